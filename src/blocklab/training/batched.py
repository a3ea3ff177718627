"""Several runs of one architecture trained as one member-stacked model: the sweep's design for a GPU.

On a GPU one run of the copy model is too small to fill the device (kernel launches, not FLOPs, bound it), so each
norm position's runs train together through ``torch.func.vmap`` over stacked weights. Each member keeps its own
seed, data stream, warm-up and divergence stop, so it reproduces ``train.train``'s run up to float rounding
(tests/test_fast_path.py). Used by ``blocklab sweep train-group`` (``sweep.batched``) and by ``blocklab bench``.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..model_config import NORM_POSITIONS
from ..model.fastpath import PLAIN, FastPath, fuse_layernorms, use_math_attention
from ..params_file import load_params
from ..runtime import resolve_device, set_threads
from ..run_settings import CopyTask, Sweep
from . import copy_model, sweep
from .precision import autocast, check_precision
from .tasks import copy_batch, copy_loss
from .diagnostics import table as diagnostics_table
from .train import TrainResult, warmup_factor, write_run

log = logging.getLogger("blocklab.batched")


def flat_members(stacked: dict) -> tuple[torch.Tensor, dict]:
    """All members' parameters as one (members, parameters) tensor, each stacked parameter a leaf view into it.

    Adam is elementwise, so it then updates every parameter of every member with a handful of kernels instead of
    six per parameter tensor (on a GPU, hundreds of kernel launches a step fewer).
    """
    members = next(iter(stacked.values())).shape[0]
    flat = torch.cat([w.detach().reshape(members, -1) for w in stacked.values()], dim=1)
    views, offset = {}, 0
    for name, w in stacked.items():
        size = w[0].numel()
        views[name] = flat[:, offset:offset + size].view(w.shape).requires_grad_()
        offset += size
    return flat, views


def adam_members(flat: torch.Tensor, grad: torch.Tensor, state: dict, lrs, step: int, betas=(0.9, 0.999), eps=1e-8) -> None:
    """torch.optim.Adam's update (its single-tensor form) on (members, parameters) tensors, one learning rate a member.

    Adam is elementwise, so stacking members changes nothing but the learning rate, which differs per warm-up.
    """
    beta1, beta2 = betas
    step_size = lrs / (1 - beta1**step)
    root_bias2 = math.sqrt(1 - beta2**step)
    with torch.no_grad():
        if not state:
            state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(flat), torch.zeros_like(flat)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / root_bias2).add_(eps)
        flat.sub_(exp_avg.div(denom).mul_(step_size.view(-1, 1)))


def train_copy_group_batched(params: dict, norm: str, runs: list[tuple[int, int]], steps: int, device="cpu",
                             fast: FastPath = PLAIN, precision: str = "fp32") -> list[dict]:
    """Train several runs of one norm position as one member-stacked model (torch.func.vmap over stacked weights).

    ``runs`` are (warmup, seed) pairs. Each member draws its own batches from its own seeded generator and follows
    its own warm-up, so each reproduces ``train.train``'s run up to float rounding (tests/test_fast_path.py). A
    member whose loss turns non-finite is recorded as diverged at that step and keeps the weights it had there, as
    ``train.train`` would. Meant for one GPU, where per-run kernels are too small to fill the device; on the CPU it
    only proves the numbers (it is no faster there). ``precision`` "bf16": forward and loss under bf16 autocast, the
    stacked weights, gradients and Adam in fp32, as ``train.train`` does.
    """
    from torch.func import functional_call, stack_module_state, vmap

    task, settings = CopyTask.from_params(params), Sweep.from_params(params)
    began = time.perf_counter()
    cfg = copy_model.copy_model_config(params, norm)
    models = [copy_model.build_copy_model(cfg, seed).to(device) for _, seed in runs]
    for model in models:
        use_math_attention(model)  # attention vmap can batch, on every device
        if fast.fused_layernorm:
            fuse_layernorms(model)
    stacked, buffers = stack_module_state(models)
    flat, stacked = flat_members(stacked)
    template = copy.deepcopy(models[0]).to("meta")
    del models

    def member_loss(weights, bufs, inputs, targets):
        return copy_loss(functional_call(template, (weights, bufs), (inputs,)).float(), targets)

    batched_loss = vmap(member_loss)
    if fast.compile:
        batched_loss = torch.compile(batched_loss, dynamic=False)
    generators = [torch.Generator().manual_seed(seed) for _, seed in runs]
    losses, diverged, frozen, state, step_starts = [[] for _ in runs], [None] * len(runs), {}, {}, []
    for step in range(1, steps + 1):
        step_starts.append(time.perf_counter())
        batches = [copy_batch(task.batch_size, task.seq_len, task.vocab_size, g, device=device) for g in generators]
        inputs, targets = (torch.stack(parts) for parts in zip(*batches))
        with autocast(precision, device):
            member_losses = batched_loss(stacked, buffers, inputs, targets)
        grads = torch.autograd.grad(member_losses.sum(), list(stacked.values()))
        grad = torch.cat([g.reshape(len(runs), -1) for g in grads], dim=1)
        for k, value in enumerate(member_losses.tolist()):
            if diverged[k] is None and not math.isfinite(value):
                diverged[k] = step  # train.train stops here without applying the step: keep these weights
                frozen[k] = flat[k].clone()
            elif diverged[k] is None:
                losses[k].append(value)
        lrs = torch.tensor([settings.lr * warmup_factor(step, w) for w, _ in runs], device=device)
        adam_members(flat, grad, state, lrs, step)
        if len(frozen) == len(runs):
            break
    ended = time.perf_counter()
    with torch.no_grad():
        for k, weights in frozen.items():
            flat[k].copy_(weights)
    bounds = step_starts + [ended]
    share = 1 / len(runs)  # the group's wall time, split evenly: summing members gives the group's time back
    return [{
        "run": f"{norm}-w{w}-s{seed}", "norm": norm, "warmup": w, "seed": seed, "group_size": len(runs),
        "setup_s": (step_starts[0] - began) * share, "step_s": [(b - a) * share for a, b in zip(bounds, bounds[1:])],
        "total_s": (ended - began) * share, "losses": losses[k], "diverged_step": diverged[k],
        "weights": {name: weights[k].detach() for name, weights in stacked.items()},  # model.named_parameters() keys
        "threads": torch.get_num_threads(), "pid": os.getpid(),
    } for k, (w, seed) in enumerate(runs)]


def group_runs(params: dict) -> list[tuple[int, int]]:
    """The (warm-up, seed) pairs one norm position's batched job trains, in a fixed order."""
    settings = Sweep.from_params(params)
    return [(warmup, seed) for warmup in settings.warmups for seed in settings.seeds]


