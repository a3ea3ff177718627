"""The inference study's plan, from the parameters alone (the params level): the document's unstated setup, inferred
(the procedure in docs/dynamics.md, stated before any of these runs). Each candidate setting
(``inference.positions`` x ``inference.batch_sizes`` at the document's depth, learning rate and precision) trains
post-norm with warm-up and pre-norm without it, at ``inference.seeds``, for ``inference.fit_steps`` steps only (the
document's five early losses are at steps 100-300). A run is an ordinary sweep run (``sweep.train_copy_run``) with
``sweep.steps`` set to ``fit_steps``: its first steps are those of a full-length run of the same seed. The validation
runs at full length are the dynamics study's collapse settings.

Here: the fitting runs and the held-out runs, their directories, the snapshots they may be read from, and the
section's checks. The runs and their status are in ``run``; the losses and the ranking by the document's numbers in
``aggregate``; the command line in ``commands``.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd

from ...model_config import ConfigError
from ...integrity import verify_snapshot
from ...io import read_table
from ...run_settings import Sweep
from ..cells import Cell, cell_params, default_cell, run_dir, run_name, study_paths, training_identity

ROOT, RUNS, PLAN = study_paths("inference")
LOSSES = f"{ROOT}/losses.csv"
RANKING = f"{ROOT}/ranking.csv"
HOLDOUT = f"{ROOT}/holdout.csv"  # the default cell's fitting runs at seeds the fit never used (the fitted claims' test)
SNAPSHOT_FILES = ("runs.csv", "losses.csv")
FIGURES: dict[str, list[str]] = {}  # figure -> the tables it is drawn from: none (the ranking is a table)
CASES = (("post", None), ("pre", 0))  # post-norm with the sweep's largest warm-up, pre-norm without warm-up


def candidates(params: dict) -> list[Cell]:
    base, inf = default_cell(params), params["inference"]
    cells = [Cell(position, batch, base.depth, base.lr, base.precision)
             for position in inf["positions"] for batch in inf["batch_sizes"]]
    return [cell for cell in cells if f"{cell.position}-b{cell.batch_size}" not in inf.get("skip", [])]


def plan(params: dict) -> pd.DataFrame:
    """Every fitting run: setting, norm, warm-up, seed, run, its directory and whether it is a main-sweep run (the
    default cell at a seed of ``sweep.seeds``, trained by the pipeline anyway at ``sweep.steps`` >= ``fit_steps``: its
    first ``fit_steps`` steps are the fitting run's, so it is read from ``data/sweep/runs`` and not trained again)."""
    sweep, base = Sweep.from_params(params), default_cell(params)
    warmup, reuse = max(sweep.warmups), sweep.steps >= params["inference"]["fit_steps"]
    rows = []
    for cell in candidates(params):
        for norm, w in CASES:
            w = warmup if w is None else w
            for seed in params["inference"]["seeds"]:
                run = run_name(norm, w, seed)
                main = (reuse and cell == base and norm in sweep.norms and w in sweep.warmups and seed in sweep.seeds)
                rows.append({"setting": cell.name, "norm": norm, "warmup": w, "seed": seed, "run": run,
                             "run_dir": run_dir(RUNS, cell, run, main), "main_sweep": main})
    return pd.DataFrame(rows, columns=["setting", "norm", "warmup", "seed", "run", "run_dir", "main_sweep"])


def holdout_plan(params: dict) -> pd.DataFrame:
    """The held-out fitting runs: the default cell's two fitted cases at ``inference.holdout_seeds``, seeds
    no fitting run used, for ``fit_steps`` steps, so that the five fitted numbers are judged on runs the fit never saw.
    Never part of the ranking. Columns as ``plan`` (``main_sweep`` always False: a held-out seed is not a sweep seed)."""
    warmup, base = max(Sweep.from_params(params).warmups), default_cell(params)
    rows = [{"setting": base.name, "norm": norm, "warmup": warmup if w is None else w, "seed": seed,
             "run": run_name(norm, warmup if w is None else w, seed), "main_sweep": False}
            for norm, w in CASES for seed in params["inference"].get("holdout_seeds", [])]
    frame = pd.DataFrame(rows, columns=["setting", "norm", "warmup", "seed", "run", "main_sweep"])
    frame.insert(5, "run_dir", [f"{RUNS}/{s}/{r}" for s, r in zip(frame["setting"], frame["run"])])
    return frame


def fit_params(params: dict, cell: Cell) -> dict:
    out = cell_params(params, cell)
    out["sweep"] = copy.deepcopy(out["sweep"])
    out["sweep"]["steps"] = params["inference"]["fit_steps"]
    out["sweep"]["checkpoint_every"] = min(out["sweep"]["checkpoint_every"], out["sweep"]["steps"])
    return out


def run_identity(params: dict, cell_name: str) -> dict:
    """What decides a fitting run's numbers (Snakemake params of its rule): the cell at ``fit_steps`` steps."""
    return training_identity(fit_params(params, Cell.parse(cell_name)))


def snapshots(params: dict) -> list[str]:
    return list(params["inference"].get("from_snapshots", []))


def read_snapshots(dirs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, losses) recorded in ``dirs``: fitting snapshots (``blocklab inference snapshot``) or the sensitivity
    study's (its full-length runs begin with the fitting run's steps). A run recorded in two of them is read from the
    first."""
    runs, losses = [], []
    for d in map(Path, dirs):
        missing = [name for name in SNAPSHOT_FILES if not (d / name).is_file()]
        if missing:
            raise ConfigError(f"inference.from_snapshots: {d} has no {', '.join(missing)}; allowed: directories "
                              "written by `blocklab inference snapshot` or `blocklab sensitivity snapshot`")
        verify_snapshot(d)
        runs.append(read_table(d / "runs.csv").assign(snapshot=str(d)))
        losses.append(read_table(d / "losses.csv")[["setting", "run", "step", "loss"]].assign(snapshot=str(d)))
    if not runs:
        return pd.DataFrame(columns=["setting", "run", "snapshot"]), pd.DataFrame(columns=["setting", "run", "step", "loss"])
    runs = pd.concat(runs, ignore_index=True).drop_duplicates(["setting", "run"], keep="first")
    losses = pd.concat(losses, ignore_index=True)
    losses = losses.merge(runs[["setting", "run", "snapshot"]], on=["setting", "run", "snapshot"])
    return runs, losses.drop(columns="snapshot")


def sources(params: dict, root: str | Path = ".", planned: pd.DataFrame | None = None):
    """(planned runs read from their directories, runs the snapshots give, their losses): main-sweep runs always from
    ``data/sweep/runs``; other runs from the first snapshot that records them, else from their own directory.
    ``planned``: the runs asked for (default: the ranking's ``plan``; ``holdout_plan`` for the held-out runs)."""
    planned = plan(params) if planned is None else planned
    dirs = [Path(root) / d for d in snapshots(params)]
    runs, losses = read_snapshots(dirs)
    have = set(zip(runs["setting"], runs["run"]))
    recorded = [(not m) and (s, r) in have for s, r, m in zip(planned["setting"], planned["run"], planned["main_sweep"])]
    recorded = pd.Series(recorded, index=planned.index, dtype=bool)
    keys = set(zip(planned.loc[recorded, "setting"], planned.loc[recorded, "run"]))
    keep = lambda frame: frame[[k in keys for k in zip(frame["setting"], frame["run"])]].reset_index(drop=True)  # noqa: E731
    return planned[~recorded], keep(runs), keep(losses)


def aggregate_inputs(params: dict, planned: pd.DataFrame | None = None) -> list[str]:
    """The snapshots' files and the meta.json of every planned run they do not record (those train first)."""
    own, _, _ = sources(params, planned=planned)
    return [f"{d}/{name}" for d in snapshots(params) for name in SNAPSHOT_FILES] + [f"{d}/meta.json" for d in own["run_dir"]]


def check_problems(params: dict) -> list[tuple[str, str]]:
    """Cross-field checks of the inference section (``studies.checks`` runs them with the others):
    ``inference.from_snapshots`` holds snapshots; ``inference.skip`` names candidates as ``{position}-b{batch}`` (all
    at the default depth, learning rate and precision) and leaves at least one."""
    inf = params.get("inference")
    if not inf:
        return []
    problems = [(f"inference.from_snapshots[{i}]", f"{d!r} has no runs.csv and losses.csv; allowed: directories written "
                 "by `blocklab inference snapshot` or `blocklab sensitivity snapshot`")
                for i, d in enumerate(inf.get("from_snapshots", []))
                if not all((Path(d) / name).is_file() for name in ("runs.csv", "losses.csv"))]
    held = list(inf.get("holdout_seeds", []))
    sweep_seeds = list(Sweep.from_params(params).seeds)
    used = sorted(set(held) & (set(inf.get("seeds", [])) | set(sweep_seeds)))
    if used:  # the default cell's fitting runs at sweep.seeds are the sweep's own runs: the fit saw those too
        free = max(list(inf.get("seeds", [])) + sweep_seeds) + 1
        problems.append(("inference.holdout_seeds", f"{used} are seeds a fitting run uses (inference.seeds or "
                         f"sweep.seeds); allowed: seeds in neither, e.g. {list(range(free, free + 3))}"))
    if not inf.get("skip"):
        return problems
    names = [f"{p}-b{b}" for p in inf["positions"] for b in inf["batch_sizes"]]
    unknown = [(f"inference.skip[{i}]", f"{name!r} is not a candidate; allowed: {names}")
               for i, name in enumerate(inf["skip"]) if name not in names]
    problems += unknown
    if not unknown and set(inf["skip"]) >= set(names):
        problems.append(("inference.skip", f"skips every candidate; allowed: a subset of {names}"))
    return problems
