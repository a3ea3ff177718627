"""DVC as people use it: `dvc metrics show` / `dvc exp show` read the pipeline's outcome from one small JSON,
and `dvc plots` has a plot for every figure drawn from a CSV table."""
from pathlib import Path

import pandas as pd
import yaml

from blocklab.params_file import load_params
from blocklab.pipeline import FIGURES
from blocklab.reporting import metrics
from blocklab.studies.dynamics.plan import FIGURES as DYNAMICS_FIGURES
from blocklab.studies.sensitivity.plan import FIGURES as SENSITIVITY_FIGURES
from blocklab.records import GALLERY

ROOT = Path(__file__).resolve().parents[1]
GALLERY = ROOT / GALLERY
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))


def test_the_metrics_are_the_gallery_runs_numbers(tmp_path):
    values = metrics.write_metrics(load_params(GALLERY / "params.yaml"), GALLERY, tmp_path / "metrics.json")
    claims = pd.read_csv(GALLERY / "claims/claims.csv")
    assert sum(values["claims"].values()) == len(claims)
    assert values["claims"]["reproduced"] == int((claims["verdict"] == "reproduced").sum())
    summary = pd.read_csv(GALLERY / "sweep/summary.csv")
    pre = summary[(summary["norm"] == "pre") & (summary["warmup"] == 0)]["final_loss"].mean()
    assert abs(values["loss"]["pre_w0"] - pre) <= 1e-3 * pre
    assert set(values["loss"]) == {"pre_w0", "pre_w400", "post_w0", "post_w400"}
    rates = pd.read_csv(GALLERY / "dynamics/rates.csv").set_index("setting")
    assert values["collapse"]["runs"] == rates.loc["learned-b64-L24-lr0.001-fp32", "runs"]
    assert all(isinstance(v, (int, float)) for group in values.values() for v in group.values())  # numbers only


def test_dvc_declares_the_metrics_the_pipeline_writes():
    from blocklab.records import SMOKE_METRICS

    # the pipeline's own, then the last `blocklab smoke`'s copy (so `dvc metrics show` shows it after a smoke)
    assert DVC["metrics"] == [metrics.OUT, SMOKE_METRICS]
    rules = (ROOT / "workflow/rules/report.smk").read_text(encoding="utf-8")
    assert f'"{metrics.OUT}"' in rules and f'"{metrics.OUT}"' in (ROOT / "Snakefile").read_text(encoding="utf-8")
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in DVC["stages"]["pipeline"]["outs"]]
    assert any(metrics.OUT.startswith(out + "/") for out in outs)  # tracked, and restored with its directory


# Its data is diagnostics.parquet (summary.csv only names the runs): dvc plots reads CSV, TSV, JSON and YAML.
NOT_PLOTTED = {"dynamics_gradnorm"}


def test_every_figure_with_a_csv_table_has_a_dvc_plot():
    """Each figure has a dvc plot of its own name that reads one of the figure's CSV tables."""
    plots = {name: set(spec["y"]) for plot in DVC["plots"] for name, spec in plot.items()}
    figures = {**FIGURES, **SENSITIVITY_FIGURES, **DYNAMICS_FIGURES}
    assert NOT_PLOTTED < set(figures) and len(figures) == 15
    for name, tables in figures.items():
        if name not in NOT_PLOTTED:
            assert plots.get(name, set()) & {t for t in tables if t.endswith(".csv")}, name
