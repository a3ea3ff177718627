"""`blocklab smoke`: the whole pipeline on the tiny configuration (configs/tiny.yaml) in a scratch copy of the
project: the same DAG and code paths as `make run`, minutes instead of hours; your data/ and figs/ stay untouched.

The scratch copy holds the project's files tracked by git (with their uncommitted edits); untracked files are left
out, and named. Its jobs import the copy's own src/, so an edit to the checkout during a run does not reach them. The
copy is kept after the run (a temporary folder by default, `--keep DIR` to choose it); `blocklab status`, `blocklab
claims` and `blocklab report inspect` in the checkout show its result until the pipeline's own data/ exists.

While it runs, one line updates: the jobs done of all, the time so far and the time left (the start's measured
estimate until a job finishes, then the pace of the jobs finished); Snakemake's and the runs' output goes into the
log file that the first and last lines name (ERROR: its last lines are shown). `--lang en` makes the report and the
figures English (figures.lang: en in the scratch copy's params.yaml): the same minutes.

Ctrl-C stops it, keeping the scratch copy with every finished job and each run's last checkpoint; one line then says
what is kept and the command that resumes: `blocklab smoke --keep DIR` (only what is missing is computed again).
A smoke killed outright (SIGKILL, a closed terminal) says nothing; the next `blocklab smoke` (`make smoke`) resumes its
scratch copy when the checkout is as it was (same commit, same uncommitted edits, same --config), and otherwise names
it and its size (`blocklab status` names it too) before starting a fresh one.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from .records import SMOKE, SMOKE_METRICS

PROJECT = Path(__file__).resolve().parents[2]
RESUME_ENV = "BLOCKLAB_RESUME"  # read by blocklab.pipeline.kept_line: the command a Ctrl-C line names


def tracked_files(project: Path = PROJECT) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=project, capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f]


def untracked_files(project: Path = PROJECT) -> list[str]:
    """Files git does not track and does not ignore: the scratch copy leaves them out."""
    out = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=project, capture_output=True,
                         text=True, check=True).stdout
    return [f for f in out.split("\0") if f]


def make_scratch_project(dest: Path, config: str = "configs/tiny.yaml", project: Path = PROJECT) -> Path:
    """Copy the project's tracked files (plus uncommitted edits to them) into ``dest`` with ``config`` as params.yaml,
    and make it a git repository so that DVC works there too. Copying again into a kept copy (``--keep``) updates
    its files and keeps its outputs."""
    dest = Path(dest)
    for name in tracked_files(project):
        source = project / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    shutil.copy2(project / config, dest / "params.yaml")
    git = ["git", "-c", "user.name=blocklab", "-c", "user.email=blocklab@localhost"]
    subprocess.run(git + ["init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "scratch copy"], cwd=dest, check=True)
    return dest


def job_env(dest: Path, project: Path = PROJECT) -> dict:
    """The jobs' environment: this Python's bin first (the rules call `blocklab`, papermill and jupyter by name), the
    scratch copy's src/ first on the import path (not the checkout's, which the editable install points at), the
    command a Ctrl-C line names, and the checkout's commit, which the runs record (not the copy's throwaway one)."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(dest / "src"), os.environ.get("PYTHONPATH", "")])),
           RESUME_ENV: resume_command(dest)}
    commit, dirty = source_commit(project)
    if commit:
        env |= {GIT_COMMIT_ENV: commit, GIT_DIRTY_ENV: "1" if dirty else "0"}
    return env


GIT_COMMIT_ENV, GIT_DIRTY_ENV = "BLOCKLAB_GIT_COMMIT", "BLOCKLAB_GIT_DIRTY"  # read by provenance.code_version


