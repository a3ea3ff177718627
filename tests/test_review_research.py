"""The reviewer on blocks in research styles (tests/research_blocks.py): post-norm with coefficients, leaks the
structure does not show, softmax's look-alikes, residual wiring mutants, a caller-passed mask. Each truth below is
written from the forward() of the class it names, before any review. Built at d_model 64 with 4 heads."""
import pytest

from blocklab import cli
from blocklab.review import EXIT_CANNOT, EXIT_FLAG, EXIT_PASS, EXIT_REJECT, EXIT_USAGE, review_module


def review(name, **kw):
    return review_module(f"research_blocks:{name}", "decoder", **kw)


def bad(r):
    return sorted((f.check, f.severity) for f in r.findings if f.severity in ("flag", "warn", "reject", "cannot"))


# --- post-norm with coefficients: (block, the attention's sum, the FFN's sum), as {term: coefficient} ------------
# terms: 'x' the block's input, 'ln1' ln1's output (the stream the FFN reads), the writers 'attn.o' and 'mlp.down'
ALPHA = 48 ** 0.25
POST = {
    "DeepNormBlock": ({"x": ALPHA, "attn.o": 1.0}, {"ln1": ALPHA, "mlp.down": 1.0}),  # LN(alpha x + attn(x))
    "B2TBlock": ({"x": 1.0, "attn.o": 1.0}, {"x": 1.0, "ln1": 1.0, "mlp.down": 1.0}),  # LN(h + mlp(h) + x)
    "HalfBranchPostNorm": ({"x": 1.0, "attn.o": 0.5}, {"ln1": 1.0, "mlp.down": 0.5}),  # LN(x + 0.5 attn(x))
    "NearlyPlainPostNorm": ({"x": 1.01, "attn.o": 1.0}, {"ln1": 1.01, "mlp.down": 1.0}),  # LN(1.01 x + attn(x))
    # n1(x + attn(ln1(x))), n2(h + mlp(ln2(h))): the stream re-normed after every sum, pre-norms as well
    "RenormedStream": ({"x": 1.0, "attn.o": 1.0}, {"n1": 1.0, "mlp.down": 1.0}),
}


@pytest.mark.parametrize("name", sorted(POST))
def test_post_norm_with_coefficients_is_read_with_them(name):
    r = review(name)
    s = r.facts["structure"]
    assert s["norm_placement"] == "post"
    for which, truth in zip(("attention", "ffn"), POST[name]):
        fit = s["evidence"]["norm_placement"][which]["post_sum"]
        assert fit["per_feature"] is False
        assert fit["coefficients"] == pytest.approx(truth, abs=1e-6), which
    # with warm-up, any post-norm passes the depth rule (without it, see test_post_norm_depth_is_judged_...)
    assert review(name, depth=24, warmup_steps=100).severity_of("post-norm depth") == "pass"


def test_the_coefficients_are_said_in_the_text():
    text = {name: next(f.message for f in review(name).findings if f.check == "norm position")
            for name in ("DeepNormBlock", "B2TBlock", "HalfBranchPostNorm", "RenormedStream")}
    assert "norm(2.63*h + F(h))" in text["DeepNormBlock"] and "DeepNorm" in text["DeepNormBlock"]
    assert "norm(x + h + F(h))" in text["B2TBlock"] and "B2T" in text["B2TBlock"]
    assert "norm(h + 0.5*F(h))" in text["HalfBranchPostNorm"]
    assert "norm(h + F(norm(h)))" in text["RenormedStream"] and "re-normed" in text["RenormedStream"]


def test_admin_weights_per_feature_are_read_per_feature():
    # AdminBlock: LN(omega1 * x + attn(x)), omega1 = linspace(1.2, 1.8, 64); the same around the MLP
    s = review("AdminBlock").facts["structure"]
    assert s["norm_placement"] == "post"
    for which, stream in (("attention", "x"), ("ffn", "ln1")):
        fit = s["evidence"]["norm_placement"][which]["post_sum"]
        assert fit["per_feature"] is True and fit["stream"] == stream
        assert fit["range"][stream] == pytest.approx([1.2, 1.8], abs=1e-6)
        assert fit["coefficients"][stream] == pytest.approx(1.5, abs=1e-6)


def test_plain_pre_norm_is_still_pre_norm():
    r = review("PreNormBlock", depth=24)
    assert r.facts["structure"]["norm_placement"] == "pre" and r.exit_status == EXIT_PASS


# --- leaks: rejected whether or not the structure reads -----------------------------------------------------------


@pytest.mark.parametrize("name", ["MixtureOfDepthsBlock", "QueryAxisSoftmax"])
def test_a_measured_leak_always_rejects(name):
    # MixtureOfDepthsBlock: top-k over all positions picks which tokens are processed; QueryAxisSoftmax: softmax(-2)
    r = review(name)
    assert r.severity_of("causal mask") == "reject" and r.exit_status == EXIT_REJECT


@pytest.mark.parametrize("name, role, status", [("QueryAxisSoftmax", "decoder", EXIT_REJECT),
                                                ("QueryAxisEncoder", "encoder", EXIT_FLAG)])
