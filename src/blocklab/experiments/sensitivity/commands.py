"""The study's training commands: ``sensitivity train`` (one run of a cell), ``sensitivity plan``,
``sensitivity gradnorm`` and ``sensitivity snapshot``. Its tables, claims and figures are made by the reporting
layer's commands (``blocklab.reporting.sensitivity``)."""
from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from ...config import ConfigError
from ...integrity import begin_snapshot, record_snapshot
from ...io import read_table, write_json, write_table
from ...params import load_params
from ...provenance import stamp
from ...study import Cell, cell_params, early_stop_rule, plan, require_planned, with_cells
from ..family import add_command, add_plan, add_train
from .aggregation import gradnorm_by_choice, record_runs

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
    p = add_command(subparsers, "snapshot", "record the finished runs of the study (losses and what their summary needs) in DIR",
                    _snapshot_main, root=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--family", choices=["choices", "depth_lr"], default=None, help="only this family's runs")
    p.add_argument("--setting", nargs="+", default=None, help="only these cells (e.g. learned-b32-L24-lr0.001-bf16)")
    p.add_argument("--machine", default=None, help="the processor, for runs whose meta.json does not name it")
    p.add_argument("--add-cell", action="append", default=[], metavar="CELL",
                   help="also a cell params.yaml does not list yet (repeatable): its finished runs are recorded")


def _train_main(args) -> None:
    from ...runtime import set_threads
    from ...training.sweep import train_copy_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    cell = Cell.parse(args.cell)
    if args.add_cell:
        params = with_cells(params, [args.cell], "--cell")
    require_planned(plan(params), cell, args.norm, args.warmup, args.seed, f"the sensitivity section of {args.params}")
    set_threads(args.threads or params["threads_per_run"])
    stop, words = early_stop_rule(params, cell)
    meta = train_copy_run(cell_params(params, cell), args.norm, args.warmup, args.seed, args.out_dir, params["device"],
                          stop_when=stop, stop_rule=words, sensitivity_cell=asdict(cell) | {"name": cell.name})
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


def _snapshot_main(args) -> None:
    params = with_cells(load_params(args.params), args.add_cell)
    planned = plan(params)
    if args.family:
        planned = planned[planned["family"] == args.family]
    if args.setting:
        unknown = sorted(set(args.setting) - set(planned["setting"]))
        if unknown:
            raise ConfigError(f"--setting: {', '.join(unknown)} not planned{' in ' + args.family if args.family else ''}"
                              f"; allowed: {', '.join(planned['setting'].unique())}")
        planned = planned[planned["setting"].isin(args.setting)]
    runs, losses, summary = record_runs(params, args.root, planned, machine=args.machine)
    if (args.out / "runs.csv").is_file():  # a snapshot is rewritten whole: never drop a run it records
        lost = read_table(args.out / "runs.csv").merge(runs[["setting", "run"]], how="left", indicator=True)
        lost = lost[lost["_merge"] == "left_only"]
        if len(lost):
            raise ConfigError(f"--out={args.out}: it records {len(lost)} run(s) that did not finish here "
                              f"({', '.join(lost['setting'] + '/' + lost['run'])}), which rewriting it would drop; "
                              "allowed: a new --out directory (list both in sensitivity.from_snapshots), or the "
                              "project root that holds those runs (--root)")
    args.out.mkdir(parents=True, exist_ok=True)
    begin_snapshot(args.out)  # a kill from here on leaves a snapshot that readers refuse, until it is written again
    write_table(runs, args.out / "runs.csv")
    write_table(losses, args.out / "losses.csv")
    write_table(summary.drop(columns=["family"]).drop_duplicates("run_dir"), args.out / "summary.csv")
    record_snapshot(args.out)  # last: the checksums of what was written
    print(f"{len(runs)} finished of {planned['run_dir'].nunique()} planned runs recorded in {args.out}/ "
          "(runs.csv, losses.csv, summary.csv)")
