"""Subnormal numbers in a trained run's backward pass, and what they cost a step.

A float32 below ``torch.finfo(torch.float32).tiny`` (1.18e-38) but not zero is subnormal; x86 processors compute
with such numbers on a slow path. A run whose lower blocks receive gradients that small (post-norm's vanishing
gradient, taken far enough) trains many times slower a step for that reason alone. The probe reads a finished run's
final weights, takes one copy-task batch, and measures (1) the share of subnormal entries among the gradients that
flow out of every layer in the backward pass (each leaf module's output gradient) and among the parameters' gradients,
over the model and per block, and (2) the forward and backward pass's seconds with subnormals kept, as training kept
them, and flushed to zero (``torch.set_flush_denormal``), on one thread as the runs trained: the ratio is the slow
path's cost, and the runs without subnormal entries are the control (their ratio is the timing's own spread). The
probe runs the model's plain modules; training ran the fast path (``model.fastpath``: the same arithmetic in fewer
kernels), whose own seconds a step the table carries beside the probe's (``s_per_step_trained``).
"""
from __future__ import annotations

import re
import time
import warnings
from pathlib import Path

import pandas as pd
import torch

from ..model_config import ConfigError, ModelConfig

SUBNORMAL_BELOW = torch.finfo(torch.float32).tiny
BATCH_SEED = 0  # the probe's one copy-task batch
UNDERFLOWING = 0.01  # a block "underflows" when over 1 % of its backward-pass gradient entries are subnormal
COLUMNS = ["run", "block", "lr", "seed", "s_per_step_trained", "subnormal_backward", "subnormal_params",
           "blocks_underflowing", "n_blocks", "s_kept", "s_flushed", "flush_supported", "cpu"]


def subnormal(t: torch.Tensor) -> int:
    """How many entries of ``t`` are subnormal (non-zero and below the smallest normal float32)."""
    return int(((t != 0) & (t.abs() < SUBNORMAL_BELOW)).sum())


def _part(name: str) -> str:
    found = re.search(r"(?:^|\.)blocks\.(\d+)(?:\.|$)", name)
    return f"block {int(found.group(1))}" if found else "other"


def gradient_underflow(model: torch.nn.Module) -> pd.DataFrame:
    """After a backward pass: per stack block (``blocks.<i>``; other parameters as ``other``) its parameters' gradient
    entries and how many of them are subnormal."""
    rows: dict[str, list[int]] = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        counts = rows.setdefault(_part(name), [0, 0])
        counts[0] += subnormal(p.grad)
        counts[1] += p.grad.numel()
    return pd.DataFrame([{"part": k, "subnormal": s, "entries": n} for k, (s, n) in rows.items()])


def backward_underflow(model: torch.nn.Module, step) -> pd.DataFrame:
    """Run ``step`` (a forward and backward pass) with a hook on every leaf module that counts the subnormal entries
    of the gradient flowing out of it (its output's gradient); per block as in ``gradient_underflow``."""
    rows: dict[str, list[int]] = {}

    def hook(name):
        def count(module, grad_input, grad_output):
            for g in grad_output:
                if g is not None and g.is_floating_point():
                    counts = rows.setdefault(_part(name), [0, 0])
                    counts[0] += subnormal(g)
                    counts[1] += g.numel()
        return count

    handles = [m.register_full_backward_hook(hook(name)) for name, m in model.named_modules()
               if name and not any(True for _ in m.children())]
    try:
        with warnings.catch_warnings():  # the embedding's input is integer tokens: its hook sees its output's gradient
            warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with "
                                    "respect to module outputs since no inputs require gradients")
            step()
    finally:
        for h in handles:
            h.remove()
    return pd.DataFrame([{"part": k, "subnormal": s, "entries": n} for k, (s, n) in rows.items()])


def _seconds(step, repeats: int, flush: bool) -> float:
    """The fastest of ``repeats`` calls of ``step`` with subnormals flushed to zero or kept (then kept again)."""
    torch.set_flush_denormal(flush)
    try:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        torch.set_flush_denormal(False)