def source_commit(project: Path = PROJECT) -> tuple[str | None, bool]:
    """(the checkout's commit, whether its src/ has uncommitted edits), as provenance.code_version reads them."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=project, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None, False
    return (commit.stdout.strip() or None) if commit.returncode == 0 else None, bool(status.stdout.strip())


def checkout_state(project: Path = PROJECT) -> str | None:
    """The checkout as the scratch copy copies it: its commit and a hash of its uncommitted edits to tracked files."""
    import hashlib

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, timeout=10)
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=project, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode or diff.returncode:
        return None
    return f"{commit.stdout.decode().strip()}+{hashlib.sha256(diff.stdout).hexdigest()[:16]}"


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def interrupted_smoke(checkout: Path = PROJECT) -> dict | None:
    """The checkout's record of a smoke that did not finish and no longer runs (killed or interrupted), its scratch
    copy still there, with ``size`` (the copy's size, in words); None when there is none."""
    from .records import last_smoke

    record = last_smoke(checkout)
    if record is None or record.get("finished") or (record.get("pid") and _alive(record["pid"])):
        return None
    return {**record, "size": _size(Path(record["project"]))}


def left_line(record: dict) -> str:
    """The line that names an interrupted smoke's scratch copy, its size and the commands that resume or free it."""
    config = f" --config {record['config']}" if record.get("config") not in (None, "configs/tiny.yaml") else ""
    return (f"an interrupted smoke's scratch copy is kept: {record['project']} ({record['size']}, started "
            f"{record.get('started', '?')}); `blocklab smoke --keep {record['project']}{config}` resumes it, "
            f"`rm -r {record['project']}` frees it")


def resume_command(dest: Path) -> str:
    return f"`blocklab smoke --keep {dest}` (the scratch copy stays there; `rm -r {dest}` frees it)"


def register(subparsers) -> None:
    p = subparsers.add_parser("smoke", help="run the whole pipeline on the tiny configuration in a scratch copy",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", type=int, default=2, help="cores Snakemake uses (default: 2)")
    p.add_argument("--config", default="configs/tiny.yaml", help="the parameters, copied as the scratch copy's "
                   "params.yaml (default: configs/tiny.yaml)")
    p.add_argument("--lang", choices=["ko", "en"], default=None, help="the report's and figures' language "
                   "(figures.lang in the scratch copy's params.yaml; default: the --config file's, Korean)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="the scratch copy's directory; an existing one (an "
                   "interrupted smoke's) is resumed (default: a new temporary directory)")
    p.set_defaults(func=_main)


def _record(checkout: Path, **fields) -> None:
    """What `blocklab status`, `claims` and `report inspect` read to find the smoke's result (blocklab.records.SMOKE)."""
    path = checkout / SMOKE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fields, indent=1) + "\n", encoding="utf-8")
    except OSError:  # a read-only checkout: the smoke still runs, and its last lines say where it is
        pass


