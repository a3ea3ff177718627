"""The reviewer on blocks as users write them (tests/user_blocks.py): correct blocks in several house styles pass
with the structure their forward() computes; each mutant, with one planted defect, gets the verdict that defect
calls for. Each expectation is written from the forward() of the class it names, never from the reviewer's output.
Blocks are built at d_model 64 with 4 heads (the reviewer's default width), so every case runs in about a second."""
import json

import pytest

import user_blocks
from blocklab import cli
from blocklab.review import EXIT_CANNOT, EXIT_FLAG, EXIT_PASS, EXIT_REJECT, EXIT_USAGE, review_module
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
    # DiffAttentionBlock: x + out_proj(subln(...)(norm1(x))), SwiGLU 176; nn.RMSNorm; 4 differential heads
    # (q and k as 8 heads of 8, paired; v as 4 heads of 16); rotate() on q and k; triu(1) -inf: causal
    "DiffAttentionBlock": ("decoder", dict(FLAT_LLAMA, kv_heads=4, attention="MHA")),
    # NormFormerBlock: x + out(attn_ln(heads)) with ln1 before; fc2(ffn_ln(gelu(fc1(ln2 h)))) 4x; causal, no position
    "NormFormerBlock": ("decoder", dict(CLASSIC, norm_placement="pre", position="none", causal=True, ffn="gelu")),
    # BitNetStyleBlock: RMSNorm written out; 4 query / 2 K/V heads; rotate(); relu(gate)^2 * up, 3 x d_model
    "BitNetStyleBlock": ("decoder", dict(FLAT_LLAMA, ffn="reglu2", ffn_ratio=3.0)),
    # T5StyleBlock: x + o(attn(norm1(x))) with relative_attention_bias on the logits; wo(relu(wi(norm2 h))) 4x;
    # RMSNorm written out; no mask
    "T5StyleBlock": ("encoder", dict(CLASSIC, norm_placement="pre", norm_kind="rmsnorm", position="relative-bias",
                                     causal=False)),
    # TemperatureBlock: x + out(attn(norm1(x))) with logits times exp(logit_scale[h]); nn.RMSNorm; FeedForward
    "TemperatureBlock": ("decoder", dict(CLASSIC, norm_placement="pre", norm_kind="rmsnorm", position="none",
                                         causal=True)),
    # torch's nn.MultiheadAttention (4 heads, fused in_proj) behind nn.LayerNorm, FeedForward; no mask; both layouts
    "TorchMHABlock": ("encoder", dict(CLASSIC, norm_placement="pre", position="none", causal=False)),
    "TorchMHABlockSeqFirst": ("encoder", dict(CLASSIC, norm_placement="pre", position="none", causal=False)),
    # nn.TransformerEncoderLayer(norm_first=True): x + sa(norm1(x)), x + ff(norm2(x)); relu, 4 x d_model
    "seq_first_encoder_layer": ("encoder", dict(CLASSIC, norm_placement="pre", position="none", causal=False)),
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
    # n = ln_1(x); x = n + attn(n): the residual carries ln_1's output, not x (ln_2's, after it, is the norm of the
    # attention's sum: a post-norm's, which is allowed)
    "BlockNormalisedResidual": ("decoder", EXIT_FLAG, [("residual", "attn.c_proj")]),
    # x + (att @ v) without c_proj: the heads' output flows into mlp.c_fc's input through the stream
    "BlockNoOutputProjection": ("decoder", EXIT_CANNOT, [("output projection", None), ("structure", None)]),
    # ReZero: x + alpha * attn(x), h + alpha * ffn(h), no norm anywhere (its design): only the missing norm is said;
    # alpha = 0 at init does not make it parallel or windowed
    "ReZeroBlock": ("decoder", EXIT_FLAG, [("norm position", "none")]),
    # tokens mixed by a causal depthwise convolution, no softmax anywhere: nothing to review as a transformer block
    "ConvMixerBlock": ("decoder", EXIT_CANNOT, [("structure", None)]),
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


# --- what the blocks above compute, read through norms, gates, layouts and fixed-size parameters ----------


def test_a_norm_before_the_output_projection_does_not_hide_the_attention():
    # DiffAttentionBlock: subln on (B, H, T, 16) before out_proj; a differential head's output is 2 x 8 = 16 wide;
    # BitNetStyleBlock: attn_sub_norm over the heads' 64 features before o_proj; NormFormerBlock: attn_ln before out
    for name, head_dim in (("DiffAttentionBlock", 16), ("BitNetStyleBlock", 16), ("NormFormerBlock", 16)):
        s = review(name, "decoder").facts["structure"]
        assert (s["mixer"], s["evidence"]["heads"]["head_dim"], s["qk_norm"]) == ("attention", head_dim, False), name
        assert s["evidence"]["mixer"]["softmax"] is True, name


