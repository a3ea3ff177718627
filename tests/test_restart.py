"""Stopping and starting again: Ctrl-C through `make run` ends in one line that says what is kept and how to
resume, and on the restart the runs with a checkpoint are scheduled first. On the tiny configuration, in a scratch
copy; a few seconds of training."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blocklab.pipeline import RESUME_PRIORITY, kept_line, resume_first
from blocklab.smoke import make_scratch_project

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
VENV = Path(sys.prefix)


def env_for(project: Path) -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "MPLBACKEND": "Agg",
            "PYTHONPATH": f"{project / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def training_logs(project: Path, steps: int | None = None, family: str = "**") -> list[Path]:
    """The train.log of every run (of ``family``: a folder under data/) that has logged a step of ``steps``: the
    sweep's runs made long, not a job that happens to start first and may end before the signal (the reverse-copy
    runs, or a study run that stops early)."""
    pattern = rf": step \d+/{steps if steps is not None else ''}"
    return [log for log in (project / "data").glob(f"{family}/runs/**/train.log")
            if re.search(pattern, log.read_text(encoding="utf-8", errors="replace"))]


def dry_run_priorities(project: Path) -> dict[str, int]:
    """Snakemake's dry run: each training job's run directory -> its priority (0 where Snakemake prints none)."""
    out = subprocess.run([str(BIN / "snakemake"), "--dry-run", "--cores", "2"], cwd=project, env=env_for(project),
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for block in out.split("\n\n"):
        rule = re.search(r"rule (train_\w+):", block)
        meta = re.search(r"output: .*?(data/\S+)/meta\.json", block)
        if rule and meta:
            priority = re.search(r"priority: (\d+)", block)
            found[meta[1]] = int(priority[1]) if priority else 0
    return found


def _as_from_a_terminal():
    """SIGINT back to its default in make's process, as a terminal's shell starts it: a test run started in the
    background of a non-interactive shell (``cmd &``) inherits SIGINT ignored, and a shell cannot trap a signal ignored
    at its entry, so make's recipe would never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """`make run` on the tiny configuration (training made long: 3,000 steps a run, so that the Ctrl-C lands in
    training), its process group sent SIGINT as a terminal's Ctrl-C does as soon as a run has logged a step. The
    studies are left out of the report here (their plans still run): their runs would start before the sweep's and
    add minutes of CI before the signal without testing more (the tiny DAG's tests run them)."""
    project = make_scratch_project(tmp_path_factory.mktemp("interrupt") / "project")
    params = project / "params.yaml"
    text = params.read_text(encoding="utf-8")
    assert "\n  steps: 60" in text and text.count("in_report: true") == 3
    text = text.replace("\n  steps: 60", "\n  steps: 3000", 1).replace("in_report: true", "in_report: false")
    params.write_text(text, encoding="utf-8")
    output = project.parent / "make-run.txt"
    # this environment as make's venv, its install step taken as done (-o install): nothing is installed
    proc = subprocess.Popen(["make", "-o", "install", "run", f"VENV={VENV}", "CORES=2"], cwd=project,
                            env=env_for(project), stdout=output.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    deadline = time.monotonic() + 600
    try:
        while not training_logs(project, 3000, "sweep"):
            assert proc.poll() is None, f"make run ended (rc {proc.returncode}) before training:\n{output.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no training step logged within 600 s"
            time.sleep(0.2)
        before = output.stat().st_size
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = output.read_bytes()[before:].decode("utf-8", "replace")
    return project, proc.returncode, said, output.read_text(encoding="utf-8", errors="replace")


def test_ctrl_c_on_make_run_says_in_one_line_what_is_kept_and_how_to_resume(interrupted):
    project, status, said, whole = interrupted
    # make stops by the SIGINT itself (a shell shows status 130), adding no "make: *** ... Error" of its own
    assert status == -signal.SIGINT, (status, whole[-3000:])
    for noise in ("Traceback", "Error", "error:", "make: ***", "Terminating processes", "Exception"):
        assert noise not in said, (noise, said)
    lines = [line for line in said.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and said.rstrip().endswith(lines[0]), said
    line = lines[0]
    assert line.startswith("blocklab: interrupted; kept ") and line.endswith("resume with `make run` (or `snakemake --cores N`)")
    # every run it names has its checkpoint at the step it names, and its own line is in its train.log
    from blocklab.training.train import read_checkpoint

    named = re.findall(r"(data/\S+) at step (\d+) of 3000", line)
    assert named, line
    for run, step in named:
        assert read_checkpoint(project / run / "checkpoint.pt")["step"] == int(step)
        assert f"interrupted; its checkpoint at step {step} of 3000 is kept" in (project / run / "train.log").read_text()
    assert line == kept_line(project)
    # and at its start, once, its ETA, the training left among its parts, from this machine measured then
    etas = [line for line in whole.splitlines() if re.match(r"blocklab: about \d+:\d\d:\d\d on \d+ lane", line)]
    assert len(etas) == 1 and re.search(r"training \d+:\d\d:\d\d \(\d+ training run\(s\) left, [\d,]+ steps at \S+ s a "
                                        r"step", etas[0]), etas


def test_under_dvc_repro_the_line_names_dvc_repro_and_what_dvcs_own_error_line_means(interrupted, monkeypatch):
    """`dvc repro` runs the pipeline as its stage's command, with DVC_STAGE set, and prints a line of its own after a
    stage that did not finish: the one line names `dvc repro` as the resume command and says what DVC's line means."""
    project = interrupted[0]
    monkeypatch.delenv("DVC_STAGE", raising=False)
    plain = kept_line(project)
    monkeypatch.setenv("DVC_STAGE", "pipeline")
    under_dvc = kept_line(project)
    assert plain.endswith("resume with `make run` (or `snakemake --cores N`)"), plain
    assert under_dvc.endswith("resume with `dvc repro` (DVC's ERROR line next says only that the stage did not finish: "
                              "dvc.lock is unchanged)"), under_dvc
    assert under_dvc.split("; resume with")[0] == plain.split("; resume with")[0]  # the same runs and checkpoints


def test_restart_schedules_the_runs_with_a_checkpoint_first(interrupted):
    project = interrupted[0]
    resumed = {str(c.parent.relative_to(project)) for c in (project / "data").glob("**/runs/**/checkpoint.pt")}
    priorities = dry_run_priorities(project)
    assert resumed and resumed <= set(priorities), (resumed, priorities)
    assert all(priorities[run] == RESUME_PRIORITY for run in resumed), priorities
    fresh = [p for run, p in priorities.items() if run not in resumed]
    assert fresh and max(fresh) < RESUME_PRIORITY, priorities


def test_resume_first_is_the_priority_of_a_job_whose_checkpoint_is_on_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    priority = resume_first("runs/{norm}-s{seed}/checkpoint.pt")
    assert priority({"norm": "pre", "seed": "0"}) == 0
    (tmp_path / "runs" / "pre-s0").mkdir(parents=True)
    (tmp_path / "runs" / "pre-s0" / "checkpoint.pt").write_bytes(b"")
    assert priority({"norm": "pre", "seed": "0"}) == RESUME_PRIORITY
    assert priority({"norm": "post", "seed": "0"}) == 0
    group = resume_first("runs/{norm}-s0/checkpoint.pt", "runs/{norm}-s1/checkpoint.pt")  # a batched job: any run
    assert group({"norm": "pre"}) == RESUME_PRIORITY and group({"norm": "post"}) == 0


def test_every_lab_job_appends_what_it_prints_to_its_log():
    """workflow/rules/lab.smk's jobs log like the pipeline's rule families: a `log:` each, appended to (tee -ia); a
    run's train.log beside its files, appended to and not declared as Snakemake's `log:` (Snakemake deletes a declared
    log before it reruns the job, and a resumed run's log keeps its interrupted steps)."""
    text = (Path(__file__).resolve().parents[1] / "workflow" / "rules" / "lab.smk").read_text(encoding="utf-8")
    rules = re.split(r"^rule ", text, flags=re.M)[1:]
    assert {r.split(":")[0] for r in rules} == {"lab_all", "lab_run", "lab_gradnorm", "lab_report"}
    for rule in rules:
        name = rule.split(":")[0]
        if "shell:" not in rule:
            continue
        if name == "lab_run":
            assert "log:" not in rule, "a run's train.log is not Snakemake's log: a rerun would delete it"
            assert rule.rstrip().endswith('| tee -ia runs/w{wildcards.warmup}-s{wildcards.seed}/train.log >&2"'), name
            continue
        assert re.search(r"^    log:\n\s+\"[^\"]+\.log\"", rule, re.M), f"rule {name} has no log"
        assert rule.rstrip().endswith('| tee -ia {log} >&2"'), f"rule {name} does not append to its log"


def test_chromium_runs_without_its_sandbox_only_as_root():
    from blocklab.reporting import browser

    assert "--no-sandbox" not in browser.FLAGS
    assert browser.sandbox_flags(uid=0) == ["--no-sandbox"]
    assert browser.sandbox_flags(uid=1000) == []


KILLED_RENDER = r"""
import os, signal, sys
from pathlib import Path
import papermill
from blocklab.reporting import report

def execute_notebook(notebook, output_path, **kwargs):  # papermill has written part of the executed notebook: SIGKILL
    Path(output_path).write_text('{"cells": [', encoding="utf-8")
    os.kill(os.getpid(), signal.SIGKILL)

papermill.execute_notebook = execute_notebook
report.check_table = lambda path: None
report.run_notebook("params.yaml", "analysis.ipynb", "reports/analysis.ipynb", "reports/analysis.html", "figs")
"""


def test_a_render_killed_by_sigkill_leaves_nothing_in_reports(tmp_path):
    """papermill writes the executed notebook for minutes: not beside the report (a SIGKILL left it there, and DVC
    recorded it with reports/) but in a scratch folder of the system's temporary directory."""
    from blocklab.pipeline import FIGURES

    shutil.copy(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", tmp_path / "params.yaml")
    (tmp_path / "analysis.ipynb").write_text("{}", encoding="utf-8")
    for source in {s for sources in FIGURES.values() for s in sources}:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_text("x\n", encoding="utf-8")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-c", KILLED_RENDER], cwd=tmp_path, capture_output=True, text=True,
                          env={**env_for(ROOT), "TMPDIR": str(scratch)})
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert not any((tmp_path / "reports").rglob("*")), sorted((tmp_path / "reports").rglob("*"))
    # what the kill left is in the temporary directory, nowhere else (beside the kernel's IPC socket folder)
    left = sorted(p for p in scratch.rglob("*") if not p.name.startswith("blocklab-kernel-")
                  and not any(q.name.startswith("blocklab-kernel-") for q in p.parents))
    assert left and left[0].name.startswith("blocklab-render-"), left


def test_temporary_files_a_kill_left_are_never_recorded_and_removed_at_the_next_start(tmp_path, monkeypatch):
    import pathspec

    from blocklab.io import TEMP_NAME, atomic_path
    from blocklab.pipeline import hold_run_lock

    monkeypatch.chdir(tmp_path)
    names = []
    for final in ("reports/analysis.ipynb", "figs/loss_curves.png", "data/sweep/summary.csv", "data/sweep/runs/x/checkpoint.pt"):
        with pytest.raises(RuntimeError), atomic_path(final) as tmp:
            names.append(tmp)
            raise RuntimeError  # a failed write removes its temporary file; a SIGKILL would not: make one by hand
        tmp.write_bytes(b"half")
        os.utime(tmp, (time.time() - 3600,) * 2)
    fresh = Path("data/sweep/.losses.csv.abcd1234.tmp.csv")  # a write in progress, by a command started by hand
    fresh.write_bytes(b"")
    assert all(TEMP_NAME.match(n.name) for n in [*names, fresh])
    # DVC never records one with the directory it tracks
    ignored = pathspec.PathSpec.from_lines("gitignore", (ROOT / ".dvcignore").read_text().splitlines())
    assert all(ignored.match_file(str(n)) for n in names)
    assert not ignored.match_file("reports/analysis.ipynb") and not ignored.match_file("data/sweep/summary.csv")
    # the next start, no run of the directory alive, removes them (not the fresh one, nor anything else)
    Path("reports/analysis.html").write_text("kept")
    said = []
    hold_run_lock(log=said.append)
    assert not any(n.exists() for n in names) and fresh.exists() and Path("reports/analysis.html").exists()
    assert said and f"removed {len(names)} temporary file(s)" in said[-1], said


def test_pipeline_eta_counts_the_training_left_at_the_measured_step_cost(tmp_path):
    """Two finished sweep runs measured here (4 s and 6 s for 2 steps: 2.5 s a step, the median), one resumed from
    its checkpoint (its log at step 1 of 2), two not started: 1 + 2 + 2 = 5 steps on 2 lanes."""
    import json

    from blocklab.params_file import load_params
    from blocklab.status import eta_line, pipeline_eta

    config = load_params(ROOT / "configs" / "tiny.yaml")
    config["sweep"]["steps"] = 2
    runs = tmp_path / "data" / "sweep" / "runs"
    targets = [f"data/sweep/runs/r{i}/meta.json" for i in range(5)]
    for i, seconds in ((0, 4.0), (1, 6.0)):
        (runs / f"r{i}").mkdir(parents=True)
        (runs / f"r{i}" / "meta.json").write_text(json.dumps({"wall_time_s": seconds, "loss_steps": 2}))
    (runs / "r2").mkdir()
    (runs / "r2" / "checkpoint.pt").write_bytes(b"")
    (runs / "r2" / "train.log").write_text("x r2: step 1/2 loss 4.1 lr 1e-3 2.000 s/step ETA 0:00:02\n")
    eta = pipeline_eta(targets, config, cores=2, root=tmp_path)
    assert (eta["runs"], eta["steps"], eta["lanes"], eta["step_s"]) == (3, 5, 2, 2.5)
    assert eta["seconds"] == 5 * 2.5 / 2
    assert "3 training run(s) left, 5 steps on 2 lane(s): about 0:00:06 of training at 2.5 s a step" in eta_line(eta)
    # nothing measured here yet: the recorded default run, scaled by the FLOPs of a step (the default: x 1)
    fresh = pipeline_eta(targets, load_params(ROOT / "params.yaml"), cores=2, root=tmp_path / "fresh")
    assert fresh["runs"] == 5 and "recorded default run" in fresh["basis"] and "x 1," in fresh["basis"]