def test_a_softmax_over_the_query_axis_is_named(name, role, status):
    # QueryAxisSoftmax: causally masked scores .softmax(-2); QueryAxisEncoder: unmasked scores .softmax(-2). Both
    # x + attn(ln1(x)), h + mlp(ln2(h)) (pre-norm, both residuals), 4 heads of 16, gelu 4x
    r = review_module(f"research_blocks:{name}", role)
    s = r.facts["structure"]
    assert (s["mixer"], s["norm_placement"], s["ffn"], s["ffn_ratio"]) == ("query-axis-softmax", "pre", "gelu", 4.0)
    assert (s["query_heads"], s["evidence"]["heads"]["head_dim"]) == (4, 16)
    assert all(x["residual_kept_when_silenced"] for x in s["evidence"]["sublayers"])
    (said,) = [f.message for f in r.findings if f.check == "attention"]
    assert "query axis" in said and r.severity_of("attention") == "flag" and r.exit_status == status
    if role == "encoder":  # nothing else is wrong with it: bidirectional, as an encoder is
        assert bad(r) == [("attention", "flag")] and s["causal"] is False
    else:  # the decoder's leak is measured and said with its cause
        leak = next(f.message for f in r.findings if f.check == "causal mask")
        assert r.severity_of("causal mask") == "reject" and "query axis" in leak


def test_the_same_encoder_with_its_softmax_over_the_keys_passes():
    # RowSoftmaxEncoder: QueryAxisEncoder with .softmax(-1)
    r = review_module("research_blocks:RowSoftmaxEncoder", "encoder")
    assert (r.facts["structure"]["mixer"], r.facts["structure"]["attention"]) == ("attention", "MHA")
    assert r.exit_status == EXIT_PASS


# --- softmax and its look-alikes ------------------------------------------------------------------------------


def test_attention_sinks_are_softmax_attention():
    # SinkAttentionBlock: softmax([scores, sink_h])[..., :-1]
    r = review("SinkAttentionBlock")
    s = r.facts["structure"]
    assert (s["mixer"], s["attention"], s["query_heads"]) == ("attention", "MHA", 4)
    assert s["evidence"]["mixer"]["weights"] == "sinks" and r.severity_of("attention") == "info"
    assert r.exit_status == EXIT_PASS


@pytest.mark.parametrize("name, mixer", [("SigmoidAttentionBlock", "sigmoid-attention"),
                                         ("LinearAttentionBlock", "linear-attention")])
def test_softmax_look_alikes_are_named_not_passed(name, mixer):
    # sigmoid(q.k / sqrt(d) - log T) @ v; elu(q)+1, elu(k)+1 with running sums, normalised: both causal, pre-norm
    r = review(name)
    s = r.facts["structure"]
    assert s["mixer"] == mixer and s["norm_placement"] == "pre" and s["causal"] is True
    assert bad(r) == [("structure", "cannot")] and r.exit_status == EXIT_CANNOT


def test_a_missing_value_projection_is_flagged_and_the_rest_read():
    # NoValueProjection: softmax(q.k) @ split(ln1(x)): 4 heads of 16, no W_V
    r = review("NoValueProjection")
    s = r.facts["structure"]
    assert (s["mixer"], s["query_heads"], s["evidence"]["mixer"]["values_from"]) == ("attention", 4, "ln1")
    assert bad(r) == [("attention", "flag")] and r.exit_status == EXIT_FLAG


# --- residual wiring mutants ---------------------------------------------------------------------------------


def test_a_doubled_residual_is_flagged():
    # x + x + attn(ln1(x)), then h + mlp(ln2(h)): the output carries 2x
    r = review("DoubledResidual")
    assert bad(r) == [("residual", "flag")]
    assert r.facts["structure"]["evidence"]["output_sum"]["coefficients"]["x"] == pytest.approx(2.0)


def test_an_attention_off_the_stream_is_flagged():
    # x + mlp(ln2(x + attn(ln1(x)))): the output is x + mlp's output; attn.o only feeds ln2
    r = review("MisroutedSkip")
    assert [(f.check, f.value) for f in r.findings if f.severity == "flag"] == [("residual", "attn.o")]


# --- the caller's mask, and the role -----------------------------------------------------------------------------


def test_a_mask_argument_of_the_blocks_own_is_tried():
    # CallerMaskBlock.forward(x, mask=None): scores + mask
    r = review("CallerMaskBlock")
    assert bad(r) == [("causal mask", "warn")] and r.exit_status == EXIT_FLAG
    assert r.facts["causal"]["with_caller_mask"]["style"] == "additive"


def test_role_is_required_unless_the_forward_says_decoder(capsys):
    assert cli.main(["review", "--module", "research_blocks:PreNormBlock"]) == EXIT_USAGE
    assert "encoder" in capsys.readouterr().err
    # nn.TransformerEncoderLayer's forward takes is_causal: reviewed as a decoder (it then leaks unless the caller
    # passes src_mask: a warning), and the text says the role was taken from it
    assert cli.main(["review", "--module", "torch.nn:TransformerEncoderLayer", "--kwargs",
                     '{"batch_first": true}']) == EXIT_FLAG
    out = capsys.readouterr().out
    assert "role decoder" in out and "no --role given" in out


# --- the stability lab reads the block as the reviewer does -------------------------------------------------------


def _lab_page(name):
    from pathlib import Path

    import pandas as pd

    from blocklab.lab.report import page, rates
    from blocklab.lab.spec import make_spec

    root = Path(__file__).resolve().parents[1]
    spec = make_spec(root / "params.yaml", "tiny", module=str(root / "tests" / "research_blocks.py") + f":{name}")
    lab = pd.DataFrame(columns=["block", "warmup", "seed", "outcome", "run", "n_layers", "final_loss",
                                "step_learned", "step_collapsed"])
    return spec.read, page(spec, lab, rates(lab), "-")


