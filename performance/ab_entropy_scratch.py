"""In-forward A/B of the attention entropy: ``_causal_stats`` writing m - s into a fresh tensor ("now",
before this change) against writing it over the attention's scores, dead after the softmax ("inplace": the change).

The sweep's copy-task model of params.yaml (fast path, fused Adam, its batch; post-norm, seed 0) trains N steps with
every diagnostic at every step; each call the fast attention makes to ``_causal_stats`` (24 a step) runs one of the
two, alternating call by call (the parity flips every step), timed by the thread's CPU time; the first step's calls
are dropped. Prints each one's median per layer with quartiles and checks that both give the same values.
`python performance/ab_entropy_scratch.py [N]` (default 8), from the repository root.
"""
import statistics
import sys
import time

import torch

from blocklab.model.fastpath import FastPath, apply_fast_path, tune_allocator
from blocklab.params_file import load_params
from blocklab.training import diagnostics as D, sweep
from blocklab.training.tasks import copy_batch, copy_loss
from blocklab.training.train import _make_step
torch.set_num_threads(1)
tune_allocator()
CAUSAL_STATS = D._causal_stats  # the working tree's, before the switch below takes its place


def now(scores, probs):  # _causal_stats before the change: m - s into a fresh tensor
    top_score = D._row_max(scores)
    top_weight = D._row_max(probs)
    spread = torch.sub(top_score.view(scores.shape[:-1] + (1,)), scores).mul_(probs)
    return (torch.nansum(spread) - top_weight.log_().sum()) / top_score.numel(), top_score.max()


def inplace(scores, probs):
    return CAUSAL_STATS(scores, probs, scratch=True)


times = {"now": [], "inplace": []}
calls = [0]


def switch(scores, probs, scratch=False):
    i = calls[0]
    calls[0] += 1
    name = "now" if (i + i // 24) % 2 == 0 else "inplace"
    began = time.thread_time()
    out = (now if name == "now" else inplace)(scores, probs)
    times[name].append(time.thread_time() - began)
    return out


D._causal_stats = switch
params = load_params("params.yaml")
task = params["copy_task"]
model = apply_fast_path(sweep.build_copy_model(sweep.copy_model_config(params, "post"), 0), FastPath())
opt = torch.optim.Adam(model.parameters(), lr=params["sweep"]["lr"], fused=True)
rec = D.Recorder(model, None, 1)
step = _make_step(model, lambda m, b: copy_loss(m(b[0]).float(), b[1]), opt, False, "fp32", rec)
gen = torch.Generator().manual_seed(0)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
for s in range(N):
    step(copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], gen), s + 1)
for n in times:
    t = times[n][12:]  # the first step's calls
    q = statistics.quantiles(t, n=4)
    print(f"{n}: median {statistics.median(t)*1e3:.3f} ms a layer (quartiles {q[0]*1e3:.3f} / {q[2]*1e3:.3f}), {len(t)} calls")
# numerics: same values on the same inputs
sc = torch.randn(256, 63, 63).add_(torch.full((63, 63), float("-inf")).triu_(1))
pr = sc.softmax(-1)
a, b = now(sc.clone(), pr), inplace(sc.clone(), pr)
print("identical:", bool(a[0] == b[0]) and bool(a[1] == b[1]))
print(f"{N} steps, one thread; load average {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
