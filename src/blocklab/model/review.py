"""`blocklab review`: the block reviewer of document 004 (skill-transformer-block-reviewer).

It checks a transformer block against the 2026 defaults the document names (pre-norm, RMSNorm, SwiGLU, RoPE, GQA,
FFN expansion) and against its rules. A live block is PROBED, not read: every fact below comes from calling the
block or one of its sub-modules on chosen inputs, or from parameter shapes.

    norm position   scale the input by 1000: pre-norm returns input + bounded update (output - input is tiny next
                    to the input), post-norm returns unit-RMS rows (output is tiny next to the input)
    norm kind       each norm module alone: adding a constant to every feature leaves LayerNorm's output unchanged,
                    RMSNorm's not; RMSNorm is scale-invariant
    residuals       silence one sub-layer (its output replaced by zeros): with a residual around it the output still
                    depends on the input, without one it does not
    causal mask     perturb future tokens; any change at earlier positions is a leak
    cross-attention memory longer than the target; output keeps the target's length and changes with the memory
    attention       K/V projection widths against the query width: MHA, GQA or MQA; bias on Q/K/V/O
    FFN             the Linear layers outside attention, in call order: two input matrices = gated (SwiGLU when the
                    activation read off the hidden values is SiLU); ratio = hidden width / d_model
    position        permutation equivariance (encoder), or prefix-permutation invariance of the last token (decoder):
                    RoPE or relative biases break it; additive positions live in the embedding, not in the block
    widths          build at two widths: a parameter dimension that does not follow d_model is hard-coded

Rules: REJECT post-norm deeper than 12 blocks without warm-up; REJECT a decoder whose future leaks into its past
with no way to mask it; FLAG FFN expansion below 2x, a missing residual, no normalization, cross-attention that
ignores the memory; WARN hard-coded widths and masks that only the caller applies. Deviations from the 2026
defaults are INFO.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import json
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError, ModelConfig
from ..io import write_json
from ..provenance import stamp
from . import hf_config

EXIT_PASS, EXIT_FLAG, EXIT_REJECT, EXIT_USAGE = 0, 1, 2, 3
ROLES = ("encoder", "decoder", "cross")
SEVERITY_RANK = {"pass": 0, "info": 0, "warn": 1, "flag": 1, "reject": 2}
MAX_POST_NORM_DEPTH = 12
MIN_FFN_RATIO = 2.0
SCALE = 1000.0
TOL = 1e-9  # relative, in float64: a mask is exact, so anything above round-off is a real dependence
SEQ, MEMORY_SEQ, BATCH = 6, 9, 2
DEFAULT_WIDTH, SECOND_WIDTH_STEP, DEFAULT_HEADS = 64, 32, 4

EXIT_HELP = """exit status:
  0  pass (info notes only)
  1  flags or warnings (e.g. FFN expansion below 2x, hard-coded widths, causal mask left to the caller)
  2  reject (post-norm deeper than 12 blocks without warm-up; a decoder whose future leaks into its past)
  3  bad arguments (unimportable module, missing config file, a block that cannot be built or called,
     an unwritable --json path); only unknown options are caught by the top-level parser, which exits 2

supported --module targets:
  torch.nn:TransformerEncoderLayer / TransformerDecoderLayer  built as cls(d_model, nhead=4,
      dim_feedforward=4*d_model, dropout=0, batch_first=True, **kwargs)
  a class taking a ModelConfig (first argument named cfg/config), e.g. blocklab.model.blocks:EncoderBlock
      built as cls(ModelConfig(d_model=..., n_heads=4, **kwargs))
  a class taking d_model (or dim / embed_dim / hidden_size) and optionally nhead / n_heads / num_heads
  a factory function, called with d_model=... when it accepts it, else with no arguments
