"""Document 004's checklist: the 2026 defaults and the rules, applied to a layer's structure (architecture.read_layer).

    default     pre-norm, RMSNorm, GQA, RoPE, SwiGLU with expansion >= 2x, sequential residual; deviations are INFO
    REJECT      a decoder whose future leaks into its past; post-norm deeper than 12 blocks without warm-up
    FLAG        FFN expansion below 2x; no normalization; a sub-layer without a residual; a head count that differs
                from the one the config declares; an FFN whose activation is not recognised
    CANNOT      no attention or no feed-forward network recognised: nothing to judge, never a pass
"""
from __future__ import annotations

import math

from .structure import heads_kind

MAX_POST_NORM_DEPTH = 12
MIN_FFN_RATIO = 2.0
DEFAULTS = {"residual": "sequential", "norm_placement": "pre", "norm_kind": "rmsnorm", "attention": "GQA",
            "position": "rope", "ffn": "swiglu"}
WHY = {  # document 004's reasons (its claims are in reporting/claims.yaml)
    "norm_placement": "pre-norm keeps the residual stream un-normalized, so deep stacks start without warm-up; "
                      "post-norm deeper than 12 blocks needs it",
    "norm_kind": "RMSNorm is at least as stable as LayerNorm, without the mean subtraction and the bias",
    "attention": "GQA shares each K/V head among several query heads: a smaller KV cache at close to MHA quality",
    "position": "RoPE puts relative position into the query-key product itself",
    "ffn": "SwiGLU lowers perplexity by about 0.5 against a ReLU/GELU FFN",
    "residual": "sequential sub-layers are the reference; parallel ones trade a little quality for speed",
}


def judge_structure(review, s: dict, prefix: str = "", depth: int | None = None, warmup_steps: int = 0) -> None:
    """Findings for one stack's structure; ``prefix`` names the stack when a model has several (T5)."""
    def add(check, severity, message, value=None):
        review.add(check, severity, prefix + message, value)

    if not s.get("reviewable"):
        if "output_projection" in s:
            add("output projection", "flag", "the attention has no output projection (W_O): its heads' output is "
                "added to the stream as it is", None)
        add("structure", "cannot", f"cannot review: {s.get('reason')}", None)
        if s.get("partial"):  # the attention or the FFN was not found: what was, and causality
            _part(add, s)
            return
        if not s.get("rest_read"):  # nothing else was read
            return
    _placement(add, s, depth, warmup_steps)
    _defaults(add, s)
    _residuals(add, s)
    _causal(add, s)
    _heads(add, s)
    ratio, ffn = s["ffn_ratio"], s["evidence"].get("ffn") or {}
    of = " of the width it reads, inside a bottleneck narrower than the layer" if ffn.get("reads_width") else ""
    if ratio < MIN_FFN_RATIO:
        add("ffn ratio", "flag", f"expansion {ratio:.2f}x{of} is below {MIN_FFN_RATIO:g}x", ratio)
    else:
        add("ffn ratio", "pass", f"expansion {ratio:.2f}x{of}", ratio)
    if s["cross_attention"]:
        add("cross-attention", "info", "cross-attention: keys and values from the encoder output", True)


def _part(add, s) -> None:
    """A layer read in part (architecture._read_part): the sub-layer found, its norm and residual, causality."""
    found = " and ".join(s["partial"])
    add("structure", "info", f"read without the part named above: the {found}", s["partial"])
    for which, p in s["evidence"]["norm_placement"].items():
        where = p["placement"]
        text = {"pre": "pre-norm", "sandwich": "sandwich norms", "output": "an output norm", "post": "post-norm",
                "none": "no normalization found on its input, output or residual sum"}[where]
        add("norm position", "pass" if where in ("pre", "sandwich") else "flag" if where == "none" else "info",
            f"the {which}: {text}", where)
    if s["norm_kind"]:
        add("norm kind", "pass" if s["norm_kind"] == "rmsnorm" else "info", {"rmsnorm": "RMSNorm", "layernorm":
            "LayerNorm"}.get(s["norm_kind"], s["norm_kind"]), s["norm_kind"])
    if s.get("mixer"):
        heads = s["evidence"].get("heads") or {}
        add("mixer", "info", f"the token mixing reads as {s['mixer']}" + (
            f", {heads['heads']} heads of {heads['head_dim']} ({heads_kind(heads['heads'], heads['kv_heads'])} "
            f"{heads['heads']}/{heads['kv_heads']})" if heads.get("measured") else ""), s["mixer"])
    if s.get("ffn"):
        add("ffn kind", "flag" if s["ffn"] in ("unknown", "linear") else "pass" if s["ffn"] == "swiglu" else "info",
            f"{s['ffn']} (activation {s['evidence']['ffn']['activation']})"
            + (": the FFN is linear, no activation between its projections" if s["ffn"] == "linear" else ""),
            s["ffn"])
        ratio = s["ffn_ratio"]
        add("ffn ratio", "flag" if ratio < MIN_FFN_RATIO else "pass", f"expansion {ratio:.2f}x"
            + (f" is below {MIN_FFN_RATIO:g}x" if ratio < MIN_FFN_RATIO else ""), ratio)
    _residuals(add, {**s, "norm_placement": s["evidence"]["norm_placement"].get("attention", {}).get("placement")})
    _causal(add, s)


