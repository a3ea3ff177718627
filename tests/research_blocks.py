"""Blocks in research styles the reviewer must read right, each written the way its paper or model code writes it:
post-norm with coefficients (DeepNorm, Admin, B2T, a scaled branch), blocks that leak the future in unusual ways
(mixture-of-depths routing, a softmax over the query axis), softmax's look-alikes (attention sinks, sigmoid
attention, elu+1 linear attention, no value projection), residual wiring mutants (a doubled residual, a stream
re-normed after every sum, an attention whose output is off the stream), 1/d scores, a caller-passed mask. Nothing
here imports blocklab: every expectation in tests/test_review_research.py is written from the forward() it names."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def causal_mask(T: int, dtype) -> torch.Tensor:
    return torch.full((T, T), float("-inf"), dtype=dtype).triu(1)


class Attention(nn.Module):
    """Causal softmax MHA, separate q/k/v/o, heads of d/h, scores q.k / sqrt(head_dim)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.h, self.hd = n_heads, d_model // n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def split(self, t):
        B, T, _ = t.shape
        return t.view(B, T, self.h, self.hd).transpose(1, 2)

    def merge(self, t):
        B, _, T, _ = t.shape
        return t.transpose(1, 2).reshape(B, T, -1)

    def scores(self, x):
        q, k = self.split(self.q(x)), self.split(self.k(x))
        return q @ k.transpose(-2, -1) / math.sqrt(self.hd) + causal_mask(x.shape[1], x.dtype)

    def forward(self, x):
        return self.o(self.merge(self.scores(x).softmax(-1) @ self.split(self.v(x))))


class MLP(nn.Module):
    def __init__(self, d_model: int, ratio: int = 4):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, ratio * d_model), nn.Linear(ratio * d_model, d_model)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class _Block(nn.Module):
    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.attn, self.mlp = Attention(d_model, n_heads), MLP(d_model)
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)


# --- post-norm with coefficients ---------------------------------------------------------------------------------


class DeepNormBlock(_Block):
    """DeepNet (Wang et al. 2022): LN(alpha x + attn(x)), LN(alpha h + mlp(h)), alpha = (2N)^(1/4) for an N-layer
    decoder; N = 24 here: alpha = 48^(1/4) = 2.632."""

    alpha = 48 ** 0.25

    def forward(self, x):
        h = self.ln1(self.alpha * x + self.attn(x))
        return self.ln2(self.alpha * h + self.mlp(h))


class AdminBlock(_Block):
    """Admin (Liu et al. 2020): LN(omega * x + attn(x)), a learned per-feature omega on the skip (Admin sets it from
    the profiled output variance; here as after training, 1.2 to 1.8 across the features), the same around the MLP."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.omega1 = nn.Parameter(torch.linspace(1.2, 1.8, d_model))
        self.omega2 = nn.Parameter(torch.linspace(1.2, 1.8, d_model))

    def forward(self, x):
        h = self.ln1(self.omega1 * x + self.attn(x))
        return self.ln2(self.omega2 * h + self.mlp(h))


class AdminDefaultBlock(_Block):
    """Admin with admin-torch's default for N = 24 blocks: omega0 = sqrt((M + 1) / ln(M + 1) - 1), M = 2N = 48
    (3.40), a learned vector per feature, here as after some training (omega0 to 1.2 omega0 across the features):
    LN(omega * x + attn(x)), the same around the MLP."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        omega0 = math.sqrt(49 / math.log(49) - 1)
        self.omega1 = nn.Parameter(torch.linspace(omega0, 1.2 * omega0, d_model))
        self.omega2 = nn.Parameter(torch.linspace(omega0, 1.2 * omega0, d_model))

    def forward(self, x):
        h = self.ln1(self.omega1 * x + self.attn(x))
        return self.ln2(self.omega2 * h + self.mlp(h))


class B2TBlock(_Block):
    """B2T connection (Takase et al. 2023): h = LN(x + attn(x)), out = LN(h + mlp(h) + x): the block's input skips
    both sub-layers into the last norm."""

    def forward(self, x):
        h = self.ln1(x + self.attn(x))
        return self.ln2(h + self.mlp(h) + x)


class HalfBranchPostNorm(_Block):
    """LN(x + 0.5 attn(x)), LN(h + 0.5 mlp(h)): a scaled branch."""

    def forward(self, x):
        h = self.ln1(x + 0.5 * self.attn(x))
        return self.ln2(h + 0.5 * self.mlp(h))


class NearlyPlainPostNorm(_Block):
    """LN(1.01 x + attn(x)), LN(1.01 h + mlp(h))."""

    def forward(self, x):
        h = self.ln1(1.01 * x + self.attn(x))
        return self.ln2(1.01 * h + self.mlp(h))


# --- residual wiring mutants -------------------------------------------------------------------------------------


class PreNormBlock(_Block):
    """The reference: x + attn(ln1(x)), h + mlp(ln2(h))."""

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class DoubledResidual(_Block):
    """x + x + attn(ln1(x)): the residual added twice (the stream doubles every block), then h + mlp(ln2(h))."""

    def forward(self, x):
        h = x + x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class RenormedStream(_Block):
    """Pre-norms, and the stream re-normed after every sum: n1(x + attn(ln1(x))), n2(h + mlp(ln2(h))): across a stack
    this is post-norm (no identity path from the input to the output)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.n1, self.n2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x):
        h = self.n1(x + self.attn(self.ln1(x)))
        return self.n2(h + self.mlp(self.ln2(h)))


class NormalisedFFNResidual(_Block):
    """Pre-norm attention, then an FFN that adds back the normalised stream: h = x + attn(ln1(x)), n = ln2(h),
    out = n + mlp(n): the raw h never reaches the output."""

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        n = self.ln2(h)
        return n + self.mlp(n)


class NormalisedAttentionResidual(_Block):
    """The attention adds back the normalised stream, n = ln1(x), h = n + attn(n); then a pre-norm FFN,
    h + mlp(ln2(h))."""

    def forward(self, x):
        n = self.ln1(x)
        h = n + self.attn(n)
        return h + self.mlp(self.ln2(h))


class MisroutedSkip(_Block):
    """x + mlp(ln2(x + attn(ln1(x)))): the attention's output reaches the block's output only through the MLP (it is
    off the residual stream)."""

    def forward(self, x):
        return x + self.mlp(self.ln2(x + self.attn(self.ln1(x))))


# --- scores scaled by 1/d ---------------------------------------------------------------------------------------


class InverseDScores(PreNormBlock):
    """PreNormBlock with scores q.k / head_dim (muP-style), not / sqrt(head_dim)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn
        attn.scores = lambda x: (attn.split(attn.q(x)) @ attn.split(attn.k(x)).transpose(-2, -1) / attn.hd
                                 + causal_mask(x.shape[1], x.dtype))


