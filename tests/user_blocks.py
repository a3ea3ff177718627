"""Blocks written the way users write them, for the reviewer's tests: correct ones in several house styles, and
mutants with one planted defect each. Nothing here imports blocklab: the reviewer must read them from their data
flow alone. Every expectation in tests/test_review_blocks.py is written from the forward() below it names.

House styles: nanoGPT (a config object, fused c_attn, nested attention and MLP modules), flat Llama (every
projection held by the block itself, RMSNorm written out, RoPE applied by hand), post-norm BERT-like, parallel
(GPT-J-like), sandwich, output norm, ALiBi; and norms inside the attention or the FFN (differential
attention, NormFormer, BitNet's sub-norms), a gated residual at zero (ReZero), parameters that do not scale with width
by design (T5's relative-bias table, a per-head temperature), torch's own layers in both layouts.
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
    """A broken block: the attention's output replaces the stream (no residual around the attention)."""

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


# --- norms inside the attention and the FFN, gated residuals, torch's own layers -----------------------


class DiffAttentionBlock(nn.Module):
    """Differential attention (Ye et al. 2024, the DIFF Transformer's multihead_diffattn.py, abridged): 2H query and
    key heads of head_dim = d / H / 2 (8 at d 64, H 4), H value heads of 2 * head_dim; per head
    (softmax(Q1 K1) - lambda softmax(Q2 K2)) V, then a per-head RMSNorm (subln, over 2 * head_dim) times
    (1 - lambda_init) BEFORE out_proj; RoPE on q and k; causal. Pre-norm RMSNorm around it and a SwiGLU FFN of
    hidden 176 (2.75x): x + out_proj(...)(norm1(x)), h + w2(silu(w1 n) * w3 n)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, depth: int = 1):
        super().__init__()
        self.h, self.hd = n_heads, d_model // n_heads // 2
        self.q_proj, self.k_proj = nn.Linear(d_model, d_model, bias=False), nn.Linear(d_model, d_model, bias=False)
        self.v_proj, self.out_proj = nn.Linear(d_model, d_model, bias=False), nn.Linear(d_model, d_model, bias=False)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(self.hd) * 0.1) for _ in range(4))
        self.subln = nn.RMSNorm(2 * self.hd, eps=1e-5)
        self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        hidden = 8 * (int(8 * d_model / 3) // 8 + 1)
        self.w1, self.w2, self.w3 = (nn.Linear(d_model, hidden, bias=False), nn.Linear(hidden, d_model, bias=False),
                                     nn.Linear(d_model, hidden, bias=False))
        cos, sin = rope_tables(self.hd, 256)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, 2 * self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, 2 * self.h, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.h, 2 * self.hd).transpose(1, 2)
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        scores = scores + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        weights = scores.softmax(-1).view(B, self.h, 2, T, T)
        lam = (torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
               + self.lambda_init)
        attn = (weights[:, :, 0] - lam * weights[:, :, 1]) @ v  # (B, H, T, 2 hd)
        attn = self.subln(attn) * (1 - self.lambda_init)
        return self.out_proj(attn.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        h = x + self.attention(self.norm1(x))
        n = self.norm2(h)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))


class NormFormerBlock(nn.Module):
    """NormFormer-style (Shleifer et al. 2021): pre-norm LayerNorm; attention whose heads are scaled by a learned
    per-head gain (head_scale, shape (heads,): it does not grow with d_model) and whose concatenated output goes
    through a LayerNorm BEFORE its output projection; FFN fc2(LN(gelu(fc1 x))), 4x, a LayerNorm after the
    activation; causal; no position signal in the block."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.h, self.hd = n_heads, d_model // n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.head_scale = nn.Parameter(torch.ones(n_heads))
        self.attn_ln = nn.LayerNorm(d_model)
        self.fc1, self.fc2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)
        self.ffn_ln = nn.LayerNorm(4 * d_model)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, self.hd).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        heads = (scores.softmax(-1) @ v) * self.head_scale.view(1, -1, 1, 1)
        return self.out(self.attn_ln(heads.transpose(1, 2).reshape(B, T, C)))

    def forward(self, x):
        h = x + self.attention(self.ln1(x))
        return h + self.fc2(self.ffn_ln(F.gelu(self.fc1(self.ln2(h)))))


