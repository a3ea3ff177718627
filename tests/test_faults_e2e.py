"""Faults end to end on the tiny DAG, each in a copy of it (tests/tiny_dag.py): the README's command after the fault,
and what it keeps and says. Minutes each, so opt-in: BLOCKLAB_SLOW_FAULTS=1 (with BLOCKLAB_TINY_PROJECT=<a finished
scratch project> they reuse it instead of building one). docs/reproducibility.md, "Faults", has the table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_faults_io import blocklab, flip_a_byte

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.environ.get("BLOCKLAB_SLOW_FAULTS"),
                                                   reason="end-to-end faults on the tiny DAG: BLOCKLAB_SLOW_FAULTS=1")]


def copy_project(snake_project: Path, dest: Path) -> Path:
    shutil.copytree(snake_project, dest, symlinks=True, ignore=shutil.ignore_patterns(".snakemake"))
    return dest


def snakemake(project: Path, *args: str, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "MPLBACKEND": "Agg",
           "PYTHONPATH": str(project / "src")}
    cmd = [str(bin_dir / "snakemake"), "--cores", "2", *args]
    if popen:
        return subprocess.Popen(cmd, cwd=project, env=env, text=True, **popen)
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=1800)


def test_a_flipped_sidecar_is_drawn_again_by_the_readme_command_in_a_path_with_a_space_and_hangul(snake_project,
                                                                                                     tmp_path):
    project = copy_project(snake_project, tmp_path / "내 프로젝트 a b" / "proj")
    sidecar = project / "figs" / "problem11_norm_warmup.json"
    whole, picture = json.loads(sidecar.read_text(encoding="utf-8")), sidecar.with_suffix(".png").read_bytes()
    flip_a_byte(sidecar, at=2)  # no longer valid UTF-8
    table = project / "data" / "problem9" / "scores.csv"  # an intermediate table: Snakemake alone would not remake it
    table_bytes = table.read_bytes()
    flip_a_byte(table)
    assert blocklab("verify", "data", "figs", "reports", cwd=project).returncode == 3
    done = snakemake(project)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "problem11_norm_warmup.json: damaged" in line]
    assert len(said) == 1 and "removed (problem11_norm_warmup.json, problem11_norm_warmup.png)" in said[0], said
    again = json.loads(sidecar.read_text(encoding="utf-8"))  # its paths name this copy's folder: the rest is the same
    assert {k: again[k] for k in ("figure", "params")} == {k: whole[k] for k in ("figure", "params")}
    assert sidecar.with_suffix(".png").read_bytes() == picture, "drawn again, byte-identical"
    assert table.read_bytes() == table_bytes, "made again, byte-identical"
    assert blocklab("verify", "data", "figs", "reports", cwd=project).returncode == 0


def test_params_edited_while_the_pipeline_runs_stops_its_later_jobs_and_the_rerun_uses_the_new_values(snake_project,
                                                                                                        tmp_path):
    project = copy_project(snake_project, tmp_path / "proj")
    runs = sorted((project / "data/sweep/runs").iterdir())
    for run in runs:
        shutil.rmtree(run)
    running = snakemake(project, "--cores", "1", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first = None
    while running.poll() is None and first is None:
        first = next((r for r in runs if (r / "meta.json").is_file()), None)
        time.sleep(0.2)
    params = project / "params.yaml"
    params.write_text(params.read_text(encoding="utf-8").replace("  steps: 60", "  steps: 50"), encoding="utf-8")
    output = running.communicate(timeout=1800)[0]
    assert first is not None and running.returncode != 0
    assert "params.yaml: changed while the pipeline runs" in output
    kept = [r for r in runs if (r / "meta.json").is_file()]
    assert first in kept and all(json.loads((r / "meta.json").read_text())["loss_steps"] == 60 for r in kept), \
        "what finished before the edit is kept, and no run trained with the new value under the old plan"
    done = snakemake(project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(json.loads((r / "meta.json").read_text())["loss_steps"] == 50 for r in runs)