def test_the_lab_reads_a_hand_written_deepnorm_as_post_norm_with_its_scale():
    # DeepNormBlock ends on LN(alpha h + mlp(h)): the stack needs no final norm of its own
    read, text = _lab_page("DeepNormBlock")
    assert (read["norm_placement"], read["final_norm"]) == ("post", False)
    assert "**final norm used**: none" in text and "norm(2.63*h + F(h))" in text


def test_the_lab_page_says_a_residual_is_missing():
    # NoResidualBlock: attn(ln1(x)), mlp(ln2(h)): pre-norms, no residual around either sub-layer
    read, text = _lab_page("NoResidualBlock")
    assert read["norm_placement"] == "pre" and len(read["residual"]) == 2
    assert "**Residual as read**" in text and "none around 'attn.o'" in text and "none around 'mlp.down'" in text


# --- misreads: latent attention, sequential hybrids, 1/d scores -------------------------------------------------


def test_latent_attention_is_read_as_heads_with_a_shared_latent():
    # MLABlock: k, v = W_ukv(kv_norm(W_dkv x)), 4 heads of 16 each with its own keys and values; queries W_q x, no
    # norm on them: MHA 4/4, no QK-norm (kv_norm is the latent's)
    r = review("MLABlock")
    s = r.facts["structure"]
    assert (s["attention"], s["query_heads"], s["kv_heads"], s["qk_norm"]) == ("MHA", 4, 4, False)
    assert s["evidence"]["latent"] == {"attn.w_dkv": 16, "attn.kv_norm": 16}
    assert bad(r) == [] and r.exit_status == EXIT_PASS


def test_macaron_and_a_conv_before_attention_are_sequential():
    # MacaronBlock: mlp0 -> attn -> mlp, each reading the sum before it; ConvThenAttentionBlock: conv -> attn -> mlp
    for name in ("MacaronBlock", "ConvThenAttentionBlock"):
        s = review(name).facts["structure"]
        assert (s["residual"], s["mixer"], s["attention"]) == ("sequential", "attention", "MHA"), name
    (other,) = review("ConvThenAttentionBlock").facts["structure"]["evidence"]["mixer"]["others_beside_it"]
    # the depthwise convolution of width 4 reaches positions 0-3 of its own output: a conv, before the attention
    assert (other["writer"], other["kind"], other["where"]) == ("out", "conv", "before")


@pytest.mark.parametrize("name, divisor, rule", [("InverseDScores", 16.0, "1/head_dim"),
                                                 ("PreNormBlock", 4.0, "1/sqrt(head_dim)")])
def test_the_score_scale_is_measured(name, divisor, rule):
    # InverseDScores: q.k / head_dim (16); PreNormBlock: q.k / sqrt(16)
    r = review(name)
    scale = r.facts["structure"]["evidence"]["logit_scale"]
    assert (scale["divisor"], scale["rule"]) == (pytest.approx(divisor), rule)
    said = [f for f in r.findings if f.value == "1/head_dim"]
    assert len(said) == (rule == "1/head_dim") and r.exit_status == EXIT_PASS


# --- types that did not build ----------------------------------------------------------------------------------


def test_hunyuan_dense_builds_with_its_head_dim_left_to_the_width():
    # HunYuanDenseV1Config() leaves head_dim None; its attention computes head_dim ** -0.5 and applies
    # apply_rotary_pos_emb before query_layernorm / key_layernorm: MHA 32/32 (num_key_value_heads defaults to the
    # heads), RoPE, QK-norm
    from blocklab.review import review_architecture

    r = review_architecture("hunyuan_v1_dense")
    s = r.facts["structure"]
    assert (s["attention"], s["query_heads"], s["position"], s["qk_norm"]) == ("MHA", 32, "rope", True)
    assert r.exit_status == EXIT_PASS


def test_mobilebert_is_read_through_its_bottleneck():
    # MobileBertLayer, default config (use_bottleneck, key_query_shared_bottleneck, normalization_type "no_norm",
    # num_feedforward_networks 4, hidden_act relu): bottleneck.attention projects the input, query and key read it,
    # value reads the input itself; 4 heads of true_hidden_size 128 / 4; NoNorm(dense(attn) + bottleneck.input(x)),
    # NoNorm is x * w + b (no normalisation); 4 FFNs at 128 wide, intermediate 512: 4x of the width they read;
    # bidirectional, learned positions
    from blocklab.review import review_architecture

    r = review_architecture("mobilebert")
    s = r.facts["structure"]
    assert (s["mixer"], s["attention"], s["query_heads"], s["kv_heads"]) == ("attention", "MHA", 4, 4)
    assert s["evidence"]["bottleneck"] == ["bottleneck.attention.dense"]
    assert (s["norm_placement"], s["norm_kind"], s["position"], s["causal"]) == ("none", None, "learned", False)
    assert (s["ffn"], s["ffn_ratio"], s["evidence"]["ffn"]["reads_width"]) == ("relu", 4.0, 128)
    assert bad(r) == [("norm position", "flag")] and r.exit_status == EXIT_FLAG


def test_nanochat_with_functional_norms_and_rope_before_its_qk_norm():
    # NanochatBlock: x + attn(F.rms_norm(x)), x + mlp(F.rms_norm(x)); c_q 4 heads, c_k/c_v 2 of 16; RoPE on halves,
    # then F.rms_norm on q and k (no module anywhere); causal SDPA; relu(c_fc x)^2, 4x
    r = review("NanochatBlock")
    s = r.facts["structure"]
    assert (s["mixer"], s["norm_placement"], s["norm_kind"]) == ("attention", "pre", "rmsnorm")
    assert (s["attention"], s["query_heads"], s["kv_heads"], s["position"]) == ("GQA", 4, 2, "rope")
    assert (s["ffn"], s["ffn_ratio"], s["causal"]) == ("relu2", 4.0, True)
    assert s["evidence"]["norm_placement"]["attention"]["input_norm"] == ["rms_norm()"]
    assert r.exit_status == EXIT_PASS


