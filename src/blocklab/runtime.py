"""Device and thread settings shared by every compute command."""
from __future__ import annotations

import torch

from .config import ConfigError


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was asked for but no CUDA device is available; allowed here: 'auto' or 'cpu'")
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r} is not allowed; choose one of ['auto', 'cpu', 'cuda']")
    return torch.device(name)


def set_threads(threads: int) -> None:
    """Honour the thread count the pipeline rule declared, so N parallel jobs never oversubscribe the cores."""
    torch.set_num_threads(max(1, int(threads)))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
