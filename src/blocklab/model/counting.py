"""Closed-form parameter counts from a configuration, term by term as document 004 writes them."""
from __future__ import annotations

from ..model_config import NORM_POSITION_SPECS, ModelConfig


def norm_params(cfg: ModelConfig) -> int:
    if cfg.norm_kind == "rmsnorm":
        return cfg.d_model
    return cfg.d_model * (2 if cfg.bias else 1)


def attention_params(cfg: ModelConfig) -> int:
    """Q and O are d x (heads * head_dim); K and V shrink with grouped-query attention. With MHA this is 4 d^2."""
    d, q_width, kv_width = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    weights = d * q_width + 2 * d * kv_width + q_width * d
    biases = q_width + 2 * kv_width + d if cfg.bias else 0
    return weights + biases


def ffn_params(cfg: ModelConfig) -> int:
    """Classic FFN: 2 d h; SwiGLU: 3 d h (h = r d)."""
    d, h = cfg.d_model, cfg.hidden
    if cfg.ffn_kind == "swiglu":
        return 3 * d * h + ((2 * h + d) if cfg.bias else 0)
    return 2 * d * h + ((h + d) if cfg.bias else 0)


def residual_params(cfg: ModelConfig) -> int:
    """What one residual wrapper holds besides its sub-layer: its norms and its gate (model_config.NORM_POSITION_SPECS)."""
    position = NORM_POSITION_SPECS[cfg.norm_position]
    gate = {"": 0, "scalar": 1, "vector": cfg.d_model}[position.gate]
    return position.norms * norm_params(cfg) + gate


def block_params(cfg: ModelConfig, kind: str) -> int:
    """kind: 'encoder' or 'decoder_only' (attention + FFN + 2 residuals) or 'decoder' (+ cross-attention + 1 residual).
    With pre- or post-norm a residual holds one norm."""
    if kind in ("encoder", "decoder_only"):
        return attention_params(cfg) + ffn_params(cfg) + 2 * residual_params(cfg)
    if kind == "decoder":
        return 2 * attention_params(cfg) + ffn_params(cfg) + 3 * residual_params(cfg)
    raise ValueError(f"kind={kind!r} is not allowed; choose one of ['encoder', 'decoder_only', 'decoder']")


def _embedding_params(cfg: ModelConfig) -> int:
    tables = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)  # input embedding and output head
    return tables + (cfg.max_len * cfg.d_model if cfg.position == "learned" else 0)


def _final_norm_params(cfg: ModelConfig) -> int:
    return norm_params(cfg) if NORM_POSITION_SPECS[cfg.norm_position].final_norm else 0


def decoder_lm_params(cfg: ModelConfig) -> int:
    return _embedding_params(cfg) + cfg.n_layers * block_params(cfg, "decoder_only") + _final_norm_params(cfg)


def encoder_decoder_params(cfg: ModelConfig) -> int:
    blocks = cfg.encoder_layers * block_params(cfg, "encoder") + cfg.n_layers * block_params(cfg, "decoder")
    return _embedding_params(cfg) + blocks + 2 * _final_norm_params(cfg)


def count_parameters(module) -> int:
    """What the built module really holds; shared (tied) tensors are counted once, as PyTorch's parameters() does."""
    return sum(p.numel() for p in module.parameters())