def judge_layers(review, s: dict, prefix: str = "", depth: int | None = None, warmup_steps: int = 0) -> None:
    """A stack whose layers differ: named as mixed, and each other pattern judged; only what it says differently
    from the stack's main pattern (judged by judge_structure) is added, under the pattern's layer indices."""
    patterns = s.get("layers") or []
    if len(patterns) < 2 or not s.get("reviewable"):
        return
    total = sum(len(p["indices"]) for p in patterns)
    described = "; ".join(f"{layer_ranges(p['indices'])}: {pattern_text(p)}" for p in patterns)
    review.add("layers", "info", f"{prefix}mixed stack, {len(patterns)} layer patterns over {total} layers "
               f"({described})", len(patterns))
    for shared in [s["evidence"], *(o["structure"]["evidence"] for o in s["evidence"].get("layer_patterns", [])
                                    if o["structure"].get("reviewable"))]:
        if shared.get("kv_shared"):
            kv = shared["kv_shared"]
            indices = next((o["indices"] for o in s["evidence"].get("layer_patterns", [])
                            if o["structure"]["evidence"] is shared), None) or next(
                p["indices"] for p in patterns if p.get("kv_from") == kv["from_layer"])
            config = "".join(f", config {k} {v}" for k, v in kv["config"].items())
            review.add("layers", "info", f"{prefix}layers {layer_ranges(indices)}: {kv['read_as']}; in the model "
                       f"they are computed from layer {kv['from_layer']}'s input (a KV cache shared across layers"
                       f"{config}), so these layers' attention mixes none of their own input", kv["from_layer"])
    main = _Findings()
    judge_structure(main, s, depth=depth, warmup_steps=warmup_steps)
    said = {(f.check, f.severity, f.message) for f in main.findings}
    for other in s["evidence"].get("layer_patterns", []):
        where = f"{prefix}layers {layer_ranges(other['indices'])}: "
        o = other["structure"]
        if not o.get("reviewable"):
            review.add("layers", "cannot", f"{where}cannot review: {o.get('reason')}", None)
            continue
        scratch = _Findings()
        judge_structure(scratch, {**o, "expected_causal": s.get("expected_causal"),
                                  "measured_heads_vs_config": {}}, depth=depth, warmup_steps=warmup_steps)
        for f in scratch.findings:
            if (f.check, f.severity, f.message) not in said:
                review.add(f.check, f.severity, where + f.message, f.value)


def layer_ranges(indices: list[int]) -> str:
    """[3, 7, 11, 15] -> '3, 7, ..., 15' (a constant step); [0, 1, 2, 5] -> '0-2, 5'."""
    if len(indices) > 3 and len({b - a for a, b in zip(indices, indices[1:])}) == 1 and indices[1] - indices[0] > 1:
        return f"{indices[0]}, {indices[1]}, ..., {indices[-1]}"
    parts, start = [], indices[0]
    for a, b in zip(indices, [*indices[1:], None]):
        if b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(parts)


def pattern_text(p: dict) -> str:
    if p.get("reviewable") is False:
        return "not reviewed"
    parts = [p["mixer"] if p["mixer"] != "attention" else
             f"{p['attention']} {p['query_heads']}/{p['kv_heads']}"]
    if p["mixer"] in ("attention", "linear-attention"):
        parts.append({"none": "no position (NoPE)"}.get(p["position"], p["position"]))
    if p["sliding_window"]:
        parts.append(f"window {p['sliding_window']}")
    if p.get("kv_from") is not None:
        parts.append(f"keys and values of layer {p['kv_from']}")
    parts.append(f"{p['ffn']} {p['ffn_ratio']:.2f}x" if not p["moe"] else
                 f"MoE {p['moe']['per_token']}/{p['moe']['experts']}" + (f" + {p['moe']['shared']} shared"
                                                                       if p["moe"].get("shared") else "")
                 + f" ({p['ffn_ratio']:.2f}x active)")
    return ", ".join(parts)


class _Findings:
    """Collects findings like report.Review, for a pattern judged only to compare with the main one."""

    def __init__(self):
        self.findings = []

    def add(self, check, severity, message, value=None):
        from .report import Finding

        self.findings.append(Finding(check, severity, message, value))


