"""How `blocklab lab` runs its Snakemake workflow (``workflow/rules/lab.smk``) and lives with its user.

- **Cost first**: before anything trains, the lab says what it will cost on this machine, from a few steps of the
  built stack timed here (``run.time_steps``, one thread as each job trains) and a job's start-up timed here
  (``JobStart``), laid out on the lanes as Snakemake runs the jobs (``workflow_seconds``).
- **Progress**: each run writes a line at least every 10 s (step, loss, s/step over its last minute, its ETA) to the
  terminal and to ``runs/<run>/train.log``; this process adds one line for the whole lab (runs finished, the running
  ones, the ETA of the whole lab from their measured steps) every minute and whenever a run finishes.
- **Ctrl-C** (to the terminal's process group or to this process alone, SIGINT or SIGTERM): Snakemake runs in a
  process group of its own, so the signal reaches its jobs exactly once, from here. The first line said is that the
  lab stops as asked, with the one command that resumes (the same command: finished runs are kept, checkpointed ones
  resume); from then on Snakemake's lines (its failure line among them) go to its log only, not to the terminal.
  Every running job finishes its step, saves it in its checkpoint and ends; Snakemake ends; a lock it left is removed;
  a last line says what was kept.
- **A killed lab** (SIGKILL, or SIGHUP when its terminal closes): its jobs do not train on out of sight. Between this
  process and Snakemake runs a small process (``LEASH``) that the kernel tells when this one dies (Linux's
  PR_SET_PDEATHSIG); it then stops the workflow as a Ctrl-C does (each job saves its step) and removes the locks and
  its pid file (``PID_FILE`` in the lab's folder). A rerun that finds that stop under way waits for it and resumes; one
  that finds a workflow still alive whose lab is gone (its leash killed too, or a lab older than the leash) refuses in
  one line naming its processes and how to stop it or wait for it, not Snakemake's LockException.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..training.train import INTERRUPT_ENV, RESUME_ENV

PROGRESS = re.compile(r"step (\d+)/(\d+) loss \S+ lr \S+ ([\d.]+) s/step")
LAB_LINE_EVERY_S = 60.0  # the whole lab's line; each run writes its own every 10 s (training.train._Progress)


def clock(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def start_up_s() -> float:
    """Seconds since this process started (Python, blocklab's command line): what it spent before its first line."""
    import psutil  # installed with Snakemake, which requires it

    return max(0.0, time.time() - psutil.Process().create_time())


# What a lab job does before its first step, in a fresh Python: the imports of `blocklab lab-job run` (torch, pandas, the
# training code) and an Adam optimizer (whose first construction imports torch's compiler stack). It prints when done.
JOB_START = """
import time
import torch, pandas, blocklab.cli, blocklab.lab.run
torch.optim.Adam([torch.zeros(1, requires_grad=True)])
print(time.time(), flush=True)
"""


class JobStart:
    """A job's start-up, measured: ``lanes`` fresh Pythons doing what a lab job does before its first step
    (``JOB_START``), started together now (as the jobs start side by side); ``seconds()`` waits for them and gives
    their mean. Falls back on this process's age where they cannot run."""

    def __init__(self, lanes: int = 1, python: str = sys.executable):
        self.began = time.time()
        self.procs = []
        for _ in range(max(1, lanes)):
            try:
                self.procs.append(subprocess.Popen([python, "-c", JOB_START], stdout=subprocess.PIPE,
                                                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True))
            except OSError:
                break
        self.found: float | None = None

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()

    def seconds(self, timeout_s: float = 300.0) -> float:
        if self.found is None:
            try:
                if not self.procs:
                    raise OSError
                ends = [float(proc.communicate(timeout=timeout_s)[0].split()[-1]) for proc in self.procs]
                self.found = max(0.0, sum(ends) / len(ends) - self.began)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                self.found = start_up_s()
            finally:
                self.close()
        return self.found


# The fresh Pythons of ``JobStart`` miss what a real job adds to its start-up (the shell and console script that start
# it, reading its spec and building its block, writing its files, Snakemake's own dispatch of each job, the report's
# drawing): on 2 idle cores a tiny lab took 9.7 s where they gave 7.0 s (2026-12-07, Intel Xeon). A finished lab reads
# the start-up its workflow really had back from its real time (``job_s_from``) and keeps its ratio to the fresh
# Pythons' measurement here, per machine; the next lab's estimate scales its own measurement by it.
CALIBRATION = "lab_job_start.json"


def _calibration_file() -> Path:
    root = os.environ.get("BLOCKLAB_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME")
                                                           or os.path.expanduser("~/.cache"), "blocklab")
    return Path(root) / CALIBRATION


