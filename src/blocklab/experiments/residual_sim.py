"""Problem 10: how long the pre-norm residual stream grows when every block adds a unit vector of random direction.

Independent random directions are (nearly) orthogonal, so squared lengths add: E|h_L|^2 = L + 1 exactly, and
|h_L| is close to sqrt(L + 1) in high dimension. A block's unit update then changes the stream by 1/|h_(L-1)|.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..io import write_json, write_table
from ..params_file import load_params
from ..provenance import stamp


def random_unit_vectors(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    """Uniform on the sphere: a standard normal vector is rotation-invariant, so normalizing it gives a uniform direction."""
    v = rng.standard_normal((count, dim))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def simulate_streams(dim: int, trials: int, max_blocks: int, seed: int):
    """Stream lengths (trials, max_blocks + 1) for L = 0..max_blocks, and the turn (degrees) each block gives the stream.

    The turn array has shape (trials, max_blocks); column L-1 is the angle between h_(L-1) and h_L.
    """
    rng = np.random.default_rng(seed)
    h = random_unit_vectors(rng, trials, dim)
    lengths, turns = [np.linalg.norm(h, axis=1)], []
    for _ in range(max_blocks):
        new = h + random_unit_vectors(rng, trials, dim)
        lengths.append(np.linalg.norm(new, axis=1))
        with np.errstate(invalid="ignore", divide="ignore"):  # a stream of length 0 has no direction: NaN
            cos = np.einsum("td,td->t", h, new) / (lengths[-2] * lengths[-1])
        turns.append(np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))))
        h = new
    return np.stack(lengths, axis=1), np.stack(turns, axis=1)


def curve_frame(lengths: np.ndarray, turns: np.ndarray) -> pd.DataFrame:
    """One row per L: mean and std of |h_L|, mean |h_L|^2 with its standard error, and the reference sqrt(L + 1).

    rel_change is the measured mean of |Delta_L| / |h_(L-1)| = 1 / |h_(L-1)| (the update has unit length);
    turn_deg the mean angle by which block L turns the stream. Both are undefined (NaN) at L = 0.
    """
    blocks = np.arange(lengths.shape[1])
    squared = lengths**2
    rel_change = np.concatenate([[np.nan], (1.0 / lengths[:, :-1]).mean(axis=0)])
    return pd.DataFrame({
        "blocks": blocks,
        "mean_length": lengths.mean(axis=0),
        "std_length": lengths.std(axis=0, ddof=1),
        "mean_sq_length": squared.mean(axis=0),
        "se_sq_length": squared.std(axis=0, ddof=1) / np.sqrt(lengths.shape[0]),
        "sqrt_L_plus_1": np.sqrt(blocks + 1.0),
        "rel_change": rel_change,
        "turn_deg": np.concatenate([[np.nan], np.nanmean(turns, axis=0)]),
    })


def report_table(curve: pd.DataFrame, report_blocks) -> pd.DataFrame:
    """The measured rows at the depths the problem asks about (document values live in the claims file)."""
    missing = sorted(set(report_blocks) - set(curve["blocks"]))
    if missing:
        raise ValueError(f"report_blocks {missing} exceed the simulated depth {curve['blocks'].max()}")
    rows = curve.set_index("blocks").loc[list(report_blocks)].reset_index()
    return rows[["blocks", "mean_length", "std_length", "sqrt_L_plus_1", "rel_change", "turn_deg"]]


def simulate(section: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    lengths, turns = simulate_streams(section["dim"], section["trials"], section["max_blocks"], section["seed"])
    curve = curve_frame(lengths, turns)
    return curve, report_table(curve, section["report_blocks"])


def register(subparsers) -> None:
    p = subparsers.add_parser("residual-sim", help="problem 10: residual stream length after L random unit updates")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out-curve", required=True, help="CSV, one row per L = 0..max_blocks")
    p.add_argument("--out-table", required=True, help="CSV, the rows at residual_sim.report_blocks")
    p.set_defaults(func=_main)


def _main(args) -> None:
    section = load_params(args.params)["residual_sim"]
    curve, table = simulate(section)
    for frame, out in ((curve, Path(args.out_curve)), (table, Path(args.out_table))):
        write_table(frame, out)
        write_json(stamp(artifact=out.name, params={"residual_sim": section}), out.with_suffix(".json"))
