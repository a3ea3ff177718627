"""The dynamics study's command line, ``blocklab dynamics <verb>``: ``plan``, ``train`` (one collapse-rate run),
``status``, ``snapshot``, ``aggregate`` and ``figures`` (``detectors``: ``detectors.py`` here)."""
from __future__ import annotations

import logging
from pathlib import Path

from ...figures.style import LANGS
from ...io import write_table
from ...params_file import load_params
from ..cells import require_cell_names
from ..family import add_command, add_plan, add_snapshot, add_status, add_train
from .aggregate import aggregate, write_snapshot
from .figures import save_figures
from .plan import PLAN, TABLES, case, plan
from .run import status, train

log = logging.getLogger("blocklab.dynamics")


def register(subparsers) -> None:
    p = add_train(subparsers, "train one collapse-rate run (post-norm with warm-up, a setting, a seed)", _train_main,
                  norm_and_warmup=False)
    p.add_argument("--follow", action="store_true",
                   help="train to the last step (sweep.steps) instead of stopping once it collapsed: what happens after")
    p.add_argument("--dense", default=None, metavar="FIRST:LAST",
                   help="also record the forward diagnostics at every step from FIRST to LAST (the steps before an event)")
    add_plan(subparsers, "every run of the dynamics family and its directory", plan, PLAN)
    add_command(subparsers, "aggregate", "the dynamics family's tables (losses, diagnostics, events, rates)", _aggregate_main)
    p = add_status(subparsers, "which dynamics runs are finished, checkpointed, recorded or to do", _status_main)
    p.add_argument("--add-setting", action="append", default=[], dest="setting",
                   help="also list this collapse setting's runs, before params.yaml lists it (repeatable)")
    p = add_snapshot(subparsers, "record the finished dynamics runs in a directory kept in git", _snapshot_main)
    p.add_argument("--add-setting", action="append", default=[], dest="setting",
                   help="also record this collapse setting (a sensitivity cell name) at dynamics.collapse.seeds, "
                        "before params.yaml lists it (repeatable)")
    p.add_argument("--every-step", action="store_true",
                   help="keep every recorded diagnostic step (no thinning): runs recorded at every step, for the "
                        "detectors' false alarms at the loss's own resolution")
    p = add_command(subparsers, "figures", "draw the training-dynamics figures from data/dynamics", _figures_main)
    p.add_argument("--data", default="data")
    p.add_argument("--figs", default="figs")
    p.add_argument("--lang", choices=list(LANGS), default=None)


def _status_main(args) -> None:
    params = load_params(args.params)
    settings = params["dynamics"]["collapse"]["settings"]
    settings += [name for name in require_cell_names(args.setting, "--add-setting") if name not in settings]
    frame = status(params, args.root)
    print(frame.to_string(index=False))
    done = frame["state"].eq("finished") | frame["in_snapshot"]
    print(f"{int(done.sum())} of {len(frame)} planned runs finished or recorded; "
          f"{int((~done).sum())} to train (`snakemake --cores 4 dynamics`)")


def _train_main(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    meta = train(params, args.cell, *case(params), args.seed, args.out_dir, args.threads, follow=args.follow,
                 dense=args.dense)
    log.info("%s %s in %.1f s (%s)", meta["run"], meta["status"], meta["wall_time_s"], meta["stop_reason"])


def _aggregate_main(args) -> None:
    params = load_params(args.params)
    tables = aggregate(params)
    for name, frame in tables.items():
        write_table(frame, Path(TABLES[name]))  # with its checksum record; parquet as zstd
    log.info("%d runs; rates: %s", len(tables["summary"]), tables["rates"].to_dict("records"))


def _snapshot_main(args) -> None:
    """Record every finished planned run, including seeds just added to the plan that ``from_snapshots`` does not yet
    cover (so the parameters are checked with it cleared: recording is how a new seed gets covered), and the runs of
    any ``--add-setting`` not yet in the plan (a setting whose seeds are still training)."""
    import yaml

    from ...params_file import validate_params

    raw = yaml.safe_load(Path(args.params).read_text(encoding="utf-8"))
    if isinstance(raw, dict) and isinstance(raw.get("dynamics"), dict):
        raw["dynamics"]["from_snapshots"] = []
        settings = raw["dynamics"].get("collapse", {}).get("settings")
        if args.setting and isinstance(settings, list):
            settings += [s for s in args.setting if s not in settings]
    params = validate_params(raw, str(args.params))
    runs = write_snapshot(params, args.out, thinned=not args.every_step)
    print(f"{len(runs)} run(s) recorded in {args.out} (finished here, and kept from its earlier record)")


def _figures_main(args) -> None:
    save_figures(load_params(args.params), args.data, args.figs, args.lang)
