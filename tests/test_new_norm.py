"""A norm position added to the sweep goes through every job to the report, or is refused before any job.

The report names each position from its declaration (model_config.NORM_POSITION_SPECS), as the figures do: a position
`sweep.norms` may list is one the report can write (a hand-written ("post", "pre") once crashed it after the last run).
"""
from __future__ import annotations

import shutil

import pandas as pd
import yaml

from blocklab.model_config import NORM_POSITION_SPECS, NORM_POSITIONS
from tiny_dag import run_in_project


def test_a_norm_position_added_to_the_tiny_sweep_reaches_the_report(snake_project, tmp_path):
    """The finished tiny DAG, with one more declared position in sweep.norms: its runs train, and the sweep's table,
    the probe's table, the claims and the report (in both languages' labels, the report's own) hold it."""
    project = tmp_path / "project"
    shutil.copytree(snake_project, project, symlinks=True)  # its finished jobs kept (mtimes too): only what changes runs
    params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
    added = next(n for n in NORM_POSITIONS if n not in params["sweep"]["norms"])
    params["sweep"]["norms"] = [*params["sweep"]["norms"], added]
    (project / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False), encoding="utf-8")

    run_in_project(["snakemake", "--cores", "2"], project)
    summary = pd.read_csv(project / "data/sweep/summary.csv")
    runs = summary[summary["norm"] == added]
    assert len(runs) == len(params["sweep"]["warmups"]) * len(params["sweep"]["seeds"]), summary[["norm", "warmup"]]
    assert added in set(pd.read_csv(project / "data/probe/copy.csv")["norm"])
    lang = params["figures"]["lang"]
    html = (project / "reports/analysis.html").read_text(encoding="utf-8")
    assert NORM_POSITION_SPECS[added].label(lang) in html
    assert (project / "logs/verified.txt").is_file()


def test_a_norm_position_not_declared_is_refused_before_any_job(snake_project, tmp_path):
    """A name no position declares stops the pipeline before any job, in one line naming the key and the allowed."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("Snakefile", "workflow", "profiles", "src", "configs", "notebooks", "records"):
        source = snake_project / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, project / name)
    params = yaml.safe_load((snake_project / "params.yaml").read_text(encoding="utf-8"))
    params["sweep"]["norms"] = [*params["sweep"]["norms"], "mixln"]
    (project / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False), encoding="utf-8")
    done = run_in_project(["snakemake", "--cores", "1"], project, check=False)
    assert done.returncode != 0
    said = (done.stdout + done.stderr)
    assert "sweep.norms" in said and "mixln" in said and all(n in said for n in NORM_POSITIONS), said[-2000:]
    assert not (project / "data").exists()
