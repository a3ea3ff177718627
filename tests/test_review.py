"""The block reviewer against blocks whose wiring is known independently: torch's own layers (their constructor
arguments say what they are), our blocks built from a ModelConfig, and deliberately broken blocks."""
import json

import pytest
import torch
from torch import nn

import broken_blocks
from blocklab import cli
from blocklab.config import ConfigError, ModelConfig
from blocklab.model import hf_config
from blocklab.model.layers import LayerNorm, RMSNorm
from blocklab.model.review import EXIT_FLAG, EXIT_PASS, EXIT_REJECT, EXIT_USAGE, norm_kind, review_hf_config, review_module

MODERN = {"n_kv_heads": 2, "ffn_kind": "swiglu", "norm_kind": "rmsnorm", "position": "rope", "bias": False}


def severities(review, check):
    return [f.severity for f in review.findings if f.check == check]


# --- our blocks ----------------------------------------------------------------------------------


def test_our_prenorm_encoder_passes():
    review = review_module("blocklab.model.blocks:EncoderBlock", "encoder")
    assert review.verdict == "pass" and review.exit_status == EXIT_PASS
    assert review.facts["norm_position"]["position"] == "pre"
    assert set(review.facts["norm_modules"].values()) == {"layernorm"}  # ModelConfig's default norm
    assert review.facts["ffn"]["ratio"] == ModelConfig().ffn_ratio
    assert review.facts["ffn"]["activation"] == ModelConfig().ffn_kind == "gelu"
    assert severities(review, "masking") == ["pass"]  # bidirectional
    assert review.facts["position"]["position_aware"] is False  # learned positions live in the embedding
    assert all(review.facts["residual_when_silenced"].values())


def test_our_causal_decoder_only_block_passes():
    review = review_module("blocklab.model.blocks:DecoderOnlyBlock", "decoder")
    assert review.verdict == "pass"
    assert severities(review, "causal mask") == ["pass"]
    assert review.facts["causal"]["without_caller_mask"]["max_leak"] == 0.0


def test_modern_decoder_detected_as_gqa_rmsnorm_swiglu_rope():
    review = review_module("blocklab.model.blocks:DecoderOnlyBlock", "decoder", kwargs=MODERN)
    (attention,) = review.facts["attention"].values()
    assert (attention["kind"], attention["heads"], attention["kv_heads"]) == ("GQA", ModelConfig().n_heads, 2)
    assert set(review.facts["norm_modules"].values()) == {"rmsnorm"}
    assert review.facts["ffn"]["kind"] == "swiglu" and review.facts["ffn"]["matrices"] == 3
    assert review.facts["position"]["position_aware"] is True  # RoPE breaks prefix-permutation invariance
    assert review.verdict == "pass"


def test_our_encoder_decoder_block_cross_attention():
    review = review_module("blocklab.model.blocks:DecoderBlock", "cross")
    cross = review.facts["cross_attention"]
    assert cross["memory_changes_output"] and cross["keeps_target_shape"]
    assert cross["cross_attention_modules"] == ["cross.sublayer"]  # DecoderBlock.cross is the cross-attention
    assert review.verdict == "pass"


def test_norm_kind_probe_matches_torch_norms():
    generator = torch.Generator().manual_seed(0)
    for module, expected in ((nn.LayerNorm(16), "layernorm"), (nn.RMSNorm(16, eps=1e-6), "rmsnorm"),
                             (LayerNorm(16), "layernorm"), (RMSNorm(16), "rmsnorm"), (nn.Linear(16, 16), "other")):
        assert norm_kind(module.double(), 16, generator) == expected


# --- torch's reference layers --------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_encoder_layer_norm_position(norm_first):
    review = review_module(nn.TransformerEncoderLayer, "encoder", kwargs={"norm_first": norm_first})
    assert review.facts["norm_position"]["position"] == ("pre" if norm_first else "post")
    assert review.facts["ffn"]["activation"] == "relu"  # torch's default activation
    assert review.facts["attention"]["self_attn"]["kind"] == "MHA"


def test_torch_encoder_layer_gelu_activation_is_read_off_the_hidden_values():
    review = review_module(nn.TransformerEncoderLayer, "encoder", kwargs={"activation": "gelu"})
    assert review.facts["ffn"]["activation"] == "gelu"


def test_torch_decoder_layer_masks_only_when_the_caller_asks():
    review = review_module("torch.nn:TransformerDecoderLayer", "cross")
    assert review.facts["causal"]["without_caller_mask"]["leaks"] is True
    assert review.facts["causal"]["with_caller_mask"]["leaks"] is False
    assert severities(review, "causal mask") == ["warn"]
    roles = {name: a["role"] for name, a in review.facts["attention"].items()}
    assert roles == {"self_attn": "self", "multihead_attn": "cross"}  # torch's names for the two attentions
    assert review.facts["norm_position"]["position"] == "post"  # norm_first defaults to False
    assert review.verdict == "flag" and review.exit_status == EXIT_FLAG


# --- the rules -----------------------------------------------------------------------------------


def test_leaking_decoder_is_rejected():
    review = review_module(broken_blocks.leaky_decoder, "decoder")
    assert severities(review, "causal mask") == ["reject"]
    assert review.exit_status == EXIT_REJECT


