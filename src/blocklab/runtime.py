"""Device and thread settings shared by every compute command."""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch

from .model_config import ConfigError


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


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names of the processor's bf16 instructions


@functools.cache
def cpu_bf16_units() -> tuple[str, ...]:
    """The bf16 instruction sets this CPU has, by /proc/cpuinfo flags and torch's own CPU checks (empty: none)."""
    found = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                found.update(flag for flag in line.split(":", 1)[1].split() if flag in CPU_BF16_FLAGS)
                break
    checks = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_bf16": "_is_amx_tile_supported"}
    for flag, check in checks.items():
        with contextlib.suppress(Exception):
            if getattr(torch.cpu, check)():
                found.add(flag)
    return tuple(sorted(found))


def bf16_support(device, cpu_units=None) -> tuple[bool, str]:
    """Whether ``device`` has bf16 units, and what was found (or what is missing), in words. ``cpu_units``: the CPU
    lookup to use (default ``cpu_bf16_units``)."""
    kind = torch.device(device).type
    if kind == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA device is available"
        name = torch.cuda.get_device_name(torch.device(device))
        if torch.cuda.is_bf16_supported():
            return True, f"CUDA device {name} supports bf16"
        return False, f"CUDA device {name} does not support bf16 (torch.cuda.is_bf16_supported() is False)"
    if kind == "cpu":
        units = (cpu_units or cpu_bf16_units)()
        if units:
            return True, f"CPU has {' and '.join(units)}"
        return False, f"this CPU has neither of the bf16 instruction sets {list(CPU_BF16_FLAGS)} (/proc/cpuinfo flags)"
    return False, f"bf16 is not supported on device type {kind!r} here"
