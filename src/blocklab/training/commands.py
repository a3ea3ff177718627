"""The argparse pieces that the training commands share (the copy-task sweep, document 004's reverse copy): one finished
run's training is its module's own; collecting finished runs into the two tidy tables is the same for both."""
from __future__ import annotations

from pathlib import Path

from ..model_config import ConfigError
from ..io import write_table


def add_train(subparsers, name: str, help: str, train_main):
    """``name --params --seed --out-dir [--threads]``: one run's command; the caller adds what picks its run."""
    p = subparsers.add_parser(name, help=help)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: params threads_per_run)")
    p.set_defaults(func=resumed_by_the_same_command(train_main))
    return p


def resumed_by_the_same_command(train_main):
    """A run's command typed by hand (no Snakemake main process, no lab, no smoke, which name their own command): its
    Ctrl-C line names this same command as the one that resumes it (training.train.RESUME_ENV), not Snakemake's."""
    def run(args):
        import os
        import shlex
        import sys

        from .train import INTERRUPT_ENV, RESUME_ENV

        if os.environ.get(RESUME_ENV) or os.environ.get(INTERRUPT_ENV):
            return train_main(args)
        os.environ[RESUME_ENV] = (f"the same command (`{shlex.join(['blocklab', *sys.argv[1:]])}`, from "
                                  f"{shlex.quote(os.getcwd())})")
        try:  # for this command only: a process that calls it in-process (a test) keeps its own environment after
            return train_main(args)
        finally:
            os.environ.pop(RESUME_ENV, None)

    return run


def add_aggregate(subparsers, name: str, help: str, aggregate) -> None:
    """``name --runs DIR... --out-losses CSV --out-summary CSV``: ``aggregate(runs) -> (losses, summary)`` over finished
    runs (each with its meta.json; an unfinished one is refused by name before anything is written)."""
    p = subparsers.add_parser(name, help=help)
    p.add_argument("--runs", nargs="+", required=True, type=Path)
    p.add_argument("--out-losses", required=True, type=Path)
    p.add_argument("--out-summary", required=True, type=Path)

    def run(args) -> None:
        missing = [str(r) for r in args.runs if not (Path(r) / "meta.json").is_file()]
        if missing:
            raise ConfigError(f"unfinished run(s) without meta.json: {missing}")
        losses, summary = aggregate(args.runs)
        write_table(losses, args.out_losses)
        write_table(summary, args.out_summary)

    p.set_defaults(func=run)
