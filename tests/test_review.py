"""The block reviewer against blocks whose wiring is known independently: torch's own layers (their constructor
arguments say what they are), our blocks built from a ModelConfig, the Hugging Face architectures installed with
transformers (their source says what they are), and deliberately broken blocks."""
import functools
import json

import pytest
import torch
from torch import nn
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import broken_blocks
from blocklab import cli
from blocklab.model_config import ModelConfig
from blocklab.model import hf_config
from blocklab.model.layers import LayerNorm, RMSNorm
from blocklab.review import (EXIT_CANNOT, EXIT_FLAG, EXIT_PASS, EXIT_REJECT, EXIT_USAGE, norm_kind,
                                   review_architecture, review_model, review_module)
from blocklab.review import hf as hf_arch
from blocklab.review.architecture import STRUCTURE_KEYS
from blocklab.review.table import table_rows

MODERN = {"n_kv_heads": 2, "ffn_kind": "swiglu", "norm_kind": "rmsnorm", "position": "rope", "bias": False}


def severities(review, check):
    return [f.severity for f in review.findings if f.check == check]


def structure_values(structure):
    return {key: structure[key] for key in STRUCTURE_KEYS}


# --- our blocks ----------------------------------------------------------------------------------


def residual_kept(structure):
    return {s["writer"]: s["residual_kept_when_silenced"] for s in structure["evidence"]["sublayers"]}


def test_our_prenorm_encoder_passes():
    review = review_module("blocklab.model.blocks:EncoderBlock", "encoder")
    assert review.verdict == "pass" and review.exit_status == EXIT_PASS
    s = review.facts["structure"]
    assert (s["norm_placement"], s["norm_kind"]) == ("pre", "layernorm")  # ModelConfig's default norm
    assert s["ffn_ratio"] == ModelConfig().ffn_ratio
    assert s["evidence"]["ffn"]["activation"] == ModelConfig().ffn_kind == "gelu"
    assert severities(review, "masking") == ["pass"] and s["causal"] is False  # bidirectional
    assert s["position"] == "none"  # learned positions live in the embedding
    assert all(residual_kept(s).values())


def test_our_causal_decoder_only_block_passes():
    review = review_module("blocklab.model.blocks:DecoderOnlyBlock", "decoder")
    assert review.verdict == "pass"
    assert severities(review, "causal mask") == ["pass"]
    assert review.facts["causal"]["without_caller_mask"]["max_leak"] == 0.0


def test_modern_decoder_detected_as_gqa_rmsnorm_swiglu_rope():
    review = review_module("blocklab.model.blocks:DecoderOnlyBlock", "decoder", kwargs=MODERN)
    cfg = ModelConfig(**MODERN)  # the data flow's structure (the JSON's) against the config the block was built from
    assert structure_values(review.facts["structure"]) == dict(
        residual="sequential", norm_placement=cfg.norm_position, norm_kind="rmsnorm", attention="GQA",
        query_heads=cfg.n_heads, kv_heads=2, qk_norm=False, position="rope", ffn="swiglu", ffn_ratio=cfg.ffn_ratio,
        causal=True, cross_attention=False)
    assert review.facts["structure"]["evidence"]["ffn"]["matrices"] == 3
    assert review.facts["structure"]["evidence"]["rotary_fraction"] == 1.0  # layers.py rotates every pair
    assert review.verdict == "pass"


def test_our_encoder_decoder_block_cross_attention():
    review = review_module("blocklab.model.blocks:DecoderBlock", "cross")
    assert review.facts["cross_attention"]["memory_changes_output"]
    s = review.facts["structure"]
    assert s["cross_attention"] is True and s["causal"] is True
    # DecoderBlock.cross is the cross-attention: its sub-layer reads the memory
    assert [sub["writer"].split(".")[0] for sub in s["evidence"]["sublayers"] if sub["cross"]] == ["cross"]
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
    s = review.facts["structure"]
    assert s["norm_placement"] == ("pre" if norm_first else "post")
    assert s["evidence"]["ffn"]["activation"] == "relu"  # torch's default activation
    assert (s["attention"], s["query_heads"], s["kv_heads"]) == ("MHA", 4, 4)  # built with nhead=4
    assert review.facts["traced_multihead_attention"] == ["self_attn"]
    assert review.exit_status == EXIT_PASS


def test_torch_encoder_layer_gelu_activation_is_read_off_the_hidden_values():
    review = review_module(nn.TransformerEncoderLayer, "encoder", kwargs={"activation": "gelu"})
    assert review.facts["structure"]["evidence"]["ffn"]["activation"] == "gelu"


def test_torch_decoder_layer_masks_only_when_the_caller_asks():
    review = review_module("torch.nn:TransformerDecoderLayer", "cross")
    assert review.facts["causal"]["without_caller_mask"]["leaks"] is True
    assert review.facts["causal"]["with_caller_mask"]["leaks"] is False
    assert severities(review, "causal mask") == ["warn", "pass"]  # left to the caller; with it, causal
    subs = {sub["writer"]: sub["cross"] for sub in review.facts["structure"]["evidence"]["sublayers"]}
    # torch's names for the two attentions, and the FFN's second linear
    assert subs == {"self_attn.out_proj": False, "multihead_attn.out_proj": True, "linear2": False}
    assert review.facts["structure"]["norm_placement"] == "post"  # norm_first defaults to False
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
    assert review.facts["structure"]["norm_placement"] == "post" and review.facts["structure"]["causal"] is False


def test_ffn_ratio_one_is_flagged():
    review = review_module("blocklab.model.blocks:EncoderBlock", "encoder", kwargs={"ffn_ratio": 1.0})
    assert review.facts["structure"]["ffn_ratio"] == 1.0
    assert severities(review, "ffn ratio") == ["flag"] and review.verdict == "flag"


def test_missing_ffn_residual_is_flagged():
    review = review_module(broken_blocks.NoFFNResidual, "encoder")
    assert residual_kept(review.facts["structure"]) == {"attn.sublayer.o": True, "ffn.sublayer.down": False}
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
    assert review.facts["structure"]["attention"] == "GQA"


# --- Hugging Face architectures, built tiny from their own config class ---------------------------
# Every expectation below is read from the installed transformers 5.24 source (paths under transformers/models/),
# never from the reviewer's output. "cfg" is the model's configuration_*.py, "mod" its modeling_*.py.

