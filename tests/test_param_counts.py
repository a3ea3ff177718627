"""Parameter counts against independent references: numel of real modules (ours and transformers'), hand-written
closed forms, and published totals."""
import json
from pathlib import Path

import pytest
import torch
import yaml

from blocklab import cli
from blocklab.model_config import ConfigError, ModelConfig
from blocklab.experiments import param_counts
from blocklab.model import hf_config
from blocklab.model.blocks import EncoderBlock
from blocklab.model.counting import count_parameters
from blocklab.model.models import DecoderLM

LLAMA3_8B_PUBLISHED = 8_030_261_248  # Hugging Face safetensors total of meta-llama/Meta-Llama-3-8B


# --- exercise 1 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_kind, bias", [("rmsnorm", False), ("layernorm", True)])
def test_exercise1_block_by_hand(norm_kind, bias):
    """d_model=512, 8 heads, SwiGLU with expansion 4: count by hand, then against the built block's numel."""
    d, h = 512, 4 * 512
    attention = 4 * d * d + (4 * d if bias else 0)  # Q, K, V, O
    swiglu = 3 * d * h + ((2 * h + d) if bias else 0)  # W1 (gate), W3 (up), W2 (down)
    norms = 2 * (2 * d if norm_kind == "layernorm" else d)
    cfg = ModelConfig(d_model=d, n_heads=8, ffn_ratio=4, ffn_kind="swiglu", norm_kind=norm_kind, bias=bias)
    block = EncoderBlock(cfg)  # real tensors, as the exercise asks (about 17 MB)
    assert count_parameters(block) == attention + swiglu + norms
    row = param_counts.block_row("exercise1", "modern" if norm_kind == "rmsnorm" else "classic", d, 8, 4.0, "swiglu")
    assert row["built_numel"] == row["closed_form_total"] == attention + swiglu + norms
    # the document's terms are the weight matrices alone, counted from the module: 4 d^2 + 3 d h, exactly
    assert row["built_matrices"] == 4 * d * d + 3 * d * h == row["document_approx"]
    assert row["built_numel"] - row["built_matrices"] == norms + (4 * d + 2 * h + d if bias else 0)


def test_block_grid_closed_form_equals_meta_numel():
    frame = param_counts.blocks_frame({"d_models": [64, 96], "ffn_ratios": [2.6, 4], "n_heads": 4})
    assert len(frame) == 2 + 2 * 2 * 2 * 2
    assert frame["matches"].all()
    # the document's approximation leaves out norms and biases (and rounding of r·d): close, never exact here
    assert (frame["document_approx_rel_error"].abs() < 0.05).all()
    assert (frame["document_approx"] != frame["built_numel"]).all()


def test_meta_device_numel_equals_real_numel():
    cfg = ModelConfig(d_model=96, n_heads=4, ffn_kind="swiglu", ffn_ratio=2.6)
    assert param_counts.built_numel(cfg) == count_parameters(EncoderBlock(cfg))


# --- Hugging Face configs against transformers' own modules --------------------------------------

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 80, "vocab_size": 50,
        "max_position_embeddings": 64}
TINY_CASES = {
    "llama-mha-untied": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 4},
    "llama-gqa-tied-headdim-bias": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "head_dim": 12, "tie_word_embeddings": True, "attention_bias": True,
                                    "mlp_bias": True},
    "llama-mqa": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 1},
    "mistral-gqa": {"model_type": "mistral", "num_attention_heads": 4, "num_key_value_heads": 2},
    "qwen2-gqa-tied": {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2,
                       "tie_word_embeddings": True},
    "qwen3-headdim-untied": {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2,
                             "head_dim": 16},
    "qwen3-default-headdim-tied-bias": {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 4,
                                        "tie_word_embeddings": True, "attention_bias": True},
}


@pytest.mark.parametrize("case", sorted(TINY_CASES))
def test_formula_equals_transformers_numel_for_tiny_models(case):
    config = {**TINY, **TINY_CASES[case]}
    torch.manual_seed(0)
    model = hf_config.build_with_transformers(config, device="cpu")  # real random-init weights, in memory
    assert hf_config.total_parameters(hf_config.architecture(config)) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("tie", [True, False])
