"""The sensitivity study's tables from its runs: per-step losses and one summary row per run (outcome, losses at steps
100/200/300, steps to learn, relapse after learning, why it stopped), read from the trained runs or from snapshots in
git; snapshots of finished runs (``record_runs``), small enough for git; and its verdicts: every sweep claim re-judged
under every setting of the open choices (claim x setting) by the claims' own checks (``reporting.claims``), and which
verdicts are robust.

The reporting level (it judges claims, as the inference study's ranking does); see tests/test_layers.py."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ...model_config import ConfigError
from ...integrity import begin_snapshot, read_run, record_snapshot
from ...io import read_table, write_table
from .plan import RUN_KEY, early_stop_rule, plan, read_records, snapshots, unrecorded

LOSS_AT = (100, 200, 300)
# What a run's summary needs from its meta.json besides its losses: a snapshot (``record_runs``) keeps exactly these,
# so a reader can re-aggregate and re-judge the study from git without the trained runs.
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


def refuse_twice(table: pd.DataFrame) -> None:
    """A run is one row of a family: a run directory twice in one family would be counted twice by every rate read
    from it (a run shared by two families, the default cell at the document's size, is one row in each: a count over
    families takes each ``run_dir`` once)."""
    twice = table[table.duplicated(["family", "run_dir"], keep=False)]
    if len(twice):
        first = twice.iloc[0]
        raise ConfigError(f"run {first.run_dir} is {int((twice.run_dir == first.run_dir).sum())} rows of the "
                          f"{first.family} family; a run counts once")


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


def aggregate(params: dict, root: str | Path = ".", snapshot_dirs: list[str | Path] | None = None) -> dict[str, pd.DataFrame]:
    """The study's tables (``studies.protocol.StudyAggregate``): per-step losses (unrounded) and one summary row per
    (family, run), from the snapshots ``snapshot_dirs`` (default: ``sensitivity.from_snapshots`` under ``root``) or,
    with none, from the runs trained under ``root``. Claim x setting is the reporting level's
    (``reporting.sensitivity``)."""
    root = Path(root)
    dirs = snapshot_dirs or [root / d for d in snapshots(params)]
    losses, summary = runs_tables(params, root, records=read_records(dirs) if dirs else None)
    return {"losses": losses, "summary": summary}


def runs_tables(params: dict, root: str | Path = ".", planned: pd.DataFrame | None = None,
                records: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy per-step losses and one summary row per (family, run) of the plan (or of ``planned``, some of its rows),
    read from the runs' own files, or from ``records``: (runs, losses) tables of snapshots (``read_records``)."""
    from ...training.sweep import classify  # torch: only where runs are aggregated

    rule = params["sensitivity"]["early_stop"]
    curves, rows = [], []
    planned = plan(params) if planned is None else planned
    refuse_twice(planned)
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
    summary = pd.DataFrame(rows)
    if len(summary):
        refuse_twice(summary)
    return losses, summary


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
    _, summary = runs_tables(params, planned=finished, records=(runs, losses))  # the files once, from what is recorded
    return runs, losses, summary


# What a main sweep's runs must share with a study cell to count as that cell's runs: every setting that reaches the
# training (the sweep's seeds, warm-ups, norms and batching only choose which runs there are).
SWEEP_TRAINING = ("steps", "lr", "precision", "compile", "fast_path")


