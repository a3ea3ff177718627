"""Transformer blocks. The only difference between pre-norm and post-norm lives in the two residual wrappers.

    pre-norm  (GPT-2, Xiong et al. 2020):  h <- h + F(LN(h))
    post-norm (Vaswani et al. 2017):       h <- LN(h + F(h))

A block is a short sequence of residual sub-layers; the config's ``norm_position`` picks the wrapper.
"""
from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from .layers import Attention, make_ffn, make_norm


class PreNormResidual(nn.Module):
    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer

    def forward(self, h, *args, **kwargs):
        return h + self.sublayer(self.norm(h), *args, **kwargs)


class PostNormResidual(nn.Module):
    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer

    def forward(self, h, *args, **kwargs):
        return self.norm(h + self.sublayer(h, *args, **kwargs))


RESIDUAL = {"pre": PreNormResidual, "post": PostNormResidual}


class EncoderBlock(nn.Module):
    """Bidirectional self-attention, then the feed-forward network (BERT, T5 encoder)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        residual = RESIDUAL[cfg.norm_position]
        self.attn = residual(cfg, Attention(cfg, causal=False))
        self.ffn = residual(cfg, make_ffn(cfg))

    def forward(self, h):
        h = self.attn(h)
        return self.ffn(h)


class DecoderOnlyBlock(nn.Module):
    """Masked self-attention, then the feed-forward network (GPT): no cross-attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        residual = RESIDUAL[cfg.norm_position]
        self.attn = residual(cfg, Attention(cfg, causal=True))
        self.ffn = residual(cfg, make_ffn(cfg))

    def forward(self, h):
        h = self.attn(h)
        return self.ffn(h)


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, feed-forward (T5 decoder): three sub-layers.

    Cross-attention is the only path from the encoder into the decoder.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        residual = RESIDUAL[cfg.norm_position]
        self.attn = residual(cfg, Attention(cfg, causal=True))
        self.cross = residual(cfg, Attention(cfg, cross=True))
        self.ffn = residual(cfg, make_ffn(cfg))

    def forward(self, h, memory):
        h = self.attn(h)
        h = self.cross(h, memory)
        return self.ffn(h)
