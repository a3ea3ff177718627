"""The reviewer on blocks as users write them (tests/user_blocks.py): correct blocks in several house styles pass
with the structure their forward() computes; each mutant, with one planted defect, gets the verdict that defect
calls for. Each expectation is written from the forward() of the class it names, never from the reviewer's output.
Blocks are built at d_model 64 with 4 heads (the reviewer's default width), so every case runs in about a second."""
import json

import pytest

import user_blocks
from blocklab import cli
from blocklab.review import EXIT_FLAG, EXIT_PASS, EXIT_REJECT, review_module
from blocklab.review.architecture import STRUCTURE_KEYS

# the structure each correct block computes (user_blocks.py, its forward())
NANOGPT = dict(  # Block.forward: x + attn(ln_1(x)), x + mlp(ln_2(x)); nn.LayerNorm; c_attn split into 4 heads
    # (n_head set to 4) of 16; tril buffer mask; no position inside the block (GPT's wpe is in the model); MLP
    # c_fc 4 * n_embd, nn.GELU (erf)
    residual="sequential", norm_placement="pre", norm_kind="layernorm", attention="MHA", query_heads=4, kv_heads=4,
    qk_norm=False, position="none", ffn="gelu", ffn_ratio=4.0, causal=True, cross_attention=False)
FLAT_LLAMA = dict(  # FlatLlamaBlock.forward: h = x + attention(attention_norm(x)), h + w2(silu(w1 n) * w3 n) with
    # n = ffn_norm(h); RMSNorm; wq 4 heads, wk/wv 2 K/V heads; rotate() on q and k, every pair; hidden
    # 8 * (int(8 * 64 / 3) // 8 + 1) = 176; triu(1) of -inf added to the scores
    residual="sequential", norm_placement="pre", norm_kind="rmsnorm", attention="GQA", query_heads=4, kv_heads=2,
    qk_norm=False, position="rope", ffn="swiglu", ffn_ratio=176 / 64, causal=True, cross_attention=False)
CLASSIC = dict(residual="sequential", norm_kind="layernorm", attention="MHA", query_heads=4, kv_heads=4,
               qk_norm=False, ffn="relu", ffn_ratio=4.0, cross_attention=False)  # SelfAttention + FeedForward

CORRECT = {
    "Block": ("decoder", NANOGPT),
    "FlatLlamaBlock": ("decoder", FLAT_LLAMA),
    "FlatLlamaMQA": ("decoder", dict(FLAT_LLAMA, attention="MQA", kv_heads=1)),  # n_kv_heads=1
    # norm1(x + attn(x)), norm2(h + ffn(h)); SelfAttention(causal=False)
    "PostNormEncoderBlock": ("encoder", dict(CLASSIC, norm_placement="post", position="none", causal=False)),
    # x + attn(ln(x)) + ffn(ln(x)); alibi=True: -slope_h * |i - j| on the logits; causal
    "ParallelBlock": ("decoder", dict(CLASSIC, residual="parallel", norm_placement="pre", position="alibi",
                                      causal=True)),
    # x + post1(attn(pre1(x))), h + post2(ffn(pre2(h))); nn.RMSNorm
    "SandwichBlock": ("decoder", dict(CLASSIC, norm_placement="sandwich", norm_kind="rmsnorm", position="none",
                                      causal=True)),
    # x + n1(attn(x)), h + n2(ffn(h)); nn.RMSNorm
    "OutputNormBlock": ("decoder", dict(CLASSIC, norm_placement="output", norm_kind="rmsnorm", position="none",
                                        causal=True)),
}


def review(name, role):
    return review_module(f"user_blocks:{name}", role)


def values(structure):
    return {key: structure[key] for key in STRUCTURE_KEYS}


def flags(r):
    return [(f.check, f.value) for f in r.findings if f.severity in ("flag", "warn", "reject", "cannot")]


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_blocks_pass_with_the_structure_their_forward_computes(name):
    role, expected = CORRECT[name]
    r = review(name, role)
    assert values(r.facts["structure"]) == expected
    # one block: one layer pattern, a softmax attention without a window, no experts
    (layer,) = r.facts["structure"]["layers"]
    assert (layer["indices"], layer["mixer"], layer["sliding_window"], layer["moe"]) == ([0], "attention", None, None)
    assert flags(r) == [] and r.exit_status == EXIT_PASS
    assert all(s["residual_kept_when_silenced"] for s in r.facts["structure"]["evidence"]["sublayers"])