# --- future leaks the structure does not show ---------------------------------------------------------------------


class MixtureOfDepthsBlock(PreNormBlock):
    """Mixture-of-depths (Raposo et al. 2024) routed over the whole sequence: the top half of the tokens by a router
    score (chosen among all positions, future ones included) go through attention and MLP, the rest skip the block;
    a later token's score decides whether an earlier one is processed: the future leaks into the past."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.router = nn.Linear(d_model, 1)

    def forward(self, x):
        score = self.router(x).squeeze(-1)  # (B, T)
        k = max(1, x.shape[1] // 2)
        chosen = score >= score.topk(k, dim=-1).values[:, -1:]
        processed = super().forward(x)
        weight = torch.sigmoid(score)[..., None]
        return torch.where(chosen[..., None], x + weight * (processed - x), x)


class QueryAxisSoftmax(PreNormBlock):
    """The softmax taken over the query axis (dim=-2) of the causally masked scores: each key's weights over the
    queries sum to one, so a later query changes an earlier query's weights: the future leaks."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn
        attn.forward = lambda x: attn.o(attn.merge(attn.scores(x).softmax(-2) @ attn.split(attn.v(x))))


# --- softmax and its look-alikes ----------------------------------------------------------------------------------


class SinkAttentionBlock(PreNormBlock):
    """gpt-oss style attention sinks: one learned logit per head joins each row of the softmax and is dropped after
    it, softmax([scores, sink])[..., :-1] @ v: each row's weights sum to less than one. Softmax attention."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.sinks = nn.Parameter(torch.linspace(-0.5, 0.5, n_heads))
        attn = self.attn

        def forward(x):
            s = attn.scores(x)
            sink = self.sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:-1], 1)
            w = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]
            return attn.o(attn.merge(w @ attn.split(attn.v(x))))
        attn.forward = forward


class SigmoidAttentionBlock(PreNormBlock):
    """Sigmoid attention (Ramapuram et al. 2024): sigmoid(q.k / sqrt(d) - log T) @ v, causal; no normalisation
    over the keys."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn

        def forward(x):
            T = x.shape[1]
            w = torch.sigmoid(attn.scores(x) - math.log(T))  # -inf above the diagonal: weight 0
            return attn.o(attn.merge(w @ attn.split(attn.v(x))))
        attn.forward = forward


class LinearAttentionBlock(PreNormBlock):
    """Linear attention (Katharopoulos et al. 2020), causal: phi = elu + 1, out_i = phi(q_i) S_i / phi(q_i) z_i with
    S_i = sum_{j<=i} phi(k_j) v_j^T, z_i = sum_{j<=i} phi(k_j): no softmax."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn

        def forward(x):
            q, k, v = (attn.split(p(x)) for p in (attn.q, attn.k, attn.v))
            q, k = F.elu(q) + 1, F.elu(k) + 1
            kv = torch.einsum("bhtd,bhte->bhtde", k, v).cumsum(2)
            z = k.cumsum(2)
            out = torch.einsum("bhtd,bhtde->bhte", q, kv) / torch.einsum("bhtd,bhtd->bht", q, z)[..., None]
            return attn.o(attn.merge(out))
        attn.forward = forward


class NoValueProjection(PreNormBlock):
    """Softmax attention whose values are the normed input itself, split into heads (no W_V): softmax(q.k) @ x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        del self.attn.v
        attn = self.attn
        attn.forward = lambda x: attn.o(attn.merge(attn.scores(x).softmax(-1) @ attn.split(x)))


# --- the caller passes the mask ---------------------------------------------------------------------------------


class CallerMaskBlock(PreNormBlock):
    """forward(x, mask=None): the additive mask the caller passes is added to the scores; without it the attention
    is bidirectional. A decoder block that expects its caller's causal mask."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn

        def forward(x, mask=None):
            q, k = attn.split(attn.q(x)), attn.split(attn.k(x))
            s = q @ k.transpose(-2, -1) / math.sqrt(attn.hd)
            if mask is not None:
                s = s + mask
            return attn.o(attn.merge(s.softmax(-1) @ attn.split(attn.v(x))))
        attn.forward = forward

    def forward(self, x, mask=None):
        h = x + self.attn(self.ln1(x), mask)
        return h + self.mlp(self.ln2(h))


class NoResidualBlock(_Block):
    """attn(ln1(x)), then mlp(ln2(h)): both sub-layers' outputs replace the stream (no residual anywhere)."""

    def forward(self, x):
        h = self.attn(self.ln1(x))
        return self.mlp(self.ln2(h))


# --- layouts the reviewer must not misread -----------------------------------------------------------------------


