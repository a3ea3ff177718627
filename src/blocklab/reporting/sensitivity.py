"""The sensitivity study's claims (claim judging out of the studies' aggregation): every sweep claim judged
under every open-choice setting (claim x setting), by the claims' own checks and rules, and how robust each verdict is
across the settings. The study's tables themselves are ``studies.sensitivity.aggregate``'s; the two verbs here add the
claims to them: ``blocklab sensitivity aggregate`` (the study's tables and claim x setting, the pipeline's rule) and
``blocklab sensitivity verdicts`` (claim x setting of the cells finished so far, while the study trains)."""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from ..model_config import ConfigError
from ..io import read_table, write_table
from ..params_file import load_params
from ..studies.cells import Cell, cell_params, default_cell
from ..studies.family import add_command
from ..studies.sensitivity.aggregate import aggregate, runs_tables
from ..studies.sensitivity.plan import GRADNORM, TABLES, plan, with_cells
from . import claims
from .claims import NOT_CHECKABLE

log = logging.getLogger("blocklab.sensitivity")


def as_sweep_tables(losses: pd.DataFrame, summary: pd.DataFrame, setting: str):
    """One choices cell's runs in the main sweep's table layout, so the sweep's claim checks read them unchanged."""
    # both tables already name each run as the main sweep does (sweep.run_name), so the checks match them unchanged
    s = summary[(summary["family"] == "choices") & (summary["setting"] == setting)]
    l = losses[(losses["family"] == "choices") & (losses["setting"] == setting)]
    return l, s.sort_values(["norm", "warmup", "seed"], ignore_index=True)


def claims_by_setting(params: dict, losses: pd.DataFrame, summary: pd.DataFrame, gradnorm: pd.DataFrame) -> pd.DataFrame:
    """Every sweep claim's verdict under every setting of the open choices (claim x setting), from the cells' runs,
    by the claims' own rules (``reporting.verdicts``: with one seed a value has no spread, its margin is the
    document's rounding alone; a count is Fisher's test over the cell's runs), with each verdict's margin."""
    rows = []
    settings = summary.loc[summary["family"] == "choices", ["setting", "position", "batch_size", "precision"]]
    for setting in settings.drop_duplicates("setting").itertuples(index=False):
        cell = Cell.parse(setting.setting)
        sweep_losses, sweep_summary = as_sweep_tables(losses, summary, setting.setting)
        tables = {"sweep/losses.csv": sweep_losses, "sweep/summary.csv": sweep_summary,
                  "gradnorm/gradnorm.csv": at_cell(gradnorm, cell)}
        # each cell judged on its own recorded seeds, as the study's procedure states (not the lab's extra seeds)
        data = claims.Data(".", cell_params(params, cell), tables=tables, recorded_runs=False)
        table = claims.evaluate_data(data, only=claims.SWEEP_CHECKS)
        seeds = sorted(sweep_summary["seed"].unique())
        for claim in table.itertuples(index=False):
            rows.append({"id": claim.id, "where": claim.where, "claim": claim.claim, "setting": setting.setting,
                         "position": setting.position, "batch_size": setting.batch_size,
                         "precision": setting.precision, "seeds": len(seeds),
                         "default": setting.setting == default_cell(params).name, "kind": claim.kind,
                         "measured": claim.measured, "margin": claim.margin, "verdict": claim.verdict,
                         "seeds_to_decide": claim.seeds_to_decide})
    return pd.DataFrame(rows)


def at_cell(gradnorm: pd.DataFrame, cell: Cell) -> pd.DataFrame:
    """The gradients at init a cell's runs started from: its position signal and its batch size (the table of
    ``sensitivity gradnorm``); empty where they were not measured, so the gradient claims say "not checkable"."""
    if "batch_size" not in gradnorm.columns:
        raise ConfigError(f"{GRADNORM} has no batch_size column (written before gradients were measured per batch); "
                          "rerun `blocklab sensitivity gradnorm` (Snakemake does so by itself)")
    return gradnorm[(gradnorm["position"] == cell.position) & (gradnorm["batch_size"] == cell.batch_size)]


