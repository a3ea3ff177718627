"""The sensitivity study's verdicts and figures: every sweep claim re-judged under every setting of the open choices
(claim x setting), which verdicts are robust, the study's three figures, and the commands ``sensitivity aggregate``,
``sensitivity status`` and ``sensitivity figures``. The reporting layer: it reads the experiments' tables and applies
the claims' own checks (``reporting.claims``) to them."""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from ..experiments.sensitivity.aggregation import aggregate, as_sweep_tables
from ..experiments.sensitivity.status import progress, projected_seconds
from ..experiments.family import add_command
from ..config import ConfigError
from ..io import read_table, write_table
from ..params import load_params
from ..study import FIGURES, GRADNORM, TABLES, Cell, cell_params, default_cell, plan, read_records, snapshots, with_cells
from . import claims
from .claims import NOT_CHECKABLE

log = logging.getLogger("blocklab.sensitivity")


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
        data = claims.Data(".", cell_params(params, cell), tables=tables)
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
    status = progress(params, root).drop_duplicates("run_dir").set_index("run_dir")["status"]
    choices = planned[planned["family"] == "choices"]
    complete = choices.groupby("setting")["run_dir"].agg(lambda dirs: bool((status[dirs] == "finished").all()))
    cells = choices["setting"].nunique()
    judged = choices[choices["setting"].map(complete)]
    if judged.empty or not (root / GRADNORM).exists():
        return pd.DataFrame(), 0, cells
    losses, summary = aggregate(params, root, planned=judged)
    return claims_by_setting(params, losses, summary, read_table(root / GRADNORM)), judged["setting"].nunique(), cells


def at_batch(gradnorm: pd.DataFrame, params: dict) -> pd.DataFrame:
    """The gradients at init at params.yaml's batch size (the figure compares position signals at one batch)."""
    return gradnorm[gradnorm["batch_size"] == params["copy_task"]["batch_size"]]


def save_figures(params: dict, data: str | Path = "data", figs: str | Path = "figs", lang: str | None = None) -> list:
    from ..figures import sensitivity as draw  # matplotlib only where figures are drawn
    from ..figures import style

    lang = lang or params["figures"]["lang"]
    data = Path(data)
    where = lambda rel: data / Path(rel).relative_to("data")  # noqa: E731  (the tables' paths under another data dir)
    table = lambda rel: read_table(where(rel))  # noqa: E731
    vocab = params["copy_task"]["vocab_size"]
    rule = params["sensitivity"]["early_stop"]
    made = {
        "sensitivity_phase": lambda: draw.phase_figure(table(TABLES["summary"]), lang=lang, budget=params["sweep"]["steps"],
                                                     rule=rule),
        "sensitivity_loss_curves": lambda: draw.loss_curves_by_setting_figure(table(TABLES["losses"]), lang=lang,
                                                                             vocab_size=vocab,
                                                                             default=default_cell(params).name),
        "sensitivity_gradnorm": lambda: draw.gradnorm_by_position_figure(at_batch(table(GRADNORM), params), lang=lang),
    }
    out = []
    for name, build in made.items():
        style.setup(lang)
        out.append(style.save(build(), Path(figs) / f"{name}.png", dpi=params["figures"]["dpi"],
                              sources=[str(where(s)) for s in FIGURES[name]],
                              params={"figures": params["figures"], "lang": lang, "sensitivity": params["sensitivity"]}))
    return out


# ---- command line ------------------------------------------------------------------------------------------------------


def register(subparsers) -> None:
    p = add_command(subparsers, "aggregate", "the study's loss and summary tables, and claim x setting", _aggregate_main,
                    root=True)
    p.add_argument("--from", dest="snapshots", nargs="+", type=Path, default=None, metavar="DIR",
                   help="instead of the trained runs, the runs recorded in these snapshot directories (a run in one "
                        "only), e.g. from git: docs/sensitivity/choices docs/sensitivity/depth_lr")
    p = add_command(subparsers, "status", "which runs of the study are finished, checkpointed or to do; hours", _status_main,
                    root=True)
    p.add_argument("--cores", default=2, type=int, help="cores the study runs on (jobs = cores / threads_per_run)")
    p.add_argument("--verdicts", action="store_true",
                   help="instead: claim x setting so far, for the open-choice cells whose runs have all finished")
    p.add_argument("--out", type=Path, default=None, help="with --verdicts: also write that table (CSV)")
    p.add_argument("--add-cell", action="append", default=[], metavar="CELL",
                   help="also a cell params.yaml does not list yet (repeatable; a candidate under validation)")
    p = add_command(subparsers, "figures", "draw the sensitivity study's figures from its tables", _figures_main)
    p.add_argument("--data", default="data")
    p.add_argument("--figs", default="figs")
    p.add_argument("--lang", choices=["ko", "en"], default=None)


def _aggregate_main(args) -> None:
    params = load_params(args.params)
    root = args.root
    dirs = args.snapshots or [root / d for d in snapshots(params)]
    records = read_records(dirs) if dirs else None
    losses, summary = aggregate(params, root, records=records)
    gradnorm = read_table(root / GRADNORM)
    by_setting = claims_by_setting(params, losses, summary, gradnorm)
    write_table(losses.round({"loss": 6}), root / TABLES["losses"])
    write_table(summary, root / TABLES["summary"])
    write_table(by_setting, root / TABLES["claims_by_setting"])
    log.info("%d runs, %d claim x setting verdicts", len(summary), len(by_setting))


def _status_main(args) -> None:
    params = with_cells(load_params(args.params), args.add_cell)
    if args.verdicts:
        _verdicts_main(params, args)
        return
    frame = progress(params, args.root)
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


def _verdicts_main(params: dict, args) -> None:
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


def _figures_main(args) -> None:
    for path in save_figures(load_params(args.params), args.data, args.figs, args.lang):
        print(path)
