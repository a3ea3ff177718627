"""Artifact writing. Nothing appears under its final name until it is complete: write a sibling temp file, then rename."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # reading the umask means setting it; put it back at once


class DamagedArtifact(Exception):
    """A finished run, a table or a snapshot whose files are not what was recorded: exit status 3, one line
    (``blocklab.integrity`` has the checks)."""


class OutputError(OSError):
    """An artifact could not be written for a reason outside the program (a full disk, a read-only or unwritable
    directory, a file where a directory belongs). Its message is one line: the path, the cause, what was kept, and
    what to do; the command line exits with status 1 (docs/reproducibility.md, "Faults")."""


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(err: BaseException) -> bool:
    # Python's own writes set errno; pyarrow and safetensors (Rust) put the OS message in their own exception text.
    text = str(err)
    return getattr(err, "errno", None) in _FULL or "No space left on device" in text or "StorageFull" in text \
        or "Disk quota exceeded" in text


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def _existing(directory: Path) -> Path:
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return directory


def output_error(err: OSError | Exception, path: Path) -> OutputError:
    """The one-line ``OutputError`` for a failed write of ``path``."""
    path = Path(path)
    kept = f"the previous {path.name} is kept unchanged" if path.is_file() else "nothing was written under that name"
    if _disk_full(err):
        where = _existing(path.parent)
        mount = where.resolve()
        while not os.path.ismount(mount):
            mount = mount.parent
        try:
            free = _size(shutil.disk_usage(where).free)
        except OSError:
            free = "unknown"
        return _error(errno.ENOSPC, f"no space left on device writing {path} ({free} free on {mount}); {kept};"
                      " free some space and run the same command again: finished work and checkpoints are kept")
    code = getattr(err, "errno", None)
    if code == errno.EROFS:
        cause = f"{_existing(path.parent)} is on a read-only filesystem"
    elif code in (errno.EACCES, errno.EPERM):
        cause = f"permission denied in {_existing(path.parent)} (user {os.getuid()} cannot write there)"
    elif code in (errno.ENOTDIR, errno.EEXIST):
        cause = f"a part of {path.parent} is a file, not a directory"
    elif code == errno.EFBIG:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        cause = ("the file would exceed this process's file-size limit" + (
            f" ({_size(limit)}; `ulimit -f` shows it in KiB, a batch system's job limits set it)"
            if limit != resource.RLIM_INFINITY else " (or the file system's largest file)"))
    else:
        cause = " ".join(str(err).split())
    return _error(code or errno.EIO, f"cannot write {path}: {cause}; {kept}; fix that and run the same command again")


def _error(code: int, message: str) -> OutputError:
    error = OutputError(message)  # one argument: str() is the message alone, without "[Errno N]"
    error.errno = code
    return error


# atomic_path's temporary files: ".<name>.<host>-<pid>.<8 random characters>.tmp<suffix>" beside the final name (host:
# 8 hex digits of this machine's name; pid: the writing process). A SIGKILL in the moment between writing and renaming
# leaves one behind: .dvcignore keeps DVC from recording it with a directory it tracks, and remove_stale_temps (the
# pipeline's start, when no run of the directory is alive) removes it.
TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp(\.[^./]*)?$")
_TEMP_WRITER = re.compile(r"\.([0-9a-f]{8})-(\d+)\.[a-z0-9_]{8}\.tmp(\.[^./]*)?$")


def _host_tag() -> str:
    import socket
    import zlib

    return f"{zlib.crc32(socket.gethostname().encode('utf-8')):08x}"


def _writer_alive(name: str) -> bool | None:
    """Whether the process that writes temporary file ``name`` lives: None where the name does not say (an older
    temporary file, or one written on another machine of a cluster)."""
    found = _TEMP_WRITER.search(name)
    if not found or found.group(1) != _host_tag():
        return None
    try:
        os.kill(int(found.group(2)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # a live process of another user (or a pid this system cannot hold: kept, to be safe)
    return True


def remove_stale_temps(*roots: str | os.PathLike, older_than_s: float = 600.0) -> list[str]:
    """Remove every atomic_path temporary file under ``roots`` whose writer, named in it, is dead (a process of this
    machine), or that was last written over ``older_than_s`` ago (a write in progress, even one of a command started by
    hand or on another machine, renames its file within seconds). Returns them."""
    import time

    removed, now = [], time.time()
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for folder, _, files in os.walk(root):
            for name in files:
                if not TEMP_NAME.match(name):
                    continue
                path = Path(folder) / name
                alive = _writer_alive(name)
                try:
                    stale = alive is False or now - path.stat().st_mtime > older_than_s
                except OSError:  # renamed or removed meanwhile
                    continue
                if stale:
                    path.unlink(missing_ok=True)
                    removed.append(str(path))
    return sorted(removed)


_HOST = _host_tag()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block finishes without error.
    A write that fails for want of space or permission raises ``OutputError`` naming ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_HOST}-{os.getpid()}.",
                                   suffix=".tmp" + path.suffix)
    except OSError as err:
        raise output_error(err, path) from err
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; artifacts get the permissions any new file would
        _fsync(tmp)  # the data on disk before the name: a power loss leaves the old file or the new one, never an empty one
        os.replace(tmp, path)
        _fsync(path.parent)  # and the rename itself
    except OutputError:
        raise
    except Exception as err:
        denied = getattr(err, "errno", None) in (errno.EACCES, errno.EPERM) and getattr(err, "filename", None) == tmp
        if _disk_full(err) or getattr(err, "errno", None) in (errno.EROFS, errno.EFBIG) or denied:
            raise output_error(err, path) from err
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _fsync(path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot fsync a directory: the rename is still atomic
        pass
    finally:
        os.close(fd)


def write_bytes(data: bytes | memoryview, path) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data)


def write_json(obj, path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


def read_json(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


# Every table written here gets a checksum record beside it, in sha256sum's format (`sha256sum -c NAME.sha256` checks it
# too); ``read_table`` checks it before reading, and `blocklab verify` checks every one under data/.
RECORD_SUFFIX = ".sha256"


def table_record_path(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + RECORD_SUFFIX)


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def recorded_path(path, record: bool = True):
    """``atomic_path``, then the file's checksum record beside it (``NAME.sha256``), as for a table: for the figures,
    their sidecars and the report, which no reader of the pipeline opens again, so that `blocklab verify` (the
    pipeline's last step, before DVC records them) finds a flipped byte. ``record=False``: no record, and a stale one
    of an earlier write removed."""
    with atomic_path(path) as tmp:
        yield tmp
        digest = _sha256(tmp)
    if record:
        with atomic_path(table_record_path(path)) as tmp:
            tmp.write_text(f"{digest}  {Path(path).name}\n", encoding="utf-8")
    else:
        table_record_path(path).unlink(missing_ok=True)


def write_table(frame: pd.DataFrame, path, record: bool = True) -> None:
    """CSV or parquet by suffix, then its checksum record (``NAME.sha256``; ``record=False`` for a file that another
    record covers, such as a run's loss.csv, recorded in its meta.json): a kill between the two leaves a table whose
    record does not match, which Snakemake reruns as an incomplete job and every reader refuses."""
    with recorded_path(path, record) as tmp:
        if Path(path).suffix == ".parquet":
            frame.to_parquet(tmp, index=False, compression="zstd")
        else:
            frame.to_csv(tmp, index=False)


def table_problem(path) -> str | None:
    """What is wrong with a table that has a checksum record (None: it matches, or it has no record)."""
    path, record = Path(path), table_record_path(path)
    if not record.is_file():
        return None
    try:
        want = record.read_text(encoding="utf-8").split()[0]
    except (UnicodeDecodeError, IndexError, OSError):
        return f"{record.name} is not a sha256 record"
    if not path.is_file():
        return f"{path.name} is missing"
    if _sha256(path) != want:
        return f"{path.name} has another sha256 than its record {record.name} (edited, truncated or bit-flipped)"
    return None


def check_table(path) -> None:
    """``DamagedArtifact`` when a recorded file (a table, a figure, its sidecar, the report) differs from its checksum
    record, naming the repair."""
    if (problem := table_problem(path)) is not None:
        kind = "table" if Path(path).suffix in (".csv", ".parquet") else "file"
        raise DamagedArtifact(f"{path}: damaged {kind}: {problem}; to repair, rerun the pipeline (`snakemake --cores N` "
                              "or `dvc repro` removes it at the start and makes it again from its inputs; or delete it, "
                              f"`rm {path}`, and rerun), or restore the good copy with `dvc checkout` where DVC holds it")


def read_table(path) -> pd.DataFrame:
    """A table, after checking it against its checksum record where it has one."""
    check_table(path)
    return pd.read_parquet(path) if Path(path).suffix == ".parquet" else pd.read_csv(path)


def data_layout(source, data) -> str:
    """A figure's source named in the pipeline's data/ layout (``data/sweep/losses.csv``) when it lies under the data
    directory ``data``, wherever that directory was on the machine that drew it; any other source as given."""
    try:
        return "data/" + Path(source).resolve().relative_to(Path(data).resolve()).as_posix()
    except ValueError:
        return str(source)
