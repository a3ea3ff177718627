"""What `blocklab bench` times: its lanes (a way of running the sweep: fast-path switches and process layout) and the
training of one sweep run for a few steps, as every lane does it."""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import torch

from ..model.fastpath import PLAIN, FastPath, apply_fast_path
from ..model.peer import build_peer_model
from ..run_settings import CopyTask, Sweep
from ..training.copy_model import build_copy_model, copy_model_config
from ..training.precision import check_precision
from ..training.tasks import copy_batch, copy_loss
from ..training.train import train


@dataclass(frozen=True)
class Lane:
    """One way of running the sweep: its fast-path switches and its process layout."""

    name: str
    fast: FastPath
    workers: int
    threads: int  # 0: torch's default (all cores)
    process_per_run: bool  # a pipeline job per run pays a process start per run; a plain loop pays it once
    batched: bool = False  # all runs of a round in one process, one vmapped model per norm position
    model: str = "blocklab"  # or "peer": blocklab.model.peer's GPT-style model of the same size
    precision: str = "fp32"  # sweep.precision of the lane
    diagnostics: bool = False  # records the training-time diagnostics (params' diagnostics section)

    def describe(self) -> str:
        what = "peer model, " + ("fused Adam" if self.fast.fused_adam else "Adam") if self.model == "peer" else self.fast.describe()
        return (what + (", bf16 autocast" if self.precision != "fp32" else "") + (", vmapped" if self.batched else "")
                + (", diagnostics" if self.diagnostics else ""))


PEER_SETTINGS = FastPath(fused_layernorm=False, short_attention=False, fused_adam=True, allocator=False, compile=False)
BASELINES = ("plain", "peer")  # lane-name prefixes of the baselines every speed-up is quoted against


def default_lanes(workers: int, threads: int, fast: FastPath, layout_reference: bool, device: str, batched: bool,
                  peer: bool = True, bf16: bool = False, compiled: bool = False, diagnostics: bool = True) -> list[Lane]:
    """CPU: plain loop, [plain model in the fast layout], [peer], fast processes, [bf16], [batched].

    CUDA: per-run plain loop and [peer] (one process, one run after another), the batched (vmapped) model as "fast",
    [batched under bf16 autocast], [batched with torch.compile]. ``fast.compile`` applies to the fast lane itself.
    """
    lanes = [Lane("plain", PLAIN, 1, 0, False)]
    if device == "cuda":
        if peer:
            lanes.append(Lane("peer", PEER_SETTINGS, 1, 0, False, model="peer"))
        lanes.append(Lane("fast", fast, 1, 0, False, batched=True))
        if bf16:
            lanes.append(Lane("bf16", fast, 1, 0, False, batched=True, precision="bf16"))
        if compiled and not fast.compile:
            lanes.append(Lane("batched-compiled", FastPath(compile=True), 1, 0, False, batched=True))
        return lanes
    if layout_reference:  # the pipeline's process layout without the fast path: separates layout from kernels
        lanes.append(Lane(f"plain-{workers}x{threads}", PLAIN, workers, threads, True))
    if peer:
        lanes.append(Lane("peer", PEER_SETTINGS, workers, threads, True, model="peer"))
    lanes.append(Lane("fast", fast, workers, threads, True))
    if bf16:
        lanes.append(Lane("bf16", fast, workers, threads, True, precision="bf16"))
    if diagnostics:  # the fast lane as the pipeline runs it, recording the diagnostics: their overhead
        lanes.append(Lane("diagnostics", fast, workers, threads, True, diagnostics=True))
    if batched:  # on the CPU a correctness demonstration of the GPU design, not a speed-up
        lanes.append(Lane("batched", fast, 1, 0, False, batched=True))
    return lanes



def sweep_runs(params: dict, n: int) -> list[tuple[str, int, int]]:
    """The sweep's runs, seed-major so that any prefix mixes both norm positions (both graphs get compiled)."""
    settings = Sweep.from_params(params)
    runs = [(norm, warmup, seed) for seed, warmup, norm in itertools.product(settings.seeds, settings.warmups, settings.norms)]
    return runs[:n]



def train_copy_steps(params: dict, norm: str, warmup: int, seed: int, steps: int, fast: FastPath, device="cpu",
                     model_kind: str = "blocklab", precision: str = "fp32", diagnostics: bool = False) -> dict:
    """Train one sweep run for ``steps`` steps with ``train.train``, timing every step. Returns timings and losses.

    The model, data stream and loss are those of ``sweep.train_copy_run``; only checkpoints and files are left out.
    ``model_kind`` "peer" trains ``blocklab.model.peer``'s model of the same size instead (``fast`` then only sets fused
    Adam and compile); ``precision`` as ``sweep.precision``; ``diagnostics`` records params' diagnostics (on) as a
    pipeline run does.
    """
    task, settings = CopyTask.from_params(params), Sweep.from_params(params)
    torch._dynamo.reset()  # a pipeline job is a fresh process: it compiles again (the on-disk caches still count)
    began = time.perf_counter()
    cfg = copy_model_config(params, norm)
    check_precision(precision, device)
    if model_kind == "peer":
        model = build_peer_model(cfg, seed).to(device)
    else:
        model = build_copy_model(cfg, seed).to(device)
        apply_fast_path(model, fast)
    step_starts = []

    def next_batch(gen):
        step_starts.append(time.perf_counter())
        return copy_batch(task.batch_size, task.seq_len, task.vocab_size, gen, device=device)

    def loss_fn(m, batch):
        inputs, targets = batch
        return copy_loss(m(inputs).float(), targets)

    recorder = None
    if diagnostics:
        from ..training.diagnostics import Recorder, check_settings

        settings_d = check_settings(params.get("diagnostics") or {"enabled": True})
        recorder = Recorder(model, settings_d["metrics"], settings_d["every"])
    result = train(
        model, next_batch, loss_fn, steps=steps, lr=settings.lr, warmup=warmup,
        generator=torch.Generator().manual_seed(seed), compile=fast.compile, fused_adam=fast.fused_adam,
        precision=precision, desc=f"bench {norm}-w{warmup}-s{seed}", diagnostics=recorder,
    )
    ended = time.perf_counter()
    bounds = step_starts + [ended]
    return {
        "run": f"{norm}-w{warmup}-s{seed}", "norm": norm, "warmup": warmup, "seed": seed,
        "setup_s": step_starts[0] - began if step_starts else ended - began,
        "step_s": [b - a for a, b in zip(bounds, bounds[1:])],
        "total_s": ended - began, "losses": result.losses, "diverged_step": result.diverged_step,
        "threads": torch.get_num_threads(), "pid": os.getpid(),
    }