def machine_key() -> str:
    import platform

    from ..provenance import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} cores, {platform.node()}"


# Where no lab has finished on a machine yet, its report's tail (its last run's end to its end: the report job imports
# and draws) in proportion to the fresh Pythons' start-up as on the one machine measured: 5.37 s against 2.75 s on 2
# idle cores of an Intel Xeon (family 6, model 167), 2026-12-07 (performance/measured/lab_estimates.csv, the tiny
# lab's cost line 0.73 of the real time without it). Drawing and importing are both single-core Python work, so the
# ratio, not the seconds, is carried over; a machine's first finished lab replaces it with its own.
REPORT_RATIO = 1.96
REPORT_PRIOR = (f"x {REPORT_RATIO:.2f} the start-up, as the report took on the one machine measured (a 2-core Intel "
                "Xeon): no lab has finished here yet")


def calibrated(measured_s: float) -> tuple[float, str | None, float, str | None]:
    """The start-up a job will take here: ``measured_s`` (the fresh Pythons) times this machine's ratio from its last
    finished lab, the words saying so, and the report's tail there (its last run's end to its end: the report job
    draws, it takes longer than a start-up) in the same ratio to the measurement, with its words (None: a finished
    lab's here). Where no lab has finished here yet: ``measured_s``, no words, and the report's tail at
    ``REPORT_RATIO``, said so (``REPORT_PRIOR``)."""
    import json

    prior = measured_s, None, measured_s * REPORT_RATIO, REPORT_PRIOR
    try:
        entry = json.loads(_calibration_file().read_text(encoding="utf-8"))[machine_key()]
        ratio = float(entry["ratio"])
        tail = entry.get("report_ratio")
        tail = None if tail is None else float(tail)
    except (OSError, ValueError, KeyError, TypeError):
        return prior
    if not (0.5 <= ratio <= 20) or (tail is not None and not 0.5 <= tail <= 40):  # no workflow gives these
        return prior
    return measured_s * ratio, (f"fresh Pythons doing what a job does before its first step, timed here now "
                                f"({measured_s:.1f} s), x {ratio:.2f}: this machine's last finished lab's start-up "
                                f"read back from its real time ({entry.get('date', '?')})"), \
        (measured_s * (REPORT_RATIO if tail is None else tail)), (REPORT_PRIOR if tail is None else None)


def record_calibration(measured_s: float, real_job_s: float, report_s: float | None = None) -> None:
    """Keep this machine's ratio of a finished lab's real start-up (and of its report's tail, ``report_s``) to the
    fresh Pythons' measurement; a file that cannot be written is left as it is (the next estimate then measures
    alone)."""
    import datetime
    import json

    if measured_s <= 0 or real_job_s <= 0:
        return
    path = _calibration_file()
    try:
        table = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    table[machine_key()] = {"ratio": round(real_job_s / measured_s, 3), "measured_s": round(measured_s, 3),
                            "real_job_s": round(real_job_s, 3), "date": datetime.date.today().isoformat(),
                            **({"report_ratio": round(report_s / measured_s, 3), "report_s": round(report_s, 3)}
                               if report_s else {})}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


