"""Training-time diagnostics of the copy-task model: what document 000 says it did not measure.

Recorded while a run trains (``train(..., diagnostics=Recorder(...))``), as a tidy table ``step, block, metric, value``
(block -1: the whole model). Nothing here changes the numbers the run computes. The gradient and optimizer metrics only
read ``.grad`` and Adam's state between ``backward()`` and ``optimizer.step()``. The forward metrics are read from the
step's own training forward by hooks that keep references to what it computes; the attention statistics are then
recomputed from the sub-layer's input under ``no_grad``. ``tests/test_diagnostics.py`` checks that the losses are
bit-identical with and without them.

The gradient and Adam metrics are taken every step; the forward ones every ``every`` steps (and at step 1), and at every
step of an optional ``dense`` window (first, last step), e.g. the steps before an event when a run is re-run to see it.
"""
from __future__ import annotations

import math
import pandas as pd
import torch

from ..studies.dynamics.plan import COLUMNS, METRICS, MODEL_BLOCK, Metric, check_settings  # noqa: F401  (names live there)


class Recorder:
    """Collects the diagnostics of one run of a model with ``blocks`` (each with ``attn`` and ``ffn`` residual
    sub-layers wrapping ``.sublayer``, as ``blocklab.model.blocks``) and an output ``head``."""

    def __init__(self, model: torch.nn.Module, metrics: list[str] | None = None, every: int = 10,
                 dense: tuple[int, int] | None = None):
        self.model, self.every, self.dense = model, every, dense
        self.metrics = list(metrics or METRICS)
        self.blocks = list(model.blocks)
        self.block_params = [[p for p in block.parameters()] for block in self.blocks]
        self.rows: list[tuple[int, int, str, float]] = []
        self._before: list[list[torch.Tensor]] | None = None

    def wants(self, name: str) -> bool:
        return name in self.metrics

    def _add(self, step: int, block: int, metric: str, value) -> None:
        self.rows.append((step, block, metric, float(value)))

    # ---- between backward() and optimizer.step() ------------------------------------------------------------------

    @torch.no_grad()
    def before_update(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        for i, block in enumerate(self.blocks):
            if self.wants("grad_ffn_out"):
                self._add(step, i, "grad_ffn_out", _norm([block.ffn.sublayer.down.weight.grad]))
            if self.wants("grad_attn"):
                self._add(step, i, "grad_attn", _norm([p.grad for p in block.attn.parameters()]))
            if self.wants("grad_ffn"):
                self._add(step, i, "grad_ffn", _norm([p.grad for p in block.ffn.parameters()]))
        if self.wants("adam_rms"):
            for i, value in enumerate(_adam_rms(self.block_params, optimizer)):
                self._add(step, i, "adam_rms", value)
        if self.wants("update_ratio"):
            self._before = [torch._foreach_mul(params, 1.0) for params in self.block_params]  # copies

    @torch.no_grad()
    def after_update(self, step: int) -> None:
        if self._before is None:
            return
        for i, (params, before) in enumerate(zip(self.block_params, self._before)):
            old = _norm(before)
            torch._foreach_sub_(before, params)  # before - after: the update, sign aside
            self._add(step, i, "update_ratio", _norm(before) / max(old, 1e-30))
        self._before = None

    # ---- the step's own training forward, read by hooks --------------------------------------------------------------

    def forward_due(self, step: int) -> bool:
        in_window = self.dense is not None and self.dense[0] <= step <= self.dense[1]
        return (step == 1 or step % self.every == 0 or in_window) and any(METRICS[m].cadence == "every" for m in self.metrics)

    def watch(self, step: int):
        """A context manager: while it is open the model's forward is read (the stream entering each block, each
        attention sub-layer's input, the output logits); on exit the forward metrics of ``step`` are computed from
        what was read. Hooks only keep references (detached), so the forward computes exactly what it would."""
        return _Watch(self, step)

    @torch.no_grad()
    def _forward_metrics(self, step: int, captured: dict) -> None:
        for i, block in enumerate(self.blocks):
            if self.wants("stream_norm"):
                self._add(step, i, "stream_norm", captured["stream", i].float().norm(dim=-1).mean())
            if self.wants("attn_entropy") or self.wants("attn_logit_max"):
                entropy, logit_max = _attention_stats(block.attn.sublayer, captured["attn_in", i])
                if self.wants("attn_entropy"):
                    self._add(step, i, "attn_entropy", entropy)
                if self.wants("attn_logit_max"):
                    self._add(step, i, "attn_logit_max", logit_max)
        if self.wants("output_logit_max"):
            self._add(step, MODEL_BLOCK, "output_logit_max", captured["logits"].float().max())

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


def _norm(tensors) -> float:
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return float("nan")
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors))))


def _adam_rms(blocks: list[list[torch.Tensor]], optimizer) -> list[float]:
    """Per block, sqrt(mean over its entries of g^2 / v_hat), v_hat Adam's bias-corrected second moment *before* this
    step's update (the gradient measured against the running estimate that scales it). NaN at step 1 (no estimate).
    g^2 / (v / c + eps^2) = g^2 c / (v + c eps^2), c = 1 - beta2^t."""
    beta2, eps = optimizer.param_groups[0]["betas"][1], optimizer.param_groups[0]["eps"]
    out = []
    for params in blocks:
        states = [optimizer.state.get(p, {}) for p in params]
        if any(p.grad is None or "exp_avg_sq" not in st for p, st in zip(params, states)):
            out.append(float("nan"))
            continue
        c = 1 - beta2 ** float(states[0]["step"])
        squares = torch._foreach_mul([p.grad for p in params], [p.grad for p in params])
        denominators = torch._foreach_add([st["exp_avg_sq"] for st in states], c * eps**2)
        torch._foreach_div_(squares, denominators)
        total = float(torch.stack([x.sum() for x in squares]).sum()) * c
        out.append(math.sqrt(total / sum(p.numel() for p in params)))
    return out


class _Watch:
    def __init__(self, recorder: Recorder, step: int):
        self.recorder, self.step, self.captured, self.hooks = recorder, step, {}, []

    def __enter__(self):
        for i, block in enumerate(self.recorder.blocks):
            self.hooks.append(block.register_forward_pre_hook(_capture(self.captured, ("stream", i))))
            self.hooks.append(block.attn.sublayer.register_forward_pre_hook(_capture(self.captured, ("attn_in", i))))
        self.hooks.append(self.recorder.model.head.register_forward_hook(
            lambda module, args, output: self.captured.__setitem__("logits", output.detach())))
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        if exc[0] is None and len(self.captured) == 2 * len(self.recorder.blocks) + 1:
            self.recorder._forward_metrics(self.step, self.captured)
        self.captured.clear()
        return False


def _capture(store: dict, key):
    def hook(module, args):
        store[key] = args[0].detach()

    return hook


def _attention_stats(attention, x: torch.Tensor) -> tuple[float, float]:
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
    logit_max = scores.max()  # the masked entries are -inf
    entropy = torch.special.entr(scores.softmax(-1)).sum(-1).mean()  # entr(0) = 0 for the masked entries
    return float(entropy), float(logit_max)
