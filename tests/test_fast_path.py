"""The fast training path of `blocklab bench` gives the plain path's numbers, and the FLOP count behind its GFLOPS.

Tolerances: the fast path changes only the order of float operations (fused LayerNorm, bmm attention, fused Adam),
so single ops agree to ~1e-6 and losses over a few dozen Adam steps to a relative 1e-5 (observed: ~1e-7).
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from blocklab.bench import capture_step_gemms, copy_step_flops, time_gemm_floor, train_copy_steps
from blocklab.fastpath import PLAIN, FastPath, fuse_layernorms, tune_allocator, use_short_causal_attention
from blocklab.config import ModelConfig
from blocklab.layers import Attention, LayerNorm
from blocklab.params import load_params
from blocklab import sweep
from blocklab.sweep import build_copy_model, copy_model_config, train_copy_run
from blocklab.tasks import copy_batch, copy_loss
from blocklab.train import train

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
LOSS_RTOL = 1e-5
FAST = FastPath(compile=False)


def _grads(module, x, upstream):
    x = x.detach().clone().requires_grad_(True)
    module.zero_grad()
    out = module(x)
    out.backward(upstream)
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def test_fused_layernorm_matches_ours_and_torchs():
    torch.manual_seed(0)
    ours, fused, reference = LayerNorm(24), LayerNorm(24), torch.nn.LayerNorm(24)
    with torch.no_grad():
        for m in (ours, fused, reference):
            m.weight.copy_(torch.linspace(0.5, 1.5, 24))
            m.bias.copy_(torch.linspace(-0.2, 0.3, 24))
    assert fuse_layernorms(fused) == 1 and isinstance(fused, LayerNorm)
    x, upstream = torch.randn(3, 5, 24) * 3 + 1, torch.randn(3, 5, 24)
    out, dx, dp = _grads(fused, x, upstream)
    for other in (ours, reference):
        out_o, dx_o, dp_o = _grads(other, x, upstream)
        torch.testing.assert_close(out, out_o, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(dx, dx_o, rtol=1e-5, atol=1e-5)
        for name in dp:
            torch.testing.assert_close(dp[name], dp_o[name], rtol=1e-5, atol=1e-5)


def _attention_by_hand(attn, x):
    """softmax(q k^T / sqrt(hd) + causal mask) v in float64, written out from the definition."""
    b, t, _ = x.shape
    h, hd = attn.n_heads, attn.head_dim
    x = x.double()
    q, k, v = (torch.nn.functional.linear(x, p.weight.double(), p.bias.double()).view(b, t, h, hd).transpose(1, 2)
               for p in (attn.q, attn.k, attn.v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * hd)
    return torch.nn.functional.linear(y, attn.o.weight.double(), attn.o.bias.double())


def test_short_causal_attention_matches_sdpa_and_the_definition():
    cfg = ModelConfig(d_model=32, n_heads=4, n_layers=1, max_len=16)
    torch.manual_seed(1)
    plain = Attention(cfg, causal=True)
    short = Attention(cfg, causal=True)
    short.load_state_dict(plain.state_dict())
    assert use_short_causal_attention(short) == 1
    x, upstream = torch.randn(2, 11, 32), torch.randn(2, 11, 32)
    out, dx, dp = _grads(short, x, upstream)
    out_p, dx_p, dp_p = _grads(plain, x, upstream)
    torch.testing.assert_close(out, out_p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, dx_p, rtol=1e-5, atol=1e-5)
    for name in dp:
        torch.testing.assert_close(dp[name], dp_p[name], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), _attention_by_hand(plain, x), rtol=1e-5, atol=1e-6)


def test_short_attention_leaves_other_attention_kinds_alone():
    cfg = ModelConfig(d_model=16, n_heads=4, n_kv_heads=2, n_layers=1, position="rope", max_len=8)
    torch.manual_seed(2)
    for kwargs in ({"causal": False}, {"causal": True}):
        plain = Attention(cfg, **kwargs)
        short = Attention(cfg, **kwargs)
        short.load_state_dict(plain.state_dict())
        use_short_causal_attention(short)
        x = torch.randn(2, 7, 16)
        assert torch.equal(short(x), plain(x))  # GQA / RoPE / bidirectional take the unchanged SDPA path


def _params(steps, fast_path=False):
    params = load_params(TINY)
    params["sweep"]["steps"] = steps
    params["sweep"]["fast_path"] = fast_path
    return params


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_fast_path_gives_the_pipelines_losses(tmp_path, norm):
    """The reference is the real pipeline function (sweep.train_copy_run -> loss.csv), not the bench's own loop."""
    steps, warmup = 25, 5
    params = _params(steps)
    train_copy_run(params, norm, warmup, 1, tmp_path / "plain")
    reference = pd.read_csv(tmp_path / "plain" / "loss.csv")["loss"].to_numpy()
    fast = train_copy_steps(params, norm, warmup, 1, steps, FAST)
    plain = train_copy_steps(params, norm, warmup, 1, steps, PLAIN)
    assert plain["losses"] == list(reference)  # the bench's plain lane is the pipeline's loop, bit for bit
    assert len(fast["losses"]) == steps and fast["diverged_step"] is None
    torch.testing.assert_close(torch.tensor(fast["losses"], dtype=torch.float64), torch.tensor(reference), rtol=LOSS_RTOL, atol=0)
    assert reference[-1] < reference[0]  # it is training, so agreement is not agreement of constants


