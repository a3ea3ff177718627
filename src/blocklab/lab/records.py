"""The stability lab's runs recorded in git at the document's setup: where they are (``RUNS``, the one place that says
so) and what they show, read back with their checksums (``integrity.read_run``).

A recorded run is a folder ``<norm>-w<warmup>-s<seed>`` with the loss.csv and meta.json its training wrote
(``blocklab lab-job record``). Its outcome is computed here from its losses with the lab's own thresholds
(``run.outcome``), never stored by hand, so the claims, the docs and the gallery read the same outcome.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..training.lab_records import (COLUMNS, NAME, RECORDED_FILES, REPO, RUNS, SETUP_KEYS, outcome,  # noqa: F401
                                    params_setup, read_run, recorded, runs_dir, setup_differs, setup_of)


def meta_of(run: str, root: Path | str = REPO) -> dict:
    return read_run(runs_dir(root) / run)[0]


def losses(runs, root: Path | str = REPO) -> pd.DataFrame:
    """The per-step losses of the recorded runs named ``runs`` (run, block, warmup, seed, step, loss)."""
    frames = []
    for run in runs:
        meta, loss = read_run(runs_dir(root) / run)
        frames.append(loss[["step", "loss"]].assign(run=run, block=meta["norm"], warmup=int(meta["warmup"]),
                                                    seed=int(meta["seed"])))
    if not frames:
        return pd.DataFrame(columns=["step", "loss", "run", "block", "warmup", "seed"])
    return pd.concat(frames, ignore_index=True)


# ---- `blocklab lab` adopts a recorded run instead of training it again ---------------------------------------------

ADOPTED = "adopted.json"  # in a lab's run folder: the run was copied from the records, not trained here


def matching(norm: str, warmup: int, seed: int, params: dict, root: Path | str = REPO) -> str | None:
    """The recorded run of built-in ``norm`` at ``warmup`` and ``seed`` trained at ``params``' setup (the lab's
    profile applied: ``spec.params_for``), or None."""
    run_dir = runs_dir(root) / f"{norm}-w{warmup}-s{seed}"
    if not (run_dir / "meta.json").is_file():
        return None
    meta = read_run(run_dir)[0]
    precision = (meta.get("sweep", {}).get("precision") or "fp32", params["sweep"].get("precision") or "fp32")
    same = (meta.get("norm") == norm and int(meta["warmup"]) == warmup and int(meta["seed"]) == seed
            and not setup_differs(meta, params) and precision[0] == precision[1])
    return run_dir.name if same else None


def adopt(spec, params: dict, out: Path, root: Path | str = REPO, dry_run: bool = False) -> list[dict]:
    """For a built-in block, copy each planned run that is recorded at the same setup into ``out/runs/<run>/``
    (loss.csv, meta.json and ``ADOPTED``), after ``spec.json`` is written, so that its Snakemake job (whose input is
    spec.json) has nothing to train; a run trained there is left as it is, an adopted one is copied again. Returns what was (or, ``dry_run``, would be) adopted."""
    import json
    import shutil

    from .spec import params_for

    if spec.block.kind != "builtin":
        return []
    at = params_for(params, spec.setup)
    found = []
    for warmup, seed in spec.runs():
        name = matching(spec.block.source, warmup, seed, at, root)
        target = Path(out) / "runs" / spec.run_name(warmup, seed)
        if name is None or ((target / "meta.json").is_file() and not (target / ADOPTED).is_file()):
            continue  # not recorded, or trained here: its job decides; an adopted run is copied again (a newer spec)
        meta = meta_of(name, root)
        record = {"run": spec.run_name(warmup, seed), "from": f"{RUNS}/{name}", "cpu": meta.get("libraries", {}).get("cpu"),
                  "git_commit": (meta.get("code", {}).get("git_commit") or "")[:10], "meta_sha256": meta.get("meta_sha256")}
        found.append(record)
        if dry_run:
            continue
        target.mkdir(parents=True, exist_ok=True)
        for file in RECORDED_FILES:
            shutil.copyfile(runs_dir(root) / name / file, target / file)
        (target / ADOPTED).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return found


def adopted(run_dir: Path) -> dict | None:
    import json

    path = Path(run_dir) / ADOPTED
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
