"""Every registered study's own checks of params.yaml, from its plan (``studies.<study>.plan.check_problems``), which
``params_file.validate_params`` runs after the schema and the general checks, all before any compute and in one message.

The params level, beside the plans: ``params`` reads ``CHECKS`` (a deferred import), and no plan imports ``params``, so
there is no circle. A fourth study adds its plan here; tests/test_studies.py checks that ``CHECKS`` holds exactly the
plans of ``protocol.STUDIES``.
"""
from __future__ import annotations

from .dynamics import plan as dynamics
from .inference import plan as inference
from .sensitivity import plan as sensitivity

CHECKS = (sensitivity.check_problems, inference.check_problems, dynamics.check_problems)
