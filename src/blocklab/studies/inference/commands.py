"""The inference study's command line, ``blocklab inference <verb>``: ``plan``, ``train`` (one fitting run),
``status``, ``snapshot``, ``aggregate`` (the fitting runs' losses and the ranking), ``aggregate-holdout`` and
``score`` (rank any recorded runs)."""
from __future__ import annotations

import logging
from pathlib import Path

from ...io import write_table
from ...params_file import load_params
from ..cells import Cell
from ..family import add_command, add_plan, add_snapshot, add_status, add_train
from .aggregate import holdout_table, write_snapshot
from .plan import HOLDOUT, PLAN, plan
from .run import status, train

log = logging.getLogger("blocklab.inference")


def register(subparsers) -> None:
    add_train(subparsers, "train one fitting run of the inferred-setup procedure", _train_main)
    p = add_command(subparsers, "aggregate-holdout", "the held-out fitting runs' losses (inference.holdout_seeds)",
                    _holdout_main)
    p.add_argument("--out", type=Path, default=Path(HOLDOUT))
    add_plan(subparsers, "every fitting run of the inferred-setup procedure", plan, PLAN)
    add_status(subparsers, "which fitting runs are recorded, finished or to do; hours left", _status_main)
    p = add_snapshot(subparsers, "record the finished fitting runs in a directory kept in git", _snapshot_main)
    p.add_argument("--from-sweep", type=Path, default=None, metavar="DATA",
                   help="instead, the fitting cases of the main sweep in DATA (a finished run's data directory with "
                        "its params.yaml, e.g. records/gallery), named by that run's default cell")


def _train_main(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cell = Cell.parse(args.cell)
    meta = train(load_params(args.params), cell.name, args.norm, args.warmup, args.seed, args.out_dir, args.threads,
                 source=args.params)
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
    runs = write_snapshot(load_params(args.params), args.out, from_sweep=args.from_sweep)
    print(f"{len(runs)} finished fitting run(s) recorded in {args.out}")


def _holdout_main(args) -> None:
    params = load_params(args.params)
    table = holdout_table(params)
    write_table(table, args.out)
    log.info("%d held-out runs, %d rows: %s", table["run"].nunique(), len(table), sorted(table["run"].unique()))
