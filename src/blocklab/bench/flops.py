"""The work of one copy-task training step: its FLOPs, its matrix products replayed alone, and the machine's matmul peak.

FLOPs of one training step (stated again in the output and in performance/README.md), with T = 2 * seq_len - 1 tokens:
    forward  = 2 * B*T * [L * (d*(H+2*KV)*hd + H*hd*d + n_ffn*d*hidden) + d*V]      every Linear: q,k,v,o,ffn,head
             + L * 2 * 2 * B*H*hd * T*(T+1)/2                                        QK^T and AV, causal: lower half
    backward = 2 * forward;  step = 3 * forward.   Norms, softmax, GELU, embeddings and Adam are not counted.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from ..model.fastpath import FastPath, apply_fast_path
from ..run_settings import CopyTask, Sweep
from ..training.copy_model import build_copy_model, copy_model_config
from ..training.tasks import copy_batch, copy_loss

MATMUL_SIZE = 2048


# --- FLOPs -----------------------------------------------------------------------------------------------------------


def copy_step_flops(cfg, batch_size: int, seq_len: int) -> dict:
    """FLOPs of one training step of the copy-task model (see the module docstring for the formula)."""
    tokens_per_seq = 2 * seq_len - 1
    tokens = batch_size * tokens_per_seq
    hd, heads, kv = cfg.head_dim, cfg.n_heads, cfg.kv_heads
    n_ffn = 3 if cfg.ffn_kind == "swiglu" else 2
    per_layer = cfg.d_model * (heads + 2 * kv) * hd + heads * hd * cfg.d_model + n_ffn * cfg.d_model * cfg.hidden
    linear = 2 * tokens * (cfg.n_layers * per_layer + cfg.d_model * cfg.vocab_size)
    pairs_full, pairs_causal = tokens_per_seq**2, tokens_per_seq * (tokens_per_seq + 1) // 2
    attention_full = cfg.n_layers * 2 * 2 * batch_size * heads * hd * pairs_full
    attention_causal = cfg.n_layers * 2 * 2 * batch_size * heads * hd * pairs_causal
    return {
        "linear_forward": linear,
        "attention_forward_full": attention_full,
        "attention_forward_causal": attention_causal,
        "step": 3 * (linear + attention_causal),
        "step_attention_full": 3 * (linear + attention_full),
    }


FLOP_FORMULA = (
    "step = 3 * forward (backward = 2x forward); forward = 2*B*T*[L*(d*(H+2KV)*hd + H*hd*d + n_ffn*d*hidden) + d*V]"
    " + L*2*2*B*H*hd*T*(T+1)/2 (attention QK^T and AV, causal: lower triangle incl. diagonal); T = 2*seq_len-1;"
    " norms, softmax, GELU, embedding and Adam not counted"
)


# --- the machine's peak ----------------------------------------------------------------------------------------------


def matmul_gflops(seconds: float, device: str = "cpu", size: int = MATMUL_SIZE) -> float:
    """Sustained fp32 matmul throughput of this process over ``seconds`` (mean over the window, after one warm-up)."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    torch.mm(a, b, out=out)
    sync()
    calls, began = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds or calls < 2:
        for _ in range(1 if not a.is_cuda else 20):
            torch.mm(a, b, out=out)
            calls += 1
        sync()
    return 2 * size**3 * calls / elapsed / 1e9



# --- GEMM floor: the fast step's own matrix products, nothing else ---------------------------------------------------

GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")


def _gemm_flops(name: str, shapes: list[tuple]) -> int:
    """Executed FLOPs of one captured call: 2*M*N*K, times the batch for bmm/baddbmm (masked entries included)."""
    a, b = (shapes[0], shapes[1]) if name in ("mm", "bmm") else (shapes[1], shapes[2])
    return 2 * math.prod(a) * b[-1]


def capture_step_gemms(params: dict, norm: str, fast: FastPath, device="cpu") -> list[dict]:
    """Every matrix-product call (forward and backward) of one fast-path training step, with shapes, strides and scalars.

    The step is the real one (the sweep's model, batch, loss, Adam); a dispatch mode below autograd records the calls.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in GEMM_OPS:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                calls.append({"op": name, "shapes": [tuple(t.shape) for t in tensors],
                              "strides": [tuple(t.stride()) for t in tensors], "kwargs": dict(kwargs or {}),
                              "flops": _gemm_flops(name, [tuple(t.shape) for t in tensors])})
            return func(*args, **(kwargs or {}))

    task, settings = CopyTask.from_params(params), Sweep.from_params(params)
    model = apply_fast_path(build_copy_model(copy_model_config(params, norm), 0).to(device), fast)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr, fused=fast.fused_adam or None)
    inputs, targets = copy_batch(task.batch_size, task.seq_len, task.vocab_size, torch.Generator().manual_seed(0), device=device)
    with Recorder():
        copy_loss(model(inputs), targets).backward()
        optimizer.step()
    return calls


def time_gemm_floor(calls: list[dict], repeats: int, device="cpu") -> dict:
    """Replay ``calls`` ``repeats`` times on random operands of the captured shapes and strides; median seconds a step.

    Every call gets operands of its own (as in the step, where each product reads tensors that other ops just wrote)
    and allocates its output, so cache and allocator behave as in training. No other work is done: this is the
    ceiling of any path that keeps these products.
    """
    def operand(shape, stride):
        size = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        return torch.randn(size, device=device).as_strided(shape, stride)

    prepared = [(getattr(torch.ops.aten, c["op"]).default, [operand(sh, st) for sh, st in zip(c["shapes"], c["strides"])], c["kwargs"])
                for c in calls]
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    times = []
    for _ in range(repeats + 1):  # the first replay warms up and is dropped
        sync()
        began = time.perf_counter()
        for op, operands, kwargs in prepared:
            op(*operands, **kwargs)
        sync()
        times.append(time.perf_counter() - began)
    return {"step_s": statistics.median(times[1:]), "calls": len(calls), "executed_flops": sum(c["flops"] for c in calls)}