def test_pipeline_fast_path_setting_gives_the_plain_losses_and_resumes_across_paths(tmp_path, monkeypatch):
    """sweep.fast_path only changes kernels: a run gives the plain run's losses, and a run checkpointed on one path
    finishes on the other with the same losses (checkpoints hold the same state-dict keys and optimizer state)."""
    steps, warmup = 25, 5
    train_copy_run(_params(steps, fast_path=False), "pre", warmup, 1, tmp_path / "plain")
    train_copy_run(_params(steps, fast_path=True), "pre", warmup, 1, tmp_path / "fast")
    plain, fast = (pd.read_csv(tmp_path / name / "loss.csv")["loss"].to_numpy() for name in ("plain", "fast"))
    torch.testing.assert_close(torch.tensor(fast), torch.tensor(plain), rtol=LOSS_RTOL, atol=0)
    assert plain[-1] < plain[0]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    mixed = _params(steps, fast_path=False)
    mixed["sweep"]["checkpoint_every"] = 10
    monkeypatch.setattr(sweep, "write_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_copy_run(mixed, "pre", warmup, 1, tmp_path / "mixed")
    monkeypatch.undo()
    assert (tmp_path / "mixed" / "checkpoint.pt").exists() and not (tmp_path / "mixed" / "meta.json").exists()
    mixed["sweep"]["fast_path"] = True
    meta = train_copy_run(mixed, "pre", warmup, 1, tmp_path / "mixed")
    assert meta["resumed_from_step"] == 20
    resumed = pd.read_csv(tmp_path / "mixed" / "loss.csv")["loss"].to_numpy()
    assert resumed[:20].tolist() == plain[:20].tolist()
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(plain), rtol=LOSS_RTOL, atol=0)


def test_fast_path_keeps_weights_and_state_dict_keys():
    params = _params(12)
    cfg = copy_model_config(params, "pre")
    task = params["copy_task"]

    def run(fast: bool):
        model = build_copy_model(cfg, 3)
        if fast:
            fuse_layernorms(model)
            use_short_causal_attention(model)
        gen = torch.Generator().manual_seed(3)
        train(model, lambda g: copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], g),
              lambda m, b: copy_loss(m(b[0]), b[1]), steps=12, lr=1e-3, warmup=0, generator=gen, fused_adam=fast)
        return model.state_dict()

    plain, fast = run(False), run(True)
    assert list(plain) == list(fast)
    # A key bias adds the same q.b_k to every score of a query, which softmax cancels: its true gradient is 0, its
    # computed one is rounding noise, and Adam turns noise into lr-sized steps of either sign. It moves in both
    # paths, differently, without changing any output, so it is the one tensor not compared.
    free = {n for n in plain if n.endswith("attn.sublayer.k.bias")}
    model = build_copy_model(cfg, 3)
    model.load_state_dict(plain)
    inputs = copy_batch(2, task["seq_len"], task["vocab_size"], torch.Generator().manual_seed(9))[0]
    before = model(inputs)
    with torch.no_grad():
        for name in free:
            model.get_parameter(name).add_(torch.randn_like(model.get_parameter(name)))
    torch.testing.assert_close(model(inputs), before, rtol=1e-5, atol=1e-5)
    for name in set(plain) - free:
        torch.testing.assert_close(fast[name], plain[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_compiled_training_matches_eager():
    """torch.compile (sweep.compile) changes kernels, not the numbers: same losses within LOSS_RTOL."""
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=12, max_len=12, position="sinusoidal")

    def run(compile_: bool):
        model = build_copy_model(cfg, 0)
        gen = torch.Generator().manual_seed(0)
        return train(model, lambda g: copy_batch(4, 6, 12, g), lambda m, b: copy_loss(m(b[0]), b[1]),
                     steps=8, lr=1e-2, warmup=2, generator=gen, compile=compile_).losses

    eager, compiled = run(False), run(True)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=LOSS_RTOL, atol=0)