def _placement(add, s, depth, warmup_steps) -> None:
    where, ffn_where = s["norm_placement"], s["evidence"]["norm_placement"]["ffn"]["placement"]
    if ffn_where != where and "none" not in (where, ffn_where):
        add("norm position", "info", f"the FFN's norm placement ({ffn_where}) differs from the attention's "
            f"({where}, reported)", ffn_where)
    messages = {"pre": "pre-norm: h + F(norm(h))",
                "sandwich": "sandwich: h + norm(F(norm(h))), pre-norm plus a norm on each sub-layer's output",
                "output": f"output norm: h + norm(F(h)), the sub-layer input is not normalized; 2026 default: "
                          f"pre-norm ({WHY['norm_placement']})",
                "post": f"post-norm: norm(h + F(h)); 2026 default: pre-norm ({WHY['norm_placement']})"}
    if where == "none" or ffn_where == "none":
        which = "the sub-layers'" if where == ffn_where else "the attention's" if where == "none" else "the FFN's"
        add("norm position", "flag", f"no normalization found on {which} inputs, outputs or residual sums", "none")
        if where == "none":
            return
    if where == "post" and s["evidence"]["norm_placement"]["attention"].get("unit_sphere"):
        messages["post"] = ("post-norm on the unit sphere: after each sub-layer every row of the stream has length 1, "
                            "an L2 normalisation written by hand (x / ||x||, nGPT's hypersphere); the sum it reads is "
                            "not hooked, so no coefficients are read; 2026 default: pre-norm "
                            f"({WHY['norm_placement']})")
    elif where == "post":
        messages["post"] = f"post-norm: {post_norm_text(s['evidence']['norm_placement'])}; 2026 default: pre-norm " \
                           f"({WHY['norm_placement']})"
    through = {k: p["read_through"] for k, p in s["evidence"]["norm_placement"].items() if p.get("read_through")}
    if where in ("pre", "sandwich") and through:
        messages[where] += ("; " + " and ".join(f"the {'FFN' if k == 'ffn' else k} reads its norm's output through "
                                                 + ", ".join(f"'{n}'" for n in names) for k, names in through.items())
                            + " (measured and not judged: a function of the norm's output alone, as Canon layers' "
                            "short convolution with its own residual; the stream itself stays un-normalised)")
    add("norm position", "pass" if where in ("pre", "sandwich") else "info", messages[where], where)
    if where == "post" and depth is not None:
        _post_norm_depth(add, s, depth, warmup_steps)


def deepnorm_alpha(n: int) -> float:
    """DeepNorm's skip weight for a decoder of n blocks (Wang et al. 2022): alpha = (2N)^(1/4)."""
    return (2 * n) ** 0.25


def admin_omega(n: int) -> float:
    """Admin's skip weight at init for n blocks, the admin-torch default (blocklab.model.blocks.AdminResidual):
    omega0 = sqrt((M + 1) / ln(M + 1) - 1), M = 2N residual sub-layers."""
    m = 2 * n
    return math.sqrt((m + 1) / math.log(m + 1) - 1)


def covered(weight: float, needed) -> int:
    """The most blocks whose constant ``needed(n)`` the weight reaches (0: not even one)."""
    n = 0
    while n < 100_000 and weight >= needed(n + 1) * (1 - WEIGHT_TOL):
        n += 1
    return n


WEIGHT_TOL = 1e-4  # a skip weight written as (2N)^(1/4) to 4 digits still reaches it
LAB_BLOCKS = {"deepnorm": "DeepNorm", "admin": "Admin", "b2t": "B2T"}


def post_norm_fix(placements: dict) -> dict:
    """What the post-norm sums' coefficients make of the block: 'b2t' (the block's input joins a later sum), 'admin'
    (a weight per feature on the skip), 'deepnorm' (the skip weighted above the branch: h + 0.5 F(h) is norm(2h +
    F(h)), as the norm does not see the scale), else 'plain'; with the smallest skip weight over the branch."""
    fits = [p["post_sum"] for p in placements.values() if p.get("placement") == "post" and p.get("post_sum")]
    if not fits:
        return {"kind": "plain", "weight": 1.0}
    weights, per_feature, b2t = [], False, False
    for fit in fits:
        branch = abs(fit["coefficients"][fit["branch"]]) or 1.0
        stream = fit.get("stream")
        if "x" in fit["coefficients"] and stream != "x":
            b2t = True
        if stream is None:
            continue
        if fit["per_feature"] and fit["range"][stream][1] - fit["range"][stream][0] > 1e-6:
            per_feature = True
            weights.append(fit["range"][stream][0] / branch)
        else:
            weights.append(fit["coefficients"][stream] / branch)
    weight = min(weights) if weights else 1.0
    kind = "b2t" if b2t else "admin" if per_feature else "deepnorm" if weight > 1 + 1e-6 else "plain"
    return {"kind": kind, "weight": weight}


def lab_record(block: str, depth: int) -> str | None:
    """The lab's recorded outcome of its built-in ``block`` without warm-up (records/lab/runs, read and checked by
    blocklab.training.lab_records.recorded): 'learns 4 of 4 at 24 blocks without warm-up, records/lab/runs', or None where
    nothing is recorded (or the records cannot be read)."""
    try:
        from ..training.lab_records import RUNS, recorded

        runs = recorded(norm=block, warmup=0)
    except Exception:  # noqa: BLE001 - an installed copy without the records, or a damaged record: no citation
        return None
    if not len(runs):
        return None
    depths = sorted({int(n) for n in runs["n_layers"]})
    at = max((n for n in depths if n <= depth), default=depths[0])
    rows = runs[runs["n_layers"] == at]
    learned = int((rows["outcome"] == "learned").sum())
    others = rows[rows["outcome"] != "learned"]
    text = f"learns {learned} of {len(rows)} at {at} blocks without warm-up, {RUNS}"
    if len(others):
        text += " (" + ", ".join(f"{r.run}: {r.outcome}" for r in others.itertuples()) + ")"
    if at != depth:
        text += f"; the lab measured {at} blocks, not {depth}"
    return text, learned == len(rows) and at >= depth