class LatentAttention(Attention):
    """Multi-head latent attention (DeepSeek-V2's MLA, without its decoupled RoPE key): keys and values of every head
    come up from one shared latent per token, c = kv_norm(W_dkv x) (d_model / 4 wide), [k, v] = W_ukv c (one fused
    up-projection, as kv_b_proj); queries W_q x; 4 heads of 16, each with keys and values of its own."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        latent = d_model // 4
        del self.k, self.v
        self.w_dkv, self.kv_norm = nn.Linear(d_model, latent, bias=False), nn.RMSNorm(latent)
        self.w_ukv = nn.Linear(latent, 2 * d_model, bias=False)

    def forward(self, x):
        c = self.kv_norm(self.w_dkv(x))
        k, v = self.w_ukv(c).split(x.shape[-1], dim=-1)
        q, k, v = self.split(self.q(x)), self.split(k), self.split(v)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.hd) + causal_mask(x.shape[1], x.dtype)
        return self.o(self.merge(s.softmax(-1) @ v))


class MLABlock(PreNormBlock):
    """PreNormBlock around LatentAttention."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.attn = LatentAttention(d_model, n_heads)


class MacaronBlock(_Block):
    """Macaron (Lu et al. 2019, as in Conformer): x + 0.5 mlp(ln0(x)), h + attn(ln1(h)), h + 0.5 mlp2(ln2(h)):
    sequential, two half-step FFNs around the attention."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.ln0, self.mlp0 = nn.LayerNorm(d_model), MLP(d_model)

    def forward(self, x):
        h = x + 0.5 * self.mlp0(self.ln0(x))
        h = h + self.attn(self.ln1(h))
        return h + 0.5 * self.mlp(self.ln2(h))


class ConvThenAttentionBlock(_Block):
    """A hybrid written sequentially (as a Mamba-attention stack's pair of layers): x + out(conv(inp(ln0(x)))), a
    causal depthwise convolution of width 4, then h + attn(ln1(h)), h + mlp(ln2(h))."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.ln0 = nn.LayerNorm(d_model)
        self.inp, self.out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size=4, groups=d_model, padding=3)

    def forward(self, x):
        T = x.shape[1]
        h = x + self.out(self.conv(self.inp(self.ln0(x)).transpose(1, 2))[..., :T].transpose(1, 2))
        h = h + self.attn(self.ln1(h))
        return h + self.mlp(self.ln2(h))


class MoEBlock(PreNormBlock):
    """A mixture of experts written by hand: a router Linear(d, 4), the top 2 of 4 experts per token weighted by the
    softmax of their router scores, each expert an MLP of 2x (128 wide); h + sum_e g_e expert_e(ln2(h))."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, experts: int = 4, top: int = 2):
        super().__init__(d_model, n_heads)
        self.router, self.top = nn.Linear(d_model, experts, bias=False), top
        self.experts = nn.ModuleList(MLP(d_model, ratio=2) for _ in range(experts))
        del self.mlp

    def moe(self, x):
        scores, chosen = self.router(x).topk(self.top, dim=-1)
        gates = scores.softmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            weight = (gates * (chosen == e)).sum(-1, keepdim=True)
            routed = (chosen == e).any(-1)
            if routed.any():
                out[routed] = out[routed] + weight[routed] * expert(x[routed])
        return out

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.moe(self.ln2(h))


class EinsumAttentionBlock(_Block):
    """Attention written with torch.einsum on the block's own parameters: w_qkv (3, d, heads, head_dim) and w_o
    (heads, head_dim, d), no nn.Linear in the attention; 4 heads of 16, causal, pre-norm."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        del self.attn
        self.h, self.hd = n_heads, d_model // n_heads
        self.w_qkv = nn.Parameter(torch.randn(3, d_model, n_heads, self.hd) / math.sqrt(d_model))
        self.w_o = nn.Parameter(torch.randn(n_heads, self.hd, d_model) / math.sqrt(d_model))

    def attend(self, x):
        q, k, v = torch.einsum("btd,sdhe->sbhte", x, self.w_qkv)
        s = torch.einsum("bhte,bhue->bhtu", q, k) / math.sqrt(self.hd) + causal_mask(x.shape[1], x.dtype)
        return torch.einsum("bhte,hed->btd", s.softmax(-1) @ v, self.w_o)

    def forward(self, x):
        h = x + self.attend(self.ln1(x))
        return h + self.mlp(self.ln2(h))


# --- nanochat (Karpathy's nanochat gpt.py, abridged): functional norms, RoPE then a QK-norm, relu^2 MLP ----------


def _rms(x):
    return F.rms_norm(x, (x.size(-1),))


def _rotary(x, cos, sin):
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3).to(x.dtype)


class NanochatBlock(nn.Module):
    """x + attn(rms(x)), x + mlp(rms(x)) with F.rms_norm (no norm module); c_q, c_k, c_v (4 query heads, 2 K/V
    heads of 16), RoPE on halves (rotary tables held by the block: nanochat keeps them in the model), then a
    functional RMS QK-norm, causal SDPA; MLP c_proj(relu(c_fc x)^2), 4x; no biases."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2):
        super().__init__()
        self.h, self.kv, self.hd = n_heads, n_kv_heads, d_model // n_heads
        self.c_q = nn.Linear(d_model, n_heads * self.hd, bias=False)
        self.c_k = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.c_v = nn.Linear(d_model, n_kv_heads * self.hd, bias=False)
        self.c_proj = nn.Linear(d_model, d_model, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d_model, 4 * d_model, bias=False), nn.Linear(4 * d_model, d_model, bias=False)
        inv = 1.0 / 10000 ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd)
        freqs = torch.outer(torch.arange(256, dtype=torch.float32), inv)
        self.register_buffer("cos", freqs.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", freqs.sin()[None, :, None, :], persistent=False)

    def attn(self, x):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.h, self.hd)
        k = self.c_k(x).view(B, T, self.kv, self.hd)
        v = self.c_v(x).view(B, T, self.kv, self.hd)
        cos, sin = self.cos[:, :T].to(x.dtype), self.sin[:, :T].to(x.dtype)
        q, k = _rms(_rotary(q, cos, sin)), _rms(_rotary(k, cos, sin))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, -1))

    def forward(self, x):
        x = x + self.attn(_rms(x))
        return x + self.mlp_proj(F.relu(self.c_fc(_rms(x))).square())


class ZeroSinkAttentionBlock(SinkAttentionBlock):
    """SinkAttentionBlock with its sink logits zero at init, as gpt-oss initialises them."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        with torch.no_grad():
            self.sinks.zero_()


