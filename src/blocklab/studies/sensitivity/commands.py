"""The sensitivity study's command line, ``blocklab sensitivity <verb>``: ``plan``, ``train`` (one run of a cell),
``gradnorm``, ``snapshot``, ``aggregate`` (its tables and claim x setting), ``status`` and ``figures``."""
from __future__ import annotations

import logging
from pathlib import Path

from ...model_config import ConfigError
from ...io import write_json, write_table
from ...params_file import load_params
from ...provenance import stamp
from ..cells import Cell
from ..family import add_command, add_plan, add_snapshot, add_status, add_train
from .aggregate import write_snapshot
from .figures import save_figures
from .plan import plan, with_cells
from .run import gradnorm_by_choice, projected_seconds, status, train

log = logging.getLogger("blocklab.sensitivity")


def register(subparsers) -> None:
    p = add_train(subparsers, "train one run of a sensitivity cell (open choices of document 000)", _train_main)
    p.add_argument("--add-cell", action="store_true",
                   help="the cell need not be in params.yaml yet (a candidate under validation, recorded with "
                        "`sensitivity snapshot --add-cell` before params.yaml lists it)")
    add_plan(subparsers, "list every run of the sensitivity study and where it lives", plan)
    p = add_command(subparsers, "gradnorm", "gradient norms at init at each position signal and batch size of the study",
                    _gradnorm_main)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--add-cell", action="append", default=[], metavar="CELL",
                   help="also a cell params.yaml does not list yet (repeatable; a candidate under validation)")
    p = add_snapshot(subparsers, "record the finished runs of the study (losses and what their summary needs) in DIR",
                     _snapshot_main, root=True)
    p.add_argument("--family", choices=["choices", "depth_lr"], default=None, help="only this family's runs")
    p.add_argument("--setting", nargs="+", default=None, help="only these cells (e.g. learned-b32-L24-lr0.001-bf16)")
    p.add_argument("--seed", type=int, action="append", default=None, help="only this seed's runs (repeatable)")
    p.add_argument("--machine", default=None, help="the processor, for runs whose meta.json does not name it")
    p.add_argument("--from-sweep", type=Path, default=None, metavar="DATA",
                   help="record the runs a finished main sweep trained (DATA/params.yaml, DATA/sweep/*.csv) where its "
                        "setup is a planned cell's, instead of training them (needs --machine)")
    p.add_argument("--add-cell", action="append", default=[], metavar="CELL",
                   help="also a cell params.yaml does not list yet (repeatable): its finished runs are recorded")
    p = add_status(subparsers, "which runs of the study are finished, checkpointed or to do; hours", _status_main)
    p.add_argument("--cores", default=2, type=int, help="cores the study runs on (jobs = cores / threads_per_run)")
    p.add_argument("--add-cell", action="append", default=[], metavar="CELL",
                   help="also a cell params.yaml does not list yet (repeatable; a candidate under validation)")
    p = add_command(subparsers, "figures", "draw the sensitivity study's figures from its tables", _figures_main)
    p.add_argument("--data", default="data")
    p.add_argument("--figs", default="figs")
    p.add_argument("--lang", choices=["ko", "en"], default=None)


def _train_main(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    cell = Cell.parse(args.cell)
    if args.add_cell:
        params = with_cells(params, [args.cell], "--cell")
    meta = train(params, cell.name, args.norm, args.warmup, args.seed, args.out_dir, args.threads, source=args.params)
    log.info("%s/%s %s (%s) in %.1f s", cell.name, meta["run"], meta["status"], meta["stop_reason"], meta["wall_time_s"])


def _gradnorm_main(args) -> None:
    from ...runtime import set_threads

    params = with_cells(load_params(args.params), args.add_cell)
    set_threads(params["threads_per_run"])
    frame = gradnorm_by_choice(params)
    write_table(frame, args.out)
    pairs = frame[["position", "batch_size"]].drop_duplicates()
    write_json(stamp(artifact=args.out.name, cells=[f"{p}-b{b}" for p, b in pairs.itertuples(index=False)],
                     params={k: params[k] for k in ("copy_task", "copy_model", "gradnorm")}),
               args.out.with_suffix(".json"))


def _only(planned, column: str, values, where: str = ""):
    """The planned rows whose ``column`` is one of ``values`` (an option's list); a value the plan lacks is refused,
    naming the allowed ones."""
    unknown = sorted(set(values) - set(planned[column]))
    if unknown:
        raise ConfigError(f"--{column}: {', '.join(map(str, unknown))} not planned{where}; allowed: "
                          f"{', '.join(map(str, sorted(planned[column].unique())))}")
    return planned[planned[column].isin(values)]


def _snapshot_main(args) -> None:
    params = with_cells(load_params(args.params), args.add_cell)
    planned = plan(params)
    if args.family:
        planned = planned[planned["family"] == args.family]
    if args.setting:
        planned = _only(planned, "setting", args.setting, f" in {args.family}" if args.family else "")
    if args.seed:
        planned = _only(planned, "seed", args.seed)
    runs = write_snapshot(params, args.out, args.root, planned, machine=args.machine, from_sweep=args.from_sweep)
    print(f"{len(runs)} finished of {planned['run_dir'].nunique()} planned runs recorded in {args.out}/ "
          "(runs.csv, losses.csv, summary.csv)")


def _status_main(args) -> None:
    params = with_cells(load_params(args.params), args.add_cell)
    frame = status(params, args.root)
    frame["projected_s"] = projected_seconds(frame)
    by_status = frame["status"].value_counts()
    print(frame.groupby("setting", sort=False).agg(
        runs=("run", "size"), finished=("status", lambda s: int((s == "finished").sum())),
        steps_done=("steps_done", "sum"), hours=("seconds", lambda s: round(s.sum() / 3600, 2)),
        projected_hours_left=("projected_s", lambda s: round(s.sum() / 3600, 2))).to_string())
    jobs = max(1, args.cores // params["threads_per_run"])
    spent, left = frame["seconds"].sum() / 3600, frame["projected_s"].sum() / 3600
    print(f"\n{len(frame)} runs: " + ", ".join(f"{n} {s}" for s, n in by_status.items())
          + f". Run time so far {spent:.2f} h (about {spent / jobs:.2f} h of wall time with {jobs} jobs side by side); "
          f"at most {left:.2f} h of run time left (projected from the runs so far; early stops shorten it), "
          f"about {left / jobs:.2f} h of wall time with {jobs} jobs.")


def _figures_main(args) -> None:
    for path in save_figures(load_params(args.params), args.data, args.figs, args.lang):
        print(path)