@pytest.mark.parametrize("depth, warmup, rejected", [(24, 0, True), (24, 4000, False), (12, 0, False)])
def test_deep_post_norm_without_warmup_is_rejected(depth, warmup, rejected):
    review = review_module("blocklab.model.blocks:EncoderBlock", "encoder", kwargs={"norm_position": "post"},
                           depth=depth, warmup_steps=warmup)
    assert (review.verdict == "reject") is rejected


def test_ffn_ratio_one_is_flagged():
    review = review_module("blocklab.model.blocks:EncoderBlock", "encoder", kwargs={"ffn_ratio": 1.0})
    assert review.facts["ffn"]["ratio"] == 1.0
    assert severities(review, "ffn ratio") == ["flag"] and review.verdict == "flag"


def test_missing_ffn_residual_is_flagged():
    review = review_module(broken_blocks.NoFFNResidual, "encoder")
    assert review.facts["residual_when_silenced"] == {"attn.sublayer": True, "ffn": False}
    assert review.verdict == "flag"


def test_hard_coded_ffn_width_is_warned():
    review = review_module(broken_blocks.FixedHidden, "encoder")
    fixed = review.facts["widths"]["fixed"]
    assert fixed and all(name.startswith("ffn.sublayer.") for name in fixed)
    assert "warn" in severities(review, "widths")


def test_block_that_ignores_d_model_is_warned():
    review = review_module(broken_blocks.IgnoresWidth, "encoder", d_model=96)
    assert review.facts["d_model"] == {"requested": 96, "probed": 64}
    assert severities(review, "widths").count("warn") == 2


def test_factory_without_width_is_probed_at_its_own_width():
    review = review_module(broken_blocks.fixed_modern_decoder, "decoder")
    assert review.facts["d_model"]["probed"] == 48
    assert review.facts["widths"] == {"tested": False}
    assert next(iter(review.facts["attention"].values()))["kind"] == "GQA"


# --- Hugging Face configs ------------------------------------------------------------------------


def test_llama3_8b_config_review():
    review = review_hf_config("llama3-8b")
    arch = review.facts["architecture"]
    assert (arch["attention_kind"], arch["num_heads"], arch["num_kv_heads"]) == ("GQA", 32, 8)
    assert arch["ffn_kind"] == "swiglu" and arch["ffn_ratio"] == 14336 / 4096
    assert arch["rope_theta"] == 500000.0 and arch["tie_embeddings"] is False
    assert severities(review, "norm kind") == ["pass"]
    assert review.facts["parameters"]["total"] == 8_030_261_248  # published (Hugging Face safetensors total)
    assert severities(review, "parameters") == ["pass"] and review.verdict == "pass"


def test_qwen3_vl_text_config_review():
    review = review_hf_config("qwen3-vl-4b-text")
    arch = review.facts["architecture"]
    assert arch["tie_embeddings"] is True and arch["qk_norm"] is True
    assert arch["head_dim"] == 128 and arch["head_dim_decoupled"] is True
    # no total is published for the text model alone; Qwen3-4B has the same text architecture and publishes one
    same = hf_config.load_config_dict("qwen3-vl-4b-text")["_published_same_architecture"]["total_parameters"]
    assert review.facts["parameters"]["total"] == same
    assert review.verdict == "pass"


# --- the command ---------------------------------------------------------------------------------


def test_cli_exit_statuses_and_json(tmp_path, capsys):
    out = tmp_path / "review.json"
    argv = ["review", "--module", "blocklab.model.blocks:EncoderBlock", "--role", "encoder", "--json", str(out)]
    assert cli.main(argv) == EXIT_PASS
    saved = json.loads(out.read_text())
    assert saved["verdict"] == "pass" and saved["exit_status"] == 0 and "code" in saved
    assert cli.main(["review", "--module", "broken_blocks:leaky_decoder", "--role", "decoder"]) == EXIT_REJECT
    assert cli.main(["review", "--module", "blocklab.model.blocks:EncoderBlock", "--role", "encoder",
                     "--kwargs", '{"ffn_ratio": 1}']) == EXIT_FLAG
    assert cli.main(["review", "--hf-config", "llama3-8b"]) == EXIT_PASS


@pytest.mark.parametrize("argv", [
    ["--module", "no_such_package.mod:Block", "--role", "encoder"],
    ["--module", "blocklab.model.blocks:NoSuchBlock", "--role", "encoder"],
    ["--hf-config", "/no/such/config.json"],
    ["--module", "blocklab.model.blocks:EncoderBlock"],  # no role
    ["--module", "blocklab.model.blocks:DecoderBlock", "--role", "decoder"],  # needs memory: cannot be called as block(x)
    ["--module", "blocklab.model.blocks:EncoderBlock", "--role", "encoder", "--kwargs", "[1]"],
])
def test_cli_user_errors_exit_3_with_one_line(argv, capsys):
    assert cli.main(["review", *argv]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("blocklab review: error:")


def test_cli_bad_choice_exits_3():
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["review", "--module", "blocklab.model.blocks:EncoderBlock", "--role", "sideways"])
    assert exit_info.value.code == EXIT_USAGE


def test_unsupported_model_type_is_a_config_error():
    with pytest.raises(ConfigError, match="model_type"):
        review_hf_config({"model_type": "bert", "hidden_size": 8})
