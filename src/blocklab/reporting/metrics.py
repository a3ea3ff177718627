"""The pipeline's outcome in a few numbers, for `dvc metrics show` and `dvc exp show` (dvc.yaml's ``metrics:``): the
sweep's final loss per norm position and warm-up (the mean over its seeds), the claims' verdict counts, and the collapse
rate of post-norm after warm-up at the main sweep's setting when the dynamics study is in the run.

Read from tables the pipeline already wrote (``data/sweep/summary.csv``, ``data/claims/claims.csv``,
``data/dynamics/rates.csv``); written by the `metrics` rule as ``data/claims/metrics.json``. Numbers only, rounded to
4 significant digits, so that an experiment table fits a terminal.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..io import read_table, write_json
from ..studies.cells import default_cell
from .verdicts import VERDICTS

OUT = "data/claims/metrics.json"


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def metrics(params: dict, claims: pd.DataFrame, summary: pd.DataFrame, rates: pd.DataFrame | None = None) -> dict:
    """{"loss": {"pre_w0": final loss, ...}, "claims": {"reproduced": count, ...}, "collapse": {"rate", "runs"}}: the
    columns of `dvc exp show` (collapse only when the dynamics study's rates are there)."""
    final = summary.groupby(["norm", "warmup"], sort=True)["final_loss"].mean()
    out = {"loss": {f"{norm}_w{warmup}": _round(loss) for (norm, warmup), loss in final.items()},
           "claims": {v.split(" here")[0].replace(" ", "_"): int((claims["verdict"] == v).sum()) for v in VERDICTS}}
    setting = default_cell(params).name
    if rates is not None and (rates["setting"] == setting).any():
        row = rates[rates["setting"] == setting].iloc[0]
        out["collapse"] = {"rate": _round(row["collapsed_rate"]), "runs": int(row["runs"])}
    return out


def write_metrics(params: dict, data: str | Path = "data", out: str | Path = OUT) -> dict:
    data = Path(data)
    rates = data / "dynamics" / "rates.csv"
    values = metrics(params, read_table(data / "claims" / "claims.csv"), read_table(data / "sweep" / "summary.csv"),
                     read_table(rates) if rates.is_file() else None)
    write_json(values, Path(out))
    return values


def register(subparsers) -> None:
    p = subparsers.add_parser("metrics", help="final losses, verdict counts and the collapse rate as one JSON "
                                              "(dvc metrics show)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--data", default="data")
    p.add_argument("--out", default=OUT)
    p.set_defaults(func=_main)


def _main(args) -> None:
    from ..params_file import load_params

    write_metrics(load_params(args.params), args.data, args.out)
