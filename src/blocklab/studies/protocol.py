"""The one study protocol: what every study implements, with the same names and signatures, so that
a reader who knows one study knows the others and a new study is checked against this rather than against a copied
directory. ``STUDIES`` registers them, once: the parameters' validation (``studies.checks``, which ``params`` runs),
the command line (``cli.TABLE``'s study groups), the rules (``workflow/rules/<study>.smk``) and the layer test read it,
and tests/test_studies.py checks each registered study against ``Study``, signatures included.

A study is a package, ``blocklab.studies.<name>``, of five modules, one per layer (studies/README.md); ``Study`` is
that package, each of its members the protocol of one module:

- ``plan`` (params level): the runs of the study, from the parameters alone; snapshots; the section's checks.
- ``run`` (experiments level): ``train`` one run, ``status`` of every planned run.
- ``aggregate`` (experiments level): the study's tables, from its runs or recorded snapshots; ``write_snapshot``. It
  judges no claim: claims are the reporting level's (``reporting.sensitivity``, ``reporting.inference``).
- ``figures`` (figures level): ``save_figures``, every figure of ``plan.FIGURES``.
- ``commands`` (top): ``register``, the study's verbs (``studies.family`` gives them the same options).

Each signature below is the study's, parameter for parameter; a study may add keyword options after them, each with
a default (the dynamics study's ``train(..., follow=False, dense=None)``).

The params level: it imports nothing of the package, so any module may read it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pandas as pd

STUDIES = ("sensitivity", "dynamics", "inference")  # blocklab.studies.<name>: registered here, once


@runtime_checkable
class StudyPlan(Protocol):
    """A study's ``plan`` module."""

    PLAN: str  # the plan table's path, data/<study>/plan.csv (``cells.study_paths``)
    RUNS: str  # where its runs train, data/<study>/runs
    FIGURES: dict  # figure -> the tables it is drawn from (none: {})

    def plan(self, params: dict) -> pd.DataFrame:
        """Every run of the study, one row each: setting, norm, warmup, seed, run, run_dir, main_sweep (and more)."""

    def run_identity(self, params: dict, cell_name: str) -> dict:
        """What a run of this cell is (parameters and code) for the rules: a change retrains exactly its runs."""

    def snapshots(self, params: dict) -> list[str]:
        """The directories of recorded runs the study reads instead of training them (``from_snapshots``)."""

    def aggregate_inputs(self, params: dict) -> list[str]:
        """The files the study's aggregation reads: its runs' and its snapshots'."""

    def check_problems(self, params: dict) -> list[tuple[str, str]]:
        """(key, problem) for each value of the study's section that cannot run, checked before any job."""


@runtime_checkable
class StudyRun(Protocol):
    """A study's ``run`` module."""

    def train(self, params: dict, cell_name: str, norm: str, warmup: int, seed: int, out_dir: Path,
              threads: int | None = None) -> dict:
        """One planned run (a cell, norm position, warm-up and seed) into ``out_dir``, refused before any compute when
        the plan lacks it; returns its meta.json."""

    def status(self, params: dict, root: str | Path = ".") -> pd.DataFrame:
        """Every planned run and where it stands (finished, checkpointed, recorded, to train), from the disk."""


@runtime_checkable
class StudyAggregate(Protocol):
    """A study's ``aggregate`` module."""

    def aggregate(self, params: dict, root: str | Path = ".") -> dict[str, pd.DataFrame]:
        """The study's tables by name, from its runs under ``root`` or the snapshots its parameters name."""

    def write_snapshot(self, params: dict, out: str | Path, root: str | Path = ".") -> pd.DataFrame:
        """Record the finished runs under ``root`` in ``out``, a directory kept in git; returns the runs recorded."""


@runtime_checkable
class StudyFigures(Protocol):
    """A study's ``figures`` module."""

    def save_figures(self, params: dict, data: str | Path = "data", figs: str | Path = "figs",
                     lang: str | None = None) -> list:
        """Every figure of ``plan.FIGURES``, drawn from the tables under ``data`` into ``figs`` (with sidecars)."""


@runtime_checkable
class StudyCommands(Protocol):
    """A study's ``commands`` module."""

    def register(self, subparsers) -> None:
        """The study's verbs, ``blocklab <study> <verb>``."""


@runtime_checkable
class Study(Protocol):
    """A study: the package ``blocklab.studies.<name>``, its five modules imported."""

    plan: StudyPlan
    run: StudyRun
    aggregate: StudyAggregate
    figures: StudyFigures
    commands: StudyCommands


PARTS = {"plan": StudyPlan, "run": StudyRun, "aggregate": StudyAggregate, "figures": StudyFigures,
         "commands": StudyCommands}  # a study's modules, bottom to top, and the protocol each implements
