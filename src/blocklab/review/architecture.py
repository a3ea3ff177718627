"""A whole architecture reviewed: a layer of each stack read from its data flow (dataflow.py), scaled back to the
config's full size, counted on the meta device and judged against the 2026 defaults (rules.py)."""
from __future__ import annotations

import json
import sys

import torch

from ..model_config import ConfigError
from ..model import hf_config
from . import hf
from .dataflow import (TOL, LayerAnalysis, MemoryCapExceeded, Tracer, _features, experts_weights, in_width,
                       memory_cap, one_thread, out_width)
from .report import Review
from .rules import judge_layers, judge_structure, layer_ranges
from .structure import heads_kind, norm_kind

STRUCTURE_KEYS = ("residual", "norm_placement", "norm_kind", "attention", "query_heads", "kv_heads", "qk_norm",
                  "position", "ffn", "ffn_ratio", "causal", "cross_attention")


LAYER_KEYS = ("mixer", "position", "attention", "query_heads", "kv_heads", "sliding_window", "qk_norm", "ffn",
              "ffn_ratio", "moe")
MIXERS = ("attention", "linear-attention", "sigmoid-attention", "query-axis-softmax", "conv", "ssm", "recurrent")
FUNCTIONAL_KINDS = {"rms_norm()": "rmsnorm", "layer_norm()": "layernorm", "l2_normalize()": "l2"}  # norms without a module (dataflow)
LOOK_ALIKES = {"sigmoid": "sigmoid-attention", "normalised-linear": "linear-attention"}


def read_mixer(a: LayerAnalysis, g) -> dict:
    """What kind of token mixing a sub-layer does, from its data flow: query/key heads and a softmax (with queries
    and keys silenced the values are still averaged) make attention; heads without the softmax, linear attention;
    no heads: a short convolution when a change at position 0 reaches only the next few positions, else a
    recurrence (a state-space scan or an RNN: the data flow does not tell them apart). Heads without a query whose
    weights are distributions over the queries: a softmax over the query axis."""
    with a.silenced(a.beside_values(g)):
        heads = a.heads(g)
        bias = a.position_bias(g, heads) if heads.get("measured") else {"measured": False}
    reach = a.reach()
    if heads.get("measured") and heads.get("roles") and any("q" in r for r in heads["roles"].values()):
        weights = bias.get("weights", "softmax" if bias.get("softmax", True) else None)
        kind = "attention" if weights in ("softmax", "sinks") else LOOK_ALIKES.get(weights, "linear-attention")
    elif a.query_axis(g, heads):
        kind = "query-axis-softmax"
    else:  # by its own reach: a convolution before an attention reaches every position through it
        own = g.reach if g.reach is not None else reach
        kind = "conv" if len(own) < a.seq else "recurrent"
    window = len(reach) if kind == "attention" and len(reach) < a.seq else None
    return {"kind": kind, "heads": heads, "bias": bias, "reach": reach, "window": window}


