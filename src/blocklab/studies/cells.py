"""What the studies share below their plans: a *cell* (one setting of the choices document 000 leaves open, named
``{position}-b{batch}-L{depth}-lr{lr}-{precision}``), params.yaml with a cell's choices in place, a run's directory
name and directory, and the refusals of a cell or run that is not allowed or not planned.

The params level: it imports nothing above ``config``, so every study's plan (and the validation of parameters) can
use it without importing the experiments.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import pandas as pd

from ..model_config import POSITION_KINDS, ConfigError
from ..run_settings import CopyModel, CopyTask, Sweep, run_name  # noqa: F401 (run_name: the plans take it from here)

CELL_PATTERN = r"[a-z]+-b\d+-L\d+-lr[0-9.e+-]+-(?:fp32|bf16)"
SWEEP_RUNS = "data/sweep/runs"  # the main sweep's runs: a study's run identical to one of them is that run


def study_paths(study: str) -> tuple[str, str, str]:
    """A study's data directory, its runs' directory and its plan table: ``data/<study>``, ``.../runs``, ``.../plan.csv``."""
    root = f"data/{study}"
    return root, f"{root}/runs", f"{root}/plan.csv"


def run_dir(runs: str, cell: "Cell", run: str, main_sweep: bool) -> str:
    """Where a planned run lives: the main sweep's run when it is one (not trained again), else ``<runs>/<cell>/<run>``."""
    return f"{SWEEP_RUNS}/{run}" if main_sweep else f"{runs}/{cell.name}/{run}"


@dataclass(frozen=True)
class Cell:
    position: str
    batch_size: int
    depth: int
    lr: float
    precision: str = "fp32"

    @property
    def name(self) -> str:
        return f"{self.position}-b{self.batch_size}-L{self.depth}-lr{self.lr:g}-{self.precision}"

    @classmethod
    def parse(cls, name: str) -> "Cell":
        if not re.fullmatch(CELL_PATTERN, name):
            raise ConfigError(f"--cell={name!r} is not a cell name; allowed: {{position}}-b{{batch}}-L{{depth}}-lr{{lr}}-"
                              "{fp32|bf16}, e.g. learned-b32-L24-lr0.001-fp32")
        position, batch, depth, rest = name.split("-", 3)  # the learning rate may hold a "-" (1e-05)
        lr, precision = rest.rsplit("-", 1)
        return cls(position, int(batch[1:]), int(depth[1:]), float(lr[2:]), precision)


def default_cell(params: dict) -> Cell:
    """The main sweep's own setting."""
    model, sweep = CopyModel.from_params(params), Sweep.from_params(params)
    return Cell(model.position, CopyTask.from_params(params).batch_size, model.n_layers, sweep.lr, sweep.precision)


def cell_params(params: dict, cell: Cell) -> dict:
    """params.yaml with the cell's choices in place: what ``train_copy_run`` trains."""
    out = copy.deepcopy(params)
    out["copy_model"]["position"] = cell.position
    out["copy_model"]["n_layers"] = cell.depth
    out["copy_task"]["batch_size"] = cell.batch_size
    out["sweep"]["lr"] = cell.lr
    if cell.precision != "fp32" or "precision" in out["sweep"]:
        out["sweep"]["precision"] = cell.precision
    return out


def training_identity(params: dict) -> dict:
    """What decides a run's numbers in params (with a cell's choices in place): the model, the task and the sweep's
    training settings, not its lists of runs nor execution settings (the base of each study's ``run_identity``)."""
    training = {k: v for k, v in params["sweep"].items() if k not in ("norms", "warmups", "seeds", "checkpoint_every",
                                                                        "compile", "fast_path", "batched")}
    return {"model": params["copy_model"], "task": params["copy_task"], "training": training}


def require_planned(planned: pd.DataFrame, cell: Cell, norm: str, warmup: int, seed: int, what: str) -> None:
    """Refuse, before any compute, a run that is not in ``planned`` (a plan with setting, norm, warmup, seed columns):
    the error names the run, ``what`` it is not a run of, and the planned cells."""
    mine = planned[(planned["setting"] == cell.name) & (planned["norm"] == norm) & (planned["warmup"] == warmup)
                   & (planned["seed"] == seed)]
    if mine.empty:
        raise ConfigError(f"--cell={cell.name} --norm={norm} --warmup={warmup} --seed={seed} is not a run of {what}; "
                          f"allowed cells: {sorted(planned['setting'].unique())}")


def cell_problems(names, key: str) -> list[tuple[str, str]]:
    """Cell names given whole (``sensitivity.choices.cells``, ``--add-cell``): each parses and names a known position."""
    problems = []
    for i, name in enumerate(names):
        try:
            position = Cell.parse(name).position
        except ConfigError as why:
            problems.append((f"{key}[{i}]", str(why).replace("--cell=", "")))
            continue
        if position not in POSITION_KINDS:
            problems.append((f"{key}[{i}]", f"{name!r}: unknown position {position!r}; allowed: "
                             f"{', '.join(POSITION_KINDS)}"))
    return problems


def require_cell_names(names, key: str) -> list[str]:
    """The canonical names of ``names``, each once; a bad one is a ConfigError naming ``key[i]`` and what is allowed."""
    problems = cell_problems(names, key)
    if problems:
        raise ConfigError("; ".join(f"{k}: {why}" for k, why in problems))
    return list(dict.fromkeys(Cell.parse(name).name for name in names))