def makespan(jobs: list[float], lanes: int) -> float:
    """Seconds until the last of ``jobs`` (each one's seconds) ends on ``lanes`` lanes, each job going to the lane that
    frees first, longest first (as Snakemake starts whatever job is ready when a core frees)."""
    ends = [0.0] * max(1, lanes)
    for cost in sorted(jobs, reverse=True):
        ends[ends.index(min(ends))] += cost
    return max(ends)


def side_by_side(cores: int, lanes: int, load: float) -> float:
    """How much slower each step is with ``lanes`` jobs side by side than with one alone, on ``cores`` cores already
    running ``load`` other busy processes (the load average, this command's own process taken out): a process gets
    min(1, cores / processes) of a core when every process asks for one."""
    others = max(0.0, load - 1.0)
    share = lambda k: min(1.0, cores / (k + others))  # noqa: E731
    return share(1) / share(max(1, lanes))


# Snakemake's own start (Python, importing Snakemake, its DAG) against a job's: importing Snakemake took 3.0 s where a
# job's imports took 7.2 s (one process each, nice 10, 2 busy cores; 2026-12-07)
SNAKEMAKE_START = 0.4


def workflow_seconds(run_steps: list[int], per_step: float, job_s: float, cores: int, load: float = 0.0,
                     gradnorm: bool = True, started: bool = False, report_s: float | None = None) -> float:
    """Seconds the lab's workflow takes from here: Snakemake's start (unless ``started``: ``SNAKEMAKE_START`` of a job's
    start-up), the runs (a job's start-up
    ``job_s`` and their steps at ``per_step``, slowed as ``side_by_side`` says when they share the machine) and the
    gradient at init (a job's start-up) on the lanes, then the report (a job's start-up: it imports and draws; or
    ``report_s``, the report's tail as a finished lab measured it here)."""
    lanes = _lanes(cores, len(run_steps) + gradnorm)
    slow = side_by_side(cores, lanes, load)
    jobs = [job_s + n * per_step * slow for n in run_steps] + ([job_s] if gradnorm else [])
    return (0.0 if started else SNAKEMAKE_START * job_s) + makespan(jobs, lanes) + (job_s if report_s is None
                                                                                     else report_s)


def load_now() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def _checkpoint_step(path: Path, spec=None) -> int:
    """The step a checkpoint resumes from: 0 where it cannot be read or (``spec`` given) is of another block's source
    (a user's block edited since: ``spec.Block.digest``), which the run moves aside and trains from step 0."""
    from ..training.train import CheckpointMismatch, read_checkpoint

    try:
        state = read_checkpoint(path)
        if spec is not None and spec.block.digest is not None:
            if ((state.get("identity") or {}).get("lab") or {}).get("block", {}).get("digest") != spec.block.digest:
                return 0
        return int(state["step"])
    except (CheckpointMismatch, KeyError, TypeError, ValueError, OSError, AttributeError):
        return 0


def finished_run(spec, run: Path) -> bool:
    """A run of this lab is finished: its meta.json is there and, for a user's block, of this block's source and
    weights at init (after an edit the run retrains: Snakemake sees spec.json newer than it)."""
    meta = Path(run) / "meta.json"
    if not meta.is_file():
        return False
    if spec.block.digest is None:
        return True
    import json

    try:
        return json.loads(meta.read_text(encoding="utf-8"))["lab"]["block"].get("digest") == spec.block.digest
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def steps_left(spec, out: Path) -> dict[str, int]:
    """Each planned run's steps still to train: 0 finished (or adopted), the rest after its checkpoint."""
    left = {}
    for warmup, seed in spec.runs():
        run = Path(out) / "runs" / spec.run_name(warmup, seed)
        done = finished_run(spec, run)
        start = _checkpoint_step(run / "checkpoint.pt", spec) if not done and (run / "checkpoint.pt").is_file() else 0
        left[spec.run_name(warmup, seed)] = 0 if done else spec.setup.steps - start
    return left


def _lanes(cores: int, runs: int) -> int:
    return max(1, min(cores, runs))