HF = {
    # llama: mod 296-314 residual + attn(input_layernorm(h)), then residual + mlp(post_attention_layernorm(h));
    # mod 53-66 RMSNorm (rsqrt of the mean square, no mean subtracted); mod 164 down(act(gate) * up), cfg 69 silu;
    # mod 249 apply_rotary_pos_emb on q and k; cfg 67-68 + 88-89: 32 heads, K/V heads default to the query heads;
    # cfg 64-65: 11008 / 4096; mod 217 is_causal
    "llama": dict(residual="sequential", norm_placement="pre", norm_kind="rmsnorm", attention="MHA", query_heads=32,
                  kv_heads=32, qk_norm=False, position="rope", ffn="swiglu", ffn_ratio=11008 / 4096, causal=True,
                  cross_attention=False),
    # mistral: mod 223-241 as llama; cfg 66-67: 32 query heads, 8 K/V heads; cfg 63-64: 14336 / 4096; mod 47 SwiGLU
    "mistral": dict(residual="sequential", norm_placement="pre", norm_kind="rmsnorm", attention="GQA", query_heads=32,
                    kv_heads=8, qk_norm=False, position="rope", ffn="swiglu", ffn_ratio=14336 / 4096, causal=True,
                    cross_attention=False),
    # qwen3: mod 229-230 + 245-246 q_norm / k_norm (RMSNorm over head_dim) before RoPE (mod 250); mod 298-316 pre-norm;
    # cfg 65-66: 32/32 heads; cfg 62-63: 22016 / 4096
    "qwen3": dict(residual="sequential", norm_placement="pre", norm_kind="rmsnorm", attention="MHA", query_heads=32,
                  kv_heads=32, qk_norm=True, position="rope", ffn="swiglu", ffn_ratio=22016 / 4096, causal=True,
                  cross_attention=False),
    # gemma2: mod 307-327 input_layernorm before attention AND post_attention_layernorm on its output before the add,
    # the same around the MLP (pre_/post_feedforward_layernorm): sandwich; mod 49-56 RMSNorm; cfg 74
    # gelu_pytorch_tanh in mod 81's gated MLP: GeGLU; cfg 71-72: 8 query / 4 K/V heads; cfg 68-69: 9216 / 2304
    "gemma2": dict(residual="sequential", norm_placement="sandwich", norm_kind="rmsnorm", attention="GQA",
                   query_heads=8, kv_heads=4, qk_norm=False, position="rope", ffn="geglu", ffn_ratio=9216 / 2304,
                   causal=True, cross_attention=False),
    # gpt_neox: cfg 78 use_parallel_residual=True -> mod 260-263 mlp(post_attention_layernorm(h)) + attn + h, both
    # norms read the layer input h; mod 232-233 nn.LayerNorm; mod 181 fused query_key_value 3*hidden (MHA, cfg 64: 64
    # heads); mod 176 + cfg 98 rotary on 25 % of each head; mod 46-47 + cfg 66 gelu; cfg 62, 65: 24576 / 6144
    "gpt_neox": dict(residual="parallel", norm_placement="pre", norm_kind="layernorm", attention="MHA", query_heads=64,
                     kv_heads=64, qk_norm=False, position="rope", ffn="gelu", ffn_ratio=4.0, causal=True,
                     cross_attention=False),
    # gpt2: mod 276-310 ln_1 before attention, ln_2 before the MLP, residual adds; mod 254-256 nn.LayerNorm; mod 107 +
    # 187 fused c_attn split into q, k, v of embed_dim each (cfg 81: 12 heads); mod 492 + 576 learned wpe added to the
    # token embedding; mod 241-242 + cfg 83 gelu_new; cfg 82 n_inner None -> 4 x n_embd; mod 583 create_causal_mask
    "gpt2": dict(residual="sequential", norm_placement="pre", norm_kind="layernorm", attention="MHA", query_heads=12,
                 kv_heads=12, qk_norm=False, position="learned", ffn="gelu", ffn_ratio=4.0, causal=True,
                 cross_attention=False),
    # bert: mod 293 LayerNorm(attention output + input) and mod 352 LayerNorm(FFN output + input): post-norm;
    # mod 155-157 separate query/key/value of all_head_size (cfg 47: 12 heads); mod 60 learned position_embeddings;
    # mod 338 + cfg 49 gelu; cfg 45, 48: 3072 / 768; encoder without is_causal (mod 162, default False)
    "bert": dict(residual="sequential", norm_placement="post", norm_kind="layernorm", attention="MHA", query_heads=12,
                 kv_heads=12, qk_norm=False, position="learned", ffn="gelu", ffn_ratio=3072 / 768, causal=False,
                 cross_attention=False),
    # bloom (its config class is already small: cfg 58-60 hidden 64, 8 heads): mod 62-89 + 271 ALiBi slopes times
    # distance added to the logits (baddbmm); mod 197 fused query_key_value 3 x hidden; mod 373-395 input_layernorm
    # before attention, post_attention_layernorm before the MLP, residual from the unnormalized input (cfg default
    # apply_residual_connection_post_layernorm False); mod 350 LayerNorm; mod 121 + 321-327 tanh GELU, 4 x hidden
    "bloom": dict(residual="sequential", norm_placement="pre", norm_kind="layernorm", attention="MHA", query_heads=8,
                  kv_heads=8, qk_norm=False, position="alibi", ffn="gelu", ffn_ratio=4.0, causal=True,
                  cross_attention=False),
    # ctrl: mod 46-51 + 230 + 320 a sinusoid table in a buffer, indexed by position and added to the embedding;
    # mod 175-187 layernorm1 before attention, layernorm2 before the FFN (mod 162-163 nn.LayerNorm); mod 152
    # Linear, ReLU, Linear; cfg 54-57: 16 heads, 8192 / 1280
    "ctrl": dict(residual="sequential", norm_placement="pre", norm_kind="layernorm", attention="MHA", query_heads=16,
                 kv_heads=16, qk_norm=False, position="sinusoidal", ffn="relu", ffn_ratio=8192 / 1280, causal=True,
                 cross_attention=False),
}
# t5: mod 395 + 139-141 h + sublayer(layer_norm(h)): pre-norm; mod 51-66 T5LayerNorm divides by the root mean square
# without subtracting the mean: RMSNorm; mod 207-208 q, k, v of n_heads * d_kv (cfg 45, 49: 8 heads of 64, MHA);
# mod 213 relative_attention_bias embedding added to the logits; cfg 55 feed_forward_proj relu -> mod 79-86 wi, relu,
# wo; cfg 44, 46: 2048 / 512; mod 410-427 the decoder's EncDecAttention; mod 701 the decoder's create_causal_mask
T5_COMMON = dict(residual="sequential", norm_placement="pre", norm_kind="rmsnorm", attention="MHA", query_heads=8,
                 kv_heads=8, qk_norm=False, position="relative-bias", ffn="relu", ffn_ratio=2048 / 512)