class QueryAxisEncoder(PreNormBlock):
    """An encoder block (no mask) whose softmax runs over the query axis: softmax(q.k / sqrt(d), dim=-2) @ v: each
    key's weights over the queries sum to one, no query's weights over the keys do."""
    SOFTMAX_DIM = -2  # the query axis of (batch, heads, query, key)

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn, dim = self.attn, self.SOFTMAX_DIM

        def forward(x):
            q, k = attn.split(attn.q(x)), attn.split(attn.k(x))
            w = (q @ k.transpose(-2, -1) / math.sqrt(attn.hd)).softmax(dim)
            return attn.o(attn.merge(w @ attn.split(attn.v(x))))
        attn.forward = forward


class RowSoftmaxEncoder(QueryAxisEncoder):
    """QueryAxisEncoder with the softmax over the keys, softmax(dim=-1): a plain bidirectional encoder block."""
    SOFTMAX_DIM = -1


# --- a mixture of experts and an attention written by hand, in other styles ---------------------------------------


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), hidden wide."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d_model, hidden, bias=False), nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoE(nn.Module):
    """Mixtral-style, as its first Hugging Face code wrote it: a gate Linear(d, 8), the softmax over all 8 router
    scores, the top 2 kept without renormalising, tokens flattened, each chosen expert (SwiGLU, 1x wide) applied to
    its rows and added back with index_add_; plus one shared SwiGLU expert (1x) on every token."""

    def __init__(self, d_model: int, experts: int = 8, top: int = 2):
        super().__init__()
        self.top = top
        self.gate = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_model) for _ in range(experts))
        self.shared = SwiGLU(d_model, d_model)

    def forward(self, x):
        B, T, D = x.shape
        flat = x.reshape(-1, D)
        weights, chosen = self.gate(flat).softmax(-1).topk(self.top, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            if len(rows):
                out.index_add_(0, rows, weights[rows, slot, None] * expert(flat[rows]))
        return (out + self.shared(flat)).reshape(B, T, D)


class SwiGLUMoEBlock(nn.Module):
    """x + attn(rms1(x)), h + moe(rms2(h)) with SparseMoE: 8 experts, 2 per token, 1 shared; nn.RMSNorm."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.attn, self.moe = Attention(d_model, n_heads), SparseMoE(d_model)
        self.rms1, self.rms2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)

    def forward(self, x):
        h = x + self.attn(self.rms1(x))
        return h + self.moe(self.rms2(h))


class EinsumGQABlock(nn.Module):
    """Attention and FFN on the block's own nn.Parameters, no nn.Linear anywhere: wq (d, 4, 16), wk and wv (d, 2,
    16), wo (4, 16, d); q = einsum('btd,dhe->bthe'), scores einsum('bthd,bshd->bhts', q, k) over each query head's
    key/value head (GQA 4/2), causal, / sqrt(16); an RMS pre-norm written out with its own weight; the FFN
    (silu(x @ w1) * (x @ w3)) @ w2, hidden 2d: a SwiGLU of 2x."""

    causal = True

    def __init__(self, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2):
        super().__init__()
        hd = d_model // n_heads
        self.h, self.kv, self.hd = n_heads, n_kv_heads, hd
        s = d_model ** -0.5
        self.wq = nn.Parameter(torch.randn(d_model, n_heads, hd) * s)
        self.wk = nn.Parameter(torch.randn(d_model, n_kv_heads, hd) * s)
        self.wv = nn.Parameter(torch.randn(d_model, n_kv_heads, hd) * s)
        self.wo = nn.Parameter(torch.randn(n_heads, hd, d_model) * s)
        self.w1 = nn.Parameter(torch.randn(d_model, 2 * d_model) * s)
        self.w3 = nn.Parameter(torch.randn(d_model, 2 * d_model) * s)
        self.w2 = nn.Parameter(torch.randn(2 * d_model, d_model) * (2 * d_model) ** -0.5)
        self.g1, self.g2 = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.ones(d_model))

    @staticmethod
    def rms(x, g):
        return g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def attend(self, x):
        q = torch.einsum("btd,dhe->bthe", x, self.wq)
        k = torch.einsum("btd,dhe->bthe", x, self.wk).repeat_interleave(self.h // self.kv, dim=2)
        v = torch.einsum("btd,dhe->bthe", x, self.wv).repeat_interleave(self.h // self.kv, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.hd)
        if self.causal:
            s = s + causal_mask(x.shape[1], x.dtype)
        return torch.einsum("bthe,hed->btd", torch.einsum("bhts,bshe->bthe", s.softmax(-1), v), self.wo)

    def forward(self, x):
        h = x + self.attend(self.rms(x, self.g1))
        u = self.rms(h, self.g2)
        return h + (F.silu(u @ self.w1) * (u @ self.w3)) @ self.w2


class EinsumNoMaskBlock(EinsumGQABlock):
    """EinsumGQABlock without its causal mask: every query reads every key (the future leaks in a decoder)."""

    causal = False


class ExpertChoiceMoEBlock(PreNormBlock):
    """Expert-choice routing (Zhou et al. 2022) written by hand: each of 4 experts (MLP, 2x) takes the half of the
    sequence's tokens its router score ranks highest, over all positions, later ones included, and adds its output
    weighted by the softmax of the token's scores: which tokens an expert takes depends on the future (a leak in a
    decoder), and no expert is ever handed every token."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, experts: int = 4):
        super().__init__(d_model, n_heads)
        self.router = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(MLP(d_model, ratio=2) for _ in range(experts))
        del self.mlp

    def moe(self, x):
        gates = self.router(x).softmax(-1)  # (B, T, E)
        out = torch.zeros_like(x)
        take = max(1, x.shape[1] // 2)
        for e, expert in enumerate(self.experts):
            for b in range(x.shape[0]):
                rows = gates[b, :, e].topk(take).indices
                out[b, rows] = out[b, rows] + gates[b, rows, e, None] * expert(x[b, rows])
        return out

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.moe(self.ln2(h))


class MoEOffStream(MoEBlock):
    """MoEBlock whose MoE output replaces the stream: x + attn(ln1(x)), then moe(ln2(h)) with no residual."""

    def forward(self, x):
        return self.moe(self.ln2(x + self.attn(self.ln1(x))))


class TensordotAttentionBlock(PreNormBlock):
    """PreNormBlock whose attention applies its weights with torch.tensordot on 3-D nn.Parameters (w_q, w_k, w_v of
    (d, 4, 16), w_o (4, 16, d)): a function the reviewer does not follow. Causal softmax MHA, gelu MLP 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        del self.attn
        hd = d_model // n_heads
        self.hd = hd
        self.w_q, self.w_k, self.w_v = (nn.Parameter(torch.randn(d_model, n_heads, hd) / math.sqrt(d_model))
                                        for _ in range(3))
        self.w_o = nn.Parameter(torch.randn(n_heads, hd, d_model) / math.sqrt(d_model))

    def attend(self, x):
        q, k, v = (torch.tensordot(x, w, dims=1).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.hd) + causal_mask(x.shape[1], x.dtype)
        return torch.tensordot((s.softmax(-1) @ v).transpose(1, 2), self.w_o, dims=2)

    def forward(self, x):
        h = x + self.attend(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class TensordotLeakBlock(TensordotAttentionBlock):
    """TensordotAttentionBlock without its causal mask: the future leaks."""

    def attend(self, x):
        q, k, v = (torch.tensordot(x, w, dims=1).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        return torch.tensordot((s.softmax(-1) @ v).transpose(1, 2), self.w_o, dims=2)


# --- mutants with one planted defect each: the scale, an input written in place, RoPE on v, a linear FFN ---------


class ModelWidthScores(PreNormBlock):
    """PreNormBlock with scores q.k / sqrt(d_model) (8 at d_model 64), not / sqrt(head_dim) (4)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn
        attn.scores = lambda x: (attn.split(attn.q(x)) @ attn.split(attn.k(x)).transpose(-2, -1) / math.sqrt(d_model)
                                 + causal_mask(x.shape[1], x.dtype))


class InPlaceNormBlock(_Block):
    """x.copy_(ln1(x)): the input normalised in place (the caller's tensor too), then x + attn(x), h + mlp(ln2(h)):
    the residual carries ln1(x)."""

    def forward(self, x):
        x.copy_(self.ln1(x))
        h = x + self.attn(x)
        return h + self.mlp(self.ln2(h))


class InPlaceRMSBlock(_Block):
    """An RMS norm written in place on the input, x.mul_(rsqrt(mean(x^2) + eps)), then x + attn(x), h + mlp(ln2(h))."""

    def forward(self, x):
        x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        h = x + self.attn(x)
        return h + self.mlp(self.ln2(h))


def _rotate_half(t, cos, sin):
    """Llama's RoPE on (..., T, head_dim): pairs (i, i + head_dim / 2)."""
    d = t.shape[-1] // 2
    t1, t2 = t[..., :d], t[..., d:]
    return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1)


