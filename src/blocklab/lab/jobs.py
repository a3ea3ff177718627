"""`blocklab lab-job <verb>`: the stability lab's Snakemake jobs (workflow/rules/lab.smk); people run `blocklab lab`."""
from __future__ import annotations

from .command import register_jobs as register  # noqa: F401