# --- experts and attention written by hand --------------------------------------------------------------------


def test_a_mixture_of_experts_written_by_hand_is_read_as_experts():
    # MoEBlock: router Linear(64, 4), top 2 scores, softmax over them; experts ModuleList of 4 MLP(64, ratio 2)
    # (gelu, 128 wide); x + attn(ln1(x)), h + moe(ln2(h)): 2 x 128 / 64 = 4x active per token
    r = review("MoEBlock")
    s = r.facts["structure"]
    assert s["moe"] == {"experts": 4, "per_token": 2, "shared": 0, "written_by_hand": {
        "container": "experts", "router": "router", "read_through": "experts.0"}}
    assert (s["ffn"], s["ffn_ratio"], s["norm_placement"], s["residual"]) == ("gelu", 4.0, "pre", "sequential")
    assert (s["attention"], s["query_heads"], s["causal"]) == ("MHA", 4, True)
    assert s["evidence"]["output_sum"]["coefficients"] == {"x": 1.0, "attn.o": 1.0, "experts.0.down": 1.0}
    assert bad(r) == [] and r.exit_status == EXIT_PASS
    # SwiGLUMoEBlock: moe.gate Linear(64, 8), softmax over all 8, top 2 not renormalised, index_add_; SwiGLU experts
    # of 64 and one shared SwiGLU of 64 on every token; RMSNorm: (2 x 64 + 64) / 64 = 3x
    s = review("SwiGLUMoEBlock").facts["structure"]
    assert s["moe"] == {"experts": 8, "per_token": 2, "shared": 1, "written_by_hand": {
        "container": "moe.experts", "router": "moe.gate", "read_through": "moe.experts.0"}}
    assert (s["ffn"], s["ffn_ratio"], s["norm_kind"], s["norm_placement"]) == ("swiglu", 3.0, "rmsnorm", "pre")


def test_a_hand_written_moe_off_the_stream_is_flagged():
    # MoEOffStream: moe(ln2(x + attn(ln1(x)))): the experts' output replaces the stream
    r = review("MoEOffStream")
    assert [(f.check, f.value) for f in r.findings if f.severity == "flag"] == [("residual", "experts.0.down")]


def test_experts_that_choose_their_tokens_are_named_and_the_rest_reviewed():
    # ExpertChoiceMoEBlock: each of 4 experts takes the top half of the sequence by its router score (future
    # positions included): no expert is ever handed every token; x + attn(ln1(x)) is read, and the leak rejects
    r = review("ExpertChoiceMoEBlock")
    s = r.facts["structure"]
    assert s["hand_written_experts"] == {"container": "experts", "experts": 4, "per_token": 2}
    (cannot,) = [f.message for f in r.findings if f.severity == "cannot"]
    assert "4 experts in 'experts'" in cannot and "handed a subset of the tokens" in cannot
    assert s["partial"] == ["attention"] and s["evidence"]["norm_placement"]["attention"]["placement"] == "pre"
    assert r.severity_of("causal mask") == "reject" and r.exit_status == EXIT_REJECT


def test_attention_written_with_einsum_on_parameters_is_read():
    # EinsumAttentionBlock: q, k, v = einsum('btd,sdhe->sbhte', x, w_qkv (3, 64, 4, 16)), causal softmax over
    # q.k / 4, einsum('bhte,hed->btd', ., w_o (4, 16, 64)); ln1/ln2 pre-norms, MLP gelu 4x
    r = review("EinsumAttentionBlock")
    s = r.facts["structure"]
    attn = s["evidence"]["sublayers"][0]
    assert (attn["writer"], attn["inputs"], attn["mixes_tokens"]) == ("w_o", ["w_qkv"], True)
    assert (s["mixer"], s["attention"], s["query_heads"], s["kv_heads"]) == ("attention", "MHA", 4, 4)
    assert (s["norm_placement"], s["ffn"], s["ffn_ratio"], s["causal"]) == ("pre", "gelu", 4.0, True)
    assert s["evidence"]["logit_scale"]["rule"] == "1/sqrt(head_dim)" and s["evidence"]["unhooked_weights"] == []
    assert bad(r) == [] and r.exit_status == EXIT_PASS
    # EinsumGQABlock: wq (64, 4, 16), wk and wv (64, 2, 16) by einsum, scores einsum('bthd,bshd->bhts'), wo (4, 16,
    # 64); RMS pre-norms written out; FFN (silu(u @ w1) * (u @ w3)) @ w2, 128 wide; nothing is an nn.Linear
    s = review("EinsumGQABlock").facts["structure"]
    assert (s["attention"], s["query_heads"], s["kv_heads"], s["norm_kind"]) == ("GQA", 4, 2, "rmsnorm")
    assert (s["ffn"], s["ffn_ratio"], s["residual"], s["causal"]) == ("swiglu", 2.0, "sequential", True)
    # EinsumNoMaskBlock: the same without its causal mask: the leak rejects
    r = review("EinsumNoMaskBlock")
    assert r.facts["structure"]["mixer"] == "attention" and bad(r) == [("causal mask", "reject")]


