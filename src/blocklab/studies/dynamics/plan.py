"""The dynamics study's plan, from the parameters alone (the params level): which runs it has and where, the snapshots
it may be read from, the events of a run's loss (``events``, and the stop rule ``collapse_stop`` built on them, as the
sensitivity plan's ``early_stop_rule``), and the cross-field checks of the ``dynamics`` section (``studies.checks``
runs them before any compute; the diagnostics themselves, their names and how each is read, are
``training.diagnostics.METRICS``). The runs are in ``run``;
the tables, rates and precursors in ``aggregate``; the figures in ``figures``; the command line in ``commands``.

Why post-norm fails, measured while it trains: the training-time diagnostics of the copy-task runs, and
how often post-norm with warm-up collapses after its warm-up, over enough seeds to give the rate an interval.

Two groups of runs, each an ordinary sweep run (``sweep.train_copy_run``) with its diagnostics:
- ``compare``: the default cell's norm x warm-up runs at ``dynamics.compare_seeds`` (the main sweep's own runs), for
  Xiong et al.'s Fig. 3 through training;
- ``collapse``: post-norm with warm-up at each setting of ``dynamics.collapse.settings`` (sensitivity's cell names)
  and ``dynamics.collapse.seeds``, for the collapse rate. Such a run stops once it has collapsed (``dynamics.events``):
  a run that never collapses trains the full ``sweep.steps``.

A run identical to a main-sweep run is that run (``data/sweep/runs``); the others are in
``data/dynamics/runs/<cell>/<run>/``. Events are judged from the loss alone, with thresholds fixed in params.yaml
before any of these runs trained:
- learned: the loss below ``learned_below`` for ``learned_for`` consecutive steps (the first of them: the step it learned);
- collapse: after learning, the loss at or above ``collapse_at`` x ln(vocab) (chance) for ``collapse_for`` steps in a row;
- spike: after learning, the loss above ``spike_above`` at some step, without a collapse (it came back).
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ...model_config import ConfigError
from ...integrity import verify_snapshot
from ...io import read_table
from ..cells import Cell, cell_params, default_cell, run_dir, run_name, study_paths, training_identity

ROOT, RUNS, PLAN = study_paths("dynamics")
TABLES = {"losses": f"{ROOT}/losses.csv", "diagnostics": f"{ROOT}/diagnostics.parquet",
          "summary": f"{ROOT}/summary.csv", "rates": f"{ROOT}/rates.csv"}
SNAPSHOT_FILES = ("runs.csv", "losses.csv", "diagnostics.parquet")
FIGURES = {  # figure -> the tables it is drawn from
    "dynamics_gradnorm": [TABLES["diagnostics"], TABLES["summary"]],
    "dynamics_collapse": [TABLES["diagnostics"], TABLES["losses"], TABLES["summary"]],
}


PLAN_COLUMNS = ["setting", "norm", "warmup", "seed", "run", "run_dir", "main_sweep", "compare", "collapse"]


def plan(params: dict) -> pd.DataFrame:
    """Every run of the family once: the cell, norm, warm-up, seed, its run directory and its groups (compare,
    collapse: booleans)."""
    dyn, sweep = params["dynamics"], params["sweep"]
    base = default_cell(params)
    rows = [("compare", base, norm, warmup, seed)
            for norm in sweep["norms"] for warmup in sweep["warmups"] for seed in dyn["compare_seeds"]]
    collapse = dyn["collapse"]
    rows += [("collapse", Cell.parse(name), "post", collapse["warmup"], seed)
             for name in collapse["settings"] for seed in collapse["seeds"]]
    records: dict[str, dict] = {}
    for group, cell, norm, warmup, seed in rows:
        in_main = cell == base and norm in sweep["norms"] and warmup in sweep["warmups"] and seed in sweep["seeds"]
        run = run_name(norm, warmup, seed)
        where = run_dir(RUNS, cell, run, in_main)
        record = records.setdefault(where, {"setting": cell.name, "norm": norm, "warmup": warmup, "seed": seed,
                                            "run": run, "run_dir": where, "main_sweep": in_main,
                                            "compare": False, "collapse": False})
        record[group] = True  # a run can be in both groups (post-norm with warm-up at a compare seed): listed once
    return pd.DataFrame(list(records.values()), columns=PLAN_COLUMNS)


def case(params: dict) -> tuple[str, int]:
    """The norm position and warm-up of every collapse run: post-norm at ``dynamics.collapse.warmup``."""
    return "post", int(params["dynamics"]["collapse"]["warmup"])


def collapse_params(params: dict, cell_name: str) -> dict:
    """params.yaml with the cell's choices in place (what a collapse run trains)."""
    return cell_params(params, Cell.parse(cell_name))


