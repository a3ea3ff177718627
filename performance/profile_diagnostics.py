"""Where a diagnostics step's extra time goes, metric by metric: torch.profiler, one thread.

The sweep's copy-task model of params.yaml (fast path, fused Adam, batch of params.yaml) trains STEPS steps without
diagnostics and STEPS steps recording every diagnostic at every step (params' ``diagnostics``, ``every`` forced to 1),
alternating, under the profiler. Each metric's read is wrapped in a ``record_function`` named after it, as are the
Recorder's own moments (``before_update``, ``after_update``, the forward read), so the table gives, per metric, its CPU
time per step and its share of a plain step. `python performance/profile_diagnostics.py [steps] [rev]`, from the repository
root; with REV, the diagnostics module of that git revision is profiled instead of the working tree's.
"""
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from blocklab.model.fastpath import FastPath, apply_fast_path, tune_allocator
from blocklab.params_file import load_params
from blocklab.training import sweep
from blocklab.training.tasks import copy_batch, copy_loss
from blocklab.training.train import _make_step


def load_diagnostics(rev: str | None):
    """The working tree's diagnostics module, or REV's (``ab_diagnostics.load_diagnostics``)."""
    if rev is None:
        from blocklab.training import diagnostics
        return diagnostics
    from ab_diagnostics import load_diagnostics as load
    return load(rev)


def labelled(fn, label):
    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)
    return wrapper


def instrument(diag):
    """Wrap every metric's read and the Recorder's moments in record_function (labels ``diag:<name>``)."""
    for name, metric in list(diag.METRICS.items()):
        object.__setattr__(metric, "read", labelled(metric.read, f"diag:{name}"))
    for moment in ("before_update", "after_update", "_forward_metrics"):
        if hasattr(diag.Recorder, moment):
            setattr(diag.Recorder, moment, labelled(getattr(diag.Recorder, moment), f"diag-moment:{moment}"))
    for helper in ("_attention_stats", "_attention_from", "_causal_entropy", "_causal_stats"):
        if hasattr(diag, helper):
            setattr(diag, helper, labelled(getattr(diag, helper), f"diag-helper:{helper}"))


def main(steps: int, rev: str | None) -> None:
    torch.set_num_threads(1)
    tune_allocator()
    diag = load_diagnostics(rev)
    instrument(diag)
    params = load_params("params.yaml")
    task, lr = params["copy_task"], params["sweep"]["lr"]
    settings = diag.check_settings({**params["diagnostics"], "every": 1})
    lanes = {}
    for name in ("plain", "diag"):
        model = apply_fast_path(sweep.build_copy_model(sweep.copy_model_config(params, "post"), 0), FastPath())
        opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
        recorder = diag.Recorder(model, settings["metrics"], 1) if name == "diag" else None

        def loss_fn(m, batch):
            return copy_loss(m(batch[0]).float(), batch[1])
        lanes[name] = _make_step(model, loss_fn, opt, False, "fp32", recorder)
    gen = torch.Generator().manual_seed(0)
    batches = [copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], gen) for _ in range(steps + 2)]
    for i in range(2):  # warm-up, not profiled
        for name in lanes:
            lanes[name](batches[i], i + 1)
    wall = {name: [] for name in lanes}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2, steps + 2):
            for name in (("plain", "diag") if i % 2 else ("diag", "plain")):
                with record_function(f"step:{name}"):
                    began = time.perf_counter()
                    lanes[name](batches[i], i + 1)
                    wall[name].append(time.perf_counter() - began)
    events = {e.key: e for e in prof.key_averages()}
    plain_ms = events["step:plain"].cpu_time_total / 1e3 / steps
    diag_ms = events["step:diag"].cpu_time_total / 1e3 / steps
    print(f"module: {diag.__name__}; {steps} profiled steps each, batch {task['batch_size']}, one thread")
    print(f"plain step {plain_ms:.1f} ms, diagnostics step {diag_ms:.1f} ms (profiler CPU time; wall medians "
          f"{statistics.median(wall['plain']) * 1e3:.1f} / {statistics.median(wall['diag']) * 1e3:.1f} ms): "
          f"{diag_ms / plain_ms - 1:+.1%}")
    print(f"{'label':<40} {'ms/step':>9} {'% of plain step':>16}")
    for key, e in sorted(events.items(), key=lambda kv: -kv[1].cpu_time_total):
        if key.startswith("diag"):
            ms = e.cpu_time_total / 1e3 / steps
            print(f"{key:<40} {ms:9.2f} {ms / plain_ms:16.2%}")
    print("top ops inside the diagnostics (self CPU time, ms/step):")
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(table)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4, sys.argv[2] if len(sys.argv) > 2 else None)