T5 = {"encoder": dict(T5_COMMON, causal=False, cross_attention=False),
      "decoder": dict(T5_COMMON, causal=True, cross_attention=True)}


@functools.cache
def hf_review(model_type, attention="eager"):
    return review_architecture(model_type, attention=attention)


@pytest.mark.parametrize("model_type", sorted(HF))
def test_hf_architecture_structure_read_from_the_data_flow(model_type):
    review = hf_review(model_type)
    assert structure_values(review.facts["structure"]) == HF[model_type]
    assert review.exit_status in (EXIT_PASS, EXIT_FLAG)


def test_t5_reviews_both_stacks():
    review = hf_review("t5")
    assert {stack: structure_values(s) for stack, s in review.facts["structure"].items()} == T5


@pytest.mark.parametrize("model_type, fraction", [
    ("gpt_neox", 0.25),  # cfg 98 partial_rotary_factor 0.25; mod 176 rotary_ndims = head_size * 0.25
    ("gemma2", 1.0),  # mod 257 apply_rotary_pos_emb on the whole query and key, slow pairs too
])
def test_rotated_fraction_of_each_head(model_type, fraction):
    assert hf_review(model_type).facts["structure"]["evidence"]["rotary_fraction"] == fraction


# full-size counts: closed forms written from the module layouts, independent of the reviewer's meta-device count
def gpt2_closed_form(V=50257, P=1024, d=768, L=12):
    # wte, wpe; per block ln_1, c_attn (d x 3d + 3d), c_proj (d x d + d), ln_2, c_fc (d x 4d + 4d), c_proj (4d x d + d);
    # ln_f; lm_head tied to wte (cfg tie_word_embeddings=True)
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    return V * d + P * d + L * block + 2 * d


def t5_closed_form(V=32128, d=512, d_ff=2048, inner=512, L=6, buckets=32, heads=8):
    # shared embedding (tied lm_head); per encoder block: attention q, k, v, o + norm, FFN wi, wo + norm; the decoder
    # adds cross-attention + norm; one relative_attention_bias (buckets x heads) per stack; a final norm per stack
    attention, ffn = 4 * d * inner + d, 2 * d * d_ff + d
    encoder = L * (attention + ffn) + buckets * heads + d
    decoder = L * (2 * attention + ffn) + buckets * heads + d
    return V * d + encoder + decoder


@pytest.mark.parametrize("model_type, expected", [
    ("gpt2", gpt2_closed_form()),  # 124,439,808: GPT-2 small as published
    ("t5", t5_closed_form()),  # 60,506,624: t5-small as published
    ("mistral", None),  # None: hf_config's closed form (written from modeling_mistral.py) on the same config
    ("llama", None),
])
def test_full_size_parameter_count(model_type, expected):
    review = hf_review(model_type)
    if expected is None:
        config = AutoConfig.for_model(model_type).to_dict()
        expected = hf_config.total_parameters(hf_config.architecture(config))
    assert review.facts["parameters"] == expected
    checks = review.facts["count_checks"]
    assert checks["tiny_meta"] == checks["tiny_built"]


def test_gpt2_verdict_does_not_depend_on_the_attention_backend():
    eager, sdpa = hf_review("gpt2"), hf_review("gpt2", "sdpa")
    assert structure_values(sdpa.facts["structure"]) == structure_values(eager.facts["structure"])
    assert [(f.check, f.severity) for f in sdpa.findings] == [(f.check, f.severity) for f in eager.findings]
    assert sdpa.exit_status == eager.exit_status == EXIT_PASS


def test_shipped_llama3_8b_config_is_counted_exactly():
    review = review_architecture("llama3-8b")
    assert review.facts["parameters"] == 8_030_261_248  # published (Hugging Face safetensors total)
    assert review.facts["count_checks"]["closed_form"] == 8_030_261_248
    # llama3-8b.json: 32 query heads, 8 K/V heads, intermediate 14336 over hidden 4096
    s = review.facts["structure"]
    assert (s["attention"], s["query_heads"], s["kv_heads"], s["ffn_ratio"]) == ("GQA", 32, 8, 14336 / 4096)
    assert review.verdict == "pass"


def test_shipped_qwen3_vl_text_config_counts_like_qwen3_4b():
    review = review_architecture("qwen3-vl-4b-text")
    # no total is published for the text model alone; Qwen3-4B has the same text architecture and publishes one
    same = hf_config.load_config_dict("qwen3-vl-4b-text")["_published_same_architecture"]["total_parameters"]
    assert review.facts["parameters"] == same
    assert review.facts["structure"]["qk_norm"] is True and review.verdict == "pass"


# --- planted defects inside real models ----------------------------------------------------------


def tiny(model_type, attention="eager"):
    full = hf_arch.load_config(model_type)
    config = hf_arch.shrink(full, attention)
    return hf_arch.build_tiny(config), config


def test_attention_that_drops_the_models_mask_is_rejected():
    model, config = tiny("llama")
    for layer in model.layers:  # eager attention adds the mask only when given one (mod 194-195, 258-263)
        original = layer.self_attn.forward
        layer.self_attn.forward = lambda *a, original=original, **kw: original(*a, **{**kw, "attention_mask": None})
    review = review_model(model, config, subject="llama with a dropped mask")
    assert review.facts["structure"]["causal"] is False
    assert review.severity_of("causal mask") == "reject" and review.exit_status == EXIT_REJECT


