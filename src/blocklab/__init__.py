"""blocklab: re-run the transformer-block experiments of two textbook chapters and regenerate their figures.

The model's names below are imported on first use (PEP 562), not with the package: ``import blocklab.pipeline`` (every
Snakemake run) and the commands that need no model (plans, aggregates, claims, figures) start without loading torch.
"""
from __future__ import annotations

import importlib

from .model_config import ConfigError, ModelConfig

__version__ = "0.1.0"
_LAZY = {
    "DecoderBlock": ".model.blocks", "DecoderOnlyBlock": ".model.blocks", "EncoderBlock": ".model.blocks",
    "PostNormResidual": ".model.blocks", "PreNormResidual": ".model.blocks",
    "DecoderLM": ".model.models", "EncoderDecoder": ".model.models",
}
__all__ = sorted(["ConfigError", "ModelConfig", *_LAZY])


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # once: later lookups find it without coming here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
