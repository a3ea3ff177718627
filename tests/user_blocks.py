"""Blocks written the way users write them, for the reviewer's tests: correct ones in several house styles, and
mutants with one planted defect each. Nothing here imports blocklab: the reviewer must read them from their data
flow alone. Every expectation in tests/test_review_blocks.py is written from the forward() below it names.

House styles: nanoGPT (a config object, fused c_attn, nested attention and MLP modules), flat Llama (every
projection held by the block itself, RMSNorm written out, RoPE applied by hand), post-norm BERT-like, parallel
(GPT-J-like), sandwich, output norm, ALiBi.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


# --- nanoGPT (Karpathy's model.py, abridged; dropout kept as in the original, the reviewer builds it at 0) -------


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """nanoGPT's block: pre-norm LayerNorm, causal MHA, GELU MLP 4x, x + attn(ln_1(x)), x + mlp(ln_2(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class BlockDroppedAttentionResidual(Block):
    """The issue's block: the attention's output replaces the stream (no residual around the attention)."""

    def forward(self, x):
        x = self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class BlockDroppedMLPResidual(Block):
    """No residual around the MLP: its output is the block's output."""

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return self.mlp(self.ln_2(x))


class BlockNoMask(Block):
    """The causal mask forgotten: every position sees the future."""

    def __init__(self, config):
        super().__init__(config)
        self.attn.bias.fill_(1.0)


class BlockMaskOffByOne(Block):
    """tril(diagonal=1): each position also sees the next one; a mask defect, and no position signal."""

    def __init__(self, config):
        super().__init__(config)
        size = self.attn.bias.shape[-1]
        self.attn.bias.copy_(torch.tril(torch.ones(size, size), diagonal=1).view(1, 1, size, size))


class BlockNormsBypassed(Block):
    """ln_1 is computed but its output is thrown away: the attention reads the raw stream (FFN still pre-norm)."""

    def forward(self, x):
        self.ln_1(x)
        x = x + self.attn(x)
        x = x + self.mlp(self.ln_2(x))
        return x


class BlockNarrowMLP(Block):
    """The MLP is 1.5x wide: below the 2x rule."""

    def __init__(self, config):
        super().__init__(config)
        hidden = 3 * config.n_embd // 2
        self.mlp.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.mlp.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)


# --- Llama written flat: every projection is the block's own attribute ------------------------------------------


class RMSNorm(nn.Module):
    """Meta's llama/model.py RMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, length: int, theta: float = 10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """Rotate pairs (x[2i], x[2i+1]) by position: x is (batch, heads, time, head_dim)."""
    T = x.shape[-2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class FlatLlamaBlock(nn.Module):
    """Llama from scratch: RMSNorm written by hand, GQA (4 query heads, 2 K/V heads), RoPE applied by hand, SwiGLU
    w2(silu(w1 x) * w3 x) with hidden 8/3 dim rounded to a multiple of 8 (176 at dim 64: 2.75x); causal; every
    projection is the block's own attribute (no attention or FFN sub-module)."""

    def __init__(self, dim: int = 64, n_heads: int = 4, n_kv_heads: int = 2, eps: float = 1e-6):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim, self.eps = n_heads, n_kv_heads, dim // n_heads, eps
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        hidden = 8 * (int(8 * dim / 3) // 8 + 1)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(dim, eps), RMSNorm(dim, eps)
        cos, sin = rope_tables(self.head_dim, 256)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def attention(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        repeat = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        scores = scores + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
        return self.wo(out)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        n = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))


class FlatLlamaMQA(FlatLlamaBlock):
    """The same block with one K/V head (MQA)."""

    def __init__(self, dim: int = 64, n_heads: int = 4):
        super().__init__(dim, n_heads, n_kv_heads=1)


class FlatLlamaDroppedFFNResidual(FlatLlamaBlock):
    """The flat block with the FFN's residual forgotten: its output replaces the stream."""

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        n = self.ffn_norm(h)
        return self.w2(F.silu(self.w1(n)) * self.w3(n))


# --- other house styles (nested, separate Q/K/V, nn.LayerNorm) ----------------------------------------------------


class SelfAttention(nn.Module):
    """Separate q/k/v projections; optional ALiBi; causal or not."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = True, alibi: bool = False):
        super().__init__()
        self.h, self.hd, self.causal, self.alibi = n_heads, d_model // n_heads, causal, alibi
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.h, self.hd).transpose(1, 2) for p in (self.query, self.key, self.value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        if self.alibi:  # Press et al.: slope 2^(-8 h / H) per head, times -distance
            slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / self.h) for i in range(self.h)], dtype=x.dtype)
            pos = torch.arange(T)
            distance = (pos[None, :] - pos[:, None]).abs().to(x.dtype)
            scores = scores - slopes[:, None, None] * distance
        if self.causal:
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ratio: int = 4):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, ratio * d_model), nn.Linear(ratio * d_model, d_model)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class PostNormEncoderBlock(nn.Module):
    """BERT-like: LN(x + attn(x)), LN(h + ffn(h)); bidirectional; ReLU FFN 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.attn, self.ffn = SelfAttention(d_model, n_heads, causal=False), FeedForward(d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x):
        h = self.norm1(x + self.attn(x))
        return self.norm2(h + self.ffn(h))


class ParallelBlock(nn.Module):
    """GPT-J-like: x + attn(ln(x)) + ffn(ln(x)), one norm read by both; causal, ALiBi."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.attn, self.ffn = SelfAttention(d_model, n_heads, alibi=True), FeedForward(d_model)

    def forward(self, x):
        n = self.ln(x)
        return x + self.attn(n) + self.ffn(n)


class SandwichBlock(nn.Module):
    """Gemma-2-like: x + post(attn(pre(x))), the same around the FFN; RMSNorm modules; causal, no position."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.attn, self.ffn = SelfAttention(d_model, n_heads), FeedForward(d_model)
        self.pre1, self.post1, self.pre2, self.post2 = (nn.RMSNorm(d_model) for _ in range(4))

    def forward(self, x):
        h = x + self.post1(self.attn(self.pre1(x)))
        return h + self.post2(self.ffn(self.pre2(h)))


class OutputNormBlock(nn.Module):
    """OLMo-2-like: x + norm(attn(x)), h + norm(ffn(h)); causal."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.attn, self.ffn = SelfAttention(d_model, n_heads), FeedForward(d_model)
        self.n1, self.n2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)

    def forward(self, x):
        h = x + self.n1(self.attn(x))
        return h + self.n2(self.ffn(h))


class NoNormBlock(nn.Module):
    """Residuals, but no norm anywhere: x + attn(x), h + ffn(h)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.attn, self.ffn = SelfAttention(d_model, n_heads), FeedForward(d_model)

    def forward(self, x):
        h = x + self.attn(x)
        return h + self.ffn(h)