def sweep_records(params: dict, data: str | Path, planned: pd.DataFrame | None = None,
                  machine: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``record_runs`` for the planned runs that a finished run's **main sweep** trained (``DATA/params.yaml``,
    ``DATA/sweep/summary.csv`` and ``losses.csv``: a run's data folder or a gallery, also one taken from git at an old
    commit), so that a study cell that is the main sweep's own setup is not trained twice. Refused unless the sweep's
    model, task and training settings are the cell's (``cell_params``): the same runs, not look-alikes. The tables
    carry neither the processor (``machine`` names it) nor the commit (left empty)."""
    from ...params_file import read_params_file
    from ..cells import Cell, cell_params, default_cell

    data = Path(data)
    made_by = read_params_file(data / "params.yaml")  # not validated: an old gallery's paths need not exist now
    cell = default_cell(made_by)
    planned = plan(params) if planned is None else planned
    planned = planned[planned["setting"] == cell.name]
    if planned.empty:
        raise ConfigError(f"--from-sweep={data}: its main sweep's setup is the cell {cell.name}, which the study does "
                          "not plan here (or the filters leave out)")
    wanted = cell_params(params, Cell.parse(cell.name))
    for section in ("copy_model", "copy_task"):
        if made_by[section] != wanted[section]:
            raise ConfigError(f"--from-sweep={data}: {section} differs from the study's {cell.name}: "
                              f"{made_by[section]} vs {wanted[section]}; allowed: a sweep of the cell's own setup")
    for key in SWEEP_TRAINING:
        if made_by["sweep"].get(key) != wanted["sweep"].get(key):
            raise ConfigError(f"--from-sweep={data}: sweep.{key} is {made_by['sweep'].get(key)!r}, the study's "
                              f"{cell.name} trains with {wanted['sweep'].get(key)!r}; allowed: a sweep of the cell's setup")
    if early_stop_rule(params, Cell.parse(cell.name))[0] is not None:
        raise ConfigError(f"--from-sweep={data}: the study stops {cell.name}'s runs early and the main sweep does not; "
                          "allowed: a cell at the document's size")
    if not machine:
        raise ConfigError("--from-sweep needs --machine: a main sweep's tables do not name the processor")
    summary = read_table(data / "sweep" / "summary.csv").set_index("run")
    chosen = planned[planned["run"].isin(summary.index)].drop_duplicates("run_dir")
    if chosen.empty:
        raise ConfigError(f"--from-sweep={data}: none of the planned runs of {cell.name} "
                          f"({', '.join(planned['run'].unique())}) is in its sweep/summary.csv")
    rows = [{"setting": row.setting, "run": row.run, "vocab_size": made_by["copy_task"]["vocab_size"],
             "diverged_step": summary.loc[row.run, "diverged_step"], "stopped_step": None, "stop_reason": None,
             "wall_time_s": summary.loc[row.run, "wall_time_s"], "machine": machine, "git_commit": None,
             "run_dir": row.run_dir} for row in chosen.itertuples(index=False)]
    runs = pd.DataFrame(rows, columns=[*RUN_KEY, *RECORD_FIELDS, "run_dir"])
    runs["diverged_step"] = runs["diverged_step"].where(runs["diverged_step"].notna(), None)
    losses = read_table(data / "sweep" / "losses.csv")
    losses = losses[losses["run"].isin(chosen["run"])]
    losses = losses.assign(setting=cell.name, precision=cell.precision)[["setting", "precision", "run", "step", "loss"]]
    losses = losses.reset_index(drop=True)
    _, table = runs_tables(params, planned=chosen, records=(runs, losses))
    return runs, losses, table


def write_snapshot(params: dict, out: Path, root: str | Path = ".", planned: pd.DataFrame | None = None,
                   machine: str | None = None, from_sweep: str | Path | None = None) -> pd.DataFrame:
    """Record the finished runs among ``planned`` (default: the whole plan) in the snapshot directory ``out`` (kept in
    git; ``record_runs``; with ``from_sweep``, the ones a main sweep trained: ``sweep_records``), whole: refused when
    it would drop a run ``out`` records that did not finish here. Returns the runs recorded."""
    out = Path(out)
    runs, losses, summary = (record_runs(params, root, planned, machine=machine) if from_sweep is None
                             else sweep_records(params, from_sweep, planned, machine=machine))
    if (out / "runs.csv").is_file():  # a snapshot is rewritten whole: never drop a run it records
        lost = read_table(out / "runs.csv").merge(runs[["setting", "run"]], how="left", indicator=True)
        lost = lost[lost["_merge"] == "left_only"]
        if len(lost):
            raise ConfigError(f"--out={out}: it records {len(lost)} run(s) that did not finish here "
                              f"({', '.join(lost['setting'] + '/' + lost['run'])}), which rewriting it would drop; "
                              "allowed: a new --out directory (list both in sensitivity.from_snapshots), or the "
                              "project root that holds those runs (--root)")
    out.mkdir(parents=True, exist_ok=True)
    begin_snapshot(out)  # a kill from here on leaves a snapshot that readers refuse, until it is written again
    write_table(runs, out / "runs.csv")
    write_table(losses, out / "losses.csv")
    write_table(summary.drop(columns=["family"]).drop_duplicates("run_dir"), out / "summary.csv")
    record_snapshot(out)  # last: the checksums of what was written
    return runs