def robustness(by_setting: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: its verdict under the default setting (else the commonest), how many settings agree with
    it, the settings that do not, and ``robust``: judged ("not checkable here" is no verdict) under at least one
    setting, and the same verdict under every setting."""
    rows = []
    for claim_id, group in by_setting.groupby("id", sort=False):
        default = group[group["default"].astype(bool)]
        ref = default["verdict"].iloc[0] if len(default) else group["verdict"].mode().iloc[0]
        checkable = bool((group["verdict"] != NOT_CHECKABLE).any())
        rows.append({"id": claim_id, "default_verdict": ref,
                     "settings": len(group), "agree": int((group["verdict"] == ref).sum()), "checkable": checkable,
                     "robust": checkable and bool((group["verdict"] == ref).all()),
                     "differ": "; ".join(f"{r.setting}: {r.verdict}" for r in group[group["verdict"] != ref].itertuples())})
    return pd.DataFrame(rows)


def finished_verdicts(params: dict, root: str | Path = ".") -> tuple[pd.DataFrame, int, int]:
    """Claim x setting for the open-choice cells whose runs have all finished, while the study is still training:
    (the table, cells judged, cells planned). The same aggregation and checks as the study's own table."""
    root = Path(root)
    planned = plan(params)
    choices = planned[planned["family"] == "choices"]
    # finished: its meta.json is written (as ``record_runs`` and ``run.status`` tell a finished run)
    complete = choices.groupby("setting")["run_dir"].agg(lambda dirs: all((root / d / "meta.json").is_file() for d in dirs))
    cells = choices["setting"].nunique()
    judged = choices[choices["setting"].map(complete)]
    if judged.empty or not (root / GRADNORM).exists():
        return pd.DataFrame(), 0, cells
    losses, summary = runs_tables(params, root, planned=judged)
    return claims_by_setting(params, losses, summary, read_table(root / GRADNORM)), judged["setting"].nunique(), cells


def register(subparsers) -> None:
    p = add_command(subparsers, "aggregate", "the study's loss and summary tables, and claim x setting", _aggregate_main,
                    root=True)
    p.add_argument("--from", dest="snapshots", nargs="+", type=Path, default=None, metavar="DIR",
                   help="instead of the trained runs, the runs recorded in these snapshot directories (a run in one "
                        "only), e.g. from git: records/sensitivity/choices records/sensitivity/depth_lr")
    p = add_command(subparsers, "verdicts", "claim x setting so far, for the open-choice cells whose runs have all "
                    "finished", _verdicts_main, root=True)
    p.add_argument("--out", type=Path, default=None, help="also write that table (CSV)")
    p.add_argument("--add-cell", action="append", default=[], metavar="CELL",
                   help="also a cell params.yaml does not list yet (repeatable; a candidate under validation)")


def _aggregate_main(args) -> None:
    params = load_params(args.params)
    root = args.root
    tables = aggregate(params, root, args.snapshots)
    losses, summary = tables["losses"], tables["summary"]
    by_setting = claims_by_setting(params, losses, summary, read_table(root / GRADNORM))
    write_table(losses.round({"loss": 6}), root / TABLES["losses"])
    write_table(summary, root / TABLES["summary"])
    write_table(by_setting, root / TABLES["claims_by_setting"])
    log.info("%d runs, %d claim x setting verdicts", len(summary), len(by_setting))


def _verdicts_main(args) -> None:
    params = with_cells(load_params(args.params), args.add_cell)
    table, judged, cells = finished_verdicts(params, args.root)
    if table.empty:
        print(f"No open-choice cell has finished all its runs yet (0 of {cells}), or {GRADNORM} is missing.")
        return
    wide = table.pivot_table(index="id", columns="setting", values="verdict", aggfunc="first", sort=False)
    print(f"Claim x setting for the {judged} of {cells} open-choice cells whose runs have all finished "
          f"(seeds per cell: {', '.join(sorted({str(n) for n in table['seeds']}))}); not the study's table until "
          f"every cell has trained:\n")
    print(wide.to_string())
    if args.out:
        write_table(table, args.out)
