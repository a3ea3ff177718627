"""`blocklab smoke` and what a fresh checkout's commands find after it: the scratch copy holds the tracked files only
(the untracked ones are named), its jobs import the copy's code, a Ctrl-C names the one command that resumes, and
`blocklab status`, `blocklab claims` and `blocklab report inspect` show the smoke's result where the checkout has none.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from blocklab import smoke
from blocklab.records import GALLERY, SMOKE

PROJECT = Path(__file__).resolve().parents[1]


def git_project(root: Path) -> Path:
    """A small git project: a tracked config and module, an edit not committed, an untracked and an ignored file."""
    (root / "configs").mkdir(parents=True)
    (root / "configs/tiny.yaml").write_text("sweep: {steps: 2}\n")
    (root / "src/pkg").mkdir(parents=True)
    (root / "src/pkg/__init__.py").write_text("WHERE = 'committed'\n")
    (root / ".gitignore").write_text("ignored.txt\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run(git + ["init", "-q"], cwd=root, check=True)
    subprocess.run(git + ["add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-qm", "x"], cwd=root, check=True)
    (root / "src/pkg/__init__.py").write_text("WHERE = 'edited'\n")
    (root / "src/pkg/new.py").write_text("")
    (root / "ignored.txt").write_text("")
    return root


def test_the_scratch_copy_holds_the_tracked_files_and_its_jobs_import_its_code(tmp_path):
    """Tracked files are copied with their uncommitted edits, the untracked one is left out and named, the ignored one
    neither; copying again into the kept copy works (a resumed smoke); a job's Python imports the copy's src/, not
    the package the environment installed."""
    project = git_project(tmp_path / "project")
    assert smoke.untracked_files(project) == ["src/pkg/new.py"]
    dest = smoke.make_scratch_project(tmp_path / "scratch", project=project)
    assert (dest / "src/pkg/__init__.py").read_text() == "WHERE = 'edited'\n"
    assert (dest / "params.yaml").read_text() == "sweep: {steps: 2}\n"
    assert not (dest / "src/pkg/new.py").exists() and not (dest / "ignored.txt").exists()
    assert smoke.make_scratch_project(dest, project=project) == dest  # again, into the kept copy: nothing to commit

    found = subprocess.run([sys.executable, "-c", "import pkg; print(pkg.WHERE)"], env=smoke.job_env(dest),
                           capture_output=True, text=True, check=True).stdout.strip()
    assert found == "edited"
    copy = tmp_path / "copy"
    smoke.make_scratch_project(copy)  # the real project: its jobs must import this copy's blocklab
    found = subprocess.run([sys.executable, "-c", "import blocklab; print(blocklab.__file__)"], env=smoke.job_env(copy),
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(found).resolve() == (copy / "src/blocklab/__init__.py").resolve(), found
    # its runs record the checkout's commit, not the copy's throwaway one
    recorded = subprocess.run([sys.executable, "-c", "from blocklab.provenance import code_version; "
                               "print(code_version()['git_commit'])"], env=smoke.job_env(copy), cwd=copy,
                              capture_output=True, text=True, check=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT, capture_output=True, text=True).stdout.strip()
    assert recorded == head != subprocess.run(["git", "rev-parse", "HEAD"], cwd=copy, capture_output=True,
                                              text=True).stdout.strip()


def test_an_interrupted_smoke_names_the_command_that_resumes_it(tmp_path, monkeypatch, capsys):
    """Snakemake's one Ctrl-C line (blocklab.pipeline.kept_line) names `blocklab smoke --keep DIR` in a smoke's jobs;
    the smoke itself waits for it and adds nothing, exit status 130."""
    from blocklab.pipeline import kept_line

    dest = tmp_path / "scratch"
    monkeypatch.setenv("BLOCKLAB_RESUME", smoke.job_env(dest)["BLOCKLAB_RESUME"])
    line = kept_line(tmp_path)
    assert f"resume with `blocklab smoke --keep {dest}`" in line and "interrupted" in line and "\n" not in line

    class Interrupted:  # Snakemake, sent the terminal's Ctrl-C with the smoke: it says the line and exits 1
        def wait(self):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            return 1

    monkeypatch.setattr(smoke, "make_scratch_project", lambda dest, config: dest)
    monkeypatch.setattr(smoke, "PROJECT", tmp_path / "checkout")
    monkeypatch.setattr(smoke, "start_snakemake", lambda dest, cores: Interrupted())
    before = signal.getsignal(signal.SIGINT)
    assert smoke._main(argparse.Namespace(keep=dest, config="configs/tiny.yaml", cores=2)) == 130
    assert signal.getsignal(signal.SIGINT) is before
    assert "smoke run finished" not in capsys.readouterr().out
    record = json.loads((tmp_path / "checkout" / SMOKE).read_text())
    assert record["project"] == str(dest.resolve()) and record["finished"] is None


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def killed_smoke(checkout: Path, scratch: Path, **fields) -> dict:
    """The record a SIGKILLed `blocklab smoke` leaves in ``checkout``: not finished, its pid gone, its copy there."""
    (scratch / "data/sweep/runs/pre-w0-s0").mkdir(parents=True)
    (scratch / "data/sweep/runs/pre-w0-s0/checkpoint.pt").write_bytes(bytes(3_000_000))
    record = {"project": str(scratch), "config": "configs/tiny.yaml", "started": "2026-12-07T03:00:00+00:00",
              "finished": None, "pid": _dead_pid(), "state": smoke.checkout_state(checkout), **fields}
    (checkout / SMOKE).parent.mkdir(parents=True, exist_ok=True)
    (checkout / SMOKE).write_text(json.dumps(record))
    return record


def test_a_killed_smoke_is_resumed_by_the_next_when_the_checkout_is_as_it_was_else_named_with_its_size(
        tmp_path, monkeypatch, capsys):
    checkout, scratch = git_project(tmp_path / "checkout"), tmp_path / "blocklab-smoke-killed"
    monkeypatch.setattr(smoke, "PROJECT", checkout)
    killed_smoke(checkout, scratch)
    args = argparse.Namespace(keep=None, config="configs/tiny.yaml", cores=2)
    assert smoke._resumable(args, smoke.checkout_state(checkout)) == scratch
    said = capsys.readouterr().err
    assert f"resuming the interrupted smoke's scratch copy {scratch} (3 MB, started 2026-12-07T03:00:00+00:00;" in said
    # the checkout edited since: a fresh copy, the killed one named with its size and the commands
    (checkout / "src/pkg/__init__.py").write_text("WHERE = 'edited again'\n")
    assert smoke._resumable(args, smoke.checkout_state(checkout)) is None
    said = capsys.readouterr().err
    assert f"an interrupted smoke's scratch copy is kept: {scratch} (3 MB, started " in said, said
    assert f"`blocklab smoke --keep {scratch}` resumes it, `rm -r {scratch}` frees it" in said
    # a smoke still running (its pid alive) is neither resumed nor named; a finished one neither
    killed_smoke(checkout, tmp_path / "running", pid=os.getpid())
    assert smoke.interrupted_smoke(checkout) is None
    killed_smoke(checkout, tmp_path / "finished", finished="2026-12-07T03:09:00+00:00")
    assert smoke.interrupted_smoke(checkout) is None


def test_status_names_a_killed_smokes_copy_its_size_and_the_command_that_resumes_it(tmp_path):
    checkout, scratch = tmp_path / "checkout", tmp_path / "blocklab-smoke-killed"
    (checkout / "data").mkdir(parents=True)
    (checkout / "data/README.md").write_text("what the pipeline writes here\n")
    shutil.copy(PROJECT / "configs/tiny.yaml", checkout / "params.yaml")
    killed_smoke(checkout, scratch, config="configs/other.yaml")
    result = blocklab("status", cwd=checkout)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        f"an interrupted smoke's scratch copy is kept: {scratch} (3 MB, started 2026-12-07T03:00:00+00:00); "
        f"`blocklab smoke --keep {scratch} --config configs/other.yaml` resumes it, `rm -r {scratch}` frees it")


def test_smoke_help_describes_it():
    result = subprocess.run([sys.executable, "-m", "blocklab.cli", "smoke", "--help"], capture_output=True, text=True,
                            check=True)
    assert "scratch copy" in result.stdout and "--keep" in result.stdout and "untracked" in result.stdout


@pytest.fixture
def after_smoke(tmp_path):
    """A checkout with no data/ whose last smoke's scratch copy has a finished run, a claims table and a report."""
    checkout, scratch = tmp_path / "checkout", tmp_path / "scratch"
    (checkout / "data").mkdir(parents=True)  # a fresh clone's data/ holds its README only
    (checkout / "data/README.md").write_text("what the pipeline writes here\n")
    run = scratch / "data/sweep/runs/pre-w0-s0"
    run.mkdir(parents=True)
    (run / "loss.csv").write_text("step,loss,lr\n1,4.2,0.001\n60,0.125,0.001\n")
    (run / "meta.json").write_text('{"status": "finished", "wall_time_s": 90.0, "sweep": {"steps": 60}}')
    (scratch / "data/claims").mkdir(parents=True)
    shutil.copy(PROJECT / GALLERY / "claims/claims.csv", scratch / "data/claims/claims.csv")
    (scratch / "reports").mkdir()
    (scratch / "reports/analysis.html").write_text("<html></html>")
    shutil.copy(PROJECT / "configs/tiny.yaml", scratch / "params.yaml")
    (checkout / ".blocklab").mkdir(parents=True)
    (checkout / SMOKE).write_text(json.dumps({"project": str(scratch), "finished": "2026-12-06T02:40:00+00:00"}))
    return checkout, scratch