def read_layer(a: LayerAnalysis, absolute: dict | None = None) -> dict:
    """The structure of one layer at the size it was built, with the evidence for each value under 'evidence'."""
    selfs = [g for g in a.attentions if not g.cross]
    # weights of 3 or more dimensions are used without a layer to hook (fused experts): their work is not seen
    # (a convolution's kernel is applied by its own layer, which the hooks see)
    modules = dict(a.driver.layer.named_modules())
    bulk = sorted({n.rpartition(".")[0] for n, p in a.driver.layer.named_parameters() if p.dim() >= 3
                   and sorted(p.shape)[-2] > 1  # not a per-head gain shaped (heads, 1, 1)
                   and not isinstance(modules.get(n.rpartition(".")[0]), torch.nn.modules.conv._ConvNd)})
    bulk = [b for b in bulk if not all(n in a.tracer.applied for n, p in a.driver.layer.named_parameters()
                                       if n.rpartition(".")[0] == b and p.dim() >= 3)]  # applied token-wise: seen
    hand_moe = a.hand_experts
    routed_note = ((f"; routed experts written by hand: {hand_moe['experts']} experts in '{hand_moe['container']}'"
                   + (f", {hand_moe['per_token']} per token" if hand_moe["per_token"] else "")
                   + f", each called on the tokens routed to it: their FFN is not read ({a.unrouted})")
                   if hand_moe and not a.routing else "")
    unprojected = next((g for g in selfs if g.unprojected), None)
    if unprojected is not None and routed_note:
        return {"reviewable": False, "attention_found": True, "ffn_found": False, "hand_written_experts": hand_moe,
                "reason": f"the sub-layers after the attention could not be told apart{routed_note}"}
    if unprojected is not None:
        first = unprojected.unprojected[0]
        mixers = [c.name for c in unprojected.ins if c.index < next(i.index for i in unprojected.ins
                                                                      if i.name == first)]
        return {"reviewable": False, "attention_found": True, "ffn_found": False, "output_projection": None,
                "reason": f"no output projection after the token mixing: the values mixed from {mixers} reach "
                          f"'{first}', the next sub-layer's in-projection, without a projection back to the model "
                          "width (W_O) of their own; the attention and the sub-layer after it cannot be told apart"}
    if not selfs or not a.ffns:
        missing = " and ".join(n for n, found in (("token mixer (attention or other)", selfs),
                                                  ("feed-forward network", a.ffns)) if not found)
        found = [(g.out.name, "mixes tokens" if g.mixes else "per token") for g in a.sublayers]
        weights = [n for n, p in a.driver.layer.named_parameters() if p.dim() >= 3 and sorted(p.shape)[-2] > 1
                   and any(n.rpartition(".")[0] == b for b in bulk)]
        hint = (f"; weights of 3 or more dimensions applied without a layer to hook, {weights[:6]}: applied by a "
                "function the reviewer does not follow (torch.einsum, matmul and F.linear of a parameter on the "
                "tokens are followed; bmm, tensordot or a weight indexed or reshaped first are not)") if bulk else ""
        streams = a.streams() if not selfs and not a.sublayers else None
        outside = [g for g in a.reads_outside() if not g.mixes] if not selfs else []
        if outside:
            config = getattr(a.driver, "config", None)
            keys = {k: v for k, v in (vars(config).items() if config is not None else ())
                    if "kv_shared" in k and isinstance(v, int) and not isinstance(v, bool)}
            hint += ("; " + ", ".join(f"'{g.out.name}'" for g in outside) + " reads what the model computed from its "
                     "tokens outside this layer's input: with the input held and the tokens changed, its in-projections ("
                     + ", ".join(f"'{c.name}'" for g in outside for c in g.ins) + ") hold still and its input moves; "
                     "its keys and values come from an earlier layer (a shared KV cache"
                     + (", config " + ", ".join(f"{k} {v}" for k, v in keys.items()) if keys else "")
                     + "), so the attention mixes none of this layer's own input and cannot be read from it")
        elif streams:
            hint += (f"; the layer's input holds {streams['streams']} residual streams of {streams['width']} features "
                     "mixed by learned weights (with every projection's output zeroed, the output is x times A kron I, "
                     f"A = {streams['mixing']}: hyper-connections); measured and not judged: its sub-layers read and "
                     f"write one stream's width, and sub-layers are found by their projections back to the layer's "
                     f"width ({a.width})")
        elif not selfs and not bulk:
            hint += ("; if the layer has an attention, its keys and values come from outside it (a KV cache shared "
                     "with an earlier layer), which mixes none of the layer's own input")
        out = {"reviewable": False, "attention_found": bool(selfs), "ffn_found": bool(a.ffns),
               **({"streams": streams} if streams else {}),
               **({"hand_written_experts": hand_moe} if routed_note else {}),
               "reason": f"no {missing} recognised in the data flow (sub-layers found: {found}{hint}{routed_note})"}
        return {**out, **_read_part(a, selfs)} if a.sublayers else out
    cross = [g for g in a.attentions if g.cross]
    routed = [g for g in a.ffns if g.experts or g.hand]
    # the FFN expands: beside a low-rank adapter that also works per token (Gemma 3n's LAuReL, AltUp), the widest;
    # of two as wide (Macaron's half-step FFNs), the first after the attention
    after = selfs[0].out.index
    ffn = routed[0] if routed else max(a.ffns, key=lambda g: (g.out.inp.shape[-1], g.out.index > after))
    # a layer can mix tokens twice, side by side (Falcon-H1: attention and a Mamba scan on the same input): the
    # attention is the one reviewed, the others are named in the evidence
    mixers = []
    for g in selfs:
        mixers.append((g, read_mixer(a, g)))
        if mixers[-1][1]["kind"] == "attention":
            break
    attn, mixer = next(((g, m) for g, m in mixers if m["kind"] == "attention"), mixers[0])
    read = {id(g): m for g, m in mixers}
    # another mixer beside the attention (both read the layer's input: Falcon-H1), or before or after it in turn
    others = [{"writer": g.out.name, "kind": (read.get(id(g)) or read_mixer(a, g))["kind"],
               "where": "before" if any(a.depends.get((g.out.key, c.key)) for c in attn.ins) else
               "after" if any(a.depends.get((attn.out.key, c.key)) for c in g.ins) else "beside"}
              for g in selfs if g is not attn]
    is_attention = mixer["kind"] == "attention"
    # a softmax over the query axis has heads (counted from the features each edit moves), no query to probe
    heads, bias = (mixer["heads"], mixer["bias"]) if is_attention else (
        mixer["heads"] if mixer["kind"] == "query-axis-softmax" else {}, {"measured": False})
    causal = a.causal()
    aware = a.position_aware(causal["causal"])
    beside = a.beside_values(attn) if is_attention else []
    silence = a.silenced(beside)
    silence.__enter__()  # the attention probes below read the weights with the path beside them zeroed
    # position from the data flow only: rotated queries and keys (RoPE) or a bias on the logits; a layer that is
    # position-aware for another reason (a mask off by one, a sliding window) has neither
    rotary = a.rotary_fraction(attn, heads) if is_attention and bias.get("kind") == "none" else None
    if mixer["kind"] == "linear-attention" and mixer["heads"].get("measured"):
        # linear attention with heads (RetNet's retention): its queries and keys may be rotated by position too; the
        # same probe (a query at one offset, keys at the others, one-hot values) reads it, with nothing to judge
        rotary = a.rotary_fraction(attn, mixer["heads"]) if a.offsets_apart(attn, mixer["heads"]) else None
    scale = a.logit_scale(attn, heads) if is_attention else None
    cap = a.logit_cap(attn, heads, scale) if scale else None
    if cap and cap.get("divisor"):
        scale = cap["divisor"]  # read at a logit of about 1, the cap bent it: fitted with the cap
    if is_attention and heads.get("values_rotated"):
        heads = {**heads, "values_rotated": {**heads["values_rotated"], "keys_rotated": a.keys_rotated(attn, heads)}}
    if heads.get("logit_bias_from"):
        position = "decay-bias"  # a bias computed from the tokens (FoX's forget gate), read as no other kind
    elif bias.get("kind") in ("alibi", "relative-bias"):
        position = bias["kind"]
    elif rotary:
        position = "rope"
    else:
        position = (absolute or {}).get("kind") or "none"
    placements = {"attention": a.norm_placement(attn), "ffn": a.norm_placement(ffn)}
    qk_norms = (a.qk_norm(attn) or (["scale-invariant (no module)"] if a.qk_scale_invariant(attn, heads) else [])) \
        if is_attention else []
    silence.__exit__(None, None, None)
    norms = {c.name: c for c in a.norm_calls if any(c.name in p["norms"] for p in placements.values())}
    kinds = sorted({norm_kind(c.module, c.inp.shape[-1], a.generator) for c in norms.values()}
                   | {FUNCTIONAL_KINDS[n] for p in placements.values() for n in p["norms"] if n in FUNCTIONAL_KINDS})
    # parallel: the FFN and the attention read the same input; either reading the other's output is sequential
    parallel = not any(a.depends.get((g.out.key, c.key)) for g in a.attentions for c in ffn.ins) and \
        not any(a.depends.get((ffn.out.key, c.key)) for c in attn.ins)
    ffn_facts, moe = _ffn_and_moe(a, ffn, routed)
    # the width the FFN expands from: the layer's, or a bottleneck's (MobileBERT's FFNs read 128 of its 512)
    reads = ffn.ins[0].inp.shape[-1] if not routed and ffn.ins else a.width
    if reads != a.width:
        ffn_facts = {**ffn_facts, "reads_width": reads, "layer_width": a.width}
    bulk = [b for b in bulk if b not in {g.out.name for g in routed}]  # experts read as a whole: seen
    # 3-D weights inside a token mixer (RecurrentGemma's block-diagonal gates in its recurrence) are the mixer's work,
    # not a feed-forward network's
    spans = [(g.ins[0].index, g.out.index) for g in a.sublayers if g.mixes]
    inside = {c.name for c in a.calls if any(lo < c.index < hi for lo, hi in spans)}
    bulk = [b for b in bulk if not any(n == b or n.startswith(b + ".") for n in inside)]
    residuals = {g.out.name: a.residual_kept(g) for g in a.sublayers}
    # the layer's output as a sum of x and the sub-layers' outputs (None where a norm or a gate comes last): the
    # residual's coefficient on x (1 unless it is scaled or doubled) and which sub-layers' outputs are on the stream
    output_sum = a.stream_sum("output", a.sublayers[-1])
    normalised = {g.out.name: a.normalised_residual(g) for g in a.sublayers}
    if normalised.get(attn.out.name):
        # h = N(h) + F(N(h)): the stream between blocks is normalised at the start of each, which across a stack is
        # post-norm, norm(h + F(h)), not pre-norm
        placements["attention"] = {**placements["attention"], "placement": "post",
                                   "residual_carries": normalised[attn.out.name]}
    return {
        "reviewable": True,
        "mixer": mixer["kind"],
        "residual": "parallel" if parallel else "sequential",
        "norm_placement": placements["attention"]["placement"],
        "norm_kind": kinds[0] if len(kinds) == 1 else ("mixed" if kinds else None),
        "attention": heads_kind(heads.get("heads"), heads.get("kv_heads")),
        "query_heads": heads.get("heads"),
        "kv_heads": heads.get("kv_heads"),
        "sliding_window": mixer["window"],
        "qk_norm": bool(qk_norms) if is_attention else False,
        "position": position,
        "ffn": ffn_facts["kind"],
        "ffn_ratio": ffn_facts["hidden"] / reads,
        "moe": moe,
        "causal": causal["causal"],
        "cross_attention": bool(cross),
        "evidence": {
            "sublayers": [{"writer": g.out.name, "inputs": [c.name for c in g.ins], "mixes_tokens": g.mixes,
                           "cross": g.cross, "residual_kept_when_silenced": residuals[g.out.name],
                           "residual_carries_norm": normalised[g.out.name]}
                          for g in a.sublayers],
            "mixer": {"kind": mixer["kind"], "others_beside_it": others, "reach_of_position_0": mixer["reach"],
                      "heads_measured": bool(mixer["heads"].get("measured")),
                      "softmax": mixer["bias"].get("softmax"), "weights": mixer["bias"].get("weights"),
                      "no_value_projection": bool(mixer["heads"].get("no_value_projection")),
                      "values_from": mixer["heads"].get("values_from")},
            "heads": {k: v for k, v in heads.items() if k not in ("roles", "v_offsets")},
            "latent": {c.name: _features(c.out) for c in a.latents(attn)} if is_attention else {},
            "bottleneck": [c.name for c in a.bottleneck(attn)] if is_attention else [],
            "norm_placement": placements, "qk_norms": qk_norms if is_attention else [],
            "max_future_leak": causal["max_leak"], "position_aware_in_layer": aware, "attention_bias": bias,
            "rotary_fraction": rotary, "absolute_position": absolute, "ffn": ffn_facts, "unhooked_weights": bulk,
            "leak": _leak(a, causal, mixer["heads"] if mixer["heads"].get("roles") else None),
            "beside_values": [{"module": c.name, "type": type(c.module).__name__,
                               "reads": [p.name for p in attn.ins if a.depends.get((p.key, c.key))]} for c in beside],
            "output_sum": output_sum, "logit_cap": cap, "logit_scale": _scale_facts(scale, heads.get("head_dim"), a.width,
                                                                  lambda: a.scale_is_learned(attn, heads, scale)),
        },
    }


