"""Same-process A/B of two ways of putting the fast path in place: the run-time class swap of REV (the old
``model/fastpath.py``, loaded from git) against the module replacement of the working tree.

Both models are the sweep's copy-task model from the same seed, with the fast path and fused Adam, on one thread; every
round trains one step of each on the same batch, in an order that alternates, so that load drifting from minute to
minute hits both alike. Prints each round's step times, then the median old/new ratio with its quartiles, and checks
that the two give bit-identical losses at every step. `python performance/ab_fastpath.py [rounds] [rev]` (defaults 30 and
5e7c1ba, the last commit with the class swap), from the repository root.
"""
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from blocklab.model import fastpath as new
from blocklab.params_file import load_params
from blocklab.training import sweep
from blocklab.training.tasks import copy_batch, copy_loss


def load_old(rev: str):
    """REV's model/fastpath.py as the module blocklab.model._fastpath_old (its relative imports resolve as before)."""
    source = subprocess.run(["git", "show", f"{rev}:src/blocklab/model/fastpath.py"], capture_output=True, text=True,
                            check=True).stdout
    path = Path(tempfile.mkdtemp()) / "_fastpath_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("blocklab.model._fastpath_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(rounds: int, rev: str) -> None:
    torch.set_num_threads(1)
    new.tune_allocator()
    old = load_old(rev)
    params = load_params("params.yaml")
    task, lr = params["copy_task"], params["sweep"]["lr"]
    models = {}
    for norm in ("post", "pre"):
        for name, module in (("old", old), ("new", new)):
            model = module.apply_fast_path(sweep.build_copy_model(sweep.copy_model_config(params, norm), 0), module.FastPath())
            models[name, norm] = model, torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    assert any(type(m).__name__ == "ShortCausalAttention" for m in models["new", "pre"][0].modules())
    gen = torch.Generator().manual_seed(0)
    times, ratios, identical = {"old": [], "new": []}, [], 0
    for r in range(rounds + 2):  # the first two rounds warm up and are dropped
        norm = ("post", "pre")[r % 2]
        x, y = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], gen)
        step, loss = {}, {}
        for name in (("old", "new") if r % 4 < 2 else ("new", "old")):
            model, opt = models[name, norm]
            began = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            value = copy_loss(model(x), y)
            value.backward()
            opt.step()
            step[name], loss[name] = time.perf_counter() - began, value.item()
        assert loss["old"] == loss["new"], f"round {r}: losses differ, {loss['old']!r} vs {loss['new']!r}"
        identical += 1
        if r >= 2:
            for name in step:
                times[name].append(step[name])
            ratios.append(step["old"] / step["new"])
            print(f"round {r - 1:3d} {norm:4s}: old {step['old']:.3f} s  new {step['new']:.3f} s  old/new {ratios[-1]:.3f}",
                  flush=True)
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    print(f"old {statistics.median(times['old']):.3f} s/step, new {statistics.median(times['new']):.3f} s/step (medians of"
          f" {len(ratios)} steps); old/new per round: median {median:.3f}, quartiles {q1:.3f}-{q3:.3f};"
          f" losses bit-identical in all {identical} rounds")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30, sys.argv[2] if len(sys.argv) > 2 else "5e7c1ba")
