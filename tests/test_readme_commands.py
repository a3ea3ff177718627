"""The README's commands, run as a reader types them after `make smoke`: the README activates the venv before any
command that needs it, and each command it says works in the checkout (before the pipeline has run here) exits 0
and says what it shows. The commands are read from the README's text, not copied into this test."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# the sentence that names the commands that work before the pipeline has run here
BEFORE_THE_PIPELINE = re.compile(r"Then (`blocklab status`.*?) show the smoke's result", re.S)


def _named_commands() -> list[str]:
    found = BEFORE_THE_PIPELINE.search(README)
    assert found, "the README no longer says which commands work before the pipeline runs here"
    return [" ".join(c.split()) for c in re.findall(r"`((?:blocklab|dvc)\s[^`]+)`", found.group(1))]


def test_the_readme_activates_the_venv_before_its_first_command_that_needs_it():
    after = README[README.index("make smoke "):]  # what a reader runs once `make smoke` has installed the venv
    activate = after.index("source .venv/bin/activate")
    first = min(m.start() for m in re.finditer(r"(?m)(^|`)(blocklab|dvc|snakemake)\s", after))
    assert activate < first


@pytest.mark.parametrize("command", [c for c in _named_commands() if "report inspect" not in c])
def test_each_command_the_readme_says_works_before_the_pipeline_exits_0(command):
    """Run with the venv's bin first on PATH, as `source .venv/bin/activate` puts it (the test's own interpreter's)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "MPLBACKEND": "Agg"}
    done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    assert done.stdout.strip(), command
