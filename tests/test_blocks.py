"""The blocks against independent references: torch's own transformer layers, norms and closed forms."""
import pytest
import torch
from torch import nn

from blocklab import ConfigError, DecoderBlock, DecoderLM, EncoderBlock, EncoderDecoder, ModelConfig
from blocklab.model.blocks import DecoderOnlyBlock
from blocklab.model.counting import block_params, count_parameters, decoder_lm_params, encoder_decoder_params
from blocklab.model.layers import Attention, LayerNorm, RMSNorm

D, HEADS, HIDDEN = 32, 4, 64
# Our modules vs torch's are different kernels (torch's fused MHA / SDPA / native LayerNorm), compared on one forward
# pass: outputs of order 1-3, fp32 sums of <= 64 terms, round at ~1e-6 on any instruction set; the bound 1e-5 is 10x
# that and far below what a wrong wiring gives (the causal-mask test below sees 1e-3 from one perturbed token).


def classic(norm_position, ffn_kind="relu", **kw):
    return ModelConfig(d_model=D, n_heads=HEADS, ffn_hidden=HIDDEN, ffn_kind=ffn_kind, norm_position=norm_position, **kw)


def copy_attention(ours: Attention, theirs: nn.MultiheadAttention):
    wq, wk, wv = theirs.in_proj_weight.chunk(3)
    bq, bk, bv = theirs.in_proj_bias.chunk(3)
    for linear, w, b in ((ours.q, wq, bq), (ours.k, wk, bk), (ours.v, wv, bv), (ours.o, theirs.out_proj.weight, theirs.out_proj.bias)):
        linear.weight.copy_(w)
        linear.bias.copy_(b)


def copy_norm(ours, theirs):
    ours.weight.copy_(theirs.weight)
    ours.bias.copy_(theirs.bias)


def copy_ffn(ours, theirs):
    ours.up.weight.copy_(theirs.linear1.weight), ours.up.bias.copy_(theirs.linear1.bias)
    ours.down.weight.copy_(theirs.linear2.weight), ours.down.bias.copy_(theirs.linear2.bias)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("ffn_kind", ["relu", "gelu"])
@torch.no_grad()
def test_encoder_block_matches_torch(norm_position, ffn_kind):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(D, HEADS, HIDDEN, dropout=0.0, activation=ffn_kind, batch_first=True,
                                     norm_first=norm_position == "pre").eval()
    ours = EncoderBlock(classic(norm_position, ffn_kind)).eval()
    copy_attention(ours.attn.sublayer, ref.self_attn)
    copy_ffn(ours.ffn.sublayer, ref)
    copy_norm(ours.attn.norm, ref.norm1)
    copy_norm(ours.ffn.norm, ref.norm2)
    x = torch.randn(3, 7, D)
    assert (ours(x) - ref(x)).abs().max() <= 1e-5


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@torch.no_grad()
def test_decoder_block_matches_torch(norm_position):
    torch.manual_seed(1)
    ref = nn.TransformerDecoderLayer(D, HEADS, HIDDEN, dropout=0.0, batch_first=True,
                                     norm_first=norm_position == "pre").eval()
    ours = DecoderBlock(classic(norm_position)).eval()
    copy_attention(ours.attn.sublayer, ref.self_attn)
    copy_attention(ours.cross.sublayer, ref.multihead_attn)
    copy_ffn(ours.ffn.sublayer, ref)
    for mine, theirs in ((ours.attn.norm, ref.norm1), (ours.cross.norm, ref.norm2), (ours.ffn.norm, ref.norm3)):
        copy_norm(mine, theirs)
    target, memory = torch.randn(2, 5, D), torch.randn(2, 6, D)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    expected = ref(target, memory, tgt_mask=mask, tgt_is_causal=True)
    assert (ours(target, memory) - expected).abs().max() <= 1e-5


@torch.no_grad()
def test_norms_match_torch():
    torch.manual_seed(2)
    x = torch.randn(4, 9, D) * 3 + 1
    ln_ref, rms_ref = nn.LayerNorm(D), nn.RMSNorm(D, eps=1e-6)
    nn.init.normal_(ln_ref.weight), nn.init.normal_(ln_ref.bias), nn.init.normal_(rms_ref.weight)
    ln, rms = LayerNorm(D), RMSNorm(D, eps=1e-6)
    copy_norm(ln, ln_ref)
    rms.weight.copy_(rms_ref.weight)
    assert (ln(x) - ln_ref(x)).abs().max() <= 1e-5
    assert (rms(x) - rms_ref(x)).abs().max() <= 1e-5


@pytest.mark.parametrize("block_cls,expect_leak", [(DecoderOnlyBlock, False), (EncoderBlock, True)])
@torch.no_grad()
def test_causal_mask(block_cls, expect_leak):
    torch.manual_seed(3)
    block = block_cls(classic("pre")).eval()
    x = torch.randn(1, 8, D)
    changed = x.clone()
    changed[:, 5] += torch.randn(D)  # perturb a future token (not by a constant: LayerNorm would erase that)
    diff = (block(x) - block(changed)).abs().amax(-1)[0]
    assert (diff[:5].max() > 1e-3) == expect_leak
    assert diff[:5].max() < 1e-5 or expect_leak  # unchanged up to float rounding
    assert diff[5:].min() > 1e-3  # the perturbed position and later ones do see it


