"""The study's tables from its runs: per-step losses and one summary row per run (outcome, losses at steps 100/200/300,
steps to learn, relapse after learning, why it stopped), read from the trained runs or from snapshots in git; and
snapshots of finished runs (``record_runs``), small enough for git."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pandas as pd

from ...config import ConfigError
from ...integrity import read_run
from ...io import read_json, read_table
from ...study import RUN_KEY, plan, unrecorded

LOSS_AT = (100, 200, 300)
# What a run's summary needs from its meta.json besides its losses: a snapshot (``record_runs``) keeps exactly these,
# so a reader can re-aggregate and re-judge the study from git without the trained runs.
# The columns of the study's gradients at init (``gradnorm_by_choice``, ``sensitivity gradnorm``).
GRADNORM_COLUMNS = ["position", "batch_size", "norm", "seed", "block", "grad_norm", "loss"]
RECORD_FIELDS = ("vocab_size", "diverged_step", "stopped_step", "stop_reason", "wall_time_s", "machine", "git_commit")


def steps_to_learn(losses: pd.Series, steps: pd.Series, below: float, for_steps: int) -> float:
    """The first step of the first run of ``for_steps`` consecutive losses below ``below`` (NaN: never)."""
    streak = 0
    for step, value in zip(steps, losses):
        streak = streak + 1 if value < below else 0
        if streak == for_steps:
            return float(step - for_steps + 1)
    return float("nan")


def relapse(losses: pd.Series, steps: pd.Series, below: float, for_steps: int) -> tuple[float, float]:
    """The worst loss after a run had learned (``for_steps`` consecutive losses below ``below``, as steps_to_learn),
    and its step: how far it fell back (a spike it recovered from, or the document's collapse). (NaN, NaN): it never
    learned, or nothing came after."""
    learned = steps_to_learn(losses, steps, below, for_steps)
    if math.isnan(learned):
        return float("nan"), float("nan")
    losses, steps = pd.Series(list(losses)), pd.Series(list(steps))
    after = losses[steps >= learned + for_steps]
    if after.empty:
        return float("nan"), float("nan")
    return float(after.max()), float(steps[after.idxmax()])


def _record(meta: dict) -> dict:
    libraries, code = meta.get("libraries", {}), meta.get("code", {})
    return {"vocab_size": meta["copy_task"]["vocab_size"], "diverged_step": meta.get("diverged_step"),
            "stopped_step": meta.get("stopped_step"), "stop_reason": meta.get("stop_reason"),
            "wall_time_s": meta["wall_time_s"], "machine": libraries.get("cpu") or None,
            "git_commit": code.get("git_commit")}


def _runs_from_dirs(root: Path, planned: pd.DataFrame):
    for row in planned.itertuples(index=False):
        meta, loss = read_run(root / row.run_dir)  # checked against its checksums and recorded steps
        yield row, _record(meta), loss


def _runs_from_records(records: pd.DataFrame, losses: pd.DataFrame, planned: pd.DataFrame):
    if why := unrecorded(records, planned):
        raise ConfigError(why)
    records = records.drop_duplicates(RUN_KEY).set_index(RUN_KEY)
    by_run = {key: part for key, part in losses.groupby(RUN_KEY, sort=False)}
    for row in planned.itertuples(index=False):
        record = {k: (None if pd.isna(v) else v) for k, v in records.loc[(row.setting, row.run)].to_dict().items()}
        loss = by_run.get((row.setting, row.run), losses.iloc[:0])[["step", "loss"]].sort_values("step", ignore_index=True)
        yield row, record, loss


def aggregate(params: dict, root: str | Path = ".", planned: pd.DataFrame | None = None,
              records: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy per-step losses and one summary row per (family, run) of the plan (or of ``planned``, some of its rows),
    read from the runs' own files, or from ``records``: (runs, losses) tables of snapshots (``read_records``)."""
    from ...training.sweep import classify  # torch: only where runs are aggregated

    rule = params["sensitivity"]["early_stop"]
    curves, rows = [], []
    planned = plan(params) if planned is None else planned
    runs = _runs_from_dirs(Path(root), planned) if records is None else _runs_from_records(*records, planned)
    for row, record, loss in runs:
        ident = {k: getattr(row, k) for k in ("family", "setting", "position", "batch_size", "depth", "lr",
                                             "precision", "norm", "warmup", "seed", "run")}
        curves.append(loss[["step", "loss"]].assign(**ident))
        diverged, stopped = record["diverged_step"], record["stopped_step"]
        outcome = "diverged" if diverged or not len(loss) else classify(loss["loss"], record["vocab_size"])
        if stopped and not diverged:
            outcome = "learned"  # the stop rule fired: the loss stayed below its threshold (the run has learned)
        at = {f"loss_at_{s}": float(loss.loc[loss["step"] == s, "loss"].iloc[0]) if (loss["step"] == s).any()
              else float("nan") for s in LOSS_AT}
        worst, worst_step = relapse(loss["loss"], loss["step"], rule["loss_below"], rule["for_steps"])
        rows.append({
            **ident, **at,
            "final_loss": float(loss["loss"].iloc[-1]) if len(loss) else float("nan"),
            "min_loss": float(loss["loss"].min()) if len(loss) else float("nan"),
            "outcome": outcome,
            "steps_to_learn": steps_to_learn(loss["loss"], loss["step"], rule["loss_below"], rule["for_steps"]),
            "relapse_loss": worst, "relapse_step": worst_step,
            "trained_steps": int(loss["step"].max()) if len(loss) else 0,
            "stop_reason": record["stop_reason"] or ("diverged" if diverged else "trained the full budget"),
            "main_sweep": bool(row.main_sweep),
            "wall_time_s": record["wall_time_s"],
            "machine": record["machine"],
            "run_dir": row.run_dir,
        })
    losses = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame()
    return losses, pd.DataFrame(rows)


def record_runs(params: dict, root: str | Path = ".", planned: pd.DataFrame | None = None,
                machine: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A snapshot of the finished runs among ``planned`` (default: the whole plan), small enough for git: (runs: one
    row per run with what its summary needs from meta.json, losses: every step, summary: the study's own summary of
    them). ``machine`` names the processor where the runs' meta.json does not (runs trained before it was recorded)."""
    root = Path(root)
    planned = plan(params) if planned is None else planned
    finished = planned[[(root / d / "meta.json").exists() for d in planned["run_dir"]]]
    rows, curves = [], []
    for row, record, loss in _runs_from_dirs(root, finished.drop_duplicates("run_dir")):
        rows.append({"setting": row.setting, "run": row.run, **record, "machine": record["machine"] or machine,
                     "run_dir": row.run_dir})
        curves.append(loss[["step", "loss"]].assign(setting=row.setting, precision=row.precision, run=row.run))
    columns = [*RUN_KEY, *RECORD_FIELDS, "run_dir"]
    runs = pd.DataFrame(rows, columns=columns)
    losses = (pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=["step", "loss", "precision", *RUN_KEY]))
    losses = losses[["setting", "precision", "run", "step", "loss"]]  # unrounded: re-aggregating gives the same numbers
    _, summary = aggregate(params, planned=finished, records=(runs, losses))  # the files once, from what is recorded
    return runs, losses, summary


def as_sweep_tables(losses: pd.DataFrame, summary: pd.DataFrame, setting: str):
    """One choices cell's runs in the main sweep's table layout, so the sweep's claim checks read them unchanged."""
    # both tables already name each run as the main sweep does (sweep.run_name), so the checks match them unchanged
    s = summary[(summary["family"] == "choices") & (summary["setting"] == setting)]
    l = losses[(losses["family"] == "choices") & (losses["setting"] == setting)]
    return l, s.sort_values(["norm", "warmup", "seed"], ignore_index=True)


def gradnorm_by_choice(params: dict) -> pd.DataFrame:
    """Gradient norms at init (the gradnorm section's init, norms and seeds) at every (position signal, batch size) of
    the study's open-choice cells: the one batch each seed draws has the cell's own size, so a cell's claim check reads
    the gradients its own runs started from."""
    from ..gradnorm import gradnorm_frame

    planned = plan(params)
    pairs = planned.loc[planned["family"] == "choices", ["position", "batch_size"]].drop_duplicates()
    parts = []
    for position, batch in pairs.itertuples(index=False):
        p = copy.deepcopy(params)
        p["copy_model"]["position"] = position
        p["copy_task"]["batch_size"] = int(batch)
        parts.append(gradnorm_frame(p).assign(position=position, batch_size=int(batch)))
    return pd.concat(parts, ignore_index=True)[GRADNORM_COLUMNS]
