"""Same-process A/B of the bench's models, one thread, alternating steps: the lane ratios on a loaded machine.

Every round trains one step of each model (plain, peer, fast, bf16, peer-bf16) in a rotated order, so that load that
drifts from minute to minute hits all of them alike; the result is the median step time of each over the rounds.
`python performance/ab_lanes.py [rounds]` (default 10, after 2 warm-up rounds). Not part of `blocklab bench`: a check of its
ratios where the process-level lanes cannot be trusted (a machine loaded by other jobs).
"""
import statistics
import sys
import time

import torch

from blocklab.model.fastpath import PLAIN, FastPath, apply_fast_path, tune_allocator
from blocklab.model.peer import build_peer_model
from blocklab.params_file import load_params
from blocklab.training import sweep
from blocklab.training.precision import autocast
from blocklab.training.tasks import copy_batch, copy_loss

torch.set_num_threads(1)
tune_allocator()  # process-wide: every lane gets it (the fast lane's allocator gain is not in these ratios)
params = load_params("params.yaml")
task, lr = params["copy_task"], params["sweep"]["lr"]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10


def lane(kind, norm):
    cfg = sweep.copy_model_config(params, norm)
    if kind.startswith("peer"):
        model, fused = build_peer_model(cfg, 0), True
    else:
        model = apply_fast_path(sweep.build_copy_model(cfg, 0), PLAIN if kind == "plain" else FastPath())
        fused = kind != "plain"
    return model, torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None), "bf16" if kind.endswith("bf16") else "fp32"


kinds = ["plain", "peer", "fast", "bf16", "peer-bf16"]
models = {(k, n): lane(k, n) for k in kinds for n in ("post", "pre")}
gen = torch.Generator().manual_seed(0)
times = {key: [] for key in models}
for r in range(rounds + 2):
    norm = ("post", "pre")[r % 2]
    order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
    for k in order:
        model, opt, precision = models[(k, norm)]
        x, y = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], gen)
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast(precision, "cpu"):
            loss = copy_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        if r >= 2:
            times[(k, norm)].append(time.perf_counter() - began)
step = {k: statistics.median(times[(k, "post")] + times[(k, "pre")]) for k in kinds}
best = min(("plain", "peer"), key=step.get)
for k in kinds:
    print(f"{k:>9}: {step[k]:.3f} s/step (median of {2 * (rounds // 2)} steps, post and pre)   "
          f"{step[best] / step[k]:.2f}x {best}   {step['fast'] / step[k]:.2f}x fast")
