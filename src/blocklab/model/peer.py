"""A peer baseline for `blocklab bench`: the copy-task model as a careful user would write it, in the common style of
public GPT implementations (nanoGPT's model.py and the like), not our readable modules.

Same size and task as the sweep's model (``copy_model`` of params.yaml: 24 blocks, d 128, 4 heads, MLP 4x GELU,
biases, untied head, sinusoidal positions, post- or pre-norm), written the usual way: one fused qkv ``nn.Linear``,
``F.scaled_dot_product_attention(is_causal=True)``, ``nn.LayerNorm``, ``nn.GELU``; the bench trains it with
``torch.optim.Adam(fused=True)`` (nanoGPT's ``AdamW(fused=True)`` at weight decay 0 is the same update and kernel). Its parameters have the same shapes and its step the
same FLOPs; it is not meant to reproduce our losses (its weights are laid out and initialized its own way). Used only to
time a training step; never by the pipeline.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import sinusoidal_table


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, bias: bool = True):
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.c_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, bias: bool = True):
        super().__init__()
        self.c_fc = nn.Linear(d_model, hidden, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, hidden: int, pre_norm: bool, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.pre_norm = pre_norm
        self.ln_1 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.attn = CausalSelfAttention(d_model, n_heads, bias)
        self.ln_2 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.mlp = MLP(d_model, hidden, bias)

    def forward(self, x):
        if self.pre_norm:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class PeerGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.ffn_kind != "gelu" or cfg.norm_kind != "layernorm" or cfg.position not in ("sinusoidal", "learned"):
            raise ValueError("the peer model is the GELU / LayerNorm / additive-position GPT only")
        if cfg.norm_position not in ("pre", "post"):
            raise ValueError(f"the peer model is GPT-2's pre- or post-norm block only, not {cfg.norm_position!r}")
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.position == "learned":
            self.wpe = nn.Embedding(cfg.max_len, cfg.d_model)
        else:
            self.register_buffer("wpe_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        pre = cfg.norm_position == "pre"
        self.h = nn.ModuleList(Block(cfg.d_model, cfg.n_heads, cfg.hidden, pre, cfg.norm_eps, cfg.bias) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias) if pre else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = self.wpe.weight[:t] if hasattr(self, "wpe") else self.wpe_table[:t]
        x = self.wte(idx) + pos
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_peer_model(cfg, seed: int) -> PeerGPT:
    torch.manual_seed(seed)
    return PeerGPT(cfg)