class BitNetStyleBlock(nn.Module):
    """BitNet b1.58 as transformers' modeling_bitnet.py writes its layer (full-precision weights): pre-norm RMSNorm;
    GQA 4/2 with RoPE, attn_sub_norm (RMSNorm over the heads' output) BEFORE o_proj; gated ReLU² FFN
    down(ffn_sub_norm(relu(gate x)^2 * up x)), hidden 3 x d_model; causal."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2):
        super().__init__()
        self.h, self.kv, self.hd = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.attn_sub_norm, self.input_layernorm, self.post_attention_layernorm = (
            RMSNorm(d_model) for _ in range(3))
        self.gate_proj, self.up_proj = nn.Linear(d_model, 3 * d_model, bias=False), nn.Linear(d_model, 3 * d_model,
                                                                                              bias=False)
        self.down_proj, self.ffn_sub_norm = nn.Linear(3 * d_model, d_model, bias=False), RMSNorm(3 * d_model)
        cos, sin = rope_tables(self.hd, 256)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        q = rotate(self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2), self.cos, self.sin)
        k = rotate(self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2), self.cos, self.sin)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        k, v = k.repeat_interleave(self.h // self.kv, dim=1), v.repeat_interleave(self.h // self.kv, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        scores = scores + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        return self.o_proj(self.attn_sub_norm(out))

    def forward(self, x):
        h = x + self.attention(self.input_layernorm(x))
        n = self.post_attention_layernorm(h)
        return h + self.down_proj(self.ffn_sub_norm(F.relu(self.gate_proj(n)).square() * self.up_proj(n)))


class ReZeroBlock(nn.Module):
    """ReZero (Bachlechner et al. 2020): x + alpha * attn(x), h + alpha * ffn(h), one scalar alpha initialised to 0
    and NO norm anywhere; at init the block is the identity. Causal, no position, ReLU FFN 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.attn, self.ffn = SelfAttention(d_model, n_heads), FeedForward(d_model)
        self.alpha = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        h = x + self.alpha * self.attn(x)
        return h + self.alpha * self.ffn(h)


class T5StyleBlock(nn.Module):
    """T5's encoder layer (modeling_t5.py, abridged): pre-norm T5LayerNorm (RMSNorm written out), q/k/v/o without
    bias, no 1/sqrt(d) scaling, a learned relative-position bias table relative_attention_bias of (32 buckets,
    heads) added to the logits (bidirectional buckets, max distance 128): its shape does not follow d_model by design;
    ReLU FFN wo(relu(wi x)), 4x; bidirectional."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.h, self.hd, self.num_buckets, self.max_distance = n_heads, d_model // n_heads, num_buckets, max_distance
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)
        self.norm1, self.norm2 = RMSNorm(d_model), RMSNorm(d_model)
        self.wi, self.wo = nn.Linear(d_model, 4 * d_model, bias=False), nn.Linear(4 * d_model, d_model, bias=False)

    def bucket(self, relative):
        half = self.num_buckets // 2
        out = (relative > 0).long() * half
        n = relative.abs()
        exact = half // 2
        large = exact + (torch.log(n.double() / exact + 1e-30) / math.log(self.max_distance / exact)
                         * (half - exact)).long()
        return out + torch.where(n < exact, n, large.clamp(max=half - 1))

    def forward(self, x):
        B, T, C = x.shape
        n = self.norm1(x)
        q, k, v = (p(n).view(B, T, self.h, self.hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        pos = torch.arange(T)
        bias = self.relative_attention_bias(self.bucket(pos[None, :] - pos[:, None])).permute(2, 0, 1)
        scores = q @ k.transpose(-2, -1) + bias.to(x.dtype)
        h = x + self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))
        return h + self.wo(F.relu(self.wi(self.norm2(h))))


class TemperatureBlock(nn.Module):
    """Attention with a learned per-head temperature (as Swin v2's logit_scale, shape (heads, 1, 1): it does not grow
    with d_model): logits q.k / sqrt(head_dim) * exp(logit_scale), no norm on q or k; pre-norm nn.RMSNorm, ReLU FFN
    4x, causal, no position."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.h, self.hd = n_heads, d_model // n_heads
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.logit_scale = nn.Parameter(torch.zeros(n_heads, 1, 1) + 0.5)
        self.norm1, self.norm2, self.ffn = nn.RMSNorm(d_model), nn.RMSNorm(d_model), FeedForward(d_model)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, self.hd).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd) * self.logit_scale.exp()
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        h = x + self.attention(self.norm1(x))
        return h + self.ffn(self.norm2(h))