def test_step_flops_agree_with_torchs_flop_counter():
    """Every matmul the plain and the fast model run, counted by torch; attention is counted in full by torch."""
    params = _params(1)
    task = params["copy_task"]
    cfg = copy_model_config(params, "pre")
    flops = copy_step_flops(cfg, task["batch_size"], task["seq_len"])
    inputs, targets = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], torch.Generator().manual_seed(0))
    counted = {}
    for name in ("plain", "fast"):
        model = build_copy_model(cfg, 0)
        if name == "fast":
            use_short_causal_attention(model)
        with FlopCounterMode(display=False) as counter:
            copy_loss(model(inputs), targets).backward()
        counted[name] = counter.get_total_flops()
    # torch's counter has no formula for the CPU flash-attention kernel, so the plain model shows the Linears only
    assert counted["plain"] == 3 * flops["linear_forward"]
    assert counted["fast"] == flops["step_attention_full"]
    t = 2 * task["seq_len"] - 1
    assert flops["attention_forward_causal"] * 2 * t == flops["attention_forward_full"] * (t + 1)


@pytest.mark.parametrize("path", [PLAIN, FAST], ids=["plain", "fast"])
def test_gemm_floor_captures_every_product_of_a_training_step(path):
    """The bench's GEMM floor replays exactly the step's products: their FLOPs are the formula's executed FLOPs."""
    params = _params(1)
    task = params["copy_task"]
    cfg = copy_model_config(params, "post")
    calls = capture_step_gemms(params, "post", path)
    flops = copy_step_flops(cfg, task["batch_size"], task["seq_len"])
    if path is FAST:  # every Linear (forward, input grad, weight grad) and the four attention bmm's per layer
        assert sum(c["flops"] for c in calls) == flops["step_attention_full"]
        assert {c["op"] for c in calls} == {"mm", "addmm", "bmm", "baddbmm"}
    else:  # the plain model's attention is the CPU flash kernel: no GEMM calls of its own
        assert sum(c["flops"] for c in calls) == 3 * flops["linear_forward"]
    floor = time_gemm_floor(calls, repeats=2)
    assert floor["calls"] == len(calls) and floor["executed_flops"] == sum(c["flops"] for c in calls)
    assert 0 < floor["step_s"] < 60


def test_allocator_tuning_reports_success_on_linux():
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc only")
    assert tune_allocator() is True


@pytest.mark.slow
def test_bench_command_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "blocklab.cli", "bench", "--quick", "--params", str(TINY), "--no-layout-ref", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("bench-json: "))
    result = json.loads(line[len("bench-json: "):])
    assert set(result["lanes"]) == {"plain", "fast"}
    assert result["lanes"]["plain"]["run_steps"] == result["lanes"]["fast"]["run_steps"] == 2 * 4
    assert result["max_rel_loss_diff"] < LOSS_RTOL
    assert result["matmul_peak_gflops"] > 0 and result["ratio_window"] > 0
    floor = result["gemm_floor"]
    assert floor["processes"] == result["lanes"]["fast"]["processes"] and floor["calls_per_step"] > 0
    assert 0 < floor["fraction_of_peak"] and floor["share_of_fast_step"] > 0 and "GEMMs alone" in proc.stdout
    assert "fast vs plain" in proc.stdout and json.loads(out.read_text())["flops_per_step"] == result["flops_per_step"]