def test_multimodal_text_config_counts_like_transformers(tie):
    """A Qwen3-VL config: the text section is counted; the top-level tie flag decides the LM head."""
    text = {**TINY, "model_type": "qwen3_vl_text", "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "tie_word_embeddings": not tie}
    config = {"model_type": "qwen3_vl", "tie_word_embeddings": tie, "text_config": text, "vision_config": {}}
    arch = hf_config.architecture(config)
    assert arch.tie_embeddings is tie
    assert hf_config.total_parameters(arch) == hf_config.transformers_numel(config)


def test_llama3_8b_matches_published_total_three_ways():
    arch = hf_config.architecture("llama3-8b")
    assert hf_config.total_parameters(arch) == LLAMA3_8B_PUBLISHED == arch.published_total
    assert hf_config.transformers_numel("llama3-8b") == LLAMA3_8B_PUBLISHED
    ours, gaps = hf_config.to_model_config(arch)
    assert gaps == []
    with torch.device("meta"):  # our own DecoderLM from the mapped config, 8B parameters without allocating
        assert count_parameters(DecoderLM(ours)) == LLAMA3_8B_PUBLISHED


def test_qwen3_vl_text_count_and_its_references():
    raw = hf_config.load_config_dict("qwen3-vl-4b-text")
    arch = hf_config.architecture("qwen3-vl-4b-text")
    total = hf_config.total_parameters(arch)
    assert total == hf_config.transformers_numel("qwen3-vl-4b-text")
    assert total == raw["_published_same_architecture"]["total_parameters"]  # Qwen3-4B, same text architecture
    assert total < raw["_published_whole_vlm_parameters"]  # the vision tower comes on top
    breakdown = hf_config.parameter_breakdown(arch).set_index("component")
    assert breakdown.loc["lm_head", "count"] == 0  # tied
    assert breakdown.loc["q_norm", "count_each"] == arch.head_dim == 128
    ours, gaps = hf_config.to_model_config(arch)
    assert ours is None and any("head_dim" in g for g in gaps) and any("q_norm" in g for g in gaps)


def test_shipped_configs_name_their_source():
    for name in hf_config.SHIPPED:
        assert "huggingface.co" in hf_config.load_config_dict(name)["_source"]


def test_bad_configs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        hf_config.architecture(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        hf_config.architecture(bad)
    with pytest.raises(ConfigError, match="a decoder config needs it"):
        hf_config.architecture({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2})


# --- the document's arithmetic -------------------------------------------------------------------


def test_audit_of_the_documents_example():
    audit = param_counts.audit_frame().set_index("document_expression")
    d = 4096
    assert audit.loc["3·2.6·4096²", "computed_value"] == pytest.approx(3 * 2.6 * d * d)
    assert audit.loc["3·2.6·4096²", "verdict"] == "wrong"  # 131M, not 32M
    assert audit.loc["1.5B × 32", "computed_value"] == 48e9
    assert audit.loc["1.5B × 32", "verdict"] == "wrong"
    assert audit.loc["계층당 1.5B", "verdict"] == "wrong"  # one layer is about 198M
    whole = audit.loc["32 · (4·4096² + 3·2.6·4096²) ≈ 7B"]
    assert whole["computed_value"] == pytest.approx(32 * (4 + 7.8) * d * d)
    assert whole["verdict"] == "wrong" and whole["rounding"] == 0.5e9  # 6.34B is not within 7B's rounding (6.5B-7.5B)
    assert audit.loc["32 · (16 + 32) M", "verdict"] == "right"  # 1.536B written 1.5B: within its rounding (1.45-1.55B)
    assert audit.loc["exact count from config.json", "computed_value"] == LLAMA3_8B_PUBLISHED
    assert list(audit["about"]) == ["arithmetic"] * 7 + ["llama 3 8B"] * 5  # the chain, then the comparison


def test_a_written_number_is_judged_by_its_own_rounding_not_a_blanket_band():
    """No ±5 % / ±15 % band: "7B" holds 6.5B-7.5B, "1.5B" 1.45B-1.55B, "2.6" 2.55-2.65, "16M" 15.5M-16.5M."""
    assert param_counts.written("16M") == (16e6, 0.5e6) and param_counts.written("2.6") == (2.6, 0.05)
    value, half = param_counts.written("1.5B")
    assert value == pytest.approx(1.5e9) and half == pytest.approx(0.05e9)
    assert param_counts.verdict("7B", 6.51e9)[2] == "right" and param_counts.verdict("7B", 6.49e9)[2] == "wrong"
    assert param_counts.verdict("1.5B", 1.56e9)[2] == "wrong"  # 4 % off: a 5 % band would have called it right
    assert param_counts.verdict(4.0, 4.0)[2] == "right" and param_counts.verdict(4.0, 4.0 + 1e-9)[2] == "wrong"


# --- the command ---------------------------------------------------------------------------------


def test_cli_writes_all_tables(tmp_path):
    params = yaml.safe_load((Path(__file__).parent.parent / "params.yaml").read_text(encoding="utf-8"))
    params["param_counts"].update(d_models=[64], ffn_ratios=[4], n_heads=4, hf_configs=["llama3-8b"])
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    out = tmp_path / "out"
    assert cli.main(["exp", "param-counts", "--params", str(path), "--out-dir", str(out)]) == 0
    for name in ("blocks.csv", "models.csv", "model_components.csv", "audit.csv"):
        assert (out / name).stat().st_size > 0
    meta = json.loads((out / "param_counts.json").read_text())
    assert meta["all_blocks_match"] is True
    assert meta["models"]["llama3-8b"] == {"total": LLAMA3_8B_PUBLISHED, "published": LLAMA3_8B_PUBLISHED}


def test_block_breakdown_figure_shares_add_up():
    from blocklab.figures.params import block_breakdown_figure

    frame = param_counts.blocks_frame({"d_models": [64, 96], "ffn_ratios": [4], "n_heads": 4})
    fig = block_breakdown_figure(frame, lang="en")
    bars = fig.axes[0].patches
    assert len(bars) == 3 * 2  # attention, FFN, norms for each of the two widths
    for row in range(2):
        assert sum(bars[row + 2 * part].get_width() for part in range(3)) == pytest.approx(1.0)
