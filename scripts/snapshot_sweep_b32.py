"""Record the batch-32 main sweep's post-norm + warm-up seeds 0-2 (the batch-32 default run, kept in records/gallery
until the gallery is redrawn at batch 64) as a dynamics snapshot, records/dynamics/sweep-b32.

At batch 32 those seeds were the main sweep's own runs, read from data/sweep/runs by the pipeline; once the default
is batch 64 the batch-32 collapse setting is read from snapshots only. Seeds 1 and 2 go to records/dynamics/sweep-b32
(in ``dynamics.from_snapshots``). Seed 0 of that setting is already recorded in records/dynamics/collapse (Intel Xeon; the
collapse rate and the figures read it there), so this processor's seed 0 (AMD EPYC Zen 4: another trajectory) goes to
records/dynamics/sweep-b32-s0, outside ``from_snapshots`` (a run is read from one snapshot only), for the detectors and
the docs, which count a run per processor (as records/dynamics/sweep-b64 holds the Zen 3 runs). The tables are copied,
not recomputed: losses and diagnostics as the gallery's run recorded them (code c73338269d), at every recorded step
(as `blocklab dynamics snapshot --every-step`: Adam's ratio at every step is what the detectors' false alarms are
counted on), stored as the snapshot writer stores them (float16 values). First run: seeds 1 and 2, thinned;
rerun on 2026-12-04 for seeds 0-2 unthinned, before the gallery moved to batch 64. Run from the repository
root while records/gallery is the batch-32 run: ``python scripts/snapshot_sweep_b32.py``.
"""
from pathlib import Path

import pandas as pd
import yaml

from blocklab.integrity import begin_snapshot, record_snapshot
from blocklab.io import write_table
from blocklab.records import DYNAMICS, GALLERY

GALLERY, SETTING = Path(GALLERY), "learned-b32-L24-lr0.001-fp32"
OUTS = {Path(f"{DYNAMICS}/sweep-b32"): ["post-w400-s1", "post-w400-s2"], Path(f"{DYNAMICS}/sweep-b32-s0"): ["post-w400-s0"]}

params = yaml.safe_load((GALLERY / "params.yaml").read_text())
assert params["copy_task"]["batch_size"] == 32, "records/gallery is no longer the batch-32 run"
for OUT, RUNS in OUTS.items():
    summary = pd.read_csv(GALLERY / "dynamics/summary.csv")
    summary = summary[(summary["setting"] == SETTING) & summary["run"].isin(RUNS)].reset_index(drop=True)
    assert sorted(summary["run"]) == RUNS, summary["run"].tolist()
    losses = pd.read_csv(GALLERY / "dynamics/losses.csv")
    losses = losses[(losses["setting"] == SETTING) & losses["run"].isin(RUNS)]
    diagnostics = pd.read_parquet(GALLERY / "dynamics/diagnostics.parquet")
    diagnostics = diagnostics[(diagnostics["setting"] == SETTING) & diagnostics["run"].isin(RUNS)]
    runs = pd.DataFrame({
        "setting": SETTING, "run": summary["run"], "norm": summary["norm"], "warmup": summary["warmup"],
        "seed": summary["seed"], "vocab_size": params["copy_task"]["vocab_size"], "diverged_step": None,
        "stopped_step": None, "stop_reason": summary["stop_reason"], "wall_time_s": summary["wall_time_s"],
        "machine": summary["machine"], "git_commit": "c73338269d", "diagnostics": summary["diagnostics"],
        "run_dir": "data/sweep/runs/" + summary["run"]})
    OUT.mkdir(parents=True, exist_ok=True)
    begin_snapshot(OUT)  # a kill from here on leaves a snapshot that readers refuse, until it is written again
    write_table(runs, OUT / "runs.csv")
    write_table(losses[["setting", "run", "step", "loss", "lr"]], OUT / "losses.csv")
    kept = diagnostics.astype({"value": "float16", "step": "int32", "block": "int16"})
    kept.to_parquet(OUT / "diagnostics.parquet", index=False, compression="zstd")
    record_snapshot(OUT)  # last: the checksums of what was written
    print(f"{OUT}: {len(runs)} runs, {len(losses)} loss rows, {len(kept)} of {len(diagnostics)} diagnostic rows kept")