def _read_part(a: LayerAnalysis, selfs: list) -> dict:
    """What can be read of a layer whose attention or FFN is not found: the part that is (its norm placement, its
    kind, its residual), the norms' kind, the layer's output as a sum, and causality, measured on the layer whole.
    judge_structure says these after the line that names what could not be read."""
    parts = {}
    if selfs:
        parts["attention"] = selfs[0]
    if a.ffns:
        parts["ffn"] = max(a.ffns, key=lambda g: g.out.inp.shape[-1])
    placements = {which: a.norm_placement(g) for which, g in parts.items()}
    for p in placements.values():
        # a norm of the sum after the part found feeds the part not found (a pre-norm block's second norm): with
        # an input norm of its own, the part found is pre-norm
        if p["placement"] == "post" and p["input_norm"]:
            p["placement"] = "pre"
    names = {n for p in placements.values() for n in p["norms"]}
    kinds = sorted({norm_kind(c.module, c.inp.shape[-1], a.generator) for c in a.norm_calls if c.name in names}
                   | {FUNCTIONAL_KINDS[n] for n in names if n in FUNCTIONAL_KINDS})
    mixer = read_mixer(a, parts["attention"]) if "attention" in parts else None
    ffn = a.ffn(parts["ffn"]) if "ffn" in parts else None
    causal = a.causal()
    residuals = {g.out.name: a.residual_kept(g) for g in a.sublayers}
    return {
        "partial": sorted(parts),
        "mixer": mixer["kind"] if mixer else None,
        "norm_kind": kinds[0] if len(kinds) == 1 else ("mixed" if kinds else None),
        "ffn": ffn["kind"] if ffn else None,
        "ffn_ratio": ffn["hidden"] / a.width if ffn else None,
        "causal": causal["causal"],
        "evidence": {
            "sublayers": [{"writer": g.out.name, "inputs": [c.name for c in g.ins], "mixes_tokens": g.mixes,
                           "cross": g.cross, "residual_kept_when_silenced": residuals[g.out.name]}
                          for g in a.sublayers],
            "norm_placement": placements, "ffn": ffn, "max_future_leak": causal["max_leak"],
            "leak": _leak(a, causal, None),
            "output_sum": a.stream_sum("output", a.sublayers[-1]),
            "mixer": {"kind": mixer["kind"], "reach_of_position_0": mixer["reach"]} if mixer else None,
            "heads": {k: v for k, v in mixer["heads"].items() if k not in ("roles", "v_offsets")} if mixer else {},
        },
    }


