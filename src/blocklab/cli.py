"""The `blocklab` command: a few commands for people first, then the pipeline's jobs (`blocklab <group> <verb>`, what
the Snakemake rules call) and maintenance. User errors exit 2 without a traceback."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .model_config import ConfigError
from .studies.protocol import STUDIES

# The whole command line, defined here once: a command -> (its line in `blocklab --help`, the module that defines it),
# or a group -> (its line, {verb -> module}). Each module's register(subparsers) adds its own commands (setting `func`
# on each parser), under the group's verbs for a group. Only the module of the command being run is imported (`blocklab
# --help` imports none: no torch), so one broken or slow module never affects the others.
TABLE = {
    "status": ("every run of the pipeline on disk: its state, step and loss", "blocklab.status"),
    "claims": ("the claims table: each claim of the chapters, its measured value and verdict",
               "blocklab.reporting.claims_table"),
    "report": ("the HTML report in a browser (inspect); the recorded full run's report, in English in minutes "
               "(recorded); the pipeline's notebook, figure, claims and metrics jobs", {
        "inspect": "blocklab.reporting.browser",
        "recorded": "blocklab.reporting.report",
        "notebook": "blocklab.reporting.report",
        "figure": "blocklab.reporting.report",
        "claims": "blocklab.reporting.claims",
        "metrics": "blocklab.reporting.metrics",
    }),
    "review": ("check a transformer block or a Hugging Face architecture against the 2026 defaults "
               "(blocklab review llama)", "blocklab.review"),
    "lab": ("put a block through document 000's copy-task stress test: does it start without warm-up, how often "
            "does it collapse (blocklab lab deepnorm --out DIR)", "blocklab.lab.command"),
    "bench": ("copy-task sweep throughput: the plain per-run loop vs the fast path, side by side",
              "blocklab.bench.command"),
    "smoke": ("the whole pipeline on the tiny configuration in a scratch copy (minutes)", "blocklab.smoke"),
    "verify": ("check finished runs and recorded snapshots against their checksums", "blocklab.integrity"),
    "lab-job": ("to use the lab, run `blocklab lab`; this holds the jobs its workflow runs (run, gradnorm, report: "
                "workflow/rules/lab.smk) and the verbs that train and record records/lab (maintainers)", {
        "run": "blocklab.lab.jobs",
        "gradnorm": "blocklab.lab.jobs",
        "report": "blocklab.lab.jobs",
        "run-builtin": "blocklab.lab.jobs",
        "record": "blocklab.lab.jobs",
        "lr-run": "blocklab.lab.jobs",
        "lr-record": "blocklab.lab.jobs",
        "underflow": "blocklab.lab.jobs",
    }),
    "sweep": ("document 000's copy-task sweep: norm position x warm-up x seed", {
        "train": "blocklab.training.sweep",
        "train-group": "blocklab.training.batched",
        "aggregate": "blocklab.training.sweep",
    }),
    "exp": ("the single experiments of documents 000 and 004", {
        "gradnorm": "blocklab.experiments.gradnorm",
        "residual-sim": "blocklab.experiments.residual_sim",
        "problem9": "blocklab.experiments.problem9",
        "param-counts": "blocklab.experiments.param_counts",
        "activation-norms": "blocklab.experiments.activation_norms",
        "residual-ablation": "blocklab.experiments.activation_norms",
        "train-reverse": "blocklab.experiments.reverse_copy",
        "aggregate-reverse": "blocklab.experiments.reverse_copy",
        "probe-residual": "blocklab.experiments.residual_trained",
        "probe-copy": "blocklab.experiments.residual_trained",
    }),
    "sensitivity": ("the sensitivity study: what document 000 leaves open (its status and snapshot for people)", {
        "plan": "blocklab.studies.sensitivity.commands",
        "train": "blocklab.studies.sensitivity.commands",
        "gradnorm": "blocklab.studies.sensitivity.commands",
        "snapshot": "blocklab.studies.sensitivity.commands",
        "aggregate": "blocklab.reporting.sensitivity",  # it judges claims (claim x setting): the reporting level's
        "verdicts": "blocklab.reporting.sensitivity",
        "status": "blocklab.studies.sensitivity.commands",
        "figures": "blocklab.studies.sensitivity.commands",
    }),
    "dynamics": ("the training-dynamics study: why post-norm fails (its status and snapshot for people)", {
        "plan": "blocklab.studies.dynamics.commands",
        "train": "blocklab.studies.dynamics.commands",
        "snapshot": "blocklab.studies.dynamics.commands",
        "status": "blocklab.studies.dynamics.commands",
        "aggregate": "blocklab.studies.dynamics.commands",
        "detectors": "blocklab.studies.dynamics.detectors",
        "figures": "blocklab.studies.dynamics.commands",
    }),
    "inference": ("the inferred setup: fitting runs ranked by the document's losses (its status for people)", {
        "plan": "blocklab.studies.inference.commands",
        "train": "blocklab.studies.inference.commands",
        "snapshot": "blocklab.studies.inference.commands",
        "status": "blocklab.studies.inference.commands",
        "aggregate-holdout": "blocklab.studies.inference.commands",
        "aggregate": "blocklab.reporting.inference",  # it ranks by the document's numbers (claims): reporting's
        "score": "blocklab.reporting.inference",
    }),
    "docs": ("rewrite the README's and docs/' generated blocks from the recorded tables (--check: only compare)",
             "blocklab.reporting.docs"),
    "gallery": ("redraw every figure of a finished run into docs/gallery with provenance", "blocklab.reporting.gallery"),
}

# `blocklab --help` in three parts, in this order. A name here without an entry in TABLE is left out (a slot).
SECTIONS = {
    "commands for people": ("status", "claims", "report", "review", "lab", "bench", "smoke", "verify"),
    "the pipeline's jobs (the Snakemake rules call these; `blocklab status` shows where they stand)":
        ("sweep", "exp", *STUDIES, "lab-job"),
    "maintenance": ("docs", "gallery"),
}

# Every command as the words that call it ("sweep train", "review") -> its module.
COMMANDS = {f"{name} {verb}": module for name, (_, target) in TABLE.items() if isinstance(target, dict)
            for verb, module in target.items()}
COMMANDS |= {name: target for name, (_, target) in TABLE.items() if isinstance(target, str)}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: same exit status, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"blocklab: error: {message}\n")


def _register(modules, subparsers) -> None:
    for name in dict.fromkeys(modules):
        importlib.import_module(name).register(subparsers)


def _overview() -> str:
    """The commands of `blocklab --help`, by section, each with its line from TABLE."""
    width = max(map(len, TABLE)) + 2
    parts = []
    for title, names in SECTIONS.items():
        lines = [f"  {name:<{width}}{TABLE[name][0]}" for name in names if name in TABLE]
        parts.append(f"{title}:\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n\n`blocklab COMMAND --help`: a command's options; `blocklab GROUP --help`: its verbs."


def build_parser(words=()) -> argparse.ArgumentParser:
    """The parser for the command that ``words`` (the command line's leading words) name, importing its module alone
    when they name one; every other command gets a bare entry from TABLE (help, usage errors), importing nothing.
    ``words=None``: every command of every group (for the tests)."""
    every = words is None
    words = list(words or [])[:2] + [None, None]
    parser = _Parser(prog="blocklab", usage="blocklab [-h] COMMAND ...", description=__doc__,
                     epilog=_overview(), formatter_class=argparse.RawDescriptionHelpFormatter)
    top = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                prog="blocklab", help=argparse.SUPPRESS)
    for name, (about, target) in TABLE.items():
        named = every or words[0] == name
        if isinstance(target, str):
            if named:
                _register([target], top)
            else:
                top.add_parser(name, description=about)
            continue
        group = top.add_parser(name, description=about)
        sub = group.add_subparsers(dest="verb", required=True, parser_class=_Parser, metavar="VERB")
        if named:
            _register([target[words[1]]] if words[1] in target and not every else target.values(), sub)
    return parser


def _pipeline_says_interrupt() -> bool:
    """Whether this command is a job of a Snakemake main process that says in one line what a Ctrl-C kept
    (blocklab.pipeline.say_interrupt_in_one_line): the same Ctrl-C then ends this command without a word of its own."""
    import os

    return os.environ.get("BLOCKLAB_INTERRUPT_SAID_BY") == str(os.getpgrp())


def _exit_quietly(signum, frame):
    raise SystemExit(130)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet_interrupt = _pipeline_says_interrupt()
    if quiet_interrupt:  # even while importing (torch takes seconds); training sets its own handler while it trains
        import signal

        signal.signal(signal.SIGINT, _exit_quietly)
    if refused := _params_refused(argv):  # before the command's module is imported (torch alone takes seconds)
        return refused
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
        return 130 if quiet_interrupt else _fail(command, "interrupted", 130)
    return int(result or 0)


def _params_refused(argv: list[str]) -> int:
    """A --params file too large, a YAML bomb or not YAML at all is refused in a fraction of a second, before any
    command module (and torch) is imported: ``params_file.read_params_file``'s checks, one line, exit 2; 0 when it passes
    them or names no file (the command then reads and validates it as always)."""
    given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--params"]
    given += [a.split("=", 1)[1] for a in argv if a.startswith("--params=")]
    from .params_file import ParamsError, read_params_file

    for path in given:
        if not Path(path).is_file():
            continue  # the command says so, naming its option
        try:
            read_params_file(path)
        except ParamsError as err:
            words = [a for a in argv if not a.startswith("-")][:2]
            return _fail(" ".join(words), err, 2)
    return 0


def _fail(command: str, err, status: int) -> int:
    # One line, so that a Snakemake log or a CI summary shows the whole message.
    message = " ".join(str(err).split())
    print(f"blocklab {command}: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
