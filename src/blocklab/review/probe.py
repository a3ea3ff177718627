"""Calling a user's block: the call itself (block(x), block(x, memory), a caller-side causal mask), the few facts
measured on the whole block (does the future leak, does the memory matter, which parameters follow d_model), and the
driver dataflow.LayerAnalysis reads the block's structure through. In float64 with dropout off."""
from __future__ import annotations

import math
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..model_config import ConfigError
from .build import SECOND_WIDTH_STEP, Builder, _parameters
from .structure import _changed, infer_width

TOL = 1e-9  # relative, in float64: a mask is exact, so anything above round-off is a real dependence
SEQ, MEMORY_SEQ, BATCH = 6, 9, 2


def causal_float_mask(length: int) -> torch.Tensor:
    return torch.triu(torch.full((length, length), float("-inf"), dtype=torch.float64), diagonal=1)


GENERIC_MASKS = ("mask", "attn_mask", "attention_mask")  # a block's own mask argument, after torch's names
# additive: 0 where a position may be read, -inf where not (torch's float masks); keep: True where it may be read
# (the Annotated Transformer's masked_fill(mask == 0, -inf)); hide: True where it may not (torch's boolean masks)
MASK_STYLES = ("additive", "keep", "hide")


def causal_mask(length: int, style: str = "additive") -> torch.Tensor:
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    return {"additive": causal_float_mask(length), "keep": allowed, "hide": ~allowed}[style]


class Caller:
    """block(x) for encoder/decoder roles, block(x, memory) for cross; optionally with a caller-side causal mask."""

    def __init__(self, module: nn.Module, role: str):
        self.module, self.role = module, role
        self.forward_params = _parameters(module.forward)
        self.seq_first = False  # the block reads (time, batch, d): torch's layers with batch_first=False
        self.mask_style = MASK_STYLES[0]
        self.overwritten = None  # the block's input before and after a call that wrote into it in place

    def mask_kwargs(self, length: int) -> dict | None:
        p, mask = self.forward_params, causal_mask(length, self.mask_style)
        if "tgt_mask" in p:
            return {"tgt_mask": mask, **({"tgt_is_causal": True} if "tgt_is_causal" in p else {})}
        if "src_mask" in p:
            return {"src_mask": mask, **({"is_causal": True} if "is_causal" in p else {})}
        if "is_causal" in p:
            return {"is_causal": True}
        name = next((n for n in GENERIC_MASKS if n in p), None)
        return {name: mask} if name else None

    def mask_styles(self) -> tuple[str, ...]:
        """The mask conventions worth trying: torch's named masks take its additive float mask; a block's own
        ``mask`` argument may want a boolean one, True where a position may be read or True where it may not."""
        return MASK_STYLES if any(n in self.forward_params for n in GENERIC_MASKS) and not any(
            n in self.forward_params for n in ("tgt_mask", "src_mask", "is_causal")) else MASK_STYLES[:1]

    def __call__(self, x, memory=None, masked: bool = False) -> torch.Tensor:
        kwargs = (self.mask_kwargs(x.shape[-2]) or {}) if masked else {}
        if self.seq_first:
            x, memory = x.transpose(0, 1), None if memory is None else memory.transpose(0, 1)
        # the block is handed copies: one that writes into its input in place (x.copy_(norm(x)), x.mul_(...)) must
        # not change the reviewer's own x; what it wrote is kept, the first time, for the review to say
        given, memory = x.clone(), None if memory is None else memory.clone()
        out = self.module(given, memory, **kwargs) if self.role == "cross" else self.module(given, **kwargs)
        if self.overwritten is None and _changed(given, x, x.abs().max().item()) > TOL:
            self.overwritten = {"before": x.detach().clone(), "after": given.detach().clone()}
        out = out[0] if isinstance(out, (tuple, list)) else out
        return (out.transpose(0, 1) if self.seq_first and torch.is_tensor(out) else out).detach()


# --- nn.MultiheadAttention, made observable ------------------------------------------------------


class _InProjection(nn.Module):
    """Rows [start, stop) of one of nn.MultiheadAttention's input weights, applied as a layer a hook can see."""

    def __init__(self, owner: nn.MultiheadAttention, weight: str, bias_offset: int, start: int, stop: int):
        super().__init__()
        self._owner = [owner]  # a list: not registered as a child (no cycle in named_modules)
        self.weight_name, self.bias_offset, self.start, self.stop = weight, bias_offset, start, stop

    @property
    def weight(self) -> torch.Tensor:
        return getattr(self._owner[0], self.weight_name)[self.start:self.stop]

    def forward(self, x):
        bias = self._owner[0].in_proj_bias
        b = None if bias is None else bias[self.bias_offset + self.start:self.bias_offset + self.stop]
        return F.linear(x, self.weight, b)