@torch.no_grad()
def test_cross_attention_is_the_only_path_from_encoder():
    torch.manual_seed(4)
    block = DecoderBlock(classic("pre")).eval()
    target, memory = torch.randn(1, 5, D), torch.randn(1, 6, D)
    out = block(target, memory)
    assert (out - block(target, memory + 1.0)).abs().max() > 1e-4
    block.cross.sublayer.o.weight.zero_()
    block.cross.sublayer.o.bias.zero_()
    assert (block(target, memory) - block(target, torch.randn(1, 6, D))).abs().max() == 0


@torch.no_grad()
def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(5)
    attn = Attention(classic("pre", position="rope"))
    q, k = torch.randn(HEADS, 1, D // HEADS), torch.randn(HEADS, 1, D // HEADS)

    def score(pq, pk):
        return (attn.rope(q, torch.tensor([pq])) * attn.rope(k, torch.tensor([pk]))).sum(-1)

    assert torch.allclose(score(3, 1), score(13, 11), atol=1e-5)
    assert torch.allclose(score(7, 7), score(0, 0), atol=1e-5)
    assert not torch.allclose(score(3, 1), score(1, 3), atol=1e-3)


CLASSIC = dict(norm_kind="layernorm", ffn_kind="relu", position="sinusoidal")
MODERN = dict(norm_kind="rmsnorm", ffn_kind="swiglu", position="rope", bias=False)


@pytest.mark.parametrize("variant", [CLASSIC, MODERN], ids=["classic", "modern"])
@torch.no_grad()
def test_encoder_decoder_step3_and_step4_shapes(variant):
    """Document 004 steps 3-4: a 6-token source and a 5-token target give logits of shape (5, vocab)."""
    cfg = ModelConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=11, max_len=16, **variant)
    model = EncoderDecoder(cfg)
    logits = model(torch.randint(0, 11, (6,)), torch.randint(0, 11, (5,)))
    assert logits.shape == (5, 11)
    assert torch.isfinite(logits).all()


BLOCK_CASES = [
    ModelConfig(d_model=512, n_heads=8, ffn_ratio=4, ffn_kind="swiglu"),  # document 004, exercise 1
    ModelConfig(d_model=512, n_heads=8, ffn_ratio=4, ffn_kind="swiglu", norm_kind="rmsnorm", bias=False),
    ModelConfig(d_model=64, n_heads=8, n_kv_heads=2, ffn_kind="gelu", norm_kind="rmsnorm", position="rope"),
    ModelConfig(d_model=48, n_heads=6, ffn_ratio=2.5, ffn_kind="relu", bias=False),
]


@pytest.mark.parametrize("cfg", BLOCK_CASES)
@pytest.mark.parametrize("kind,cls", [("encoder", EncoderBlock), ("decoder_only", DecoderOnlyBlock), ("decoder", DecoderBlock)])
def test_closed_form_block_count_equals_numel(cfg, kind, cls):
    assert block_params(cfg, kind) == count_parameters(cls(cfg))


def test_exercise_1_count_by_hand():
    cfg = BLOCK_CASES[0]
    d, h = 512, 2048
    by_hand = (4 * d * d + 4 * d) + (3 * d * h + 2 * h + d) + 2 * (2 * d)  # MHA + SwiGLU (+biases) + two LayerNorms
    assert block_params(cfg, "encoder") == by_hand == count_parameters(EncoderBlock(cfg))


@pytest.mark.parametrize("extra", [{}, {"tie_embeddings": True}, {"norm_position": "post", "position": "learned"}])
def test_closed_form_model_counts(extra):
    cfg = ModelConfig(d_model=32, n_heads=4, n_layers=3, vocab_size=50, max_len=20, **extra)
    assert decoder_lm_params(cfg) == count_parameters(DecoderLM(cfg))
    assert encoder_decoder_params(cfg) == count_parameters(EncoderDecoder(cfg))


@pytest.mark.parametrize("bad,field", [
    ({"d_model": 130, "n_heads": 4}, "n_heads"),
    ({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads"),
    ({"norm_kind": "batchnorm"}, "norm_kind"),
    ({"ffn_kind": "tanh"}, "ffn_kind"),
    ({"norm_position": "middle"}, "norm_position"),
    ({"position": "alibi"}, "position"),
    ({"init": "orthogonal"}, "init"),
    ({"d_model": 0}, "d_model"),
    ({"n_layers": -2}, "n_layers"),
    ({"ffn_ratio": 0}, "ffn_ratio"),
])
def test_invalid_config_names_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**bad)


def test_xavier_init_zero_biases_unit_gain():
    model = DecoderLM(ModelConfig(d_model=32, n_heads=4, n_layers=2, init="xavier"))
    block = model.blocks[0]
    assert block.attn.sublayer.q.bias.abs().max() == 0
    assert torch.all(block.ffn.norm.weight == 1) and torch.all(block.ffn.norm.bias == 0)
    bound = (6 / (32 + 128)) ** 0.5
    w = block.ffn.sublayer.up.weight
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