def _post_norm_depth(add, s, depth: int, warmup_steps: int) -> None:
    """REJECT post-norm deeper than MAX_POST_NORM_DEPTH without warm-up, unless its coefficients are a fix that holds
    at that depth: DeepNorm's skip weight alpha >= (2N)^(1/4), Admin's omega >= the admin-torch omega0(N), B2T's
    input joining the last sum. A recognised fix cites the lab's recorded runs of its built-in counterpart."""
    if warmup_steps or depth <= MAX_POST_NORM_DEPTH:
        add("post-norm depth", "pass", f"post-norm stack of {depth} blocks"
            + (f" with {warmup_steps} warm-up steps" if warmup_steps else f" (<= {MAX_POST_NORM_DEPTH})"), depth)
        return
    fix = post_norm_fix(s["evidence"]["norm_placement"])
    kind, weight = fix["kind"], fix["weight"]
    plain = (f"post-norm stack of {depth} blocks without warm-up: deeper than {MAX_POST_NORM_DEPTH} it needs a "
             "warm-up schedule, or switch to pre-norm")
    if kind == "deepnorm":
        need, reach = deepnorm_alpha(depth), covered(weight, deepnorm_alpha)
        holds = weight >= need * (1 - WEIGHT_TOL)
        said = (f"the skip weighs {weight:.3g}x the branch: DeepNorm's alpha = (2N)^(1/4) "
                + (f"for N = {reach} blocks" if reach else f"for no depth (1 block needs {deepnorm_alpha(1):.3g})")
                + f"; {depth} blocks need {need:.3g}")
    elif kind == "admin":
        need, reach = admin_omega(depth), covered(weight, admin_omega)
        holds = weight >= need * (1 - WEIGHT_TOL)
        said = (f"Admin's weight per feature on the skip, at least {weight:.3g}x the branch: the admin-torch "
                "omega0 = sqrt((2N + 1) / ln(2N + 1) - 1) "
                + (f"for N = {reach} blocks" if reach else f"for no depth (1 block needs {admin_omega(1):.3g})")
                + f"; {depth} blocks need {need:.3g}")
    elif kind == "b2t":
        holds, said = True, "the block's input joins its last sum, a path past every norm of the block but the last"
    else:
        add("post-norm depth", "reject", plain, depth)
        return
    record = lab_record(kind, depth) if holds else None
    if not holds:
        add("post-norm depth", "reject", f"{plain}: {said}", depth)
        return
    if record is None:
        add("post-norm depth", "pass", f"post-norm stack of {depth} blocks without warm-up, as {LAB_BLOCKS[kind]}: "
            f"{said} (no run of the lab's {kind} recorded)", depth)
        return
    text, all_learned = record
    add("post-norm depth", "pass" if all_learned else "warn", f"post-norm stack of {depth} blocks without warm-up, as "
        f"{LAB_BLOCKS[kind]}: {said}; measured: the lab's {kind} {text}", depth)


def sum_text(fit: dict) -> str:
    """The sum a post-norm reads, as a formula: 'h + F(h)', '2.63*h + F(h)', 'w*h + F(h) (w per feature, ...)',
    'x + h + F(h)' (B2T: the block's input x joins the last sum)."""
    def term(k, v):
        label = "F(h)" if k == fit["branch"] else "h" if k == fit.get("stream") else "x" if k == "x" else f"{k}(.)"
        if fit["per_feature"]:
            lo, hi = fit["range"][k]
            if hi - lo > 1e-6:
                return f"w*{label} (w per feature, {lo:.3g} to {hi:.3g})"
        return label if abs(v - 1) < 1e-6 else f"{v:.3g}*{label}"
    return " + ".join(term(k, v) for k, v in fit["coefficients"].items())


def post_norm_text(placements: dict) -> str:
    """norm(sum) for each sub-layer read as post-norm, with what sets its sum apart from h + F(h)."""
    parts = []
    sum_norms = {n for p in placements.values() for n in p.get("post_norm", [])}
    for which, p in placements.items():
        fit = p.get("post_sum")
        # a post-norm block's FFN reads the attention's sum norm: not an input norm of its own
        p = {**p, "input_norm": [n for n in p.get("input_norm", []) if n not in sum_norms]}
        if p.get("placement") != "post" or not fit:
            if p.get("placement") == "post" and p.get("residual_carries"):
                parts.append(f"the {which}'s residual carries {p['residual_carries']}(h), norm(h) + F(norm(h))")
            continue
        inner = "F(norm(h))" if p.get("input_norm") else "F(h)"
        text = sum_text(fit).replace("F(h)", inner)
        notes = []
        stream = fit["coefficients"].get(fit.get("stream"))
        if fit["per_feature"] and any(hi - lo > 1e-6 for lo, hi in fit["range"].values()) or \
                fit["per_feature"] and stream is not None and abs(stream - 1) > 1e-6:
            notes.append("a weight per feature on the skip, as Admin's omega")
        elif stream is not None and abs(stream - 1) > 1e-6:
            notes.append(f"the skip scaled by {stream:.3g}, as DeepNorm's alpha")
        if "x" in fit["coefficients"] and fit.get("stream") != "x":
            notes.append("the block's input joins the sum, B2T's form")
        if abs(fit["coefficients"][fit["branch"]] - 1) > 1e-6 and not fit["per_feature"]:
            notes.append(f"the branch scaled by {fit['coefficients'][fit['branch']]:.3g}")
        if p.get("input_norm"):
            notes.append(f"with input norms too ({', '.join(p['input_norm'])}): the stream is re-normed after every "
                         "sum")
        parts.append(f"{which} norm({text})" + (f" ({'; '.join(notes)})" if notes else ""))
    return ", ".join(parts) if parts else "norm(h + F(h))"


