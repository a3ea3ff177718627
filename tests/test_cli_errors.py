"""Bad arguments to `blocklab` fail with a non-zero status and a message, never with a traceback or half an output.

Run through `python -m blocklab.cli` in a subprocess, exactly as a user or a Snakemake rule would.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
TINY = str(PROJECT / "configs/tiny.yaml")  # sweep.steps = 60


def blocklab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blocklab.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def train_copy(out_dir: Path, **overrides: str) -> list[str]:
    args = {"--params": TINY, "--norm": "pre", "--warmup": "0", "--seed": "0", "--out-dir": str(out_dir), **overrides}
    return ["sweep", "train"] + [item for key, value in args.items() if value is not None for item in (key, value)]


# (case id, arguments given the output directory, exit status, what stderr must mention)
CASES = [
    ("no-subcommand", lambda out: [], 2, "required: COMMAND"),
    ("unknown-subcommand", lambda out: ["trian-copy", "--seed", "0"], 2, "invalid choice: 'trian-copy'"),
    ("unknown-verb", lambda out: ["sweep", "trian", "--seed", "0"], 2, "invalid choice: 'trian'"),
    ("group-without-verb", lambda out: ["dynamics"], 2, "required: VERB"),
    ("missing-required-option", lambda out: train_copy(out, **{"--seed": None}), 2, "--seed"),
    ("non-integer-seed", lambda out: train_copy(out, **{"--seed": "one"}), 2, "invalid int value: 'one'"),
    ("float-seed", lambda out: train_copy(out, **{"--seed": "1.5"}), 2, "invalid int value: '1.5'"),
    ("norm-not-in-choices", lambda out: train_copy(out, **{"--norm": "mid"}), 2, "invalid choice: 'mid'"),
    ("warmup-longer-than-steps", lambda out: train_copy(out, **{"--warmup": "61"}), 2, "0..60"),
    ("negative-warmup", lambda out: train_copy(out, **{"--warmup": "-1"}), 2, "0..60"),
    ("nonexistent-params", lambda out: train_copy(out, **{"--params": str(out.parent / "nope.yaml")}), 2,
     "nope.yaml' does not exist"),
    ("params-is-a-directory", lambda out: train_copy(out, **{"--params": str(out.parent)}), 2, "is a directory"),
    ("unknown-option", lambda out: train_copy(out) + ["--epochs", "3"], 2, "unrecognized arguments: --epochs"),
    ("reverse-variant-not-in-choices",
     lambda out: ["exp", "train-reverse", "--params", TINY, "--variant", "fancy", "--seed", "0", "--out-dir", str(out)], 2,
     "invalid choice: 'fancy'"),
    ("gradnorm-missing-out", lambda out: ["exp", "gradnorm", "--params", TINY], 2, "--out"),
    ("residual-sim-nonexistent-params",
     lambda out: ["exp", "residual-sim", "--params", str(out.parent / "missing.yaml"), "--out-curve", str(out / "c.csv"),
                  "--out-table", str(out / "t.csv")], 2, "missing.yaml' does not exist"),
    # The output's parent is a file: the environment, not the parameters, is wrong (exit 1), still one line.
    ("output-under-a-file", lambda out: ["exp", "problem9", "--params", TINY, "--out", str(out.parent / "a-file" / "s.csv")], 1,
     "a-file"),
]


@pytest.mark.parametrize("make_args,status,mention", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_arguments_fail_cleanly(tmp_path, make_args, status, mention):
    (tmp_path / "a-file").write_text("not a directory\n")
    out = tmp_path / "out"
    result = blocklab(*make_args(out), cwd=tmp_path)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    assert mention in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("blocklab"), "the last line should be blocklab's message"
    assert not out.exists(), "a refused command must not leave output behind"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "nothing else may be written either"


def test_help_still_succeeds(tmp_path):
    # The other side of the cases above: the parser itself is fine.
    result = blocklab("sweep", "train", "--help", cwd=tmp_path)
    assert result.returncode == 0 and "--warmup" in result.stdout


def test_command_table_names_every_registered_subcommand():
    """cli.TABLE imports one module per command; it must list exactly what the modules register, in its group."""
    import argparse
    import importlib

    from blocklab.cli import TABLE

    for group, entry in TABLE.items():
        verbs = {group: entry} if isinstance(entry, str) else entry[1]
        for module_name in set(verbs.values()):
            subparsers = argparse.ArgumentParser().add_subparsers()
            importlib.import_module(module_name).register(subparsers)
            registered = set(subparsers.choices)
            assert registered == {v for v, m in verbs.items() if m == module_name}, (group, module_name)


def test_the_top_level_is_short_and_lists_the_groups(tmp_path):
    """Issue 35: at most 12 entries in `blocklab --help`; the groups' verbs appear in the group's own help."""
    from blocklab.cli import TABLE

    assert len(TABLE) <= 12
    result = blocklab("--help", cwd=tmp_path)
    assert result.returncode == 0
    listed = [line.split()[0] for line in result.stdout.split("COMMAND")[-1].splitlines()
              if line.startswith("    ") and not line.startswith("     ")]
    assert listed == list(TABLE), listed
    result = blocklab("sensitivity", "--help", cwd=tmp_path)
    assert result.returncode == 0 and {"plan", "train", "aggregate", "status", "snapshot"} <= set(result.stdout.split())
