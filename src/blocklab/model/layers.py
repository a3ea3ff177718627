"""The building blocks both documents describe: norms, feed-forward layers, attention, position signals."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..model_config import ModelConfig


# --- normalization -------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """Ba et al. 2016: per token, subtract the mean, divide by the standard deviation, then scale and shift."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        x = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + self.eps)
        return x * self.weight + self.bias if self.bias is not None else x * self.weight


class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019: LayerNorm without the mean subtraction and without a bias."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm_kind == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return LayerNorm(cfg.d_model, cfg.norm_eps, bias=cfg.bias)


# --- feed-forward --------------------------------------------------------------------------------


class MLP(nn.Module):
    """Two-layer position-wise network W2 · act(W1 x) with ReLU or GELU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.hidden, bias=cfg.bias)
        self.down = nn.Linear(cfg.hidden, cfg.d_model, bias=cfg.bias)
        self.act = nn.ReLU() if cfg.ffn_kind == "relu" else nn.GELU()

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class SwiGLU(nn.Module):
    """Shazeer 2020: W2 (silu(W1 x) * W3 x), three matrices of hidden width."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.hidden, bias=cfg.bias)  # W1
        self.up = nn.Linear(cfg.d_model, cfg.hidden, bias=cfg.bias)  # W3
        self.down = nn.Linear(cfg.hidden, cfg.d_model, bias=cfg.bias)  # W2

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def make_ffn(cfg: ModelConfig) -> nn.Module:
    return SwiGLU(cfg) if cfg.ffn_kind == "swiglu" else MLP(cfg)


# --- position ------------------------------------------------------------------------------------


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: dim // 2])
    return table


class LearnedPosition(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.table = nn.Embedding(cfg.max_len, cfg.d_model)

    def forward(self, x):
        return x + self.table.weight[: x.shape[-2]]


class SinusoidalPosition(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)

    def forward(self, x):
        return x + self.table[: x.shape[-2]]


def make_position(cfg: ModelConfig) -> nn.Module:
    """Additive position signal at the input; RoPE and 'none' add nothing here (RoPE acts inside attention)."""
    if cfg.position == "learned":
        return LearnedPosition(cfg)
    if cfg.position == "sinusoidal":
        return SinusoidalPosition(cfg)
    return nn.Identity()


class RotaryEmbedding(nn.Module):
    """Su et al. 2021, in the rotate-half layout of Hugging Face Llama: rotates query/key pairs by position."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, positions):
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        x1, x2 = x.chunk(2, dim=-1)
        return x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()


# --- attention -----------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head attention with optional causal mask, grouped-query heads and RoPE.

    Self-attention reads keys and values from its own input; cross-attention (``memory`` given) reads them
    from the encoder output while its queries come from the decoder.
    """

    def __init__(self, cfg: ModelConfig, causal: bool = False, cross: bool = False):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.causal = causal
        self.q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=cfg.bias)
        self.k = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=cfg.bias)
        self.v = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=cfg.bias)
        self.o = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta) if cfg.position == "rope" and not cross else None

    def split_heads(self, x, heads):
        return x.unflatten(-1, (heads, self.head_dim)).transpose(-3, -2)  # (..., heads, time, head_dim)

    def forward(self, x, memory=None, positions=None):
        source = x if memory is None else memory
        q = self.split_heads(self.q(x), self.n_heads)
        k = self.split_heads(self.k(source), self.kv_heads)
        v = self.split_heads(self.v(source), self.kv_heads)
        if self.rope is not None:
            positions = torch.arange(x.shape[-2], device=x.device) if positions is None else positions
            q, k = self.rope(q, positions), self.rope(k, positions)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, enable_gqa=self.kv_heads != self.n_heads
        )
        return self.o(y.transpose(-3, -2).flatten(-2))
