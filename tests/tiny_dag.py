"""The tiny DAG, run once per test session (imported by conftest.py): tests/test_pipeline.py checks its artifacts,
tests/test_report.py opens its report in a browser and builds Snakemake's report from it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blocklab.smoke import make_scratch_project

BIN = Path(sys.executable).parent


def run_in_project(cmd, project, check=True) -> subprocess.CompletedProcess:
    """Run a venv command in a scratch project, importing the scratch copy's own code (edits to the working tree made
    during a run cannot leak in)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "MPLBACKEND": "Agg",
           "PYTHONPATH": f"{Path(project) / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=project, env=env, capture_output=True, text=True)
    if check and done.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="session")
def snake_project(tmp_path_factory):
    """The whole DAG on the tiny configuration with Snakemake, in a scratch copy. BLOCKLAB_TINY_PROJECT=<dir>: use that
    finished scratch project instead (e.g. one kept by `blocklab smoke --keep <dir>`), to iterate on the report tests."""
    if os.environ.get("BLOCKLAB_TINY_PROJECT"):
        return Path(os.environ["BLOCKLAB_TINY_PROJECT"])
    project = make_scratch_project(tmp_path_factory.mktemp("snakemake") / "project")
    run_in_project(["snakemake", "--cores", "2"], project)
    return project
