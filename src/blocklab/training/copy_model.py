"""Document 000's copy-task model: its config from params.yaml and its seeded initial weights.

One module of its own, because every module that trains, times or probes that model builds it the same way (the
sweep and its batched job, the studies, the bench, the probe, the gradient-norm experiment): a run's weights at step 0
are decided here and nowhere else.
"""
from __future__ import annotations

from dataclasses import asdict, replace

import torch

from ..model_config import ModelConfig
from ..model.models import DecoderLM
from ..run_settings import CopyModel, CopyTask


def copy_model_config(params: dict, norm: str, init: str | None = None) -> ModelConfig:
    """The copy-task model of params.yaml with the given norm position (and optionally another init scheme)."""
    model, task = CopyModel.from_params(params), CopyTask.from_params(params)
    if init is not None:
        model = replace(model, init=init)
    return ModelConfig(**asdict(model), norm_position=norm, vocab_size=task.vocab_size, max_len=2 * task.seq_len)


def build_copy_model(cfg: ModelConfig, seed: int) -> DecoderLM:
    """The run's model at initialization: the same seed always gives the same weights."""
    torch.manual_seed(seed)
    return DecoderLM(cfg)