def run_identity(params: dict, cell_name: str) -> dict:
    """What decides a collapse run's numbers (Snakemake params of its rule): the cell and the events that stop it."""
    return {**training_identity(collapse_params(params, cell_name)), "events": params["dynamics"]["events"]}


# ---- events: judged from the loss alone, with the thresholds of dynamics.events --------------------------------------

OUTCOMES = ("never learned", "stable", "spiked", "collapsed")


def _first_streak(flags, steps, length: int, start: int = 0) -> int | None:
    """Index of the first element of the first run of ``length`` True flags at or after index ``start``."""
    streak = 0
    for i in range(start, len(flags)):
        streak = streak + 1 if flags[i] else 0
        if streak == length:
            return i - length + 1
    return None


def events(losses, steps, rule: dict, vocab_size: int) -> dict:
    """The run's outcome (never learned | stable | spiked | collapsed) and the steps of its events (NaN: none)."""
    losses, steps = list(map(float, losses)), list(map(int, steps))
    chance = math.log(vocab_size)
    nan = float("nan")
    out = {"outcome": "never learned", "learned_step": nan, "spike_step": nan, "spike_loss": nan, "collapse_step": nan,
           "max_after_learned": nan, "reached_chance": False}
    learned = _first_streak([x < rule["learned_below"] for x in losses], steps, rule["learned_for"])
    if learned is None:
        return out
    out["learned_step"] = steps[learned]
    after = learned + rule["learned_for"]
    if after >= len(losses):
        out["outcome"] = "stable"
        return out
    worst = max(range(after, len(losses)), key=lambda i: losses[i])
    out["max_after_learned"] = losses[worst]
    # back at chance for at least one step after learning, whether it stayed there (a collapse) or recovered: the
    # document's "4.32 at step 460" as far as a single number shows (a reading added after the first runs; see rates)
    out["reached_chance"] = losses[worst] >= rule["collapse_at"] * chance
    collapse = _first_streak([x >= rule["collapse_at"] * chance for x in losses], steps, rule["collapse_for"], after)
    spike = next((i for i in range(after, len(losses)) if losses[i] > rule["spike_above"]), None)
    if collapse is not None:
        out.update(outcome="collapsed", collapse_step=steps[collapse])
    elif spike is not None:
        out["outcome"] = "spiked"
    else:
        out["outcome"] = "stable"
    if spike is not None:
        out.update(spike_step=steps[spike], spike_loss=losses[spike])
    return out


def collapse_stop(params: dict):
    """(callable, words): stop a run once it has collapsed (it learned, then sat at chance for ``collapse_for`` steps)."""
    rule, vocab = params["dynamics"]["events"], params["copy_task"]["vocab_size"]

    def stop(losses: list[float]) -> bool:
        tail = rule["collapse_for"]
        if len(losses) < tail or losses[-1] < rule["collapse_at"] * math.log(vocab):
            return False
        return events(losses, range(1, len(losses) + 1), rule, vocab)["outcome"] == "collapsed"

    words = (f"collapsed: learned (loss < {rule['learned_below']:g} for {rule['learned_for']} steps), then loss >= "
             f"{rule['collapse_at']:g} x ln {vocab} for {rule['collapse_for']} steps")
    return stop, words


# ---- snapshots -------------------------------------------------------------------------------------------------------


