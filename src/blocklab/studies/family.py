"""The command line the studies share (sensitivity, dynamics, inference: ``blocklab <study> <verb>``): each study's
``commands.register()`` makes its verbs with these, so that ``train``, ``plan``, ``status`` and ``snapshot`` take the
same options (``--params``, ``--root``, ``--out``) in every study and a fourth study gets them by calling the same
functions. The studies' data paths are ``cells.study_paths``."""
from __future__ import annotations

from pathlib import Path

from ..model_config import NORM_POSITIONS
from ..io import write_table
from ..training.commands import add_train as run_command, resumed_by_the_same_command
from ..params_file import load_params


def add_command(subparsers, verb: str, help: str, func, root: bool = False):
    """A study's command with --params (and --root, the project holding data/); returns it for its own options."""
    p = subparsers.add_parser(verb, help=help)
    p.add_argument("--params", default="params.yaml")
    if root:
        p.add_argument("--root", default=".", type=Path, help="project root holding data/ (default: here)")
    p.set_defaults(func=func)
    return p


def add_train(subparsers, help: str, func, norm_and_warmup: bool = True):
    """``train``: one run of a setting (--cell) at a seed into --out-dir (``training.commands.add_train``'s options); the
    norm position and warm-up are given, or (``norm_and_warmup=False``) the study's plan fixes them."""
    p = run_command(subparsers, "train", help, resumed_by_the_same_command(func))
    p.add_argument("--cell", required=True, help="the setting, e.g. learned-b32-L24-lr0.001-fp32")
    if norm_and_warmup:
        p.add_argument("--norm", required=True, choices=NORM_POSITIONS)
        p.add_argument("--warmup", required=True, type=int)
    return p


def add_plan(subparsers, help: str, plan, out: str | None = None):
    """``plan``: every run of the study and its directory, as a table written to --out (default ``out``)."""
    p = add_command(subparsers, "plan", help, lambda args: write_table(plan(load_params(args.params)), args.out))
    p.add_argument("--out", type=Path, required=out is None, default=None if out is None else Path(out))
    return p


def add_status(subparsers, help: str, func):
    """``status``: where each planned run stands (read under --root); returns it for the study's own options."""
    return add_command(subparsers, "status", help, func, root=True)


def add_snapshot(subparsers, help: str, func, root: bool = False):
    """``snapshot``: record the study's finished runs in --out, a directory kept in git."""
    p = add_command(subparsers, "snapshot", help, func, root=root)
    p.add_argument("--out", required=True, type=Path)
    return p
