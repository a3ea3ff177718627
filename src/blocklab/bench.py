"""`blocklab bench`: throughput of the copy-task sweep: the plain loop, a peer-style model, the fast path, bf16.

Every lane trains the sweep's own runs (norm x warm-up x seed) with ``train.train`` for a few steps. They run in
interleaved rounds so that whatever else loads the machine slows all alike, and every number is reported next to
the fp32 matmul throughput measured in the same run:

    plain  one process, default torch threads, eager, the runs one after another (what a plain loop does)
    plain-WxT  the plain model in the fast lane's process layout: separates layout from kernels
    peer   the same model written as public GPT code is (blocklab.model.peer: fused qkv Linear, SDPA is_causal,
           nn.LayerNorm, fused Adam), in the fast lane's process layout: what a careful user would write
    fast   W worker processes x T threads, each run afresh (dynamo reset, as a new pipeline job would), with
           FusedLayerNorm, ShortCausalAttention, fused Adam, a tuned allocator and optionally torch.compile
    bf16   the fast lane under bf16 autocast (sweep.precision: bf16), where the device has bf16 units
    diagnostics  the fast lane recording the training-time diagnostics (params' ``diagnostics``): their overhead

Every speed-up is quoted against the fastest baseline (plain, plain-WxT, peer) in the same metric, never against a
slower one; bf16 also against the fp32 fast lane; the diagnostics lane's overhead against the fast lane.

FLOPs of one training step (stated again in the output and in bench/README.md), with T = 2 * seq_len - 1 tokens:
    forward  = 2 * B*T * [L * (d*(H+2*KV)*hd + H*hd*d + n_ffn*d*hidden) + d*V]      every Linear: q,k,v,o,ffn,head
             + L * 2 * 2 * B*H*hd * T*(T+1)/2                                        QK^T and AV, causal: lower half
    backward = 2 * forward;  step = 3 * forward.   Norms, softmax, GELU, embeddings and Adam are not counted.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from . import provenance
from .config import ConfigError
from .io import write_json
from .model.fastpath import PLAIN, FastPath, apply_fast_path, tune_allocator
from .model.peer import build_peer_model
from .params import load_params
from .runtime import resolve_device, set_threads
from .training import sweep
from .training.batched import train_copy_group_batched
from .training.precision import bf16_support, check_precision
from .training.tasks import copy_batch, copy_loss
from .training.train import train

RESULT_TAG = "BLOCKLAB-BENCH-RESULT "  # worker replies are the stdout lines that start with this; anything else is noise
JSON_TAG = "bench-json: "
MATMUL_SIZE = 2048


# --- FLOPs -------------------------------------------------------------------------------------------------------------


def copy_step_flops(cfg, batch_size: int, seq_len: int) -> dict:
    """FLOPs of one training step of the copy-task model (see the module docstring for the formula)."""
    tokens_per_seq = 2 * seq_len - 1
    tokens = batch_size * tokens_per_seq
    hd, heads, kv = cfg.head_dim, cfg.n_heads, cfg.kv_heads
    n_ffn = 3 if cfg.ffn_kind == "swiglu" else 2
    per_layer = cfg.d_model * (heads + 2 * kv) * hd + heads * hd * cfg.d_model + n_ffn * cfg.d_model * cfg.hidden
    linear = 2 * tokens * (cfg.n_layers * per_layer + cfg.d_model * cfg.vocab_size)
    pairs_full, pairs_causal = tokens_per_seq**2, tokens_per_seq * (tokens_per_seq + 1) // 2
    attention_full = cfg.n_layers * 2 * 2 * batch_size * heads * hd * pairs_full
    attention_causal = cfg.n_layers * 2 * 2 * batch_size * heads * hd * pairs_causal
    return {
        "linear_forward": linear,
        "attention_forward_full": attention_full,
        "attention_forward_causal": attention_causal,
        "step": 3 * (linear + attention_causal),
        "step_attention_full": 3 * (linear + attention_full),
    }


FLOP_FORMULA = (
    "step = 3 * forward (backward = 2x forward); forward = 2*B*T*[L*(d*(H+2KV)*hd + H*hd*d + n_ffn*d*hidden) + d*V]"
    " + L*2*2*B*H*hd*T*(T+1)/2 (attention QK^T and AV, causal: lower triangle incl. diagonal); T = 2*seq_len-1;"
    " norms, softmax, GELU, embedding and Adam not counted"
)


# --- worker process --------------------------------------------------------------------------------------------------


def _matmul_gflops(seconds: float, device: str = "cpu", size: int = MATMUL_SIZE) -> float:
    """Sustained fp32 matmul throughput of this process over ``seconds`` (mean over the window, after one warm-up)."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    torch.mm(a, b, out=out)
    sync()
    calls, began = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds or calls < 2:
        for _ in range(1 if not a.is_cuda else 20):
            torch.mm(a, b, out=out)
            calls += 1
        sync()
    return 2 * size**3 * calls / elapsed / 1e9


