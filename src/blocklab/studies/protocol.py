"""What every study implements, written once: the names and signatures a study's modules share, so that a reader who
knows one study knows the others, and a new study is checked against this rather than against a copied directory
(tests/test_studies.py). Two parts, by layer (studies/README.md): ``StudyPlan`` for ``plan.py`` (params level: made
from the parameters alone) and ``StudyRun`` for ``run.py`` (experiments level).

``STUDIES`` names them, once: the layer test and the protocol test read it. Still per study (issue 48, point 4, left
open): ``train`` (a cell and norm x warm-up for two studies, a cell name for dynamics), ``write_snapshot`` and the
aggregation's signature.

The params level: it imports nothing of the package, so a plan may use it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import pandas as pd

STUDIES = ("sensitivity", "dynamics", "inference")  # blocklab.studies.<name>, each with plan.py and run.py


@runtime_checkable
class StudyPlan(Protocol):
    """A study's ``plan`` module."""

    PLAN: str  # the plan table's path, data/<study>/plan.csv (``cells.study_paths``)
    RUNS: str  # where its runs train, data/<study>/runs

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

    def status(self, params: dict, root: str | Path = ".") -> pd.DataFrame:
        """Every planned run and where it stands (finished, checkpointed, recorded, to train), from the disk."""
