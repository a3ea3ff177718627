"""The sensitivity study's plan, from the parameters alone: its cells (the settings of what document 000 leaves open),
every run and its directory, the snapshots the study may be read from, and the cross-field checks of the
``sensitivity`` section (``params_file.validate_params`` runs them before any compute).

The params level: it imports nothing above ``runtime``, so validating parameters never imports the experiments.
A *cell* (``studies.cells``) is one setting of the open choices, named ``{position}-b{batch}-L{depth}-lr{lr}-{precision}``;
each of its runs (norm x warm-up x seed) is an ordinary sweep run in ``data/sensitivity/runs/<cell>/<norm>-w<warmup>-s<seed>/``,
or, identical to a main-sweep run, that run (``data/sweep/runs/...``). Training, gradients at init and status are in
``run``; the tables and claim x setting in ``aggregate``; the figures in ``figures``; the command line in ``commands``.

What document 000 leaves open: the copy-task sweep under other position signals, batch sizes and precisions at the
document's size, and a depth x learning-rate grid (the document's "the difference grows with depth"). Runs at the
document's size (its depth and learning rate, i.e. ``copy_model.n_layers`` and ``sweep.lr``) train the full
``sweep.steps``; the other depth x lr cells stop early once the loss has stayed below
``sensitivity.early_stop.loss_below`` for ``for_steps`` steps in a row.
"""
from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from ...model_config import ConfigError
from ...integrity import verify_snapshot
from ...io import read_table
from ...runtime import bf16_support, resolve_device
from ...run_settings import CopyModel, CopyTask, Sweep
from ..cells import (Cell, cell_params, cell_problems, default_cell, require_cell_names, run_dir, run_name, study_paths,
                     training_identity)

log = logging.getLogger("blocklab.sensitivity")

ROOT, RUNS, PLAN = study_paths("sensitivity")  # PLAN: every planned run and its directory (made by every pipeline run)
TABLES = {"losses": f"{ROOT}/losses.csv", "summary": f"{ROOT}/summary.csv",
          "claims_by_setting": f"{ROOT}/claims_by_setting.csv"}
GRADNORM = f"{ROOT}/gradnorm.csv"
FIGURES = {  # figure -> the tables it is drawn from
    "sensitivity_phase": [TABLES["summary"]],
    "sensitivity_loss_curves": [TABLES["losses"]],
    "sensitivity_gradnorm": [GRADNORM],
}


def held_batch(params: dict) -> int:
    """``sensitivity.batch_size``: the batch of the study's cells off its batch axis (the depth x learning-rate grid and
    the other precisions). Named, not the default batch, so that runs recorded at one batch are never judged as
    another's when the default changes (absent: the default batch, ``copy_task.batch_size``)."""
    return int(params["sensitivity"].get("batch_size") or CopyTask.from_params(params).batch_size)


def at_document_size(params: dict, cell: Cell) -> bool:
    """The document's depth and learning rate: such runs never stop early (its claims include what follows learning)."""
    return cell.depth == CopyModel.from_params(params).n_layers and cell.lr == Sweep.from_params(params).lr


def run_identity(params: dict, cell_name: str) -> dict:
    """Everything that decides a cell's numbers (Snakemake's params for the training rule): a change retrains it."""
    cell = Cell.parse(cell_name)
    early = None if at_document_size(params, cell) else params["sensitivity"]["early_stop"]
    return {**training_identity(cell_params(params, cell)), "early_stop": early}


def early_stop_rule(params: dict, cell: Cell):
    """(callable, words) for a depth x lr cell, (None, None) at the document's size."""
    if at_document_size(params, cell):
        return None, None
    rule = params["sensitivity"]["early_stop"]
    below, n = rule["loss_below"], rule["for_steps"]

    def stop(losses: list[float]) -> bool:
        return len(losses) >= n and all(value < below for value in losses[-n:])

    return stop, f"loss < {below:g} for {n} consecutive steps"


def available_precisions(params: dict, precisions: list[str]) -> list[str]:
    """The precisions this machine's training device can run; bf16 without bf16 units is left out of the plan, with a
    warning (the study is made of the rest), rather than failing its jobs one by one. Where the study is read from
    recorded snapshots (``sensitivity.from_snapshots``), nothing is trained here: the plan is the recorded one on every
    machine, whatever its processor (a bf16 cell recorded elsewhere is read, not dropped)."""
    if "bf16" not in precisions or snapshots(params):
        return list(precisions)
    ok, why = bf16_support(resolve_device(params["device"]))
    if not ok:
        log.warning("sensitivity.choices.precisions: bf16 left out of the study here: %s", why)
    return [p for p in precisions if p != "bf16" or ok]


