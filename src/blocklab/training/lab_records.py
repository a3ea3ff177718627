"""The stability lab's runs recorded in git at the document's setup, read back with their checksums: where they are
(``RUNS``, named once in ``blocklab.records``), one run's files (``read_run``), its setup and the table of every
recorded run with its outcome (``recorded``). Below the lab in the layers, so that the reviewer can cite the lab's
recorded runs without importing the lab (``blocklab.lab.records`` re-exports these).
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..integrity import _differences, _loss_problems, _meta_problems, expected_loss_steps
from ..io import DamagedArtifact
from ..records import LAB_RUNS
from .outcomes import COLUMNS, outcome

REPO = Path(__file__).resolve().parents[3]
RUNS = LAB_RUNS  # the recorded lab runs, relative to the repository root (named once, in blocklab.records)
NAME = re.compile(r"^(?P<norm>[a-z0-9]+)-w(?P<warmup>\d+)-s(?P<seed>\d+)$")
# What makes two runs the same setup: (meta.json's section, key) -> the params.yaml (section, key) it was made from.
SETUP_KEYS = {("model_config", "n_layers"): ("copy_model", "n_layers"), ("model_config", "d_model"): ("copy_model", "d_model"),
              ("model_config", "n_heads"): ("copy_model", "n_heads"), ("model_config", "position"): ("copy_model", "position"),
              ("copy_task", "vocab_size"): ("copy_task", "vocab_size"), ("copy_task", "seq_len"): ("copy_task", "seq_len"),
              ("copy_task", "batch_size"): ("copy_task", "batch_size"), ("sweep", "lr"): ("sweep", "lr"),
              ("sweep", "steps"): ("sweep", "steps")}


def runs_dir(root: Path | str = REPO) -> Path:
    return Path(root) / RUNS


RECORDED_FILES = ("loss.csv", "meta.json")  # what `lab-job record` copies of a finished run (no weights, no checkpoint)


def read_run(run_dir: Path | str) -> tuple[dict, pd.DataFrame]:
    """A recorded run's meta.json (checked against its own checksum) and loss.csv (against meta.json's record of it
    and its steps); ``DamagedArtifact`` otherwise. The weights were not recorded, so they are not asked for."""
    run_dir = Path(run_dir)
    meta, problems = _meta_problems(run_dir)
    if not problems:
        problems = _differences(run_dir, {"loss.csv": meta["artifacts"].get("loss.csv", {"bytes": -1, "sha256": ""})})
    if not problems:
        problems = _loss_problems(run_dir / "loss.csv", expected_loss_steps(meta))
    if problems:
        raise DamagedArtifact(f"{run_dir}: damaged recorded run: {'; '.join(problems)}; record it again (`blocklab "
                              "lab-job record`) from the machine that trained it")
    return meta, pd.read_csv(run_dir / "loss.csv")


def setup_of(meta: dict) -> dict:
    """The setup a recorded run was trained at, keyed as params.yaml ("copy_model.n_layers": 24, ...)."""
    return {f"{p[0]}.{p[1]}": meta.get(m[0], {}).get(m[1]) for m, p in SETUP_KEYS.items()}


def params_setup(params: dict) -> dict:
    """The same keys from a params.yaml (copy_model.position absent: learned, the schema's default)."""
    out = {}
    for section, key in SETUP_KEYS.values():
        value = params.get(section, {}).get(key)
        out[f"{section}.{key}"] = "learned" if key == "position" and value is None else value
    return out


def setup_differs(meta: dict, params: dict) -> list[str]:
    """The keys in which a recorded run's setup differs from ``params`` ('key=run's (params ...)'); [] when the same."""
    mine, theirs = setup_of(meta), params_setup(params)
    return [f"{k}={mine[k]} (params {theirs[k]})" for k in mine
            if not (mine[k] == theirs[k] or (isinstance(mine[k], float) and theirs[k] is not None
                                             and abs(mine[k] - float(theirs[k])) <= 1e-12 * abs(mine[k])))]


def recorded(root: Path | str = REPO, norm: str | None = None, warmup: int | None = None) -> pd.DataFrame:
    """One row a recorded run (checked against its checksums): the lab.csv columns, its run name, setup and
    processor; narrowed to ``norm`` and ``warmup`` when given. Empty (with the columns) when none is recorded."""
    rows = []
    folder = runs_dir(root)
    for run_dir in sorted(folder.iterdir()) if folder.is_dir() else []:
        named = NAME.match(run_dir.name)
        if not named or not (run_dir / "meta.json").is_file():
            continue
        if (norm is not None and named["norm"] != norm) or (warmup is not None and int(named["warmup"]) != warmup):
            continue
        meta, loss = read_run(run_dir)
        found = outcome(loss["step"].tolist(), loss["loss"].tolist(), meta["copy_task"]["vocab_size"],
                        meta.get("diverged_step"))
        rows.append({"run": run_dir.name, "block": meta["norm"], "n_layers": meta["model_config"]["n_layers"],
                     "warmup": int(meta["warmup"]), "seed": int(meta["seed"]), **found,
                     "steps": len(loss), "cpu": meta.get("libraries", {}).get("cpu") or "",
                     "wall_time_s": meta.get("wall_time_s"), **setup_of(meta)})
    columns = ["run", *COLUMNS, "steps", "cpu", "wall_time_s", *(f"{p[0]}.{p[1]}" for p in SETUP_KEYS.values())]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["block", "warmup", "seed"], ignore_index=True) if len(frame) else frame
