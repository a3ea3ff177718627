"""What a module does to chosen inputs, with no name read: the norm kind of a norm, the activations an FFN may
apply, the head layout's name, the width a block works at."""
from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn


def _changed(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """Largest difference relative to the scale of the output."""
    return (a - b).abs().max().item() / max(scale, 1e-30)


def heads_kind(heads: int | None, kv_heads: int | None) -> str | None:
    if not heads or not kv_heads:
        return None
    return "MHA" if kv_heads == heads else "MQA" if kv_heads == 1 else "GQA"


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
    """The width the block's weights share most (norm weights, output biases and 2-D weights all count)."""
    dims = Counter()
    for p in module.parameters():
        if p.dim() in (1, 2):
            dims.update(p.shape)
    return dims.most_common(1)[0][0] if dims else None


ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda t: F.relu(t).square(),
    "quick_gelu": lambda t: t * torch.sigmoid(1.702 * t),
    "identity": lambda t: t,  # last: no activation at all (a linear FFN; gated, the bilinear GLU)
}
# the FFN kind an activation makes, gated (act(gate) * up) or not
GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu", "quick_gelu": "geglu", "relu": "reglu",
         "relu2": "reglu2", "identity": "bilinear"}
PLAIN = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu", "quick_gelu": "gelu", "relu": "relu", "relu2": "relu2",
         "identity": "linear"}
