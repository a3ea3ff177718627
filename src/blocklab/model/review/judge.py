"""The rules of document 004 applied to what the probes measured on a user's block (`--module`)."""
from __future__ import annotations

import torch
from torch import nn

from ...config import ConfigError
from .architecture import read_layer
from .build import DEFAULT_WIDTH, Builder, resolve
from .dataflow import LayerAnalysis
from .probe import MEMORY_SEQ, SCALE, SEQ, BlockDriver, Probe, width_check
from .report import Review
from .rules import MAX_POST_NORM_DEPTH, MIN_FFN_RATIO
from .structure import attention_kind, attention_shape, ffn_structure, infer_width

ROLES = ("encoder", "decoder", "cross")

# --- live module review --------------------------------------------------------------------------


def review_module(target, role: str, d_model: int | None = None, depth: int | None = None, warmup_steps: int = 0,
                  kwargs: dict | None = None, seed: int = 0, subject: str | None = None) -> Review:
    """Build, probe and judge one block. ``target``: 'pkg.mod:Name', a class, a factory or a module instance."""
    if role not in ROLES:
        raise ConfigError(f"--role {role!r} is not allowed; choose one of {list(ROLES)}")
    obj = resolve(target) if isinstance(target, str) else target
    subject = subject or (target if isinstance(target, str) else getattr(obj, "__qualname__", type(obj).__name__))
    builder = Builder(obj, kwargs)
    requested = d_model or DEFAULT_WIDTH
    torch.manual_seed(seed)
    module = builder.build(requested)
    width = infer_width(module) or requested
    review = Review(subject=subject, mode="module", role=role)
    review.facts["built_as"] = builder.how
    review.facts["d_model"] = {"requested": requested if builder.follows_width else None, "probed": width}
    widths = width_check(builder, requested, module)
    probe = Probe(module, role, width, seed)
    _judge_norms(review, probe, depth, warmup_steps)
    _judge_causal(review, probe)
    attention_roles = probe.attention_roles()
    ffn = ffn_structure(probe.linears(), width)
    _judge_residuals(review, probe, ffn, attention_roles)
    if role == "cross":
        _judge_cross(review, probe, attention_roles)
    _judge_attention(review, probe, attention_roles)
    _judge_ffn(review, ffn)
    _judge_position(review, probe)
    _judge_widths(review, widths, requested if builder.follows_width else None, width)
    _judge_recognised(review, probe, ffn, builder.declared_heads)
    return review


def _judge_recognised(review: Review, probe: Probe, ffn, declared_heads) -> None:
    """The structure from the data flow (JSON 'structure'); nothing to review without attention or an FFN."""
    structure = read_layer(LayerAnalysis(BlockDriver(probe)))
    review.facts["structure"] = structure
    if structure["reviewable"]:
        measured = structure["query_heads"]
        if declared_heads and measured and measured != declared_heads:
            review.add("head count", "flag", f"the attention computes {measured} heads of "
                       f"{structure['evidence']['heads']['head_dim']}, the block was built with {declared_heads}",
                       measured)
        return
    attention_found = bool(probe.attentions) or structure["attention_found"]
    if any(isinstance(m, nn.MultiheadAttention) for m in probe.attentions.values()):
        structure["reason"] += ("; nn.MultiheadAttention projects Q, K, V and O inside one function, with no layer "
                                "to hook: the facts above come from the module probes")
    if not attention_found or not (ffn or structure["ffn_found"]):
        missing = " and ".join(n for n, ok in (("attention", attention_found), ("feed-forward network", ffn))
                               if not ok)
        review.add("structure", "cannot", f"cannot review: no {missing} recognised, by module type or in the "
                   f"data flow ({structure['reason'].split('(', 1)[-1]}", None)


