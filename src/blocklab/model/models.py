"""Whole models: the decoder-only copy-task LM of document 000 and the encoder-decoder of document 004."""
from __future__ import annotations

from torch import nn

from ..model_config import NORM_POSITION_SPECS, ModelConfig
from .blocks import DecoderBlock, DecoderOnlyBlock, EncoderBlock, init_residuals
from .init import initialize
from .layers import make_norm, make_position


def final_norm(cfg: ModelConfig) -> nn.Module:
    """Pre-norm leaves the stream un-normalized, so one norm follows the last block (GPT-2); post-norm ends normed.
    Every norm position declares it (``model_config.NORM_POSITION_SPECS[...].final_norm``)."""
    return make_norm(cfg) if NORM_POSITION_SPECS[cfg.norm_position].final_norm else nn.Identity()


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = make_position(cfg)
        self.blocks = nn.ModuleList(DecoderOnlyBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = final_norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        init_residuals(initialize(self, cfg.init))

    def forward(self, tokens, return_hidden: bool = False):
        """Logits (batch, time, vocab); with ``return_hidden`` also the stream before block 1 and after every block."""
        h = self.position(self.embed(tokens))
        hidden = [h]
        for block in self.blocks:
            h = block(h)
            hidden.append(h)
        logits = self.head(self.norm(h))
        return (logits, hidden) if return_hidden else logits


class EncoderDecoder(nn.Module):
    """Vaswani et al. 2017 layout: one shared embedding, encoder stack, decoder stack with cross-attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = make_position(cfg)
        self.encoder = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.encoder_norm = final_norm(cfg)
        self.decoder_norm = final_norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        init_residuals(initialize(self, cfg.init))

    def encode(self, source):
        h = self.position(self.embed(source))
        for block in self.encoder:
            h = block(h)
        return self.encoder_norm(h)

    def decode(self, target, memory):
        h = self.position(self.embed(target))
        for block in self.decoder:
            h = block(h, memory)
        return self.head(self.decoder_norm(h))

    def forward(self, source, target):
        return self.decode(target, self.encode(source))