def job_s_from(real_s: float, run_steps: list[int], per_step: float, cores: int, load: float = 0.0,
               report_s: float | None = None) -> float:
    """The job start-up with which ``workflow_seconds`` gives ``real_s``, the time a workflow took (its runs'
    steps, per step and lanes as estimated): how long a job took to start there, read back from a finished workflow
    (0 where its steps alone took longer)."""
    low, high = 0.0, max(real_s, 1e-9)
    if workflow_seconds(run_steps, per_step, 0.0, cores, load, report_s=report_s) >= real_s:
        return 0.0
    for _ in range(60):  # workflow_seconds grows with the start-up: bisection
        mid = (low + high) / 2
        low, high = ((mid, high) if workflow_seconds(run_steps, per_step, mid, cores, load, report_s=report_s) < real_s
                     else (low, mid))
    return (low + high) / 2


def estimate(spec, out: Path, per_step: float, job_s: float, cores: int, timed: int,
             load: float = 0.0, job_basis: str = "fresh Pythons doing what a job does before its first step, started "
             "together as the jobs are, timed here now", report_s: float | None = None,
             report_basis: str | None = None) -> tuple[str, float]:
    """The line said before anything trains: what the lab will cost here, and what that is made of; and its seconds."""
    left = steps_left(spec, out)
    todo = [run for run, n in left.items() if n]
    if not todo:
        return "blocklab lab: every run is finished; only the tables, figure and page are (re)written", 2 * job_s
    resumed = [f"{run} from step {spec.setup.steps - left[run]}" for run in todo if left[run] < spec.setup.steps]
    steps = sum(left.values())
    lanes = _lanes(cores, len(todo) + 1)
    total = workflow_seconds([left[run] for run in todo], per_step, job_s, cores, load, report_s=report_s)
    slow = side_by_side(cores, lanes, load)
    return (f"blocklab lab: cost ≈ {clock(total)} on this machine: {len(todo)} run(s) to train"
            f"{' (resuming ' + ', '.join(resumed) + ')' if resumed else ''}, {steps:,} steps at {per_step:.3g} s/step "
            f"(timed here on {timed} steps of the built stack, one thread as each job trains"
            f"{f'; x {slow:.2g} for {lanes} side by side at load {load:.1f}' if slow > 1.005 else ''}), {lanes} "
            f"job(s) at a time (--cores {cores}), plus ≈ {job_s:.0f} s start-up a job ({job_basis}) for each run, the "
            + ("gradient at init and Snakemake, and ≈ " + f"{report_s:.0f} s for the report ("
               + (report_basis or "as a finished lab's took here, in proportion") + ")"
               if report_s is not None else "gradient at init, the report and Snakemake")
            + ", at the machine's present load"), total


def job_ages() -> dict[str, float]:
    """Seconds each lab job under this process has been running, by what it makes: a run's name (``w0-s1``),
    ``gradnorm`` or ``report`` (from the jobs' command lines, ``blocklab lab-job ...``)."""
    import psutil

    ages, now = {}, time.time()
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return ages
    for child in children:
        try:
            words = child.cmdline()
            if "lab-job" not in words or words.index("lab-job") + 1 >= len(words):
                continue
            verb = words[words.index("lab-job") + 1]
            if verb == "run" and "--warmup" in words and "--seed" in words:
                name = f"w{words[words.index('--warmup') + 1]}-s{words[words.index('--seed') + 1]}"
            else:
                name = verb
            ages[name] = max(ages.get(name, 0.0), now - child.create_time())
        except (psutil.Error, ValueError, IndexError):
            continue
    return ages


