"""A user's own block (`--module`): built, called, its structure read from its data flow (the same read_layer as a
Hugging Face layer's) and judged by the same rules. What only a user's block needs is measured on the block as a
whole: whether the causal mask is left to the caller, whether the memory matters (cross role), whether the
parameters follow d_model, and whether the measured heads are the heads the block was built with."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model_config import ConfigError
from .architecture import layer_entry, read_layer
from .build import DEFAULT_WIDTH, Builder, resolve
from .dataflow import LayerAnalysis, MemoryCapExceeded, memory_cap, one_thread
from .probe import MEMORY_SEQ, SEQ, BlockDriver, Probe, width_check
from .report import Review
from .rules import judge_logit_scale, judge_structure
from .structure import infer_width, norm_kind

ROLES = ("encoder", "decoder", "cross")


def review_module(target, role: str, d_model: int | None = None, depth: int | None = None, warmup_steps: int = 0,
                  kwargs: dict | None = None, seed: int = 0, subject: str | None = None,
                  max_memory_gb: float | None = None) -> Review:
    """Build, probe and judge one block. ``target``: 'pkg.mod:Name', 'file.py:Name', a class, a factory or a module
    instance (a name is imported: its code runs). Batched probes past ``max_memory_gb`` end in 'cannot review'."""
    if max_memory_gb is not None and not max_memory_gb > 0:
        raise ConfigError(f"--max-memory-gb must be > 0, got {max_memory_gb}")
    with one_thread(), memory_cap(int(max_memory_gb * 2**30) if max_memory_gb else None):
        return _review_module(target, role, d_model, depth, warmup_steps, kwargs, seed, subject)


def _review_module(target, role, d_model, depth, warmup_steps, kwargs, seed, subject) -> Review:
    if role not in ROLES:
        raise ConfigError(f"--role {role!r} is not allowed; choose one of {list(ROLES)}")
    obj = resolve(target) if isinstance(target, str) else target
    subject = subject or (target if isinstance(target, str) else getattr(obj, "__qualname__", type(obj).__name__))
    builder = Builder(obj, kwargs)
    requested = d_model or DEFAULT_WIDTH
    torch.manual_seed(seed)
    module = builder.build(requested)
    inferred = infer_width(module)
    width = requested if builder.follows_width or not inferred else inferred
    review = Review(subject=subject, mode="module", role=role)
    review.facts["built_as"] = builder.how
    if builder.config_fields:
        review.facts["config_fields_set"] = builder.config_fields
    review.facts["d_model"] = {"requested": requested if builder.follows_width else None, "probed": width}
    widths = width_check(builder, requested, module)
    try:
        probe = Probe(module, role, width, seed)
    except ConfigError:
        if not inferred or inferred == width:
            raise
        width = inferred  # a block that ignores the width it was given: probed at the width its weights have
        review.facts["d_model"]["probed"] = width
        probe = Probe(module, role, width, seed)
    if probe.traced_mha:
        review.facts["traced_multihead_attention"] = probe.traced_mha
    if probe.refilled:
        review.facts["zero_at_init"] = probe.refilled
        # said in the text: the gates (fewer numbers than the width: a scalar, one per head), not the zero biases
        params = dict(probe.module.named_parameters())
        gates = [n for n in probe.refilled if params[n].numel() < width]
        if gates:
            review.add("zero at init", "info", f"{', '.join(gates[:4])}{' ...' if len(gates) > 4 else ''}: zero at "
                       "init (a gate such as ReZero's alpha silences what it multiplies; a value such as an "
                       "attention sink's logit only starts at zero): probed nonzero, so the structure read is the "
                       "trained block's (facts.zero_at_init lists every zero parameter)", gates)
    review.facts["layout"] = "(time, batch, d_model)" if probe.call.seq_first else "(batch, time, d_model)"
    if probe.call.seq_first:
        review.add("layout", "info", "the block reads (time, batch, d_model), torch's default layout (batch_first="
                   "False): a change of one batch element moved the others; reviewed with x transposed", "seq_first")
    _caller_mask(review, probe)
    _judge_in_place(review, probe)
    try:
        structure = read_layer(LayerAnalysis(BlockDriver(probe), seed))
    except MemoryCapExceeded as err:
        structure = {"reviewable": False, "reason": str(err)}
    except Exception as err:  # noqa: BLE001 - the user's forward under edited inputs: say so, never a traceback
        structure = {"reviewable": False, "reason": f"driving the block with hooks failed: {type(err).__name__}: "
                                                    f"{err}"}
    if structure.get("reviewable") and structure["mixer"] not in ("attention", "query-axis-softmax"):
        # a block is reviewed for its attention: a block whose token mixing is no softmax attention is not passed,
        # but the rest of it (norms, residuals, causality, FFN) is read and judged all the same; a softmax over the
        # query axis is an attention with a defect, flagged by the rules
        mixer = structure["mixer"]
        structure = {**structure, "reviewable": False, "rest_read": True,
                     "reason": f"no softmax attention recognised in the data flow: its token mixing reads as {mixer} "
                               "(evidence.mixer); the rest of the block is reviewed below"}
    structure["expected_causal"] = role != "encoder"
    structure["layers"] = [layer_entry(structure, [0])]  # one block: one layer, one pattern
    review.facts["structure"] = structure
    judge_structure(review, structure, depth=depth, warmup_steps=warmup_steps)
    measured = review.facts["causal"].get("with_caller_mask") or review.facts["causal"]["without_caller_mask"]
    if role != "encoder" and measured["leaks"] and not structure.get("reviewable") and "causal" not in structure:
        # the structure could not be read, but the leak was measured on the whole block: it rejects all the same
        review.add("causal mask", "reject", f"future tokens leak into earlier positions (relative change "
                   f"{measured['max_leak']:.1e}, measured on the whole block) in a decoder", False)
    if structure.get("reviewable"):
        _judge_heads(review, structure, builder.declared_heads)
        judge_logit_scale(review, structure)
    if role == "cross":
        _judge_cross(review, probe, structure)
    if widths.get("fixed") and structure.get("query_heads"):
        # a parameter sized by the heads alone (FoX's forget-gate bias, one per head) keeps its shape by design
        heads = {structure.get("query_heads"), structure.get("kv_heads")}
        params = dict(module.named_parameters())
        by_heads = [n for n in widths["fixed"] if n in params and {d for d in params[n].shape if d > 1} <= heads]
        if by_heads:
            widths = {**widths, "fixed": [n for n in widths["fixed"] if n not in by_heads],
                      "not_width_sized": widths.get("not_width_sized", []) + by_heads}
    _judge_widths(review, widths, requested if builder.follows_width else None, width)
    return review


MASK_TEXT = {"additive": "0 / -inf added to the scores", "keep": "boolean, True where a position may be read",
             "hide": "boolean, True where a position is hidden"}


def _caller_mask(review: Review, probe: Probe) -> None:
    """A decoder block that leaks unless the caller passes a causal mask is reviewed with the mask (a warning)."""
    plain = probe.causal()
    review.facts["causal"] = {"without_caller_mask": plain}
    if probe.role == "encoder" or not plain["leaks"] or probe.call.mask_kwargs(SEQ) is None:
        return
    for style in probe.call.mask_styles():  # the first convention that makes the block causal
        probe.call.mask_style = style
        probe.use_caller_mask()
        masked = probe.causal()
        if not masked["leaks"]:
            break
    review.facts["causal"]["with_caller_mask"] = {**masked, "style": probe.call.mask_style}
    if not masked["leaks"]:
        names = ", ".join(probe.call.mask_kwargs(SEQ))
        review.add("causal mask", "warn", f"leaks unless the caller passes a causal mask ({names}, "
                   f"{MASK_TEXT[probe.call.mask_style]}); reviewed with that mask", "caller")


def _judge_in_place(review: Review, probe: Probe) -> None:
    """A block that writes into its own input (x.copy_(norm(x)), x.mul_(rsqrt(...))): the caller's tensor is changed
    and, when the block adds it back, its residual carries what was written, not the input. The reviewer hands every
    call a copy (probe.Caller), so the rest of the review reads the block on an intact input."""
    written = probe.call.overwritten
    if written is None:
        return
    before, after = written["before"], written["after"]
    width = before.shape[-1]
    norms = [("LayerNorm", lambda t: F.layer_norm(t, (width,))), ("RMSNorm", lambda t: F.rms_norm(t, (width,)))]
    for name, m in probe.module.named_modules():
        if name and not list(m.children()) and sum(p.numel() for p in m.parameters()) <= 2 * width:
            try:
                if norm_kind(m, width, torch.Generator().manual_seed(0)) in ("layernorm", "rmsnorm"):
                    norms.insert(0, (f"'{name}'", m))
            except (TypeError, RuntimeError, ValueError):  # not a module of one tensor of this width
                continue

    def written_by(norm) -> bool:
        with torch.no_grad():
            return (after - norm(before)).abs().max().item() <= 1e-4 * after.abs().max().item()

    what = next((name for name, norm in norms if written_by(norm)), None)
    done = f"normalises its input in place ({what} of x written into x)" if what else "writes into its input in place"
    review.facts["input_overwritten"] = {"as": what.strip("'") if what else None,
                                         "max_change": (after - before).abs().max().item()}
    review.add("input", "flag", f"the block {done} (an in-place op on x: copy_, mul_, ...): the caller's tensor is "
               "changed, and a residual that adds x back then carries the written stream, not the block's input; "
               "reviewed on a copy of its input", what.strip("'") if what else "in-place")


def _judge_heads(review: Review, structure: dict, declared) -> None:
    measured = structure["query_heads"]
    if declared and measured and measured != declared:
        review.add("head count", "flag", f"the attention computes {measured} heads of "
                   f"{structure['evidence']['heads']['head_dim']}, the block was built with {declared}", measured)


def _judge_cross(review: Review, probe: Probe, structure: dict) -> None:
    facts = probe.cross()
    review.facts["cross_attention"] = facts
    seen = bool(structure.get("cross_attention"))
    if facts["memory_changes_output"] and (seen or not structure.get("reviewable")):
        review.add("cross-attention", "pass", f"the output changes with the memory (length {MEMORY_SEQ} -> "
                   f"output length {SEQ})" + (", read by an attention's keys and values" if seen else ""), True)
    else:
        review.add("cross-attention", "flag", "the output ignores the encoder output (memory)" if not
                   facts["memory_changes_output"] else "the memory changes the output, but no attention reads its "
                   "keys and values from it", False)


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
