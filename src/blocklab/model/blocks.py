"""Transformer blocks. Where the norms sit lives only in the residual wrappers, one class per norm position:

    pre-norm  (GPT-2, Xiong et al. 2020):  h <- h + F(LN(h))
    post-norm (Vaswani et al. 2017):       h <- LN(h + F(h))

and the literature's fixes for post-norm (``model_config.NORM_POSITION_SPECS`` declares each one's norms, gate, final norm and labels;
the stability lab trains them at document 000's setup). A block is a short sequence of residual sub-layers; the
config's ``norm_position`` picks the wrapper. Every wrapper takes ``block_input`` (the stream entering the block): only
B2T reads it. ``init_`` (where a wrapper has one) runs after the model's own initialization and draws no random numbers,
so a seed gives the same pre- and post-norm weights as before the fixes existed.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..model_config import NORM_POSITION_SPECS, ConfigError, ModelConfig
from .layers import Attention, make_ffn, make_norm


class PreNormResidual(nn.Module):
    """h + F(LN(h))."""

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer

    def forward(self, h, *args, block_input=None, **kwargs):
        return h + self.sublayer(self.norm(h), *args, **kwargs)


class PostNormResidual(nn.Module):
    """LN(h + F(h))."""

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer

    def forward(self, h, *args, block_input=None, **kwargs):
        return self.norm(h + self.sublayer(h, *args, **kwargs))


class DeepNormResidual(nn.Module):
    """DeepNorm (Wang et al. 2022, DeepNet), decoder-only constants for N blocks:

        h <- LN(α·h + F(h)),  α = (2N)^(1/4);
        at init the value and output projections and both FFN matrices are multiplied by β = (8N)^(-1/4)
        (on top of the model's own initialization).

    The weights only, as the paper's formula states it (Wang et al. 2022, Algorithm 1: ``xavier_normal_(w, gain=β)``
    for the FFN, v_proj and out_proj weights). torchscale's code also multiplies those layers' biases by β; at this
    project's default init a bias is at most 1/sqrt(fan_in) (1/sqrt(128) = 0.088 at width 128), so the two differ at
    step 0 by at most that much in a coordinate of a sub-layer's output; the paper's formula is what is built.
    """

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer
        self.alpha = (2 * cfg.n_layers) ** 0.25
        self.beta = (8 * cfg.n_layers) ** -0.25

    def forward(self, h, *args, block_input=None, **kwargs):
        return self.norm(self.alpha * h + self.sublayer(h, *args, **kwargs))

    @torch.no_grad()
    def init_(self):
        scaled = [self.sublayer.v, self.sublayer.o] if isinstance(self.sublayer, Attention) else [
            m for m in self.sublayer.modules() if isinstance(m, nn.Linear)]
        for linear in scaled:
            linear.weight.mul_(self.beta)


class AdminResidual(nn.Module):
    """Admin (Liu et al. 2020), the admin-torch default (output change O(log M)) with ω as a learned vector:

        h <- LN(ω ⊙ h + F(h)),  ω₀ = sqrt((M + 1) / ln(M + 1) − 1),  M = 2N residual sub-layers of N blocks.
    """

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer
        m = 2 * cfg.n_layers
        self.omega0 = math.sqrt((m + 1) / math.log(m + 1) - 1)
        self.omega = nn.Parameter(torch.full((cfg.d_model,), self.omega0))

    def forward(self, h, *args, block_input=None, **kwargs):
        return self.norm(self.omega * h + self.sublayer(h, *args, **kwargs))

    @torch.no_grad()
    def init_(self):
        self.omega.fill_(self.omega0)


class B2TResidual(nn.Module):
    """B2T connection (Takase et al. 2022): post-norm whose last sub-layer also adds the block's input, which so skips
    every norm of the block but the last:  x' = LN(x + A(x));  x'' = LN(x' + F(x') + x).

    At init every weight matrix of the block's sub-layers (not the biases, not the norms) is multiplied by N^(-1/2)
    for N blocks: the authors' code does so whenever B2T is on (``rescaling_init`` in takase/b2t_connection,
    fairseq/modules/transformer_layer.py: every parameter named ``weight`` outside a layer norm, times
    ``layer_num ** -0.5``), on top of the model's own initialization."""

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer
        self.scale = cfg.n_layers ** -0.5

    def forward(self, h, *args, block_input=None, **kwargs):
        out = h + self.sublayer(h, *args, **kwargs)
        return self.norm(out if block_input is None else out + block_input)

    @torch.no_grad()
    def init_(self):
        for linear in (m for m in self.sublayer.modules() if isinstance(m, nn.Linear)):
            linear.weight.mul_(self.scale)


class ReZeroResidual(nn.Module):
    """ReZero (Bachlechner et al. 2020): h <- h + α·F(h), α a learned scalar starting at 0; no norm anywhere."""

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.sublayer = sublayer
        self.alpha = nn.Parameter(torch.zeros(()))

    def forward(self, h, *args, block_input=None, **kwargs):
        return h + self.alpha * self.sublayer(h, *args, **kwargs)

    @torch.no_grad()
    def init_(self):
        self.alpha.zero_()