def blocklab(*args, cwd):
    return subprocess.run([sys.executable, "-m", "blocklab.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_status_and_claims_show_the_smoke_where_the_checkout_has_no_data(after_smoke):
    checkout, scratch = after_smoke
    result = blocklab("status", cwd=checkout)
    assert result.returncode == 0, result.stderr
    first, *rest = result.stdout.splitlines()
    assert first.startswith("no data/sweep/runs here: the smoke's") and str(scratch) in first
    row = next(line for line in rest if line.startswith("data/sweep/runs/pre-w0-s0"))
    assert "finished" in row and "60/60" in row and "0.125" in row
    result = blocklab("claims", cwd=checkout)
    assert result.returncode == 0, result.stderr
    assert str(scratch / "data/claims/claims.csv") in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "d000-post-nowarm-stuck" in result.stdout
    shutil.rmtree(scratch)  # the scratch copy removed: the checkout's own state, as before
    result = blocklab("status", cwd=checkout)
    assert result.returncode == 0 and "smoke" not in result.stdout and "no training run on disk" in result.stdout
    result = blocklab("claims", cwd=checkout)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_report_inspect_opens_the_smokes_report_where_the_checkout_has_none(after_smoke, monkeypatch, capsys):
    from blocklab.reporting import browser

    checkout, scratch = after_smoke
    opened = []
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(browser, "inspect_report", lambda html, **kw: opened.append(html) or {"title": "x"})
    browser._inspect_main(argparse.Namespace(html=browser.REPORT, screenshot=None, width=800))
    assert opened == [str(scratch / "reports/analysis.html")]
    assert "no reports/analysis.html here: the smoke's" in capsys.readouterr().err


def test_the_eta_adds_the_training_the_jobs_the_probe_and_the_serial_end_measured_here():
    """The tiny configuration's time is mostly its jobs starting (each imports torch), the SmolLM2 probe, and the
    claims and report at the end, one after another; its runs train for seconds. The ETA counts each part from this
    machine measured now (a job's start, a step, a run's fixed cost) and says each; the arithmetic, by hand."""
    from blocklab.params_file import load_params
    from blocklab.status import HEAVY_JOBS, ORDINARY_JOB, eta_line, pipeline_eta

    config = load_params(PROJECT / "configs/tiny.yaml")
    targets = [f"data/sweep/runs/pre-w0-s{seed}/meta.json" for seed in range(4)]  # 4 runs x 60 steps
    rules = ["train_copy"] * 4 + ["problem9", "probe_lm", "claims", "report"]
    measured = {"start_s": 2.0, "step_s": 0.01, "run_s": 1.5, "timed": 16, "load": 0.0}
    eta = pipeline_eta(targets, config, cores=2, root=PROJECT / "no-such-dir", rules=rules, measured=measured)
    training = 4 * 60 * 0.01 + 4 * 1.5
    jobs = 5 * 2.0 * ORDINARY_JOB
    probe, serial = 2.0 * HEAVY_JOBS["probe_lm"], 2.0 * (HEAVY_JOBS["claims"] + HEAVY_JOBS["report"])
    assert (eta["runs"], eta["steps"], eta["jobs"]) == (4, 240, 8)
    assert eta["training"] == pytest.approx(training) and eta["jobs_s"] == pytest.approx(jobs)
    assert eta["probe_s"] == pytest.approx(probe) and eta["serial_s"] == pytest.approx(serial)
    assert eta["seconds"] == pytest.approx((training + jobs + probe) / 2 + serial)  # 2 lanes; the serial end alone
    line = eta_line(eta)
    for said in ("4 training run(s) left, 240 steps at 0.01 s a step, 16 steps timed here now", "8 job(s)",
                 "a start, 2 side by side, measured here now: 2.0 s", "the SmolLM2 probe", "the claims and the report render"):
        assert said in line, (said, line)
    # the runs Snakemake will (re)make, when it says which (a forced rerun of a finished run counts)
    assert pipeline_eta(targets, config, cores=2, root=PROJECT / "no-such-dir", rules=rules, measured=measured,
                        todo={targets[0]})["runs"] == 1
    # nothing measured and nothing finished: a tiny model's step is not the recorded default run's scaled by FLOPs
    bare = pipeline_eta(targets, config, cores=2, root=PROJECT / "no-such-dir")
    assert bare["seconds"] is None and "no measured step cost yet" in eta_line(bare)


def test_measuring_here_times_a_start_and_real_training_steps_of_the_configuration():
    from blocklab.status import measure_here

    found = measure_here(PROJECT / "configs/tiny.yaml", lanes=2)
    assert found["start_s"] > 0 and found["step_s"] > 0 and found["run_s"] >= 0 and found["timed"] == 16, found
    starts = measure_here(PROJECT / "configs/tiny.yaml", lanes=1, train=False)  # no training job left to estimate
    assert starts["start_s"] > 0 and starts["step_s"] is None and starts["timed"] == 0, starts


def test_every_word_a_judge_gives_a_run_is_in_the_one_outcome_vocabulary():
    """The sweep's, the lab's and the dynamics study's outcome words, read from the judges themselves, each map onto
    run_settings.OUTCOMES; a word no judge gives is refused, naming the allowed ones."""
    import math

    import pandas as pd

    from blocklab.lab import outcomes as lab
    from blocklab.run_settings import OUTCOME_WORDS, OUTCOMES, outcome
    from blocklab.studies.dynamics import plan as dynamics
    from blocklab.training.sweep import classify

    chance = math.log(64)
    curves = {"learned": [4.1, 0.1], "stuck": [4.1, 4.0], "collapsed": [4.1, 0.1, 3.0], "partial": [4.1, 2.0]}
    assert {word: classify(pd.Series([x for x in curve]), 64) for word, curve in curves.items()} == {
        word: word for word in curves}
    assert set(OUTCOME_WORDS["sweep"]) == {*curves, "diverged"}
    assert set(OUTCOME_WORDS["lab"]) == set(lab.OUTCOMES)
    assert set(OUTCOME_WORDS["dynamics"]) == set(dynamics.OUTCOMES)
    assert {outcome(j, w) for j, words in OUTCOME_WORDS.items() for w in words} == set(OUTCOMES)
    assert outcome("lab", lab.outcome([1, 2], [0.1 * chance - 0.01, 4.0], 64, None)["outcome"]) == "collapsed"
    assert outcome("lab", "never") == outcome("sweep", "stuck") == outcome("dynamics", "never learned")
    with pytest.raises(ValueError, match="lab: learned, never"):
        outcome("lab", "stuck")


def test_a_finished_smoke_records_its_copy_and_its_metrics_for_dvc(tmp_path, monkeypatch, capsys):
    """The checkout records where the smoke ran and when it finished, and holds a copy of its metrics, which dvc.yaml
    lists, so that `dvc metrics show` in the checkout shows them; the last lines say so."""
    dest, checkout = tmp_path / "scratch", tmp_path / "checkout"

    class Finished:
        def wait(self):
            (dest / "data/claims").mkdir(parents=True)
            (dest / "data/claims/metrics.json").write_text('{"verdicts": {"reproduced": 3}}')
            return 0

    monkeypatch.setattr(smoke, "make_scratch_project", lambda dest, config: dest)
    monkeypatch.setattr(smoke, "PROJECT", checkout)
    monkeypatch.setattr(smoke, "start_snakemake", lambda dest, cores: Finished())
    assert smoke._main(argparse.Namespace(keep=dest, config="configs/tiny.yaml", cores=2)) == 0
    record = json.loads((checkout / SMOKE).read_text())
    assert record["project"] == str(dest.resolve()) and record["finished"] and record["wall_s"] >= 0
    # and what a row of performance/measured/pipeline_times.csv needs: its jobs' CPU time, the machine, its load
    assert record["cpu_s"] >= 0 and record["cores"] >= 1 and "machine" in record and "load_at_start" in record
    out = capsys.readouterr().out
    assert "CPU-seconds" in out
    from blocklab.records import SMOKE_METRICS

    assert json.loads((checkout / SMOKE_METRICS).read_text()) == {"verdicts": {"reproduced": 3}}
    assert SMOKE_METRICS in yaml.safe_load((PROJECT / "dvc.yaml").read_text())["metrics"]
    assert SMOKE_METRICS in out.splitlines()[-1]