@pytest.mark.parametrize("name, status", [("TensordotAttentionBlock", EXIT_CANNOT),
                                          ("TensordotLeakBlock", EXIT_REJECT)])
def test_an_attention_the_reviewer_cannot_follow_is_named_and_the_rest_reviewed(name, status):
    # torch.tensordot on w_q, w_k, w_v (64, 4, 16) and w_o (4, 16, 64): not followed. The rest, x + ... and
    # h + mlp(ln2(h)) (pre-norm, gelu 4x), is read; TensordotLeakBlock has no causal mask: the leak rejects
    r = review(name)
    s = r.facts["structure"]
    (cannot,) = [f.message for f in r.findings if f.severity == "cannot"]
    assert "'w_q'" in cannot and "'w_o'" in cannot and "tensordot" in cannot
    assert s["partial"] == ["ffn"] and (s["ffn"], s["ffn_ratio"]) == ("gelu", 4.0)
    assert s["evidence"]["norm_placement"]["ffn"]["placement"] == "pre"
    assert s["causal"] is (status == EXIT_CANNOT) and r.exit_status == status


def test_the_lab_passes_a_blocks_own_mask_argument():
    # CallerMaskBlock.forward(x, mask=None) adds the mask to its scores: the lab must pass it, or it trains a leak
    import torch

    from blocklab.lab.spec import CallBlock

    read, _ = _lab_page("CallerMaskBlock")
    assert read["mask"] == "mask"
    import research_blocks

    torch.manual_seed(0)
    wrapped = CallBlock(research_blocks.CallerMaskBlock(16, 2), read["mask"], read["seq_first"])
    x = torch.randn(1, 5, 16)
    later = x.clone()
    later[:, 3:] += 1.0
    assert torch.allclose(wrapped(x)[:, :3], wrapped(later)[:, :3])


def test_sinks_zero_at_init_are_still_sinks_and_not_called_a_gate():
    # ZeroSinkAttentionBlock: sinks = zeros(4) at init: probed nonzero, read as softmax with sinks
    r = review("ZeroSinkAttentionBlock")
    # LayerNorm biases are zero at init too (facts only); the text names the gate-sized parameters
    assert r.facts["zero_at_init"] == ["sinks", "ln1.bias", "ln2.bias"]
    assert r.facts["structure"]["evidence"]["mixer"]["weights"] == "sinks"
    (said,) = [f.message for f in r.findings if f.check == "zero at init"]
    assert "attention sink" in said and r.exit_status == EXIT_PASS


def test_falcons_parallel_sum_is_read_whole():
    # FalconDecoderLayer (parallel_attn): mlp_output += attention_output in place, then output = mlp_output + residual:
    # the output is x + attention + MLP, neither off the stream
    from blocklab.review import review_architecture

    r = review_architecture("falcon")
    total = r.facts["structure"]["evidence"]["output_sum"]["coefficients"]
    assert total == {"x": 1.0, "self_attention.dense": 1.0, "mlp.dense_4h_to_h": 1.0}
    assert r.facts["structure"]["residual"] == "parallel" and r.exit_status == EXIT_PASS


# --- the normalised stream added back ----------------------------------------------------------------------------


@pytest.mark.parametrize("name, carries, placement, writer", [
    ("NormalisedFFNResidual", [None, "ln2"], "pre", "mlp.down"),  # x + attn(ln1(x)), then ln2(h) + mlp(ln2(h))
    ("NormalisedAttentionResidual", ["ln1", None], "post", "attn.o"),  # ln1(x) + attn(ln1(x)), then h + mlp(ln2(h))
])
def test_a_normalised_stream_added_back_is_flagged_in_either_sub_layer(name, carries, placement, writer):
    r = review(name)
    s = r.facts["structure"]
    assert [x["residual_carries_norm"] for x in s["evidence"]["sublayers"]] == carries
    assert s["norm_placement"] == placement
    assert [(f.check, f.value) for f in r.findings if f.severity == "flag"] == [("residual", writer)]
    assert r.exit_status == EXIT_FLAG


# --- mutants: one planted defect each ------------------------------------------------------------------------------


def test_scores_divided_by_the_model_width_are_flagged():
    # ModelWidthScores: q.k / sqrt(64) = 8 with heads of 16 (sqrt: 4)
    r = review("ModelWidthScores")
    scale = r.facts["structure"]["evidence"]["logit_scale"]
    assert (scale["divisor"], scale["rule"]) == (pytest.approx(8.0), "1/sqrt(d_model)")
    assert bad(r) == [("logit scale", "flag")] and "sqrt(d_model)" in r.text() and r.exit_status == EXIT_FLAG


def test_a_learned_temperature_is_not_flagged():
    # user_blocks.TemperatureBlock: q.k / sqrt(16) * exp(logit_scale), logit_scale a parameter (0.5 per head)
    r = review_module("user_blocks:TemperatureBlock", "decoder")
    assert r.facts["structure"]["evidence"]["logit_scale"]["rule"] == "learned" and r.exit_status == EXIT_PASS


@pytest.mark.parametrize("name, written", [("InPlaceNormBlock", "ln1"), ("InPlaceRMSBlock", "RMSNorm")])
def test_a_block_that_normalises_its_input_in_place_is_flagged_not_misread(name, written):
    r = review(name)
    s = r.facts["structure"]
    # read on a copy of its input: (batch, time, d_model), a causal softmax attention, 4 heads
    assert r.facts["layout"] == "(batch, time, d_model)" and r.severity_of("layout") is None
    assert (s["mixer"], s["query_heads"], s["causal"]) == ("attention", 4, True)
    assert r.severity_of("input") == "flag" and r.facts["input_overwritten"]["as"] == written
    assert r.exit_status == EXIT_FLAG


