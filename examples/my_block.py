"""A pre-norm transformer block written the way nanoGPT writes one: copy this file, edit ``Block``, and run

    blocklab lab --module my_block.py:Block --out lab/mine           # the stability lab (document 000's copy task)
    blocklab review --module my_block.py:Block --role decoder        # the block reviewer (document 004's checklist)

The lab and the reviewer build it as ``Block(BlockConfig(n_embd=<the lab's width>, n_head=<its heads>))``: the
constructor's first argument is named ``config`` and ``BlockConfig`` is the one dataclass of this file with a width
field (``n_embd``), so they set the width and the head count, set every dropout field to 0, and leave the rest at its
default (``--kwargs '{"mlp_ratio": 2}'`` sets another field). ``forward`` takes the residual stream ``x`` of shape (batch, time, n_embd) and returns the same shape; a
position must not read later ones (the causal mask is applied here, not by the caller). The lab stacks copies of the
block, adds a final LayerNorm after the last one when the reviewer reads the block as pre-norm, and trains the stack.

Nothing here imports blocklab: the file is yours.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn


@dataclass
class BlockConfig:
    n_embd: int = 128  # the stream's width (the lab sets it)
    n_head: int = 4  # attention heads (the lab sets it)
    dropout: float = 0.0  # the lab and the reviewer set every dropout field to 0
    bias: bool = True  # biases in the linear layers and the LayerNorms
    mlp_ratio: int = 4  # the MLP's hidden width over n_embd


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention over earlier positions only (nanoGPT's, with its flash path)."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_head must divide n_embd"
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # query, key, value in one
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.dropout = config.n_head, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: BlockConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_ratio * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(config.mlp_ratio * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x)). For post-norm, write x = self.ln_1(x + self.attn(x)) and
    x = self.ln_2(x + self.mlp(x)); the lab then adds no final norm, as the reviewer reads the placement."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x