def read_snapshots(dirs, verify: bool = True, diagnostics: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The snapshots' runs, losses and diagnostics, each snapshot verified against its manifest first.
    ``diagnostics=False``: their diagnostics left unread (an empty table), for a check that needs only the runs (the
    parameter checks run at every command's start; the diagnostics are the snapshots' largest file)."""
    runs, losses, diags = [], [], []
    for d in map(Path, dirs):
        missing = [name for name in SNAPSHOT_FILES if not (d / name).is_file()]
        if missing:
            raise ConfigError(f"{d}: no dynamics snapshot there (missing {', '.join(missing)}); allowed: directories "
                              "written by `blocklab dynamics snapshot`")
        if verify:
            verify_snapshot(d)
        runs.append(read_table(d / "runs.csv"))
        losses.append(read_table(d / "losses.csv"))
        if diagnostics:
            diags.append(pd.read_parquet(d / "diagnostics.parquet").astype({"value": "float64", "step": "int64",
                                                                              "block": "int64"}))
    runs = pd.concat(runs, ignore_index=True)
    doubled = runs[runs.duplicated(["setting", "run"], keep=False)]
    if len(doubled):
        raise ConfigError(f"dynamics.from_snapshots: runs recorded twice: {sorted(set(doubled['setting'] + '/' + doubled['run']))}")
    return runs, pd.concat(losses, ignore_index=True), pd.concat(diags, ignore_index=True) if diags else pd.DataFrame()


def unrecorded(runs: pd.DataFrame, planned: pd.DataFrame) -> str | None:
    have = set(zip(runs["setting"], runs["run"])) if len(runs) else set()
    missing = [f"{s}/{r}" for s, r in zip(planned["setting"], planned["run"]) if (s, r) not in have]
    if missing:
        return (f"{len(missing)} planned run(s) not in the snapshots: {', '.join(missing[:6])}"
                f"{' ...' if len(missing) > 6 else ''}; allowed: snapshots that record every run of the plan, or "
                "dynamics.from_snapshots: [] to train them here")
    return None


def snapshots(params: dict) -> list[str]:
    return list(params["dynamics"].get("from_snapshots", []))


def from_runs(params: dict) -> pd.DataFrame:
    """The planned runs read from their own directories: all of them, or with ``dynamics.from_snapshots`` the main
    sweep's (the pipeline trains those anyway, with their diagnostics); the snapshots give the rest."""
    planned = plan(params)
    return planned[planned["main_sweep"]] if snapshots(params) else planned


def from_records(params: dict) -> pd.DataFrame:
    """The planned runs the snapshots must record (none without ``dynamics.from_snapshots``)."""
    planned = plan(params)
    return planned[~planned["main_sweep"]] if snapshots(params) else planned.iloc[0:0]


def aggregate_inputs(params: dict) -> list[str]:
    """What the aggregation reads: the meta.json of every run read from its directory (they train first), and the
    snapshots' files."""
    return ([f"{d}/{name}" for d in snapshots(params) for name in SNAPSHOT_FILES]
            + [f"{d}/meta.json" for d in from_runs(params)["run_dir"]])


def check_problems(params: dict) -> list[tuple[str, str]]:
    """Cross-field checks of ``dynamics`` (``studies.checks`` runs them with the others): (key, message). The
    ``diagnostics`` section needs none beyond the schema's (its enum is ``training.diagnostics.METRICS``, tested)."""
    problems = []
    dyn = params.get("dynamics")
    if dyn is None:
        return problems
    steps, chance = params["sweep"]["steps"], math.log(params["copy_task"]["vocab_size"])
    rule = dyn["events"]
    if not 0 < rule["learned_below"] < rule["spike_above"]:
        problems.append(("dynamics.events.learned_below", f"{rule['learned_below']} must be below "
                         f"dynamics.events.spike_above={rule['spike_above']}, else every learned run spikes; allowed: "
                         f"a number in (0, {rule['spike_above']})"))
    if rule["spike_above"] >= rule["collapse_at"] * chance:
        problems.append(("dynamics.events.spike_above", f"{rule['spike_above']} is not below the collapse level "
                         f"collapse_at x ln(vocab) = {rule['collapse_at'] * chance:.3f}; allowed: (learned_below, "
                         f"{rule['collapse_at'] * chance:.3f})"))
    if rule["learned_for"] + rule["collapse_for"] > steps:
        problems.append(("dynamics.events.collapse_for", f"learned_for + collapse_for = "
                         f"{rule['learned_for'] + rule['collapse_for']} exceeds sweep.steps={steps}, so a collapse "
                         f"could never fire; allowed: 1..{steps - rule['learned_for']}"))
    warmup = dyn["collapse"]["warmup"]
    if warmup > steps:
        problems.append(("dynamics.collapse.warmup", f"{warmup} is longer than training (sweep.steps={steps}); "
                         f"allowed: 0..{steps}"))
    for i, name in enumerate(dyn["collapse"]["settings"]):
        try:
            Cell.parse(name)
        except ConfigError:
            problems.append((f"dynamics.collapse.settings[{i}]", f"{name!r} is not a setting; allowed: "
                             "{position}-b{batch}-L{depth}-lr{lr}-{fp32|bf16}, e.g. " + default_cell(params).name))
    dirs = snapshots(params)
    if dirs and not problems:
        bad = [d for d in dirs if not all((Path(d) / n).is_file() for n in SNAPSHOT_FILES)]
        if bad:
            problems.append(("dynamics.from_snapshots", f"{', '.join(bad)}: no snapshot there; allowed: directories "
                             "written by `blocklab dynamics snapshot`, e.g. records/dynamics/collapse"))
        elif dyn.get("in_report", True):  # out of the pipeline, the snapshots need not cover the plan
            try:
                runs, _, _ = read_snapshots(dirs, diagnostics=False)
                why = unrecorded(runs, from_records(params))
                if why:
                    problems.append(("dynamics.from_snapshots", why))
            except ConfigError as why:
                problems.append(("dynamics.from_snapshots", str(why)))
    return problems