def test_rope_on_the_values_instead_of_the_keys_is_named():
    # RopeOnValues: q and v rotated, k not; a causal softmax over q.k / 4
    r = review("RopeOnValues")
    s = r.facts["structure"]
    assert (s["mixer"], s["attention"], s["query_heads"], s["causal"]) == ("attention", "MHA", 4, True)
    rotated = s["evidence"]["heads"]["values_rotated"]
    assert rotated["keys_rotated"] is False and [0, 8] in rotated["planes"]
    assert bad(r) == [("position", "flag")] and "RoPE on q and v" in r.text() and r.exit_status == EXIT_FLAG


def test_an_ffn_without_an_activation_is_called_linear():
    # IdentityActivationFFN: down(up(x))
    r = review("IdentityActivationFFN")
    assert r.facts["structure"]["ffn"] == "linear"
    assert bad(r) == [("ffn kind", "flag")] and "the FFN is linear" in r.text() and r.exit_status == EXIT_FLAG


# --- post-norm's fixes judged at the depth asked, with the lab's recorded runs ------------------------------------


def _lab_says(block, depth=24):
    """The lab's recorded runs of its built-in ``block`` without warm-up, as the reviewer must cite them."""
    from blocklab.training.lab_records import recorded

    runs = recorded(norm=block, warmup=0)
    runs = runs[runs["n_layers"] == depth]
    learned = int((runs["outcome"] == "learned").sum())
    return f"learns {learned} of {len(runs)} at {depth} blocks without warm-up, records/lab/runs", learned == len(runs)


@pytest.mark.parametrize("name, fix", [
    ("DeepNormBlock", "deepnorm"),  # alpha = 48^(1/4) = (2 * 24)^(1/4): DeepNorm's constant for 24 blocks
    ("AdminDefaultBlock", "admin"),  # omega from admin-torch's omega0 for 24 blocks (3.40) up, per feature
    ("B2TBlock", "b2t"),  # the block's input joins the last sum
])
def test_a_post_norm_fix_that_holds_at_the_depth_cites_the_lab(name, fix):
    said, all_learned = _lab_says(fix)
    r = review(name, depth=24)
    (depth,) = [f for f in r.findings if f.check == "post-norm depth"]
    assert depth.severity == ("pass" if all_learned else "warn") and said in depth.message
    assert r.severity_of("post-norm depth") != "reject"


@pytest.mark.parametrize("name, depth", [
    ("DeepNormBlock", 48),  # alpha for 24 blocks, (2 * 48)^(1/4) = 3.13 needed
    ("NearlyPlainPostNorm", 24),  # 1.01 on the skip: (2N)^(1/4) >= 1.19 for any N >= 1
    ("HalfBranchPostNorm", 24),  # h + 0.5 F(h) = 2h + F(h) under the norm: alpha 2, DeepNorm's for 8 blocks
    ("AdminBlock", 24),  # omega 1.2 to 1.8: below admin-torch's omega0 for 1 block (1.32)
    ("RenormedStream", 24),  # plain sums, re-normed
])
def test_a_post_norm_whose_coefficients_fall_short_at_the_depth_is_rejected(name, depth):
    r = review(name, depth=depth)
    assert r.severity_of("post-norm depth") == "reject" and r.exit_status == EXIT_REJECT
    assert "records/lab" not in r.text()


def test_the_lab_outcome_is_read_from_the_records_not_typed(monkeypatch):
    import pandas as pd

    from blocklab.training import lab_records as records  # where the reviewer reads them (below the lab)

    fake = pd.DataFrame({"run": [f"deepnorm-w0-s{i}" for i in range(5)], "block": "deepnorm", "n_layers": 24,
                         "warmup": 0, "seed": range(5), "outcome": ["learned"] * 3 + ["never", "diverged"]})
    monkeypatch.setattr(records, "recorded", lambda **kw: fake)
    r = review("DeepNormBlock", depth=24)
    (depth,) = [f for f in r.findings if f.check == "post-norm depth"]
    assert depth.severity == "warn" and "learns 3 of 5 at 24 blocks" in depth.message
    assert "deepnorm-w0-s3: never" in depth.message


# --- a leak says where it leaks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, where, said, ahead", [
    # user_blocks.BlockMaskOffByOne: tril(diagonal=1): each row reads the next key
    ("user_blocks:BlockMaskOffByOne", "attn.c_proj", "off by 1", 1),
    # user_blocks.BlockNoMask: no mask at all: position 0 reads the 5 after it
    ("user_blocks:BlockNoMask", "attn.c_proj", "needs a causal mask", 5),
    ("research_blocks:MaskAfterSoftmax", "attn.o", "after the softmax", 5),  # the normaliser reads every key
    ("research_blocks:ScoreNormBlock", "attn.o", "norm over the score matrix", None),  # mean/std over every key
    ("research_blocks:ViewSplitHeads", "attn.o", "heads mix positions", None),  # reshape without transpose
])
def test_a_leak_names_the_sub_layer_and_the_operation(name, where, said, ahead):
    r = review_module(name, "decoder")
    leak = r.facts["structure"]["evidence"]["leak"]
    (message,) = [f.message for f in r.findings if f.check == "causal mask"]
    assert leak["origin"]["sublayer"] == where and f"'{where}'" in message and said in message
    if ahead is not None:
        assert leak["positions_ahead"] == ahead and f"up to {ahead} position" in message
    assert r.exit_status == EXIT_REJECT