def _leak(a: LayerAnalysis, causal: dict, heads: dict | None) -> dict | None:
    """Where a layer that reads later positions does so (dataflow.LayerAnalysis.locate_leak), or None if causal."""
    if causal["causal"]:
        return None
    try:
        return a.locate_leak(heads)
    except MemoryCapExceeded:
        raise
    except Exception as err:  # noqa: BLE001 - located or not, the leak itself is measured and judged
        return {"error": f"{type(err).__name__}: {err}"}


def _scale_facts(scale: float | None, head_dim: int | None, width: int | None = None, learned=None) -> dict | None:
    """The measured divisor of q.k, and which rule it is: 1/sqrt(head_dim), 1/head_dim (muP), none (T5), times
    sqrt(head_dim) (nGPT's, on unit queries and keys), 1/sqrt(d_model) (the model's width where the head's belongs),
    learned (a parameter of the block moves it: a temperature), other. ``learned()`` is asked only for a scale that
    follows no rule."""
    if scale is None or not head_dim:
        return None
    rules = {"1/sqrt(head_dim)": head_dim ** 0.5, "1/head_dim": float(head_dim), "none": 1.0,
             "sqrt(head_dim)": head_dim ** -0.5}
    if width and width != head_dim and abs(width ** 0.5 / head_dim - 1) > 1e-3:
        rules["1/sqrt(d_model)"] = width ** 0.5
    rule = next((r for r, v in rules.items() if abs(scale / v - 1) < 1e-3), "other")
    if rule == "other" and learned is not None and learned():
        rule = "learned"
    return {"divisor": round(scale, 6), "head_dim": head_dim, "rule": rule,
            **({"d_model": width} if width else {})}


def _ffn_and_moe(a: LayerAnalysis, ffn, routed) -> tuple[dict, dict | None]:
    """The FFN's facts; for routed experts, the active width per token: per_token x expert width + the width of
    the dense FFNs that run beside them on every token (shared experts)."""
    if not routed:
        return a.ffn(ffn), None
    experts = a.experts(ffn)
    shared = [a.ffn(g) for g in a.ffns if not (g.experts or g.hand)]
    kind, activation = experts["kind"], experts["activation"]
    if kind == "unknown" and shared:  # the experts' own calling convention not reproduced: the shared one's
        kind, activation = shared[0]["kind"], shared[0]["activation"]
    active = (experts["per_token"] or 0) * (experts["hidden"] or 0) + sum(f["hidden"] for f in shared)
    facts = {"kind": kind, "activation": activation, "hidden": active, "matrices": 3 if kind in GATED_KINDS else 2,
             "writer": experts["module"], "inputs": [], "experts": experts, "shared": shared}
    # shared experts by width: one dense FFN sized for two experts (ERNIE 4.5's moe_num_shared_experts 2) is two
    width = experts["hidden"] or 0
    count = round(sum(f["hidden"] for f in shared) / width) if width and shared else len(shared)
    moe = {"experts": experts["experts"], "per_token": experts["per_token"], "shared": count}
    if ffn.hand:  # a ModuleList of FFNs: named, with the router and the expert it was read through
        moe["written_by_hand"] = {k: experts[k] for k in ("container", "router", "read_through")}
    return facts, moe


GATED_KINDS = ("swiglu", "geglu", "reglu", "reglu2")


def layer_entry(structure: dict, indices: list[int]) -> dict:
    """One entry of structure.layers: a layer pattern and the (full-size) indices of the layers that have it."""
    if not structure.get("reviewable"):
        return {"indices": indices, **{k: None for k in LAYER_KEYS}, "reviewable": False,
                "reason": structure.get("reason")}
    return {"indices": indices, **{k: structure.get(k) for k in LAYER_KEYS},
            **({"kv_from": structure["kv_from"]} if structure.get("kv_from") is not None else {})}


