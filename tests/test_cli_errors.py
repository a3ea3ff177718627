"""Bad arguments to `blocklab` fail with a non-zero status and a message, never with a traceback or half an output.

Run through `python -m blocklab.cli` in a subprocess, exactly as a user or a Snakemake rule would.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from blocklab.records import GALLERY

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

    for group, (_, target) in TABLE.items():
        verbs = {group: target} if isinstance(target, str) else target
        for module_name in set(verbs.values()):
            subparsers = argparse.ArgumentParser().add_subparsers()
            importlib.import_module(module_name).register(subparsers)
            registered = set(subparsers.choices)
            assert registered == {v for v, m in verbs.items() if m == module_name}, (group, module_name)


def test_the_top_level_lists_the_commands_for_people_first(tmp_path):
    """`blocklab --help` lists people's commands, then the pipeline's jobs, then maintenance; every command
    is in one section, and the groups' verbs appear in the group's own help."""
    from blocklab.cli import SECTIONS, TABLE

    placed = [name for names in SECTIONS.values() for name in names]
    assert len(placed) == len(set(placed)) and set(TABLE) <= set(placed)
    assert list(SECTIONS)[0] == "commands for people"
    assert {"sweep", "exp", "sensitivity", "dynamics", "inference"} <= set(list(SECTIONS.values())[1])
    result = blocklab("--help", cwd=tmp_path)
    assert result.returncode == 0
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ") and
              not line.startswith("   ") and not line.lstrip().startswith("-")]
    assert listed == [name for name in placed if name in TABLE], listed
    assert result.stdout.index("status") < result.stdout.index("sweep") < result.stdout.index("gallery")
    result = blocklab("sensitivity", "--help", cwd=tmp_path)
    assert result.returncode == 0 and {"plan", "train", "aggregate", "status", "snapshot"} <= set(result.stdout.split())


def test_help_imports_no_torch(tmp_path):
    """`blocklab --help` imports no command module, and the help of `status`, `claims` and `smoke` none that loads torch
    (a group's help imports its verbs' modules for their lines)."""
    code = ("import sys, contextlib, io\n"
            "from blocklab import cli\n"
            "for argv in (['--help'], ['status', '--help'], ['claims', '--help'], ['smoke', '--help'], []):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try:\n"
            "            cli.main(argv)\n"
            "        except SystemExit:\n"
            "            pass\n"
            "print(sorted(m for m in ('torch', 'matplotlib', 'pandas', 'transformers') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch" not in result.stdout and "matplotlib" not in result.stdout, result.stdout


def test_review_takes_a_model_type_as_its_argument():
    """`blocklab review llama` is `blocklab review --hf-config llama`."""
    from blocklab.cli import build_parser

    args = build_parser(["review", "llama"]).parse_args(["review", "llama", "--depth", "24"])
    assert args.model_type == "llama" and args.depth == 24


def test_report_inspect_without_a_report_fails_in_one_line(tmp_path):
    result = blocklab("report", "inspect", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "reports/analysis.html" in lines[0] and "snakemake" in lines[0], result.stderr


def test_status_and_claims_read_what_is_on_disk(tmp_path):
    """`blocklab status`: every run under data/ and the main sweep's planned runs, with step and loss; `blocklab
    claims`: the claims table, one claim a line, with the verdict counts; without data, status fails in one line and
    claims shows the recorded full run's table in a project (one line says so), or fails in one line elsewhere."""
    for command in ("status", "claims"):
        result = blocklab(command, cwd=tmp_path)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    fresh = tmp_path / "fresh"  # a fresh clone: no data/claims, the gallery's table recorded
    (fresh / GALLERY / "claims").mkdir(parents=True)
    (fresh / GALLERY / "claims/claims.csv").write_bytes((PROJECT / GALLERY / "claims/claims.csv").read_bytes())
    result = blocklab("claims", cwd=fresh)
    assert result.returncode == 0 and "d000-post-nowarm-stuck" in result.stdout, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and f"{GALLERY}/claims/claims.csv" in result.stderr
    (tmp_path / "params.yaml").write_text(Path(TINY).read_text(encoding="utf-8"), encoding="utf-8")
    done = tmp_path / "data/sweep/runs/pre-w0-s0"
    done.mkdir(parents=True)
    (done / "loss.csv").write_text("step,loss,lr\n1,4.2,0.001\n60,0.125,0.001\n")
    (done / "meta.json").write_text('{"status": "finished", "wall_time_s": 90.0, "sweep": {"steps": 60}}')
    going = tmp_path / "data/dynamics/runs/learned-b64-L24-lr0.001-fp32/post-w400-s3"
    going.mkdir(parents=True)
    (going / "train.log").write_text("post-w400-s3: step 100/1200 loss 4.0212 lr 2.50e-04\n")
    result = blocklab("status", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("data/")}
    assert "finished" in rows["data/sweep/runs/pre-w0-s0"] and "60/60" in rows["data/sweep/runs/pre-w0-s0"]
    assert "0.125" in rows["data/sweep/runs/pre-w0-s0"] and "1.5" in rows["data/sweep/runs/pre-w0-s0"]
    assert "training" in rows[str(going.relative_to(tmp_path))] and "100/1200" in rows[str(going.relative_to(tmp_path))]
    assert "not started" in rows["data/sweep/runs/post-w20-s1"]  # planned by the tiny sweep, not on disk
    assert "9 runs: " in result.stdout
    result = blocklab("claims", "--table", str(PROJECT / f"{GALLERY}/claims/claims.csv"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "d000-post-nowarm-stuck" in result.stdout and "claims: " in result.stdout.splitlines()[-1]


def test_smoke_runs_the_snakemake_beside_its_python_and_ends_with_the_paths(tmp_path, monkeypatch, capsys):
    """`.venv/bin/blocklab smoke` without the venv on PATH: Snakemake (and, through PATH, the rules' `blocklab`) are
    this Python's; the last lines name the report and the figures (after Snakemake's hundreds)."""
    import argparse

    from blocklab import smoke

    calls = []
    monkeypatch.setattr(smoke, "make_scratch_project", lambda dest, config: dest)
    monkeypatch.setattr(smoke, "PROJECT", tmp_path / "checkout")  # where it records the scratch copy
    monkeypatch.setattr(smoke, "untracked_files", lambda: [])
    done = subprocess.Popen([sys.executable, "-c", ""])
    real = subprocess.Popen  # git's calls (the checkout's commit and state) run; Snakemake's is recorded

    def popen(cmd, **kw):
        return real(cmd, **kw) if cmd[0] == "git" else calls.append((cmd, kw)) or done

    monkeypatch.setattr(smoke.subprocess, "Popen", popen)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    args = argparse.Namespace(keep=tmp_path / "scratch", config="configs/tiny.yaml", cores=2)
    assert smoke._main(args) == 0
    (command, kwargs), = calls
    here = Path(sys.executable).parent
    assert command[0] == str(here / "snakemake") or not (here / "snakemake").is_file()
    assert kwargs["env"]["PATH"].split(":")[0] == str(here)
    last = capsys.readouterr().out.strip().splitlines()[-6:]  # the end: report, figures, claims, log, where to look
    said = {line.split(":", 1)[0].strip(): line for line in last if ":" in line}
    assert str(tmp_path / "scratch" / "reports/analysis.html") in said["report"]
    assert str(tmp_path / "scratch" / "figs") in said["figures"]
    assert str(tmp_path / "scratch" / "logs" / "smoke.log") in said["log"]