def test_a_convolution_padded_on_both_sides_is_named_with_its_reach():
    # SameConvBlock: depthwise Conv1d, kernel 3, padding='same': each position reads the next one
    r = review("SameConvBlock")
    leak = r.facts["structure"]["evidence"]["leak"]
    assert (leak["origin"]["kind"], leak["origin"]["module"], leak["positions_ahead"]) == ("module", "conv", 1)
    (message,) = [f.message for f in r.findings if f.check == "causal mask"]
    assert "'conv' (Conv1d)" in message and "padding='same'" in message and "up to 1 position ahead" in message


# --- published designs of 2024-2025 ----------------------------------------------------------------------------------


def test_ngpt_is_read_on_the_unit_sphere():
    # NGPTBlock: q, k, v 4 heads of 16, RoPE on q and k, q and k divided by their length (x / ||x||, by hand), causal
    # softmax; h = justnorm(justnorm(h) + alpha * (justnorm(attn(h)) - justnorm(h))); u * silu(v) of
    # chunk(8 * c_fc(h)), 4x; the same interpolation: no norm module, every row of the output has length 1
    r = review("NGPTBlock")
    s = r.facts["structure"]
    assert (s["mixer"], s["attention"], s["query_heads"], s["position"]) == ("attention", "MHA", 4, "rope")
    assert (s["qk_norm"], s["norm_kind"], s["norm_placement"]) == (True, "l2", "post")
    assert (s["ffn"], s["ffn_ratio"], s["causal"]) == ("swiglu", 4.0, True)
    assert s["evidence"]["ffn"]["scaled_before_activation"]["activation_input"] == pytest.approx(8.0)
    assert all(x["residual_kept_when_silenced"] for x in s["evidence"]["sublayers"])
    assert bad(r) == [] and r.exit_status == EXIT_PASS


def test_a_fused_qkv_sliced_and_applied_by_einsum_is_read_by_its_weights_use():
    # SlicedQKVEinsumBlock: w_qkv (64, 192) sliced into three (64, 64) column blocks, each viewed (64, 4, 16) and
    # applied by einsum; causal softmax over q.k / 4; y @ w_o; ln1/ln2 pre-norms, MLP gelu 4x
    r = review("SlicedQKVEinsumBlock")
    s = r.facts["structure"]
    assert s["evidence"]["sublayers"][0]["inputs"] == ["w_qkv[:, 0:64]", "w_qkv[:, 64:128]", "w_qkv[:, 128:192]"]
    assert (s["mixer"], s["attention"], s["query_heads"], s["kv_heads"]) == ("attention", "MHA", 4, 4)
    assert (s["norm_placement"], s["ffn"], s["ffn_ratio"], s["causal"]) == ("pre", "gelu", 4.0, True)
    assert s["evidence"]["logit_scale"]["rule"] == "1/sqrt(head_dim)"
    assert bad(r) == [] and r.exit_status == EXIT_PASS


def test_deepseek_v3_absorbed_mla_is_read_as_attention():
    # AbsorbedMLABlock: wkv_b.weight viewed (4, 32, 16) and applied by einsum (never called): 4 query heads over one
    # shared latent of 16 (kv_norm(wkv_a(x)[:16])), each head's query taken into it by wkv_b[:, :16] and its value
    # brought up after the softmax by wkv_b[:, -16:]: MLA's count is 4 K/V heads, 1 in the latent; causal softmax;
    # RoPE on 8 of each head's 24 query-key features (the decoupled q_pe . k_pe); RMSNorm pre-norms, SwiGLU 2x
    r = review("AbsorbedMLABlock")
    s = r.facts["structure"]
    assert (s["mixer"], s["attention"], s["query_heads"], s["kv_heads"], s["causal"]) == ("attention", "MHA", 4, 4, True)
    assert s["evidence"]["mixer"]["weights"] == "softmax" and not s["evidence"]["mixer"]["no_value_projection"]
    assert s["evidence"]["heads"]["absorbed_latent"] == {"width": 16, "kv_heads_in_latent": 1,
                                                         "values_brought_up_by": ["wkv_b.weight[:, -16:]"]}
    assert s["evidence"]["latent"] == {"wkv_a": 24, "kv_norm": 16} and s["qk_norm"] is False
    assert s["position"] == "rope" and s["evidence"]["rotary_fraction"] == pytest.approx(8 / 24)
    assert (s["norm_placement"], s["norm_kind"], s["ffn"], s["ffn_ratio"]) == ("pre", "rmsnorm", "swiglu", 2.0)
    assert r.exit_status == EXIT_PASS


def test_the_forgetting_transformer_is_softmax_attention_with_a_decay_bias():
    # ForgettingBlock: softmax(q.k / 4 + D + causal mask) @ v, D_ij = sum of log sigmoid(fgate(x_l)) for l in (j, i],
    # fgate Linear(64, 4) (a bias per head); LayerNorm pre-norms, gelu 4x
    r = review("ForgettingBlock")
    s = r.facts["structure"]
    assert (s["mixer"], s["attention"], s["query_heads"], s["kv_heads"]) == ("attention", "MHA", 4, 4)
    assert s["evidence"]["mixer"]["weights"] == "softmax"
    assert (s["position"], s["evidence"]["heads"]["logit_bias_from"]) == ("decay-bias", ["attn.fgate"])
    assert "attn.fgate.bias" not in r.facts["widths"]["fixed"] and r.severity_of("widths") == "pass"
    assert bad(r) == [] and r.exit_status == EXIT_PASS