def _judge_norms(review: Review, probe: Probe, depth, warmup_steps) -> None:
    position = probe.norm_position()
    kinds = probe.norm_kinds()
    review.facts["norm_position"], review.facts["norm_modules"] = position, kinds
    where = position["position"]
    detail = (f"output - input is {position['residual_fraction_at_1000x']:.1e} of the input at {SCALE:g}x scale"
              if where == "pre" else f"output RMS is {position['output_scale_ratio_at_1000x']:.1e} of the input's at "
              f"{SCALE:g}x scale (rows renormalized)")
    if where == "pre":
        review.add("norm position", "pass", f"pre-norm ({detail})", where)
    elif where == "post":
        review.add("norm position", "info", f"post-norm ({detail}); 2026 default: pre-norm", where)
    else:
        review.add("norm position", "flag", "no normalization detected: the output neither keeps the input's scale "
                   "plus a bounded update nor renormalizes it", where)
    _judge_depth(review, where, depth, warmup_steps)
    found = sorted(set(kinds.values()))
    if not found:
        review.add("norm kind", "info", "no norm module found to probe", None)
    elif found == ["rmsnorm"]:
        review.add("norm kind", "pass", f"RMSNorm ({len(kinds)} modules: shifting every feature changes the output, "
                   "scaling does not)", "rmsnorm")
    elif found == ["layernorm"]:
        review.add("norm kind", "info", f"LayerNorm ({len(kinds)} modules: a constant added to every feature does "
                   "not change the output); 2026 default: RMSNorm", "layernorm")
    else:
        review.add("norm kind", "info", f"mixed or unrecognised norms {kinds}; 2026 default: RMSNorm", found)


def _judge_depth(review: Review, where: str, depth, warmup_steps) -> None:
    if where != "post":
        return
    if depth is None:
        review.add("post-norm depth", "info", f"depth not given (--depth); post-norm deeper than "
                   f"{MAX_POST_NORM_DEPTH} blocks needs warm-up", None)
    elif depth > MAX_POST_NORM_DEPTH and not warmup_steps:
        review.add("post-norm depth", "reject", f"post-norm stack of {depth} blocks without warm-up: deeper than "
                   f"{MAX_POST_NORM_DEPTH} it needs a warm-up schedule, or switch to pre-norm", depth)
    elif depth > MAX_POST_NORM_DEPTH:
        review.add("post-norm depth", "info", f"post-norm stack of {depth} blocks with {warmup_steps} warm-up steps",
                   depth)
    else:
        review.add("post-norm depth", "pass", f"post-norm stack of {depth} blocks (<= {MAX_POST_NORM_DEPTH})", depth)


def _judge_causal(review: Review, probe: Probe) -> None:
    plain = probe.causal()
    review.facts["causal"] = {"without_caller_mask": plain}
    if probe.role == "encoder":
        if plain["leaks"]:
            review.add("masking", "pass", "bidirectional: every position sees every other (no mask)", "none")
        else:
            review.add("masking", "warn", "the block hides later tokens from earlier ones; an encoder should be "
                       "bidirectional", "causal")
        return
    if not plain["leaks"]:
        review.add("causal mask", "pass", f"no leak: perturbing future tokens leaves earlier outputs unchanged "
                   f"(max change {plain['max_leak']:.1e})", "built-in")
        return
    if probe.call.mask_kwargs(SEQ) is not None:
        probe.use_caller_mask()
        masked = probe.causal()
        review.facts["causal"]["with_caller_mask"] = masked
        if not masked["leaks"]:
            names = ", ".join(probe.call.mask_kwargs(SEQ))
            review.add("causal mask", "warn", f"leaks unless the caller passes a causal mask ({names}); masked, no "
                       "leak", "caller")
            return
    review.add("causal mask", "reject", f"future tokens leak into earlier positions (relative change "
               f"{plain['max_leak']:.1e}): a decoder block needs a causal mask", "none")


def _judge_residuals(review: Review, probe: Probe, ffn, attention_roles) -> None:
    residuals = probe.residuals(ffn)
    review.facts["residual_when_silenced"] = residuals
    for name, kept in residuals.items():
        label = "FFN" if name == "ffn" else f"{attention_roles.get(name, 'self')}-attention '{name}'"
        if kept:
            review.add("residual", "pass", f"around {label}: the input still reaches the output with it silenced", name)
        else:
            review.add("residual", "flag", f"none around {label}: silenced, the output no longer depends on the "
                       "input (deep stacks then lose their gradient path)", name)
    if not residuals:
        review.add("residual", "info", "no attention or FFN sub-module recognised; residuals not probed", None)


