"""The sweep's fast training path: the same model and numbers as the plain path, fewer and cheaper kernels on a CPU.

The plain modules in layers.py are written to be read; this module puts in their place equivalents that do the same
arithmetic in fewer kernels. Each fast module is built from the plain one it replaces and holds that module's very own
parameters and sub-modules under the same names, so the model's Parameter objects and state-dict keys do not change:
checkpoints, optimizer state and safetensors files are the same for both paths, and a run may resume on either. Each
replacement is exact up to float rounding (tests/test_fast_path.py); measured gains are in performance/README.md.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Attention, LayerNorm


class FusedLayerNorm(LayerNorm):
    """LayerNorm as one ATen kernel forward and one backward instead of ~10 eager ops; same parameters and keys."""

    def __init__(self, norm: LayerNorm):
        super().__init__(norm.weight.numel(), norm.eps, bias=norm.bias is not None)
        self.weight, self.bias = norm.weight, norm.bias  # norm's own parameters, in the slots just made for them

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class CausalAttentionFunction(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v on (batch*heads, time, head_dim) tensors, with the textbook backward.
    ``observe(scores, probs)``, when given, is shown the step's own scores and weights (the training diagnostics read
    them instead of recomputing them); it may use ``scores`` as scratch (nothing reads them after the softmax), and
    only reads ``probs``."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, observe=None):
        scores = torch.baddbmm(mask, q, k.transpose(-1, -2), alpha=scale)
        if scores.dtype == torch.float32:
            probs = torch.softmax(scores, dim=-1)
        else:  # bf16 autocast: ATen's CPU softmax is ~2.5x slower in bf16 than fp32-out here (4.9 vs 1.8 ms a layer)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
        if observe is not None:
            observe(scores, probs)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return torch.bmm(probs, v)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_v = torch.bmm(probs.transpose(-1, -2), grad_out)
        grad_scores = torch._softmax_backward_data(torch.bmm(grad_out, v.transpose(-1, -2)), probs, -1, probs.dtype)
        grad_q = torch.bmm(grad_scores, k).mul_(ctx.scale)
        grad_k = torch.bmm(grad_scores.transpose(-1, -2), q).mul_(ctx.scale)
        return (grad_q, grad_k, grad_v) + (None,) * (len(ctx.needs_input_grad) - 3)  # mask, scale[, observe]


class FastAttention(Attention):
    """An Attention built from a plain one: its settings and its own q, k, v, o and RoPE modules (same keys)."""

    def __init__(self, attn: Attention):
        nn.Module.__init__(self)  # not Attention.__init__: it would draw fresh weights; these modules are attn's
        self.n_heads, self.kv_heads, self.head_dim, self.causal = attn.n_heads, attn.kv_heads, attn.head_dim, attn.causal
        self.q, self.k, self.v, self.o, self.rope = attn.q, attn.k, attn.v, attn.o, attn.rope


class ShortCausalAttention(FastAttention):
    """Causal self-attention for short sequences on the CPU; every other case takes Attention's own path.

    The CPU flash kernel behind F.scaled_dot_product_attention is blocked for long sequences. At T = 63 and
    head_dim 32 its online softmax and zero-filled gradient buffers cost ~2x plain bmm-softmax-bmm (measured here:
    7.7 vs 4.1 ms forward + backward for the attention core of one layer, 22.6 vs 18.4 ms for the whole sub-layer
    with its projections). Same arithmetic, different rounding (~1e-6).
    ``observe``: None, or a callable shown each forward's scores and weights (``CausalAttentionFunction``).
    """
    observe = None

    def forward(self, x, memory=None, positions=None):
        if memory is not None or not self.causal or self.rope is not None or self.kv_heads != self.n_heads or x.is_cuda:
            return super().forward(x, memory, positions)
        *batch, time_, _ = x.shape
        # One GEMM for q, k and v, and one copy into head-major order (three strided copies otherwise).
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        bias = torch.cat([self.q.bias, self.k.bias, self.v.bias]) if self.q.bias is not None else None
        qkv = F.linear(x, weight, bias).view(-1, time_, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, -1, time_, self.head_dim).unbind(0)
        mask = torch.full((time_, time_), float("-inf"), dtype=x.dtype, device=x.device).triu_(1)
        observed = () if self.observe is None else (self.observe,)
        y = CausalAttentionFunction.apply(q, k, v, mask, self.head_dim**-0.5, *observed)
        return self.o(y.view(*batch, self.n_heads, time_, self.head_dim).transpose(-3, -2).flatten(-2))


class MathCausalAttention(FastAttention):
    """Causal self-attention in plain differentiable ops (matmul, masked softmax, matmul) for ``torch.func.vmap``.

    vmap batches these ops across stacked members; it has no batching rule for the CPU flash kernel behind
    F.scaled_dot_product_attention and falls back to a loop over members there. Same arithmetic (~1e-6).
    """

    def forward(self, x, memory=None, positions=None):
        if memory is not None or not self.causal or self.rope is not None or self.kv_heads != self.n_heads:
            return super().forward(x, memory, positions)
        q, k, v = (self.split_heads(projection(x), self.n_heads) for projection in (self.q, self.k, self.v))
        time_ = x.shape[-2]
        future = torch.ones(time_, time_, dtype=torch.bool, device=x.device).triu_(1)
        scores = (q @ k.transpose(-1, -2) * self.head_dim**-0.5).masked_fill(future, float("-inf"))
        return self.o((scores.softmax(-1) @ v).transpose(-3, -2).flatten(-2))


def _replace(model: nn.Module, plain: type, fast: type) -> int:
    """Put ``fast(module)`` in the place of every module of ``model`` whose type is exactly ``plain``; returns how many.

    The fast module holds the plain one's own parameters (see the top), so optimizers, checkpoints and safetensors
    files are unaffected. Hooks registered on a replaced module do not move with it: replace before adding any.
    """
    places = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
              if type(child) is plain]
    for parent, name, child in places:
        module = fast(child)
        module.training = child.training
        setattr(parent, name, module)
    return len(places)


def fuse_layernorms(model) -> int:
    """Put a FusedLayerNorm in the place of every LayerNorm inside ``model``; returns how many were replaced."""
    return _replace(model, LayerNorm, FusedLayerNorm)


def use_short_causal_attention(model) -> int:
    """Put a ShortCausalAttention in the place of every Attention inside ``model``; returns how many were replaced."""
    return _replace(model, Attention, ShortCausalAttention)


def use_math_attention(model) -> int:
    """Put a MathCausalAttention (for vmap) in the place of every Attention inside ``model``; returns how many."""
    return _replace(model, Attention, MathCausalAttention)


def tune_allocator() -> bool:
    """Stop glibc from returning freed activation buffers to the kernel after every step.

    With the default (dynamic) mmap and trim thresholds one step of the copy model page-faults ~110 MB back in
    (~28k minor faults, ~10% of a one-thread step on the 2-core test machine). Numbers are unaffected.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


@dataclass(frozen=True)
class FastPath:
    """What the fast path switches on. Each is exact up to float rounding (see tests/test_fast_path.py)."""

    fused_layernorm: bool = True
    short_attention: bool = True
    fused_adam: bool = True
    allocator: bool = True
    compile: bool = False  # measured here: no faster than fused eager on 1 thread/process, and it costs compile time

    def describe(self) -> str:
        on = [name for name in ("fused_layernorm", "short_attention", "fused_adam", "allocator", "compile") if getattr(self, name)]
        return "+".join(on) or "plain"


PLAIN = FastPath(fused_layernorm=False, short_attention=False, fused_adam=False, allocator=False, compile=False)


def apply_fast_path(model: torch.nn.Module, fast: FastPath) -> torch.nn.Module:
    """Replace ``model``'s modules by the fast kernels that ``fast`` asks for (in place) and tune the allocator."""
    if fast.fused_layernorm:
        fuse_layernorms(model)
    if fast.short_attention:
        use_short_causal_attention(model)
    if fast.allocator:
        tune_allocator()
    return model