class RopeOnValues(PreNormBlock):
    """PreNormBlock whose attention applies RoPE (theta 10000, Llama's halves) to q and v, and leaves k as it is."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn, hd = self.attn, d_model // n_heads
        inv = 1.0 / 10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)

        def forward(x):
            angles = torch.outer(torch.arange(x.shape[1], dtype=torch.float64), inv)
            cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
            q, k, v = attn.split(attn.q(x)), attn.split(attn.k(x)), attn.split(attn.v(x))
            q, v = _rotate_half(q, cos, sin), _rotate_half(v, cos, sin)
            scores = q @ k.transpose(-2, -1) / math.sqrt(hd) + causal_mask(x.shape[1], x.dtype)
            return attn.o(attn.merge(scores.softmax(-1) @ v))

        attn.forward = forward


class IdentityActivationFFN(PreNormBlock):
    """PreNormBlock whose MLP has no activation: down(up(x))."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        mlp = self.mlp
        mlp.forward = lambda x: mlp.down(mlp.up(x))


# --- leaks in unusual places: each must be located -----------------------------------------------------------------


class _LeakyAttention(PreNormBlock):
    """PreNormBlock whose attention's forward is ``self.leaky(attn, x)``."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn
        attn.forward = lambda x: self.leaky(attn, x)


class MaskAfterSoftmax(_LeakyAttention):
    """softmax(q.k / 4) over every key, then the later keys' weights set to 0: the normaliser read them."""

    @staticmethod
    def leaky(attn, x):
        T = x.shape[1]
        scores = attn.split(attn.q(x)) @ attn.split(attn.k(x)).transpose(-2, -1) / math.sqrt(attn.hd)
        weights = scores.softmax(-1).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0.0)
        return attn.o(attn.merge(weights @ attn.split(attn.v(x))))


class ScoreNormBlock(_LeakyAttention):
    """The scores standardised over the key axis ((s - mean) / std over every key), then the causal mask, then the
    softmax: the mean and std read later keys."""

    @staticmethod
    def leaky(attn, x):
        scores = attn.split(attn.q(x)) @ attn.split(attn.k(x)).transpose(-2, -1) / math.sqrt(attn.hd)
        scores = (scores - scores.mean(-1, keepdim=True)) / scores.std(-1, keepdim=True)
        weights = (scores + causal_mask(x.shape[1], x.dtype)).softmax(-1)
        return attn.o(attn.merge(weights @ attn.split(attn.v(x))))


class ViewSplitHeads(PreNormBlock):
    """Heads split by t.reshape(B, heads, T, head_dim) of a (B, T, d) tensor (no transpose): each head's rows are
    made of features of several tokens; the causal mask is there."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        attn = self.attn
        attn.split = lambda t: t.reshape(t.shape[0], attn.h, t.shape[1], attn.hd)


class SameConvBlock(PreNormBlock):
    """A depthwise convolution of width 3 with padding='same' (it reads one position ahead) and its own residual
    before the PreNormBlock: x + conv(ln0(x))."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.ln0 = nn.LayerNorm(d_model)
        self.conv = nn.Conv1d(d_model, d_model, 3, padding="same", groups=d_model)

    def forward(self, x):
        x = x + self.conv(self.ln0(x).transpose(1, 2)).transpose(1, 2)
        return super().forward(x)


