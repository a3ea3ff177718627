"""Figures of the inference study: none of its own. Its ranking is a table (``data/inference/ranking.csv``, shown in
docs/dynamics.md and the report); the runs it validates with are drawn by the dynamics study. ``save_figures`` is the
protocol's (``studies.protocol.StudyFigures``) and draws the figures of ``plan.FIGURES``: none."""
from __future__ import annotations

from pathlib import Path

from .plan import FIGURES


def save_figures(params: dict, data: str | Path = "data", figs: str | Path = "figs", lang: str | None = None) -> list:
    """Every figure of the study (``plan.FIGURES``: none), drawn from its tables under ``data`` into ``figs``."""
    assert not FIGURES, "a figure of the ranking is drawn here, from aggregate's tables, as the other studies do"
    return []