def _defaults(add, s) -> None:
    kind = s["norm_kind"]
    add("norm kind", "pass" if kind == "rmsnorm" else "info",
        {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm", None: "no norm found",
         "l2": "L2 normalisation written by hand (x / ||x||: rows of length 1, no gain)"}.get(kind, str(kind))
        + ("" if kind == "rmsnorm" else f"; 2026 default: RMSNorm ({WHY['norm_kind']})"), kind)
    mixer = s.get("mixer", "attention")
    if mixer == "attention":
        _attention(add, s)
    elif mixer == "query-axis-softmax":
        heads = s["evidence"].get("heads") or {}
        add("attention", "flag", "softmax over the query axis (softmax(dim=-2)): each key's weights over the "
            "queries sum to one, not each query's weights over the keys (softmax(dim=-1)); read with queries and "
            "keys as computed and one-hot values, every head's weight columns are distributions and its rows are "
            f"not" + (f" ({heads['heads']} heads of {heads['head_dim']})" if heads.get("heads") else ""), mixer)
    else:
        add("mixer", "info", f"token mixing by {mixer} (no softmax attention): "
            + {"linear-attention": "queries read a running state of keys and values",
               "sigmoid-attention": "each weight is a sigmoid of its own logit, no distribution over the keys "
                                    "(sigmoid attention: with queries and keys silenced every key weighs the same "
                                    "in every row)",
               "conv": "a short convolution over the last few positions",
               "ssm": "a state-space scan over all earlier positions (the config declares its state size)",
               "recurrent": "a recurrence over all earlier positions (state-space scan or RNN)"}.get(mixer, mixer),
            mixer)
    for other in s["evidence"].get("mixer", {}).get("others_beside_it", []):
        where = other.get("where", "beside")
        add("mixer", "info", f"{where} it, token mixing by {other['kind']} in '{other['writer']}' (a hybrid layer: "
            + ("both read the layer's input)" if where == "beside" else
               ("the attention reads its output" if where == "before" else "it reads the attention's output")
               + ", in turn)"), other["kind"])
    if s["qk_norm"]:
        add("qk norm", "info", "norm on queries and keys before their product (QK-norm)", True)
    position, rotary = s["position"], s["evidence"].get("rotary_fraction")
    partial = f"partial RoPE ({rotary:.0%} of each head rotated)" if rotary is not None and rotary < 1 else "RoPE"
    text = {"rope": partial, "learned": "learned absolute positions added to the embedding",
            "sinusoidal": "sinusoidal absolute positions added to the embedding",
            "relative-bias": "learned relative-position bias on the attention logits",
            "alibi": "ALiBi: a fixed bias linear in distance on the attention logits",
            "decay-bias": "a bias on the logits computed from the tokens by "
                          f"{(s['evidence'].get('heads') or {}).get('logit_bias_from')} (a forget gate's decay, as "
                          "the Forgetting Transformer's: softmax attention whose weights fade with what lies between "
                          "key and query)",
            "none": "no position signal found (neither in the embedding nor in the layer)"
            if s["evidence"].get("absolute_position") is not None else
            "no position signal inside the block: positions must come from the embedding"}[position]
    through = [n for p in s["evidence"].get("norm_placement", {}).values() for n in p.get("read_through", [])]
    if position == "none" and through and s["evidence"].get("position_aware_in_layer"):
        # Canon layers: the attention's logits carry no position, but its input is a short causal convolution's
        text = ("no position signal in the attention's logits (measured and not judged: the block's output depends "
                "on the order of earlier tokens, and its projections read the norms' outputs through "
                + ", ".join(f"'{n}'" for n in through) + ", as Canon layers' short causal convolution orders "
                "neighbours)")
    if mixer == "attention":
        add("position", "pass" if position == "rope" else "info",
            text + ("" if position == "rope" else f"; 2026 default: RoPE ({WHY['position']})"), position)
    elif position == "rope":
        add("position", "info", f"measured and not judged: queries and keys rotated by position inside the {mixer} "
            f"({text}, as RetNet's retention rotates them); the 2026 defaults judge a softmax attention's", position)
    if s.get("sliding_window"):
        add("sliding window", "info", f"attention over the last {s['sliding_window']} positions only (a sliding "
            "window: the data flow's reach of position 0 ends before the sequence does)", s["sliding_window"])
    ffn, act = s["ffn"], s["evidence"]["ffn"]["activation"]
    if s["evidence"].get("unhooked_weights"):
        add("ffn", "warn", f"weights of 3 or more dimensions in {s['evidence']['unhooked_weights']} work without a "
            "layer to hook (routed experts?): the FFN read here is only part of the layer's feed-forward work", None)
    if ffn == "unknown":
        zeros = s["evidence"]["ffn"].get("zero_fraction")
        add("ffn kind", "flag", "the FFN's activation is none of ReLU, ReLU², GELU (erf, tanh, quick), SiLU, gated "
            "or not" + (f"; {zeros:.0%} of its hidden units are exactly zero at init (measured): a thresholded "
                        "activation, such as a top-k of the gate, that keeps the rest" if zeros else ""), ffn)
    elif ffn == "linear":
        add("ffn kind", "flag", f"the FFN is linear: no activation between its projections (the writer reads the "
            f"in-projection's output as it is), so its {s['evidence']['ffn']['matrices']} matrices are one linear "
            "map and the block has no per-token nonlinearity", ffn)
    else:
        add("ffn kind", "pass" if ffn == "swiglu" else "info", f"{ffn} (activation {act}, "
            f"{s['evidence']['ffn']['matrices']} matrices)" + ("" if ffn == "swiglu" else
                                                             f"; 2026 default: SwiGLU ({WHY['ffn']})"), ffn)
    moe = s.get("moe")
    if moe:
        shared = f" plus {moe['shared']} shared FFN{'s' if moe['shared'] > 1 else ''} on every token" \
            if moe["shared"] else ""
        hand = moe.get("written_by_hand")
        by_hand = (f" (written by hand: a list of FFNs in '{hand['container']}', routed by '{hand['router']}'; read "
                   f"through '{hand['read_through']}' with the router's output held so every token goes to it)"
                   if hand else "")
        add("moe", "info", f"routed experts: {moe['per_token']} of {moe['experts']} per token{shared}{by_hand}; the "
            f"FFN ratio below is the active width per token", moe)
    add("residual", "pass" if s["residual"] == "sequential" else "info",
        "sequential: the FFN reads the attention's output" if s["residual"] == "sequential" else
        f"parallel: attention and FFN read the same input, h + attn(.) + ffn(.); {WHY['residual']}", s["residual"])