def scale_to_full(structure: dict, layer_path: str, full_model, heads: int, d: int,
                  config_kv: int | None = None) -> dict:
    """Head counts and FFN ratio at the config's full size: the same modules, built on the meta device."""
    ev = structure["evidence"]
    attn = ev["sublayers"][[s["mixes_tokens"] for s in ev["sublayers"]].index(True)]
    ffn = ev["sublayers"][[s["mixes_tokens"] for s in ev["sublayers"]].index(False)]
    shared = ev.get("kv_shared") or {}
    source_path = f"{layer_path.rpartition('.')[0]}.{shared['from_layer']}" if shared else layer_path

    def get(name):  # a module borrowed by the layer whose keys and values this one shares is that layer's
        borrowed = shared and name.rpartition(".")[2] in shared.get("borrowed", ())
        return full_model.get_submodule(f"{source_path if borrowed else layer_path}.{name}")
    ffn_ratio, moe = _full_ffn(structure, get, d)
    if structure.get("mixer") != "attention":  # no heads to scale: the FFN's width only
        return {**structure, "ffn_ratio": ffn_ratio, "moe": moe,
                "evidence": {**ev, "tiny": {"ffn_ratio": structure["ffn_ratio"], "moe": structure["moe"]}}}
    o_in = in_width(get(attn["writer"]))
    in_total = sum(out_width(get(n)) for n in attn["inputs"])
    head_dim = o_in // heads
    kv = (in_total // head_dim - heads) // 2
    derived = "projection widths"
    if not (1 <= kv <= heads and heads % kv == 0):
        # the in-projections are not Q, K and V of head_dim each (multi-head latent attention projects to a shared
        # latent first): the full size keeps the tiny build's head layout, as the shrink does
        # latent attention, or a gate inside the query projection (Qwen3-Next): the full size keeps the tiny
        # build's layout, with the config's K/V heads for GQA (the shrink maps any GQA to 2 of 4)
        gqa = config_kv if config_kv and heads % config_kv == 0 and 1 < config_kv < heads else None
        kv = {"MQA": 1, "MHA": heads}.get(structure["attention"], gqa) or max(
            1, heads * (structure["kv_heads"] or 1) // (structure["query_heads"] or 1))
        derived = f"the tiny build's layout ({structure['attention']})" + (", the config's K/V heads" if gqa else "")
    full = {"query_heads": heads, "kv_heads": kv, "attention": heads_kind(heads, kv), "head_dim": head_dim,
            "ffn_ratio": ffn_ratio, "moe": moe, "hidden_size": d, "kv_heads_from": derived}
    # the tiny build keeps the head structure (shrink): MHA stays MHA, GQA GQA, MQA MQA
    full["agrees_with_tiny"] = full["attention"] == structure["attention"]
    return {**structure, **{k: full[k] for k in ("query_heads", "kv_heads", "attention", "ffn_ratio", "moe")},
            "evidence": {**ev, "full_size": full, "tiny": {k: structure[k] for k in
                                                           ("query_heads", "kv_heads", "ffn_ratio", "moe")}}}


def _full_ffn(structure: dict, get, d: int) -> tuple[float, dict | None]:
    """The FFN ratio (active width per token for routed experts) and the experts, from the full-size modules."""
    ffn = structure["evidence"]["ffn"]
    if not structure.get("moe"):
        # the width it expands from: the layer's, or a bottleneck's (MobileBERT's FFNs read 128 of its 512; its tiny
        # build has every width at 32)
        reads = in_width(get(ffn["inputs"][0])) if ffn.get("inputs") else d
        if reads != d:
            ffn.update(reads_width=reads, layer_width=d)
        return in_width(get(ffn["writer"])) / reads, None
    per_token = structure["moe"]["per_token"] or 0
    shared = sum(in_width(get(f["writer"])) for f in ffn["shared"])
    if structure["moe"].get("written_by_hand"):  # one expert's own layers, as many as the container holds
        container = get(structure["moe"]["written_by_hand"]["container"])
        return (per_token * in_width(get(ffn["writer"])) + shared) / d, {**structure["moe"], "experts": len(container)}
    weights = experts_weights(get(ffn["writer"]))
    w_out = next((w for w in weights if w.shape[1] == d and w.shape[-1] != d), weights[-1])
    return (per_token * w_out.shape[-1] + shared) / d, {**structure["moe"], "experts": weights[0].shape[0]}


def _stack_label(name: str, names) -> str:
    first = name.split(".")[0]
    return first if sum(n.split(".")[0] == first for n in names) == 1 else name


@one_thread()
def review_model(model, tiny_config, full_config=None, subject: str = "model", only_stack: str | None = None,
                 depth: int | None = None, warmup_steps: int = 0, seed: int = 0) -> Review:
    """Review a built (tiny, float64) transformers model; full_config scales counts back to the full size."""
    found = hf.stacks(model)
    if only_stack:
        found = {k: v for k, v in found.items() if k == only_stack}
    review = Review(subject=subject, mode="hf-config", role=None)
    full = hf.count_full(full_config) if full_config is not None else None
    head_class = hf.model_class(tiny_config, prefer_head=True)[1]
    structures = {}
    for name, layers in found.items():
        decoder_side = name.startswith("decoder")
        base = _base_prefix(full["model"], model) if full is not None else ""
        config_kv = next((getattr(full_config, k) for k in hf.KV_KEYS
                          if isinstance(getattr(full_config, k, None), int)), None) if full is not None else None
        scale = None if full is None else lambda s, i, name=name, side=decoder_side: scale_to_full(
            s, f"{base}{name}.{i}", full["model"], _heads_of(full_config, side), full_config.hidden_size, config_kv)
        try:
            structure = read_stack(model, layers, tiny_config, decoder_side, seed, scale, full_config)
        except Exception as err:  # transformers' own forward on a valid architecture: reported, never exit 3
            structure = {"reviewable": False, "reason": f"driving {type(model).__name__} with hooks failed: "
                                                          f"{type(err).__name__}: {err}"}
        structure["expected_causal"] = _expect_causal(structure, head_class)
        structure["measured_heads_vs_config"] = {"config": _heads_of(tiny_config, decoder_side),
                                                 "measured": structure.get("query_heads") if full is None else
                                                 structure["evidence"]["tiny"].get("query_heads")
                                                 if structure["reviewable"] else None}
        structures[_stack_label(name, found)] = structure
    if not structures:
        review.add("structure", "cannot", "no stack of repeated layers found in the model", None)
        return review
    layers = getattr(full_config or tiny_config, "num_hidden_layers", None)
    for label, structure in structures.items():
        prefix = f"{label}: " if len(structures) > 1 else ""
        judge_structure(review, structure, prefix=prefix, depth=depth or layers, warmup_steps=warmup_steps)
        judge_layers(review, structure, prefix=prefix, depth=depth or layers, warmup_steps=warmup_steps)
    review.facts["structure"] = next(iter(structures.values())) if len(structures) == 1 else structures
    if full is not None:
        review.facts["parameters"] = full["parameters"]
        review.facts["counted_as"] = full["class"]
    return review


def _fingerprint(model, layer, tiny_config, decoder_side: bool, seed: int) -> tuple:
    """What sets one layer apart from another, in one batched run: the shapes of its hooked calls in order (which
    modules it has: a convolution or an attention, a router), which positions a change at position 0 reaches (a
    sliding window), and whether the last token depends on the order of the ones before it (RoPE or NoPE). Only
    for grouping: each group's structure is then read in full from one of its layers."""
    driver = hf.ModelDriver(model, layer, tiny_config, seed=seed, decoder_side=decoder_side)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, driver.seq, driver.width, dtype=torch.float64, generator=generator).expand(3, -1, -1).clone()
    x[1, 0] += torch.randn(driver.width, dtype=torch.float64, generator=generator)
    x[2, :-1] = x[2, :-1].roll(1, dims=0)  # the prefix rotated by one place, the last token kept
    calls, y = Tracer(driver).run(x)
    return _fingerprint_of(calls, y, driver.seq)


def _fingerprint_of(calls, y, seq: int) -> tuple:
    shapes = tuple((type(c.module).__name__, tuple(c.inp.shape[2:]), tuple(c.out.shape[2:])) for c in calls)
    scale = y[0].abs().max().clamp_min(1e-30)
    reach = tuple(t for t in range(seq) if ((y[1, t] - y[0, t]).abs().max() / scale).item() > TOL)
    aware = ((y[2, -1] - y[0, -1]).abs().max() / scale).item() > TOL
    # a call whose input is mostly exact zeros (an activation kept sparse by a top-k: Gemma 3n's first layers):
    # layers alike in shape and reach can differ in it
    sparse = tuple(bool((c.inp == 0).double().mean() > 0.8) for c in calls if torch.is_tensor(c.inp)
                   and c.inp.is_floating_point())
    return shapes, reach, aware, sparse


def _fingerprints(model, layers, tiny_config, decoder_side: bool, seed: int) -> list[tuple]:
    """_fingerprint of every layer from one run of the whole model (hf.StackDriver: each layer fed the same x);
    layer by layer, one run up to each, if that run fails or misses a layer."""
    try:
        driver = hf.StackDriver(model, layers, tiny_config, seed=seed, decoder_side=decoder_side)
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(1, driver.seq, driver.width, dtype=torch.float64, generator=generator).expand(3, -1, -1)
        x = x.clone()
        x[1, 0] += torch.randn(driver.width, dtype=torch.float64, generator=generator)
        x[2, :-1] = x[2, :-1].roll(1, dims=0)
        calls, _ = Tracer(driver).run(x)
        if len(driver.outputs) == len(layers):
            by_layer = {i: [] for i in range(len(layers))}
            for c in calls:
                by_layer[int(c.name.split(".")[0])].append(c)
            return [_fingerprint_of(by_layer[i], driver.outputs[i], driver.seq) for i in range(len(layers))]
    except MemoryCapExceeded:
        raise
    except Exception:  # noqa: BLE001 - a model whose layers cannot all be fed at once: one run per layer
        pass
    return [_fingerprint(model, layer, tiny_config, decoder_side, seed) for layer in layers]


def _state_space(s: dict, config) -> dict:
    """A mixer the data flow reads as linear attention or a recurrence is a state-space scan ('ssm') in a config
    that declares a state-space state size: the data flow finds the layers, the config names their kind (an SSM and
    a gated linear attention or an RNN are alike in the data flow)."""
    key = next((k for k in hf.SSM_STATE_KEYS if hf._int_attr(config, k)), None)
    if key is None:
        return s
    scan = ("linear-attention", "recurrent")
    mixer = s["evidence"]["mixer"]
    others = [{**o, "kind": "ssm", "read_as": o["kind"]} if o["kind"] in scan else o
              for o in mixer.get("others_beside_it", [])]
    if s["mixer"] not in scan:
        return {**s, "evidence": {**s["evidence"], "mixer": {**mixer, "others_beside_it": others}}}
    return {**s, "mixer": "ssm", "evidence": {**s["evidence"], "mixer": {
        **mixer, "others_beside_it": others, "read_as": s["mixer"], "ssm_state_key": key}}}


def _merge_alike(patterns: list) -> list:
    """Groups whose fingerprints differ but whose reviewed layer keys are the same are one pattern (a decaying
    recurrence can reach the last position in one layer and fall below round-off in another)."""
    merged: dict = {}
    for indices, s in patterns:
        key = json.dumps(layer_entry(s, []), sort_keys=True, default=str)
        if key in merged:
            merged[key] = (sorted(merged[key][0] + indices), merged[key][1])
        else:
            merged[key] = (indices, s)
    return sorted(merged.values(), key=lambda p: p[0][0])


def read_stack(model, layers, tiny_config, decoder_side: bool, seed: int, scale=None, full_config=None) -> dict:
    """Every layer of the stack, grouped by what sets them apart (_fingerprint); each group's structure read from
    its first layer past layer 0 (the cheapest to drive; layer 0 can be special: ModernBERT's has no attention norm
    of its own, and gets a group of its own), scaled to full size.
    The stack's top-level keys are those of its most common attention pattern; 'layers' lists every pattern."""
    first = hf.ModelDriver(model, layers[0], tiny_config, seed=seed, decoder_side=decoder_side)
    absolute = hf.absolute_position(first)
    groups: dict = {}
    for i, fingerprint in enumerate(_fingerprints(model, layers, tiny_config, decoder_side, seed)):
        groups.setdefault(fingerprint, []).append(i)
    patterns = []
    for indices in sorted(groups.values()):
        rep = next((i for i in indices if i > 0), indices[0])  # the first layer can be special (ModernBERT's)
        driver = hf.ModelDriver(model, layers[rep], tiny_config, seed=seed, decoder_side=decoder_side)
        try:
            s = read_layer(LayerAnalysis(driver, seed), absolute)
        except MemoryCapExceeded:
            raise
        except Exception as err:  # noqa: BLE001 - one pattern that cannot be driven: said, the rest reviewed
            s = {"reviewable": False, "reason": f"driving layer {rep} with hooks failed: {type(err).__name__}: {err}"}
        source = hf.kv_source(layers, rep, tiny_config) if not s.get("reviewable") else None
        if source is not None:
            s = _read_kv_shared(model, layers, rep, source, tiny_config, decoder_side, seed, absolute, s)
        if s.get("reviewable") and scale is not None:
            s = scale(s, rep)
        if s.get("reviewable"):
            s = _state_space(s, tiny_config)
        if s.get("reviewable") and s["sliding_window"] is not None and full_config is not None:
            full_window = next((getattr(full_config, k) for k in hf.WINDOW_KEYS
                                if isinstance(getattr(full_config, k, None), int)), None)
            s["evidence"]["sliding_window"] = {"tiny_reach": s["sliding_window"], "tiny_config": hf.WINDOW,
                                               "full_config": full_window}
            s["sliding_window"] = full_window or s["sliding_window"]
        patterns.append((indices, s))
    patterns = _merge_alike(patterns)
    attention = [(idx, s) for idx, s in patterns if s.get("reviewable") and s["mixer"] == "attention"]
    if not attention:
        reasons = "; ".join(f"layers {layer_ranges(idx)}: " + (s["mixer"] if s.get("reviewable") else s["reason"])
                            for idx, s in patterns)
        return {"reviewable": False, "reason": f"no layer with attention and a feed-forward network ({reasons})",
                "layers": [layer_entry(s, idx) for idx, s in patterns]}
    # the main pattern is one read from its own layer: a layer read with another's keys and values only if all are
    main_indices, main = max(attention, key=lambda p: ("kv_from" not in p[1], len(p[0]), p[0][-1]))
    out = dict(main)
    out["layers"] = [layer_entry(s, idx) for idx, s in patterns]
    out["evidence"] = {**main["evidence"], "representative_layer": main_indices[-1],
                       "layer_patterns": [{"indices": idx, "structure": s} for idx, s in patterns if s is not main]}
    return out


def _read_kv_shared(model, layers, rep: int, source: int, tiny_config, decoder_side, seed, absolute,
                    unread: dict) -> dict:
    """A layer whose keys and values are an earlier layer's (a shared KV cache) mixes none of its own input, so its
    attention cannot be read from it (unread: that reading). Read instead with the source layer's K/V modules borrowed
    to it and applied to its own input: the heads, position, window, QK-norm and FFN are this layer's; the keys and
    values are made by the source layer's weights, from this layer's input rather than the source layer's."""
    try:
        with hf.kv_computed_here(layers[rep], layers[source]) as borrowed:
            driver = hf.ModelDriver(model, layers[rep], tiny_config, seed=seed, decoder_side=decoder_side)
            s = read_layer(LayerAnalysis(driver, seed), absolute)
    except MemoryCapExceeded:
        raise
    except Exception as err:  # noqa: BLE001 - the shared reading failed too: the first reason, and this one
        return {**unread, "reason": f"{unread.get('reason')}; read with layer {source}'s keys and values computed "
                                    f"here, driving it failed: {type(err).__name__}: {err}"}
    if not s.get("reviewable"):
        return unread
    keys = {k: v for k, v in vars(tiny_config).items() if "kv_shared" in k and isinstance(v, int)
            and not isinstance(v, bool)}
    return {**s, "kv_from": source,
            "evidence": {**s["evidence"], "kv_shared": {
                "from_layer": source, "borrowed": borrowed, "config": keys, "unread_reason": unread.get("reason"),
                "read_as": f"keys and values of layer {source} (a shared KV cache): read with layer {source}'s "
                           f"{', '.join(borrowed)} applied to this layer's own input"}}}


def _heads_of(config, decoder_side: bool) -> int | None:
    """Query heads the config declares for this stack (BART keeps encoder and decoder heads apart)."""
    key = "decoder_attention_heads" if decoder_side else "encoder_attention_heads"
    return getattr(config, key, None) or getattr(config, "num_attention_heads", None)


def _base_prefix(full_model, tiny_model) -> str:
    """Where the bare model sits in its head class: under base_model_prefix ('model.', 'transformer.'), else wherever
    a module of the bare model's class is (Llama4ForCausalLM names its prefix 'language_model' but holds the text
    model as 'model'); T5 has none."""
    if type(full_model) is type(tiny_model):
        return ""
    prefix = getattr(full_model, "base_model_prefix", "")
    if prefix and isinstance(getattr(full_model, prefix, None), type(tiny_model)):
        return f"{prefix}."
    found = next((name for name, m in full_model.named_modules() if name and type(m) is type(tiny_model)), None)
    return f"{found}." if found else (f"{prefix}." if prefix and hasattr(full_model, prefix) else "")


def _expect_causal(structure: dict, head_class: str) -> bool | None:
    if not structure.get("reviewable"):
        return None
    if structure["cross_attention"]:
        return True  # the decoder of an encoder-decoder
    return {"AutoModelForCausalLM": True, "AutoModelForMaskedLM": False, "AutoModelForSeq2SeqLM": False}.get(head_class)


def review_architecture(source, attention: str = "eager", depth: int | None = None, warmup_steps: int = 0,
                        seed: int = 0, only_layer_class=None, stack_role: str | None = None,
                        subject: str | None = None, max_memory_gb: float | None = None) -> Review:
    """`--hf-config`: a config.json, a shipped name or a model_type, reviewed at the tiny size, counted at full size.

    Bad arguments (an unknown model_type, an unreadable file, an unknown backend) raise ConfigError; a valid
    architecture that cannot be shrunk, built or driven gets a review that says so (verdict 'cannot review').
    """
    if max_memory_gb is not None and not max_memory_gb > 0:
        raise ConfigError(f"--max-memory-gb must be > 0, got {max_memory_gb}")
    import contextlib

    with one_thread(), memory_cap(int(max_memory_gb * 2**30) if max_memory_gb else None) as cap, \
            contextlib.ExitStack() as scope:
        try:
            return _review_architecture(source, attention, depth, warmup_steps, seed, only_layer_class,
                                        stack_role, subject, cap, scope)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - transformers on a valid config: exit 4 with the reason
            cannot = Review(subject=subject or str(source), mode="hf-config", role=None)
            cannot.add("structure", "cannot", f"cannot review: {type(err).__name__}: {str(err)[:300]}", None)
            return cannot


def _review_architecture(source, attention, depth, warmup_steps, seed, only_layer_class, stack_role,
                         subject, cap, scope=None) -> Review:
    if attention not in hf.ATTENTION_BACKENDS:
        raise ConfigError(f"--attention {attention!r} is not allowed; choose one of {list(hf.ATTENTION_BACKENDS)}")
    full_config = hf.load_config(source)
    subject = subject or str(source)
    cannot = Review(subject=subject, mode="hf-config", role=None)
    fallback = None
    try:
        try:
            tiny_config = hf.shrink(full_config, attention)
            model = hf.build_tiny(tiny_config, seed, cap)
        except ConfigError as err:
            if attention == "eager":
                raise
            fallback = f"{attention} is not available for this architecture ({str(err).split(': ', 2)[-1][:80]}...)"
            tiny_config = hf.shrink(full_config, "eager")
            model = hf.build_tiny(tiny_config, seed, cap)
    except Exception as err:  # noqa: BLE001 - whatever transformers raises for this architecture is the reason
        cannot.add("structure", "cannot", f"cannot review: the tiny build failed: {err}", None)
        return cannot
    if scope is not None:  # a chunked scan's chunks at the probes' size for the rest of the review (exact)
        scope.enter_context(hf.short_chunks(model))
    stack = None
    if only_layer_class is not None:
        candidates = [n for n, layers in hf.stacks(model).items() if isinstance(layers[0], only_layer_class)]
        side = "encoder" if stack_role == "encoder" else "decoder" if stack_role else None
        stack = next((n for n in candidates if side and n.startswith(side)), candidates[0] if candidates else None)
        if stack is None:
            cannot.add("structure", "cannot", f"cannot review: {only_layer_class.__name__} is not a layer of a stack "
                       f"in {type(model).__name__}: only a stack's layer can be driven inside its model", None)
            return cannot
    review = review_model(model, tiny_config, full_config, subject=subject, only_stack=stack, depth=depth,
                          warmup_steps=warmup_steps, seed=seed)
    review.facts["config"] = hf.config_summary(full_config)
    review.facts["config_source"] = hf.describe_source(source, full_config)
    full_depth = next((hf._int_attr(full_config, k) for k in hf.LAYER_KEYS if hf._int_attr(full_config, k)), None)
    tiny_depth = next((hf._int_attr(tiny_config, k) for k in hf.LAYER_KEYS if hf._int_attr(tiny_config, k)), None)
    review.facts["depth"] = {"config": full_depth, "probed": tiny_depth}
    if full_depth and tiny_depth and tiny_depth < full_depth:
        review.add("depth", "info", f"the config has {full_depth} layers; the tiny model keeps the first {tiny_depth} "
                   f"(at most {hf.MAX_LAYERS}): layers {tiny_depth}-{full_depth - 1} are not probed, and the layer "
                   "patterns list the probed layers only", review.facts["depth"])
    review.facts["attention_backend"] = "eager" if fallback else attention
    if fallback:
        review.add("attention backend", "info", f"{fallback}: reviewed with eager attention", "eager")
    _cross_check_counts(review, source, full_config, tiny_config)
    return review


def _cross_check_counts(review: Review, source, full_config, tiny_config) -> None:
    if "parameters" not in review.facts:
        return
    total = review.facts["parameters"]
    meta, real = hf.count_tiny_both_ways(tiny_config)
    checks = {"tiny_meta": meta, "tiny_built": real}
    model_type = getattr(full_config, "model_type", None)
    if model_type in hf_config.FAMILIES:
        raw = (hf_config.load_config_dict(source) if not _is_model_type(source)
               else {**full_config.to_dict(), "model_type": model_type})
        checks["closed_form"] = hf_config.total_parameters(hf_config.architecture(raw, name=str(source)))
    review.facts["count_checks"] = checks
    agree = meta == real and checks.get("closed_form", total) == total
    note = f"closed form {checks['closed_form']:,}; " if "closed_form" in checks else "no closed form here; "
    review.add("parameters", "pass" if agree else "flag",
               f"{total:,} parameters at full size ({review.facts['counted_as']}, meta device); {note}"
               f"tiny build {real:,} = meta {meta:,}", total)


def _is_model_type(source) -> bool:
    try:
        return str(source) in hf.model_types() and not str(source).endswith(".json")
    except ConfigError:
        return False


def hf_layer_class(obj) -> bool:
    """A transformers layer class (transformers.models.<type>.modeling_<type>:SomeLayer)."""
    module = getattr(obj, "__module__", "") or ""
    return isinstance(obj, type) and issubclass(obj, torch.nn.Module) and module.startswith("transformers.models.")


def model_type_of(layer_class) -> str:
    """The model_type whose modeling file defines the class: the config class that file's models use."""
    module = sys.modules[layer_class.__module__]
    for value in vars(module).values():
        config_class = getattr(value, "config_class", None)
        if isinstance(value, type) and getattr(config_class, "model_type", None):
            return config_class.model_type
    raise ConfigError(f"{layer_class.__module__} defines no model with a config class: cannot build "
                      f"{layer_class.__name__} from its config")
