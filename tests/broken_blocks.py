"""Deliberately broken blocks for the reviewer's tests: each one breaks exactly one rule of document 004."""
from torch import nn

from blocklab.model_config import ModelConfig
from blocklab.model.blocks import DecoderOnlyBlock, EncoderBlock, PreNormResidual
from blocklab.model.layers import MLP


def leaky_decoder(d_model: int = 64) -> DecoderOnlyBlock:
    """A GPT block whose causal mask was removed: the future leaks into the past."""
    block = DecoderOnlyBlock(ModelConfig(d_model=d_model, n_heads=4))
    block.attn.sublayer.causal = False
    return block


class NoFFNResidual(EncoderBlock):
    """Pre-norm attention with its residual, then the FFN without one: h = FFN(LN(h))."""

    def __init__(self, d_model: int = 64):
        super().__init__(ModelConfig(d_model=d_model, n_heads=4))

    def forward(self, h):
        h = self.attn(h)
        return self.ffn.sublayer(self.ffn.norm(h))


class FixedHidden(EncoderBlock):
    """Follows d_model everywhere except the FFN, whose hidden width is hard-coded to 256."""

    def __init__(self, d_model: int = 64):
        super().__init__(ModelConfig(d_model=d_model, n_heads=4, ffn_hidden=256))


class IgnoresWidth(nn.Module):
    """Takes d_model and ignores it: always 64 wide."""

    def __init__(self, d_model: int = 64):
        super().__init__()
        self.block = EncoderBlock(ModelConfig(d_model=64, n_heads=4))

    def forward(self, h):
        return self.block(h)


def fixed_modern_decoder() -> DecoderOnlyBlock:
    """A factory without a width argument: RMSNorm, SwiGLU, RoPE, GQA 4/2 at d_model=48."""
    return DecoderOnlyBlock(ModelConfig(d_model=48, n_heads=4, n_kv_heads=2, ffn_kind="swiglu", norm_kind="rmsnorm",
                                        position="rope", bias=False))


class FFNOnly(nn.Module):
    """A pre-norm residual FFN and nothing else: no attention to review."""

    def __init__(self, d_model: int = 64):
        super().__init__()
        self.ffn = PreNormResidual(ModelConfig(d_model=d_model, n_heads=4), MLP(ModelConfig(d_model=d_model)))

    def forward(self, h):
        return self.ffn(h)


class FewerHeadsThanDeclared(DecoderOnlyBlock):
    """Declares 4 heads (ModelConfig.n_heads) but its attention splits the width into 2 heads of twice the size."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(ModelConfig(d_model=d_model, n_heads=n_heads))
        attention = self.attn.sublayer
        attention.n_heads = attention.kv_heads = 2
        attention.head_dim = d_model // 2
