"""Calling a user's block and measuring it: every fact comes from calling the block (or one of its sub-modules) on
chosen inputs, in float64 with dropout off."""
from __future__ import annotations

import torch
from torch import nn

from ...config import ConfigError
from .build import SECOND_WIDTH_STEP, Builder, _parameters
from .structure import _changed, _rms, find_attention, find_norms, infer_width, norm_kind

SCALE = 1000.0
TOL = 1e-9  # relative, in float64: a mask is exact, so anything above round-off is a real dependence
SEQ, MEMORY_SEQ, BATCH = 6, 9, 2



def causal_float_mask(length: int) -> torch.Tensor:
    return torch.triu(torch.full((length, length), float("-inf"), dtype=torch.float64), diagonal=1)


class Caller:
    """block(x) for encoder/decoder roles, block(x, memory) for cross; optionally with a caller-side causal mask."""

    def __init__(self, module: nn.Module, role: str):
        self.module, self.role = module, role
        self.forward_params = _parameters(module.forward)

    def mask_kwargs(self, length: int) -> dict | None:
        p, mask = self.forward_params, causal_float_mask(length)
        if "tgt_mask" in p:
            return {"tgt_mask": mask, **({"tgt_is_causal": True} if "tgt_is_causal" in p else {})}
        if "src_mask" in p:
            return {"src_mask": mask, **({"is_causal": True} if "is_causal" in p else {})}
        if "is_causal" in p:
            return {"is_causal": True}
        return None

    def __call__(self, x, memory=None, masked: bool = False) -> torch.Tensor:
        kwargs = (self.mask_kwargs(x.shape[-2]) or {}) if masked else {}
        out = self.module(x, memory, **kwargs) if self.role == "cross" else self.module(x, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.detach()


# --- hooks ---------------------------------------------------------------------------------------


def _zero_output(module, args, output):
    if isinstance(output, tuple):
        return (torch.zeros_like(output[0]), *output[1:])
    return torch.zeros_like(output)


class Silenced:
    """Within the block, the given sub-modules return zeros."""

    def __init__(self, modules):
        self.modules, self.handles = list(modules), []

    def __enter__(self):
        self.handles = [m.register_forward_hook(_zero_output) for m in self.modules]

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def record_linears(module: nn.Module, skip_prefixes, run) -> list[tuple[str, nn.Linear, torch.Tensor, torch.Tensor]]:
    """(name, layer, input, output) of every Linear outside attention, in the order the forward pass calls them."""
    calls, handles = [], []
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear) and not any(name == p or name.startswith(p + ".") for p in skip_prefixes):
            handles.append(sub.register_forward_hook(
                lambda m, args, out, name=name: calls.append((name, m, args[0].detach(), out.detach()))))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return calls


def attention_roles(module: nn.Module, attentions: dict, run, memory_len: int) -> dict[str, str]:
    """'cross' for an attention module that receives a tensor with the memory's length, else 'self'."""
    seen, handles = {}, []
    for name, attn in attentions.items():
        def hook(m, args, kwargs, name=name):
            lengths = {a.shape[-2] for a in [*args, *kwargs.values()] if torch.is_tensor(a) and a.dim() >= 2}
            seen[name] = "cross" if memory_len in lengths else seen.get(name, "self")
        handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return {name: seen.get(name, "unused") for name in attentions}


# --- the probes ----------------------------------------------------------------------------------


