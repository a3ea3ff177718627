"""``sweep.precision``: fp32 (the default) or bf16 autocast with fp32 master weights and an fp32 loss.

bf16 changes results (8 significand bits instead of 24), so it is part of a run's identity: it is in the training
rule's params and in meta.json, and a run trained in one precision never resumes from a checkpoint of the other.
It is allowed only where the hardware has bf16 units: on the CPU the AVX512-BF16 or AMX-BF16 instructions (without
them oneDNN emulates bf16 and is slower than fp32), on CUDA a device for which ``torch.cuda.is_bf16_supported()``.
"""
from __future__ import annotations

import contextlib

import torch

from .. import runtime
from ..model_config import ConfigError
from ..runtime import CPU_BF16_FLAGS, cpu_bf16_units  # noqa: F401  (the hardware probe lives in runtime)

PRECISIONS = ("fp32", "bf16")
DEFAULT = "fp32"


def bf16_support(device) -> tuple[bool, str]:
    """Whether ``device`` has bf16 units, and what was found (or what is missing), in words (``runtime.bf16_support``,
    asking this module's ``cpu_bf16_units``, which a test may replace to play a CPU without bf16 units)."""
    return runtime.bf16_support(device, cpu_bf16_units)


def check_precision(precision: str, device, key: str = "sweep.precision") -> str:
    """Refuse an unknown precision, or bf16 where ``device`` has no bf16 units, with the key and the allowed values."""
    if precision not in PRECISIONS:
        raise ConfigError(f"{key}={precision!r} is not allowed; allowed values: {list(PRECISIONS)}")
    if precision == "bf16":
        ok, why = bf16_support(device)
        if not ok:
            raise ConfigError(f"{key}='bf16' needs bf16 units on the training device ({torch.device(device)}), but {why};"
                              f" allowed here: {key}='fp32'")
    return precision


def autocast(precision: str, device):
    """The context to run forward + loss under: nothing for fp32, ``torch.autocast(device type, bfloat16)`` for bf16.

    Parameters, gradients and the optimizer stay fp32 (autocast casts copies for the ops that run in bf16); the
    caller casts the logits to float before the loss, so the loss and its gradient's start are computed in fp32.
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    raise ConfigError(f"sweep.precision={precision!r} is not allowed; allowed values: {list(PRECISIONS)}")
