"""Where the study stands while it trains (it may span sessions): each planned run finished, checkpointed or not started,
the run time spent, and a projection of what is left (``blocklab sensitivity status``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...study import plan


def progress(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """Where each planned run stands (the study may span sessions): finished, checkpointed at a step, or not started.

    ``seconds`` is the run time spent so far (a finished run's ``wall_time_s``, a checkpoint's saved seconds), and
    ``steps_left`` the most steps still to train (an early-stoppable run may need fewer).
    """
    from ...training.sweep import run_state

    root, steps = Path(root), params["sweep"]["steps"]
    rows = []
    for row in plan(params).drop_duplicates("run_dir").itertuples(index=False):
        state = run_state(root / row.run_dir, steps)
        status, done, seconds = state["status"], state["steps_done"], state["seconds"]
        rows.append({"setting": row.setting, "run": row.run, "batch_size": row.batch_size, "depth": row.depth,
                     "precision": row.precision, "status": status, "steps_done": done,
                     "steps_left": 0 if status == "finished" else steps - done, "seconds": seconds,
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
