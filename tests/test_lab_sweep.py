"""`blocklab lab --lr-sweep` end to end at the tiny profile, through each front door (a user's module, a transformers
config, a built-in block). A module of its own: these labs are the suite's longest tests, and pytest-xdist schedules
tests by module, so they run beside tests/test_lab.py rather than after it."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lab(*args, cwd=ROOT):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "blocklab.cli", "lab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_a_bad_learning_rate_is_refused_before_anything_is_written(tmp_path):
    blocklab = str(Path(sys.executable).with_name("blocklab"))
    bad = subprocess.run([blocklab, "lab", "pre", "--profile", "tiny", "--lr", "-1", "--out", str(tmp_path / "bad")],
                         cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and "--lr -1.0: give a learning rate in (0, 1)" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("door, warmups", [
    (["--module", "lab_blocks.py:TinyPreNormBlock"], []),  # a user's block, tiny's own warm-ups (0 and 4)
    (["--hf-config", "gpt2"], ["--warmups", "0"]),
    (["pre"], ["--warmups", "0"]),  # a built-in block, one warm-up given
])
def test_the_lr_sweep_finishes_from_every_front_door_with_its_figure_and_summary(tmp_path, door, warmups):
    """`--lr-sweep` through each front door at tiny, from a folder holding only the block's file, with the profile's
    two warm-ups or one given: exit 0; one lab a learning rate of the grid, each rate reaching its runs (the lr each step logged);
    one row of lr_sensitivity.csv a warm-up, Wortsman's measure recomputed here from the runs' final losses; the
    figure; and the summary giving the number with its meaning (the rates at which the block learned, its best loss
    against chance, the blind spot said for this block)."""
    shutil.copy(ROOT / "tests" / "lab_blocks.py", tmp_path / "lab_blocks.py")
    out = tmp_path / "sweep"
    done = _lab(*door, "--profile", "tiny", "--lr-sweep", *warmups, "--out", str(out), "--cores", "2",
                "--params", str(ROOT / "params.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    from blocklab.lab import lrsweep

    label = {"--module": "TinyPreNormBlock", "--hf-config": "gpt2"}.get(door[0], door[0])
    runs = pd.read_csv(out / "lr_runs.csv")
    expected = [0] if warmups else [0, 4]
    assert (runs["block"] == label).all() and sorted(runs["warmup"].unique()) == expected
    assert len(runs) == len(lrsweep.LRS) * len(expected)
    for lr in lrsweep.LRS:
        for w in expected:
            # the rate the optimiser stepped with: loss.csv logs each step's lr; its peak (after any warm-up) is the rate
            steps = pd.read_csv(out / f"lr{lr:g}" / "runs" / f"w{w}-s0" / "loss.csv")
            assert steps["lr"].max() == pytest.approx(lr, rel=1e-6)
    table = pd.read_csv(out / "lr_sensitivity.csv")
    assert table["warmup"].tolist() == expected and (table["runs"] == len(lrsweep.LRS)).all()
    chance = math.log(json.loads((out / "lr0.001" / "spec.json").read_text())["setup"]["vocab_size"])
    for r in table.itertuples():
        curve = runs[runs["warmup"] == r.warmup].set_index("lr")["final_loss"]
        capped = np.minimum(curve, chance)
        assert r.lr_sensitivity == pytest.approx(np.mean(capped - capped.min()))
        assert r.runs_learned == runs[runs["warmup"] == r.warmup]["learned"].sum()
    assert (out / "lr_sensitivity.png").stat().st_size > 10_000
    page = (out / "README.md").read_text(encoding="utf-8")
    for r in table.itertuples():
        assert f"{r.block}: LR sensitivity {r.lr_sensitivity:.3f}" in done.stderr and r.block in page
        assert f"{int(r.runs_learned)} of {int(r.runs)} runs learned" in done.stderr
    assert "× chance (ln V = " in page and ("at no rate of the grid" in page) == (table["runs_learned"] == 0).any()