def _copy_metrics(source: Path, target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    except OSError:
        pass


def _machine() -> dict:
    """Where the smoke runs: the processor, its cores, the 1-minute load average at the start."""
    from .provenance import cpu_name

    return {"machine": cpu_name(), "cores": os.cpu_count(),
            "load_at_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def _children_cpu_s() -> float:
    """CPU seconds (user and system) of every process this one waited for: Snakemake and, through it, its jobs."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _size(folder: Path) -> str:
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return f"{total / 1e6:.0f} MB"


def _resumable(args, state: str | None) -> Path | None:
    """Without --keep: the scratch copy of an interrupted smoke of this checkout as it is now (same state, same
    --config), which is resumed; another one left is named with its size (and `blocklab status` names it)."""
    record = interrupted_smoke(PROJECT)
    if record is None:
        return None
    if (state is not None and record.get("state") == state and record.get("config") == args.config
            and record.get("lang") == getattr(args, "lang", None)):
        print(f"blocklab smoke: resuming the interrupted smoke's scratch copy {record['project']} ({record['size']}, "
              f"started {record.get('started', '?')}; the checkout is as it was then): only what is missing is computed;"
              f" `rm -r {record['project']}` first for a fresh one", file=sys.stderr)
        return Path(record["project"])
    print(f"blocklab smoke: {left_line(record)}; this one starts a fresh copy (the checkout, --config or --lang "
          "changed since that one)", file=sys.stderr)
    return None


def _main(args) -> int:
    state = checkout_state(PROJECT)
    keep = args.keep or _resumable(args, state)
    dest = (keep or Path(tempfile.mkdtemp(prefix="blocklab-smoke-"))).resolve()
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(True))  # Snakemake says it
    try:
        started, clock = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.monotonic()
        machine = _machine()
        dest.mkdir(parents=True, exist_ok=True)
        make_scratch_project(dest, args.config)
        lang = getattr(args, "lang", None)
        if lang:
            set_lang(dest / "params.yaml", lang)
        left_out = untracked_files()
        print(f"scratch project: {dest} (the files git tracks, with their uncommitted edits; "
              + (f"{len(left_out)} untracked file(s) left out: {', '.join(left_out[:5])}"
                 f"{', ...' if len(left_out) > 5 else ''}; `git add` one to include it)" if left_out
                 else "no untracked file left out)"), file=sys.stderr)
        if interrupted:
            raise KeyboardInterrupt
        _record(PROJECT, project=str(dest), config=args.config, lang=lang, started=started, finished=None,
                pid=os.getpid(), state=state)
        child = start_snakemake(dest, args.cores)
        while True:  # a Ctrl-C reaches Snakemake too (one process group): wait for its own line and exit
            try:
                status = child.wait()
                break
            except KeyboardInterrupt:  # only where the handler above was replaced
                interrupted.append(True)
    except KeyboardInterrupt:
        print(f"blocklab smoke: interrupted while copying; resume with {resume_command(dest)}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        return 130  # Snakemake's last line said what is kept and named the resume command (blocklab.pipeline.kept_line)
    if status == 0:  # the last lines a reader sees, after the progress line
        wall, cpu = time.monotonic() - clock, _children_cpu_s()
        _record(PROJECT, project=str(dest), config=args.config, lang=lang, started=started,
                finished=datetime.now(timezone.utc).isoformat(timespec="seconds"), wall_s=round(wall),
                cpu_s=round(cpu), **machine)  # a row of performance/measured/pipeline_times.csv, ready to copy
        _copy_metrics(dest / "data/claims/metrics.json", PROJECT / SMOKE_METRICS)
        print(f"\nsmoke run finished in {dest} ({wall // 60:.0f} min {wall % 60:.0f} s; its jobs used {cpu:.0f} "
              f"CPU-seconds; {_size(dest)})"
              f"\n  report:  {dest / 'reports/analysis.html'}\n  figures: {dest / 'figs'}/"
              f"\n  claims:  {dest / 'data/claims/claims.csv'}"
              f"\n  log:     {dest / LOG} (Snakemake's and the runs' output)"
              "\n  here, until the pipeline's own data/ exists, `blocklab status`, `blocklab claims` and `blocklab "
              f"report inspect` show it; `dvc metrics show {SMOKE_METRICS}` shows its metrics")
    return status


LOG = "logs/smoke.log"  # in the scratch copy: Snakemake's output and its jobs', whole


def set_lang(params_file: Path, lang: str) -> None:
    """figures.lang in the scratch copy's parameters (the copy's own file: the checkout's configs stay as they are)."""
    import yaml

    params = yaml.safe_load(params_file.read_text(encoding="utf-8"))
    params.setdefault("figures", {})["lang"] = lang
    params_file.write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True), encoding="utf-8")