def test_canon_layers_keep_the_pre_norm():
    # CanonBlock: x + attn(u), u = n + conv(n), n = rms1(x); h + mlp(m + conv2(m)), m = rms2(h): pre-norm, RMSNorm;
    # each sub-layer reads the stream only through its norm, with the convolution (canon_a, canon_c) between
    r = review("CanonBlock")
    s = r.facts["structure"]
    assert (s["norm_placement"], s["norm_kind"], s["attention"], s["causal"]) == ("pre", "rmsnorm", "MHA", True)
    placements = s["evidence"]["norm_placement"]
    assert (placements["attention"]["input_norm"], placements["attention"]["read_through"]) == (["rms1"], ["canon_a"])
    assert (placements["ffn"]["placement"], placements["ffn"]["input_norm"]) == ("pre", ["rms2"])
    assert placements["ffn"]["read_through"] == ["canon_c"] and placements["attention"]["post_norm"] == []
    (said,) = [f.message for f in r.findings if f.check == "norm position"]
    assert "'canon_a'" in said and "measured and not judged" in said
    # no RoPE or bias on the logits, but the convolution orders neighbours: the position line says both
    (position,) = [f.message for f in r.findings if f.check == "position"]
    assert s["position"] == "none" and "'canon_a'" in position and "logits" in position
    assert r.exit_status == EXIT_PASS


# --- features measured and not judged: read right, or said as seen and left unjudged -------------------------------


def test_retnet_retention_rotates_its_queries_and_keys():
    # RetentionBlock: (q k^T * D) v with q, k rotated by position (RoPE pairs over all 16 features of a head),
    # D[n, m] = gamma_h^(n - m): no softmax (linear attention with a decay), a per-token swish gate after its GroupNorm
    r = review("RetentionBlock")
    s = r.facts["structure"]
    assert (s["mixer"], s["position"], s["evidence"]["rotary_fraction"]) == ("linear-attention", "rope", 1.0)
    (said,) = [f for f in r.findings if f.check == "position"]
    assert said.severity == "info" and said.message.startswith("measured and not judged")
    assert r.exit_status == EXIT_CANNOT  # no softmax attention: the block is not passed


def test_a_qk_norm_before_rope_is_both():
    # QKNormThenRope: q = rope(rms_q(W_q x)), k = rope(rms_k(W_k x)): a QK-norm, and every feature rotated
    s = review("QKNormThenRope").facts["structure"]
    assert (s["qk_norm"], s["evidence"]["qk_norms"]) == (True, ["attn.q_norm", "attn.k_norm"])
    assert (s["position"], s["evidence"]["rotary_fraction"]) == ("rope", 1.0)
    assert s["evidence"]["logit_scale"]["divisor"] == pytest.approx(4.0)


def test_a_soft_cap_on_the_scores_is_measured_and_not_judged():
    # SoftcapBlock: 50 * tanh((q.k / 4) / 50): the cap 50 and the divisor 4 (sqrt(head_dim 16))
    r = review("SoftcapBlock")
    s = r.facts["structure"]
    cap = s["evidence"]["logit_cap"]
    assert (cap["form"], cap["cap"], cap["divisor"]) == ("tanh", pytest.approx(50.0, rel=1e-4), pytest.approx(4.0))
    assert all(seen < v for seen, v in zip(cap["logits_seen"], cap["logits_set"]))  # each logit bent below its value
    assert s["evidence"]["logit_scale"]["rule"] == "1/sqrt(head_dim)"
    assert any(f.message.startswith("measured and not judged: a tanh cap on the scores at 50") for f in r.findings)
    assert r.exit_status == EXIT_PASS


def test_a_block_without_a_cap_says_none():
    assert review("PreNormBlock").facts["structure"]["evidence"]["logit_cap"] is None


def test_hyper_connections_stream_mixing_is_measured_and_not_judged():
    # HyperConnectionBlock: 2 streams of 32 in the 64 inputs; with the sub-layers silenced, H' = H A_1 then H A_2
    # (einsum 'btnd,nm->btmd'): the output's streams are the input's mixed by A_1 A_2
    from research_blocks import HyperConnectionBlock

    block = HyperConnectionBlock()
    mixing = (block.a1 @ block.a2).flatten().tolist()  # [[0.76, 0.41], [0.24, 0.59]]
    r = review("HyperConnectionBlock")
    s = r.facts["structure"]
    assert (s["streams"]["streams"], s["streams"]["width"]) == (2, 32)
    assert [v for row in s["streams"]["mixing"] for v in row] == pytest.approx(mixing, abs=1e-6)
    (said,) = [f.message for f in r.findings if f.check == "structure"]
    assert "2 residual streams of 32 features" in said and "measured and not judged" in said
    assert "KV cache" not in said
    assert r.exit_status == EXIT_CANNOT


@pytest.mark.parametrize("name", ["DeltaRuleBlock", "LinearAttentionBlock"])
def test_a_linear_attention_without_rotation_reads_no_rope(name):
    # DeltaRuleBlock: L2-normalised q and k in a delta-rule state; LinearAttentionBlock: elu + 1 feature maps; neither
    # rotates anything by position (the rotation probe's query-key pairing is read only where the output is bilinear
    # in the queries and keys, as RetNet's is)
    s = review(name).facts["structure"]
    assert s["mixer"] in ("linear-attention", "recurrent") and s["position"] == "none"
