"""The dynamics study's runs: one collapse-rate run (post-norm with warm-up at a setting and a seed: an ordinary sweep
run, ``sweep.train_copy_run``, with its diagnostics), stopped once it has collapsed (``plan.collapse_stop``), and where
each planned run stands (``status``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...model_config import ConfigError
from ...io import read_table
from ...run_settings import Sweep
from ..cells import Cell
from .plan import case, collapse_params, collapse_stop, plan, snapshots


def parse_window(text: str | None, steps: int) -> tuple[int, int] | None:
    """``--dense FIRST:LAST`` checked: 1 <= FIRST <= LAST <= steps (None: no window)."""
    if text is None:
        return None
    try:
        first, last = (int(part) for part in text.split(":"))
    except ValueError:
        raise ConfigError(f"--dense={text!r} is not allowed; choose FIRST:LAST, two step numbers, e.g. 450:600") from None
    if not 1 <= first <= last <= steps:
        raise ConfigError(f"--dense={text!r} is not allowed; choose 1 <= FIRST <= LAST <= {steps} (sweep.steps)")
    return first, last


def train(params: dict, cell_name: str, norm: str, warmup: int, seed: int, out_dir: Path, threads: int | None = None,
          follow: bool = False, dense: str | None = None) -> dict:
    """One collapse run of a setting at a seed, stopped once it collapsed unless ``follow``; ``dense``: FIRST:LAST,
    steps that also record the forward diagnostics. The plan fixes the norm position and warm-up (``plan.case``: post-norm
    at ``dynamics.collapse.warmup``); others are refused before any compute. Returns its meta."""
    from ...runtime import set_threads
    from ...training.sweep import train_copy_run

    Cell.parse(cell_name)
    if (norm, warmup) != case(params):
        raise ConfigError(f"norm={norm!r}, warmup={warmup!r} is not a dynamics run; allowed: the plan's "
                          f"norm={case(params)[0]!r}, warmup={case(params)[1]!r} (dynamics.collapse.warmup)")
    if seed < 0:
        raise ConfigError(f"--seed={seed} is not allowed; choose an integer >= 0")
    window = parse_window(dense, Sweep.from_params(params).steps)
    set_threads(threads or params["threads_per_run"])
    stop, words = (None, None) if follow else collapse_stop(params)
    p = collapse_params(params, cell_name)
    extra = {"follow": True} if follow else {}
    return train_copy_run(p, norm, warmup, seed, out_dir, params["device"],
                          stop_when=stop, stop_rule=words, dense_steps=window, setting=cell_name, **extra)


def status(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """Every planned run: finished here, checkpointed (at which step), recorded in a snapshot, or still to train."""
    from ...training.sweep import run_state

    root = Path(root)
    recorded = set()
    for d in snapshots(params) or []:
        if (root / d / "runs.csv").is_file():
            runs = read_table(root / d / "runs.csv")
            recorded |= set(zip(runs["setting"], runs["run"]))
    rows, steps = [], Sweep.from_params(params).steps
    for row in plan(params).itertuples(index=False):
        got = run_state(root / row.run_dir, steps)
        state = f"checkpointed at step {got['steps_done']}" if got["status"] == "checkpointed" else \
            "to do" if got["status"] == "not started" else "finished"
        wall = got["seconds"] if state == "finished" else None
        rows.append({"setting": row.setting, "run": row.run, "state": state,
                     "in_snapshot": (row.setting, row.run) in recorded, "wall_time_s": wall})
    return pd.DataFrame(rows)
