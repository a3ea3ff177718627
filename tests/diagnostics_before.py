"""The training diagnostics as they were before they were made cheap (src/blocklab/training/diagnostics.py at 90d4296), frozen:
the reference that tests/test_diagnostics_record.py holds the batched implementation to (every metric recomputed per
block, the attention from the sub-layer's input). Not used by the package; do not edit except to fix imports."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pandas as pd
import torch

from blocklab.model_config import ConfigError

MODEL_BLOCK = -1  # the block index of whole-model metrics
COLUMNS = ["step", "block", "metric", "value"]


@dataclass(frozen=True)
class Metric:
    """One diagnostic: what it is and when and how it is read. ``when`` says which of the Recorder's moments calls
    ``read`` and with what: ``gradient`` (a block, after backward: its value), ``optimizer`` (every block's
    parameters and the optimizer, before the step: one value per block), ``update`` (the blocks' parameters before and
    after the step: one value per block), ``forward`` (a block and what the step's forward fed it: its value),
    ``output`` (the model's output logits: one value). Forward and output metrics are read every ``every`` steps
    (``cadence`` "every"), the others at every step ("step")."""
    scope: str      # "block" (one value per block) or "model"
    when: str       # gradient | optimizer | update | forward | output
    label: str      # what it is, in words (figure axes, the README)
    read: Callable

    @property
    def cadence(self) -> str:
        return "every" if self.when in ("forward", "output") else "step"


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


def _update_ratios(before: list[list[torch.Tensor]], after: list[list[torch.Tensor]]) -> list[float]:
    """Per block, ||before - after|| / ||before|| (``before``: copies taken before the step)."""
    return [_norm(torch._foreach_sub(old, new)) / max(_norm(old), 1e-30)  # before - after: the update, sign aside
            for old, new in zip(before, after)]


def _attention(block, seen: dict) -> tuple[float, float]:
    """The block's attention (entropy, largest logit), computed once per forward read (``seen`` keeps it)."""
    if "attention" not in seen:
        seen["attention"] = _attention_stats(block.attn.sublayer, seen["attn_in"])
    return seen["attention"]


# The list of diagnostics: one entry per metric, beside the code that reads it. The Recorder reads the wanted ones in
# this order (within each moment), so the table's rows come in this order; params.schema.yaml's enum of
# diagnostics.metrics is checked against these names (tests/test_diagnostics.py).
METRICS = {
    "grad_ffn_out": Metric("block", "gradient", "gradient norm of the block's second MLP weight (Xiong et al. 2020, Fig. 3)",
                           lambda block: _norm([block.ffn.sublayer.down.weight.grad])),
    "grad_attn": Metric("block", "gradient", "gradient norm of the attention sub-layer (its norm included)",
                        lambda block: _norm([p.grad for p in block.attn.parameters()])),
    "grad_ffn": Metric("block", "gradient", "gradient norm of the MLP sub-layer (its norm included)",
                       lambda block: _norm([p.grad for p in block.ffn.parameters()])),
    "update_ratio": Metric("block", "update", "Adam's relative update ||dtheta|| / ||theta|| of the block", _update_ratios),
    "adam_rms": Metric("block", "optimizer", "sqrt(mean(g^2 / v_hat)) over the block, v_hat before the step "
                       "(Wortsman et al. 2023)", _adam_rms),
    "stream_norm": Metric("block", "forward", "mean L2 norm of the residual stream entering the block",
                          lambda block, seen: seen["stream"].float().norm(dim=-1).mean()),
    "attn_entropy": Metric("block", "forward", "mean attention entropy of the block's heads (nats; Zhai et al. 2023)",
                           lambda block, seen: _attention(block, seen)[0]),
    "attn_logit_max": Metric("block", "forward", "largest attention logit q.k/sqrt(d_head) of the block",
                             lambda block, seen: _attention(block, seen)[1]),
    "output_logit_max": Metric("model", "output", "largest output logit of the model",
                               lambda logits: logits.float().max()),
}


def check_settings(settings: dict | None, key: str = "diagnostics") -> dict:
    """The ``diagnostics`` section of params.yaml, checked: unknown metric names and a non-positive interval fail here,
    naming the key and the allowed values, before anything trains (params.schema.yaml checks the same when params.yaml
    is loaded; this is for callers that build the section themselves)."""
    settings = dict(settings or {"enabled": False})
    allowed = {"enabled", "every", "metrics"}
    unknown = set(settings) - allowed
    if unknown:
        raise ConfigError(f"{key}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    every = settings.get("every", 10)
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

    def _at(self, when: str) -> list[tuple[str, Metric]]:
        """The wanted metrics read at ``when``, in the order of ``METRICS``."""
        return [(name, m) for name, m in METRICS.items() if m.when == when and name in self.metrics]

    def _add(self, step: int, block: int, metric: str, value) -> None:
        self.rows.append((step, block, metric, float(value)))

    # ---- between backward() and optimizer.step() ------------------------------------------------------------------

    @torch.no_grad()
    def before_update(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        gradient = self._at("gradient")
        for i, block in enumerate(self.blocks):
            for name, metric in gradient:
                self._add(step, i, name, metric.read(block))
        for name, metric in self._at("optimizer"):
            for i, value in enumerate(metric.read(self.block_params, optimizer)):
                self._add(step, i, name, value)
        if self._at("update"):
            self._before = [torch._foreach_mul(params, 1.0) for params in self.block_params]  # copies

    @torch.no_grad()
    def after_update(self, step: int) -> None:
        if self._before is None:
            return
        for name, metric in self._at("update"):
            for i, value in enumerate(metric.read(self._before, self.block_params)):
                self._add(step, i, name, value)
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
        forward = self._at("forward")
        for i, block in enumerate(self.blocks):
            seen = {"stream": captured["stream", i], "attn_in": captured["attn_in", i]}
            for name, metric in forward:
                self._add(step, i, name, metric.read(block, seen))
        for name, metric in self._at("output"):
            self._add(step, MODEL_BLOCK, name, metric.read(captured["logits"]))

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
