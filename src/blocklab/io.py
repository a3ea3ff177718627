"""Artifact writing. Nothing appears under its final name until it is complete: write a sibling temp file, then rename."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import pandas as pd

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # reading the umask means setting it; put it back at once


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; artifacts get the permissions any new file would
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(obj, path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


def read_json(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_table(frame: pd.DataFrame, path) -> None:
    """CSV or parquet by suffix."""
    with atomic_path(path) as tmp:
        if Path(path).suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        else:
            frame.to_csv(tmp, index=False)


def read_table(path) -> pd.DataFrame:
    return pd.read_parquet(path) if Path(path).suffix == ".parquet" else pd.read_csv(path)