def train_copy_group(params: dict, norm: str, out_root: Path, device: str = "cpu") -> list[dict]:
    """Train every run of one norm position as one member-stacked model; write each run's usual artifacts.

    Each run directory gets the loss.csv, model.safetensors and meta.json that ``train_copy_run`` writes, with the
    same numbers up to float rounding (tests/test_fast_path.py). There are no checkpoints: on the GPU this job is
    meant for, the whole group takes seconds, and an interrupted group is trained again from the start.
    """
    settings = Sweep.from_params(params)
    device = resolve_device(device)
    precision = check_precision(settings.precision, device)
    runs = group_runs(params)
    fast = replace(FastPath() if settings.fast_path else PLAIN, compile=settings.compile)
    members = train_copy_group_batched(params, norm, runs, settings.steps, str(device), fast, precision)
    cfg = copy_model.copy_model_config(params, norm)
    group = [sweep.run_name(norm, warmup, seed) for warmup, seed in runs]
    group_seconds = sum(member["total_s"] for member in members)
    metas = []
    for (warmup, seed), member in zip(runs, members):
        steps = list(range(1, len(member["losses"]) + 1))
        result = TrainResult(steps=steps, losses=member["losses"], diverged_step=member["diverged_step"],
                             lrs=[settings.lr * warmup_factor(step, warmup) for step in steps], seconds=member["total_s"])
        model = copy_model.build_copy_model(cfg, seed)
        missing, unexpected = model.load_state_dict(member["weights"], strict=False)
        buffers = {name for name, _ in model.named_buffers()}
        if unexpected or set(missing) - buffers:
            raise RuntimeError(f"batched weights do not fit the model: missing {missing}, unexpected {unexpected}")
        # the vmapped path records no diagnostics (its members share one forward): said in meta.json, empty table
        meta = sweep.run_meta(params, cfg, norm, warmup, seed, device, result, diagnostics=None,
                              batched_group=group, group_wall_time_s=round(group_seconds, 2))
        write_run(Path(out_root) / sweep.run_name(norm, warmup, seed), result, model, meta, diagnostics_table([]))
        metas.append(meta)
    return metas


def register(subparsers) -> None:
    p = subparsers.add_parser("train-group", help="train all runs of one norm position as one batched job (GPU)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--norm", required=True, choices=NORM_POSITIONS)
    p.add_argument("--out-root", required=True, type=Path, help="each run goes to OUT_ROOT/<norm>-w<warmup>-s<seed>/")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: params threads_per_run)")
    p.set_defaults(func=_train_group_main)


def _train_group_main(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    set_threads(args.threads or params["threads_per_run"])
    for meta in train_copy_group(params, args.norm, args.out_root, params["device"]):
        log.info("%s %s (group of %d in %.1f s)", meta["run"], meta["status"], len(meta["batched_group"]), meta["group_wall_time_s"])
