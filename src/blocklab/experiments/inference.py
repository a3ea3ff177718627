"""The document's unstated setup, inferred (issue 23; the procedure in docs/dynamics.md, stated before any of these
runs): the fitting runs. Each candidate setting (``inference.positions`` x ``inference.batch_sizes`` at the document's
depth, learning rate and precision) trains post-norm with warm-up and pre-norm without it, at ``inference.seeds``, for
``inference.fit_steps`` steps only (the document's five early losses are at steps 100-300). A run is an ordinary sweep
run (``sweep.train_copy_run``) with ``sweep.steps`` set to ``fit_steps``: its first steps are those of a full-length run
of the same seed. The ranking itself is ``blocklab.reporting.inference``; the validation runs at full length are the
dynamics family's collapse settings. (The ranking reads the runs through ``collect``: ``blocklab inference aggregate``.)
"""
from __future__ import annotations

import copy
import logging
from pathlib import Path

import pandas as pd

from ..config import ConfigError
from ..integrity import begin_snapshot, read_run, record_snapshot, verify_snapshot
from ..io import read_json, read_table, write_table
from ..params import load_params
from ..study import Cell, cell_params, default_cell, require_planned, run_name
from .family import add_command, add_plan, add_train

log = logging.getLogger("blocklab.inference")

ROOT = "data/inference"
RUNS = f"{ROOT}/runs"
PLAN = f"{ROOT}/plan.csv"
LOSSES = f"{ROOT}/losses.csv"
RANKING = f"{ROOT}/ranking.csv"
HOLDOUT = f"{ROOT}/holdout.csv"  # the default cell's fitting runs at seeds the fit never used (the fitted claims' test)
SNAPSHOT_FILES = ("runs.csv", "losses.csv")
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
    warmup = max(params["sweep"]["warmups"])
    sweep, base = params["sweep"], default_cell(params)
    reuse = sweep["steps"] >= params["inference"]["fit_steps"]
    rows = []
    for cell in candidates(params):
        for norm, w in CASES:
            w = warmup if w is None else w
            for seed in params["inference"]["seeds"]:
                run = run_name(norm, w, seed)
                main = (reuse and cell == base and norm in sweep["norms"] and w in sweep["warmups"]
                        and seed in sweep["seeds"])
                rows.append({"setting": cell.name, "norm": norm, "warmup": w, "seed": seed, "run": run,
                             "run_dir": f"data/sweep/runs/{run}" if main else f"{RUNS}/{cell.name}/{run}",
                             "main_sweep": main})
    return pd.DataFrame(rows, columns=["setting", "norm", "warmup", "seed", "run", "run_dir", "main_sweep"])


def holdout_plan(params: dict) -> pd.DataFrame:
    """The held-out fitting runs (issue 33): the default cell's two fitted cases at ``inference.holdout_seeds``, seeds
    no fitting run used, for ``fit_steps`` steps, so that the five fitted numbers are judged on runs the fit never saw.
    Never part of the ranking. Columns as ``plan`` (``main_sweep`` always False: a held-out seed is not a sweep seed)."""
    warmup, base = max(params["sweep"]["warmups"]), default_cell(params)
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
    p = fit_params(params, Cell.parse(cell_name))
    training = {k: v for k, v in p["sweep"].items() if k not in ("norms", "warmups", "seeds", "checkpoint_every",
                                                                   "compile", "fast_path", "batched")}
    return {"model": p["copy_model"], "task": p["copy_task"], "training": training}


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