def test_nanogpt_block_is_built_from_its_own_config_class():
    r = review("Block", "decoder")
    # GPTConfig is the one config dataclass in user_blocks.py; its width and head fields are set, the rest
    # (dropout 0.0, bias True, block_size 1024) keep their defaults
    assert r.facts["config_fields_set"] == {"n_embd": 64, "n_head": 4}
    assert r.facts["built_as"] == "Block(GPTConfig(n_embd=64, n_head=4))"


def test_flat_block_reviews_like_a_nested_one():
    # the same Llama computation, projections on the block itself vs in sub-modules (blocklab's own blocks)
    flat = values(review("FlatLlamaBlock", "decoder").facts["structure"])
    nested = values(review_module("blocklab.model.blocks:DecoderOnlyBlock", "decoder", kwargs=dict(
        n_kv_heads=2, ffn_kind="swiglu", norm_kind="rmsnorm", position="rope", bias=False, ffn_hidden=176)
    ).facts["structure"])
    assert flat == nested == FLAT_LLAMA


# --- mutants: one planted defect each ------------------------------------------------------------

MUTANTS = {
    # x = attn(ln_1(x)): the attention's output replaces the stream
    "BlockDroppedAttentionResidual": ("decoder", EXIT_FLAG, [("residual", "attn.c_proj")]),
    # return mlp(ln_2(x)): the MLP's output replaces the stream
    "BlockDroppedMLPResidual": ("decoder", EXIT_FLAG, [("residual", "mlp.c_proj")]),
    # the flat Llama block without h + around the FFN
    "FlatLlamaDroppedFFNResidual": ("decoder", EXIT_FLAG, [("residual", "w2")]),
    # the tril buffer filled with ones: no mask
    "BlockNoMask": ("decoder", EXIT_REJECT, [("causal mask", False)]),
    # tril(diagonal=1): each position also sees the next
    "BlockMaskOffByOne": ("decoder", EXIT_REJECT, [("causal mask", False)]),
    # self.ln_1(x) thrown away: the attention reads the raw stream
    "BlockNormsBypassed": ("decoder", EXIT_FLAG, [("norm position", "none")]),
    # c_fc 3 * n_embd // 2 = 96 wide
    "BlockNarrowMLP": ("decoder", EXIT_FLAG, [("ffn ratio", 1.5)]),
    # x + attn(x), h + ffn(h): no norm at all
    "NoNormBlock": ("decoder", EXIT_FLAG, [("norm position", "none")]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_planted_defect_is_found_and_nothing_else(name):
    role, status, expected = MUTANTS[name]
    r = review(name, role)
    assert flags(r) == expected
    assert r.exit_status == status


def test_dropped_residual_does_not_turn_the_next_pre_norm_into_a_sandwich():
    # BlockDroppedAttentionResidual: ln_2 reads the attention's output, but feeds the MLP: a pre-norm
    s = review("BlockDroppedAttentionResidual", "decoder").facts["structure"]
    assert s["norm_placement"] == "pre"
    assert s["evidence"]["norm_placement"]["attention"]["output_norm"] == []


def test_a_mask_off_by_one_is_not_a_position_signal():
    # BlockMaskOffByOne has no position code anywhere: its position-awareness comes from the mask alone
    s = review("BlockMaskOffByOne", "decoder").facts["structure"]
    assert s["position"] == "none" and s["evidence"]["rotary_fraction"] == 0.0
    assert s["evidence"]["position_aware_in_layer"] is True


def test_deep_post_norm_user_block_is_rejected_without_warmup():
    r = review_module("user_blocks:PostNormEncoderBlock", "encoder", depth=24)
    assert flags(r) == [("post-norm depth", 24)] and r.exit_status == EXIT_REJECT


# --- one structure: the text, the findings, the verdict and the JSON agree -----------------------


@pytest.mark.parametrize("name, status", [("BlockDroppedAttentionResidual", EXIT_FLAG),
                                          ("FlatLlamaBlock", EXIT_PASS), ("Block", EXIT_PASS)])
def test_cli_text_and_json_come_from_one_structure(name, status, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["review", "--module", f"user_blocks:{name}", "--role", "decoder", "--json", str(out)]) == status
    text = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["exit_status"] == status
    # every finding of the JSON is one line of the text, in order, and nothing else is said
    lines = [line for line in text.splitlines()[1:-1]]
    assert len(lines) == len(saved["findings"])
    for line, finding in zip(lines, saved["findings"]):
        assert line.split()[0] == finding["severity"].upper() and finding["message"] in line
    assert "not recognised" not in text and "no norm module" not in text
    s = saved["structure"]
    if s["attention"]:
        assert f"{s['attention']} {s['query_heads']}/{s['kv_heads']}" in text