# --- published designs of 2024-2025 ----------------------------------------------------------------------------------


def _justnorm(x):
    """nGPT's justnorm: x / ||x||_2 over the features, written by hand."""
    return x / x.norm(p=2, dim=-1, keepdim=True)


def _sinusoidal_rope(q, k):
    """nGPT's apply_rotary_position_embeddings on (B, heads, T, head_dim): interleaved pairs (2i, 2i + 1), theta
    10000."""
    T, hd = q.shape[-2], q.shape[-1]
    inv = 1.0 / 10000 ** (torch.arange(0, hd, 2, dtype=q.dtype) / hd)
    angles = torch.outer(torch.arange(T, dtype=q.dtype), inv)
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)

    def rotate(t):
        pairs = torch.stack([-t[..., 1::2], t[..., 0::2]], -1).reshape(t.shape)
        return t * cos + pairs * sin

    return rotate(q), rotate(k)


class NGPTBlock(nn.Module):
    """nGPT (Loshchilov et al. 2024, NVIDIA/ngpt model.py, use_nGPT=1): the stream lives on the unit sphere.
    q, k, v = W_q h, W_k h, W_v h (4 heads of 16); RoPE on q and k; q, k = s_qk * justnorm(q), justnorm(k) (s_qk per
    head feature, 1 at init); causal softmax with scale sqrt(head_dim) (unit vectors); h_A = W_o(y);
    h = justnorm(justnorm(h) + alpha_A * (justnorm(h_A) - justnorm(h))), alpha_A per feature (0.05 at init: the
    eigen learning rates). MLP: u, v = chunk(s_uv * sqrt(d) * c_fc(h)), u * silu(v) (SwiGLU, 4d hidden), h_M =
    W_down(.), the same interpolation with alpha_M. No LayerNorm, no RMSNorm: x / ||x|| is the norm."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.h, self.hd, self.d = n_heads, d_model // n_heads, d_model
        self.query, self.key, self.value = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))
        self.att_c_proj = nn.Linear(d_model, d_model, bias=False)
        self.c_fc = nn.Linear(d_model, 2 * 4 * d_model, bias=False)
        self.mlp_c_proj = nn.Linear(4 * d_model, d_model, bias=False)
        self.sqk = nn.Parameter(torch.ones(d_model))
        self.suv = nn.Parameter(torch.ones(2 * 4 * d_model))
        self.attn_alpha = nn.Parameter(torch.full((d_model,), 0.05))
        self.mlp_alpha = nn.Parameter(torch.full((d_model,), 0.05))

    def attention(self, h):
        B, T, C = h.shape
        q, k, v = (p(h).view(B, T, self.h, self.hd).transpose(1, 2) for p in (self.query, self.key, self.value))
        q, k = _sinusoidal_rope(q, k)
        sqk = self.sqk.view(1, self.h, 1, self.hd)
        q, k = sqk * _justnorm(q), sqk * _justnorm(k)
        scores = q @ k.transpose(-2, -1) * math.sqrt(self.hd) + causal_mask(T, h.dtype)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        return self.att_c_proj(y)

    def mlp(self, h):
        u, v = torch.chunk(self.suv * math.sqrt(self.d) * self.c_fc(h), 2, dim=-1)
        return self.mlp_c_proj(u * F.silu(v))

    def forward(self, h):
        a, b = _justnorm(h), _justnorm(self.attention(h))
        h = _justnorm(a + self.attn_alpha.abs() * (b - a))
        a, b = _justnorm(h), _justnorm(self.mlp(h))
        return _justnorm(a + self.mlp_alpha.abs() * (b - a))


class SlicedQKVEinsumBlock(_Block):
    """A fused w_qkv (d, 3 * d) parameter sliced into its query, key and value columns and each applied by einsum:
    q = einsum('btd,dhe->bthe', x, w_qkv[:, :d].view(d, 4, 16)), likewise k and v; causal softmax over q.k / 4;
    w_o (d, d) applied by x @ w_o; ln1/ln2 pre-norms, MLP gelu 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        del self.attn
        self.h, self.hd, self.d = n_heads, d_model // n_heads, d_model
        self.w_qkv = nn.Parameter(torch.randn(d_model, 3 * d_model) / math.sqrt(d_model))
        self.w_o = nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model))

    def attend(self, x):
        d = self.d
        q, k, v = (torch.einsum("btd,dhe->bthe", x, self.w_qkv[:, i * d:(i + 1) * d].view(d, self.h, self.hd))
                   for i in range(3))
        s = torch.einsum("bthe,bshe->bhts", q, k) / math.sqrt(self.hd) + causal_mask(x.shape[1], x.dtype)
        y = torch.einsum("bhts,bshe->bthe", s.softmax(-1), v).reshape(x.shape)
        return y @ self.w_o

    def forward(self, x):
        h = x + self.attend(self.ln1(x))
        return h + self.mlp(self.ln2(h))


def _complex_rope(t, dim: int):
    """DeepSeek-V3's apply_rotary_emb on (B, T, heads, dim): interleaved pairs as complex numbers, theta 10000."""
    T = t.shape[1]
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = torch.polar(torch.ones(T, dim // 2, dtype=torch.float64), torch.outer(torch.arange(T, dtype=torch.float64),
                                                                                  inv))
    z = torch.view_as_complex(t.double().reshape(*t.shape[:-1], -1, 2)) * freqs[None, :, None, :]
    return torch.view_as_real(z).flatten(3).to(t.dtype)