def collect(params: dict, root: str | Path = ".", only_finished: bool = False,
            planned: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, losses up to ``fit_steps``) of the planned runs (default ``plan``): from ``inference.from_snapshots``
    where they record them, else from the run directories. ``only_finished``: the finished fitting runs trained here
    only (what ``inference snapshot`` records: the ranking's and the held-out ones)."""
    root = Path(root)
    if only_finished:
        own = pd.concat([plan(params), holdout_plan(params)], ignore_index=True) if planned is None else planned
        own, runs, losses = own[~own["main_sweep"]], pd.DataFrame(), pd.DataFrame()
    else:
        own, runs, losses = sources(params, root, planned)
    records, curves = [], []
    for row in own.itertuples(index=False):
        meta_path = root / row.run_dir / "meta.json"
        if not meta_path.is_file():
            if only_finished:
                continue
            raise ConfigError(f"{row.run_dir}: not trained yet; `snakemake --cores 4 inference` trains it")
        meta, loss = read_run(root / row.run_dir)  # checked against its checksums and recorded steps
        records.append({"setting": row.setting, "run": row.run, "wall_time_s": meta.get("wall_time_s"),
                        "machine": meta.get("libraries", {}).get("cpu"),
                        "git_commit": meta.get("code", {}).get("git_commit")})
        curves.append(loss[["step", "loss"]].assign(setting=row.setting, run=row.run))
    columns = ["setting", "run", "step", "loss"]
    runs = pd.concat([frame for frame in (pd.DataFrame(records), runs) if len(frame)], ignore_index=True) \
        if len(records) or len(runs) else pd.DataFrame(columns=["setting", "run"])
    losses = pd.concat([frame[columns] for frame in (*curves, losses) if len(frame)], ignore_index=True) \
        if curves or len(losses) else pd.DataFrame(columns=columns)
    losses = losses[losses["step"] <= params["inference"]["fit_steps"]].reset_index(drop=True)
    return runs, losses


def status(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """Every planned fitting run: where it comes from (``source``: main sweep, a snapshot, or trained here), where it
    stands (recorded, finished, checkpointed, not started), the steps and run time spent and the run time projected for
    what is left (seconds per step scaled with batch size, from the runs timed on this family: see
    ``sensitivity.status.projected_seconds``)."""
    from ..training.sweep import run_state
    from .sensitivity.status import projected_seconds

    root, fit = Path(root), params["inference"]["fit_steps"]
    planned = plan(params)
    recorded, _ = read_snapshots([root / d for d in snapshots(params)])
    where = {(r.setting, r.run): r for r in recorded.itertuples(index=False)}
    rows = []
    for row in planned.itertuples(index=False):
        cell = Cell.parse(row.setting)
        steps = params["sweep"]["steps"] if row.main_sweep else fit
        base = {"setting": row.setting, "run": row.run, "batch_size": cell.batch_size, "depth": cell.depth,
                "precision": cell.precision}
        hit = None if row.main_sweep else where.get((row.setting, row.run))
        if hit is not None:
            snap = str(Path(hit.snapshot).relative_to(root)) if Path(hit.snapshot).is_absolute() else hit.snapshot
            timed = snap.endswith("inference/fit") and hit.wall_time_s == hit.wall_time_s
            rows.append({**base, "source": snap, "status": "recorded", "steps_done": fit if timed else 0,
                         "steps_left": 0, "seconds": float(hit.wall_time_s) if timed else 0.0})
            continue
        state = run_state(root / row.run_dir, steps)
        rows.append({**base, "source": "main sweep" if row.main_sweep else "here", **state,
                     "steps_left": 0 if state["status"] == "finished" else steps - state["steps_done"]})
    frame = pd.DataFrame(rows)
    frame["projected_s"] = projected_seconds(frame)
    return frame


def register(subparsers) -> None:
    add_train(subparsers, "train one fitting run of the inferred-setup procedure", _train_main)
    p = add_command(subparsers, "aggregate-holdout", "the held-out fitting runs' losses (inference.holdout_seeds)",
                    _holdout_main)
    p.add_argument("--out", type=Path, default=Path(HOLDOUT))
    add_plan(subparsers, "every fitting run of the inferred-setup procedure", plan, PLAN)
    add_command(subparsers, "status", "which fitting runs are recorded, finished or to do; hours left", _status_main,
                root=True)
    p = add_command(subparsers, "snapshot", "record the finished fitting runs in a directory kept in git", _snapshot_main)
    p.add_argument("--out", required=True, type=Path)


def _train_main(args) -> None:
    from ..runtime import set_threads
    from ..training.sweep import train_copy_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    cell = Cell.parse(args.cell)
    require_planned(pd.concat([plan(params), holdout_plan(params)]), cell, args.norm, args.warmup, args.seed,
                    f"the inference fitting runs (or held-out runs) of {args.params}")
    set_threads(args.threads or params["threads_per_run"])
    meta = train_copy_run(fit_params(params, cell), args.norm, args.warmup, args.seed, args.out_dir, params["device"],
                          inference_cell=cell.name)
    log.info("%s/%s %s in %.1f s", cell.name, meta["run"], meta["status"], meta["wall_time_s"])


def _status_main(args) -> None:
    frame = status(load_params(args.params), args.root)
    shown = frame.assign(minutes=(frame["seconds"] / 60).round(1), projected_min=(frame["projected_s"] / 60).round(1))
    print(shown[["setting", "run", "source", "status", "steps_done", "minutes", "projected_min"]].to_string(index=False))
    left = frame[(frame["steps_left"] > 0) & (frame["source"] == "here")]
    main = frame[(frame["steps_left"] > 0) & (frame["source"] == "main sweep")]
    hours = float(left["projected_s"].sum()) / 3600
    print(f"{len(frame) - len(left) - len(main)} of {len(frame)} fitting runs recorded or finished; {len(left)} to train "
          f"(`snakemake --cores 4 inference`): ~{hours:.1f} run-hours, ~{hours / 2:.1f} wall-hours with two side by side"
          + (f"; and {len(main)} main-sweep runs the default pipeline trains anyway" if len(main) else ""))


def _snapshot_main(args) -> None:
    runs, losses = collect(load_params(args.params), only_finished=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    begin_snapshot(out)  # a kill from here on leaves a snapshot that readers refuse, until it is written again
    write_table(runs, out / "runs.csv")
    write_table(losses, out / "losses.csv")
    record_snapshot(out)  # last: the checksums of what was written
    print(f"{len(runs)} finished fitting run(s) recorded in {out}")


def holdout_table(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """The held-out runs' losses up to ``fit_steps``, one row per run and step, with norm, warm-up and seed."""
    planned = holdout_plan(params)
    _, losses = collect(params, root, planned=planned)
    ident = planned[["setting", "run", "norm", "warmup", "seed"]]
    return ident.merge(losses, on=["setting", "run"]).sort_values(["norm", "seed", "step"], ignore_index=True)


def _holdout_main(args) -> None:
    params = load_params(args.params)
    table = holdout_table(params)
    write_table(table, args.out)
    log.info("%d held-out runs, %d rows: %s", table["run"].nunique(), len(table), sorted(table["run"].unique()))