class Probe:
    """Everything measured on one built block, in float64 with dropout off."""

    def __init__(self, module: nn.Module, role: str, width: int, seed: int = 0):
        self.module = module.double().eval()
        self.role, self.width = role, width
        self.generator = torch.Generator().manual_seed(seed)
        self.call = Caller(self.module, role)
        self.x = self.randn(BATCH, SEQ, width)
        self.memory = self.randn(BATCH, MEMORY_SEQ, width) if role == "cross" else None
        self.attentions = find_attention(self.module)
        self.masked = False  # see use_caller_mask
        try:
            self.y = self.run(self.x)
        except Exception as err:
            how = "block(x, memory)" if role == "cross" else "block(x)"
            raise ConfigError(f"calling the block as {how} with x of shape {tuple(self.x.shape)} failed: "
                              f"{type(err).__name__}: {err}") from None
        self.scale = self.y.abs().max().item()

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

    def depends_on_input(self) -> bool:
        return _changed(self.run(self.x), self.run(self.x + self.randn(*self.x.shape)), self.scale) > TOL

    # each returns plain facts; the rules turn them into findings

    def norm_position(self) -> dict:
        big = SCALE * self.x
        out = self.run(big)
        residual_fraction, scale_ratio = _rms(out - big) / _rms(big), _rms(out) / _rms(big)
        position = "pre" if residual_fraction < 0.02 else "post" if scale_ratio < 0.02 else "none"
        return {"position": position, "residual_fraction_at_1000x": residual_fraction,
                "output_scale_ratio_at_1000x": scale_ratio, "output_row_rms_at_1000x": _rms(out)}

    def norm_kinds(self) -> dict:
        norms = find_norms(self.module, self.width)
        return {name: norm_kind(norm, self.width, self.generator) for name, norm in norms.items()}

    def causal(self) -> dict:
        leaks, sees = [], []
        for cut in (SEQ - 1, SEQ // 2, 1):
            future = self.x.clone()
            future[:, cut:] += self.randn(BATCH, SEQ - cut, self.width)
            y, y2 = self.run(self.x), self.run(future)
            leaks.append(_changed(y[:, :cut], y2[:, :cut], self.scale))
            sees.append(_changed(y[:, cut:], y2[:, cut:], self.scale))
        return {"max_leak": max(leaks), "leaks": max(leaks) > TOL, "future_positions_respond": max(sees) > TOL}

    def residuals(self, ffn: dict | None) -> dict:
        """For each sub-layer: does the block output still depend on its input when that sub-layer is silenced?"""
        targets = dict(self.attentions)
        if ffn:
            targets["ffn"] = dict(self.module.named_modules())[ffn["down"]]
        out = {}
        for name, sub in targets.items():
            with Silenced([sub]):
                out[name] = self.depends_on_input()
        return out

    def cross(self) -> dict:
        other = self.memory + self.randn(*self.memory.shape)
        changed = _changed(self.run(self.x), self.run(self.x, other), self.scale)
        return {"memory_length": MEMORY_SEQ, "target_length": SEQ, "output_shape": list(self.y.shape),
                "keeps_target_shape": tuple(self.y.shape) == tuple(self.x.shape),
                "memory_changes_output": changed > TOL}

    def position_signal(self, causal: bool) -> dict:
        if not causal:  # bidirectional: permuting the tokens should permute the output, nothing more
            perm = torch.randperm(SEQ, generator=self.generator)
            moved = _changed(self.run(self.x[:, perm]), self.y[:, perm], self.scale)
            return {"test": "permutation equivariance", "deviation": moved, "position_aware": moved > TOL}
        # causal: the last token attends to a set of earlier tokens; without positions their order cannot matter
        perm = torch.cat([torch.randperm(SEQ - 1, generator=self.generator), torch.tensor([SEQ - 1])])
        moved = _changed(self.run(self.x[:, perm])[:, -1], self.y[:, -1], self.scale)
        return {"test": "last token under permuted prefix", "deviation": moved, "position_aware": moved > TOL}

    def linears(self):
        return record_linears(self.module, self.attentions, lambda: self.run(self.x))

    def attention_roles(self) -> dict:
        if self.role != "cross":
            return {name: "self" for name in self.attentions}
        return attention_roles(self.module, self.attentions, lambda: self.run(self.x), MEMORY_SEQ)


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
    fixed = sorted(n for n in a.keys() & b.keys() if a[n].shape == b[n].shape and any(s > 1 for s in a[n].shape))
    return {"tested": True, "second_width": second_width, "fixed": fixed, "parameters": len(a),
            "built_width": infer_width(first), "second_built_width": infer_width(second)}



class BlockDriver:
    """The probed block as dataflow.LayerAnalysis drives a layer: x (any batch) -> block output, with the probe's
    memory (cross role) and the probe's caller mask when the block only masks on request."""

    def __init__(self, probe: Probe):
        self.probe, self.layer, self.width, self.seq = probe, probe.module, probe.width, SEQ
        self.memory_seq = MEMORY_SEQ if probe.role == "cross" else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        memory = None if self.probe.memory is None else self.probe.memory[:1].expand(x.shape[0], -1, -1)
        return self.probe.call(x, memory, masked=self.probe.masked)