def _attention(add, s) -> None:
    attention, heads = s["attention"], f"{s['query_heads']}/{s['kv_heads']} (query/KV heads)"
    if attention is None:
        add("attention", "flag", "token mixing found, but no query/key head structure in it", None)
        return
    full = s["evidence"].get("full_size")
    if full and not full["agrees_with_tiny"]:
        add("attention", "flag", f"the tiny build measured {s['evidence']['tiny']['query_heads']}/"
            f"{s['evidence']['tiny']['kv_heads']} heads, which the full-size shapes ({heads}) do not repeat", None)
    mixer = s["evidence"].get("mixer", {})
    latent = s["evidence"].get("latent")
    if latent:
        add("attention", "info", "multi-head latent attention: each head's keys and values come up from a latent "
            "shared per token (" + ", ".join(f"'{n}' {w} wide" for n, w in latent.items()) + "); heads counted "
            "after it", "latent")
    absorbed = (s["evidence"].get("heads") or {}).get("absorbed_latent")
    if absorbed:
        add("attention", "info", "the latent is absorbed: its " + str(absorbed["width"]) + " features are every "
            "head's keys and values at once, each head's query taken into it and each head's value brought up after "
            "the softmax (" + ", ".join(f"'{n}'" for n in absorbed["values_brought_up_by"]) + "); heads counted "
            f"per up-projection ({absorbed['kv_heads_in_latent']} K/V head in the latent itself)", "absorbed")
    if s["evidence"].get("bottleneck"):
        add("attention", "info", "the attention reads the layer's input through a bottleneck: "
            + ", ".join(f"'{n}'" for n in s["evidence"]["bottleneck"]) + " projects it and the in-projections read "
            "that (MobileBERT's shared query-key bottleneck); heads counted after it", "bottleneck")
    if mixer.get("weights") == "sinks":
        add("attention", "info", "attention sinks: an extra logit per head joins each softmax row and its weight is "
            "dropped (gpt-oss): a row's weights sum to less than one", "sinks")
    if mixer.get("no_value_projection"):
        add("attention", "flag", "no value projection (W_V): the heads average their input as it is"
            + (f" (the values are the output of '{mixer['values_from']}')" if mixer.get("values_from") else ""),
            "no W_V")
    rotated = (s["evidence"].get("heads") or {}).get("values_rotated")
    if rotated:
        keys = rotated.get("keys_rotated")
        add("position", "flag", "RoPE rotates the values: each value feature moves its rotary partner's column too "
            f"({len(rotated['planes'])} planes per head, e.g. offsets {rotated['planes'][0]}), so the output carries "
            "each token's absolute position; RoPE belongs on the queries and keys, where the rotations cancel to "
            "the relative position" + (" (the keys are not rotated: RoPE on q and v instead of q and k, and a "
                                       "rotation of the queries alone moves a row's logits alike: no position in "
                                       "the weights)" if keys is False else ""), "rope on values")
    scale = s["evidence"].get("logit_scale")
    if scale and scale["rule"] == "1/head_dim":
        add("attention", "info", f"scores q.k / {scale['divisor']:.3g}: divided by head_dim ({scale['head_dim']}), "
            f"not its square root (muP's scaling: logits {scale['head_dim'] ** 0.5:.3g}x smaller at this head width "
            "than 1/sqrt(head_dim) gives)", scale["rule"])
    for c in s["evidence"].get("beside_values") or []:
        add("attention", "info", f"measured and not judged: '{c['module']}' ({c['type']}) reads "
            + ", ".join(f"'{n}'" for n in c["reads"]) + " and adds its convolution over positions to the heads' "
            "output, beside the attention weights (Nystromformer's on the values); the heads were read with it "
            "silenced", "beside values")
    cap = s["evidence"].get("logit_cap")
    if cap:
        add("attention", "info", "measured and not judged: "
            + (f"a tanh cap on the scores at {cap['cap']:g} (c * tanh(s / c), Gemma 2's soft-capping)" if cap["cap"]
               else "the scores saturate, not as a tanh cap (logits set to "
               + ", ".join(f"{v:g}" for v in cap["logits_set"]) + " show as "
               + ", ".join(f"{v:.4g}" for v in cap["logits_seen"]) + ")"), "logit cap")
    maps = (s["evidence"].get("heads") or {}).get("maps_per_head", 1)
    if maps > 1:
        add("attention", "info", f"differential attention: each head's output is read from {maps} separate softmax "
            "maps (each half of its query features has its own)", maps)
    add("attention", "pass" if attention == "GQA" else "info",
        f"{attention} {heads}" + ("" if attention == "GQA" else f"; 2026 default: GQA ({WHY['attention']})"),
        attention)