def lab_line(spec, out: Path, per_step: float, start_s: float, cores: int, planned: dict[str, int],
             ages: dict[str, float] | None = None, report_s: float | None = None) -> str:
    """The whole lab's progress: runs finished, each running run's step and s/step (its last line in train.log: its
    recent steps), and the ETA of the whole lab from the measured steps (the timed steps until a run has measured its
    own): the runs left and the gradient at init on the lanes, then the report, each job's start-up less the time it
    has run already (``ages``: ``job_ages()``, seconds by job)."""
    ages = job_ages() if ages is None else ages
    left_of = lambda job: max(0.0, start_s - ages.get(job, 0.0))  # noqa: E731 (a start-up partly done)
    finished, running, measured, jobs = 0, [], [], []
    waiting = []
    for warmup, seed in spec.runs():
        name = spec.run_name(warmup, seed)
        run = Path(out) / "runs" / name
        if finished_run(spec, run):
            finished += 1
            continue
        log = run / "train.log"
        found = PROGRESS.findall(log.read_text(encoding="utf-8", errors="replace")) if log.is_file() else []
        if found:
            step, total, rate = int(found[-1][0]), int(found[-1][1]), float(found[-1][2])
            running.append(f"{name} at step {step}/{total} ({rate:.3g} s/step)")
            measured.append(rate)
            jobs.append((total - step) * rate)
        else:
            waiting.append((name, planned.get(name, spec.setup.steps)))
    runs = len(spec.runs())
    rate = sum(measured) / len(measured) if measured else per_step
    gradnorm = not (Path(out) / "gradnorm.csv").is_file()
    every = jobs + [left_of(name) + n * rate for name, n in waiting] + ([left_of("gradnorm")] if gradnorm else [])
    report = start_s if report_s is None else report_s  # the report job: a start-up, or its tail measured here
    eta = (makespan(every, _lanes(cores, len(every))) + report if every
           else max(0.0, report - ages.get("report", 0.0)))
    return (f"blocklab lab: {finished} of {runs} runs finished" + (f"; {', '.join(running)}" if running else "")
            + f"; ETA of the whole lab ≈ {clock(eta)} (from {'the runs' if measured else 'the timed'} steps)")


def resume_command() -> str:
    """The one command that resumes: this one, from this folder."""
    words = sys.argv[1:]
    exe = "blocklab" if shutil.which("blocklab") else str(Path(sys.executable).with_name("blocklab"))
    if words[:1] != ["lab"]:
        return f"the same `blocklab lab` command (from {os.getcwd()})"
    return f"cd {shlex.quote(os.getcwd())} && {shlex.join([exe, *words])}"


def locks(out: Path) -> list[Path]:
    folder = Path(out) / ".snakemake" / "locks"
    return sorted(folder.glob("*.lock")) if folder.is_dir() else []


def workers(out: Path) -> list[int]:
    """Processes of this machine working in ``out`` (their current folder): a Snakemake of this lab and its jobs."""
    import psutil

    out = Path(out).resolve()
    found = []
    for proc in psutil.process_iter(["pid", "cwd"]):
        cwd = proc.info.get("cwd")
        if cwd and proc.info["pid"] != os.getpid() and Path(cwd) == out:
            found.append(proc.info["pid"])
    return found


LAB_LOCK = ".blocklab-lab.lock"  # in --out: held (flock) by the `blocklab lab` that works there, with its pid


def hold_folder(out: Path):
    """Take ``out`` for this `blocklab lab`: an exclusive flock on ``out/.blocklab-lab.lock`` (released when this
    process ends, however it ends), holding this process's pid and command. Returns the open lock file (keep it open
    while the lab runs), or a string saying which lab holds the folder: another `blocklab lab` (its pid, since when,
    its command), or, without one, another process working in it beside Snakemake's lock."""
    import fcntl

    path = Path(out) / LAB_LOCK
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip().split("\t")
        handle.close()
        pid, since, command = (holder + ["?", "?", "?"])[:3]
        return (f"blocklab lab: another `blocklab lab` is running in {out} (pid {pid}, since {since}: {command}); "
                f"two labs in one folder would train the same runs: wait for it to end, or stop it (Ctrl-C in its "
                f"terminal, or kill -INT {pid}: it keeps its checkpoints), then run this command again; or give "
                "another --out")
    if refused := wait_for_orphans(out):  # a killed lab's workflow: waited for while its leash stops it, else named
        handle.close()
        return refused
    others = workers(out) if locks(out) else []
    if others:
        handle.close()
        import psutil

        said = []
        for pid in others[:3]:
            try:
                said.append(f"pid {pid}: {' '.join(psutil.Process(pid).cmdline())[:120]}")
            except psutil.Error:
                said.append(f"pid {pid}")
        return (f"blocklab lab: another lab is running in {out}: Snakemake's lock is there and another process works "
                f"in the folder ({'; '.join(said)}); wait for it to end or stop it, then run this command again")
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\t{time.strftime('%Y-%m-%d %H:%M:%S')}\t{shlex.join(['blocklab', *sys.argv[1:]])}\n")
    handle.flush()
    return handle


