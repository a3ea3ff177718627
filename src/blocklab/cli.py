"""The `blocklab` command. Every pipeline rule calls one of these subcommands; user errors exit 2 without a traceback."""
from __future__ import annotations

import argparse
import importlib
import sys

from .config import ConfigError

# Subcommand -> the module that defines it (with register(subparsers), setting `func` on its parser).
# Only the module of the command being run is imported, so one broken or slow module never affects the others.
COMMANDS = {
    "train-copy": "blocklab.training.sweep",
    "train-copy-group": "blocklab.training.batched",
    "aggregate-sweep": "blocklab.training.sweep",
    "gradnorm": "blocklab.experiments.gradnorm",
    "train-sensitivity": "blocklab.experiments.sensitivity",
    "sensitivity-gradnorm": "blocklab.experiments.sensitivity",
    "sensitivity-plan": "blocklab.experiments.sensitivity",
    "aggregate-sensitivity": "blocklab.reporting.sensitivity",
    "sensitivity-figures": "blocklab.reporting.sensitivity",
    "sensitivity-status": "blocklab.reporting.sensitivity",
    "sensitivity-snapshot": "blocklab.experiments.sensitivity",
    "train-dynamics": "blocklab.experiments.dynamics",
    "dynamics-plan": "blocklab.experiments.dynamics",
    "aggregate-dynamics": "blocklab.experiments.dynamics",
    "dynamics-snapshot": "blocklab.experiments.dynamics",
    "dynamics-status": "blocklab.experiments.dynamics",
    "dynamics-detectors": "blocklab.experiments.detectors",
    "dynamics-figures": "blocklab.figures.dynamics",
    "residual-sim": "blocklab.experiments.residual_sim",
    "problem9": "blocklab.experiments.problem9",
    "param-counts": "blocklab.experiments.param_counts",
    "activation-norms": "blocklab.experiments.activation_norms",
    "residual-ablation": "blocklab.experiments.activation_norms",
    "train-reverse": "blocklab.experiments.reverse_copy",
    "aggregate-reverse": "blocklab.experiments.reverse_copy",
    "probe-residual": "blocklab.experiments.probe",
    "probe-copy": "blocklab.experiments.probe",
    "review": "blocklab.review",
    "claims": "blocklab.reporting.claims",
    "inference-score": "blocklab.reporting.inference",
    "aggregate-inference": "blocklab.reporting.inference",
    "train-inference": "blocklab.experiments.inference",
    "aggregate-holdout": "blocklab.experiments.inference",
    "inference-plan": "blocklab.experiments.inference",
    "inference-snapshot": "blocklab.experiments.inference",
    "inference-status": "blocklab.experiments.inference",
    "report": "blocklab.reporting.report",
    "figure": "blocklab.reporting.report",
    "docs": "blocklab.reporting.docs",
    "inspect-report": "blocklab.reporting.browser",
    "bench": "blocklab.bench",
    "smoke": "blocklab.smoke",
    "gallery": "blocklab.reporting.gallery",
    "verify": "blocklab.integrity",
}


class UserError(ConfigError):
    """Bad input from the user: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: same exit status, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"blocklab: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for ``command`` alone when it is known, else for every command (help, usage errors)."""
    parser = _Parser(prog="blocklab", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    from .integrity import DamagedArtifact

    # Exit statuses (docs/reproducibility.md, "Faults"): 1 the environment, 2 the input, 3 damaged data, 130 interrupted.
    try:
        result = args.func(args)
    except (ConfigError, FileNotFoundError) as err:  # the user's input: fix the named value or path
        return _fail(args.command, err, 2)
    except OSError as err:  # the environment (permissions, a file where a directory belongs, a full disk)
        return _fail(args.command, err, 1)
    except DamagedArtifact as err:  # a finished run or snapshot is not what it recorded: the message says the repair
        return _fail(args.command, err, 3)
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
