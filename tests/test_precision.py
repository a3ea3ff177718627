"""sweep.precision: bf16 tracks fp32, is a different run for the cache, and bad values or missing units are refused.

Tolerance of the bf16-vs-fp32 loss comparison (tiny configuration, sweep.steps = 60, lr 1e-3, both norm positions):
bf16 keeps 8 significand bits, so one rounding has relative error at most u = 2^-8 ~ 0.39 %. Under autocast only the
operands of the matrix products are rounded (one rounding each, so at most ~2u on each product) and the products
accumulate in fp32; the residual stream, LayerNorm statistics, the logits' cross-entropy (the logits are cast to
float first), the weights and Adam stay fp32, so the errors of successive blocks add to an fp32 stream instead of
multiplying. The cross-entropy of a token moves by at most 2 ||delta logits||_inf (its gradient p - onehot has l1 norm
<= 2), so at equal weights the loss moves by a few u relative at most. Across steps Adam normalizes each update to ~lr
whatever the gradient's rounding, so the two weight trajectories part by ~N * lr * O(u) per weight (60 * 1e-3 * 4e-3
~ 2.4e-4, small against weights of ~0.1): the per-step difference stays at the rounding level and does not compound
over this run. Bound asserted: every step's |loss_bf16 - loss_fp32| <= 4u * loss_fp32 (2^-6 ~ 1.6 %), and the mean
over steps <= u. Observed on the Sapphire Rapids test machine: max 1.4e-4 relative, mean 4.5e-5 (the loss of the
tiny run stays near ln 64, where it is least sensitive to the logits). Not claimed: agreement over a long run whose
trajectory is chaotic (a post-norm run near divergence): that is what the sensitivity study's verdicts measure.
"""
import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from blocklab.model_config import ConfigError
from blocklab.params_file import ParamsError, load_params, validate_params
from blocklab.pipeline import training_settings
from blocklab.training import precision as precision_mod
from blocklab.training.precision import autocast, check_precision, cpu_bf16_units
from blocklab.training.sweep import train_copy_run

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
U = 2.0**-8  # bf16 unit roundoff (8 significand bits)
BIN = Path(sys.executable).parent
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (these run in scripts/gpu_check.sh on a GPU machine)")

needs_cpu_bf16 = pytest.mark.skipif(
    not cpu_bf16_units(),
    reason="this CPU has no bf16 units (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo): sweep.precision=bf16 is "
           "refused here, so there is no bf16 run to compare",
)


def _params(precision: str, steps: int | None = None, device: str = "cpu") -> dict:
    params = copy.deepcopy(load_params(TINY))
    params["sweep"]["precision"] = precision
    params["device"] = device
    if steps is not None:
        params["sweep"]["steps"] = steps
    return params


def _device_params(device):
    return pytest.param(device, marks=needs_cuda if device == "cuda" else needs_cpu_bf16, id=device)


@pytest.mark.parametrize("device", [_device_params("cpu"), _device_params("cuda")])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_bf16_losses_track_fp32_within_rounding(tmp_path, norm, device):
    torch.set_num_threads(1)
    losses = {}
    for precision in ("fp32", "bf16"):
        meta = train_copy_run(_params(precision, device=device), norm, 0, 0, tmp_path / precision, device)
        assert meta["sweep"]["precision"] == precision
        losses[precision] = pd.read_csv(tmp_path / precision / "loss.csv")["loss"]
    fp32, bf16 = losses["fp32"], losses["bf16"]
    assert len(fp32) == len(bf16) == _params("fp32")["sweep"]["steps"]
    relative = (bf16 - fp32).abs() / fp32
    assert relative.max() <= 4 * U, f"step {relative.idxmax() + 1}: relative difference {relative.max():.2e} > 4u"
    assert relative.mean() <= U, f"mean relative difference {relative.mean():.2e} > u"
    assert (bf16 != fp32).any(), "bf16 gave fp32's losses bit for bit: autocast did not take effect"


@needs_cpu_bf16
def test_bf16_autocast_keeps_weights_and_loss_fp32():
    from blocklab.training.copy_model import build_copy_model, copy_model_config
    from blocklab.training.tasks import copy_batch, copy_loss

    params = _params("bf16")
    model = build_copy_model(copy_model_config(params, "pre"), 0)
    task = params["copy_task"]
    inputs, targets = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], torch.Generator().manual_seed(0))
    with autocast("bf16", "cpu"):
        logits = model(inputs)
        loss = copy_loss(logits.float(), targets)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())


def test_bad_precision_is_refused_by_the_schema_with_key_and_allowed_values():
    params = _params("fp32")
    params["sweep"]["precision"] = "fp16"
    with pytest.raises(ParamsError, match=re.escape("sweep.precision: 'fp16' is not allowed; allowed values: ['fp32', 'bf16']")):
        validate_params(params)
    del params["sweep"]["precision"]
    with pytest.raises(ParamsError, match=r"sweep: missing required key\(s\) \['precision'\]"):
        validate_params(params)


