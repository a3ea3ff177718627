"""Same-process A/B of the training diagnostics' cost: a fast step without them, with REV's diagnostics
(loaded from git) and with the working tree's, one thread, steps alternating.

Three copies of the sweep's copy-task model of params.yaml (fast path, fused Adam, its batch; post-norm, seed 0), each
trained through ``train._make_step`` as a pipeline run is: ``fast`` records nothing, ``before`` and ``now`` record every
diagnostic at every step (params' ``diagnostics``, ``every`` forced to 1). Every round trains one step of each on the
same batch, in an order that rotates, so that load drifting from minute to minute hits all of them alike. Each step is
timed twice: wall time, and the thread's CPU time (``time.thread_time``: on a machine loaded by other jobs, the time this
one thread computed, without the time it waited for a core; memory and cache contention remain in it). Prints the median
step of each, and each one's overhead over ``fast`` as the median of the rounds' ratios with its quartiles; checks that
the three give bit-identical losses. `python performance/ab_diagnostics.py [rounds] [rev]` (defaults 12 and 90d4296, the
last commit before the diagnostics were made cheap), from the repository root.
"""
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from blocklab.model.fastpath import FastPath, apply_fast_path, tune_allocator
from blocklab.params_file import load_params
from blocklab.training import diagnostics as now
from blocklab.training import sweep
from blocklab.training.tasks import copy_batch, copy_loss
from blocklab.training.train import _make_step


def load_diagnostics(rev: str):
    """REV's training/diagnostics.py as the module blocklab.training._diagnostics_<rev>."""
    source = subprocess.run(["git", "show", f"{rev}:src/blocklab/training/diagnostics.py"], capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / f"_diagnostics_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"blocklab.training._diagnostics_{rev}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def lanes(params: dict, modules: dict) -> dict:
    """name -> step function (batch, step number) -> loss, each on its own copy of the seed-0 model."""
    out = {}
    for name, module in modules.items():
        model = apply_fast_path(sweep.build_copy_model(sweep.copy_model_config(params, "post"), 0), FastPath())
        opt = torch.optim.Adam(model.parameters(), lr=params["sweep"]["lr"], fused=True)
        recorder = None
        if module is not None:
            settings = module.check_settings({**params["diagnostics"], "enabled": True, "every": 1})
            recorder = module.Recorder(model, settings["metrics"], 1)
        out[name] = _make_step(model, lambda m, b: copy_loss(m(b[0]).float(), b[1]), opt, False, "fp32", recorder)
    return out


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main(rounds: int, rev: str) -> None:
    torch.set_num_threads(1)
    tune_allocator()
    params = load_params("params.yaml")
    task = params["copy_task"]
    steps = lanes(params, {"fast": None, "before": load_diagnostics(rev), "now": now})
    names = list(steps)
    gen = torch.Generator().manual_seed(0)
    times, cpu, losses = {n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names}
    for r in range(rounds + 2):  # the first two rounds warm up and are dropped
        batch = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], gen)
        order = names[r % len(names):] + names[:r % len(names)]
        line = []
        for name in order:
            began, began_cpu = time.perf_counter(), time.thread_time()
            losses[name].append(steps[name](batch, r + 1))
            took, took_cpu = time.perf_counter() - began, time.thread_time() - began_cpu
            if r >= 2:
                times[name].append(took)
                cpu[name].append(took_cpu)
            line.append(f"{name} {took:.3f} ({took_cpu:.3f} CPU)")
        print(f"round {r + 1}{' (warm-up)' if r < 2 else ''}: " + ", ".join(line) + " s", flush=True)
    assert losses["before"] == losses["fast"] and losses["now"] == losses["fast"], "the diagnostics changed a loss"
    print(f"losses bit-identical in all three over {rounds + 2} steps")
    print(f"batch {task['batch_size']}, one thread, {rounds} rounds; before = {rev}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for clock, data in (("wall", times), ("CPU", cpu)):
        print(f"-- {clock} time")
        for name in names:
            print(f"{name:>7}: median step {statistics.median(data[name]):.3f} s")
        for name in ("before", "now"):
            ratios = [d / f - 1 for d, f in zip(data[name], data["fast"])]
            lo, mid, hi = quartiles(ratios)
            print(f"{name:>7} overhead over fast: {mid:+.1%} (quartiles {lo:+.1%} / {hi:+.1%}; "
                  f"ratio of medians {statistics.median(data[name]) / statistics.median(data['fast']) - 1:+.1%})")
        ratios = [b / n for b, n in zip(data["before"], data["now"])]
        lo, mid, hi = quartiles(ratios)
        print(f"before / now: {mid:.3f}x (quartiles {lo:.3f} / {hi:.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12, sys.argv[2] if len(sys.argv) > 2 else "90d4296")