def judge_logit_scale(review, s: dict) -> None:
    """A user's block: scores scaled by anything but 1/sqrt(head_dim) or a documented alternative are flagged (the
    divisor measured, evidence.logit_scale). The alternatives: 1/head_dim (muP, said as info by _attention), none
    (T5, whose initialisation takes the scale in), times sqrt(head_dim) (nGPT, on unit-norm queries and keys), and a
    temperature a parameter of the block sets."""
    scale = (s.get("evidence") or {}).get("logit_scale")
    if not s.get("reviewable") or s.get("mixer") != "attention" or not scale:
        return
    rule, divisor, hd = scale["rule"], scale["divisor"], scale["head_dim"]
    usual = f"sqrt(head_dim) = sqrt({hd}) = {hd ** 0.5:.3g}"
    if rule == "1/sqrt(d_model)":
        review.add("logit scale", "flag", f"scores q.k / {divisor:.3g}: divided by sqrt(d_model) = "
                   f"sqrt({scale['d_model']}), not by {usual}: logits {divisor / hd ** 0.5:.3g}x smaller than the "
                   "usual scale at this width, and smaller still as heads are added", rule)
    elif rule == "other":
        review.add("logit scale", "flag", f"scores q.k / {divisor:.3g}: neither 1/{usual} nor a documented "
                   "alternative (1/head_dim as muP, none as T5, times sqrt(head_dim) on unit vectors as nGPT), and "
                   "no parameter of the block sets it (no learned temperature)", rule)
    elif rule == "none":
        review.add("logit scale", "info", f"scores q.k not scaled (divisor 1, not {usual}): T5's convention, "
                   "which folds the scale into the initialisation of the queries", rule)
    elif rule == "sqrt(head_dim)":
        review.add("logit scale", "info", f"scores q.k times sqrt(head_dim) ({hd ** 0.5:.3g}): nGPT's scale, "
                   "for queries and keys of unit norm", rule)
    elif rule == "learned":
        review.add("logit scale", "info", f"scores q.k / {divisor:.3g} as probed: a parameter of the block sets "
                   "the scale (a learned temperature)", rule)


def _residuals(add, s) -> None:
    total = s["evidence"].get("output_sum")
    if total and s["norm_placement"] != "post" and "x" in total["coefficients"]:
        # the output is x plus sub-layer outputs: x must enter once, and every sub-layer's output must be in the sum
        c = total["coefficients"]["x"]
        if total["per_feature"] or abs(c - 1) > 1e-6:
            lo, hi = total["range"]["x"] if total["per_feature"] else (c, c)
            add("residual", "flag", f"the block's output carries {_amount(lo, hi)} times its input x, not once "
                "(x + F(.)): over a stack the un-normalised stream is scaled by that at every block"
                + (" (the residual added twice)" if abs(c - 2) < 1e-6 else ""), c)
        for sub in s["evidence"]["sublayers"]:
            if sub["residual_kept_when_silenced"] and sub["writer"] in total.get("terms", []) \
                    and sub["writer"] not in total["coefficients"]:
                add("residual", "flag", f"the output of '{sub['writer']}' is off the residual stream: the block's "
                    "output is x plus the later sub-layers' outputs, and it reaches it only through them",
                    sub["writer"])
    for sub in s["evidence"]["sublayers"]:
        if not sub["residual_kept_when_silenced"]:
            add("residual", "flag", f"none around '{sub['writer']}': silenced, the output no longer depends on the "
                "input (deep stacks then lose their gradient path)", sub["writer"])
        elif sub.get("residual_carries_norm"):
            add("residual", "flag", f"around '{sub['writer']}' the residual carries the normalised stream "
                f"{sub['residual_carries_norm']}(h), not h: h = norm(h) + F(norm(h)), across a stack post-norm "
                "(norm(h + F(h))): the raw stream has no identity path", sub["writer"])