def probe_run(run_dir: Path | str, repeats: int = 2) -> dict:
    """One finished run of the LR study (its meta.json, loss.csv and model.safetensors, checked against their
    checksums): the row of ``COLUMNS``."""
    from safetensors.torch import load_file

    from ..integrity import read_run, verify_run
    from ..model.models import DecoderLM
    from ..provenance import cpu_name
    from ..runtime import set_threads
    from ..training.tasks import copy_batch, copy_loss

    run_dir = Path(run_dir)
    if not (run_dir / "model.safetensors").is_file():
        raise ConfigError(f"{run_dir}: no model.safetensors; the probe reads a finished run's final weights")
    meta = verify_run(run_dir)
    _, loss = read_run(run_dir)
    set_threads(1)
    cfg = ModelConfig.from_dict(meta["model_config"])
    model = DecoderLM(cfg)
    model.load_state_dict(load_file(str(run_dir / "model.safetensors")))
    task = meta["copy_task"]
    inputs, targets = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"],
                                 torch.Generator().manual_seed(BATCH_SEED))

    def step():
        model.zero_grad(set_to_none=True)
        copy_loss(model(inputs).float(), targets).backward()

    supported = torch.set_flush_denormal(False)  # whether the processor can flush them (x86 with SSE3)
    kept = _seconds(step, repeats, flush=False)
    flushed = _seconds(step, repeats, flush=True) if supported else float("nan")
    stream = backward_underflow(model, step)  # a pass of its own, untimed, with subnormals kept as training kept them
    params = gradient_underflow(model)
    blocks = stream[stream["part"].str.startswith("block ")]
    return {"run": run_dir.name, "block": meta["norm"], "lr": float(meta["sweep"]["lr"]), "seed": int(meta["seed"]),
            "s_per_step_trained": float(meta["wall_time_s"]) / len(loss),
            "subnormal_backward": stream["subnormal"].sum() / stream["entries"].sum(),
            "subnormal_params": params["subnormal"].sum() / params["entries"].sum(),
            "blocks_underflowing": int((blocks["subnormal"] > UNDERFLOWING * blocks["entries"]).sum()),
            "n_blocks": int(cfg.n_layers), "s_kept": kept, "s_flushed": flushed, "flush_supported": bool(supported),
            "cpu": cpu_name() or ""}


def probe_runs(runs: Path | str, repeats: int = 2) -> pd.DataFrame:
    """Every finished run folder in ``runs`` (a meta.json), in name order."""
    runs = Path(runs)
    if not runs.is_dir():
        raise ConfigError(f"--runs {str(runs)!r} is not a folder of run folders")
    found = [d for d in sorted(runs.iterdir()) if (d / "meta.json").is_file()]
    if not found:
        raise ConfigError(f"--runs {str(runs)!r} holds no finished run (a folder with meta.json)")
    from tqdm import tqdm

    return pd.DataFrame([probe_run(d, repeats) for d in tqdm(found, desc="underflow probe", unit="run")],
                        columns=COLUMNS)


def summary(table: pd.DataFrame) -> dict:
    """The probe's runs read together: ``cells``, one row a (block, lr) cell with any subnormal entry in a run's
    backward pass (its runs, and the lowest and highest backward share, parameter share, blocks underflowing,
    kept/flushed ratio and training seconds a step); ``control``, the runs with none (how many, their ratio's median
    and maximum: the timing's own spread, and their median seconds a step); ``rho``, ``p``: Spearman's rank correlation
    of the backward share with the ratio over every run (``scipy.stats.spearmanr``); ``underflowing``, the runs with
    a block over ``UNDERFLOWING``."""
    from scipy import stats

    table = table.assign(ratio=table["s_kept"] / table["s_flushed"])
    hit = table["subnormal_backward"] > 0
    cells = (table[hit].groupby(["block", "lr"])
             .agg(runs=("run", "size"), backward_low=("subnormal_backward", "min"),
                  backward_high=("subnormal_backward", "max"), params_low=("subnormal_params", "min"),
                  params_high=("subnormal_params", "max"), blocks_low=("blocks_underflowing", "min"),
                  blocks_high=("blocks_underflowing", "max"), n_blocks=("n_blocks", "max"),
                  ratio_low=("ratio", "min"), ratio_high=("ratio", "max"),
                  s_low=("s_per_step_trained", "min"), s_high=("s_per_step_trained", "max"))
             .sort_values("backward_high", ascending=False).reset_index())
    quiet = table[~hit]
    rho, p = stats.spearmanr(table["subnormal_backward"], table["ratio"]) if len(table) > 2 else (float("nan"),) * 2
    return {"runs": len(table), "with_any": int(hit.sum()),
            "underflowing": int((table["blocks_underflowing"] > 0).sum()), "cells": cells,
            "control": {"runs": len(quiet), "ratio": quiet["ratio"].median(), "ratio_max": quiet["ratio"].max(),
                        "s_per_step": quiet["s_per_step_trained"].median()},
            "rho": float(rho), "p": float(p)}
