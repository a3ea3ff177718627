"""A block's learning-rate sensitivity: the field's small-scale stability measure, run by ``blocklab lab --lr-sweep``.

Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities" (ICLR 2024), Sec. 2:
train the same model at every learning rate η of a grid; with ℓ(η) the final loss, ℓ* = min over the grid of ℓ(η) and
ℓ₀ the loss at initialization,

    LR sensitivity = mean over η of ( min(ℓ(η), ℓ₀) − ℓ* )

(the clamp at ℓ₀ keeps a diverged run from counting more than a run that never left the start). A block that trains
well only in a narrow band of learning rates scores high; one that trains at every rate scores near 0.

Here, stated before any run: the grid ``LRS`` (5 points, half-decades over 1e-4 … 1e-2); ℓ(η) the mean training loss
of the last ``FINAL_WINDOW`` steps (one step's loss at batch 16 is noisy); ℓ₀ = ln(vocabulary), the copy task's loss
at chance (an untrained model's); a run that diverged (a non-finite loss) has ℓ = ℓ₀. The sensitivity is computed per
seed (each seed's own curve and ℓ*) and reported as the mean over seeds with its 95 % t interval.

The recorded study (``records/lab/lr-sweep``) runs the built-in blocks at the ``lr-sweep`` profile
(``PROFILE``); any block runs the same grid at any lab profile (``blocklab lab BLOCK --lr-sweep``).
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import ConfigError

LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
FINAL_WINDOW = 10
PROFILE = "lr-sweep"
# the recorded study: the seven built-in blocks, in this order on every page
BLOCKS = ("pre", "post", "deepnorm", "admin", "b2t", "rezero", "sandwich")
SEEDS = (0, 1, 2)


def run_name(block: str, lr: float, seed: int, warmup: int = 0) -> str:
    """``<block>-lr<lr>-w<warmup>-s<seed>``, e.g. ``post-lr0.001-w0-s2`` (the lr as Python's ``g`` format writes it)."""
    return f"{block}-lr{lr:g}-w{warmup}-s{seed}"


def lr_setup(setup, lr: float):
    """The profile's setup at one learning rate of the grid."""
    if not (isinstance(lr, float) and math.isfinite(lr) and lr > 0):
        raise ConfigError(f"--lr {lr!r}: give a positive learning rate, e.g. one of {list(LRS)}")
    return replace(setup, lr=float(lr))


def plan(blocks=BLOCKS, lrs=LRS, seeds=SEEDS, warmup: int = 0) -> list[tuple[str, float, int]]:
    """Every run of the recorded study, seed by seed (so that a stopped study has whole seeds), then lr, then block."""
    return [(block, lr, seed) for seed in seeds for lr in lrs for block in blocks]


def train_builtin(params: dict, block: str, lr: float, seed: int, out_dir: Path, profile: str = PROFILE,
                  warmup: int = 0) -> dict:
    """One run of a built-in block at ``profile`` and learning rate ``lr``, through the sweep's own training
    (``training.sweep.train_copy_run``: resumes from its checkpoint, writes meta.json last)."""
    from ..runtime import set_threads
    from ..training.sweep import train_copy_run
    from .spec import params_for, profile_setup

    setup = lr_setup(profile_setup(params, profile, seeds=[seed], warmups=[warmup]), lr)
    set_threads(1)
    return train_copy_run(params_for(params, setup), block, warmup, seed, Path(out_dir), "cpu",
                          lab={"lr_sweep": {"profile": profile, "block": block, "lr": lr, "grid": list(LRS)}})


# ---- the measure --------------------------------------------------------------------------------------------------


def final_loss(steps, losses, vocab_size: int, diverged_step=None, steps_planned: int | None = None) -> float:
    """ℓ(η): the mean loss of the last ``FINAL_WINDOW`` steps; ℓ₀ = ln(vocab_size) for a diverged run."""
    chance = math.log(vocab_size)
    losses = np.asarray(losses, dtype=float)
    if diverged_step is not None or not len(losses) or not np.isfinite(losses).all():
        return chance
    if steps_planned is not None and int(max(steps)) < steps_planned:
        raise ConfigError(f"a run stopped at step {int(max(steps))} of {steps_planned}: not a finished run")
    return float(losses[-FINAL_WINDOW:].mean())


def sensitivity(curve: pd.Series, chance: float) -> float:
    """Wortsman et al.'s LR sensitivity of one curve (final loss indexed by learning rate): mean of
    min(ℓ(η), ℓ₀) − ℓ* over the grid."""
    clamped = np.minimum(curve.to_numpy(dtype=float), chance)
    return float(np.mean(clamped - clamped.min()))


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """The mean of ``values`` and its two-sided ``level`` t interval (scipy.stats.t; NaN bounds for one value)."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return mean, mean - half, mean + half


def table(runs: pd.DataFrame, chance: float) -> pd.DataFrame:
    """One row per block: the LR sensitivity's mean over seeds with its 95 % t interval, the seeds, the best learning
    rate (of the mean curve) and the mean final loss at every learning rate. ``runs``: one row per run with
    block, lr, seed, final_loss."""
    if runs.duplicated(["block", "lr", "seed"]).any():
        twice = runs[runs.duplicated(["block", "lr", "seed"], keep=False)].iloc[0]
        raise ConfigError(f"run {run_name(twice.block, twice.lr, int(twice.seed))} is counted twice")
    rows = []
    for block, part in runs.groupby("block", sort=False):
        wide = part.pivot(index="seed", columns="lr", values="final_loss").sort_index(axis=1)
        complete = wide.dropna()
        per_seed = [sensitivity(row, chance) for _, row in complete.iterrows()]
        mean, low, high = t_interval(per_seed) if per_seed else (float("nan"),) * 3
        curve = wide.mean()
        rows.append({"block": block, "seeds": len(complete), "lr_sensitivity": mean, "low": low, "high": high,
                     "per_seed": ", ".join(f"{v:.3f}" for v in per_seed), "best_lr": float(curve.idxmin()),
                     **{f"loss_lr{lr:g}": float(curve[lr]) for lr in curve.index}})
    return pd.DataFrame(rows)
