"""The `blocklab` command. Every pipeline rule calls one of these subcommands; user errors exit 2 without a traceback."""
from __future__ import annotations

import argparse
import importlib
import sys

from .config import ConfigError

# Each module defines register(subparsers); a subcommand's parser sets `func` to a handler taking the parsed args.
COMMAND_MODULES = [
    "blocklab.sweep",
    "blocklab.experiments.gradnorm",
    "blocklab.experiments.residual_sim",
    "blocklab.experiments.problem9",
    "blocklab.experiments.param_counts",
    "blocklab.experiments.activation_norms",
    "blocklab.experiments.reverse_copy",
    "blocklab.probe",
    "blocklab.review",
    "blocklab.claims",
    "blocklab.report",
    "blocklab.bench",
    "blocklab.smoke",
]


class UserError(ConfigError):
    """Bad input from the user: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: same exit status, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"blocklab: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="blocklab", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.func(args)
    except (ConfigError, FileNotFoundError) as err:  # the user's input: fix the named value or path
        return _fail(args.command, err, 2)
    except OSError as err:  # the environment (permissions, a file where a directory belongs, a full disk)
        return _fail(args.command, err, 1)
    except KeyboardInterrupt:
        return _fail(args.command, "interrupted", 130)
    return int(result or 0)


def _fail(command: str, err, status: int) -> int:
    # One line, so that a Snakemake log or a CI summary shows the whole message.
    message = " ".join(str(err).split())
    print(f"blocklab {command}: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