def train_copy_steps(params: dict, norm: str, warmup: int, seed: int, steps: int, fast: FastPath, device="cpu",
                     model_kind: str = "blocklab", precision: str = "fp32", diagnostics: bool = False) -> dict:
    """Train one sweep run for ``steps`` steps with ``train.train``, timing every step. Returns timings and losses.

    The model, data stream and loss are those of ``sweep.train_copy_run``; only checkpoints and files are left out.
    ``model_kind`` "peer" trains ``blocklab.model.peer``'s model of the same size instead (``fast`` then only sets fused
    Adam and compile); ``precision`` as ``sweep.precision``; ``diagnostics`` records params' diagnostics (on) as a
    pipeline run does.
    """
    task, settings = params["copy_task"], params["sweep"]
    torch._dynamo.reset()  # a pipeline job is a fresh process: it compiles again (the on-disk caches still count)
    began = time.perf_counter()
    cfg = sweep.copy_model_config(params, norm)
    check_precision(precision, device)
    if model_kind == "peer":
        model = build_peer_model(cfg, seed).to(device)
    else:
        model = sweep.build_copy_model(cfg, seed).to(device)
        apply_fast_path(model, fast)
    step_starts = []

    def next_batch(gen):
        step_starts.append(time.perf_counter())
        return copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], gen, device=device)

    def loss_fn(m, batch):
        inputs, targets = batch
        return copy_loss(m(inputs).float(), targets)

    recorder = None
    if diagnostics:
        from .training.diagnostics import Recorder, check_settings

        settings_d = check_settings(params.get("diagnostics") or {"enabled": True})
        recorder = Recorder(model, settings_d["metrics"], settings_d["every"])
    result = train(
        model, next_batch, loss_fn, steps=steps, lr=settings["lr"], warmup=warmup,
        generator=torch.Generator().manual_seed(seed), compile=fast.compile, fused_adam=fast.fused_adam,
        precision=precision, desc=f"bench {norm}-w{warmup}-s{seed}", diagnostics=recorder,
    )
    ended = time.perf_counter()
    bounds = step_starts + [ended]
    return {
        "run": f"{norm}-w{warmup}-s{seed}", "norm": norm, "warmup": warmup, "seed": seed,
        "setup_s": step_starts[0] - began if step_starts else ended - began,
        "step_s": [b - a for a, b in zip(bounds, bounds[1:])],
        "total_s": ended - began, "losses": result.losses, "diverged_step": result.diverged_step,
        "threads": torch.get_num_threads(), "pid": os.getpid(),
    }


# --- GEMM floor: the fast step's own matrix products, nothing else ---------------------------------------------------

GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")


def _gemm_flops(name: str, shapes: list[tuple]) -> int:
    """Executed FLOPs of one captured call: 2*M*N*K, times the batch for bmm/baddbmm (masked entries included)."""
    a, b = (shapes[0], shapes[1]) if name in ("mm", "bmm") else (shapes[1], shapes[2])
    return 2 * math.prod(a) * b[-1]