class TorchMHABlock(nn.Module):
    """Pre-norm around torch's own nn.MultiheadAttention (4 heads) and a ReLU FFN 4x, bidirectional. With
    batch_first=False (torch's default) the block transposes its (batch, time, d) input to (time, batch, d) for the
    attention and back."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, batch_first: bool = True):
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=batch_first)
        self.norm1, self.norm2, self.ffn = nn.LayerNorm(d_model), nn.LayerNorm(d_model), FeedForward(d_model)

    def forward(self, x):
        n = self.norm1(x) if self.batch_first else self.norm1(x).transpose(0, 1)
        a = self.attn(n, n, n, need_weights=False)[0]
        h = x + (a if self.batch_first else a.transpose(0, 1))
        return h + self.ffn(self.norm2(h))


class TorchMHABlockSeqFirst(TorchMHABlock):
    """TorchMHABlock with nn.MultiheadAttention in torch's default layout, batch_first=False."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads, batch_first=False)


def seq_first_encoder_layer(d_model: int = 64):
    """torch's nn.TransformerEncoderLayer in its default layout (batch_first=False: it reads (time, batch, d)),
    pre-norm (norm_first=True), 4 heads, ReLU FFN 4x, no dropout; called as block(x) on (batch, time, d), it would
    mix the batch: the reviewer must find the layout."""
    return nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0, norm_first=True)


class BlockNormalisedResidual(Block):
    """The residual carries the normalised stream: h = ln_1(x) + attn(ln_1(x)), h = ln_2(h) + mlp(ln_2(h)); the raw
    x never reaches the output (across a stack this is post-norm: norm(h + F(h)))."""

    def forward(self, x):
        n = self.ln_1(x)
        x = n + self.attn(n)
        n = self.ln_2(x)
        return n + self.mlp(n)


class BlockNoOutputProjection(Block):
    """nanoGPT's block with the attention's output projection removed: the heads' concatenated output is added to
    the stream as it is (no c_proj)."""

    def __init__(self, config):
        super().__init__(config)
        del self.attn.c_proj

    def forward(self, x):
        a = self.attn
        B, T, C = x.shape
        q, k, v = (t.view(B, T, a.n_head, C // a.n_head).transpose(1, 2)
                   for t in a.c_attn(self.ln_1(x)).split(a.n_embd, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(a.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
        x = x + (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return x + self.mlp(self.ln_2(x))


class ConvMixerBlock(nn.Module):
    """No attention: tokens mixed by a causal depthwise convolution of width 3 (x + conv(norm1(x)) through a linear
    in and out), then a ReLU FFN 4x; pre-norm nn.RMSNorm."""

    def __init__(self, d_model: int = 64):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.inp, self.out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size=3, groups=d_model, padding=2)
        self.ffn = FeedForward(d_model)

    def forward(self, x):
        T = x.shape[1]
        mixed = self.conv(self.inp(self.norm1(x)).transpose(1, 2))[..., :T].transpose(1, 2)
        h = x + self.out(mixed)
        return h + self.ffn(self.norm2(h))