class PostNormLlamaLayer(LlamaDecoderLayer):
    """Llama's layer with both norms moved after the residual add: norm(h + F(h))."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):
        attn, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                 position_embeddings=position_embeddings, **kwargs)
        hidden_states = self.input_layernorm(hidden_states + attn)
        return self.post_attention_layernorm(hidden_states + self.mlp(hidden_states))


def test_a_moved_norm_is_seen():
    model, config = tiny("llama")
    for layer in model.layers:  # every layer: a stack is a list of layers of one class
        layer.__class__ = PostNormLlamaLayer
    review = review_model(model, config, subject="llama, post-norm")
    assert review.facts["structure"]["norm_placement"] == "post"


def test_a_head_count_that_contradicts_the_config_is_flagged():
    model, config = tiny("gpt2")
    for block in model.h:  # mod 187-192 split by head_dim: twice as wide, half as many heads
        block.attn.head_dim *= 2
    review = review_model(model, config, subject="gpt2, 2 heads")
    assert review.facts["structure"]["query_heads"] == config.num_attention_heads // 2
    assert review.severity_of("head count") == "flag" and review.exit_status == EXIT_FLAG


def test_block_with_fewer_heads_than_declared_is_flagged():
    review = review_module(broken_blocks.FewerHeadsThanDeclared, "decoder")
    assert review.facts["structure"]["query_heads"] == 2 and review.severity_of("head count") == "flag"


# --- every layer of a stack, and routed experts ----------------------------------------------------
# Layer indices are the full-size ones: the tiny model keeps the config's depth.


def patterns(review):
    return {tuple(layer["indices"]): {k: v for k, v in layer.items() if k != "indices"}
            for layer in review.facts["structure"]["layers"]}


def test_uniform_stack_has_one_layer_pattern():
    (indices,) = patterns(hf_review("llama"))  # cfg 66: 32 layers, all alike
    assert indices == tuple(range(32))


def test_smollm3_nope_layers_are_their_own_pattern():
    # smollm3 cfg 88-89 + 101: no_rope_layers[i] = int((i + 1) % 4 != 0), and mod 215 applies RoPE only where it is
    # 1: layers 3, 7, ..., 35 have no position signal; the rest RoPE; 16 query / 4 K/V heads throughout
    found = patterns(hf_review("smollm3"))
    nope = tuple(range(3, 36, 4))
    assert set(found) == {nope, tuple(i for i in range(36) if i not in nope)}
    assert found[nope]["position"] == "none"
    assert {p["position"] for k, p in found.items() if k != nope} == {"rope"}
    assert {(p["mixer"], p["attention"], p["query_heads"], p["kv_heads"]) for p in found.values()} == {
        ("attention", "GQA", 16, 4)}
    review = hf_review("smollm3")
    assert review.facts["structure"]["position"] == "rope"  # the top level: the main pattern
    assert table_rows(review)[0][9] == "attention x27, NoPE x9 (3, 7, ..., 35)"  # the table's layers column


def test_lfm2_convolution_layers_are_a_conv_pattern():
    # tests/hf_configs/lfm2-1.2b.json layer_types; lfm2 mod 389-394: a "conv" layer holds Lfm2ShortConv (a depthwise
    # Conv1d of conv_L_cache 3 over the sequence, mod 329) in place of attention; every layer has the same MLP
    review = review_architecture("tests/hf_configs/lfm2-1.2b.json")
    found = patterns(review)
    conv = (0, 1, 3, 4, 6, 7, 9, 11, 13, 15)
    assert set(found) == {conv, (2, 5, 8, 10, 12, 14)}
    assert found[conv]["mixer"] == "conv" and found[conv]["attention"] is None
    assert found[(2, 5, 8, 10, 12, 14)]["mixer"] == "attention"
    assert (found[(2, 5, 8, 10, 12, 14)]["query_heads"], found[(2, 5, 8, 10, 12, 14)]["kv_heads"]) == (32, 8)
    assert review.severity_of("layers") == "info" and review.exit_status == EXIT_PASS
    assert table_rows(review)[0][9] == "conv x10, attention x6 (2, 5, 8, 10, 12, 14)"


def test_a_uniform_stacks_window_shows_in_the_table():
    # mistral cfg 79: sliding_window 4096 on every layer. It was measured all along (the JSON's layers and the text
    # had it); the table's layers column said only "uniform", and no column showed the window
    review = hf_review("mistral")
    assert [p["sliding_window"] for p in review.facts["structure"]["layers"]] == [4096]
    assert table_rows(review)[0][9] == "uniform, window 4096"
    assert table_rows(hf_review("llama"))[0][9] == "uniform"  # llama cfg: no sliding_window


def test_gemma2_sliding_window_layers():
    # gemma2 cfg 87-95: sliding_window 4096 on the even layers ("sliding_attention"), full attention on the odd
    found = patterns(hf_review("gemma2"))
    assert {k: p["sliding_window"] for k, p in found.items()} == {tuple(range(0, 26, 2)): 4096,
                                                                   tuple(range(1, 26, 2)): None}


def test_jamba_mamba_layers_are_ssm_and_its_attention_layers_are_found():
    # jamba cfg 84-91 + 108-122: attention on layers i % 8 == 4, Mamba elsewhere (mamba_d_state 16: a state-space
    # state size); 16 experts, 2 per token, on layers i % 2 == 1, a dense MLP (14336 / 4096) on the others. Its
    # layers are of two classes in one ModuleList (they were "no stack of repeated layers" before), and a Mamba
    # layer's scan, silenced, leaves only D x after its short convolution (mod 432: weights of either sign), not
    # the distribution a softmax leaves: it is read as no attention
    review = hf_review("jamba")
    found = patterns(review)
    attention = tuple(i for i in range(32) if i % 8 == 4)
    routed = tuple(i for i in range(32) if i % 2 == 1)
    dense_ssm = tuple(i for i in range(32) if i not in attention + routed)
    assert set(found) == {attention, routed, dense_ssm}
    assert {k: p["mixer"] for k, p in found.items()} == {attention: "attention", routed: "ssm", dense_ssm: "ssm"}
    assert found[routed]["moe"] == {"experts": 16, "per_token": 2, "shared": 0}
    assert found[routed]["ffn_ratio"] == 2 * 14336 / 4096 and found[dense_ssm]["ffn_ratio"] == 14336 / 4096
    assert (found[attention]["query_heads"], found[attention]["kv_heads"]) == (32, 8)
    assert review.facts["structure"]["mixer"] == "attention" and review.exit_status in (EXIT_PASS, EXIT_FLAG)
    assert table_rows(review)[0][9] == "ssm + dense x12, ssm + MoE x16 (1, 3, ..., 31), attention + NoPE + dense x4 " \
                                      "(4, 12, ..., 28)"


@pytest.mark.parametrize("model_type", ["bamba", "falcon_h1"])
def test_mamba2_heads_tile_the_tiny_inner_width(model_type):
    # bamba cfg 103-110, falcon_h1 cfg 109 + 122-130: mamba_d_head x mamba_n_heads must equal the inner width,
    # mamba_d_ssm or else mamba_expand x hidden_size (the heads once followed the attention heads: a reshape failed)
    tiny = hf_arch.shrink(hf_arch.load_config(model_type))
    inner = getattr(tiny, "mamba_d_ssm", None) or tiny.mamba_expand * tiny.hidden_size
    assert tiny.mamba_d_head * tiny.mamba_n_heads == inner and tiny.hidden_size == hf_arch.WIDTH
    tiny.validate_architecture()  # the config class's own check


def test_falcon_h1_attention_is_reviewed_with_its_mamba_beside_it():
    # falcon_h1 mod 875-877 + 918-937: every layer runs a Mamba-2 mixer and attention side by side on the same
    # input and adds both; cfg 65-66, 81: 32 query / 8 K/V heads, mamba_d_state 256 (a state-space state size)
    review = hf_review("falcon_h1")
    s = review.facts["structure"]
    assert [p["indices"] for p in s["layers"]] == [list(range(32))]
    assert (s["mixer"], s["query_heads"], s["kv_heads"]) == ("attention", 32, 8)
    beside = s["evidence"]["mixer"]["others_beside_it"]
    assert [(o["writer"], o["kind"]) for o in beside] == [("mamba.out_proj", "ssm")]
    assert any(f.check == "mixer" and "ssm" in f.message for f in review.findings)


def test_llama4_text_chunked_layers_are_windows_and_its_text_model_is_counted():
    # llama4 cfg 158, 187-189: layer_types "chunked_attention" (attention_chunk_size 8192) where no_rope_layers is 1
    # (3 of every 4 layers), "full_attention" on the others; mod 574 + 582: Llama4ForCausalLM's base_model_prefix is
    # "language_model" but it holds the text model as `model` (the full-size count once failed on that)
    from transformers import Llama4TextConfig

    config = Llama4TextConfig()
    review = hf_review("llama4_text")
    found = {k: p["sliding_window"] for k, p in patterns(review).items()}
    chunked = tuple(i for i, t in enumerate(config.layer_types) if t == "chunked_attention")
    assert found == {chunked: config.attention_chunk_size,
                     tuple(i for i in range(config.num_hidden_layers) if i not in chunked): None}
    assert review.facts["counted_as"] == "Llama4ForCausalLM" and review.exit_status in (EXIT_PASS, EXIT_FLAG)


def test_a_softmax_is_told_from_other_mixers_by_its_rows():
    # queries and keys silenced: softmax rows are distributions (the causal mask's uniform rows, a bias's uneven
    # ones, or scaled by an output gate such as sigmoid(1)); linear attention leaves nothing; a scan's skip term
    # weights of either sign
    from blocklab.review.dataflow import _distributions

    causal = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5).unsqueeze(1)
    biased = torch.softmax(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)), -1)
    assert _distributions(causal[None]) and _distributions(biased[None])
    assert _distributions(torch.sigmoid(torch.tensor(1.0)) * causal[None])
    assert not _distributions(torch.zeros(1, 4, 4))
    assert not _distributions(torch.tensor([[[1e-3, 0, 0], [-2e-3, 1e-3, 0], [5e-4, 1e-3, -1e-3]]]))
    assert not _distributions(torch.tensor([[[0.5, 0, 0], [0.2, 0.2, 0], [0.3, 0.3, 0.3]]]))  # rows differ


def test_mixtral_routed_experts_are_reviewed():
    # mixtral cfg 68, 84-85: 8 experts of 14336, 2 per token; mod 57-93 experts as 3-D weights, no layer each
    review = hf_review("mixtral")
    s = review.facts["structure"]
    assert s["moe"] == {"experts": 8, "per_token": 2, "shared": 0}
    assert s["ffn"] == "swiglu" and s["ffn_ratio"] == 2 * 14336 / 4096  # active width per token
    assert review.exit_status == EXIT_PASS


def test_qwen2_moe_shared_expert_counts_in_the_active_width():
    # qwen2_moe cfg 96-99: 60 experts of 1408, 4 per token; mod 337-343 a shared expert MLP of 5632 on every token:
    # one module sized for 5632 / 1408 = 4 experts (Qwen1.5-MoE's "4 shared experts"): shared experts count by width
    s = hf_review("qwen2_moe").facts["structure"]
    assert s["moe"] == {"experts": 60, "per_token": 4, "shared": 4}
    assert s["ffn_ratio"] == (4 * 1408 + 5632) / 2048


def test_block_without_attention_cannot_be_reviewed():
    review = review_module(broken_blocks.FFNOnly, "encoder")
    assert review.verdict == "cannot review" and review.exit_status == EXIT_CANNOT


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


def test_review_llama_is_llama_3_8b_and_says_which_config_it_reviewed(tmp_path, capsys):
    """`blocklab review llama` reviews the Llama the README names (Llama 3 8B, the shipped llama3-8b.json), and its
    second line names the config and its shape; a model_type alone says it is transformers' defaults."""
    out = tmp_path / "llama.json"
    assert cli.main(["review", "llama", "--json", str(out)]) == EXIT_PASS
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("blocklab review: llama = llama3-8b")
    assert lines[1] == ("  config reviewed: blocklab's shipped llama3-8b (config.json of meta-llama/Meta-Llama-3-8B): "
                        "hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads, vocab 128256, "
                        "rope_theta 500000, norm eps 1e-05")
    saved = json.loads(out.read_text())
    assert saved["parameters"] == hf_config.total_parameters(hf_config.architecture("llama3-8b")) == 8_030_261_248
    assert saved["structure"]["kv_heads"] == 8 and saved["structure"]["query_heads"] == 32
    assert saved["facts"]["config"]["intermediate_size"] == 14336 and saved["facts"]["config"]["vocab_size"] == 128256
    defaults = hf_arch.describe_source("llama", hf_arch.load_config("llama"))
    assert defaults.startswith("transformers' LlamaConfig defaults (model_type llama): hidden 4096, intermediate 11008")


