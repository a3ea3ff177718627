"""Hugging Face ``config.json`` files: read the decoder architecture, map it to ModelConfig, count parameters exactly.

The count is written term by term from the module layout of the Hugging Face implementations (modeling_llama.py,
modeling_qwen2.py, modeling_qwen3.py, modeling_qwen3_vl.py, modeling_mistral.py), so every row of the breakdown names
one weight tensor of one layer:

    embed_tokens   V x d                     lm_head        V x d (0 when tied to embed_tokens)
    q_proj         d x (H * hd)  [+ H*hd]    k_proj, v_proj d x (KV * hd) [+ KV*hd]   (GQA: KV < H)
    o_proj         (H * hd) x d  [+ d]       q_norm, k_norm hd each (Qwen3 only, RMSNorm over one head)
    gate, up       d x I  [+ I]              down           I x d  [+ d]
    input_layernorm, post_attention_layernorm   d each       final norm     d

with hd the explicit ``head_dim`` when the config gives one (Qwen3-4B: 128, not 2560 / 32 = 80).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import pandas as pd

from ..model_config import ConfigError, ModelConfig

SHIPPED = {"llama3-8b": "llama3-8b.json", "qwen3-vl-4b-text": "qwen3-vl-4b-text.json"}
# The names a user types for a shipped config: `blocklab review llama` is Llama 3 8B, the Llama the README speaks of
# (transformers' own LlamaConfig defaults are Llama 2 7B's shape: `--table llama` and the library's API keep those).
NAMED = {"llama": "llama3-8b"}


@dataclass(frozen=True)
class Family:
    """What a model_type's modeling file hard-codes, as opposed to what its config.json says."""

    qk_norm: bool  # per-head RMSNorm on queries and keys (Qwen3)
    qkv_bias: str  # "config" (attention_bias) | "always" | "never"
    o_bias: str
    mlp_bias: str  # "config" (mlp_bias) | "never"
    # what the transformers config class assumes when config.json leaves a key out (None: hidden_size / heads,
    # resp. as many K/V heads as query heads)
    default_head_dim: int | None = None
    default_kv_heads: int | None = None


FAMILIES = {
    "llama": Family(qk_norm=False, qkv_bias="config", o_bias="config", mlp_bias="config"),
    "mistral": Family(qk_norm=False, qkv_bias="never", o_bias="never", mlp_bias="never", default_kv_heads=8),
    "qwen2": Family(qk_norm=False, qkv_bias="always", o_bias="never", mlp_bias="never", default_kv_heads=32),
    "qwen3": Family(qk_norm=True, qkv_bias="config", o_bias="config", mlp_bias="never", default_head_dim=128,
                    default_kv_heads=32),
    "qwen3_vl_text": Family(qk_norm=True, qkv_bias="config", o_bias="config", mlp_bias="never", default_head_dim=128,
                            default_kv_heads=32),
}
GATED_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu"}