def capture_step_gemms(params: dict, norm: str, fast: FastPath, device="cpu") -> list[dict]:
    """Every matrix-product call (forward and backward) of one fast-path training step, with shapes, strides and scalars.

    The step is the real one (the sweep's model, batch, loss, Adam); a dispatch mode below autograd records the calls.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in GEMM_OPS:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                calls.append({"op": name, "shapes": [tuple(t.shape) for t in tensors],
                              "strides": [tuple(t.stride()) for t in tensors], "kwargs": dict(kwargs or {}),
                              "flops": _gemm_flops(name, [tuple(t.shape) for t in tensors])})
            return func(*args, **(kwargs or {}))

    task, settings = params["copy_task"], params["sweep"]
    model = apply_fast_path(sweep.build_copy_model(sweep.copy_model_config(params, norm), 0).to(device), fast)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"], fused=fast.fused_adam or None)
    inputs, targets = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], torch.Generator().manual_seed(0), device=device)
    with Recorder():
        copy_loss(model(inputs), targets).backward()
        optimizer.step()
    return calls


def time_gemm_floor(calls: list[dict], repeats: int, device="cpu") -> dict:
    """Replay ``calls`` ``repeats`` times on random operands of the captured shapes and strides; median seconds a step.

    Every call gets operands of its own (as in the step, where each product reads tensors that other ops just wrote)
    and allocates its output, so cache and allocator behave as in training. No other work is done: this is the
    ceiling of any path that keeps these products.
    """
    def operand(shape, stride):
        size = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        return torch.randn(size, device=device).as_strided(shape, stride)

    prepared = [(getattr(torch.ops.aten, c["op"]).default, [operand(sh, st) for sh, st in zip(c["shapes"], c["strides"])], c["kwargs"])
                for c in calls]
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    times = []
    for _ in range(repeats + 1):  # the first replay warms up and is dropped
        sync()
        began = time.perf_counter()
        for op, operands, kwargs in prepared:
            op(*operands, **kwargs)
        sync()
        times.append(time.perf_counter() - began)
    return {"step_s": statistics.median(times[1:]), "calls": len(calls), "executed_flops": sum(c["flops"] for c in calls)}


def _worker_main(argv) -> None:
    """Serve JSON commands from stdin, one per line, until EOF. Started by the coordinator, never by hand."""
    fast = FastPath(**json.loads(argv[0]))
    threads = int(argv[1])
    allocator = tune_allocator() if fast.allocator else False
    if threads > 0:
        set_threads(threads)
    params_cache = {}
    _reply({"ready": True, "threads": torch.get_num_threads(), "allocator_tuned": allocator})
    for line in sys.stdin:
        job = json.loads(line)
        if job["op"] == "matmul":
            _reply({"gflops": _matmul_gflops(job["seconds"], job["device"])})
        elif job["op"] == "train":
            params = params_cache.setdefault(job["params"], load_params(job["params"]))
            _reply(train_copy_steps(params, job["norm"], job["warmup"], job["seed"], job["steps"], fast, job["device"],
                                    job.get("model", "blocklab"), job.get("precision", "fp32"),
                                    job.get("diagnostics", False)))
        elif job["op"] == "gemm_floor":
            params = params_cache.setdefault(job["params"], load_params(job["params"]))
            calls = capture_step_gemms(params, job["norm"], fast, job["device"])
            _reply(time_gemm_floor(calls, job["repeats"], job["device"]))
        elif job["op"] == "train_batched":
            params = params_cache.setdefault(job["params"], load_params(job["params"]))
            replies = []
            for norm in dict.fromkeys(n for n, _, _ in job["runs"]):  # one stacked model per architecture
                group = [(w, s) for n, w, s in job["runs"] if n == norm]
                for reply in train_copy_group_batched(params, norm, group, job["steps"], job["device"], fast,
                                                      job.get("precision", "fp32")):
                    reply.pop("weights")
                    replies.append(reply)
            _reply({"runs": replies})


def _reply(obj) -> None:
    sys.stdout.write(RESULT_TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Worker:
    """One worker process of a path, driven line by line over pipes."""

    def __init__(self, fast: FastPath, threads: int, env: dict, log: Path):
        began = time.perf_counter()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "blocklab.bench", "--worker", json.dumps(fast.__dict__), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )
        hello = self.receive()
        self.startup_s = time.perf_counter() - began  # python + torch + blocklab imports: paid once per pipeline job
        self.threads, self.allocator_tuned = hello["threads"], hello["allocator_tuned"]

    def send(self, **job) -> None:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])
        raise RuntimeError(f"bench worker {self.proc.pid} exited (rc={self.proc.wait()}); see {self.log.name}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


# --- coordinator -----------------------------------------------------------------------------------------------------


def sweep_runs(params: dict, n: int) -> list[tuple[str, int, int]]:
    """The sweep's runs, seed-major so that any prefix mixes both norm positions (both graphs get compiled)."""
    settings = params["sweep"]
    runs = [(norm, warmup, seed) for seed, warmup, norm in itertools.product(settings["seeds"], settings["warmups"], settings["norms"])]
    return runs[:n]


def _concurrent(workers: list[Worker], jobs: list[dict]) -> tuple[float, list[dict]]:
    began = time.perf_counter()
    for worker, job in zip(workers, jobs):
        worker.send(**job)
    replies = [worker.receive() for worker in workers[: len(jobs)]]
    return time.perf_counter() - began, replies


def _matmul_peak(plain: Worker, fast_workers: list[Worker], seconds: float, device: str) -> dict:
    """Machine fp32 matmul throughput two ways: one process on all its threads, and every fast worker at once."""
    job = {"op": "matmul", "seconds": seconds, "device": device}
    _, (one,) = _concurrent([plain], [job])
    _, many = _concurrent(fast_workers, [job] * len(fast_workers))
    return {"one_process_gflops": one["gflops"], "all_workers_gflops": sum(r["gflops"] for r in many)}


def _steady(run: dict, warmup_steps: int) -> float:
    timed = run["step_s"][warmup_steps:] or run["step_s"]
    return statistics.median(timed)


