"""Training-time diagnostics of the copy-task model: what document 000 says it did not measure.

Recorded while a run trains (``train(..., diagnostics=Recorder(...))``), as a tidy table ``step, block, metric, value``
(block -1: the whole model). Nothing here changes the numbers the run computes. The gradient and optimizer metrics only
read ``.grad`` and Adam's state between ``backward()`` and ``optimizer.step()``. The forward metrics are read from the
step's own training forward by hooks that keep references to what it computes; the attention statistics are read from
the step's own attention scores and weights where the fast path's attention shows them
(``ShortCausalAttention.observe``), else recomputed from the sub-layer's input under ``no_grad``.
``tests/test_diagnostics.py`` checks that the losses are bit-identical with and without them.

The gradient and Adam metrics are taken every step; the forward ones every ``every`` steps (and at step 1), and at every
step of an optional ``dense`` window (first, last step), e.g. the steps before an event when a run is re-run to see it.

Cost: each quantity is computed once a step from what the step has: the gradient norms from one
``_foreach_norm`` over every gradient, Adam's ratio and the update block by block (cache-resident) from Adam's state
and copies kept between steps, the stream norm as each block receives it, the attention metrics from the step's own
scores and weights; a moment's values reach the host in one ``tolist()``. ``performance/profile_diagnostics.py`` says
where the time goes, ``performance/ab_diagnostics.py`` what it costs (performance/measured/HISTORY.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pandas as pd
import torch

from ..model_config import ConfigError

MODEL_BLOCK = -1  # the block index of whole-model metrics
COLUMNS = ["step", "block", "metric", "value"]


@dataclass(frozen=True)
class Metric:
    """One diagnostic: what it is and when and how it is read. ``when`` says which of the Recorder's moments calls
    ``read`` and with what: ``gradient`` (a block and the step's per-tensor gradient norms, a dict parameter -> norm,
    after backward: its value), ``optimizer`` (every block's parameters and the optimizer, before the step: one value
    per block), ``update`` (copies of the blocks' parameters before the step and the parameters after it: one value per
    block; it may overwrite the copies), ``forward`` (a block and what the step's forward fed it: its value), ``output``
    (the model's output logits: one value). Values are floats or 0-d tensors (brought to the host together). Forward
    and output metrics are read every ``every`` steps (``cadence`` "every"), the others at every step ("step")."""
    scope: str      # "block" (one value per block) or "model"
    when: str       # gradient | optimizer | update | forward | output
    label: str      # what it is, in words (figure axes, the README)
    read: Callable

    @property
    def cadence(self) -> str:
        return "every" if self.when in ("forward", "output") else "step"


def _combine(norms: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of several tensors from their own norms (NaN for none)."""
    if not norms:
        return torch.tensor(float("nan"))
    return torch.linalg.vector_norm(torch.stack(norms))


def _scalar(value: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor of ``value`` (one element), with no new ATen call where it already is one (read under no_grad)."""
    value = value.detach() if value.requires_grad else value
    return value if value.dim() == 0 else value.reshape(())


def _grad(norms: dict, params) -> torch.Tensor:
    """The gradient norm of ``params`` from the step's per-tensor gradient norms (those without a gradient left out)."""
    return _combine([norms[p] for p in params if p in norms])


def _adam_rms(blocks: list[list[torch.Tensor]], optimizer) -> list[float]:
    """Per block, sqrt(mean over its entries of g^2 / v_hat), v_hat Adam's bias-corrected second moment *before* this
    step's update (the gradient measured against the running estimate that scales it). NaN at step 1 (no estimate).
    g^2 / (v / c + eps^2) = g^2 c / (v + c eps^2), c = 1 - beta2^t. Block by block (a block's gradients and moments,
    ~0.8 MB, stay in the core's cache through the three passes: 1.3x faster than one pass of each over every block),
    the sums brought to the host together."""
    beta2, eps = optimizer.param_groups[0]["betas"][1], optimizer.param_groups[0]["eps"]
    sums, scales = [], []
    for params in blocks:
        states = [optimizer.state.get(p, {}) for p in params]
        if any(p.grad is None or "exp_avg_sq" not in st for p, st in zip(params, states)):
            scales.append(None)
            continue
        c = 1 - beta2 ** float(states[0]["step"])
        squares = torch._foreach_mul([p.grad for p in params], [p.grad for p in params])
        denominators = torch._foreach_add([st["exp_avg_sq"] for st in states], c * eps**2)
        torch._foreach_div_(squares, denominators)
        sums.append(torch.stack([x.sum() for x in squares]).sum())
        scales.append((c, sum(p.numel() for p in params)))
    totals = iter(torch.stack(sums).tolist() if sums else [])
    return [float("nan") if sc is None else math.sqrt(next(totals) * sc[0] / sc[1]) for sc in scales]


def _update_ratios(before: list[list[torch.Tensor]], after: list[list[torch.Tensor]]) -> list[float]:
    """Per block, ||before - after|| / ||before|| (``before``: copies taken before the step, overwritten here by the
    update before - after, sign aside). Block by block, so that the subtraction and the norms read a block's copies
    from the cache; the norms brought to the host together."""
    pairs = []
    for old, new in zip(before, after):
        norm = _combine(torch._foreach_norm(old))
        torch._foreach_sub_(old, new)
        pairs.append(torch.stack([_combine(torch._foreach_norm(old)), norm]))
    return [update / max(norm, 1e-30) for update, norm in torch.stack(pairs).tolist()]


def _attention(block, seen: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's attention (entropy, largest logit): as the step's own attention showed them, else recomputed once
    per forward read (``seen`` keeps it)."""
    if "attention" not in seen:
        seen["attention"] = _attention_stats(block.attn.sublayer, seen["attn_in"])
    return seen["attention"]


# The list of diagnostics: one entry per metric, beside the code that reads it. The Recorder reads the wanted ones in
# this order (within each moment), so the table's rows come in this order; params.schema.yaml's enum of
# diagnostics.metrics is checked against these names (tests/test_diagnostics.py).
METRICS = {
    "grad_ffn_out": Metric("block", "gradient", "gradient norm of the block's second MLP weight (Xiong et al. 2020, Fig. 3)",
                           lambda block, norms: _grad(norms, [block.ffn.sublayer.down.weight])),
    "grad_attn": Metric("block", "gradient", "gradient norm of the attention sub-layer (its norm included)",
                        lambda block, norms: _grad(norms, block.attn.parameters())),
    "grad_ffn": Metric("block", "gradient", "gradient norm of the MLP sub-layer (its norm included)",
                       lambda block, norms: _grad(norms, block.ffn.parameters())),
    "update_ratio": Metric("block", "update", "Adam's relative update ||dtheta|| / ||theta|| of the block", _update_ratios),
    "adam_rms": Metric("block", "optimizer", "sqrt(mean(g^2 / v_hat)) over the block, v_hat before the step "
                       "(Wortsman et al. 2023)", _adam_rms),
    "stream_norm": Metric("block", "forward", "mean L2 norm of the residual stream entering the block",
                          lambda block, seen: seen["stream_norm"]),
    "attn_entropy": Metric("block", "forward", "mean attention entropy of the block's heads (nats; Zhai et al. 2023)",
                           lambda block, seen: _attention(block, seen)[0]),
    "attn_logit_max": Metric("block", "forward", "largest attention logit q.k/sqrt(d_head) of the block",
                             lambda block, seen: _attention(block, seen)[1]),
    "output_logit_max": Metric("model", "output", "largest output logit of the model",
                               lambda logits: logits.float().max()),
}


EVERY = 10  # steps between forward metrics when a caller builds the section without ``every`` (params.yaml must name it)


def check_settings(settings: dict | None, key: str = "diagnostics") -> dict:
    """The ``diagnostics`` section of params.yaml, checked: unknown metric names and a non-positive interval fail here,
    naming the key and the allowed values, before anything trains (params.schema.yaml checks the same when params.yaml
    is loaded; this is for callers that build the section themselves)."""
    settings = dict(settings or {"enabled": False})
    allowed = {"enabled", "every", "metrics"}
    unknown = set(settings) - allowed
    if unknown:
        raise ConfigError(f"{key}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    every = settings.get("every", EVERY)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ConfigError(f"{key}.every={every!r} is not allowed; choose an integer >= 1 (steps between forward metrics)")
    metrics = settings.get("metrics", list(METRICS))
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics or len(set(metrics)) != len(metrics):
        why = f"unknown {bad}" if bad else "empty" if not metrics else "repeated names"
        raise ConfigError(f"{key}.metrics: {why}; allowed: {list(METRICS)} (each at most once)")
    return {"enabled": bool(settings.get("enabled", False)), "every": every, "metrics": list(metrics)}



class Recorder:
    """Collects the diagnostics of one run of a model with ``blocks`` (each with ``attn`` and ``ffn`` residual
    sub-layers wrapping ``.sublayer``, as ``blocklab.model.blocks``) and an output ``head``."""

    def __init__(self, model: torch.nn.Module, metrics: list[str] | None = None, every: int = EVERY,
                 dense: tuple[int, int] | None = None):
        self.model, self.every, self.dense = model, every, dense
        self.metrics = list(metrics or METRICS)
        self.blocks = list(model.blocks)
        self.block_params = [[p for p in block.parameters()] for block in self.blocks]
        self.rows: list[tuple[int, int, str, float]] = []
        self._before: list[list[torch.Tensor]] | None = None
        self._copies: list[list[torch.Tensor]] | None = None  # kept between steps: the update's buffers

    def wants(self, name: str) -> bool:
        return name in self.metrics

    def _at(self, when: str) -> list[tuple[str, Metric]]:
        """The wanted metrics read at ``when``, in the order of ``METRICS``."""
        return [(name, m) for name, m in METRICS.items() if m.when == when and name in self.metrics]

    def _add(self, step: int, values: list[tuple[int, str, object]]) -> None:
        """Rows ``(step, block, metric, value)`` for a moment's values, floats or 0-d tensors: the tensors reach the
        host together, in one ``tolist()``, stacked as they are and cast once (``stack`` promotes to the widest float
        type present and the cast widens: every conversion exact, so each value is its ``float()``; one cast of the
        stack instead of a ``double()`` of each value: ~650 fewer ATen calls a step at 24 blocks)."""
        tensors = [_scalar(v) for _, _, v in values if isinstance(v, torch.Tensor)]
        host = iter(torch.stack(tensors).double().tolist() if tensors else [])
        self.rows.extend((step, block, name, next(host) if isinstance(v, torch.Tensor) else float(v))
                         for block, name, v in values)

    # ---- between backward() and optimizer.step() ------------------------------------------------------------------

    @torch.no_grad()
    def before_update(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        values = []
        gradient = self._at("gradient")
        if gradient:
            grads = [(p, p.grad) for params in self.block_params for p in params if p.grad is not None]
            norms = dict(zip((p for p, _ in grads), torch._foreach_norm([g for _, g in grads]))) if grads else {}
            for i, block in enumerate(self.blocks):
                for name, metric in gradient:
                    values.append((i, name, metric.read(block, norms)))
        for name, metric in self._at("optimizer"):
            values += [(i, name, value) for i, value in enumerate(metric.read(self.block_params, optimizer))]
        self._add(step, values)
        if self._at("update"):
            if self._copies is None:
                self._copies = [torch._foreach_mul(params, 1.0) for params in self.block_params]
            else:
                for copies, params in zip(self._copies, self.block_params):
                    torch._foreach_copy_(copies, params)
            self._before = self._copies

    @torch.no_grad()
    def after_update(self, step: int) -> None:
        if self._before is None:
            return
        for name, metric in self._at("update"):
            self._add(step, [(i, name, value) for i, value in enumerate(metric.read(self._before, self.block_params))])
        self._before = None

    # ---- the step's own training forward, read by hooks --------------------------------------------------------------

    def forward_due(self, step: int) -> bool:
        in_window = self.dense is not None and self.dense[0] <= step <= self.dense[1]
        return (step == 1 or step % self.every == 0 or in_window) and any(METRICS[m].cadence == "every" for m in self.metrics)

    def watch(self, step: int):
        """A context manager: while it is open the model's forward is read (the norm of the stream entering each block,
        each attention sub-layer's input and, where it shows them, its scores and weights, the output logits); on exit
        the forward metrics of ``step`` are computed from what was read. Hooks only keep references (detached) or
        reduce what they are shown under ``no_grad`` (the attention's scores, dead after its softmax, serving as
        scratch), so the forward computes exactly what it would."""
        return _Watch(self, step)

    @torch.no_grad()
    def _forward_metrics(self, step: int, captured: dict) -> None:
        forward, values = self._at("forward"), []
        for i, block in enumerate(self.blocks):
            seen = {"stream_norm": captured["stream_norm", i], "attn_in": captured["attn_in", i]}
            if ("attention", i) in captured:
                seen["attention"] = captured["attention", i]
            for name, metric in forward:
                values.append((i, name, metric.read(block, seen)))
        for name, metric in self._at("output"):
            values.append((MODEL_BLOCK, name, metric.read(captured["logits"])))
        self._add(step, values)

    # ---- checkpoints and the table ------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"rows": list(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        self.rows = [tuple(row) for row in state.get("rows", [])]

    def table(self) -> pd.DataFrame:
        return table(self.rows)


def table(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({"step": "int64", "block": "int64", "metric": "string", "value": "float64"})


class _Watch:
    def __init__(self, recorder: Recorder, step: int):
        self.recorder, self.step, self.captured, self.hooks, self.observed = recorder, step, {}, [], []

    def __enter__(self):
        attention = any(self.recorder.wants(m) for m in ("attn_entropy", "attn_logit_max"))
        for i, block in enumerate(self.recorder.blocks):
            self.hooks.append(block.register_forward_pre_hook(_stream(self.captured, ("stream_norm", i))))
            self.hooks.append(block.attn.sublayer.register_forward_pre_hook(_capture(self.captured, ("attn_in", i))))
            if attention and hasattr(block.attn.sublayer, "observe"):  # the fast path's attention shows its scores
                block.attn.sublayer.observe = _observe(self.captured, ("attention", i))
                self.observed.append(block.attn.sublayer)
        self.hooks.append(self.recorder.model.head.register_forward_hook(
            lambda module, args, output: self.captured.__setitem__("logits", output.detach())))
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        for sublayer in self.observed:
            del sublayer.observe  # back to the class's None
        read = {key for key in self.captured if key == "logits" or key[0] in ("stream_norm", "attn_in")}
        if exc[0] is None and len(read) == 2 * len(self.recorder.blocks) + 1:
            self.recorder._forward_metrics(self.step, self.captured)
        self.captured.clear()
        return False


def _capture(store: dict, key):
    def hook(module, args):
        store[key] = args[0].detach()

    return hook


def _stream(store: dict, key):
    """The mean L2 norm of the residual stream entering a block, taken as the block receives it (the stream is then in
    the cache; the forward only reads it)."""
    def hook(module, args):
        with torch.no_grad():
            store[key] = args[0].detach().float().norm(dim=-1).mean()

    return hook


def _observe(store: dict, key):
    """What the fast (causal) attention shows each forward, its scores (-inf where masked) and its weights, reduced
    at once to the two attention metrics; bf16 scores are left to the recomputation (fp32 from the bf16 projections,
    as the first diagnostics did)."""
    def observe(scores, probs):
        if scores.dtype == torch.float32 and probs.dtype == torch.float32:
            store[key] = _causal_stats(scores, probs, scratch=True)  # the forward reads no score after its softmax

    return observe


def _attention_from(scores: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean entropy (nats) of the attention weights (masked entries 0: entr(0) = 0) and the largest logit (masked
    entries -inf), over every head, query and batch row."""
    return torch.special.entr(probs).sum(-1).mean(), scores.max()


def _row_max(x: torch.Tensor) -> torch.Tensor:
    """Each row's largest entry of causal (..., T, T) scores (-inf above the diagonal) or weights (0 there), flat.
    ATen reduces rows of 63 floats ~8x slower than rows of 64 (0.91 vs 0.095 ms a batch-64 layer here: only whole
    vectors are reduced fast), so a contiguous x is read as overlapping rows of T + 1 that start one entry early: the
    entry before row r of a head is row r - 1's last, above the diagonal, so it changes no maximum; before a head's
    row 0 it is the previous head's last diagonal entry, so row 0 takes its only entry, x[..., 0, 0], instead."""
    time_ = x.shape[-1]
    if not x.is_contiguous() or time_ < 2 or x.shape[-2] != time_:
        return x.amax(-1).reshape(-1)
    rows = x.numel() // time_
    out = torch.empty(rows, dtype=x.dtype, device=x.device)
    out[1:] = x.as_strided((rows - 1, time_ + 1), (time_, 1), x.storage_offset() + time_ - 1).amax(-1)
    out.view(-1, time_)[:, 0] = x.reshape(-1, time_, time_)[:, 0, 0]
    return out


def _causal_stats(scores: torch.Tensor, probs: torch.Tensor, scratch: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``_attention_from(scores, probs)`` for causal float32 scores and their softmax, with one logarithm a row
    instead of one an entry. With m a row's largest score and p_max its weight (the largest: the softmax is monotone),
    log p_j = s_j - m + log p_max, so the row's entropy is -log p_max + sum_j p_j (m - s_j): every term >= 0 (no
    cancellation, however peaked the row), masked entries 0 (p = 0; their 0 * inf = NaN is what ``nansum`` skips; a
    NaN score still makes m, p_max and so the mean NaN). 0.63 vs 1.16 ms a batch-64 layer here, largest logit included.
    What bounds the difference from entr of the weights is the softmax's own rounding: entr takes the log of each
    rounded weight, this the exact log of the weight the softmax meant, exp(s_j - m) / Z, and of p_max = 1 / Z as
    rounded; the two differ by a few float32 units (2^-24) relative of each weight, weighted by p_j; then one rounding
    of each term (m - s_j, times p_j, both >= 0) and the cascade sums. Observed within 1.5e-7 relative of a float64
    entr (T 2-64, entropies 0.002-3.2 nats), as entr itself; the tests allow 1e-6.
    ``scratch``: m - s is written over ``scores`` (the same values as into a fresh tensor) instead of a new tensor: the
    fast attention's scores are dead after its softmax, and still in the cache (1.00 vs 1.17 ms a batch-64 layer inside
    a real forward, performance/measured/HISTORY.md)."""
    top_score = _row_max(scores)
    top_weight = _row_max(probs)
    spread = torch.sub(top_score.view(scores.shape[:-1] + (1,)), scores, out=scores if scratch else None).mul_(probs)
    return (torch.nansum(spread) - top_weight.log_().sum()) / top_score.numel(), top_score.max()


def _attention_stats(attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean entropy (nats) of the causal attention weights and the largest logit q.k/sqrt(d_head), recomputed from
    the sub-layer's own projections on its input (self-attention without RoPE, as the copy model's)."""
    q = attention.split_heads(attention.q(x), attention.n_heads).float()
    k = attention.split_heads(attention.k(x), attention.kv_heads).float()
    if attention.kv_heads != attention.n_heads:
        k = k.repeat_interleave(attention.n_heads // attention.kv_heads, dim=-3)
    scores = q @ k.transpose(-1, -2) * attention.head_dim**-0.5
    if attention.causal:
        time_ = x.shape[-2]
        scores = scores + torch.full((time_, time_), float("-inf"), device=x.device).triu_(1)
    return _attention_from(scores, scores.softmax(-1))
