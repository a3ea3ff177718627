"""params.yaml validated whole: the schema and the general cross-field checks (``blocklab.params``), then each study's
own checks, from its plan (``studies.<study>.plan.check_problems``), all before any compute and in one message.

The params level, one step above ``params`` and the plans: so ``params`` imports no study, and a study's plan may use
anything of the params level. The pipeline (the Snakefile's config), the studies' commands and the reporting, which
read the studies' sections, load parameters from here; a command that reads no study section may use
``params.load_params`` alone. A fourth study adds its ``check_problems`` to ``CHECKS``.
"""
from __future__ import annotations

from pathlib import Path

from .. import params
from .dynamics import plan as dynamics
from .inference import plan as inference
from .sensitivity import plan as sensitivity

CHECKS = (sensitivity.check_problems, inference.check_problems, dynamics.check_problems)


def load_params(path: str | Path = "params.yaml") -> dict:
    """``params.load_params`` with every study's checks."""
    return params.load_params(path, checks=CHECKS)


def validate_params(values, source: str = "params.yaml") -> dict:
    """``params.validate_params`` with every study's checks."""
    return params.validate_params(values, source, checks=CHECKS)
