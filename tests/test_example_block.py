"""The example block a user copies (examples/my_block.py): the lab trains it at the tiny profile from the user's own
folder, and the reviewer reads it as the pre-norm, causal block it says it is."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_block.py"


def _blocklab(*args, cwd):
    return subprocess.run([sys.executable, "-m", "blocklab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "MPLBACKEND": "Agg"})


def test_the_example_block_runs_through_the_lab_as_the_readme_writes_it(tmp_path):
    """`blocklab lab --module my_block.py:Block` in a folder holding a copy of the example, at the tiny profile (one
    run): exit 0, its run in lab.csv, and its page says the placement read (pre) and the final norm added."""
    shutil.copy(EXAMPLE, tmp_path / "my_block.py")
    done = _blocklab("lab", "--module", "my_block.py:Block", "--params", str(ROOT / "params.yaml"), "--profile", "tiny",
                     "--warmups", "0", "--out", "lab", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lab = pd.read_csv(tmp_path / "lab" / "lab.csv")
    assert lab[["block", "n_layers", "warmup", "seed"]].values.tolist() == [["Block", 2, 0, 0]]
    assert lab["final_loss"].notna().all()
    page = (tmp_path / "lab" / "README.md").read_text(encoding="utf-8")
    assert "Block(BlockConfig(" in page and "Norm placement as read**: pre" in page
    assert "one LayerNorm after the last block" in page


def test_the_reviewer_passes_the_example_block(tmp_path):
    """`blocklab review --module my_block.py:Block --role decoder`, as its docstring writes it: pre-norm, causal, pass."""
    shutil.copy(EXAMPLE, tmp_path / "my_block.py")
    done = _blocklab("review", "--module", "my_block.py:Block", "--role", "decoder", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pre-norm: h + F(norm(h))" in done.stdout and "causal: perturbing future tokens" in done.stdout
