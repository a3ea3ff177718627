"""`blocklab smoke`: the whole pipeline on the tiny configuration (configs/tiny.yaml) in a scratch copy of the
project: the same DAG and code paths as `make run`, minutes instead of hours; your data/ and figs/ stay untouched.

The scratch copy holds the project's files tracked by git (with their uncommitted edits); untracked files are left
out, and named. Its jobs import the copy's own src/, so an edit to the checkout during a run does not reach them. The
copy is kept after the run (a temporary folder by default, `--keep DIR` to choose it); `blocklab status`, `blocklab
claims` and `blocklab report inspect` in the checkout show its result until the pipeline's own data/ exists.

Ctrl-C stops it, keeping the scratch copy with every finished job and each run's last checkpoint; one line then says
what is kept and the command that resumes: `blocklab smoke --keep DIR` (only what is missing is computed again).
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


def job_env(dest: Path) -> dict:
    """The jobs' environment: this Python's bin first (the rules call `blocklab`, papermill and jupyter by name), the
    scratch copy's src/ first on the import path (not the checkout's, which the editable install points at), and the
    command a Ctrl-C line names."""
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(dest / "src"), os.environ.get("PYTHONPATH", "")])),
            RESUME_ENV: resume_command(dest)}


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


def _main(args) -> int:
    dest = (args.keep or Path(tempfile.mkdtemp(prefix="blocklab-smoke-"))).resolve()
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
        _record(PROJECT, project=str(dest), config=args.config, started=started, finished=None)
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