def _project(runs: list[dict], workers: int, steps: int, startup_s: float, per_run_startup: bool, warmup_steps: int) -> float:
    """Wall time of the full sweep at ``steps`` steps per run from measured per-run overheads and steady step times.

    Runs go to the least-loaded worker in sweep order, as Snakemake hands out jobs. A run costs its measured fixed
    overhead (model build, compile, first-step allocations) plus ``steps`` steady steps, plus a process start when the
    path starts a process per run (the pipeline does).
    """
    loads = [0.0 if per_run_startup else startup_s] * workers
    for run in runs:
        steady = _steady(run, warmup_steps)
        overhead = max(0.0, run["total_s"] - len(run["step_s"]) * steady)
        i = loads.index(min(loads))
        loads[i] += overhead + steps * steady + (startup_s if per_run_startup else 0.0)
    return max(loads)


def machine_info() -> dict:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    info = {
        "cpu_model": model, "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__, "torch_default_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    if hasattr(os, "getloadavg"):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


@dataclass(frozen=True)
class Lane:
    """One way of running the sweep: its fast-path switches and its process layout."""

    name: str
    fast: FastPath
    workers: int
    threads: int  # 0: torch's default (all cores)
    process_per_run: bool  # a pipeline job per run pays a process start per run; a plain loop pays it once
    batched: bool = False  # all runs of a round in one process, one vmapped model per norm position
    model: str = "blocklab"  # or "peer": blocklab.model.peer's GPT-style model of the same size
    precision: str = "fp32"  # sweep.precision of the lane
    diagnostics: bool = False  # records the training-time diagnostics (params' diagnostics section)

    def describe(self) -> str:
        what = "peer model, " + ("fused Adam" if self.fast.fused_adam else "Adam") if self.model == "peer" else self.fast.describe()
        return (what + (", bf16 autocast" if self.precision != "fp32" else "") + (", vmapped" if self.batched else "")
                + (", diagnostics" if self.diagnostics else ""))


PEER_SETTINGS = FastPath(fused_layernorm=False, short_attention=False, fused_adam=True, allocator=False, compile=False)
BASELINES = ("plain", "peer")  # lane-name prefixes of the baselines every speed-up is quoted against


def default_lanes(workers: int, threads: int, fast: FastPath, layout_reference: bool, device: str, batched: bool,
                  peer: bool = True, bf16: bool = False, compiled: bool = False, diagnostics: bool = True) -> list[Lane]:
    """CPU: plain loop, [plain model in the fast layout], [peer], fast processes, [bf16], [batched].

    CUDA: per-run plain loop and [peer] (one process, one run after another), the batched (vmapped) model as "fast",
    [batched under bf16 autocast], [batched with torch.compile]. ``fast.compile`` applies to the fast lane itself.
    """
    lanes = [Lane("plain", PLAIN, 1, 0, False)]
    if device == "cuda":
        if peer:
            lanes.append(Lane("peer", PEER_SETTINGS, 1, 0, False, model="peer"))
        lanes.append(Lane("fast", fast, 1, 0, False, batched=True))
        if bf16:
            lanes.append(Lane("bf16", fast, 1, 0, False, batched=True, precision="bf16"))
        if compiled and not fast.compile:
            lanes.append(Lane("batched-compiled", FastPath(compile=True), 1, 0, False, batched=True))
        return lanes
    if layout_reference:  # the pipeline's process layout without the fast path: separates layout from kernels
        lanes.append(Lane(f"plain-{workers}x{threads}", PLAIN, workers, threads, True))
    if peer:
        lanes.append(Lane("peer", PEER_SETTINGS, workers, threads, True, model="peer"))
    lanes.append(Lane("fast", fast, workers, threads, True))
    if bf16:
        lanes.append(Lane("bf16", fast, workers, threads, True, precision="bf16"))
    if diagnostics:  # the fast lane as the pipeline runs it, recording the diagnostics: their overhead
        lanes.append(Lane("diagnostics", fast, workers, threads, True, diagnostics=True))
    if batched:  # on the CPU a correctness demonstration of the GPU design, not a speed-up
        lanes.append(Lane("batched", fast, 1, 0, False, batched=True))
    return lanes


def run_bench(params_path: str, *, steps: int, warmup_steps: int, runs: int, lanes: list[Lane], device: str,
              peak_seconds: float, floor_repeats: int = 3, echo=print) -> dict:
    """Train the first ``runs`` sweep runs on every lane in interleaved rounds; returns all measurements as a dict."""
    params = load_params(params_path)
    device = str(resolve_device(device))
    todo = sweep_runs(params, runs)
    task = params["copy_task"]
    flops = copy_step_flops(sweep.copy_model_config(params, "pre"), task["batch_size"], task["seq_len"])
    info = machine_info()
    scratch = Path(tempfile.mkdtemp(prefix="blocklab-bench-"))
    base_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # "default threads" means torch's own
    echo(f"bench: {len(todo)} runs x ({warmup_steps} warm-up + {steps} timed) steps; lanes: "
         + "; ".join(f"{l.name} = {l.workers} process(es) x {l.threads or 'default'} thread(s) [{l.describe()}]" for l in lanes)
         + f"; logs in {scratch}")
    pools = {}
    try:
        for lane in lanes:
            # A fresh compile cache per lane: compile time is paid in full, as on a first pipeline run.
            env = base_env | {"TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{lane.name}")}
            pools[lane.name] = [Worker(lane.fast, lane.threads, env, scratch / f"{lane.name}-{i}.log") for i in range(lane.workers)]
        widest = max(lanes, key=lambda l: l.workers)
        round_size = len(todo) if any(l.batched for l in lanes) else widest.workers
        peak_start = _matmul_peak(pools[lanes[0].name][0], pools[widest.name], peak_seconds, device)
        echo(f"bench: fp32 matmul {MATMUL_SIZE}^3: {peak_start['one_process_gflops']:.0f} GFLOPS in one process,"
             f" {peak_start['all_workers_gflops']:.0f} GFLOPS over {widest.workers} workers")
        walls = {lane.name: 0.0 for lane in lanes}
        results = {lane.name: [] for lane in lanes}
        n_steps = warmup_steps + steps
        for round_no, start in enumerate(range(0, len(todo), round_size)):
            jobs = [{"op": "train", "params": str(params_path), "norm": n, "warmup": w, "seed": s, "steps": n_steps,
                     "device": device} for n, w, s in todo[start:start + round_size]]
            shift = round_no % len(lanes)  # rotate the lane order every round: load drift hits every lane alike
            for lane in lanes[shift:] + lanes[:shift]:
                pool = pools[lane.name]
                if lane.batched:
                    wall, (reply,) = _concurrent(pool, [{"op": "train_batched", "params": str(params_path), "steps": n_steps,
                                                         "device": device, "precision": lane.precision,
                                                         "runs": [[j["norm"], j["warmup"], j["seed"]] for j in jobs]}])
                    walls[lane.name] += wall
                    order = [f"{j['norm']}-w{j['warmup']}-s{j['seed']}" for j in jobs]
                    results[lane.name].extend(sorted(reply["runs"], key=lambda r: order.index(r["run"])))
                    continue
                lane_jobs = [job | {"model": lane.model, "precision": lane.precision, "diagnostics": lane.diagnostics}
                             for job in jobs]
                for i in range(0, len(jobs), lane.workers):
                    wall, replies = _concurrent(pool, lane_jobs[i:i + lane.workers])
                    walls[lane.name] += wall
                    results[lane.name].extend(replies)
            echo(f"bench: {start + len(jobs)}/{len(todo)} runs  " + "  ".join(f"{k} {v:.1f} s" for k, v in walls.items()))
        fast_lane = next(l for l in lanes if l.name == "fast")
        floor = None
        if not fast_lane.batched:  # the products of one fast step, replayed alone in every fast worker at once
            floor_jobs = [{"op": "gemm_floor", "params": str(params_path), "norm": todo[i % len(todo)][0],
                           "repeats": floor_repeats, "device": device} for i in range(fast_lane.workers)]
            _, floor = _concurrent(pools["fast"], floor_jobs)
            echo(f"bench: GEMMs alone: {statistics.median(r['step_s'] for r in floor):.3f} s a step in each of {len(floor)} processes")
        peak_end = _matmul_peak(pools[lanes[0].name][0], pools[widest.name], peak_seconds, device)
        lane_info = {l.name: {"startup": statistics.median(w.startup_s for w in pools[l.name]),
                              "threads": pools[l.name][0].threads, "allocator": pools[l.name][0].allocator_tuned}
                     for l in lanes}
    finally:
        for pool in pools.values():
            for worker in pool:
                worker.close()
    shutil.rmtree(scratch, ignore_errors=True)  # kept only when something failed: its logs say what
    peak = max(*peak_start.values(), *peak_end.values())
    full_steps = params["sweep"]["steps"]
    summary = {}
    for lane in lanes:
        done, meta = results[lane.name], lane_info[lane.name]
        run_steps = sum(len(r["step_s"]) for r in done)
        projected = _project(done, lane.workers, full_steps, meta["startup"], lane.process_per_run, warmup_steps)
        rate, full_rate = run_steps / walls[lane.name], len(done) * full_steps / projected
        steady = statistics.median(_steady(r, warmup_steps) for r in done)
        summary[lane.name] = {
            "fast_path": lane.describe(), "model": lane.model, "precision": lane.precision, "processes": lane.workers, "threads_per_process": meta["threads"],
            "allocator_tuned": meta["allocator"], "run_steps": run_steps, "wall_s": walls[lane.name],
            "run_steps_per_s": rate, "steady_step_s": steady, "steady_run_steps_per_s": lane.workers / steady,
            "run_overhead_s": statistics.median(max(0.0, r["total_s"] - len(r["step_s"]) * _steady(r, warmup_steps)) for r in done),
            "process_start_s": meta["startup"], "projected_sweep_s": projected, "projected_run_steps_per_s": full_rate,
            "gflops": rate * flops["step"] / 1e9, "fraction_of_peak": rate * flops["step"] / 1e9 / peak,
            "projected_gflops": full_rate * flops["step"] / 1e9,
            "projected_fraction_of_peak": full_rate * flops["step"] / 1e9 / peak,
        }
    plain, fast = summary["plain"], summary["fast"]
    speedups = speedups_vs_baselines(summary)
    best_steady = speedups["fast"]["steady"]["vs"]
    gemm_floor = None
    if floor:
        floor_step = statistics.median(r["step_s"] for r in floor)
        floor_rate = len(floor) / floor_step
        gemm_floor = {
            "processes": len(floor), "step_s": floor_step, "calls_per_step": floor[0]["calls"],
            "executed_flops_per_step": floor[0]["executed_flops"], "run_steps_per_s": floor_rate,
            "gflops": floor_rate * flops["step"] / 1e9, "fraction_of_peak": floor_rate * flops["step"] / 1e9 / peak,
            "ratio_vs_plain_steady": floor_rate / plain["steady_run_steps_per_s"],
            "ratio_vs_best_baseline_steady": floor_rate / summary[best_steady]["steady_run_steps_per_s"],
            "best_baseline_steady": best_steady,
            "share_of_fast_step": floor_step / fast["steady_step_s"],
        }
    return {
        "machine": info | ({"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]} if hasattr(os, "getloadavg") else {}),
        "device": device, "runs": len(todo), "steps_per_run": n_steps, "timed_steps": steps, "warmup_steps": warmup_steps,
        "full_sweep_steps_per_run": full_steps, "fast_path": fast["fast_path"],
        "flops_per_step": flops["step"], "flop_formula": FLOP_FORMULA,
        "matmul_peak_gflops": peak, "matmul_start": peak_start, "matmul_end": peak_end,
        "lanes": summary,
        "gemm_floor": gemm_floor,
        # fast against the fastest baseline lane (plain, plain-WxT, peer) of each metric, named in ratio_reference
        "ratio_window": speedups["fast"]["window"]["ratio"],
        "ratio_projected": speedups["fast"]["projected"]["ratio"],
        "ratio_steady": speedups["fast"]["steady"]["ratio"],
        "ratio_reference": {kind: r["vs"] for kind, r in speedups["fast"].items()},
        "speedups": speedups,
        "bf16_vs_fast": ({kind: summary["bf16"][m] / fast[m] for kind, m in RATE_METRICS.items()} if "bf16" in summary else None),
        # extra time a step takes with the diagnostics on: fast's rate over the diagnostics lane's, minus one
        "diagnostics_overhead": ({kind: fast[m] / summary["diagnostics"][m] - 1 for kind, m in RATE_METRICS.items()}
                                 if "diagnostics" in summary else None),
        "fraction_of_peak": fast["fraction_of_peak"], "projected_fraction_of_peak": fast["projected_fraction_of_peak"],
        "ratios_vs_each_lane": {
            ref: {"window": fast["run_steps_per_s"] / s["run_steps_per_s"],
                  "projected": fast["projected_run_steps_per_s"] / s["projected_run_steps_per_s"],
                  "steady": fast["steady_run_steps_per_s"] / s["steady_run_steps_per_s"]}
            for ref, s in summary.items() if ref != "fast"
        },
        **_compare_losses(results["plain"], results["fast"]),
        "loss_diff_vs_plain": {name: _compare_losses(results["plain"], done) for name, done in results.items() if name != "plain"},
        "per_run": [
            {"lane": name, "run": r["run"], "setup_s": r["setup_s"], "total_s": r["total_s"],
             "steady_step_s": _steady(r, warmup_steps), "first_step_s": r["step_s"][0] if r["step_s"] else None}
            for name, done in results.items() for r in done
        ],
    }


RATE_METRICS = {"window": "run_steps_per_s", "projected": "projected_run_steps_per_s", "steady": "steady_run_steps_per_s"}


def speedups_vs_baselines(summary: dict) -> dict:
    """Every non-baseline lane's rate over the fastest baseline lane (plain, plain-WxT, peer) in each metric.

    The reference is picked per metric (window, projected full sweep, steady step), so no ratio is quoted against a
    baseline that another baseline beats in that metric.
    """
    baselines = [name for name in summary if name.startswith(BASELINES)]
    out = {}
    for name, lane in summary.items():
        if name in baselines:
            continue
        out[name] = {}
        for kind, metric in RATE_METRICS.items():
            ref = max(baselines, key=lambda b: summary[b][metric])
            out[name][kind] = {"vs": ref, "ratio": lane[metric] / summary[ref][metric]}
    return out


def _compare_losses(plain_runs: list[dict], fast_runs: list[dict]) -> dict:
    """Largest loss difference between two lanes over the same runs and steps (runs matched by name)."""
    worst_abs, worst_rel = 0.0, 0.0
    fast_by_run = {r["run"]: r for r in fast_runs}
    for a in plain_runs:
        for x, y in zip(a["losses"], fast_by_run[a["run"]]["losses"]):
            worst_abs = max(worst_abs, abs(x - y))
            worst_rel = max(worst_rel, abs(x - y) / max(abs(x), 1e-12))
    return {"max_abs_loss_diff": worst_abs, "max_rel_loss_diff": worst_rel}
def format_report(result: dict) -> str:
    """A readable table of every lane plus the headline ratios."""
    full = result["full_sweep_steps_per_run"]
    rows = [{
        "lane": name, "procs x thr": f"{s['processes']} x {s['threads_per_process']}", "run-steps": s["run_steps"],
        "wall s": s["wall_s"], "run-steps/s": s["run_steps_per_s"], "s/step/proc": s["steady_step_s"],
        "GFLOPS": s["gflops"], "% peak": 100 * s["fraction_of_peak"], "setup/run s": s["run_overhead_s"],
        "proc start s": s["process_start_s"], f"sweep@{full} s": s["projected_sweep_s"],
        f"run-steps/s@{full}": s["projected_run_steps_per_s"], f"GFLOPS@{full}": s["projected_gflops"],
        f"% peak@{full}": 100 * s["projected_fraction_of_peak"],
    } for name, s in result["lanes"].items()]
    table = pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3g}")
    m = result["machine"]
    lines = [
        f"machine: {m['cpu_model']}, {m['cores']} cores, torch {m['torch']} ({m['cpu_capability']}), default threads"
        f" {m['torch_default_threads']}, device {result['device']}, load average {m.get('loadavg_at_start')} -> {m.get('loadavg_at_end')}",
        f"runs: {result['runs']} x {result['steps_per_run']} steps ({result['warmup_steps']} warm-up + {result['timed_steps']} timed);"
        f" fast path: {result['fast_path']}",
        f"FLOPs/step: {result['flops_per_step'] / 1e9:.2f} GFLOP; {result['flop_formula']}",
        f"fp32 matmul peak (best of start/end, one process on all threads or all workers): {result['matmul_peak_gflops']:.0f} GFLOPS",
        table,
    ]
    ref = result["ratio_reference"]
    lines.append(
        f"fast vs the fastest baseline (of {', '.join(n for n in result['lanes'] if n.startswith(BASELINES))}, per metric):"
        f" {result['ratio_window']:.2f}x in the bench window (setup and compile included; vs {ref['window']}),"
        f" {result['ratio_projected']:.2f}x projected for the full sweep (vs {ref['projected']}),"
        f" {result['ratio_steady']:.2f}x in steady steps (vs {ref['steady']});"
        f" fast reaches {100 * result['fraction_of_peak']:.0f}% of the matmul peak ({100 * result['projected_fraction_of_peak']:.0f}% projected)")
    for name, r in result["speedups"].items():
        if name != "fast":
            lines.append(f"{name} vs the fastest baseline: {r['window']['ratio']:.2f}x window (vs {r['window']['vs']}),"
                         f" {r['projected']['ratio']:.2f}x projected (vs {r['projected']['vs']}),"
                         f" {r['steady']['ratio']:.2f}x steady (vs {r['steady']['vs']})")
    if result.get("bf16_vs_fast"):
        b = result["bf16_vs_fast"]
        lines.append(f"bf16 vs fast (fp32, same layout): {b['window']:.2f}x window, {b['projected']:.2f}x projected,"
                     f" {b['steady']:.2f}x steady (its GFLOPS and % peak above are against the fp32 matmul peak)")
    if result.get("diagnostics_overhead"):
        d = result["diagnostics_overhead"]
        lines.append(f"diagnostics overhead vs fast (same layout): {d['window']:+.1%} window, {d['projected']:+.1%} "
                     f"projected, {d['steady']:+.1%} steady")
    floor = result.get("gemm_floor")
    if floor:
        lines.append(
            f"GEMMs alone (the fast step's {floor['calls_per_step']} mm/addmm/bmm/baddbmm calls, replayed with nothing else in"
            f" each of {floor['processes']} processes): {floor['step_s']:.3g} s/step/proc = {floor['run_steps_per_s']:.3g}"
            f" run-steps/s, {floor['gflops']:.0f} GFLOPS = {100 * floor['fraction_of_peak']:.0f}% of peak,"
            f" {floor['ratio_vs_best_baseline_steady']:.2f}x {floor['best_baseline_steady']} steady: the ceiling of any fp32"
            " path that keeps these products;"
            f" they are {100 * floor['share_of_fast_step']:.0f}% of the fast step")
    for ref, r in result["ratios_vs_each_lane"].items():
        if ref.startswith(BASELINES):
            lines.append(f"fast vs {ref}: {r['window']:.2f}x window, {r['projected']:.2f}x projected, {r['steady']:.2f}x steady")
    # The load at the end is mostly the bench's own workers; only the 1-minute load before it started says that
    # something else was running.
    before = m.get("loadavg_at_start", [0])[0]
    if before > 0.5:
        lines.append(f"note: the machine was busy before the bench started (1-minute load average {before:.1f} on {m['cores']}"
                     " cores): the multi-threaded plain lane suffers most from load, so also read the steady ratio and fast"
                     " vs the WxT reference lane")
    why = {"peer": " (another model's weights and layout: not expected to agree)", "bf16": " (bf16 rounding)"}
    for name, diff in result["loss_diff_vs_plain"].items():
        lines.append(f"losses {name} vs plain, same runs and steps: max |diff| {diff['max_abs_loss_diff']:.2e},"
                     f" max relative {diff['max_rel_loss_diff']:.2e}{why.get(name, '')}")
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="copy-task sweep throughput: plain per-run loop vs the fast path, side by side")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--steps", type=int, default=6, help="timed steps per run, after the warm-up steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed-for-steady-state steps per run (still counted)")
    p.add_argument("--runs", type=int, default=8, help="how many of the sweep's runs (seed-major order)")
    p.add_argument("--workers", type=int, default=None, help="fast-path processes (default: cores // threads)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per fast-path process")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=FastPath().compile,
                   help="torch.compile in the fast path (compile time counts)")
    p.add_argument("--compiled", action="store_true",
                   help="CUDA: add a lane of the batched model under torch.compile (compile time counts)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda (default: params device)")
    p.add_argument("--peak-seconds", type=float, default=3.0, help="length of each matmul-peak measurement")
    p.add_argument("--layout-ref", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the plain model in the fast path's process layout (separates layout from kernels)")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                   help="time the peer-style model (blocklab.model.peer) in the fast lane's layout: a baseline")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="add the fast path under bf16 autocast (default: where the device has bf16 units)")
    p.add_argument("--diagnostics", action=argparse.BooleanOptionalAction, default=True,
                   help="add the fast lane recording the training-time diagnostics (their overhead)")
    p.add_argument("--batched", action="store_true",
                   help="CPU: add a lane training each norm's runs as one vmapped model (the GPU design; numbers only)")
    p.add_argument("--quick", action="store_true", help="2 runs x (1 + 3) steps, 1 s peak: a smoke check, not a result")
    p.add_argument("--out", type=Path, default=None, help="also write the result as JSON (with provenance)")
    p.set_defaults(func=_main)


def _main(args) -> None:
    params = load_params(args.params)
    if args.quick:
        args.runs, args.steps, args.warmup_steps, args.peak_seconds = min(args.runs, 2), 3, 1, 1.0
    total_runs = len(sweep_runs(params, 10**6))
    threads = args.threads
    workers = args.workers or max(1, (os.cpu_count() or 1) // max(1, threads))
    for name, value, low, high in (("--runs", args.runs, 1, total_runs), ("--steps", args.steps, 1, 10**6),
                                   ("--warmup-steps", args.warmup_steps, 0, 10**6), ("--workers", workers, 1, 256),
                                   ("--threads", threads, 1, 256), ("--peak-seconds", args.peak_seconds, 0.1, 600)):
        if not low <= value <= high:
            raise ConfigError(f"{name}={value} is not allowed; choose {low}..{high}")
    device = str(resolve_device(args.device or params["device"]))
    bf16 = bf16_support(device)[0] if args.bf16 is None else args.bf16
    if bf16:
        check_precision("bf16", device, key="--bf16")
    lanes = default_lanes(workers, threads, FastPath(compile=args.compile), args.layout_ref, device, args.batched,
                          peer=args.peer, bf16=bf16, compiled=args.compiled, diagnostics=args.diagnostics)
    result = run_bench(
        args.params, steps=args.steps, warmup_steps=args.warmup_steps, runs=args.runs, lanes=lanes,
        device=device, peak_seconds=args.peak_seconds,
        echo=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(format_report(result))
    print(JSON_TAG + json.dumps({k: v for k, v in result.items() if k != "per_run"}, default=str))
    if args.out is not None:
        write_json(provenance.stamp(**result), args.out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
