"""Where an artifact came from: code version and library versions, recorded beside every artifact."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

LIBRARIES = ("torch", "numpy", "pandas", "snakemake", "dvc", "papermill", "seaborn", "matplotlib", "transformers")


@functools.cache
def code_version() -> dict:
    """Git commit (with a dirty flag) where available, and always a hash of the package's own source files."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for file in sorted(package.rglob("*")):
        if file.suffix in (".py", ".yaml", ".json") and "__pycache__" not in file.parts:
            digest.update(file.relative_to(package).as_posix().encode())
            digest.update(file.read_bytes())
    version = {"blocklab_source_sha256": digest.hexdigest()[:16], "git_commit": None, "git_dirty": None}
    if os.environ.get("BLOCKLAB_GIT_COMMIT"):  # a scratch copy's jobs (blocklab.smoke.job_env): the checkout's commit,
        return {**version, "git_commit": os.environ["BLOCKLAB_GIT_COMMIT"],  # not the copy's throwaway one
                "git_dirty": os.environ.get("BLOCKLAB_GIT_DIRTY") == "1"}
    try:
        top = package.parent.parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=top, capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            version["git_commit"] = commit.stdout.strip()
            status = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=top, capture_output=True, text=True, timeout=10)
            version["git_dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return version


# The source files that decide a copy-task run's numbers (model, its initialization and fast path, the settings read
# from params, the data, the training loop and precision): a checkpoint written by other code of these is not resumed
# (training.train); an edit anywhere else (reporting, figures, the reviewer, docs) leaves the checkpoints of a run
# that is stopped and resumed valid.
NUMBERS_CODE = ("model_config.py", "run_settings.py", "model/layers.py", "model/blocks.py", "model/models.py", "model/init.py",
                "model/fastpath.py", "training/train.py", "training/tasks.py", "training/precision.py",
                "training/copy_model.py", "training/sweep.py")


def numbers_code_version(package: Path | None = None, extra: tuple[str, ...] = ()) -> str:
    """A hash of the ``NUMBERS_CODE`` files of the package (16 hex digits); ``extra``: more files (relative to the
    package) that decide one experiment's numbers, e.g. the reverse copy's own module."""
    package = Path(package) if package is not None else Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in (*NUMBERS_CODE, *extra):
        digest.update(name.encode())
        digest.update((package / name).read_bytes())
    return digest.hexdigest()[:16]


def cpu_name() -> str | None:
    """The processor as /proc/cpuinfo names it, with its family and model (results differ between processors)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines()[:40] if ":" in line)
    except OSError:
        return platform.processor() or None
    info = {k.strip(): v.strip() for k, v in info.items()}
    name = info.get("model name") or platform.processor() or None
    return f"{name} (family {info['cpu family']}, model {info['model']})" if name and "cpu family" in info else name


@functools.cache
def library_versions() -> dict:
    versions = {"python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor(),
                "cpu": cpu_name()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def stamp(**fields) -> dict:
    """Metadata for one artifact: the given fields plus code and library versions."""
    return {**fields, "code": code_version(), "libraries": library_versions()}