def test_bf16_without_bf16_units_is_refused_before_any_compute(tmp_path, monkeypatch):
    monkeypatch.setattr(precision_mod, "cpu_bf16_units", lambda: ())
    with pytest.raises(ConfigError, match=r"sweep.precision='bf16' needs bf16 units .*neither of the bf16 instruction sets"
                                          r".*allowed here: sweep.precision='fp32'"):
        check_precision("bf16", "cpu")
    with pytest.raises(ConfigError, match="sweep.precision='bf16' needs bf16 units"):
        train_copy_run(_params("bf16"), "pre", 0, 0, tmp_path / "run")
    assert not any((tmp_path / "run").glob("*")), "nothing may be written before the refusal"
    assert check_precision("fp32", "cpu") == "fp32"
    with pytest.raises(ConfigError, match=re.escape("sweep.precision='fp16' is not allowed; allowed values: ['fp32', 'bf16']")):
        check_precision("fp16", "cpu")


def test_precision_is_part_of_the_rule_params_only_off_the_old_default():
    sweep = _params("fp32")["sweep"]
    loop = ("norms", "warmups", "seeds", "checkpoint_every", "compile", "fast_path", "batched")
    fp32 = training_settings(sweep, *loop)
    assert "precision" not in fp32  # finished fp32 runs (cached before the key existed) stay valid
    bf16 = training_settings({**sweep, "precision": "bf16"}, *loop)
    assert bf16 == {**fp32, "precision": "bf16"}


@needs_cpu_bf16
def test_checkpoint_of_the_other_precision_is_not_resumed(tmp_path):
    from blocklab.training import train as train_mod

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"precision": "fp32"}, run / "checkpoint.pt")  # an fp32 run's checkpoint (a stub: loading it would fail)
    assert train_mod._checkpoint_precision(run / "checkpoint.pt") == "fp32"
    params = _params("bf16", steps=10)
    params["sweep"]["checkpoint_every"] = 5
    meta = train_copy_run(params, "pre", 0, 0, run)  # would fail loading the stub if it tried to resume from it
    assert meta["resumed_from_step"] == 0 and meta["sweep"]["precision"] == "bf16"


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_batched_group_reproduces_the_per_run_jobs(tmp_path, precision):
    """The GPU layout (sweep.batched): each vmapped member gives its per-run job's losses on the same device."""
    from blocklab.training.batched import train_copy_group_batched
    from blocklab.model.fastpath import FastPath

    params = _params(precision, device="cuda")
    runs, steps = [(0, 0), (20, 1)], params["sweep"]["steps"]
    members = train_copy_group_batched(params, "pre", runs, steps, "cuda", FastPath(), precision)
    rtol = 1e-4 if precision == "fp32" else 4 * U  # fp32: other kernels (math attention), same arithmetic
    for (warmup, seed), member in zip(runs, members):
        train_copy_run(params, "pre", warmup, seed, tmp_path / f"w{warmup}-s{seed}", "cuda")
        alone = pd.read_csv(tmp_path / f"w{warmup}-s{seed}" / "loss.csv")["loss"]
        assert member["losses"] == pytest.approx(alone.tolist(), rel=rtol)


def _snakemake(project, *args):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "MPLBACKEND": "Agg",
           "PYTHONPATH": f"{Path(project) / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([str(BIN / "snakemake"), *args], cwd=project, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"snakemake {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _planned(project, target) -> dict:
    out = _snakemake(project, "--dry-run", "--cores", "2", target)
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.skipif(not (BIN / "snakemake").exists(), reason="Snakemake is not installed beside this python")
def test_switching_precision_plans_the_training_jobs_again(snake_project):
    """The cache treats fp32 and bf16 as different runs: after an fp32 sweep, bf16 retrains every run (and only then).
    The fp32 sweep is the session's tiny DAG run (tests/tiny_dag.py); only dry runs here, params.yaml restored."""
    project = snake_project
    target = "data/sweep/summary.csv"
    assert _planned(project, target) == {}
    params = project / "params.yaml"
    text = params.read_text(encoding="utf-8")
    assert "  precision: fp32" in text
    runs = len(load_params(params)["sweep"]["norms"]) * len(load_params(params)["sweep"]["warmups"]) \
        * len(load_params(params)["sweep"]["seeds"])
    params.write_text(text.replace("  precision: fp32", "  precision: bf16", 1), encoding="utf-8")
    try:
        planned = _planned(project, target)
    finally:
        params.write_text(text, encoding="utf-8")
    assert planned.get("train_copy") == runs and planned.get("aggregate_sweep") == 1, planned
    assert _planned(project, target) == {}