def remove_stale_locks(out: Path) -> str | None:
    """A lock left by a run that no longer runs (no process works in ``out``) is removed; returns what was said."""
    stale = locks(out)
    if not stale or workers(out):
        return None
    for path in stale:
        path.unlink(missing_ok=True)
    return (f"blocklab lab: removed the Snakemake lock {Path(out) / '.snakemake' / 'locks'} left by a run that no "
            "longer runs (no process works in the folder)")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stopping_line() -> str:
    """The first line after a Ctrl-C: the lab stops as asked, each job at a checkpoint, and the command that resumes."""
    return (f"blocklab lab: stopping as asked: each running job finishes its step, saves it in its checkpoint and "
            f"ends (a second Ctrl-C stops them at once, at their last checkpoint); resume with: {resume_command()}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _as_interrupt(signum, frame):
    raise KeyboardInterrupt


# The process between `blocklab lab` and Snakemake, in Snakemake's process group (its leader): it starts Snakemake,
# passes on its exit status, and ends the workflow when the lab that started it dies. Plain Python (``-c``), so that it
# starts in milliseconds; argv: the lab's pid, its pid file, the name of INTERRUPT_ENV, then Snakemake's command.
PID_FILE = ".blocklab-lab.pid"  # in the lab's folder while its workflow runs: the group, then "stopping" once stopping
LEASH = r"""
import ctypes, os, signal, subprocess, sys, time
parent, pid_file, interrupt_env, command = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
stop, quiet = [], []
group = os.getpgrp()
def interrupted(signum, frame):  # the lab's Ctrl-C, sent here first: Snakemake's lines stop reaching the terminal
    if not quiet:  # (its log keeps them), then the group is told (this handler too: already quiet, it returns)
        quiet.append(signum)
        os.killpg(group, signal.SIGINT)
signal.signal(signal.SIGINT, interrupted)  # a handler (not SIG_IGN): Snakemake, started below, starts with SIGINT at
# its default, as a terminal gives it
for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, lambda signum, frame: stop.append(signum))
try:  # PR_SET_PDEATHSIG: SIGTERM here when the lab dies, however it dies
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != parent:  # the lab died before the line above
    stop.append(signal.SIGTERM)
os.environ[interrupt_env] = str(group)
locks = os.path.join(".snakemake", "locks")
def our_locks():
    return set(os.listdir(locks)) if os.path.isdir(locks) else set()
before = our_locks()
def say(text):
    tmp = pid_file + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, pid_file)
say(f"{group}\n")
def others():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                found.append(int(name))
    return found
def forward(pipe):  # Snakemake's and its jobs' stderr to this one's (the terminal) until the lab stops: then nowhere
    for line in iter(pipe.readline, b""):
        if not quiet and not stop:
            try:
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()
            except OSError:  # the terminal is gone: the jobs' lines are in their logs
                pass
child = None if stop else subprocess.Popen(command, stderr=subprocess.PIPE)
reader = None
if child is not None:
    import threading
    reader = threading.Thread(target=forward, args=(child.stderr,), daemon=True)
    reader.start()
stopping = None
while True:
    if stop and stopping is None:
        stopping = time.monotonic()
        say(f"{group}\nstopping\n")
        try:  # its terminal may be gone with it
            sys.stderr.write(f"blocklab lab: the lab that started this workflow (pid {parent}) is gone; stopping "
                             "its jobs as a Ctrl-C does (each saves its step); the same command resumes\n")
            sys.stderr.flush()
        except OSError:
            pass
        quiet.append(signal.SIGTERM)  # before the group's SIGINT, which reaches this process too: its handler then
        os.killpg(group, signal.SIGINT)  # sends none again (a second SIGINT stops the jobs at once, unsaved)
    if stopping is not None and time.monotonic() - stopping > 120:
        for pid in others():  # a job that would not end
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    try:
        code = child.wait(timeout=0.5) if child is not None else 130
        break
    except subprocess.TimeoutExpired:
        pass
if stopping is not None or quiet:
    began = stopping or time.monotonic()
    while others() and time.monotonic() - began < 130:  # a job still saving its step: its checkpoint first
        time.sleep(0.2)
if reader is not None:
    reader.join(timeout=5)
if stopping is not None:
    for name in our_locks() - before:
        try:
            os.unlink(os.path.join(locks, name))
        except OSError:
            pass
try:
    os.unlink(pid_file)
except OSError:
    pass
sys.exit(128 - code if code < 0 else code)
"""


def lab_group(out: Path) -> tuple[int, bool, list[int]] | None:
    """(process group, whether its lab is gone and it is stopping, its live processes working in ``out``) of the
    workflow ``out``'s pid file names, while any of that group lives; else None."""
    import psutil

    try:
        words = (Path(out) / PID_FILE).read_text(encoding="utf-8").split()
        group = int(words[0])
    except (OSError, ValueError, IndexError):
        return None
    out = Path(out).resolve()
    alive = []
    for proc in psutil.process_iter(["pid", "cwd"]):
        try:
            if proc.info["pid"] != os.getpid() and os.getpgid(proc.info["pid"]) == group and proc.info.get("cwd") \
                    and Path(proc.info["cwd"]) == out:
                alive.append(proc.info["pid"])
        except (ProcessLookupError, PermissionError):
            continue
    return (group, "stopping" in words, sorted(alive)) if alive else None


def _described(pids: list[int]) -> str:
    """Each process as its pid and what it is: Snakemake, a lab job (its verb) or its program."""
    import psutil

    names = []
    for pid in pids:
        try:
            words = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if any("snakemake" in word for word in words):
            what = "Snakemake"
        elif "lab-job" in words and words.index("lab-job") + 1 < len(words):
            what = f"job lab-job {words[words.index('lab-job') + 1]}"
        else:
            what = Path(words[0]).name if words else "?"
        names.append(f"pid {pid} ({what})")
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


def wait_for_orphans(out: Path, limit_s: float = 180.0) -> str | None:
    """Before a lab starts Snakemake in ``out``: a workflow a killed lab left. One that is stopping (its leash saw the
    lab die) is waited for (said on stderr), its locks then gone; one still running unled (its leash killed too, or a
    lab started before the leash) is refused: returns the line naming its processes and how to stop it or wait for
    it; None when the folder is free."""
    found = lab_group(out)
    if found is None:
        legacy = [pid for pid in workers(out) if pid not in {p.pid for p in _ancestors()}] if locks(out) else []
        if not legacy:
            return None
        found = (None, False, legacy)
    group, stopping, pids = found
    if stopping:
        began = time.monotonic()
        print(f"blocklab lab: waiting for the workflow a killed `blocklab lab` left (process group {group}: "
              f"{_described(pids)}) to save its steps and end", file=sys.stderr, flush=True)
        while lab_group(out) is not None and time.monotonic() - began < limit_s:
            time.sleep(0.5)
        if lab_group(out) is None:
            print(f"blocklab lab: the workflow a killed `blocklab lab` left ended after {time.monotonic() - began:.0f} s"
                  "; resuming", file=sys.stderr, flush=True)
            if said := remove_stale_locks(out):
                print(said, file=sys.stderr, flush=True)
            return None
        group, _, pids = lab_group(out) or (group, True, pids)
    stop = f"kill -INT -{group}" if group else f"kill -INT {' '.join(map(str, pids))}"
    return (f"blocklab lab: a workflow of this lab is still running in {out}, started by a `blocklab lab` that is gone: "
                  f"{_described(pids)}{f' (process group {group})' if group else ''}; wait for it to end (each run "
                  f"writes its progress to {Path(out) / 'runs' / '<run>' / 'train.log'}), or stop it, each job keeping "
                  f"its step: `{stop}`; then run the same command again, which resumes")


def _ancestors():
    import psutil

    return psutil.Process().parents()


def run_workflow(command: list[str], out: Path, env: dict, tick, every_s: float = 5.0) -> tuple[int, int]:
    """Run Snakemake in a process group of its own; ``tick()`` every ``every_s`` seconds while it runs. A SIGINT or
    SIGTERM here is sent on to that group (once: each job keeps its current step; a second: the jobs stop at once,
    keeping their last checkpoint; a third kills the group). Returns (Snakemake's exit status, signals caught); after
    a signal, every process of the group has ended and the locks Snakemake took are gone."""
    if "--dry-run" not in command and (refused := wait_for_orphans(out)):  # a killed lab's workflow (hold_folder too)
        raise OSError(refused.removeprefix("blocklab lab: "))
    before = set(locks(out))
    # The jobs inherit INTERRUPT_ENV = their process group: they write their interrupted line to their train.log
    # and leave the terminal to this process's one line (training.train._say_interrupted).
    # The leash (LEASH) leads the group: Snakemake under it, SIGINT at its default; this process's death stops it.
    wrapped = [sys.executable, "-c", LEASH, str(os.getpid()), PID_FILE, INTERRUPT_ENV, *command]
    proc = subprocess.Popen(wrapped, cwd=out, env={**env, RESUME_ENV: f"`{resume_command()}`"},
                            stdin=subprocess.DEVNULL, start_new_session=True)
    signals = 0
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _as_interrupt) if main else None
    try:
        while True:
            try:
                try:
                    code = proc.wait(timeout=every_s)
                    break
                except subprocess.TimeoutExpired:
                    if not signals:  # stopping: no progress line after the line that says so
                        tick()
            except KeyboardInterrupt:
                signals += 1
                if signals == 1:  # said first: Snakemake's lines stop reaching the terminal (the leash's SIGINT)
                    print(stopping_line(), file=sys.stderr, flush=True)
                    _signal(proc.pid, signal.SIGINT)  # to the leash, which silences Snakemake, then tells the group
                else:
                    _signal_group(proc.pid, signal.SIGINT if signals < 3 else signal.SIGKILL)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if signals:
        waited = time.monotonic()
        while _group_alive(proc.pid):  # a job still saving its step after Snakemake ended: its checkpoint first
            if time.monotonic() - waited > 60:
                _signal_group(proc.pid, signal.SIGKILL)
            time.sleep(0.2)
        for path in set(locks(out)) - before:
            path.unlink(missing_ok=True)
    return code, signals


def kept_line(spec, out: Path) -> str:
    """After an interrupt: what was kept (finished runs, each checkpoint's step) and the one command that resumes."""
    finished, kept = 0, []
    for warmup, seed in spec.runs():
        run = Path(out) / "runs" / spec.run_name(warmup, seed)
        if finished_run(spec, run):
            finished += 1
        elif (run / "checkpoint.pt").is_file():
            kept.append(f"{run.name} at step {_checkpoint_step(run / 'checkpoint.pt', spec)} of {spec.setup.steps}")
    left = locks(out)  # this run's were removed; one older than it is not this run's to remove
    lock = f"a lock older than this run is left in {left[0].parent}" if left else "no lock is left"
    return (f"blocklab lab: interrupted; kept {finished} finished run(s) and {len(kept)} checkpoint(s)"
            f"{' (' + ', '.join(kept) + ')' if kept else ''}; no job is left running and {lock}; resume "
            f"with: {resume_command()}")
