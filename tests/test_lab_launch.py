"""`blocklab lab` as a user lives with it: from any folder, the cost said first, progress, Ctrl-C and resume."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from blocklab.lab import launch
from blocklab.lab.spec import Setup, Spec, Block

ROOT = Path(__file__).resolve().parents[1]


def _spec(steps=100, seeds=(0, 1)) -> Spec:
    setup = Setup(n_layers=2, d_model=16, n_heads=2, ffn_ratio=4.0, vocab_size=11, seq_len=8, batch_size=4, lr=1e-3,
                  steps=steps, warmups=(0,), seeds=seeds, checkpoint_every=10)
    return Spec(Block("builtin", "pre"), "tiny", setup, "0" * 64)


def test_the_whole_labs_eta_comes_from_the_runs_measured_steps(tmp_path):
    spec = _spec()
    (tmp_path / "runs" / "w0-s0").mkdir(parents=True)
    (tmp_path / "runs" / "w0-s0" / "meta.json").write_text("{}")
    (tmp_path / "runs" / "w0-s1").mkdir()
    (tmp_path / "runs" / "w0-s1" / "train.log").write_text(
        "12:00:00 pre w0-s1: step 10/100 loss 2.0 lr 1.00e-03 0.900 s/step ETA 0:01:21\n"
        "12:00:10 pre w0-s1: step 40/100 loss 1.0 lr 1.00e-03 0.500 s/step ETA 0:00:30\n")
    line = launch.lab_line(spec, tmp_path, per_step=9.0, start_s=0.0, cores=2, planned={}, ages={})
    # 60 steps left at the run's own 0.5 s/step (not the timed 9 s): 30 s
    assert "1 of 2 runs finished; w0-s1 at step 40/100 (0.5 s/step)" in line and "≈ 0:00:30" in line, line
    # before any run has measured its steps: the timed ones; four runs of 3 + 100 x 0.5 = 53 s on two lanes (106 s
    # each), the gradient at init's 3 s start-up on one of them (109 s), then the report's 3 s: 112 s
    line = launch.lab_line(_spec(seeds=(0, 1, 2, 3)), tmp_path / "none", per_step=0.5, start_s=3.0, cores=2, planned={},
                           ages={})
    assert "0 of 4 runs finished" in line and "≈ 0:01:52" in line, line
    # two of them started 2 s ago and the gradient at init 5 s ago (no step logged yet): 1 s of their start-ups left
    # and none of the gradient's: lanes [51 + 53, 51 + 53 + 0], then the report's 3 s
    line = launch.lab_line(_spec(seeds=(0, 1, 2, 3)), tmp_path / "none", per_step=0.5, start_s=3.0, cores=2, planned={},
                           ages={"w0-s0": 2.0, "w0-s1": 2.0, "gradnorm": 5.0})
    assert "≈ 0:01:47" in line, line
    # every run finished, the report running for 1 s: 2 s left
    for name in ("w0-s0", "w0-s1"):
        (tmp_path / "runs" / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / name / "meta.json").write_text("{}")
    (tmp_path / "gradnorm.csv").write_text("")
    assert "≈ 0:00:02" in launch.lab_line(spec, tmp_path, 0.5, 3.0, 2, {}, ages={"report": 1.0})


def test_the_cost_said_first_counts_only_the_steps_left(tmp_path):
    spec = _spec(steps=100, seeds=(0, 1, 2))
    (tmp_path / "runs" / "w0-s0").mkdir(parents=True)
    (tmp_path / "runs" / "w0-s0" / "meta.json").write_text("{}")
    said, seconds = launch.estimate(spec, tmp_path, per_step=0.25, job_s=2.0, cores=1, timed=3)
    # two runs of 100 steps at 0.25 s, one at a time, four jobs' start-ups (two runs, the gradient, the report) and
    # Snakemake's (SNAKEMAKE_START of a job's)
    assert "2 run(s) to train, 200 steps at 0.25 s/step" in said
    assert seconds == pytest.approx(200 * 0.25 + 4 * 2.0 + launch.SNAKEMAKE_START * 2.0)
    assert f"cost ≈ {launch.clock(seconds)}" in said and "≈ 2 s start-up a job" in said, said
    (tmp_path / "runs" / "w0-s1").mkdir()
    (tmp_path / "runs" / "w0-s2").mkdir()
    for name in ("w0-s1", "w0-s2"):
        (tmp_path / "runs" / name / "meta.json").write_text("{}")
    assert "every run is finished" in launch.estimate(spec, tmp_path, 0.25, 2.0, 1, 3)[0]


def test_the_workflows_time_is_its_jobs_on_the_lanes_then_the_report():
    """Synthetic timings: the jobs go longest first to the lane that frees first; steps side by side on a loaded
    machine take each process's share of the cores; Snakemake's start and the report come before and after."""
    assert launch.makespan([5, 5, 5], 2) == 10 and launch.makespan([9, 5, 4], 2) == 9 and launch.makespan([], 2) == 0
    assert launch.makespan([3, 3], 1) == 6
    assert launch.side_by_side(cores=2, lanes=2, load=0.0) == 1.0  # an idle machine: each job has its core
    # two cores already running two busy processes (load 3: them and this command): one job gets 2/3 of a core, two
    # side by side 1/2 each
    assert launch.side_by_side(cores=2, lanes=2, load=3.0) == pytest.approx((2 / 3) / (1 / 2))
    assert launch.side_by_side(cores=2, lanes=1, load=3.0) == 1.0
    # two runs of 10 steps at 1 s and the gradient at init, 2 s start-up each, on two idle cores: Snakemake's start,
    # the lanes [12, 12 + 2], the report 2
    snakemake = launch.SNAKEMAKE_START * 2.0
    assert launch.workflow_seconds([10, 10], 1.0, 2.0, cores=2) == pytest.approx(snakemake + 14 + 2)
    # the same at load 3: the steps take 4/3 as long side by side
    assert launch.workflow_seconds([10, 10], 1.0, 2.0, cores=2, load=3.0) == pytest.approx(snakemake + 2 + 40 / 3 + 2 + 2)
    assert launch.workflow_seconds([10], 1.0, 2.0, cores=2, started=True, gradnorm=False) == 12 + 2


def test_a_finished_workflow_gives_back_the_start_up_its_jobs_took():
    """``job_s_from`` inverts ``workflow_seconds`` (the start-up of each rate after the first under --lr-sweep)."""
    for steps, per_step, job_s, cores, load in (([12, 12], 0.02, 9.0, 2, 3.0), ([400, 400], 1.5, 12.0, 2, 0.0),
                                                ([100], 0.5, 3.0, 1, 1.0)):
        real = launch.workflow_seconds(steps, per_step, job_s, cores, load)
        assert launch.job_s_from(real, steps, per_step, cores, load) == pytest.approx(job_s, rel=1e-6)
    assert launch.job_s_from(1.0, [100], 0.5, 1) == 0.0  # the steps alone took longer: no start-up to read


def test_a_runs_eta_follows_its_recent_steps_not_its_average_since_it_began():
    """Synthetic marks: 0.1 s a step for 100 s, then the machine three times as loaded for 60 s; the average since the
    run began would say 0.13 s (an ETA 2.25 times too short), the window says 0.3 s."""
    from blocklab.training.train import recent_seconds_per_step

    marks = [(t, int(t / 0.1)) for t in range(0, 101, 10)] + [(100 + t, 1000 + int(t / 0.3)) for t in range(10, 61, 10)]
    assert marks[-1][0] / marks[-1][1] == pytest.approx(160 / 1200)  # the average since the start
    assert recent_seconds_per_step(marks, window_s=60) == pytest.approx(0.3, rel=0.01)
    assert recent_seconds_per_step(marks, window_s=1e9) == pytest.approx(160 / 1200, rel=0.01)
    # a line after a long pause has the mark before it, whatever the window: never a rate over no steps
    assert recent_seconds_per_step([(0, 0), (100, 10)], window_s=5) == 10.0
    assert recent_seconds_per_step([(0, 4), (1, 4)], window_s=5) == 1.0  # no step since: one step's time, not a division by 0


def test_the_lr_sweeps_estimate_is_the_rates_left_at_what_the_rates_done_took():
    """Synthetic timings of ``lrsweep.sweep_left_s``: before any rate is done, each later rate is this one's workflow
    (the first rate's checks, which hold the imports and the start-up's timing, done once, are not counted); after,
    the mean of the workflows done plus this rate's checks."""
    from blocklab.lab.lrsweep import sweep_left_s

    assert sweep_left_s(1, 5, planned_s=20, this_rate_s=50, done_s=[], end_s=5) == (50 + 4 * 50 + 5, 50)
    assert sweep_left_s(3, 5, planned_s=1, this_rate_s=50, done_s=[70, 90], end_s=5) == (50 + 2 * 81 + 5, 81)
    assert sweep_left_s(5, 5, planned_s=1, this_rate_s=50, done_s=[1, 2, 3, 4], end_s=5) == (55, 3.5)