@dataclass(frozen=True)
class HFArchitecture:
    """The decoder-only text model a config.json describes (every family here is pre-norm RMSNorm + gated MLP)."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_decoupled: bool  # head_dim != hidden_size / heads (Qwen3-4B: 128, not 80)
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    hidden_act: str
    norm_eps: float
    qk_norm: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope_theta: float | None
    rope_scaling: dict | None
    max_position_embeddings: int | None
    published_total: int | None = None
    source: str | None = None

    @property
    def ffn_ratio(self) -> float:
        return self.intermediate_size / self.hidden_size

    @property
    def ffn_kind(self) -> str:
        return GATED_ACTIVATIONS.get(self.hidden_act, f"gated-{self.hidden_act}")

    @property
    def attention_kind(self) -> str:
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    def to_dict(self) -> dict:
        derived = {"ffn_ratio": self.ffn_ratio, "ffn_kind": self.ffn_kind, "attention_kind": self.attention_kind}
        return {**asdict(self), **derived}


# --- loading -------------------------------------------------------------------------------------


def shipped_path(name: str):
    if name not in SHIPPED:
        raise ConfigError(f"unknown shipped config {name!r}; allowed: {sorted(SHIPPED)}")
    return resources.files("blocklab.model").joinpath("hf_configs", SHIPPED[name])


def load_config_dict(source: str | Path | dict) -> dict:
    """A dict as is; a shipped name ('llama3-8b'); or a path to a config.json."""
    if isinstance(source, dict):
        return source
    if str(source) in SHIPPED:
        return json.loads(shipped_path(str(source)).read_text(encoding="utf-8"))
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist (or name one of {sorted(SHIPPED)})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from None


def text_config(config: dict) -> dict:
    """The decoder's own section: ``text_config`` of a multimodal config, else the config itself.

    A multimodal model ties its LM head by the top-level flag (that is the one transformers reads for
    Qwen3VLForConditionalGeneration), so the top level wins over the text section's copy.
    """
    if "text_config" not in config:
        return config
    text = dict(config["text_config"])
    if "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    for key in ("_source", "_published_total_parameters"):
        text.setdefault(key, config.get(key))
    return text


def _rope(cfg: dict) -> tuple[float | None, dict | None]:
    """transformers < 5 writes rope_theta / rope_scaling; transformers 5 folds both into rope_parameters."""
    parameters = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", parameters.get("rope_theta"))
    scaling = cfg.get("rope_scaling") or {k: v for k, v in parameters.items() if k != "rope_theta"} or None
    return (float(theta) if theta is not None else None), scaling


def _bias(rule: str, cfg: dict, key: str) -> bool:
    return {"always": True, "never": False}.get(rule, bool(cfg.get(key, False)))


def _require(cfg: dict, key: str, name: str):
    if key not in cfg:
        raise ConfigError(f"{name}: config has no {key!r}; a decoder config needs it")
    return cfg[key]


def architecture(source: str | Path | dict, name: str | None = None) -> HFArchitecture:
    """Parse a config (dict, shipped name or path) into the fields the count and the reviewer need."""
    raw = load_config_dict(source)
    name = name or (str(source) if not isinstance(source, dict) else raw.get("_name_or_path", "config"))
    cfg = text_config(raw)
    model_type = cfg.get("model_type", raw.get("model_type"))
    if model_type not in FAMILIES:
        raise ConfigError(f"{name}: model_type={model_type!r} is not supported; allowed: {sorted(FAMILIES)}")
    family = FAMILIES[model_type]
    d = _require(cfg, "hidden_size", name)
    heads = _require(cfg, "num_attention_heads", name)
    head_dim = cfg.get("head_dim") or family.default_head_dim or d // heads
    kv_heads = cfg.get("num_key_value_heads", family.default_kv_heads) or heads
    theta, scaling = _rope(cfg)
    published = cfg.get("_published_total_parameters")
    return HFArchitecture(
        name=name,
        model_type=model_type,
        hidden_size=d,
        num_layers=_require(cfg, "num_hidden_layers", name),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        head_dim_decoupled=head_dim != d // heads,
        intermediate_size=_require(cfg, "intermediate_size", name),
        vocab_size=_require(cfg, "vocab_size", name),
        # every family here defaults to untied in its transformers config class
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        hidden_act=cfg.get("hidden_act", "silu"),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qk_norm=family.qk_norm,
        qkv_bias=_bias(family.qkv_bias, cfg, "attention_bias"),
        o_bias=_bias(family.o_bias, cfg, "attention_bias"),
        mlp_bias=_bias(family.mlp_bias, cfg, "mlp_bias"),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        published_total=int(published) if published is not None else None,
        source=cfg.get("_source"),
    )


# --- counting ------------------------------------------------------------------------------------


def parameter_breakdown(arch: HFArchitecture) -> pd.DataFrame:
    """One row per weight tensor kind: component, group, shape, count_each, multiplicity, count (= each x mult)."""
    d, hd, inner = arch.hidden_size, arch.head_dim, arch.intermediate_size
    q_width, kv_width = arch.num_heads * hd, arch.num_kv_heads * hd
    L, V = arch.num_layers, arch.vocab_size
    rows = [
        ("embed_tokens", "embedding", f"{V}x{d}", V * d, 1),
        ("lm_head", "embedding", "tied to embed_tokens" if arch.tie_embeddings else f"{V}x{d}",
         0 if arch.tie_embeddings else V * d, 1),
        ("q_proj", "attention", f"{d}x{q_width}", d * q_width + (q_width if arch.qkv_bias else 0), L),
        ("k_proj", "attention", f"{d}x{kv_width}", d * kv_width + (kv_width if arch.qkv_bias else 0), L),
        ("v_proj", "attention", f"{d}x{kv_width}", d * kv_width + (kv_width if arch.qkv_bias else 0), L),
        ("o_proj", "attention", f"{q_width}x{d}", q_width * d + (d if arch.o_bias else 0), L),
    ]
    if arch.qk_norm:
        rows += [("q_norm", "attention", f"{hd}", hd, L), ("k_norm", "attention", f"{hd}", hd, L)]
    mlp_in_bias, mlp_out_bias = (inner, d) if arch.mlp_bias else (0, 0)
    rows += [
        ("gate_proj", "mlp", f"{d}x{inner}", d * inner + mlp_in_bias, L),
        ("up_proj", "mlp", f"{d}x{inner}", d * inner + mlp_in_bias, L),
        ("down_proj", "mlp", f"{inner}x{d}", inner * d + mlp_out_bias, L),
        ("input_layernorm", "norm", f"{d}", d, L),
        ("post_attention_layernorm", "norm", f"{d}", d, L),
        ("final_norm", "norm", f"{d}", d, 1),
    ]
    frame = pd.DataFrame(rows, columns=["component", "group", "shape", "count_each", "multiplicity"])
    frame["count"] = frame["count_each"] * frame["multiplicity"]
    frame.insert(0, "model", arch.name)
    return frame


def total_parameters(arch: HFArchitecture) -> int:
    return int(parameter_breakdown(arch)["count"].sum())


def per_layer_parameters(arch: HFArchitecture) -> int:
    frame = parameter_breakdown(arch)
    return int(frame.loc[frame["multiplicity"] == arch.num_layers, "count_each"].sum())


def summary(arch: HFArchitecture) -> dict:
    """Totals by group, the non-embedding count, and the comparison with the published total when there is one."""
    frame = parameter_breakdown(arch)
    by_group = frame.groupby("group")["count"].sum().astype(int).to_dict()
    total = int(frame["count"].sum())
    out = {
        "model": arch.name,
        "total": total,
        "per_layer": per_layer_parameters(arch),
        "layers": arch.num_layers,
        "embedding": by_group.get("embedding", 0),
        "non_embedding": total - by_group.get("embedding", 0),
        **{f"{group}_total": count for group, count in by_group.items()},
        "published_total": arch.published_total,
    }
    out["matches_published"] = None if arch.published_total is None else total == arch.published_total
    return out


# --- mapping to our ModelConfig ------------------------------------------------------------------


def to_model_config(arch: HFArchitecture) -> tuple[ModelConfig | None, list[str]]:
    """Our ModelConfig for the same decoder, or None with the reasons it cannot express it.

    ModelConfig derives head_dim = d_model / n_heads, has no per-head q/k norms, and one ``bias`` flag for
    every linear layer and norm; a config outside that is reported, not approximated.
    """
    problems = []
    if arch.head_dim_decoupled:
        problems.append(f"head_dim={arch.head_dim} differs from hidden_size/heads={arch.hidden_size // arch.num_heads}")
    if arch.qk_norm:
        problems.append("per-head q_norm/k_norm RMSNorms (not in ModelConfig)")
    if len({arch.qkv_bias, arch.o_bias, arch.mlp_bias}) > 1:
        problems.append("bias on some linear layers only")
    if arch.ffn_kind != "swiglu":
        problems.append(f"gated MLP with {arch.hidden_act} (ModelConfig has SwiGLU only)")
    if problems:
        return None, problems
    cfg = ModelConfig(
        d_model=arch.hidden_size,
        n_heads=arch.num_heads,
        n_kv_heads=arch.num_kv_heads,
        n_layers=arch.num_layers,
        ffn_kind="swiglu",
        ffn_ratio=arch.ffn_ratio,
        ffn_hidden=arch.intermediate_size,
        norm_kind="rmsnorm",
        norm_position="pre",
        norm_eps=arch.norm_eps,
        position="rope",
        rope_theta=arch.rope_theta or 10000.0,
        vocab_size=arch.vocab_size,
        max_len=arch.max_position_embeddings or 2048,
        bias=arch.qkv_bias,  # one flag for every linear layer; RMSNorm has no bias either way
        tie_embeddings=arch.tie_embeddings,
    )
    return cfg, []


# --- independent check: let transformers build the model ------------------------------------------

_TRANSFORMERS_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def build_with_transformers(source: str | Path | dict, device: str = "meta"):
    """The text model as transformers builds it from the same config; on the meta device nothing is allocated.

    A Qwen3-VL text section is built inside Qwen3VLForConditionalGeneration (the only class that builds its LM
    head, tied or not) and handed back with the vision tower removed.
    """
    import torch
    import transformers

    raw = load_config_dict(source)
    cfg = {k: v for k, v in text_config(raw).items() if not k.startswith("_")}
    model_type = cfg.get("model_type")
    with torch.device(device):
        if model_type == "qwen3_vl_text":
            tie = cfg.get("tie_word_embeddings", False)
            full = transformers.Qwen3VLConfig(text_config=cfg, tie_word_embeddings=tie)
            model = transformers.Qwen3VLForConditionalGeneration(full)
            del model.model.visual
            return model
        if model_type not in _TRANSFORMERS_CLASSES:
            raise ConfigError(f"model_type={model_type!r} has no transformers builder here; allowed: "
                              f"{sorted([*_TRANSFORMERS_CLASSES, 'qwen3_vl_text'])}")
        config_class, model_class = (getattr(transformers, n) for n in _TRANSFORMERS_CLASSES[model_type])
        return model_class(config_class(**cfg))


def transformers_numel(source: str | Path | dict) -> int:
    """sum(p.numel()) of the transformers build; tied tensors count once, as parameters() yields them once."""
    return sum(p.numel() for p in build_with_transformers(source).parameters())