def _amount(lo: float, hi: float) -> str:
    return f"{lo:.3g}" if hi - lo <= 1e-6 else f"{lo:.3g} to {hi:.3g} (per feature)"


def _causal(add, s) -> None:
    expected, causal, leak = s.get("expected_causal"), s["causal"], s["evidence"]["max_future_leak"]
    if expected and not causal:
        add("causal mask", "reject", f"future tokens leak into earlier positions (relative change {leak:.1e}) in a "
            "decoder: " + ("its softmax over the query axis lets a later query change an earlier query's weights"
                           if s.get("mixer") == "query-axis-softmax" else leak_text(s["evidence"].get("leak")))
            + reach_text(s["evidence"].get("leak")), False)
    elif expected is False and causal:
        add("masking", "warn", "an encoder that hides later tokens from earlier ones", True)
    elif causal:
        add("causal mask", "pass", "causal: perturbing future tokens leaves earlier outputs unchanged", True)
    else:
        add("masking", "pass", "bidirectional: every position sees every other", False)


def reach_text(leak: dict | None) -> str:
    if not leak or not leak.get("positions_ahead"):
        return ""
    r = leak["positions_ahead"]
    return f"; measured reach: an output reads up to {r} position{'s' if r > 1 else ''} ahead"


def leak_text(leak: dict | None) -> str:
    """Where the leak starts and which operation reads later positions (dataflow.LayerAnalysis.locate_leak)."""
    if not leak or "origin" not in leak:
        return "it needs a causal mask"
    origin, attention = leak["origin"], leak.get("attention")
    sub = origin.get("sublayer")
    part = "the token mixer" if origin.get("mixes_tokens") else "a per-token sub-layer"
    where = f"in the sub-layer written by '{sub}' ({part}), " if sub else ""
    if origin["kind"] == "module":
        kind = origin["type"]
        what = (" (a convolution that reads later positions: padded on both sides, padding='same', not causally on "
                "the left only)" if "Conv" in kind else " (it mixes positions: a norm or pooling over the time axis?)")
        return f"{where}'{origin['module']}' ({kind}) reads later positions itself{what}"
    before = f"before '{origin['before']}'" if origin.get("before") else "after the last hooked module"
    if attention:
        if attention["later_queries_move_earlier_rows"]:
            return (f"{where}later queries reach earlier rows {before}: the heads mix positions (a reshape such as "
                    ".view(B, heads, T, head_dim) of a (B, T, d) tensor, not .view(B, T, heads, head_dim)"
                    ".transpose(1, 2))")
        ahead = attention.get("weights_on_later_keys")
        if ahead is None:
            return f"{where}later keys or values reach earlier rows {before}"
        if ahead >= leak.get("positions_ahead", 0) > 1 and attention.get("rows_sum_alike"):
            return f"{where}the attention weights reach every later key {before}: it needs a causal mask"
        if ahead:
            return (f"{where}the attention weights give keys up to {ahead} position{'s' if ahead > 1 else ''} ahead "
                    f"weight {before}: the causal mask is off by {ahead} (tril(diagonal={ahead}) or triu({ahead + 1}))")
        if not attention.get("rows_sum_alike", True):
            return (f"{where}later keys get zero weight, yet earlier rows move with them {before}, and the rows' "
                    "weights do not sum alike: the mask is applied after the softmax, whose normaliser has read "
                    "every key")
        return (f"{where}later keys get zero weight, yet earlier rows move with them {before}: the scores are "
                "normalised over every key before the mask (a norm over the score matrix, or a softmax taken "
                "before the mask and renormalised)")
    return f"{where}code outside any module {before} reads later positions (a mask, a reshape or a norm over time)"


def _heads(add, s) -> None:
    check = s.get("measured_heads_vs_config") or {}
    maps = (s.get("evidence", {}).get("heads") or {}).get("maps_per_head", 1)
    if maps > 1 and check.get("config") and check.get("measured") and check["config"] == maps * check["measured"]:
        add("head count", "info", f"differential attention: {check['measured']} heads of {maps} softmax maps "
            f"each, the {check['config']} query heads the config declares", check["measured"])
    elif check.get("config") and check.get("measured") and check["config"] != check["measured"]:
        add("head count", "flag", f"the attention computes {check['measured']} heads, the config declares "
            f"{check['config']}", check["measured"])