# ---- the plan ----------------------------------------------------------------------------------------------------------


def plan(params: dict) -> pd.DataFrame:
    """Every run of the study: family (choices | depth_lr), the cell, norm, warm-up, seed and its run directory."""
    sens, sweep = params["sensitivity"], Sweep.from_params(params)
    base = default_cell(params)
    rows = []
    choices = sens["choices"]
    # positions x batch sizes, crossed (an effect of one may show only under a value of the other), at the default
    # precision; each other precision at the default position and batch size (a faster arithmetic, not a choice of
    # the document's: does it change any verdict?)
    cells = [Cell(position, batch, base.depth, base.lr, base.precision)
             for position in choices["positions"] for batch in choices["batch_sizes"]]
    held = held_batch(params)  # the batch the study holds fixed off its batch axis (recorded runs name it)
    cells += [Cell(base.position, held, base.depth, base.lr, precision)
              for precision in available_precisions(params, choices.get("precisions", [])) if precision != base.precision]
    # and each cell named whole (a candidate under validation, e.g. a batch size the crossed grid leaves out)
    cells += [Cell.parse(name) for name in choices.get("cells", [])]
    for cell in dict.fromkeys(cells):
        for norm in sweep.norms:
            for warmup in sweep.warmups:
                for seed in choices["seeds"]:
                    rows.append(("choices", cell, norm, warmup, seed))
    grid = sens["depth_lr"]
    for depth in grid["depths"]:
        for lr in grid["lrs"]:
            cell = Cell(base.position, held, depth, float(lr), base.precision)
            for norm in grid["norms"]:
                for warmup in grid["warmups"]:
                    for seed in grid["seeds"]:
                        rows.append(("depth_lr", cell, norm, warmup, seed))
    records = []
    for family, cell, norm, warmup, seed in rows:
        in_main = (cell == base and norm in sweep.norms and warmup in sweep.warmups and seed in sweep.seeds)
        run = run_name(norm, warmup, seed)
        records.append({"family": family, "setting": cell.name, **asdict(cell), "norm": norm, "warmup": warmup,
                        "seed": seed, "run": run, "run_dir": run_dir(RUNS, cell, run, in_main), "main_sweep": in_main})
    columns = ["family", "setting", "position", "batch_size", "depth", "lr", "precision", "norm", "warmup", "seed",
               "run", "run_dir", "main_sweep"]
    return pd.DataFrame(records, columns=columns)


def run_dirs(params: dict) -> list[str]:
    """Each run directory once (a run can belong to both families: the default cell at the document's size)."""
    return list(dict.fromkeys(plan(params)["run_dir"]))


SNAPSHOT_FILES = ("runs.csv", "losses.csv")


def snapshots(params: dict) -> list[str]:
    """``sensitivity.from_snapshots``: snapshot directories the study is aggregated from instead of its trained runs."""
    return list(params["sensitivity"].get("from_snapshots") or [])


def aggregate_inputs(params: dict) -> list[str]:
    """What the study's tables are made from (the aggregation rule's input): every planned run's meta.json, or, with
    ``sensitivity.from_snapshots``, the snapshots' files (then nothing of the study is trained)."""
    if snapshots(params):
        return [f"{d}/{name}" for d in snapshots(params) for name in SNAPSHOT_FILES]
    return [f"{run}/meta.json" for run in run_dirs(params)]


# ---- snapshots: the runs recorded in git -------------------------------------------------------------------------------

RUN_KEY = ["setting", "run"]  # names a run of the plan once (a run shared by two families has one setting and run)


