"""Record the batch-32 main sweep's post-norm + warm-up seeds 1 and 2 (stop 31's default run, kept in docs/gallery/data)
as a dynamics snapshot, docs/dynamics/sweep-b32, before the default batch becomes 64 (issue 33).

At batch 32 those two seeds were the main sweep's own runs, read from data/sweep/runs by the pipeline; once the default
is batch 64 the batch-32 collapse setting is read from snapshots only, and seeds 0 and 3-8 are already recorded in
docs/dynamics/collapse. The tables are copied, not recomputed: losses and diagnostics as the gallery's run recorded them
(AMD EPYC Zen 4, code c73338269d), the diagnostics thinned by the snapshot writer's own rule (``kept_steps``).
Run once from the repository root: ``python scripts/snapshot_sweep_b32.py``.
"""
from pathlib import Path

import pandas as pd
import yaml

from blocklab.studies.dynamics.aggregate import thin
from blocklab.io import write_table

GALLERY, OUT = Path("docs/gallery/data"), Path("docs/dynamics/sweep-b32")
SETTING, RUNS = "learned-b32-L24-lr0.001-fp32", ["post-w400-s1", "post-w400-s2"]

params = yaml.safe_load((GALLERY / "params.yaml").read_text())
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
write_table(runs, OUT / "runs.csv")
write_table(losses[["setting", "run", "step", "loss", "lr"]], OUT / "losses.csv")
kept = thin(params, summary, diagnostics).astype({"value": "float16", "step": "int32", "block": "int16"})
kept.to_parquet(OUT / "diagnostics.parquet", index=False, compression="zstd")
print(f"{OUT}: {len(runs)} runs, {len(losses)} loss rows, {len(kept)} of {len(diagnostics)} diagnostic rows kept")
