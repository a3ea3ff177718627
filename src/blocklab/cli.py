"""The `blocklab` command: `blocklab <group> <verb>` for the pipeline's steps, a few commands at the top for people.
Every pipeline rule calls one of these; user errors exit 2 without a traceback."""
from __future__ import annotations

import argparse
import importlib
import sys

from .config import ConfigError

# The whole command line, defined here once: a top-level command -> the module that defines it, or a group -> its help
# and {verb -> module}. Each module's register(subparsers) adds its own commands (setting `func` on each parser), under
# the group's verbs for a group. Only the module of the command being run is imported, so one broken or slow module
# never affects the others. The commands people type come first; the groups hold what the Snakemake rules call.
TABLE = {
    "review": "blocklab.review",
    "bench": "blocklab.bench.command",
    "smoke": "blocklab.smoke",
    "verify": "blocklab.integrity",
    "status": "blocklab.pipeline",
    "docs": "blocklab.reporting.docs",
    "gallery": "blocklab.reporting.gallery",
    "report": ("the analysis notebook, one figure, the claims table, the HTML report in a browser", {
        "notebook": "blocklab.reporting.report",
        "figure": "blocklab.reporting.report",
        "claims": "blocklab.reporting.claims",
        "inspect": "blocklab.reporting.browser",
    }),
    "sweep": ("document 000's copy-task sweep: norm position x warm-up x seed (the pipeline's jobs)", {
        "train": "blocklab.training.sweep",
        "train-group": "blocklab.training.batched",
        "aggregate": "blocklab.training.sweep",
    }),
    "exp": ("the single experiments of documents 000 and 004 (the pipeline's jobs)", {
        "gradnorm": "blocklab.experiments.gradnorm",
        "residual-sim": "blocklab.experiments.residual_sim",
        "problem9": "blocklab.experiments.problem9",
        "param-counts": "blocklab.experiments.param_counts",
        "activation-norms": "blocklab.experiments.activation_norms",
        "residual-ablation": "blocklab.experiments.activation_norms",
        "train-reverse": "blocklab.experiments.reverse_copy",
        "aggregate-reverse": "blocklab.experiments.reverse_copy",
        "probe-residual": "blocklab.experiments.probe",
        "probe-copy": "blocklab.experiments.probe",
    }),
    "sensitivity": ("the sensitivity study: what document 000 leaves open (status and snapshot for people)", {
        "plan": "blocklab.studies.sensitivity.commands",
        "train": "blocklab.studies.sensitivity.commands",
        "gradnorm": "blocklab.studies.sensitivity.commands",
        "snapshot": "blocklab.studies.sensitivity.commands",
        "aggregate": "blocklab.studies.sensitivity.commands",
        "status": "blocklab.studies.sensitivity.commands",
        "figures": "blocklab.studies.sensitivity.commands",
    }),
    "dynamics": ("the training-dynamics study: why post-norm fails (status and snapshot for people)", {
        "plan": "blocklab.studies.dynamics.commands",
        "train": "blocklab.studies.dynamics.commands",
        "snapshot": "blocklab.studies.dynamics.commands",
        "status": "blocklab.studies.dynamics.commands",
        "aggregate": "blocklab.studies.dynamics.commands",
        "detectors": "blocklab.experiments.detectors",
        "figures": "blocklab.studies.dynamics.commands",
    }),
    "inference": ("the inferred setup: fitting runs ranked by the document's losses (status and snapshot for people)", {
        "plan": "blocklab.studies.inference.commands",
        "train": "blocklab.studies.inference.commands",
        "snapshot": "blocklab.studies.inference.commands",
        "status": "blocklab.studies.inference.commands",
        "aggregate-holdout": "blocklab.studies.inference.commands",
        "aggregate": "blocklab.studies.inference.commands",
        "score": "blocklab.studies.inference.commands",
    }),
}

# Every command as the words that call it ("sweep train", "review") -> its module.
COMMANDS = {f"{name} {verb}": module for name, entry in TABLE.items() if isinstance(entry, tuple)
            for verb, module in entry[1].items()}
COMMANDS |= {name: entry for name, entry in TABLE.items() if isinstance(entry, str)}


class UserError(ConfigError):
    """Bad input from the user: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: same exit status, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"blocklab: error: {message}\n")


def _register(modules, subparsers) -> None:
    for name in dict.fromkeys(modules):
        importlib.import_module(name).register(subparsers)


def build_parser(words=()) -> argparse.ArgumentParser:
    """The parser for the command that ``words`` (the command line's leading words) name, importing its module alone
    when they name one; else for every top-level command and group (help, usage errors). ``words=None``: every
    command of every group (for the tests)."""
    every = words is None
    words = list(words or [])[:2] + [None, None]
    parser = _Parser(prog="blocklab", description=__doc__)
    top = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    known = words[0] in TABLE
    for name, entry in TABLE.items():
        if isinstance(entry, str):
            if every or not known or words[0] == name:
                _register([entry], top)
            continue
        about, verbs = entry
        group = top.add_parser(name, help=about, description=about)
        sub = group.add_subparsers(dest="verb", required=True, parser_class=_Parser, metavar="VERB")
        if every or words[0] == name:
            _register([verbs[words[1]]] if words[1] in verbs and not every else verbs.values(), sub)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser([a for a in argv if not a.startswith("-")][:2]).parse_args(argv)
    command = " ".join(filter(None, [args.command, getattr(args, "verb", None)]))
    from .integrity import DamagedArtifact

    # Exit statuses (docs/reproducibility.md, "Faults"): 1 the environment, 2 the input, 3 damaged data, 130 interrupted.
    try:
        result = args.func(args)
    except (ConfigError, FileNotFoundError) as err:  # the user's input: fix the named value or path
        return _fail(command, err, 2)
    except OSError as err:  # the environment (permissions, a file where a directory belongs, a full disk)
        return _fail(command, err, 1)
    except DamagedArtifact as err:  # a finished run or snapshot is not what it recorded: the message says the repair
        return _fail(command, err, 3)
    except KeyboardInterrupt:
        return _fail(command, "interrupted", 130)
    return int(result or 0)


def _fail(command: str, err, status: int) -> int:
    # One line, so that a Snakemake log or a CI summary shows the whole message.
    message = " ".join(str(err).split())
    print(f"blocklab {command}: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
