"""Named initialization schemes, applied in one place."""
from __future__ import annotations

from torch import nn

from .layers import LayerNorm, RMSNorm


def initialize(model: nn.Module, scheme: str) -> nn.Module:
    """``default`` keeps PyTorch's own initialization (Linear: Kaiming-uniform, Embedding: N(0, 1)).

    ``xavier`` follows Xiong et al. 2020: Xavier-uniform for every weight matrix and embedding table,
    zero biases, norm gain 1 and norm bias 0.
    """
    if scheme == "default":
        return model
    if scheme != "xavier":
        raise ValueError(f"init={scheme!r} is not allowed; choose one of ['default', 'xavier']")
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.xavier_uniform_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (LayerNorm, RMSNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    return model