class SandwichResidual(nn.Module):
    """Sandwich-LN (Ding et al. 2021, CogView) / Peri-LN (Kim et al. 2025): h <- h + LN_out(F(LN_in(h)))."""

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module):
        super().__init__()
        self.norm, self.sublayer, self.out_norm = make_norm(cfg), sublayer, make_norm(cfg)

    def forward(self, h, *args, block_input=None, **kwargs):
        return h + self.out_norm(self.sublayer(self.norm(h), *args, **kwargs))


RESIDUAL = {"pre": PreNormResidual, "post": PostNormResidual, "deepnorm": DeepNormResidual, "admin": AdminResidual,
            "b2t": B2TResidual, "rezero": ReZeroResidual, "sandwich": SandwichResidual}
assert set(RESIDUAL) == set(NORM_POSITION_SPECS), ("every norm position of model_config.NORM_POSITION_SPECS has its residual "
                                                  "class here")


def init_residuals(model: nn.Module) -> nn.Module:
    """Each residual wrapper's own initialization (DeepNorm's β, Admin's ω, B2T's N^(-1/2), ReZero's α), after the
    model's."""
    for module in model.modules():
        if hasattr(module, "init_") and type(module) in RESIDUAL.values():
            module.init_()
    return model


class EncoderBlock(nn.Module):
    """Bidirectional self-attention, then the feed-forward network (BERT, T5 encoder)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        residual = RESIDUAL[cfg.norm_position]
        self.attn = residual(cfg, Attention(cfg, causal=False))
        self.ffn = residual(cfg, make_ffn(cfg))

    def forward(self, h):
        return self.ffn(self.attn(h), block_input=h)


class DecoderOnlyBlock(nn.Module):
    """Masked self-attention, then the feed-forward network (GPT): no cross-attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        residual = RESIDUAL[cfg.norm_position]
        self.attn = residual(cfg, Attention(cfg, causal=True))
        self.ffn = residual(cfg, make_ffn(cfg))

    def forward(self, h):
        return self.ffn(self.attn(h), block_input=h)


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, feed-forward (T5 decoder): three sub-layers.

    Cross-attention is the only path from the encoder into the decoder.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.norm_position not in ("pre", "post"):
            raise ConfigError(f"norm_position={cfg.norm_position!r} is built for the decoder-only stack (its constants"
                              " count two sub-layers a block); the encoder-decoder takes one of ['post', 'pre']")
        residual = RESIDUAL[cfg.norm_position]
        self.attn = residual(cfg, Attention(cfg, causal=True))
        self.cross = residual(cfg, Attention(cfg, cross=True))
        self.ffn = residual(cfg, make_ffn(cfg))

    def forward(self, h, memory):
        return self.ffn(self.cross(self.attn(h), memory), block_input=h)


def _outputs(norm: str, x: torch.Tensor) -> tuple[list, list[torch.Tensor]]:
    """One decoder block of norm position ``norm`` at a tiny width from seed 0, with its own initialization: its
    parameters' shapes, and its outputs on ``x`` at init and after every parameter is moved by the same fixed noise
    (so that a gate at zero, as ReZero's, does not hide what the block computes)."""
    cfg = ModelConfig(d_model=x.shape[-1], n_heads=2, n_layers=2, vocab_size=11, max_len=x.shape[1],
                      norm_position=norm)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        block = init_residuals(DecoderOnlyBlock(cfg)).eval()
        outputs = [block(x)]
        noise = torch.Generator().manual_seed(1)
        for p in block.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=noise))
        outputs.append(block(x))
    return [tuple(p.shape) for p in block.parameters()], outputs


def duplicate_positions(names=None) -> list[tuple[str, str]]:
    """(later, earlier) for every declared norm position whose block computes what an earlier one's does: the same
    parameters, and the same outputs from the same seed at init and after a common move of every weight. Such a
    position would train and be reported twice under two names (a 'peri' beside 'sandwich (Peri-LN)')."""
    names = list(NORM_POSITION_SPECS if names is None else names)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2))
    seen, pairs = {}, []
    for name in names:
        shapes, outputs = _outputs(name, x)
        same = next((other for other, (s, o) in seen.items() if s == shapes
                     and all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(o, outputs))), None)
        if same:
            pairs.append((name, same))
        seen[name] = (shapes, outputs)
    return pairs


def check_distinct_positions(names=None) -> None:
    """ConfigError naming each declared norm position whose forward is an earlier one's (``duplicate_positions``)."""
    pairs = duplicate_positions(names)
    if pairs:
        raise ConfigError("; ".join(
            f"norm position {new!r} computes the same block as {old!r} (declared as "
            f"{NORM_POSITION_SPECS[old].label_en!r}: {NORM_POSITION_SPECS[old].formula}; {NORM_POSITION_SPECS[old].paper})"
            for new, old in pairs) + ". One block under two names trains and is reported twice: name the paper in the "
            "existing position's label and paper (model_config.NORM_POSITION_SPECS), or give the new one the residual "
            "class that computes what it should (model/blocks.py RESIDUAL)")