def test_batched_runs_give_each_runs_own_losses():
    """Three runs of one norm position (different seeds and warm-ups) trained as one vmapped model vs one by one."""
    from blocklab.bench import train_copy_group_batched

    steps, runs = 15, [(0, 0), (5, 1), (0, 2)]
    params = _params(steps)
    batched = train_copy_group_batched(params, "post", runs, steps)
    for (warmup, seed), member in zip(runs, batched):
        alone = train_copy_steps(params, "post", warmup, seed, steps, PLAIN)
        assert member["run"] == alone["run"] and member["diverged_step"] is None
        torch.testing.assert_close(torch.tensor(member["losses"]), torch.tensor(alone["losses"]), rtol=LOSS_RTOL, atol=0)
    assert batched[0]["losses"] != batched[1]["losses"]  # members really differ (seed, warm-up)


def test_batched_runs_isolate_a_diverging_member(monkeypatch):
    """A member that goes non-finite stops where train.train stops, keeps its weights, and leaves the others alone."""
    import blocklab.sweep
    from blocklab.bench import train_copy_group_batched

    original = blocklab.sweep.build_copy_model

    def poisoned(cfg, seed):
        model = original(cfg, seed)
        if seed == 1:
            with torch.no_grad():
                model.head.weight[0, 0] = float("nan")
        return model

    steps, runs = 6, [(0, 0), (0, 1)]
    params = _params(steps)
    monkeypatch.setattr(blocklab.sweep, "build_copy_model", poisoned)
    healthy, sick = train_copy_group_batched(params, "pre", runs, steps)
    monkeypatch.setattr(blocklab.sweep, "build_copy_model", original)
    alone = train_copy_steps(params, "pre", 0, 0, steps, PLAIN)
    torch.testing.assert_close(torch.tensor(healthy["losses"]), torch.tensor(alone["losses"]), rtol=LOSS_RTOL, atol=0)
    assert sick["diverged_step"] == 1 and sick["losses"] == []
    untouched = poisoned(copy_model_config(params, "pre"), 1)
    for name, weight in untouched.named_parameters():
        torch.testing.assert_close(sick["weights"][name], weight.detach(), equal_nan=True, rtol=0, atol=0)


def test_group_job_writes_every_runs_artifacts_with_the_per_run_losses(tmp_path):
    """`blocklab train-copy-group` (sweep.batched) gives each run the artifacts and losses of its own `train-copy` job."""
    from blocklab.batched import group_runs, train_copy_group
    from blocklab.sweep import aggregate, run_name

    params = _params(6, fast_path=True)
    metas = train_copy_group(params, "pre", tmp_path / "group")
    runs = group_runs(params)
    assert [m["run"] for m in metas] == [run_name("pre", w, s) for w, s in runs] and len(runs) > 1
    for warmup, seed in runs:
        name = run_name("pre", warmup, seed)
        train_copy_run(params, "pre", warmup, seed, tmp_path / "single" / name)
        grouped, single = (pd.read_csv(tmp_path / where / name / "loss.csv") for where in ("group", "single"))
        assert list(grouped["step"]) == list(single["step"]) == list(range(1, 7))
        torch.testing.assert_close(torch.tensor(grouped["loss"].values), torch.tensor(single["loss"].values), rtol=LOSS_RTOL, atol=0)
        assert list(grouped["lr"]) == list(single["lr"])
        meta = json.loads((tmp_path / "group" / name / "meta.json").read_text())
        assert meta["status"] == "finished" and meta["batched_group"] == [m["run"] for m in metas]
        from safetensors.torch import load_file

        weights = [load_file(tmp_path / where / name / "model.safetensors") for where in ("group", "single")]
        assert weights[0].keys() == weights[1].keys()
        for key in weights[0]:
            if not key.endswith("attn.sublayer.k.bias"):  # gradient 0 up to rounding: see the test above
                torch.testing.assert_close(weights[0][key], weights[1][key], rtol=1e-4, atol=1e-5)
    _, summary = aggregate(sorted((tmp_path / "group").iterdir()))
    assert len(summary) == len(runs)


def test_batched_setting_picks_the_job_layout():
    from blocklab.pipeline import sweep_batched

    def config(batched, device):
        return {"sweep": {"batched": batched}, "device": device}

    assert sweep_batched(config(True, "cpu")) and not sweep_batched(config(False, "auto"))
    assert not sweep_batched(config("auto", "cpu"))
    assert sweep_batched(config("auto", "auto")) == torch.cuda.is_available()