class AbsorbedMLABlock(nn.Module):
    """DeepSeek-V3's MLA as model.py's attn_impl='absorb' runs it (no q LoRA): q = wq(x) per head split into 16
    'nope' and 8 RoPE features; kv = wkv_a(x) split into a latent of 16 and a shared RoPE key of 8; the Linear
    wkv_b (latent -> heads x (16 nope + 16 v)) is never called: its weight viewed (heads, 32, 16), the query's nope
    part taken into the latent by einsum('bshd,hdc->bshc', q_nope, wkv_b[:, :16]), scores = (q_lat . kv_norm(kv) +
    q_pe . k_pe) * (24)^-0.5, causal softmax, the weighted latent brought up by einsum('bshc,hdc->bshd', .,
    wkv_b[:, -16:]) and wo. 4 heads, each with keys and values of its own (MHA 4/4 through a shared latent); RMSNorm
    pre-norms, SwiGLU MLP 2x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.h, self.nope, self.rope, self.vd, self.rank = n_heads, 16, 8, 16, 16
        self.wq = nn.Linear(d_model, n_heads * (self.nope + self.rope), bias=False)
        self.wkv_a = nn.Linear(d_model, self.rank + self.rope, bias=False)
        self.kv_norm = nn.RMSNorm(self.rank)
        self.wkv_b = nn.Linear(self.rank, n_heads * (self.nope + self.vd), bias=False)
        self.wo = nn.Linear(n_heads * self.vd, d_model, bias=False)
        self.attn_norm, self.ffn_norm = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, 2 * d_model)

    def attn(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.h, self.nope + self.rope)
        q_nope, q_pe = torch.split(q, [self.nope, self.rope], dim=-1)
        q_pe = _complex_rope(q_pe, self.rope)
        kv, k_pe = torch.split(self.wkv_a(x), [self.rank, self.rope], dim=-1)
        k_pe = _complex_rope(k_pe.unsqueeze(2), self.rope).squeeze(2)
        wkv_b = self.wkv_b.weight.view(self.h, -1, self.rank)
        q_nope = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :self.nope])
        kv = self.kv_norm(kv)
        scores = (torch.einsum("bshc,btc->bsht", q_nope, kv) + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) \
            * (self.nope + self.rope) ** -0.5
        scores = (scores + causal_mask(T, x.dtype)[None, :, None, :]).softmax(dim=-1)
        o = torch.einsum("bsht,btc->bshc", scores, kv)
        o = torch.einsum("bshc,hdc->bshd", o, wkv_b[:, -self.vd:])
        return self.wo(o.flatten(2))

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.ffn(self.ffn_norm(h))


class ForgettingAttention(Attention):
    """The Forgetting Transformer's attention (FoX, Lin et al. 2025): a forget gate per head and token,
    f_t = sigmoid(w_f . x_t + b_f) (w_f a Linear(d, heads) with a bias per head), D_ij = sum_{l=j+1..i} log f_l, and
    softmax(q.k / sqrt(head_dim) + D + causal mask) @ v: softmax attention with a data-dependent decay bias."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.fgate = nn.Linear(d_model, n_heads)

    def forward(self, x):
        log_f = F.logsigmoid(self.fgate(x)).transpose(1, 2)  # (B, heads, T)
        c = log_f.cumsum(-1)
        decay = c[..., :, None] - c[..., None, :]  # sum over l in (j, i] of log f_l
        s = self.scores(x) + decay
        return self.o(self.merge(s.softmax(-1) @ self.split(self.v(x))))


class ForgettingBlock(PreNormBlock):
    """PreNormBlock around ForgettingAttention (LayerNorm pre-norms, gelu MLP 4x)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.attn = ForgettingAttention(d_model, n_heads)


class CanonBlock(nn.Module):
    """Canon layers (Allen-Zhu 2025, 'Physics of Language Models part 4.1'): after each pre-norm, before the
    projections, a short causal depthwise convolution (kernel 4, left padding 3) with its own residual,
    u = n + conv(n), n = rms(x); then x + attn(u), and the same before the MLP: h + mlp(v), v = m + conv2(m),
    m = rms2(h). RMSNorm, causal softmax MHA 4 heads, gelu MLP 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, kernel: int = 4):
        super().__init__()
        self.attn, self.mlp = Attention(d_model, n_heads), MLP(d_model)
        self.rms1, self.rms2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.canon_a = nn.Conv1d(d_model, d_model, kernel, groups=d_model, padding=kernel - 1)
        self.canon_c = nn.Conv1d(d_model, d_model, kernel, groups=d_model, padding=kernel - 1)

    @staticmethod
    def canon(conv, n):
        return n + conv(n.transpose(1, 2))[..., :n.shape[1]].transpose(1, 2)

    def forward(self, x):
        h = x + self.attn(self.canon(self.canon_a, self.rms1(x)))
        return h + self.mlp(self.canon(self.canon_c, self.rms2(h)))


# --- features the review measures and does not judge ---------------------------------------------------------------


