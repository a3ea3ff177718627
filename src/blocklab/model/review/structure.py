"""Which sub-modules of a live block are attention, norms and the FFN: parameter shapes, and what the norms and
the FFN's hidden values do to chosen inputs."""
from __future__ import annotations

import re
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from .build import HEAD_NAMES, _first

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


def heads_kind(heads: int | None, kv_heads: int | None) -> str | None:
    if not heads or not kv_heads:
        return None
    return "MHA" if kv_heads == heads else "MQA" if kv_heads == 1 else "GQA"


def attention_kind(shape: dict) -> str:
    if shape["heads"] and shape["kv_heads"]:
        return heads_kind(shape["heads"], shape["kv_heads"])
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


ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda t: F.relu(t).square(),
    "quick_gelu": lambda t: t * torch.sigmoid(1.702 * t),
}
# the FFN kind an activation makes, gated (act(gate) * up) or not
GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu", "quick_gelu": "geglu", "relu": "reglu",
         "relu2": "reglu"}
PLAIN = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu", "quick_gelu": "gelu", "relu": "relu", "relu2": "relu"}


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
                    return name, GATED[name]
        return "unknown", "gated"
    return "unknown", f"{len(inputs)} input matrices"

