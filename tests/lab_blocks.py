"""Blocks written as a user would, for the stability lab's tests (`blocklab lab --module tests/lab_blocks.py:NAME`)."""
import torch
import torch.nn.functional as F
from torch import nn


class TinyPreNormBlock(nn.Module):
    """h + Attn(LN(h)), then h + MLP(LN(h)): causal, in the user's own style (no blocklab import)."""

    def __init__(self, d_model: int, n_heads: int = 2):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def attend(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, h):
        h = h + self.attend(self.ln1(h))
        return h + self.down(F.gelu(self.up(self.ln2(h))))


class NaNAfterStepsBlock(TinyPreNormBlock):
    """The pre-norm block, whose output turns NaN once its weights have moved (after the first optimizer step): a run
    of it must end as `diverged`, and the lab must go on."""

    def __init__(self, d_model: int, n_heads: int = 2):
        super().__init__(d_model, n_heads)
        self.register_buffer("start", self.proj.bias.detach().clone())

    def forward(self, h):
        out = super().forward(h)
        moved = bool((self.proj.bias - self.start).abs().sum() > 0)
        return out * float("nan") if moved else out


class WideningBlock(nn.Module):
    """Changes the stream's width: the lab must refuse it (exit 3) before any training."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model + 1)

    def forward(self, h):
        return self.proj(h)


class PeekingBlock(TinyPreNormBlock):
    """Bidirectional attention: on the copy task it would read the answer; the lab must refuse it (exit 3)."""

    def attend(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=False)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SlowPreNormBlock(TinyPreNormBlock):
    """The pre-norm block, slowed while training (0.4 s a call with gradients on): a run of the tiny profile lasts
    long enough to be interrupted between two checkpoints, whatever the machine's speed."""

    def forward(self, h):
        if torch.is_grad_enabled():
            import time

            time.sleep(0.4)
        return super().forward(h)


class NaNWeightsBlock(TinyPreNormBlock):
    """The pre-norm block with one NaN in its output projection at init: the lab must refuse it (exit 3) saying NaN
    and where, not that it is not causal."""

    def __init__(self, d_model: int, n_heads: int = 2):
        super().__init__(d_model, n_heads)
        with torch.no_grad():
            self.proj.weight[0, 0] = float("nan")