def _mha_forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                 average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention's math (F.multi_head_attention_forward, no bias_k/add_zero_attn), through hookable
    layers: the fused in-projection when query, key and value are one tensor, else one per input."""
    # which inputs are one tensor is decided before the layout change: transposed copies are new tensors
    same, kv_same = query is key is value, key is value
    if not self.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    E, H = self.embed_dim, self.num_heads
    if same:
        q, k, v = self.in_proj_fused(query).split(E, dim=-1)
    elif kv_same:
        q, (k, v) = self.in_proj_q(query), self.in_proj_kv(key).split(E, dim=-1)
    else:
        q, k, v = self.in_proj_q(query), self.in_proj_k(key), self.in_proj_v(value)
    B, T, S, hd = q.shape[0], q.shape[1], k.shape[1], E // H
    q, k, v = (t.reshape(B, -1, H, hd).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    if is_causal and attn_mask is None:
        attn_mask = causal_float_mask(T).to(scores.dtype)
    if attn_mask is not None:
        mask = attn_mask.reshape(-1, H, T, S) if attn_mask.dim() == 3 else attn_mask
        scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        scores = scores.masked_fill(pad, float("-inf")) if pad.dtype == torch.bool else scores + pad
    weights = F.dropout(scores.softmax(-1), self.dropout, self.training)
    out = self.out_proj((weights @ v).transpose(1, 2).reshape(B, T, E))
    if not self.batch_first:
        out = out.transpose(0, 1)
    if not need_weights:
        return out, None
    return out, weights.mean(1) if average_attn_weights else weights


def make_traceable(module: nn.Module) -> list[str]:
    """nn.MultiheadAttention applies its Q/K/V and output weights inside one function, where no hook sees them:
    each instance gets the same math through layers (the same parameters, nothing copied). Returns their names."""
    done = []
    for name, mha in list(module.named_modules()):
        if not isinstance(mha, nn.MultiheadAttention) or mha.bias_k is not None or mha.add_zero_attn:
            continue
        E = mha.embed_dim
        if mha._qkv_same_embed_dim:
            parts = {"in_proj_fused": ("in_proj_weight", 0, 0, 3 * E), "in_proj_q": ("in_proj_weight", 0, 0, E),
                     "in_proj_kv": ("in_proj_weight", 0, E, 3 * E)}
        else:
            parts = {"in_proj_q": ("q_proj_weight", 0, 0, E), "in_proj_k": ("k_proj_weight", E, 0, E),
                     "in_proj_v": ("v_proj_weight", 2 * E, 0, E)}
        for part, args in parts.items():
            mha.add_module(part, _InProjection(mha, *args))
        mha.forward = types.MethodType(_mha_forward, mha)
        done.append(name)
    return done


# --- the probe -----------------------------------------------------------------------------------


class Probe:
    """One built block, in float64 with dropout off, and the input it is called with."""

    def __init__(self, module: nn.Module, role: str, width: int, seed: int = 0):
        self.module = module.double().eval()
        self.traced_mha = make_traceable(self.module)
        self.role, self.width = role, width
        self.generator = torch.Generator().manual_seed(seed)
        self.refilled = self._refill_zeros()
        self.call = Caller(self.module, role)
        self.x = self.randn(BATCH, SEQ, width)
        self.memory = self.randn(BATCH, MEMORY_SEQ, width) if role == "cross" else None
        self.masked = False  # see use_caller_mask
        try:
            self.y = self.run(self.x)
        except Exception as err:
            how = "block(x, memory)" if role == "cross" else "block(x)"
            raise ConfigError(f"calling the block as {how} with x of shape {tuple(self.x.shape)} failed: "
                              f"{type(err).__name__}: {err}") from None
        if not torch.is_tensor(self.y) or tuple(self.y.shape) != tuple(self.x.shape):
            shape = tuple(self.y.shape) if torch.is_tensor(self.y) else type(self.y).__name__
            raise ConfigError(f"the block maps x of shape {tuple(self.x.shape)} to {shape}: a transformer block "
                              "keeps (batch, time, d_model)")
        self.scale = self.y.abs().max().item()
        self._find_layout()

    def _find_layout(self) -> None:
        """A block that mixes the batch elements (a change of element 0 moves element 1's output) reads its input as
        (time, batch, d), torch's default layout (batch_first=False): from then on it is called on x transposed."""
        other = self.x.clone()
        other[0] += self.randn(SEQ, self.width)
        if _changed(self.run(other)[1], self.y[1], self.scale) > TOL:
            self.call.seq_first = True
            self.y = self.run(self.x)
            self.scale = self.y.abs().max().item()

    def _refill_zeros(self) -> list[str]:
        """Parameters that are all zero at init (ReZero's alpha, a zero-initialised gate or output layer) silence
        what they multiply: the block would read as less than it is (a sub-layer that adds nothing, an FFN that
        does not read the attention). Each gets random values in [0.5, 1) for the probe; the names are returned.
        A gate's value at init does not change what the block is."""
        names = []
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                if p.numel() and not p.any():
                    p.copy_(0.5 + 0.5 * torch.rand(p.shape, dtype=p.dtype, generator=self.generator))
                    names.append(name)
        return names

    def use_caller_mask(self) -> None:
        """From now on every call passes the causal mask: the block only masks when the caller asks."""
        self.masked = True
        self.y = self.run(self.x)
        self.scale = self.y.abs().max().item()

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, generator=self.generator)

    def run(self, x, memory=None) -> torch.Tensor:
        # grad stays enabled: torch's fused inference fast path would bypass the sub-module hooks
        return self.call(x, self.memory if memory is None else memory, masked=self.masked)

    def causal(self) -> dict:
        leaks = []
        for cut in (SEQ - 1, SEQ // 2, 1):
            future = self.x.clone()
            future[:, cut:] += self.randn(BATCH, SEQ - cut, self.width)
            leaks.append(_changed(self.run(self.x)[:, :cut], self.run(future)[:, :cut], self.scale))
        return {"max_leak": max(leaks), "leaks": max(leaks) > TOL}

    def cross(self) -> dict:
        other = self.memory + self.randn(*self.memory.shape)
        changed = _changed(self.run(self.x), self.run(self.x, other), self.scale)
        return {"memory_length": MEMORY_SEQ, "target_length": SEQ, "memory_changes_output": changed > TOL}


def width_check(builder: Builder, width: int, first: nn.Module) -> dict:
    """Build at a second width and list the parameter dimensions that did not follow d_model."""
    if not builder.follows_width:
        return {"tested": False}
    second_width = width + SECOND_WIDTH_STEP
    try:
        second = builder.build(second_width)
    except ConfigError as err:
        return {"tested": True, "second_width": second_width, "error": str(err), "fixed": []}
    a, b = dict(first.named_parameters()), dict(second.named_parameters())
    common = sorted(a.keys() & b.keys())
    # the sizes of activations that meet the model width: the width itself, and a dimension that stays put in a
    # weight whose other dimension follows d_model (an FFN hidden width written as 256)
    widths = {width, infer_width(first)}  # asked for, and built at (a block that ignores its width argument)
    for n in common:
        if a[n].dim() == b[n].dim() and a[n].shape != b[n].shape:
            widths.update(s for s, t in zip(a[n].shape, b[n].shape) if s == t and s > 1)
    unchanged = [n for n in common if a[n].shape == b[n].shape and any(s > 1 for s in a[n].shape)]
    # a parameter that keeps its shape is a hard-coded width only if it has such a size; one sized by heads,
    # buckets or experts alone (T5's relative-bias table, a per-head temperature) does not scale with width by design
    fixed = [n for n in unchanged if widths & set(a[n].shape)]
    return {"tested": True, "second_width": second_width, "fixed": fixed, "parameters": len(a),
            "not_width_sized": [n for n in unchanged if n not in fixed],
            "built_width": infer_width(first), "second_built_width": infer_width(second)}


class BlockDriver:
    """The probed block as dataflow.LayerAnalysis drives a layer: x (any batch) -> block output, with the probe's
    memory (cross role) and the probe's caller mask when the block only masks on request."""

    def __init__(self, probe: Probe):
        self.probe, self.layer, self.width, self.seq = probe, probe.module, probe.width, SEQ
        self.memory_seq = MEMORY_SEQ if probe.role == "cross" else None
        self.seq_first = probe.call.seq_first  # the hooked tensors outside nn.MultiheadAttention are (time, batch, ...)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        memory = None if self.probe.memory is None else self.probe.memory[:1].expand(x.shape[0], -1, -1)
        return self.probe.call(x, memory, masked=self.probe.masked)
