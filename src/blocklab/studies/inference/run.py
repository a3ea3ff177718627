"""The inference study's runs: one fitting run (or held-out run) of a candidate setting, ``fit_steps`` steps long, and
where each planned fitting run stands (``status``: from the main sweep, a snapshot, or trained here; the run time left
projected as the sensitivity study projects it)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...run_settings import Sweep
from ..cells import Cell, require_planned
from ..sensitivity.run import projected_seconds
from .plan import fit_params, holdout_plan, plan, read_snapshots, snapshots


def train(params: dict, cell_name: str, norm: str, warmup: int, seed: int, out_dir: Path, threads: int | None = None,
          source: str = "params.yaml") -> dict:
    """One fitting run (or held-out run) of a cell, refused before any compute when ``source``'s plans lack it;
    returns its meta."""
    from ...runtime import set_threads
    from ...training.sweep import train_copy_run

    cell = Cell.parse(cell_name)
    require_planned(pd.concat([plan(params), holdout_plan(params)]), cell, norm, warmup, seed,
                    f"the inference fitting runs (or held-out runs) of {source}")
    set_threads(threads or params["threads_per_run"])
    return train_copy_run(fit_params(params, cell), norm, warmup, seed, out_dir, params["device"],
                          inference_cell=cell.name)


def status(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """Every planned fitting run: where it comes from (``source``: main sweep, a snapshot, or trained here), where it
    stands (recorded, finished, checkpointed, not started), the steps and run time spent and the run time projected for
    what is left (seconds per step scaled with batch size, from the runs timed on this family: see
    ``sensitivity.run.projected_seconds``)."""
    from ...training.sweep import run_state

    root, fit = Path(root), params["inference"]["fit_steps"]
    planned = plan(params)
    recorded, _ = read_snapshots([root / d for d in snapshots(params)])
    where = {(r.setting, r.run): r for r in recorded.itertuples(index=False)}
    rows = []
    for row in planned.itertuples(index=False):
        cell = Cell.parse(row.setting)
        steps = Sweep.from_params(params).steps if row.main_sweep else fit
        base = {"setting": row.setting, "run": row.run, "batch_size": cell.batch_size, "depth": cell.depth,
                "precision": cell.precision}
        hit = None if row.main_sweep else where.get((row.setting, row.run))
        if hit is not None:
            snap = str(Path(hit.snapshot).relative_to(root)) if Path(hit.snapshot).is_absolute() else hit.snapshot
            timed = snap.endswith("inference/fit") and hit.wall_time_s == hit.wall_time_s
            rows.append({**base, "source": snap, "status": "recorded", "steps_done": fit if timed else 0,
                         "steps_left": 0, "seconds": float(hit.wall_time_s) if timed else 0.0})
            continue
        state = run_state(root / row.run_dir, steps)
        rows.append({**base, "source": "main sweep" if row.main_sweep else "here", **state,
                     "steps_left": 0 if state["status"] == "finished" else steps - state["steps_done"]})
    frame = pd.DataFrame(rows)
    frame["projected_s"] = projected_seconds(frame)
    return frame