def read_records(dirs, losses: bool = True) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The (runs, losses) tables of one or more snapshot directories (``record_runs``), concatenated; a run recorded
    twice is an error (which one would count?). ``losses=False``: the runs table only (losses None)."""
    for d in dirs:
        verify_snapshot(d)
    runs = pd.concat([read_table(Path(d) / "runs.csv").assign(snapshot=str(d)) for d in dirs], ignore_index=True)
    twice = runs[runs.duplicated(RUN_KEY, keep=False)]
    if len(twice):
        first = twice.iloc[0]
        raise ConfigError(f"run {first.setting}/{first.run} is in more than one snapshot: "
                          f"{', '.join(twice[(twice.setting == first.setting) & (twice.run == first.run)].snapshot)}")
    if not losses:
        return runs, None
    return runs, pd.concat([read_table(Path(d) / "losses.csv") for d in dirs], ignore_index=True)


def unrecorded(records: pd.DataFrame, planned: pd.DataFrame) -> str | None:
    """Which planned runs no snapshot records, in words (None: every one is recorded)."""
    recorded = set(zip(records["setting"], records["run"]))
    missing = [f"{s}/{r}" for s, r in planned[RUN_KEY].drop_duplicates().itertuples(index=False) if (s, r) not in recorded]
    if not missing:
        return None
    return (f"the snapshots lack {len(missing)} planned run(s): {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else "")
            + "; allowed: snapshots that record every run of the sensitivity section's plan (record them with "
            "`blocklab sensitivity snapshot`), fewer axis values, or sensitivity.from_snapshots: [] to train the "
            "study for these parameters")


# ---- checks of the parameters ------------------------------------------------------------------------------------------


def check_problems(params: dict) -> list[tuple[str, str]]:
    """Cross-field checks of the sensitivity section (``studies.checks`` runs them with the others): (key, message) pairs."""
    sens = params.get("sensitivity")
    if sens is None:
        return []
    problems = []
    chance = math.log(CopyTask.from_params(params).vocab_size)
    rule, steps = sens["early_stop"], Sweep.from_params(params).steps
    if rule["loss_below"] >= chance:
        problems.append(("sensitivity.early_stop.loss_below",
                         f"{rule['loss_below']} is not below chance ln(copy_task.vocab_size) = {chance:.3f}, so it would "
                         f"stop an untrained run; allowed: a number in (0, {chance:.3f})"))
    if rule["for_steps"] > steps:
        problems.append(("sensitivity.early_stop.for_steps",
                         f"{rule['for_steps']} exceeds sweep.steps={steps}, so the rule could never fire; allowed: 1..{steps}"))
    bad_cells = cell_problems(sens["choices"].get("cells", []), "sensitivity.choices.cells")
    problems += bad_cells or _snapshot_problems(params)
    for i, warmup in enumerate(sens["depth_lr"]["warmups"]):
        if warmup > steps:
            problems.append((f"sensitivity.depth_lr.warmups[{i}]", f"{warmup} is longer than training (sweep.steps={steps}); "
                             f"allowed: 0..{steps}"))
    model = CopyModel.from_params(params)
    d, heads = model.d_model, model.n_heads
    if "rope" in sens["choices"]["positions"] and not d % heads and (d // heads) % 2:
        problems.append(("sensitivity.choices.positions", f"'rope' needs an even head dimension d_model/n_heads={d // heads}; "
                         "allowed: another position or an even head dimension"))
    return problems


def with_cells(params: dict, names, key: str = "--add-cell") -> dict:
    """params with ``names`` added to ``sensitivity.choices.cells`` (checked first): a candidate's runs are trained,
    listed and recorded before params.yaml names the cell, since its ``from_snapshots`` cannot record them yet."""
    names = require_cell_names(names, key)
    params = copy.deepcopy(params)
    cells = params["sensitivity"]["choices"].setdefault("cells", [])
    cells += [name for name in names if name not in cells]
    return params


def _snapshot_problems(params: dict) -> list[tuple[str, str]]:
    """``sensitivity.from_snapshots``: each directory holds a snapshot, and, where the study is in the pipeline
    (``in_report``), together they record every planned run exactly once (checked before any compute; paths are
    relative to the project root, where the pipeline runs)."""
    dirs = snapshots(params)
    if not dirs:
        return []
    key = "sensitivity.from_snapshots"
    bad = [d for d in dirs if not all((Path(d) / name).is_file() for name in SNAPSHOT_FILES)]
    if bad:
        return [(key, f"{', '.join(bad)}: no snapshot there ({' and '.join(SNAPSHOT_FILES)}); allowed: directories "
                      "written by `blocklab sensitivity snapshot`, e.g. records/sensitivity/choices")]
    if not params["sensitivity"].get("in_report", True):
        return []  # the pipeline does not build the study: its snapshots need not cover the plan (`blocklab
        #            sensitivity aggregate` still refuses them if asked, naming the runs they lack)
    try:
        runs, _ = read_records(dirs, losses=False)
    except ConfigError as why:
        return [(key, str(why))]
    why = unrecorded(runs, plan(params))
    return [(key, why)] if why else []