def test_a_norm_after_the_activation_does_not_hide_it():
    # NormFormerBlock: fc2(ffn_ln(gelu(fc1 n))); BitNetStyleBlock: down(ffn_sub_norm(relu(gate n)^2 * up n))
    for name, kind, norm in (("NormFormerBlock", "gelu", "ffn_ln"), ("BitNetStyleBlock", "reglu2", "ffn_sub_norm")):
        ffn = review(name, "decoder").facts["structure"]["evidence"]["ffn"]
        assert (ffn["kind"], ffn["after_activation"]) == (kind, [norm])


def test_parameters_sized_by_heads_or_buckets_are_not_hard_coded_widths():
    # T5StyleBlock: relative_attention_bias (32 buckets, 4 heads); NormFormerBlock: head_scale (4,);
    # TemperatureBlock: logit_scale (4, 1, 1): none has the width's size, every other parameter follows d_model
    for name, role, kept in (("T5StyleBlock", "encoder", ["relative_attention_bias.weight"]),
                             ("NormFormerBlock", "decoder", ["head_scale"]),
                             ("TemperatureBlock", "decoder", ["logit_scale"])):
        widths = review(name, role).facts["widths"]
        assert (widths["fixed"], widths["not_width_sized"]) == ([], kept), name


def test_a_zero_gate_at_init_does_not_change_what_the_block_is():
    # ReZeroBlock: alpha = zeros(1); with it at 0 the FFN would not read the attention (parallel) and position 0
    # would reach position 0 only (a "window" of 1)
    r = review("ReZeroBlock", "decoder")
    s = r.facts["structure"]
    assert r.facts["zero_at_init"] == ["alpha"] and r.severity_of("zero at init") == "info"
    assert (s["residual"], s["sliding_window"], s["attention"]) == ("sequential", None, "MHA")


def test_torch_layers_in_their_default_layout_are_read_transposed():
    # batch_first=False: nn.TransformerEncoderLayer reads (time, batch, d); TorchMHABlockSeqFirst transposes itself
    # around nn.MultiheadAttention(batch_first=False), so its own input stays (batch, time, d)
    assert review("seq_first_encoder_layer", "encoder").facts["layout"] == "(time, batch, d_model)"
    assert review("TorchMHABlockSeqFirst", "encoder").facts["layout"] == "(batch, time, d_model)"
    r = review_module("torch.nn:TransformerEncoderLayer", "encoder", kwargs={"batch_first": False})
    assert r.facts["layout"] == "(time, batch, d_model)" and r.exit_status == EXIT_PASS


def test_a_normalised_residual_is_read_as_post_norm():
    s = review("BlockNormalisedResidual", "decoder").facts["structure"]
    assert s["norm_placement"] == "post"
    assert [x["residual_carries_norm"] for x in s["evidence"]["sublayers"]] == ["ln_1", None]


def test_module_from_a_file_path_and_from_the_current_folder(tmp_path, monkeypatch, capsys):
    import shutil
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    source = tmp_path / "mixed_block.py"
    shutil.copy(user_blocks.__file__, source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mixed_block", raising=False)
    assert cli.main(["review", "--module", "./mixed_block.py:Block", "--role", "decoder"]) == EXIT_PASS
    monkeypatch.delitem(sys.modules, "mixed_block", raising=False)
    sys.path[:] = [p for p in sys.path if p not in ("", str(tmp_path))]
    assert cli.main(["review", "--module", "mixed_block:FlatLlamaBlock", "--role", "decoder"]) == EXIT_PASS
    assert cli.main(["review", "--module", "./no_such_file.py:Block", "--role", "decoder"]) == EXIT_USAGE
    assert "no such file" in capsys.readouterr().err


def test_unwritable_json_is_refused_before_any_verdict(tmp_path, capsys):
    argv = ["review", "--module", "user_blocks:Block", "--role", "decoder", "--json", str(tmp_path / "no" / "r.json")]
    assert cli.main(argv) == EXIT_USAGE
    out = capsys.readouterr()
    assert "verdict" not in out.out and "does not exist" in out.err


def test_a_block_whose_mixer_is_no_attention_is_not_passed():
    r = review("ConvMixerBlock", "decoder")
    (cannot,) = [f for f in r.findings if f.severity == "cannot"]
    assert r.facts["structure"]["mixer"] == "conv" and "no softmax attention" in cannot.message