def test_a_lock_no_process_holds_is_removed_and_one_a_process_works_beside_is_kept(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("x")
    assert "removed the Snakemake lock" in launch.remove_stale_locks(tmp_path) and not list(locks.iterdir())
    (locks / "0.input.lock").write_text("x")
    beside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    try:
        for _ in range(100):  # until its working folder is readable
            if beside.pid in launch.workers(tmp_path):
                break
            time.sleep(0.05)
        assert launch.remove_stale_locks(tmp_path) is None and (locks / "0.input.lock").exists()
    finally:
        beside.kill()
        beside.wait()


def _start(command, cwd):
    """As a terminal starts a command in the foreground: its own process group, SIGINT at its default (a test run
    started in the background by a shell would pass SIGINT on ignored)."""
    return subprocess.Popen(command, cwd=cwd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "MPLBACKEND": "Agg"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _until(predicate, what, proc, limit=300):
    began = time.monotonic()
    while not predicate():
        assert proc.poll() is None, f"the lab ended before {what}:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() - began < limit, f"no {what} in {limit} s"
        time.sleep(0.05)


def _interrupt(proc, out, to_group):
    """SIGINT to the lab's process group (a terminal's Ctrl-C) or to `blocklab lab` alone; returns what it said."""
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any("lab-job" in " ".join(c.cmdline()) for c in children if c.is_running())
    os.killpg(proc.pid, signal.SIGINT) if to_group else os.kill(proc.pid, signal.SIGINT)
    said, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, said[-3000:]
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[c.cmdline() for c in alive]}"
    assert not launch.workers(out) and not list((out / ".snakemake" / "locks").glob("*"))
    return said


def _saved_step(out):
    from blocklab.training.train import read_checkpoint

    return int(read_checkpoint(out / "runs" / "w0-s0" / "checkpoint.pt")["step"])


def test_ctrl_c_keeps_the_current_step_ends_every_child_leaves_no_lock_and_the_command_said_resumes(tmp_path):
    """From a folder without params.yaml: a Ctrl-C to the process group, then (resumed) a SIGINT to `blocklab lab`
    alone; each time the running job saves the step it is at (not only its last periodic checkpoint), no child is
    left, no lock; the command the lab prints resumes from that step and finishes the run."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "lab_blocks.py", folder)
    out = tmp_path / "lab"
    command = [sys.executable, "-m", "blocklab.cli", "lab", "--module", "lab_blocks.py:SlowPreNormBlock", "--profile",
               "tiny", "--warmups", "0", "--out", str(out)]
    log = out / "runs" / "w0-s0" / "train.log"

    proc = _start(command, folder)
    _until(lambda: (out / "runs" / "w0-s0" / "checkpoint.pt").is_file(), "first checkpoint (step 5)", proc)
    said = _interrupt(proc, out, to_group=True)
    first = _saved_step(out)
    assert 5 <= first < 12
    assert f"w0-s0 at step {first} of 12" in said and "cost ≈" in said and "ETA of the whole lab" in said, said
    # the first line after the Ctrl-C says the lab stops as asked and how it resumes; after it, only the lab's own
    # last line: no Snakemake line (its "At least one job did not complete successfully" is in its log alone)
    stopped = said[said.index("blocklab lab: stopping as asked"):].splitlines()
    assert "resume with: " in stopped[0] and "did not complete successfully" not in said, said
    assert [line for line in stopped[1:] if line.strip()] == [next(l for l in stopped if "interrupted; kept" in l)], said
    assert f"interrupted; its checkpoint at step {first} of 12 is kept" in log.read_text()
    resume = re.search(r"resume with: (.+)", said)[1]
    assert "snakemake --cores" not in log.read_text() and resume in log.read_text()

    proc = _start(command, folder)
    _until(lambda: log.is_file() and f"resumed from checkpoint at step {first}" in log.read_text(), "resume", proc)
    _interrupt(proc, out, to_group=False)
    second = _saved_step(out)
    assert first <= second < 12

    done = subprocess.run(resume, shell=True, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    meta = __import__("json").loads((out / "runs" / "w0-s0" / "meta.json").read_text())
    assert meta["resumed_from_step"] == second
    assert [r["step"] for r in meta["resumes"]] == [first, second]  # every resume, not only the last
    # the rerun appends to train.log: the first attempt's interrupted line is still there
    assert f"interrupted; its checkpoint at step {first} of 12 is kept" in log.read_text()
    assert pd.read_csv(out / "runs" / "w0-s0" / "loss.csv")["step"].tolist() == list(range(1, 13))
    assert re.search(r"step 12/12 loss \S+ lr \S+ [\d.]+ s/step ETA", log.read_text())
    assert not (out / "runs" / "w0-s0" / "checkpoint.pt").exists()


def _ended(processes, limit=180):
    """Until every one of ``processes`` has ended; returns those still alive after ``limit`` seconds."""
    began = time.monotonic()
    while time.monotonic() - began < limit:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.2)
    return [p.cmdline() for p in alive]


def test_a_workflow_its_leash_is_stopping_is_waited_for_and_one_left_unled_is_named(tmp_path):
    """The pid file's process group, working in the lab's folder: waited for while its leash says it is stopping (its
    lab was killed: its jobs save their steps), refused by name with the kill that stops it while it runs unled."""
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], cwd=tmp_path,
                              start_new_session=True)
    try:
        _until(lambda: worker.pid in launch.workers(tmp_path), "the worker's folder", worker, limit=30)
        (tmp_path / launch.PID_FILE).write_text(f"{worker.pid}\n")
        said = launch.wait_for_orphans(tmp_path)
        assert said.startswith(f"blocklab lab: a workflow of this lab is still running in {tmp_path}, started by a "
                               f"`blocklab lab` that is gone: pid {worker.pid} (python") and \
            f"(process group {worker.pid}); wait for it to end" in said and f"`kill -INT -{worker.pid}`" in said, said
        (tmp_path / launch.PID_FILE).write_text(f"{worker.pid}\nstopping\n")
        locks = tmp_path / ".snakemake" / "locks"
        locks.mkdir(parents=True)
        (locks / "0.input.lock").write_text("x")  # as a leash killed mid-way would leave one
        assert launch.wait_for_orphans(tmp_path) is None and worker.poll() is not None
        assert not list(locks.iterdir())
    finally:
        worker.kill()
        worker.wait()
    assert launch.wait_for_orphans(tmp_path) is None, "a pid file whose group is gone is nobody's"


def test_a_killed_lab_stops_its_jobs_the_same_command_resumes_and_a_workflow_left_unled_is_named(tmp_path):
    """SIGKILL of `blocklab lab`: its job saves the step it is at and ends, with Snakemake, no lock and no pid file left
    (before: they trained on, detached, and the same command failed on Snakemake's LockException). A workflow whose
    lab and leash were both killed trains on: the same command then refuses in one line naming its processes and the
    `kill` that stops it keeping its step; after that kill the same command finishes, with the losses of a lab never
    interrupted."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "lab_blocks.py", folder)
    out = tmp_path / "lab"
    command = [sys.executable, "-m", "blocklab.cli", "lab", "--module", "lab_blocks.py:SlowPreNormBlock", "--profile",
               "tiny", "--warmups", "0", "--out", str(out)]
    log = out / "runs" / "w0-s0" / "train.log"
    env = {**os.environ, "MPLBACKEND": "Agg"}

    proc = _start(command, folder)
    _until(lambda: (out / "runs" / "w0-s0" / "checkpoint.pt").is_file(), "first checkpoint (step 5)", proc)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any("lab-job" in " ".join(c.cmdline()) for c in children if c.is_running())
    assert (out / launch.PID_FILE).is_file()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not _ended(children), "left running after the lab was killed"
    assert not launch.workers(out) and not list((out / ".snakemake" / "locks").glob("*"))
    assert not (out / launch.PID_FILE).exists()
    first = _saved_step(out)
    assert 5 <= first < 12 and f"interrupted; its checkpoint at step {first} of 12 is kept" in log.read_text()

    # the lab and its leash both killed (nothing a closed terminal does): Snakemake and its job train on, unled
    proc = _start(command, folder)
    _until(lambda: log.is_file() and f"resumed from checkpoint at step {first}" in log.read_text(), "resume", proc)
    leash = next(c for c in psutil.Process(proc.pid).children() if launch.PID_FILE in c.cmdline())
    unled = leash.children(recursive=True)
    jobs = [p for p in unled if "lab-job" in p.cmdline()]
    for job in jobs:  # held (SIGSTOP) while the same command starts: a run longer than the lab's own start-up
        job.suspend()
    os.kill(leash.pid, signal.SIGKILL)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)  # its output stays open: the unled workflow still writes to it
    assert jobs and all(p.is_running() for p in unled)
    refused = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, timeout=300)
    for job in jobs:
        job.resume()
    line = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 1 and f"a workflow of this lab is still running in {out}, started by a `blocklab " \
        "lab` that is gone: " in line, refused.stderr[-3000:]
    assert "(Snakemake)" in line and "(job lab-job run)" in line and f"`kill -INT -{leash.pid}`" in line, line
    assert "LockException" not in refused.stderr and "--unlock" not in refused.stderr
    subprocess.run(line.split("`kill")[1].split("`")[0].join(["kill", ""]), shell=True, check=True)
    assert not _ended(unled), "left running after the kill the lab named"
    proc.stdout.close()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "runs" / "w0-s0" / "meta.json").read_text())["resumed_from_step"] >= first
    assert not (out / launch.PID_FILE).exists()

    whole = tmp_path / "whole"  # the same lab, never interrupted
    done = subprocess.run([*command[:-1], str(whole)], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed, never = (pd.read_csv(o / "runs" / "w0-s0" / "loss.csv") for o in (out, whole))
    assert resumed["step"].tolist() == list(range(1, 13))
    pd.testing.assert_frame_equal(resumed, never)


def test_a_block_edited_after_a_kill_retrains_from_step_0_not_from_the_old_blocks_checkpoint(tmp_path):
    """Killed mid-run, the block's file edited, the same command: the old block's checkpoint is not resumed (moved
    aside), the run trains from step 0 and finishes."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "lab_blocks.py", folder)
    out = tmp_path / "lab"
    command = [sys.executable, "-m", "blocklab.cli", "lab", "--module", "lab_blocks.py:SlowPreNormBlock", "--profile",
               "tiny", "--warmups", "0", "--out", str(out)]
    proc = _start(command, folder)
    _until(lambda: (out / "runs" / "w0-s0" / "checkpoint.pt").is_file(), "first checkpoint (step 5)", proc)
    _interrupt(proc, out, to_group=True)
    assert _saved_step(out) >= 5
    text = (folder / "lab_blocks.py").read_text()
    line = "return self.proj(y.transpose(1, 2).reshape(b, t, d))"
    (folder / "lab_blocks.py").write_text(text.replace(line, line + " * 0.5", 1))  # the attention branch x 0.5
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "every run retrains from step 0" in done.stderr and "resuming" not in done.stderr
    log = (out / "runs" / "w0-s0" / "train.log").read_text()
    assert "moved aside" in log and "training starts over from step 0" in log
    meta = json.loads((out / "runs" / "w0-s0" / "meta.json").read_text())
    assert meta["resumed_from_step"] == 0
    assert pd.read_csv(out / "runs" / "w0-s0" / "loss.csv")["step"].tolist() == list(range(1, 13))


def test_a_second_lab_in_the_same_folder_says_another_lab_runs_there_with_its_pid(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "lab_blocks.py", folder)
    out = tmp_path / "lab"
    command = [sys.executable, "-m", "blocklab.cli", "lab", "--module", "lab_blocks.py:SlowPreNormBlock", "--profile",
               "tiny", "--warmups", "0", "--out", str(out)]
    proc = _start(command, folder)
    _until(lambda: (out / "runs" / "w0-s0" / "train.log").is_file(), "the first run", proc)
    second = subprocess.run(command, cwd=folder, capture_output=True, text=True,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    assert second.returncode == 1, second.stderr[-3000:]
    assert f"another `blocklab lab` is running in {out} (pid {proc.pid}," in second.stderr, second.stderr[-2000:]
    assert "LockException" not in second.stderr and "resume" not in second.stderr.lower().split("pid")[0]
    _interrupt(proc, out, to_group=True)


def test_a_depth_aware_block_gets_the_stacks_depth_unless_kwargs_gives_one(tmp_path):
    """DeepNorm's α = (2N)^¼ needs the stack's N: a block whose constructor (or config class) takes n_layers,
    num_layers or depth is given the profile's depth, and says so; --kwargs wins."""
    from blocklab.lab.spec import build_model, make_spec

    spec = make_spec(ROOT / "params.yaml", "tiny", module="blocklab.model.blocks:DecoderOnlyBlock",
                     kwargs={"norm_position": "deepnorm"})
    assert spec.setup.n_layers == 2 and spec.block.kwargs["n_layers"] == 2
    assert spec.read["depth"] == "n_layers=2 passed to the constructor (the stack's depth)"
    block = build_model(spec, 0).blocks[0].block
    assert block.attn.alpha == pytest.approx((2 * 2) ** 0.25)
    spec = make_spec(ROOT / "params.yaml", "tiny", module="blocklab.model.blocks:DecoderOnlyBlock",
                     kwargs={"norm_position": "deepnorm", "n_layers": 6})
    assert spec.block.kwargs["n_layers"] == 6 and "(from --kwargs)" in spec.read["depth"]
    spec = make_spec(ROOT / "params.yaml", "tiny", module=f"{ROOT / 'tests' / 'lab_blocks.py'}:TinyPreNormBlock")
    assert "n_layers" not in spec.block.kwargs and "depth" not in spec.read


def test_the_depth_is_passed_under_the_names_people_use_and_a_name_it_cannot_tell_is_said(tmp_path):
    """GPT-2's n_layer (nanoGPT's config field), num_hidden_layers and the rest get the stack's depth; an argument named
    like a depth that is none of them (n_blocks) is not passed, and the spec, the command line and the page say so."""
    from blocklab.lab.spec import DEPTH_NAMES, make_spec

    assert {"n_layer", "num_layers", "n_layers", "num_hidden_layers", "depth"} <= set(DEPTH_NAMES)
    spec = make_spec(ROOT / "params.yaml", "tiny", module=f"{ROOT / 'tests' / 'user_blocks.py'}:Block")
    assert spec.block.kwargs["n_layer"] == 2 and spec.read["depth"].startswith("n_layer=2 passed")
    (tmp_path / "depth_blocks.py").write_text(  # a module name of its own: the import is cached for the session
        "from torch import nn\n\n\nclass Scaled(nn.Module):\n"
        "    def __init__(self, d_model, num_hidden_layers=12, n_blocks=12):\n        super().__init__()\n"
        "        self.depth = (num_hidden_layers, n_blocks)\n        self.lin = nn.Linear(d_model, d_model)\n\n"
        "    def forward(self, h):\n        return h + self.lin(h) / self.depth[0]\n")
    spec = make_spec(ROOT / "params.yaml", "tiny", module=f"{tmp_path / 'depth_blocks.py'}:Scaled")
    assert spec.block.kwargs == {"num_hidden_layers": 2}
    assert spec.read["depth_not_passed"].startswith("n_blocks not passed") and '{"n_blocks": 2}' in \
        spec.read["depth_not_passed"]


def test_a_llama_style_block_ends_in_its_own_rmsnorm_and_a_layernorm_block_in_a_layernorm(tmp_path):
    from blocklab.lab.spec import build_model, make_spec
    from blocklab.model.layers import LayerNorm

    spec = make_spec(ROOT / "params.yaml", "tiny", module=f"{ROOT / 'tests' / 'user_blocks.py'}:FlatLlamaBlock")
    model = build_model(spec, 0)
    assert type(model.norm).__name__ == "RMSNorm" and type(model.norm).__module__ == "user_blocks"
    assert spec.read["final_norm_class"] == "RMSNorm"
    spec = make_spec(ROOT / "params.yaml", "tiny", module=f"{ROOT / 'tests' / 'lab_blocks.py'}:TinyPreNormBlock")
    assert isinstance(build_model(spec, 0).norm, LayerNorm) and "final_norm_class" not in spec.read


@pytest.mark.parametrize("layer, model_type", [
    ("transformers.models.llama.modeling_llama:LlamaDecoderLayer", "llama"),
    ("transformers.models.gpt2.modeling_gpt2:GPT2Block", "gpt2"),
])
def test_a_transformers_layer_class_is_built_inside_its_own_model_at_the_profiles_width(layer, model_type):
    from blocklab.lab.spec import build_model, check_model, make_spec

    spec = make_spec(ROOT / "params.yaml", "tiny", module=layer)
    assert spec.block.kind == "hf" and spec.block.source == model_type and f"--hf-config {model_type}" in \
        spec.read["how"]
    check_model(spec)
    model = build_model(spec, 0)
    layers = [m for m in model.modules() if type(m).__name__ == layer.rpartition(":")[2]]
    assert len(layers) == spec.setup.n_layers == 2
    assert model.model.get_input_embeddings().weight.shape[1] == spec.setup.d_model == 16


def test_the_lab_says_the_width_and_heads_it_builds_a_block_with(tmp_path):
    """tiny builds at width 16 with 2 heads: the page's "built as" and a constructor's failure say so (not 64, 4)."""
    from blocklab.model_config import ConfigError
    from blocklab.lab.spec import make_spec

    (tmp_path / "blocks.py").write_text(
        "from dataclasses import dataclass\nfrom torch import nn\n\n\n@dataclass\nclass Cfg:\n"
        "    hidden_size: int = 64\n    n_heads: int = 4\n\n\nclass Broken(nn.Module):\n"
        "    def __init__(self, config: Cfg):\n        raise RuntimeError('no')\n")
    spec = make_spec(ROOT / "params.yaml", "tiny", module=f"{ROOT / 'tests' / 'lab_blocks.py'}:TinyPreNormBlock")
    assert spec.read["how"] == "TinyPreNormBlock(d_model=..., n_heads=2)"
    with pytest.raises(ConfigError, match=r"Broken\(Cfg\(hidden_size=16, n_heads=2\)\) failed"):
        make_spec(ROOT / "params.yaml", "tiny", module=f"{tmp_path / 'blocks.py'}:Broken")


def test_the_labs_figure_marks_diverged_runs_labels_chance_and_keeps_identical_seeds_apart(tmp_path, monkeypatch):
    from blocklab.lab import report

    spec = _spec(steps=6, seeds=(0, 1, 2))
    spec = Spec(Block("module", "x:Mine"), "tiny", Setup(**{**spec.setup.__dict__, "warmups": (0, 3)}), "0" * 64)
    flat = [4.5, 4.4, 4.45, 4.41, 4.42, 4.40]  # seeds 0 and 1 identical, within a factor 10: a linear axis
    curves = pd.DataFrame([{"warmup": w, "seed": s, "step": i + 1, "loss": v}
                           for w in (0, 3) for s in (0, 1) for i, v in enumerate(flat)]
                          + [{"warmup": 0, "seed": 2, "step": 1, "loss": 4.5}]  # diverged at step 2
                          + [{"warmup": 3, "seed": 2, "step": i + 1, "loss": 4.5 * 10 ** -i} for i in range(6)])
    grads = pd.DataFrame([{"block_kind": k, "seed": 0, "block": b, "grad_norm": g} for k in ("Mine", "pre")
                          for b, g in ((1, 1.0), (2, 1.5))])
    figures = []
    monkeypatch.setattr(report.plt, "close", figures.append)
    report.loss_figure(spec, curves, grads, None, tmp_path / "lab.png", diverged={(0, 2)})
    first, second, grad = figures[0].axes
    assert first.get_yscale() == "linear" and second.get_yscale() == "log" and grad.get_yscale() == "linear"
    labels = [line.get_label() for line in first.get_lines()]
    assert "chance, ln 11 = 2.40" in labels and "diverged (loss not finite after this step)" in labels
    assert any(t.get_text() == "seed 2 diverged at step 2" for t in first.texts)
    mine = {line.get_label(): line for line in first.get_lines() if "this lab" in line.get_label()}
    assert mine["Mine seed 0 (this lab)"].get_linestyle() != mine["Mine seed 1 (this lab)"].get_linestyle()
    assert all(float(t).is_integer() for t in grad.get_xticks())


def test_the_quick_profiles_figure_draws_the_recorded_pre_and_post_runs_and_a_block_identical_to_one_shows(
        tmp_path, monkeypatch):
    """The quick profile's setup (batch 16, 400 steps) is recorded in records/sensitivity/choices (1,200 steps, seed
    0): their first 400 steps are drawn as labelled references; a user's block whose losses are the recorded pre-norm
    run's is drawn too, as a thin line inside pre-norm's wide pale band, above it."""
    from blocklab.lab import report
    from blocklab.lab.spec import make_spec

    spec = make_spec(ROOT / "params.yaml", "quick", "pre")
    reference, note = report.recorded_reference(spec)
    assert "records/sensitivity/choices" in note and "their first 400 steps" in note, note
    assert set(reference.groupby(["norm", "seed"])["step"].max().items()) == {(("pre", 0), 400), (("post", 0), 400)}
    recorded = pd.read_csv(ROOT / "records" / "sensitivity" / "choices" / "losses.csv")
    recorded = recorded[(recorded["setting"] == "learned-b16-L24-lr0.001-fp32") & (recorded["run"] == "pre-w0-s0")]
    pre = reference[reference["norm"] == "pre"]
    assert pre["loss"].tolist() == recorded["loss"].head(400).tolist()

    mine = Spec(Block("module", "x:Mine"), "quick", spec.setup, "0" * 64)
    curves = pre[["step", "loss"]].assign(warmup=0, seed=0)
    curves = pd.concat([curves, curves.assign(seed=1)], ignore_index=True)
    grads = pd.DataFrame([{"block_kind": k, "seed": 0, "block": b, "grad_norm": 1.0} for k in ("Mine", "pre")
                          for b in (1, 2)])
    figures = []
    monkeypatch.setattr(report.plt, "close", figures.append)
    report.loss_figure(mine, curves, grads, reference, tmp_path / "lab.png")
    lines = {line.get_label(): line for line in figures[0].axes[0].get_lines()}
    assert {"pre-norm (recorded, seed 0)", "post-norm (recorded, seed 0)", "Mine seed 0 (this lab)"} <= set(lines)
    band, own = lines["pre-norm (recorded, seed 0)"], lines["Mine seed 0 (this lab)"]
    assert list(own.get_ydata()) == list(band.get_ydata())  # the same curve, drawn twice
    assert band.get_linewidth() >= 3 * own.get_linewidth() and band.get_alpha() < 1 and own.get_zorder() > band.get_zorder()
    # the gradient at init alike: the built-in's wide and pale under the block's own, equal values both seen
    grad = {line.get_label(): line for line in figures[0].axes[-1].get_lines()}
    assert grad["pre (mean of 1)"].get_linewidth() >= 3 * grad["Mine (mean of 1)"].get_linewidth()
    assert grad["Mine (mean of 1)"].get_zorder() > grad["pre (mean of 1)"].get_zorder()
    # a profile whose setup nothing recorded has none, and says why
    assert report.recorded_reference(make_spec(ROOT / "params.yaml", "tiny", "pre"))[0] is None


@pytest.mark.parametrize("losses", [[4.1, 4.2, 4.35, 4.4, 4.3], [0.0004, 0.002, 0.03, 1.2, 4.2]])
def test_the_lr_figures_y_axis_has_tick_labels_at_chance_alone_and_across_decades(losses):
    """A block at chance at every rate (4.1 to 4.4: on a log axis no power of ten, nor 2, 3 or 5 times one, is in
    view) and one across four decades: the drawn y axis has at least two labelled ticks, the x axis its rates."""
    from blocklab.figures.lab import lr_sensitivity_figure
    from blocklab.lab.lrsweep import LRS, table

    runs = pd.DataFrame([{"block": "Mine", "lr": lr, "seed": seed, "final_loss": loss * (1 + 0.01 * seed),
                          "diverged": False} for lr, loss in zip(LRS, losses) for seed in (0, 1)])
    fig = lr_sensitivity_figure(runs, table(runs, math.log(64)), ["Mine"], "en", 64, lrs=LRS)
    fig.canvas.draw()
    ax = fig.axes[0]
    shown = [t.get_text() for t in [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)] if t.get_text()
             and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    assert len(shown) >= 2, (ax.get_yscale(), ax.get_ylim(), shown)
    assert {"0.0001", "0.001", "0.01"} <= {t.get_text() for t in ax.get_xticklabels()}
    assert ax.get_ylabel() == ("final loss" if max(losses) / min(losses) < 10 else "final loss (log scale)")
    __import__("matplotlib.pyplot").pyplot.close(fig)


def test_a_dry_run_from_another_folder_plans_and_prices_without_creating_the_output_folder(tmp_path):
    out = tmp_path / "lab"
    done = subprocess.run([sys.executable, "-m", "blocklab.cli", "lab", "--module",
                           f"{ROOT / 'tests' / 'lab_blocks.py'}:TinyPreNormBlock", "--profile", "tiny", "--out",
                           str(out), "--dry-run"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 run(s) to train, 24 steps at" in done.stderr and "lab_run" in done.stdout + done.stderr
    assert not out.exists() and not (tmp_path / "params.yaml").exists()


def test_a_recorded_study_jobs_ctrl_c_names_the_command_that_resumes_it_and_that_command_resumes(tmp_path):
    """`lab-job lr-run` (a run of the recorded LR study, started by scripts/train_lab_lr_sweep.sh, not by Snakemake): a SIGINT at
    step 3 keeps step 3 and says to resume with the same command or the study's script (never `snakemake` or `dvc
    repro`, which do not run it); the same command then resumes from step 3 and finishes."""
    out = tmp_path / "pre-lr0.001-w0-s0"
    command = ["-m", "blocklab.cli", "lab-job", "lr-run", "--norm", "pre", "--lr", "0.001", "--seed", "0", "--profile",
               "tiny", "--out-dir", str(out), "--params", str(ROOT / "params.yaml")]
    # the step function sends the signal itself after step 3, so the test does not race the 12 steps' 0.3 s
    interrupt_at_3 = ("import os, signal, sys, runpy; import blocklab.training.train as t\n"
                      "made = t._make_step\n"
                      "def make(*a, **k):\n"
                      "    step = made(*a, **k)\n"
                      "    def once(batch, number=0):\n"
                      "        loss = step(batch, number)\n"
                      "        if number == 3: os.kill(os.getpid(), signal.SIGINT)\n"
                      "        return loss\n"
                      "    return once\n"
                      "t._make_step = make\n"
                      "sys.argv = ['blocklab'] + sys.argv[3:]; runpy.run_module('blocklab.cli', run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("BLOCKLAB_RESUME", "BLOCKLAB_INTERRUPT_SAID_BY")}
    first = subprocess.run([sys.executable, "-c", interrupt_at_3, *command], cwd=tmp_path, env=env, text=True,
                           capture_output=True, timeout=300)
    assert first.returncode == 130, first.stderr[-3000:]
    line = next(x for x in first.stderr.splitlines() if "interrupted;" in x)
    assert "its checkpoint at step 3 of 12 is kept" in line, line
    assert line.endswith("resume with the same command (or `bash scripts/train_lab_lr_sweep.sh`, which skips finished runs)")
    assert "snakemake" not in line and "dvc repro" not in line
    assert not (out / "meta.json").exists()  # not taken as finished

    again = subprocess.run([sys.executable, *command], cwd=tmp_path, env=env, text=True, capture_output=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["resumed_from_step"] == 3 and meta["status"] == "finished"
    assert re.search(r"step 12/12 loss [0-9.]+ lr .* s/step ETA", again.stderr), again.stderr[-2000:]  # its progress


def test_a_finished_labs_real_start_up_calibrates_the_next_labs_estimate(tmp_path, monkeypatch):
    """The fresh Pythons miss part of a real job's start-up, and the report job draws (on 2 idle cores a tiny lab
    took 9.7 s where they gave 7.0 s, its last 4.7 s after its runs where the ETA said 2.0 s): a finished lab keeps,
    per machine, the ratios to their measurement of the start-up read back from its real time and of its report's
    tail, and the next lab's cost line and ETA scale its own measurement by them and say so; none kept, a damaged
    file or an impossible ratio: the measurement alone."""
    monkeypatch.setenv("BLOCKLAB_CACHE", str(tmp_path))
    # none kept: the start-up as measured, the report's tail at the ratio measured on one machine, said so
    prior = launch.calibrated(2.0)
    assert prior == (2.0, None, pytest.approx(2.0 * launch.REPORT_RATIO), launch.REPORT_PRIOR)
    said, _ = launch.estimate(_spec(), tmp_path / "lab", 0.25, 2.0, 1, 3, report_s=prior[2], report_basis=prior[3])
    assert f"≈ {2.0 * launch.REPORT_RATIO:.0f} s for the report (x {launch.REPORT_RATIO:.2f} the start-up" in said
    assert "no lab has finished here yet" in said
    launch.record_calibration(2.0, 3.0, 5.0)
    seconds, basis, report, report_basis = launch.calibrated(1.5)
    assert seconds == pytest.approx(2.25) and report == pytest.approx(3.75) and report_basis is None
    assert "x 1.50" in basis and "(1.5 s)" in basis
    said, total = launch.estimate(_spec(), tmp_path / "lab", 0.25, seconds, 1, 3, job_basis=basis, report_s=report)
    assert "x 1.50: this machine's last finished lab" in said and "≈ 4 s for the report" in said, said
    # two runs of 100 steps and the gradient at init, one at a time, each with its start-up; Snakemake's; the report's
    assert total == pytest.approx(200 * 0.25 + 3 * seconds + launch.SNAKEMAKE_START * seconds + report)
    # after the runs, the ETA is the report's tail less what the report job has run
    done = tmp_path / "lab" / "runs"
    for seed in (0, 1):
        (done / f"w0-s{seed}").mkdir(parents=True)
        (done / f"w0-s{seed}" / "meta.json").write_text("{}")
    (tmp_path / "lab" / "gradnorm.csv").write_text("")
    assert "≈ 0:00:03" in launch.lab_line(_spec(), tmp_path / "lab", 0.25, seconds, 1, {}, ages={"report": 0.5},
                                          report_s=report)
    assert launch.job_s_from(launch.workflow_seconds([100], 0.25, 2.0, 1, report_s=6.0), [100], 0.25, 1,
                             report_s=6.0) == pytest.approx(2.0, abs=1e-6)
    (tmp_path / launch.CALIBRATION).write_text("{not json", encoding="utf-8")
    assert launch.calibrated(1.5)[:2] == (1.5, None) and launch.calibrated(1.5)[3] == launch.REPORT_PRIOR
    launch.record_calibration(2.0, 200.0)  # a ratio of 100: no workflow gives it
    assert launch.calibrated(1.5)[:2] == (1.5, None) and launch.calibrated(1.5)[3] == launch.REPORT_PRIOR