def _judge_cross(review: Review, probe: Probe, attention_roles) -> None:
    facts = probe.cross()
    facts["cross_attention_modules"] = [n for n, r in attention_roles.items() if r == "cross"]
    review.facts["cross_attention"] = facts
    if facts["memory_changes_output"] and facts["keeps_target_shape"]:
        where = ", ".join(facts["cross_attention_modules"]) or "a sub-module"
        review.add("cross-attention", "pass", f"queries from the decoder, keys/values from the encoder output "
                   f"({where}): memory of length {MEMORY_SEQ} -> output of length {SEQ}, and it changes with the "
                   "memory",
                   True)
    else:
        review.add("cross-attention", "flag", "the output ignores the encoder output or does not keep the target's "
                   f"shape ({facts})", False)


def _judge_attention(review: Review, probe: Probe, attention_roles) -> None:
    shapes = {name: attention_shape(attn) for name, attn in probe.attentions.items()}
    review.facts["attention"] = {n: {**s, "role": attention_roles.get(n), "kind": attention_kind(s)}
                                 for n, s in shapes.items()}
    if not shapes:
        review.add("attention", "info", "no attention sub-module recognised", None)
    for name, shape in shapes.items():
        kind = attention_kind(shape)
        heads = (f"{shape['heads']}/{shape['kv_heads']}" if shape["heads"]
                 else f"q {shape['q_width']} / kv {shape['kv_width']}")
        severity = "info" if kind == "MHA" else "pass"
        note = "; 2026 default: GQA" if kind == "MHA" else ""
        review.add("attention", severity, f"{kind} {heads} (query/KV heads) in '{name}'{note}", kind)
        bias = "bias on Q/K/V" + (" and O" if shape["o_bias"] else "") if shape["qkv_bias"] else "no Q/K/V bias"
        if shape.get("per_head_norms"):
            bias += f"; per-head norms {shape['per_head_norms']}"
        review.add("attention bias", "info", f"{bias} in '{name}'", shape["qkv_bias"])


def _judge_ffn(review: Review, ffn) -> None:
    review.facts["ffn"] = ffn
    if ffn is None:
        review.add("ffn", "info", "no feed-forward network recognised", None)
        return
    kind = {"swiglu": "SwiGLU", "classic": "classic"}.get(ffn["kind"], ffn["kind"])
    shape = f"{kind} ({ffn['matrices']} matrices, activation {ffn['activation']}), hidden {ffn['hidden']}"
    review.add("ffn kind", "pass" if ffn["kind"] == "swiglu" else "info",
               shape + ("" if ffn["kind"] == "swiglu" else "; 2026 default: SwiGLU"), ffn["kind"])
    _judge_ratio(review, ffn["ratio"])


def _judge_ratio(review: Review, ratio: float) -> None:
    if ratio < MIN_FFN_RATIO:
        review.add("ffn ratio", "flag", f"expansion {ratio:.2f}x is below {MIN_FFN_RATIO:g}x", ratio)
    else:
        review.add("ffn ratio", "pass", f"expansion {ratio:.2f}x", ratio)


def _judge_position(review: Review, probe: Probe) -> None:
    facts = probe.position_signal(causal=probe.role != "encoder")
    review.facts["position"] = facts
    if facts["position_aware"]:
        review.add("position", "pass", f"the block itself uses token positions ({facts['test']} broken): RoPE or "
                   "relative position", "in-block")
    else:
        review.add("position", "info", f"no positional signal inside the block ({facts['test']} holds): positions "
                   "must come from the embedding; 2026 default: RoPE", "none")


def _judge_widths(review: Review, widths: dict, requested, built) -> None:
    review.facts["widths"] = widths
    if requested is not None and built != requested:
        review.add("widths", "warn", f"asked for d_model={requested}, the block was built at {built}", built)
    if not widths["tested"]:
        review.add("widths", "info", "the factory takes no width; hard-coded widths not tested", None)
    elif widths.get("error"):
        review.add("widths", "warn", f"cannot be built at d_model={widths['second_width']}: {widths['error']}", None)
    elif widths["fixed"]:
        shown = ", ".join(widths["fixed"][:4]) + (" ..." if len(widths["fixed"]) > 4 else "")
        review.add("widths", "warn", f"{len(widths['fixed'])} of {widths['parameters']} parameters keep their shape "
                   f"when d_model changes to {widths['second_width']} (hard-coded widths): {shown}", widths["fixed"])
    else:
        review.add("widths", "pass", f"every parameter follows d_model ({requested} -> {widths['second_width']})", None)

