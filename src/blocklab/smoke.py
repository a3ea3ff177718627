"""A scratch copy of the project with the tiny configuration: same DAG, same code paths, minutes instead of hours."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def tracked_files(project: Path = PROJECT) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=project, capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f]


def make_scratch_project(dest: Path, config: str = "configs/tiny.yaml", project: Path = PROJECT) -> Path:
    """Copy the project's tracked files (plus uncommitted edits to them) into ``dest`` with ``config`` as params.yaml,
    and make it a git repository so that DVC works there too."""
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
    subprocess.run(git + ["commit", "-qm", "scratch copy"], cwd=dest, check=True)
    return dest


def register(subparsers) -> None:
    p = subparsers.add_parser("smoke", help="run the whole pipeline on the tiny configuration in a scratch copy")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--keep", type=Path, default=None, help="directory for the scratch copy (default: a temp dir)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    dest = args.keep or Path(tempfile.mkdtemp(prefix="blocklab-smoke-"))
    dest.mkdir(parents=True, exist_ok=True)
    make_scratch_project(dest, args.config)
    print(f"scratch project: {dest}", file=sys.stderr)
    # this environment's bin first: the rules call `blocklab`, papermill and jupyter by name
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    status = subprocess.run([snakemake_command(), "--cores", str(args.cores)], cwd=dest, env=env).returncode
    if status == 0:  # the last lines a reader sees, after Snakemake's hundreds
        print(f"\nsmoke run finished in {dest}\n  report:  {dest / 'reports/analysis.html'}\n  figures: {dest / 'figs'}/"
              f"\n  claims:  {dest / 'data/claims/claims.csv'}")
    return status


def snakemake_command() -> str:
    """Snakemake of this Python's environment (``.venv/bin/blocklab smoke`` works without the venv on PATH), else
    the one on PATH."""
    beside = Path(sys.executable).parent / "snakemake"
    return str(beside) if beside.is_file() else shutil.which("snakemake") or "snakemake"