def start_snakemake(dest: Path, cores: int) -> "Watched":
    """Snakemake in the scratch copy, its output (and its jobs') into ``dest/LOG``, read line by line for the progress
    line."""
    log = dest / LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([snakemake_command(), "--cores", str(cores)], cwd=dest,
                             env={**job_env(dest), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    print(f"blocklab smoke: Snakemake's and the runs' output goes to {log}", file=sys.stderr, flush=True)
    return Watched(child, log)


# ---- the progress line ---------------------------------------------------------------------------------------------

STEPS_DONE = re.compile(r"^(\d+) of (\d+) steps \([^)]*\) done")  # Snakemake's line after each finished job
START_ETA = re.compile(r"^blocklab: about (\d+):(\d\d):(\d\d) on")  # the Snakefile's onstart (status.eta_line)
SAID = ("blocklab: interrupted",)  # Snakemake's lines the terminal shows too (pipeline.kept_line: what Ctrl-C kept)
TAIL_ON_ERROR = 40


def duration(seconds: float) -> str:
    """A time in the words a reader takes in at a glance: 45 s, 3 min 10 s, 1 h 05 min."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """The smoke's state, read from Snakemake's lines (``feed``): the jobs done of all (its "N of M steps done"), when
    the last one finished, and the start's ETA (the Snakefile's onstart line). ``line`` says it in one line: the time
    left is the pace of the jobs finished (the time since the first job could start, over the jobs done) times the
    jobs left, less the time since the last one finished; before any job finishes, the start's estimate counts down."""

    def __init__(self, started: float):
        self.started = self.jobs_from = started
        self.done, self.total = 0, None
        self.last_done = None
        self.start_eta = None  # (seconds, when said)

    def feed(self, line: str, now: float) -> bool:
        """Take one line of Snakemake's output; True when what ``line`` says changed."""
        found = STEPS_DONE.match(line.strip())
        if found:
            self.done, self.total, self.last_done = int(found[1]), int(found[2]), now
            return True
        found = START_ETA.match(line.strip())
        if found:
            hours, minutes, seconds = map(int, found.groups())
            self.start_eta, self.jobs_from = (3600 * hours + 60 * minutes + seconds, now), now
            return True
        return False

    def left(self, now: float) -> tuple[float | None, str]:
        """(seconds left or None, what they were estimated from)."""
        if self.total is not None and self.done >= self.total:
            return 0.0, "done"
        if self.done and self.last_done is not None:
            pace = (self.last_done - self.jobs_from) / self.done
            return max(0.0, pace * (self.total - self.done) - (now - self.last_done)), \
                f"at the pace of the {self.done} finished"
        if self.start_eta is not None:
            return max(0.0, self.start_eta[0] - (now - self.start_eta[1])), "the start's estimate"
        return None, "measuring this machine"

    def line(self, now: float) -> str:
        jobs = f"{self.done} of {self.total} jobs done" if self.total else "planning the jobs"
        left, basis = self.left(now)
        eta = ("" if basis == "done" else f", {basis}" if left is None else
               f", about {duration(left)} left ({basis})" if left > 0 else f", any moment now ({basis})")
        return f"blocklab smoke: {jobs}, {duration(now - self.started)} so far{eta}"


class Watched:
    """Snakemake's process as the smoke waits for it: every line of its output into the log, the progress line
    rewritten in place on a terminal (else printed as the jobs finish, at most every 30 s), and a few lines shown:
    those of SAID, and the log's last lines when Snakemake fails."""

    def __init__(self, child: subprocess.Popen, log: Path, stream=None, clock=time.monotonic):
        self.child, self.log, self.stream, self.clock = child, log, stream or sys.stderr, clock
        self.progress = Progress(clock())
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.lock, self.shown, self.printed_at, self.said = threading.Lock(), "", None, False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.log, "a", encoding="utf-8", errors="replace") as log:
            log.write(f"---- blocklab smoke, {datetime.now(timezone.utc).isoformat(timespec='seconds')} ----\n")
            for raw in iter(self.child.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                with self.lock:
                    changed = self.progress.feed(line, self.clock())
                    if line.startswith(SAID):
                        self._say(line.rstrip("\n"))
                    elif changed:
                        self._show(final=False)

    def _say(self, text: str) -> None:
        if self.tty and self.shown:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.shown, self.said = "", True
        self.stream.flush()

    def _show(self, final: bool) -> None:
        now = self.clock()
        text = self.progress.line(now)
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\033[K" + text[:width] + ("\n" if final else ""))
            self.shown = "" if final else text
        elif final or self.printed_at is None or now - self.printed_at >= 30:
            self.stream.write(text + "\n")
            self.printed_at = now
        self.stream.flush()

    def wait(self) -> int:
        while True:
            try:
                status = self.child.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                if self.tty:
                    with self.lock:
                        self._show(final=False)
        self.reader.join(timeout=30)
        with self.lock:
            if self.said:  # Snakemake's own last line (what a Ctrl-C kept, the command that resumes) stays the last
                return status
            self._show(final=True)
            if status not in (0, None):
                tail = self.tail(TAIL_ON_ERROR)
                self.stream.write("".join(line + "\n" for line in tail)
                                  + f"blocklab smoke: Snakemake stopped (exit status {status}); above, the last "
                                  f"{len(tail)} lines of its output; all of it: {self.log}\n")
                self.stream.flush()
        return status

    def tail(self, n: int) -> list[str]:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
        except OSError:
            return []


def snakemake_command() -> str:
    """Snakemake of this Python's environment (``.venv/bin/blocklab smoke`` works without the venv on PATH), else
    the one on PATH."""
    beside = Path(sys.executable).parent / "snakemake"
    return str(beside) if beside.is_file() else shutil.which("snakemake") or "snakemake"
