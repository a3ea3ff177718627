"""The sensitivity study's runs: one run of a cell (an ordinary sweep run, ``sweep.train_copy_run``: same code,
artifacts, checkpoints, resume, provenance), the gradients at init at each position signal and batch size the study
plans, and where the study stands while it trains (it may be stopped and resumed): each planned run finished,
checkpointed or not started, the run time spent, and a projection of what is left (``blocklab sensitivity status``)."""
from __future__ import annotations

import copy
import logging
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from ...run_settings import Sweep
from ..cells import Cell, cell_params, require_planned
from .plan import early_stop_rule, plan

log = logging.getLogger("blocklab.sensitivity")

# The columns of the study's gradients at init (``gradnorm_by_choice``, ``sensitivity gradnorm``).
GRADNORM_COLUMNS = ["position", "batch_size", "norm", "seed", "block", "grad_norm", "loss"]


def train(params: dict, cell_name: str, norm: str, warmup: int, seed: int, out_dir: Path, threads: int | None = None,
          source: str = "params.yaml") -> dict:
    """One planned run of a cell (refused before any compute when ``source``'s plan lacks it); returns its meta."""
    from ...runtime import set_threads
    from ...training.sweep import train_copy_run

    cell = Cell.parse(cell_name)
    require_planned(plan(params), cell, norm, warmup, seed, f"the sensitivity section of {source}")
    set_threads(threads or params["threads_per_run"])
    stop, words = early_stop_rule(params, cell)
    return train_copy_run(cell_params(params, cell), norm, warmup, seed, out_dir, params["device"],
                          stop_when=stop, stop_rule=words, sensitivity_cell=asdict(cell) | {"name": cell.name})


def gradnorm_by_choice(params: dict) -> pd.DataFrame:
    """Gradient norms at init (the gradnorm section's init, norms and seeds) at every (position signal, batch size) of
    the study's open-choice cells: the one batch each seed draws has the cell's own size, so a cell's claim check reads
    the gradients its own runs started from."""
    from ...experiments.gradnorm import gradnorm_frame

    planned = plan(params)
    pairs = planned.loc[planned["family"] == "choices", ["position", "batch_size"]].drop_duplicates()
    parts = []
    for position, batch in pairs.itertuples(index=False):
        p = copy.deepcopy(params)
        p["copy_model"]["position"] = position
        p["copy_task"]["batch_size"] = int(batch)
        parts.append(gradnorm_frame(p).assign(position=position, batch_size=int(batch)))
    return pd.concat(parts, ignore_index=True)[GRADNORM_COLUMNS]


def status(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """Where each planned run stands (the study may be stopped and resumed): finished, checkpointed at a step, or not
    started.

    ``seconds`` is the run time spent so far (a finished run's ``wall_time_s``, a checkpoint's saved seconds), and
    ``steps_left`` the most steps still to train (an early-stoppable run may need fewer).
    """
    from ...training.sweep import run_state

    root, steps = Path(root), Sweep.from_params(params).steps
    rows = []
    for row in plan(params).drop_duplicates("run_dir").itertuples(index=False):
        state = run_state(root / row.run_dir, steps)
        where, done, seconds = state["status"], state["steps_done"], state["seconds"]
        rows.append({"setting": row.setting, "run": row.run, "batch_size": row.batch_size, "depth": row.depth,
                     "precision": row.precision, "status": where, "steps_done": done,
                     "steps_left": 0 if where == "finished" else steps - done, "seconds": seconds,
                     "run_dir": row.run_dir})
    return pd.DataFrame(rows)


def projected_seconds(frame: pd.DataFrame) -> pd.Series:
    """A projection of each run's remaining run time from the runs that have trained: seconds per step taken to scale
    with batch size x (depth + 1) (the blocks plus embedding and head), one factor per precision (median over runs)."""
    work = frame["batch_size"] * (frame["depth"] + 1)
    trained = frame[frame["steps_done"] > 0]
    per_unit = (trained["seconds"] / trained["steps_done"] / work[trained.index]).groupby(trained["precision"]).median()
    fallback = per_unit.get("fp32", per_unit.max() if len(per_unit) else float("nan"))
    unit = frame["precision"].map(per_unit).fillna(fallback)
    return frame["steps_left"] * work * unit