Calls: encoder and decoder roles call block(x); cross calls block(x, memory). x is (batch, time, d_model).
A caller-supplied causal mask is tried through tgt_mask / src_mask (torch's additive float mask) or is_causal."""


# --- report --------------------------------------------------------------------------------------


@dataclass
class Finding:
    check: str
    severity: str  # pass | info | warn | flag | reject
    message: str
    value: object = None


@dataclass
class Review:
    subject: str
    mode: str  # "module" or "hf-config"
    role: str | None
    facts: dict = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def add(self, check: str, severity: str, message: str, value=None) -> None:
        self.findings.append(Finding(check, severity, message, value))

    @property
    def verdict(self) -> str:
        worst = max((SEVERITY_RANK[f.severity] for f in self.findings), default=0)
        return ("pass", "flag", "reject")[worst]

    @property
    def exit_status(self) -> int:
        return {"pass": EXIT_PASS, "flag": EXIT_FLAG, "reject": EXIT_REJECT}[self.verdict]

    def severity_of(self, check: str) -> str | None:
        found = [f.severity for f in self.findings if f.check == check]
        return max(found, key=SEVERITY_RANK.get) if found else None

    def to_dict(self) -> dict:
        return {"subject": self.subject, "mode": self.mode, "role": self.role, "verdict": self.verdict,
                "exit_status": self.exit_status, "facts": self.facts, "findings": [asdict(f) for f in self.findings]}

    def text(self) -> str:
        role = f", role {self.role}" if self.role else ""
        lines = [f"blocklab review: {self.subject} ({self.mode}{role})"]
        lines += [f"  {f.severity.upper():<7}{f.check:<18}{f.message}" for f in self.findings]
        lines.append(f"verdict: {self.verdict.upper()} (exit {self.exit_status})")
        return "\n".join(lines)


# --- building the block --------------------------------------------------------------------------

WIDTH_NAMES = ("d_model", "dim", "embed_dim", "hidden_size", "n_embd")
HEAD_NAMES = ("nhead", "n_heads", "num_heads", "num_attention_heads", "n_head")
CONFIG_NAMES = ("cfg", "config", "model_config")
TORCH_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def resolve(target: str):
    """'package.module:Name' (Name may be dotted) -> the object."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--module must look like package.module:ClassOrFactory, got {target!r}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"cannot import module {module_name!r}: {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _parameters(obj) -> dict:
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return {}


def _first(names, params) -> str | None:
    return next((n for n in names if n in params), None)


class Builder:
    """Builds the block at a chosen width when its constructor lets us, and says how it did so."""

    def __init__(self, obj, kwargs: dict | None = None):
        if not (isinstance(obj, nn.Module) or callable(obj)):
            raise ConfigError(f"{obj!r} is neither an nn.Module, a class nor a factory")
        self.obj, self.kwargs = obj, dict(kwargs or {})
        params = _parameters(obj)
        first = next(iter(params), None)
        if isinstance(obj, nn.Module):
            self.how, self.width_arg = "the given module instance", None
        elif inspect.isclass(obj) and issubclass(obj, TORCH_LAYERS):
            self.width_arg = "d_model"
            self.how = "cls(d_model, nhead=4, dim_feedforward=4*d_model, dropout=0, batch_first=True)"
        elif inspect.isclass(obj) and first in CONFIG_NAMES:
            self.how, self.width_arg = "cls(ModelConfig(d_model=..., n_heads=4, **kwargs))", "cfg"
        elif _first(WIDTH_NAMES, params):
            self.width_arg = _first(WIDTH_NAMES, params)
            self.how = f"{getattr(obj, '__name__', obj)}({self.width_arg}=..., heads=4 where accepted)"
        elif all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                 for p in params.values()):
            self.how, self.width_arg = f"{getattr(obj, '__name__', obj)}() (no width argument)", None
        else:
            raise ConfigError(f"cannot construct {obj!r}: its signature {list(params)} is none of the supported ones "
                              "(see `blocklab review --help`)")

    @property
    def follows_width(self) -> bool:
        return self.width_arg is not None

    def build(self, d_model: int) -> nn.Module:
        try:
            module = self._build(d_model)
        except ConfigError:
            raise
        except Exception as err:  # the user's constructor: report it as one line
            raise ConfigError(f"building the block as {self.how} failed: {type(err).__name__}: {err}") from None
        if not isinstance(module, nn.Module):
            raise ConfigError(f"the factory returned {type(module).__name__}, not an nn.Module")
        return module

    def _build(self, d: int) -> nn.Module:
        obj, kw = self.obj, self.kwargs
        if isinstance(obj, nn.Module):
            return copy.deepcopy(obj)
        if inspect.isclass(obj) and issubclass(obj, TORCH_LAYERS):
            base = {"d_model": d, "nhead": DEFAULT_HEADS, "dim_feedforward": 4 * d, "dropout": 0.0, "batch_first": True}
            return obj(**{**base, **kw})
        if self.width_arg == "cfg":
            return obj(ModelConfig(**{"n_heads": DEFAULT_HEADS, **kw, "d_model": d}))
        if self.width_arg:
            heads = _first(HEAD_NAMES, _parameters(obj))
            extra = {heads: DEFAULT_HEADS} if heads else {}
            return obj(**{**extra, **kw, self.width_arg: d})
        return obj(**kw)


# --- calling the block ---------------------------------------------------------------------------


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


def _rms(t: torch.Tensor) -> float:
    return t.pow(2).mean().sqrt().item()


def _changed(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """Largest difference relative to the scale of the output."""
    return (a - b).abs().max().item() / max(scale, 1e-30)


# --- structure: which sub-modules are attention, norms, the FFN ----------------------------------

Q_NAMES = ("q", "q_proj", "query", "wq", "to_q")
K_NAMES = ("k", "k_proj", "key", "wk", "to_k")
V_NAMES = ("v", "v_proj", "value", "wv", "to_v")
O_NAMES = ("o", "o_proj", "out_proj", "wo", "to_out", "proj", "dense")
KV_HEAD_NAMES = ("kv_heads", "n_kv_heads", "num_key_value_heads", "num_kv_heads")
HEAD_DIM_NAMES = ("head_dim", "d_head", "head_size")


def find_attention(module: nn.Module) -> dict[str, nn.Module]:
    found = {}
    for name, sub in module.named_modules():
        if any(name.startswith(prefix + ".") for prefix in found):
            continue
        children = dict(sub.named_children())
        has_qkv = all(_first(names, children) for names in (Q_NAMES, K_NAMES, V_NAMES))
        if isinstance(sub, nn.MultiheadAttention) or has_qkv:
            found[name] = sub
    return found


def _attribute(obj, names):
    return next((getattr(obj, n) for n in names if isinstance(getattr(obj, n, None), int)), None)


def attention_shape(attn: nn.Module) -> dict:
    """Heads, K/V heads and biases from parameter shapes (and head counts the module stores as attributes)."""
    if isinstance(attn, nn.MultiheadAttention):
        heads, width = attn.num_heads, attn.embed_dim
        return {"heads": heads, "kv_heads": heads, "head_dim": width // heads, "q_width": width, "kv_width": width,
                "qkv_bias": attn.in_proj_bias is not None, "o_bias": attn.out_proj.bias is not None}
    children = dict(attn.named_children())
    q, k, v = (children[_first(names, children)] for names in (Q_NAMES, K_NAMES, V_NAMES))
    o = children.get(_first(O_NAMES, children))
    heads, head_dim = _attribute(attn, HEAD_NAMES), _attribute(attn, HEAD_DIM_NAMES)
    if heads and not head_dim:
        head_dim = q.out_features // heads
    kv_heads = k.out_features // head_dim if head_dim else None
    return {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "q_width": q.out_features,
            "kv_width": k.out_features, "qkv_bias": all(m.bias is not None for m in (q, k, v)),
            "o_bias": None if o is None else getattr(o, "bias", None) is not None,
            "per_head_norms": sorted(n for n in children if re.fullmatch(r"[qk]_?(norm|ln|layernorm)", n))}


def attention_kind(shape: dict) -> str:
    if shape["heads"] and shape["kv_heads"]:
        if shape["kv_heads"] == shape["heads"]:
            return "MHA"
        return "MQA" if shape["kv_heads"] == 1 else "GQA"
    return "MHA" if shape["kv_width"] == shape["q_width"] else "GQA/MQA"


def find_norms(module: nn.Module, width: int) -> dict[str, nn.Module]:
    """Leaf modules that look like a norm over the model width (per-head norms are reported with attention)."""
    norms = {}
    for name, sub in module.named_modules():
        named_like_norm = "norm" in type(sub).__name__.lower() and not list(sub.children())
        if isinstance(sub, (nn.LayerNorm, nn.RMSNorm)) or named_like_norm:
            weight = getattr(sub, "weight", None)
            if weight is None or weight.shape[-1] == width:
                norms[name] = sub
    return norms


def norm_kind(norm: nn.Module, width: int, generator: torch.Generator) -> str:
    z = torch.randn(4, width, dtype=torch.float64, generator=generator)
    base = norm(z).detach()
    scale = base.abs().max().item()
    # 1e-3, not round-off: eps inside the square root makes RMSNorm only nearly scale-invariant
    if _changed(norm(z + 3.0).detach(), base, scale) < 1e-3:
        return "layernorm"
    if _changed(norm(5.0 * z).detach(), base, scale) < 1e-3:
        return "rmsnorm"
    return "other"


def infer_width(module: nn.Module) -> int | None:
    dims = Counter()
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            dims.update([sub.in_features, sub.out_features])
        elif isinstance(sub, nn.MultiheadAttention):
            dims.update([sub.embed_dim] * 4)
    return dims.most_common(1)[0][0] if dims else None


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


ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "relu": F.relu,
}


def ffn_structure(calls, width: int) -> dict | None:
    """The last Linear back to d_model is the down projection; the Linears before it into its width feed it."""
    downs = [c for c in calls if c[1].out_features == width]
    if not downs:
        return None
    down_name, down, down_in, _ = downs[-1]
    hidden = down.in_features
    inputs = [c for c in calls if c[0] != down_name and c[1].in_features == width and c[1].out_features == hidden]
    facts = {"down": down_name, "inputs": [c[0] for c in inputs], "hidden": hidden, "ratio": hidden / width,
             "matrices": len(inputs) + 1, "bias": all(c[1].bias is not None for c in [*inputs, downs[-1]])}
    facts["activation"], facts["kind"] = _activation(inputs, down_in)
    return facts


def _activation(inputs, down_in) -> tuple[str, str]:
    """Which activation turns the recorded input-matrix outputs into the down projection's input."""
    scale = down_in.abs().max().item()
    if len(inputs) == 1:
        a = inputs[0][3]
        for name, act in ACTIVATIONS.items():
            if _changed(act(a), down_in, scale) < 1e-6:
                return name, "classic"
        return "unknown", "classic"
    if len(inputs) == 2:
        a, b = inputs[0][3], inputs[1][3]
        for name, act in ACTIVATIONS.items():
            for gate, up in ((a, b), (b, a)):
                if _changed(act(gate) * up, down_in, scale) < 1e-6:
                    return name, {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu", "relu": "reglu"}[name]
        return "unknown", "gated"
    return "unknown", f"{len(inputs)} input matrices"


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


# --- live module review --------------------------------------------------------------------------


def review_module(target, role: str, d_model: int | None = None, depth: int | None = None, warmup_steps: int = 0,
                  kwargs: dict | None = None, seed: int = 0) -> Review:
    """Build, probe and judge one block. ``target``: 'pkg.mod:Name', a class, a factory or a module instance."""
    if role not in ROLES:
        raise ConfigError(f"--role {role!r} is not allowed; choose one of {list(ROLES)}")
    obj = resolve(target) if isinstance(target, str) else target
    subject = target if isinstance(target, str) else getattr(obj, "__qualname__", type(obj).__name__)
    builder = Builder(obj, kwargs)
    requested = d_model or DEFAULT_WIDTH
    torch.manual_seed(seed)
    module = builder.build(requested)
    width = infer_width(module) or requested
    review = Review(subject=subject, mode="module", role=role)
    review.facts["built_as"] = builder.how
    review.facts["d_model"] = {"requested": requested if builder.follows_width else None, "probed": width}
    widths = width_check(builder, requested, module)
    probe = Probe(module, role, width, seed)
    _judge_norms(review, probe, depth, warmup_steps)
    _judge_causal(review, probe)
    attention_roles = probe.attention_roles()
    ffn = ffn_structure(probe.linears(), width)
    _judge_residuals(review, probe, ffn, attention_roles)
    if role == "cross":
        _judge_cross(review, probe, attention_roles)
    _judge_attention(review, probe, attention_roles)
    _judge_ffn(review, ffn)
    _judge_position(review, probe)
    _judge_widths(review, widths, requested if builder.follows_width else None, width)
    return review


def _judge_norms(review: Review, probe: Probe, depth, warmup_steps) -> None:
    position = probe.norm_position()
    kinds = probe.norm_kinds()
    review.facts["norm_position"], review.facts["norm_modules"] = position, kinds
    where = position["position"]
    detail = (f"output - input is {position['residual_fraction_at_1000x']:.1e} of the input at {SCALE:g}x scale"
              if where == "pre" else f"output RMS is {position['output_scale_ratio_at_1000x']:.1e} of the input's at "
              f"{SCALE:g}x scale (rows renormalized)")
    if where == "pre":
        review.add("norm position", "pass", f"pre-norm ({detail})", where)
    elif where == "post":
        review.add("norm position", "info", f"post-norm ({detail}); 2026 default: pre-norm", where)
    else:
        review.add("norm position", "flag", "no normalization detected: the output neither keeps the input's scale "
                   "plus a bounded update nor renormalizes it", where)
    _judge_depth(review, where, depth, warmup_steps)
    found = sorted(set(kinds.values()))
    if not found:
        review.add("norm kind", "info", "no norm module found to probe", None)
    elif found == ["rmsnorm"]:
        review.add("norm kind", "pass", f"RMSNorm ({len(kinds)} modules: shifting every feature changes the output, "
                   "scaling does not)", "rmsnorm")
    elif found == ["layernorm"]:
        review.add("norm kind", "info", f"LayerNorm ({len(kinds)} modules: a constant added to every feature does "
                   "not change the output); 2026 default: RMSNorm", "layernorm")
    else:
        review.add("norm kind", "info", f"mixed or unrecognised norms {kinds}; 2026 default: RMSNorm", found)


def _judge_depth(review: Review, where: str, depth, warmup_steps) -> None:
    if where != "post":
        return
    if depth is None:
        review.add("post-norm depth", "info", f"depth not given (--depth); post-norm deeper than "
                   f"{MAX_POST_NORM_DEPTH} blocks needs warm-up", None)
    elif depth > MAX_POST_NORM_DEPTH and not warmup_steps:
        review.add("post-norm depth", "reject", f"post-norm stack of {depth} blocks without warm-up: deeper than "
                   f"{MAX_POST_NORM_DEPTH} it needs a warm-up schedule, or switch to pre-norm", depth)
    elif depth > MAX_POST_NORM_DEPTH:
        review.add("post-norm depth", "info", f"post-norm stack of {depth} blocks with {warmup_steps} warm-up steps",
                   depth)
    else:
        review.add("post-norm depth", "pass", f"post-norm stack of {depth} blocks (<= {MAX_POST_NORM_DEPTH})", depth)


def _judge_causal(review: Review, probe: Probe) -> None:
    plain = probe.causal()
    review.facts["causal"] = {"without_caller_mask": plain}
    if probe.role == "encoder":
        if plain["leaks"]:
            review.add("masking", "pass", "bidirectional: every position sees every other (no mask)", "none")
        else:
            review.add("masking", "warn", "the block hides later tokens from earlier ones; an encoder should be "
                       "bidirectional", "causal")
        return
    if not plain["leaks"]:
        review.add("causal mask", "pass", f"no leak: perturbing future tokens leaves earlier outputs unchanged "
                   f"(max change {plain['max_leak']:.1e})", "built-in")
        return
    if probe.call.mask_kwargs(SEQ) is not None:
        probe.use_caller_mask()
        masked = probe.causal()
        review.facts["causal"]["with_caller_mask"] = masked
        if not masked["leaks"]:
            names = ", ".join(probe.call.mask_kwargs(SEQ))
            review.add("causal mask", "warn", f"leaks unless the caller passes a causal mask ({names}); masked, no "
                       "leak", "caller")
            return
    review.add("causal mask", "reject", f"future tokens leak into earlier positions (relative change "
               f"{plain['max_leak']:.1e}): a decoder block needs a causal mask", "none")


def _judge_residuals(review: Review, probe: Probe, ffn, attention_roles) -> None:
    residuals = probe.residuals(ffn)
    review.facts["residual_when_silenced"] = residuals
    for name, kept in residuals.items():
        label = "FFN" if name == "ffn" else f"{attention_roles.get(name, 'self')}-attention '{name}'"
        if kept:
            review.add("residual", "pass", f"around {label}: the input still reaches the output with it silenced", name)
        else:
            review.add("residual", "flag", f"none around {label}: silenced, the output no longer depends on the "
                       "input (deep stacks then lose their gradient path)", name)
    if not residuals:
        review.add("residual", "info", "no attention or FFN sub-module recognised; residuals not probed", None)


def _judge_cross(review: Review, probe: Probe, attention_roles) -> None:
    facts = probe.cross()
    facts["cross_attention_modules"] = [n for n, r in attention_roles.items() if r == "cross"]
    review.facts["cross_attention"] = facts
    if facts["memory_changes_output"] and facts["keeps_target_shape"]:
        where = ", ".join(facts["cross_attention_modules"]) or "a sub-module"
        review.add("cross-attention", "pass", f"queries from the decoder, keys/values from the encoder output "
                   f"({where}): memory of length {MEMORY_SEQ} -> output of length {SEQ}, and it changes with the "
                   "memory",
                   True)
    else:
        review.add("cross-attention", "flag", "the output ignores the encoder output or does not keep the target's "
                   f"shape ({facts})", False)


def _judge_attention(review: Review, probe: Probe, attention_roles) -> None:
    shapes = {name: attention_shape(attn) for name, attn in probe.attentions.items()}
    review.facts["attention"] = {n: {**s, "role": attention_roles.get(n), "kind": attention_kind(s)}
                                 for n, s in shapes.items()}
    if not shapes:
        review.add("attention", "info", "no attention sub-module recognised", None)
    for name, shape in shapes.items():
        kind = attention_kind(shape)
        heads = (f"{shape['heads']}/{shape['kv_heads']}" if shape["heads"]
                 else f"q {shape['q_width']} / kv {shape['kv_width']}")
        severity = "info" if kind == "MHA" else "pass"
        note = "; 2026 default: GQA" if kind == "MHA" else ""
        review.add("attention", severity, f"{kind} {heads} (query/KV heads) in '{name}'{note}", kind)
        bias = "bias on Q/K/V" + (" and O" if shape["o_bias"] else "") if shape["qkv_bias"] else "no Q/K/V bias"
        if shape.get("per_head_norms"):
            bias += f"; per-head norms {shape['per_head_norms']}"
        review.add("attention bias", "info", f"{bias} in '{name}'", shape["qkv_bias"])


def _judge_ffn(review: Review, ffn) -> None:
    review.facts["ffn"] = ffn
    if ffn is None:
        review.add("ffn", "info", "no feed-forward network recognised", None)
        return
    kind = {"swiglu": "SwiGLU", "classic": "classic"}.get(ffn["kind"], ffn["kind"])
    shape = f"{kind} ({ffn['matrices']} matrices, activation {ffn['activation']}), hidden {ffn['hidden']}"
    review.add("ffn kind", "pass" if ffn["kind"] == "swiglu" else "info",
               shape + ("" if ffn["kind"] == "swiglu" else "; 2026 default: SwiGLU"), ffn["kind"])
    _judge_ratio(review, ffn["ratio"])


def _judge_ratio(review: Review, ratio: float) -> None:
    if ratio < MIN_FFN_RATIO:
        review.add("ffn ratio", "flag", f"expansion {ratio:.2f}x is below {MIN_FFN_RATIO:g}x", ratio)
    else:
        review.add("ffn ratio", "pass", f"expansion {ratio:.2f}x", ratio)


def _judge_position(review: Review, probe: Probe) -> None:
    facts = probe.position_signal(causal=probe.role != "encoder")
    review.facts["position"] = facts
    if facts["position_aware"]:
        review.add("position", "pass", f"the block itself uses token positions ({facts['test']} broken): RoPE or "
                   "relative position", "in-block")
    else:
        review.add("position", "info", f"no positional signal inside the block ({facts['test']} holds): positions "
                   "must come from the embedding; 2026 default: RoPE", "none")


def _judge_widths(review: Review, widths: dict, requested, built) -> None:
    review.facts["widths"] = widths
    if requested is not None and built != requested:
        review.add("widths", "warn", f"asked for d_model={requested}, the block was built at {built}", built)
    if not widths["tested"]:
        review.add("widths", "info", "the factory takes no width; hard-coded widths not tested", None)
    elif widths.get("error"):
        review.add("widths", "warn", f"cannot be built at d_model={widths['second_width']}: {widths['error']}", None)
    elif widths["fixed"]:
        shown = ", ".join(widths["fixed"][:4]) + (" ..." if len(widths["fixed"]) > 4 else "")
        review.add("widths", "warn", f"{len(widths['fixed'])} of {widths['parameters']} parameters keep their shape "
                   f"when d_model changes to {widths['second_width']} (hard-coded widths): {shown}", widths["fixed"])
    else:
        review.add("widths", "pass", f"every parameter follows d_model ({requested} -> {widths['second_width']})", None)


# --- Hugging Face config review ------------------------------------------------------------------


def review_hf_config(source, depth: int | None = None, warmup_steps: int = 0) -> Review:
    """Judge a published decoder config: the architecture is read from config.json, the count is exact."""
    arch = hf_config.architecture(source)
    info = hf_config.summary(arch)
    review = Review(subject=str(arch.name), mode="hf-config", role="decoder",
                    facts={"architecture": arch.to_dict(), "parameters": info})
    depth = depth or arch.num_layers
    review.add("norm position", "pass", f"pre-norm (every {arch.model_type} layer normalizes before attention and "
               f"MLP); {depth} layers", "pre")
    review.add("norm kind", "pass", f"RMSNorm (rms_norm_eps={arch.norm_eps:g})", "rmsnorm")
    kind = arch.attention_kind
    decoupled = f" (not hidden_size/heads = {arch.hidden_size // arch.num_heads})" if arch.head_dim_decoupled else ""
    heads = f"{kind} {arch.num_heads}/{arch.num_kv_heads} (query/KV heads)"
    review.add("attention", "info" if kind == "MHA" else "pass", f"{heads}, head_dim {arch.head_dim}{decoupled}", kind)
    biases = [n for n, b in (("Q/K/V", arch.qkv_bias), ("O", arch.o_bias), ("MLP", arch.mlp_bias)) if b]
    review.add("attention bias", "info", ("bias on " + ", ".join(biases)) if biases else "no bias on Q/K/V/O or MLP",
               bool(biases))
    if arch.qk_norm:
        review.add("qk norm", "info", f"per-head RMSNorm on queries and keys ({arch.head_dim} weights each)", True)
    ffn_kind = arch.ffn_kind
    review.add("ffn kind", "pass" if ffn_kind == "swiglu" else "info",
               f"{'SwiGLU' if ffn_kind == 'swiglu' else ffn_kind} (gate, up, down; hidden_act={arch.hidden_act}), "
               f"intermediate_size {arch.intermediate_size}", ffn_kind)
    _judge_ratio(review, arch.ffn_ratio)
    if arch.rope_theta is None:
        review.add("position", "info", "no rope_theta in the config; 2026 default: RoPE", None)
    else:
        scaling = f", scaling {arch.rope_scaling}" if arch.rope_scaling else ""
        review.add("position", "pass", f"RoPE theta {arch.rope_theta:g}{scaling}", arch.rope_theta)
    review.add("embeddings", "info", "input embedding and LM head tied" if arch.tie_embeddings
               else "input embedding and LM head untied", arch.tie_embeddings)
    _judge_count(review, arch, info)
    return review


def _judge_count(review: Review, arch, info: dict) -> None:
    message = (f"{info['total']:,} parameters exactly ({info['layers']} x {info['per_layer']:,} per layer, "
               f"embedding {info['embedding']:,})")
    if arch.published_total is None:
        review.add("parameters", "info", message + "; no published total to compare", info["total"])
    elif info["total"] == arch.published_total:
        review.add("parameters", "pass", message + "; equals the published total", info["total"])
    else:
        review.add("parameters", "flag", message + f"; published {arch.published_total:,}", info["total"])


# --- command -------------------------------------------------------------------------------------


def _usage_error(parser, message):
    parser.print_usage(sys.stderr)
    parser.exit(EXIT_USAGE, f"blocklab review: error: {message}\n")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "review", help="review a transformer block (live module or Hugging Face config) against the 2026 defaults",
        description=__doc__.split("\n\n")[0], epilog=EXIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--module", help="package.module:ClassOrFactory of the block to probe")
    what.add_argument("--hf-config", help="config.json path (or a shipped name: llama3-8b, qwen3-vl-4b-text)")
    p.add_argument("--role", choices=ROLES, help="encoder: block(x); decoder: masked block(x); cross: block(x, memory)")
    p.add_argument("--d-model", type=int, help=f"width to build the block at (default {DEFAULT_WIDTH})")
    p.add_argument("--depth", type=int, help="blocks in the intended stack (post-norm rule); default for a config: "
                                             "num_hidden_layers")
    p.add_argument("--warmup-steps", type=int, default=0, help="learning-rate warm-up of the intended training "
                                                               "(default 0: none)")
    p.add_argument("--kwargs", help="JSON object of constructor arguments (ModelConfig fields for a cfg class)")
    p.add_argument("--json", help="write the review as JSON here")
    # this command's own exit 2 means 'reject', so its argument errors exit 3
    p.error = lambda message: _usage_error(p, message)
    p.set_defaults(func=_main)


def _parse_kwargs(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--kwargs is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--kwargs must be a JSON object, got {type(value).__name__}")
    return value


def run_review(args) -> Review:
    if bool(args.module) == bool(args.hf_config):
        raise ConfigError("give exactly one of --module or --hf-config")
    for name in ("d_model", "depth"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.hf_config:
        return review_hf_config(args.hf_config, depth=args.depth, warmup_steps=args.warmup_steps)
    if not args.role:
        raise ConfigError(f"--module needs --role, one of {list(ROLES)}")
    return review_module(args.module, args.role, d_model=args.d_model, depth=args.depth,
                         warmup_steps=args.warmup_steps, kwargs=_parse_kwargs(args.kwargs))


def _main(args) -> int:
    try:
        review = run_review(args)
    except (ConfigError, FileNotFoundError) as err:
        print(f"blocklab review: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(review.text())
    if args.json:
        record = stamp(**review.to_dict(), arguments={k: v for k, v in vars(args).items() if k != "func"})
        try:
            write_json(record, args.json)
        except OSError as err:  # exit 1 would read as "flagged"
            print(f"blocklab review: error: cannot write {args.json}: {err}", file=sys.stderr)
            return EXIT_USAGE
    return review.exit_status
