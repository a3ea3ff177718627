"""The cost plan's measurement (docs/lab.md): one training step of every norm position at document 000's setup, on
the sweep's fast path, one thread, interleaved rounds (ratios to pre-norm measured in the same process)."""
import statistics
import sys
import time

import torch

from blocklab.model_config import NORM_POSITIONS
from blocklab.lab.spec import model_config, profile_setup
from blocklab.model.fastpath import FastPath, apply_fast_path
from blocklab.params_file import load_params
from blocklab.training.copy_model import build_copy_model
from blocklab.training.tasks import copy_batch, copy_loss

torch.set_num_threads(1)
setup = profile_setup(load_params("params.yaml"), "document")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
models = {}
for norm in NORM_POSITIONS:
    model = build_copy_model(model_config(setup, norm), 0)
    apply_fast_path(model, FastPath())
    models[norm] = (model, torch.optim.Adam(model.parameters(), lr=1e-3, fused=True))
batch = copy_batch(setup.batch_size, setup.seq_len, setup.vocab_size, torch.Generator().manual_seed(0))
times = {n: [] for n in NORM_POSITIONS}
for r in range(rounds + 1):
    for norm, (model, opt) in models.items():
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        copy_loss(model(batch[0]), batch[1]).backward()
        opt.step()
        if r:  # round 0 warms up
            times[norm].append(time.perf_counter() - start)
pre = statistics.median(times["pre"])
for norm in NORM_POSITIONS:
    med = statistics.median(times[norm])
    print(f"{norm:9s} {med:6.2f} s/step  x{med / pre:.2f} of pre  ({setup.steps} steps: {med * setup.steps / 60:.0f} min)")
