"""The document's unstated setup, inferred (issue 23; the procedure in docs/dynamics.md, stated before any of these
runs): the fitting runs. Each candidate setting (``inference.positions`` x ``inference.batch_sizes`` at the document's
depth, learning rate and precision) trains post-norm with warm-up and pre-norm without it, at ``inference.seeds``, for
``inference.fit_steps`` steps only (the document's five early losses are at steps 100-300). A run is an ordinary sweep
run (``sweep.train_copy_run``) with ``sweep.steps`` set to ``fit_steps``: its first steps are those of a full-length run
of the same seed. The ranking itself is ``blocklab.reporting.inference``; the validation runs at full length are the
dynamics family's collapse settings. (The ranking reads the runs through ``collect``: ``blocklab aggregate-inference``.)
"""
from __future__ import annotations

import copy
import logging
from pathlib import Path

import pandas as pd

from ..config import ConfigError
from ..io import read_json, read_table, write_table
from ..params import load_params
from ..study import Cell, cell_params, default_cell, require_planned, run_name

log = logging.getLogger("blocklab.inference")

ROOT = "data/inference"
RUNS = f"{ROOT}/runs"
PLAN = f"{ROOT}/plan.csv"
LOSSES = f"{ROOT}/losses.csv"
RANKING = f"{ROOT}/ranking.csv"
SNAPSHOT_FILES = ("runs.csv", "losses.csv")
CASES = (("post", None), ("pre", 0))  # post-norm with the sweep's largest warm-up, pre-norm without warm-up


def candidates(params: dict) -> list[Cell]:
    base, inf = default_cell(params), params["inference"]
    return [Cell(position, batch, base.depth, base.lr, base.precision)
            for position in inf["positions"] for batch in inf["batch_sizes"]]


def plan(params: dict) -> pd.DataFrame:
    warmup = max(params["sweep"]["warmups"])
    rows = []
    for cell in candidates(params):
        for norm, w in CASES:
            w = warmup if w is None else w
            for seed in params["inference"]["seeds"]:
                run = run_name(norm, w, seed)
                rows.append({"setting": cell.name, "norm": norm, "warmup": w, "seed": seed, "run": run,
                             "run_dir": f"{RUNS}/{cell.name}/{run}"})
    return pd.DataFrame(rows, columns=["setting", "norm", "warmup", "seed", "run", "run_dir"])


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


def aggregate_inputs(params: dict) -> list[str]:
    dirs = snapshots(params)
    if dirs:
        return [f"{d}/{name}" for d in dirs for name in SNAPSHOT_FILES]
    return [f"{d}/meta.json" for d in plan(params)["run_dir"]]


def collect(params: dict, root: str | Path = ".", only_finished: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, losses) of the planned runs, from their directories or from ``inference.from_snapshots``."""
    planned, root = plan(params), Path(root)
    dirs = [] if only_finished else snapshots(params)
    if dirs:
        runs = pd.concat([read_table(root / d / "runs.csv") for d in dirs], ignore_index=True)
        losses = pd.concat([read_table(root / d / "losses.csv") for d in dirs], ignore_index=True)
        missing = set(zip(planned["setting"], planned["run"])) - set(zip(runs["setting"], runs["run"]))
        if missing:
            raise ConfigError(f"inference.from_snapshots: {len(missing)} planned run(s) not recorded, e.g. "
                              f"{sorted(missing)[0]}; allowed: snapshots with every run, or [] to train them here")
        return runs, losses
    records, curves = [], []
    for row in planned.itertuples(index=False):
        meta_path = root / row.run_dir / "meta.json"
        if not meta_path.is_file():
            if only_finished:
                continue
            raise ConfigError(f"{row.run_dir}: not trained yet; `snakemake --cores 4 inference` trains it")
        meta = read_json(meta_path)
        records.append({"setting": row.setting, "run": row.run, "wall_time_s": meta.get("wall_time_s"),
                        "machine": meta.get("libraries", {}).get("cpu"),
                        "git_commit": meta.get("code", {}).get("git_commit")})
        curves.append(read_table(root / row.run_dir / "loss.csv")[["step", "loss"]].assign(setting=row.setting,
                                                                                            run=row.run))
    losses = pd.concat(curves, ignore_index=True)[["setting", "run", "step", "loss"]] if curves else \
        pd.DataFrame(columns=["setting", "run", "step", "loss"])
    return pd.DataFrame(records), losses


def register(subparsers) -> None:
    p = subparsers.add_parser("train-inference", help="train one fitting run of the inferred-setup procedure")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--cell", required=True)
    p.add_argument("--norm", required=True, choices=["post", "pre"])
    p.add_argument("--warmup", required=True, type=int)
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=_train_main)

    p = subparsers.add_parser("inference-plan", help="every fitting run of the inferred-setup procedure")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", type=Path, default=Path(PLAN))
    p.set_defaults(func=lambda args: write_table(plan(load_params(args.params)), args.out))

    p = subparsers.add_parser("inference-snapshot", help="record the finished fitting runs in a directory kept in git")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=_snapshot_main)


def _train_main(args) -> None:
    from ..runtime import set_threads
    from ..training.sweep import train_copy_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    cell = Cell.parse(args.cell)
    require_planned(plan(params), cell, args.norm, args.warmup, args.seed, f"the inference fitting runs of {args.params}")
    set_threads(args.threads or params["threads_per_run"])
    meta = train_copy_run(fit_params(params, cell), args.norm, args.warmup, args.seed, args.out_dir, params["device"],
                          inference_cell=cell.name)
    log.info("%s/%s %s in %.1f s", cell.name, meta["run"], meta["status"], meta["wall_time_s"])


def _snapshot_main(args) -> None:
    runs, losses = collect(load_params(args.params), only_finished=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_table(runs, out / "runs.csv")
    write_table(losses, out / "losses.csv")
    print(f"{len(runs)} finished fitting run(s) recorded in {out}")