def _rotate(t, theta: float = 10000.0):
    """RoPE on (B, heads, T, hd), pairs (i, i + hd/2), angle position * theta^(-2i/hd)."""
    T, hd = t.shape[-2], t.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=t.dtype) / hd)
    ang = torch.arange(T, dtype=t.dtype)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    a, b = t[..., :hd // 2], t[..., hd // 2:]
    return t * cos + torch.cat([-b, a], -1) * sin


class RetentionBlock(PreNormBlock):
    """RetNet's multi-scale retention (Sun et al. 2023, eq. 5-8, parallel form): q and k rotated by position
    (RoPE pairs, theta 10000), k scaled by head_dim^-0.5; Retention = (q k^T * D) v with D[n, m] = gamma_h^(n - m)
    for n >= m, else 0, gamma_h = 1 - 2^(-5 - h); a GroupNorm per head; W_o(swish(W_g x) * GroupNorm(retention)).
    4 heads of 16; LayerNorm pre-norms, gelu MLP 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.attn = Retention(d_model, n_heads)


class Retention(Attention):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.g = nn.Linear(d_model, d_model)
        self.gn = nn.GroupNorm(n_heads, d_model, affine=False)
        self.register_buffer("gamma", 1 - 2.0 ** (-5 - torch.arange(n_heads, dtype=torch.float32)))

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = _rotate(self.split(self.q(x))), _rotate(self.split(self.k(x))) * self.hd ** -0.5, self.split(self.v(x))
        n = torch.arange(T, dtype=x.dtype)
        gap = n[:, None] - n[None, :]
        decay = torch.where(gap >= 0, self.gamma.to(x.dtype)[:, None, None] ** gap.clamp_min(0), 0.0)
        r = self.merge((q @ k.transpose(-2, -1) * decay) @ v)
        return self.o(F.silu(self.g(x)) * self.gn(r.reshape(B * T, d)).reshape(B, T, d))


class QKNormThenRope(PreNormBlock):
    """Qwen3's and OLMo 2's order: q = rope(rms_q(W_q x)), k = rope(rms_k(W_k x)), an RMSNorm per head (16 wide)
    before the rotation; causal softmax over q.k / 4; LayerNorm pre-norms, gelu MLP 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.attn = _QKNormRopeAttention(d_model, n_heads)


class _QKNormRopeAttention(Attention):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.q_norm, self.k_norm = nn.RMSNorm(self.hd), nn.RMSNorm(self.hd)

    def scores(self, x):
        q = _rotate(self.q_norm(self.split(self.q(x))))
        k = _rotate(self.k_norm(self.split(self.k(x))))
        return q @ k.transpose(-2, -1) / math.sqrt(self.hd) + causal_mask(x.shape[1], x.dtype)


class SoftcapBlock(PreNormBlock):
    """Gemma 2's attention logit soft-capping: scores = 50 * tanh((q.k / 4) / 50), then the causal mask and the
    softmax; LayerNorm pre-norms, gelu MLP 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.attn = _SoftcapAttention(d_model, n_heads)


class _SoftcapAttention(Attention):
    cap = 50.0

    def scores(self, x):
        q, k = self.split(self.q(x)), self.split(self.k(x))
        s = self.cap * torch.tanh(q @ k.transpose(-2, -1) / math.sqrt(self.hd) / self.cap)
        return s + causal_mask(x.shape[1], x.dtype)


class HyperConnectionBlock(nn.Module):
    """Static hyper-connections (Zhu et al. 2025, eq. 1-5) with expansion rate n = 2: the block's input holds n
    residual streams of width d = d_model / n side by side, H = x.view(B, T, n, d); each sub-layer T reads
    h = alpha_m . H (a learned weight per stream) and writes H' = beta * T(h) + A_r^T H (A_r an n x n learned
    matrix mixing the streams). Pre-norm LayerNorm inside each T; causal softmax MHA 4 heads; gelu MLP 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, n: int = 2):
        super().__init__()
        self.n, d = n, d_model // n
        self.attn, self.mlp = Attention(d, n_heads), MLP(d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        # initialised as the paper's: alpha_m picks stream 0, A_r the identity, beta ones (here moved off it, as
        # after training, so that the streams mix)
        self.alpha1, self.alpha2 = nn.Parameter(torch.tensor([0.7, 0.3])), nn.Parameter(torch.tensor([0.4, 0.6]))
        self.a1 = nn.Parameter(torch.tensor([[0.9, 0.2], [0.1, 0.8]]))
        self.a2 = nn.Parameter(torch.tensor([[0.8, 0.3], [0.2, 0.7]]))
        self.beta1, self.beta2 = nn.Parameter(torch.tensor([1.0, 0.5])), nn.Parameter(torch.tensor([0.5, 1.0]))

    def hc(self, H, alpha, a, beta, sub, norm):
        h = torch.einsum("btnd,n->btd", H, alpha.to(H.dtype))
        return beta.to(H.dtype)[:, None] * sub(norm(h))[..., None, :] + torch.einsum("btnd,nm->btmd", H,
                                                                                       a.to(H.dtype))

    def forward(self, x):
        B, T, _ = x.shape
        H = x.view(B, T, self.n, -1)
        H = self.hc(H, self.alpha1, self.a1, self.beta1, self.attn, self.ln1)
        H = self.hc(H, self.alpha2, self.a2, self.beta2, self.mlp, self.ln2)
        return H.reshape(B, T, -1)


class DeltaRuleBlock(PreNormBlock):
    """A delta-rule linear attention (DeltaNet, Yang et al. 2024, as Qwen3-Next's gated DeltaNet without its decay
    gate): q, k, v through a short causal depthwise convolution (kernel 4, no bias) and SiLU, q and k L2-normalised per
    head, beta_t = sigmoid(w_b . x_t) per head, S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,
    o_t = S_t q_t; no rotation by position. 4 heads of 16; LayerNorm pre-norms, gelu MLP 4x."""

    def __init__(self, d_model: int = 64, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.attn = _DeltaRule(d_model, n_heads)


class _DeltaRule(Attention):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.b = nn.Linear(d_model, n_heads)
        self.conv = nn.Conv1d(3 * d_model, 3 * d_model, 4, groups=3 * d_model, padding=3, bias=False)

    def forward(self, x):
        T = x.shape[1]
        qkv = torch.cat([self.q(x), self.k(x), self.v(x)], -1).transpose(1, 2)
        qkv = F.silu(self.conv(qkv)[..., :T]).transpose(1, 2)
        q, k, v = (self.split(t) for t in qkv.chunk(3, -1))  # (B, H, T, hd)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(self.b(x)).transpose(1, 2)  # (B, H, T)
        S = torch.zeros(*q.shape[:2], self.hd, self.hd, dtype=x.dtype)
        out = []
        for t in range(x.shape[1]):
            kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None, None]
            S = S - bt * (S @ kt[..., :, None]) @ kt[..., None, :] + bt * vt[..., :, None] @ kt[..., None, :]
            out.append((S @ q[:, :, t, :, None])[..., 0])
        return self.o(self.merge(torch.stack(out, 2)))
