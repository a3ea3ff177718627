"""A model's configuration: ``ModelConfig`` (one dataclass describes a model; every module takes it instead of a pile
of keyword arguments), the norm positions (``NORM_POSITION_SPECS``) and the other choices a model takes, and
``ConfigError``, the error every invalid value raises. Not params.yaml: reading and checking that file is
``params_file``; its sections as typed run settings, ``run_settings``."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

NORM_KINDS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class NormPosition:
    """Where a block puts its norms, declared once: the model (blocks.py holds one residual class per name), the
    closed-form counts, the stack's final norm, the figures' colours and labels and the stability lab read this.

    ``norms`` per residual sub-layer; ``gate``: a learned scale inside the residual ("scalar", "vector", or "" for
    none); ``ends_normalised``: the stream leaving a block has just been normalised (the stability lab gives a user's
    block whose placement the reviewer names a final norm when it does not: lab/spec.py); ``final_norm``: the stack
    puts one norm after its last block (GPT-2's ln_f); ``fixes_post``: a fix from the literature for post-norm's
    instability; ``label_ko``, ``label_en``: its name in the figures and the report (``label``).
    """

    name: str
    formula: str
    paper: str
    norms: int
    gate: str
    ends_normalised: bool
    final_norm: bool
    colour: str
    label_ko: str
    label_en: str
    fixes_post: bool = False

    def label(self, lang: str) -> str:
        """Its name in ``lang`` (ko | en), as the figures and the report write it."""
        return self.label_en if lang == "en" else self.label_ko


# The norm positions by name (not the position signals: POSITION_KINDS). The order is the figures' and the report's
# order (norm_rank). Adding a position (docs/reproducibility.md, "Adding a norm position"): a line here, its residual
# class in model/blocks.py (RESIDUAL), its name in params.schema.yaml's enum, its wiring in figures/doc000.py's DIAGRAMS,
# its formula written out in tests/test_lab.py, and, for a fix of post-norm (fixes_post), its claim lit-<name>-nowarm in
# reporting/claims.yaml. tests/test_layout.py, tests/test_new_norm_stages.py and tests/test_claim_links.py fail on
# any of these missing, and on a position whose block computes what a declared one's does (blocks.duplicate_positions).
NORM_POSITION_SPECS = {p.name: p for p in (
    NormPosition("post", "LN(h + F(h))", "Vaswani et al. 2017", 1, "", True, False, "#c0392b", "뒤 정규화", "post-norm"),
    NormPosition("pre", "h + F(LN(h))", "Xiong et al. 2020 (GPT-2's layout)", 1, "", False, True, "#1f6f8b",
                 "앞 정규화", "pre-norm"),
    NormPosition("deepnorm", "LN(α·h + F(h)), α = (2N)^¼; value, output and FFN weights × β = (8N)^-¼ at init",
                 "Wang et al. 2022 (DeepNet)", 1, "", True, False, "#7b3294", "DeepNorm", "DeepNorm", True),
    NormPosition("admin", "LN(ω ⊙ h + F(h)), ω learned, ω₀ = √((M+1)/ln(M+1) − 1), M = 2N residual sub-layers",
                 "Liu et al. 2020 (Admin)", 1, "vector", True, False, "#e08214", "Admin", "Admin", True),
    NormPosition("b2t", "x' = LN(x + A(x)); LN(x' + F(x') + x): the block input skips every norm but the last",
                 "Takase et al. 2022 (B2T connection)", 1, "", True, False, "#b8860b", "B2T", "B2T", True),
    NormPosition("rezero", "h + α·F(h), α learned, α₀ = 0, no norm anywhere", "Bachlechner et al. 2020 (ReZero)",
                 0, "scalar", False, False, "#4d9221", "ReZero", "ReZero", True),
    NormPosition("sandwich", "h + LN(F(LN(h)))", "Ding et al. 2021 (CogView sandwich); Kim et al. 2025 (Peri-LN)",
                 2, "", False, True, "#2c7fb8", "샌드위치 정규화", "sandwich (Peri-LN)", True),
)}
NORM_POSITIONS = tuple(NORM_POSITION_SPECS)


def norm_rank(name) -> int:
    """A norm position's place in the declared order (NORM_POSITION_SPECS: the figures' and the report's order); a
    name no position declares comes after every declared one."""
    return NORM_POSITIONS.index(name) if name in NORM_POSITION_SPECS else len(NORM_POSITIONS)
FFN_KINDS = ("relu", "gelu", "swiglu")
POSITION_KINDS = ("learned", "sinusoidal", "rope", "none")  # the position signals (params.schema.yaml's $defs.position)
INIT_SCHEMES = ("default", "xavier")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: as many as n_heads (plain multi-head attention)
    n_layers: int = 24  # decoder-only model; for encoder-decoder the decoder depth
    n_encoder_layers: int | None = None  # None: same as n_layers
    ffn_kind: str = "gelu"
    ffn_ratio: float = 4.0
    ffn_hidden: int | None = None  # None: round(ffn_ratio * d_model); published configs give it exactly
    norm_kind: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    position: str = "learned"
    rope_theta: float = 10000.0
    vocab_size: int = 64
    max_len: int = 64
    bias: bool = True
    tie_embeddings: bool = False
    init: str = "default"

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "vocab_size", "max_len"):
            _require_positive_int(name, getattr(self, name))
        for name in ("n_kv_heads", "n_encoder_layers", "ffn_hidden"):
            if getattr(self, name) is not None:
                _require_positive_int(name, getattr(self, name))
        _require_choice("ffn_kind", self.ffn_kind, FFN_KINDS)
        _require_choice("norm_kind", self.norm_kind, NORM_KINDS)
        _require_choice("norm_position", self.norm_position, NORM_POSITIONS)
        _require_choice("position", self.position, POSITION_KINDS)
        _require_choice("init", self.init, INIT_SCHEMES)
        if not self.ffn_ratio > 0:
            raise ConfigError(f"ffn_ratio must be > 0, got {self.ffn_ratio!r}")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be > 0, got {self.norm_eps!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"n_heads must divide d_model: d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"n_kv_heads must divide n_heads: n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}"
            )
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(f"position='rope' needs an even head dimension, got d_model/n_heads={self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden(self) -> int:
        return self.ffn_hidden or round(self.ffn_ratio * self.d_model)

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers or self.n_layers

    def replace(self, **changes) -> "ModelConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model field(s) {unknown}; allowed: {sorted(known)}")
        return cls(**values)


def _require_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _require_choice(name: str, value, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")