@pytest.mark.parametrize("argv", [
    ["--module", "no_such_package.mod:Block", "--role", "encoder"],
    ["--module", "blocklab.model.blocks:NoSuchBlock", "--role", "encoder"],
    ["--hf-config", "/no/such/config.json"],
    ["--hf-config", "not_a_model_type"],
    ["--module", "transformers.models.llama.modeling_llama:NoSuchLayer", "--role", "decoder"],
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


def test_cli_hf_config_json_keys(tmp_path):
    out = tmp_path / "g.json"
    assert cli.main(["review", "--hf-config", "gemma2", "--json", str(out)]) == EXIT_PASS
    saved = json.loads(out.read_text())
    assert set(STRUCTURE_KEYS) <= set(saved["structure"]) and saved["structure"]["norm_placement"] == "sandwich"
    assert saved["parameters"] == hf_review("gemma2").facts["parameters"]


def test_cli_hf_layer_class_is_reviewed_inside_its_model(capsys):
    # a first attempt a user makes: LlamaDecoderLayer needs layer_idx and the model's RoPE and mask
    argv = ["review", "--module", "transformers.models.llama.modeling_llama:LlamaDecoderLayer", "--role", "decoder"]
    assert cli.main(argv) == EXIT_PASS
    argv = ["review", "--module", "transformers.models.t5.modeling_t5:T5Block", "--role", "encoder"]
    assert cli.main(argv) == EXIT_PASS
    assert "cross-attention" not in capsys.readouterr().out  # the encoder stack's T5Block: no EncDecAttention


def test_cli_block_without_attention_exits_4():
    assert cli.main(["review", "--module", "broken_blocks:FFNOnly", "--role", "encoder"]) == EXIT_CANNOT


def test_cli_unknown_model_type_names_the_argument(capsys):
    assert cli.main(["review", "--hf-config", "llamma"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--hf-config 'llamma'" in err and "llama" in err  # the close match is offered


def test_cli_table_lays_architectures_side_by_side(capsys):
    assert cli.main(["review", "--table", "gpt2"]) == EXIT_PASS
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows] == ["| architecture", "| **2026 default**", "| gpt2"]
    assert f"{gpt2_closed_form():,}" in rows[2] and "learned" in rows[2]


def test_table_has_one_row_per_stack():
    assert [row[0] for row in table_rows(hf_review("t5"))] == ["t5 (encoder)", "t5 (decoder)"]


def test_relu_squared_is_labelled_relu2():
    # nemotron cfg: hidden_act "relu2"; mod NemotronMLP down(act(up(x))), no gate; ACT2FN["relu2"] is relu(x)**2.
    # The default config leaves num_key_value_heads None, which its own attention cannot build with: 8 given
    review = review_architecture({"model_type": "nemotron", "num_key_value_heads": 8})
    s = review.facts["structure"]
    assert (s["ffn"], s["evidence"]["ffn"]["activation"]) == ("relu2", "relu2")


@pytest.mark.parametrize("model_type", ["llama4_text", "esm", "mobilebert"])
def test_architectures_transformers_cannot_drive_tiny_exit_cleanly(model_type, capsys):
    # the tracebacks these once gave: each now ends in a verdict (4: cannot review, with transformers' reason) or a review
    status = cli.main(["review", "--hf-config", model_type])
    out = capsys.readouterr()
    assert status in (EXIT_PASS, EXIT_FLAG, EXIT_CANNOT) and "Traceback" not in out.out + out.err
    if status == EXIT_CANNOT:
        assert "cannot review:" in out.out


@pytest.mark.parametrize("content, key", [
    ('{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 7}', "attention heads (7)"),
    ("[1, 2]", "JSON object"),
    ('{"model_type": "llama", "num_hidden_layers": 0}', "num_hidden_layers"),
])
def test_invalid_config_values_exit_3_with_one_line(content, key, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(content)
    assert cli.main(["review", "--hf-config", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]


def test_table_prints_every_row_it_can(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    status = cli.main(["review", "--table", "gpt2", str(bad), "mobilebert"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| gpt2", f"| {bad}", "| mobilebert"]
    assert "error (exit 3)" in rows[3] and status >= EXIT_USAGE  # the worst row: 3, or 4 for a cannot-review


def test_memory_cap_refuses_before_allocating():
    # 0.001 GiB is below the tiny llama's float64 weights: refused, with the reason, before the build
    review = review_architecture("llama", max_memory_gb=0.001)
    assert review.exit_status == EXIT_CANNOT
    (finding,) = review.findings
    assert "over the cap" in finding.message and "--max-memory-gb" in finding.message


# --- mixed stacks ----------------------------------------------------------------------


def test_a_shared_expert_module_sized_for_two_counts_two():
    # ernie4_5_moe cfg: moe_num_experts 64, moe_k 6, moe_num_shared_experts 2, moe_intermediate_size 1536; mod: the
    # shared expert MLP is moe_intermediate_size * moe_num_shared_experts wide; layer 0 dense (moe_layer_start_index 1)
    s = hf_review("ernie4_5_moe").facts["structure"]
    assert s["moe"] == {"experts": 64, "per_token": 6, "shared": 2}
    assert s["ffn_ratio"] == (6 * 1536 + 2 * 1536) / 2560


def test_full_rope_at_a_high_theta_is_full():
    # apertus cfg: rope_theta 12e6 with Llama 3 scaling (factor 8) on every query/key dimension: the slowest pair
    # turns by ~6e-7 rad a position at the tiny head width of 8
    assert hf_review("apertus").facts["structure"]["evidence"]["rotary_fraction"] == 1.0


def test_glm4_moe_default_config_is_not_refused():
    # glm4_moe cfg: 96 heads at hidden 4096 and no head_dim: mod uses hidden // heads = 42, and builds
    config = hf_arch.load_config("glm4_moe")
    assert (config.hidden_size, config.num_attention_heads) == (4096, 96)


@pytest.mark.parametrize("model_type, width_key", [("recurrent_gemma", "lru_width"),
                                                    ("gemma3n_text", "vocab_size_per_layer_input")])
def test_every_wide_part_is_shrunk(model_type, width_key):
    # recurrent_gemma cfg: lru_width 2560 (= hidden_size); gemma3n_text cfg: a second embedding table of
    # vocab_size_per_layer_input 262144 x (layers x hidden_size_per_layer_input), and intermediate_size per layer;
    # unshrunk, the tiny builds held 22.8 and 17.9 GiB of float64 weights
    full = hf_arch.load_config(model_type)
    tiny = hf_arch.shrink(full)
    cls, _ = hf_arch.model_class(tiny, prefer_head=False)
    with torch.device("meta"):
        numel = sum(p.numel() for p in cls(tiny).parameters())
    assert 8 * numel < 2**27 and getattr(tiny, width_key) < getattr(full, width_key)


def test_a_config_deeper_than_the_probe_says_how_deep_it_probed(monkeypatch):
    monkeypatch.setattr(hf_arch, "MAX_LAYERS", 3)
    review = review_architecture({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                                  "intermediate_size": 176, "num_hidden_layers": 5, "vocab_size": 128})
    assert review.facts["depth"] == {"config": 5, "probed": 3}
    (note,) = [f for f in review.findings if f.check == "depth"]
    assert note.severity == "info" and "layers 3-4 are not probed" in note.message
    assert [p["indices"] for p in review.facts["structure"]["layers"]] == [[0, 1, 2]]


def test_memory_messages_keep_small_caps_readable():
    review = review_architecture("llama", max_memory_gb=0.001)
    assert "over the cap of 0.001 GiB" in review.findings[0].message


def test_differential_attention_reads_two_softmax_maps_per_head():
    # diffllama mod DiffLlamaAttention: two attention calls share q and k over the two halves of v, the heads are
    # chunked in two and combined as out1 - lambda * out2 (two softmax maps per output head), then groupnorm (an
    # RMSNorm over 2 x head_dim) BEFORE o_proj; cfg 51-54 + 74-76: 32 query heads of 64 at 2048, K/V heads default to
    # the query heads (MHA), 8192 / 2048 SwiGLU
    review = hf_review("diffllama")
    s = review.facts["structure"]
    assert (s["mixer"], s["position"], s["ffn"]) == ("attention", "rope", "swiglu")
    assert s["evidence"]["heads"]["maps_per_head"] == 2
    assert (s["query_heads"], s["kv_heads"]) == (32, 32) and s["ffn_ratio"] == 8192 / 2048
    assert review.severity_of("head count") == "info" and review.exit_status == EXIT_PASS


def test_bitnet_sub_norms_do_not_hide_attention_or_activation():
    # bitnet mod: o_proj(attn_sub_norm(attn)) and down_proj(ffn_sub_norm(act(gate) * up)); cfg 44-49: 2560 wide,
    # 20 query / 5 K/V heads, 6912 hidden, relu2
    s = hf_review("bitnet").facts["structure"]
    assert (s["attention"], s["query_heads"], s["kv_heads"], s["position"]) == ("GQA", 20, 5, "rope")
    assert (s["ffn"], s["ffn_ratio"], s["norm_placement"]) == ("reglu2", 6912 / 2560, "pre")


def test_recurrent_gemma_recurrence_and_local_attention():
    # recurrent_gemma cfg 65 + 75: block_types (recurrent, recurrent, attention) repeated, attention window 2048,
    # partial_rotary_factor 0.5 (cfg 90); mod 480-483: the MLP is intermediate_size // 2 = 3840 wide (1.5x); the
    # RG-LRU's recurrent_gate_weight is a block-diagonal 3-D weight inside the recurrence, not routed experts
    review = hf_review("recurrent_gemma")
    found = patterns(review)
    attention = tuple(i for i in range(26) if i % 3 == 2)
    assert {k: p["mixer"] for k, p in found.items()} == {
        attention: "attention", tuple(i for i in range(26) if i % 3 != 2): "recurrent"}
    assert found[attention]["sliding_window"] == 2048
    assert all(p["moe"] is None and p["ffn_ratio"] == 1.5 for p in found.values())
    assert review.facts["structure"]["evidence"]["rotary_fraction"] == 0.5
    assert review.severity_of("ffn") is None  # no "3-D weights without a layer" warning


def test_bamba_says_it_has_no_attention():
    # bamba cfg: attn_layer_indices unset: every layer a Mamba-2 scan (mamba_d_state 128: ssm); its 256-position
    # chunk is shrunk with the rest (6 probe tokens padded to 256 made this review take 647 s)
    assert hf_arch.shrink(hf_arch.load_config("bamba")).mamba_chunk_size == hf_arch.CHUNK
    review = hf_review("bamba")
    assert review.exit_status == EXIT_CANNOT
    assert "layers 0-31: ssm" in review.findings[0].message
    # a Mamba-2 scan rotates nothing by position (mod: no rotary embedding in BambaMixer): its heads' state features
    # are no query-key pairs, so the rotation probe is not read on them
    (layer,) = review.facts["structure"]["layers"]
    assert layer["position"] == "none"


def test_nystromformer_is_softmax_attention_beside_a_convolution_of_its_values():
    # nystromformer cfg: num_landmarks 64 == segment_means_seq_len 64, so mod 171-179 takes the exact path:
    # softmax(q k^T) v with q and k each divided by head_dim^(1/4) (q.k / sqrt(head_dim)); then mod 211-212 adds
    # conv(value_layer), a depthwise Conv2d over positions (kernel conv_kernel_size 65, one group per head); 12 heads,
    # BERT's post-norm, learned absolute positions; a masked LM: bidirectional
    review = hf_review("nystromformer")
    s = review.facts["structure"]
    assert (s["mixer"], s["attention"], s["query_heads"], s["kv_heads"]) == ("attention", "MHA", 12, 12)
    assert s["evidence"]["mixer"]["weights"] == "softmax" and s["evidence"]["logit_scale"]["rule"] == "1/sqrt(head_dim)"
    assert s["evidence"]["beside_values"] == [{"module": "attention.self.conv", "type": "Conv2d",
                                               "reads": ["attention.self.value"]}]
    assert (s["norm_placement"], s["position"], s["causal"]) == ("post", "learned", False)
    (said,) = [f.message for f in review.findings if "attention.self.conv" in f.message]
    assert said.startswith("measured and not judged")
    assert review.exit_status in (EXIT_PASS, EXIT_FLAG)


def test_gemma3n_layers_that_reuse_earlier_keys_and_values_are_read_with_the_shared_projections():
    # gemma3n_text cfg: num_kv_shared_layers 15 and layer_types full every 5th layer (4, 9, ..., 34), the rest sliding:
    # kv_sharing_modes gives layers 20-34 'reuse' and the last earlier layer of each type 'store' (18 sliding, 19
    # full); mod 1174 gives layers 20-34 no k_proj / v_proj, mod 1210-1211 reads the stored keys and values.
    # cfg activation_sparsity_pattern: 0.95 for layers 0-9 (mod: a gaussian top-k of the gate keeps about 5 %), 0 after
    review = hf_review("gemma3n_text")
    found = patterns(review)
    sliding = [i for i in range(20, 35) if i % 5 != 4]
    assert found[tuple(sliding)]["kv_from"] == 18 and found[(24, 29, 34)]["kv_from"] == 19
    for indices in (tuple(sliding), (24, 29, 34)):
        p = found[indices]
        assert (p["mixer"], p["attention"], p["position"], p["ffn"]) == ("attention", "GQA", "rope", "geglu")
        assert (p["sliding_window"] is not None) == (indices != (24, 29, 34))
    assert all("kv_from" not in p for idx, p in found.items() if idx[0] < 20)
    shared = next(o["structure"]["evidence"]["kv_shared"] for o in review.facts["structure"]["evidence"]
                  ["layer_patterns"] if o["indices"] == sliding)
    assert shared["borrowed"] == ["k_proj", "v_proj", "k_norm", "v_norm"] and shared["config"] == {
        "num_kv_shared_layers": 15}
    # the reading without the borrowed projections, kept as evidence: its keys and values come from outside the layer
    assert "'self_attn.o_proj' reads what the model computed from its tokens outside this layer's input" in \
        shared["unread_reason"]
    sparse = {idx: p for idx, p in found.items() if idx[0] < 10}
    assert {i for idx in sparse for i in idx} == set(range(10))
    assert all(p["ffn"] == "unknown" for p in sparse.values())
    assert {i for idx, p in found.items() if p["ffn"] == "geglu" for i in idx} == set(range(10, 35))
    said = [f.message for f in review.findings if f.check == "ffn kind" and f.severity == "flag"]
    assert said and all("95% of its hidden units are exactly zero" in m for m in said)
    assert any(f.message.startswith("layers 24, 29, 34: keys and values of layer 19") for f in review.findings)
    assert review.exit_status == EXIT_FLAG


def test_kv_shared_layer_is_restored_after_its_reading():
    from blocklab.review import hf

    config = hf.shrink(hf.load_config("gemma3n_text"), "eager")
    model = hf.build_tiny(config, 0)
    layers = next(iter(hf.stacks(model).values()))
    assert hf.kv_source(layers, 20, config) == 18 and hf.kv_source(layers, 24, config) == 19
    assert hf.kv_source(layers, 18, config) is None
    before = {n for n, _ in layers[20].named_parameters()}
    with hf.kv_computed_here(layers[20], layers[18]) as borrowed:
        assert layers[20].self_attn.k_proj is layers[18].self_attn.k_proj and not layers[20].self_attn.is_kv_shared_layer
    assert borrowed == ["k_proj", "v_proj", "k_norm", "v_norm"]
    assert {n for n, _ in layers[20].named_parameters()} == before and layers[20].self_attn.is_kv_shared_layer


def test_gemma2_soft_cap_on_the_scores_is_measured_and_not_judged():
    # gemma2 cfg 86 + 90: query_pre_attn_scalar 256 (scores q.k / 16), attn_logit_softcapping 50.0; mod 195-198:
    # w = tanh(w / softcap) * softcap before the mask and the softmax
    review = hf_review("gemma2")
    cap = review.facts["structure"]["evidence"]["logit_cap"]
    assert (cap["form"], cap["cap"], cap["divisor"]) == ("tanh", pytest.approx(50.0, rel=1e-4), pytest.approx(16.0))
    assert any(f.message.startswith("measured and not judged: a tanh cap on the scores at 50") for f in review.findings)
    assert review.exit_status == EXIT_PASS


def test_deepseek_v3_rotates_its_decoupled_share_of_each_head():
    # deepseek_v3 cfg: qk_nope_head_dim 128, qk_rope_head_dim 64; mod: query = cat(q_nope, q_pe), key = cat(k_nope,
    # k_pe), and only q_pe and k_pe (k_pe from kv_a_proj_with_mqa, one per token for every head) are rotated:
    # 64 of each head's 192 query-key features. The tiny build keeps that share (nope 8, rope 4)
    from blocklab.review import hf

    tiny = hf.shrink(hf.load_config("deepseek_v3"), "eager")
    assert tiny.qk_rope_head_dim / (tiny.qk_rope_head_dim + tiny.qk_nope_head_dim) == pytest.approx(64 / 192)
    review = hf_review("deepseek_v3")
    s = review.facts["structure"]
    assert s["position"] == "rope" and s["evidence"]["rotary_fraction"] == pytest.approx(64 / 192)
    assert any(f.message.startswith("partial RoPE (33% of each head rotated)") for f in review.findings)


def test_deepseek_v3_rope_key_in_its_latent_is_no_logit_bias():
    # deepseek_v3 mod: k_pe is split off kv_a_proj_with_mqa's output (the latent's down-projection) and rotated with
    # q_pe (apply_rotary_pos_emb on both): RoPE; its query features pair with that key, so they are no bias on the
    # logits computed from the tokens (the Forgetting Transformer's forget gate is)
    s = hf_review("deepseek_v3").facts["structure"]
    assert s["position"] == "rope" and "logit_bias_from" not in s["evidence"]["heads"]


def test_apertus_xielu_is_an_unknown_activation_not_none():
    # apertus mod: down_proj(act_fn(up_proj(x))), act_fn xIELU (learned alpha_p, alpha_n; x^2 terms for x > 0): a
    # nonlinearity between the projections, none of those the reviewer knows; not a linear FFN
    s = hf_review("apertus").facts["structure"]
    assert (s["ffn"], s["evidence"]["ffn"]["activation"]) == ("unknown", "unknown")


def test_a_chunked_scan_runs_in_the_probes_chunks_during_a_review_and_gives_the_same_numbers():
    """Qwen3-Next's gated delta rule scans in chunks of 64 positions by default, padding the probes' few tokens to 64
    on every call (its review took 18.6 s on 2 idle cores, most of it there). During a review the modeling module's
    chunked functions get the reviewer's CHUNK: the same scan regrouped, and the module's own function again after.
    The scan casts to float32 whatever it is given (transformers' own code), so regrouping reorders float32 sums over
    20 positions: a few units of 1.2e-7 relative (measured 1.9e-6 on outputs up to 3.8); 1e-5 allows that and fails a
    scan that is wrong (the values changed by 0.1 % move the outputs by 3.8e-3)."""
    import torch
    import transformers.models.qwen3_next.modeling_qwen3_next as m

    from blocklab.review import hf

    original = m.torch_chunk_gated_delta_rule
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 20, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))  # 3 chunks of 8
    gate = -torch.rand(1, 20, 2, generator=g, dtype=torch.float64)
    beta = torch.rand(1, 20, 2, generator=g, dtype=torch.float64)
    want, _ = original(q, k, v, g=gate, beta=beta, chunk_size=64)

    class Model(torch.nn.Module):
        pass

    Model.__module__ = m.__name__
    with hf.short_chunks(Model()) as swapped:
        assert swapped == ["torch_chunk_gated_delta_rule"] and m.torch_chunk_gated_delta_rule is not original
        got, _ = m.torch_chunk_gated_delta_rule(q, k, v, g=gate, beta=beta)
    assert m.torch_chunk_gated_delta_rule is original
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max()
