"""`blocklab smoke`: the whole pipeline on the tiny configuration (configs/tiny.yaml) in a scratch copy of the
project: the same DAG and code paths as `make run`, minutes instead of hours; your data/ and figs/ stay untouched.

The scratch copy holds the project's files tracked by git (with their uncommitted edits); untracked files are left
out, and named. Its jobs import the copy's own src/, so an edit to the checkout during a run does not reach them. The
copy is kept after the run (a temporary folder by default, `--keep DIR` to choose it); `blocklab status`, `blocklab
claims` and `blocklab report inspect` in the checkout show its result until the pipeline's own data/ exists.

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
import shutil
import signal
import subprocess
import sys
import tempfile
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
    if state is not None and record.get("state") == state and record.get("config") == args.config:
        print(f"blocklab smoke: resuming the interrupted smoke's scratch copy {record['project']} ({record['size']}, "
              f"started {record.get('started', '?')}; the checkout is as it was then): only what is missing is computed;"
              f" `rm -r {record['project']}` first for a fresh one", file=sys.stderr)
        return Path(record["project"])
    print(f"blocklab smoke: {left_line(record)}; this one starts a fresh copy (the checkout or --config changed since "
          "that one)", file=sys.stderr)
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
        left_out = untracked_files()
        print(f"scratch project: {dest} (the files git tracks, with their uncommitted edits; "
              + (f"{len(left_out)} untracked file(s) left out: {', '.join(left_out[:5])}"
                 f"{', ...' if len(left_out) > 5 else ''}; `git add` one to include it)" if left_out
                 else "no untracked file left out)"), file=sys.stderr)
        if interrupted:
            raise KeyboardInterrupt
        _record(PROJECT, project=str(dest), config=args.config, started=started, finished=None, pid=os.getpid(),
                state=state)
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
    if status == 0:  # the last lines a reader sees, after Snakemake's hundreds
        wall, cpu = time.monotonic() - clock, _children_cpu_s()
        _record(PROJECT, project=str(dest), config=args.config, started=started,
                finished=datetime.now(timezone.utc).isoformat(timespec="seconds"), wall_s=round(wall),
                cpu_s=round(cpu), **machine)  # a row of performance/measured/pipeline_times.csv, ready to copy
        _copy_metrics(dest / "data/claims/metrics.json", PROJECT / SMOKE_METRICS)
        print(f"\nsmoke run finished in {dest} ({wall // 60:.0f} min {wall % 60:.0f} s; its jobs used {cpu:.0f} "
              f"CPU-seconds; {_size(dest)})"
              f"\n  report:  {dest / 'reports/analysis.html'}\n  figures: {dest / 'figs'}/"
              f"\n  claims:  {dest / 'data/claims/claims.csv'}"
              "\n  here, until the pipeline's own data/ exists, `blocklab status`, `blocklab claims` and `blocklab "
              f"report inspect` show it; `dvc metrics show` shows its metrics as {SMOKE_METRICS}")
    return status


def start_snakemake(dest: Path, cores: int) -> subprocess.Popen:
    return subprocess.Popen([snakemake_command(), "--cores", str(cores)], cwd=dest, env=job_env(dest))


def snakemake_command() -> str:
    """Snakemake of this Python's environment (``.venv/bin/blocklab smoke`` works without the venv on PATH), else
    the one on PATH."""
    beside = Path(sys.executable).parent / "snakemake"
    return str(beside) if beside.is_file() else shutil.which("snakemake") or "snakemake"
