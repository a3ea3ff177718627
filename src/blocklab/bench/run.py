"""The coordinator of `blocklab bench`: starts every lane's worker processes, trains the sweep's runs on all lanes in
interleaved rounds (the lane order rotating every round), measures the matmul peak before and after and the GEMM floor
of the fast step, and hands the measurements to ``report.summarise``."""
from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ..params_file import load_params
from ..runtime import resolve_device
from ..run_settings import CopyTask, Sweep
from ..training.copy_model import copy_model_config
from .flops import MATMUL_SIZE, copy_step_flops
from .lanes import Lane, sweep_runs
from .report import Measurements, summarise
from .workers import Worker


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



def run_bench(params_path: str, *, steps: int, warmup_steps: int, runs: int, lanes: list[Lane], device: str,
              peak_seconds: float, floor_repeats: int = 3, echo=print) -> dict:
    """Train the first ``runs`` sweep runs on every lane in interleaved rounds; returns all measurements as a dict."""
    params = load_params(params_path)
    device = str(resolve_device(device))
    todo = sweep_runs(params, runs)
    task = CopyTask.from_params(params)
    flops = copy_step_flops(copy_model_config(params, "pre"), task.batch_size, task.seq_len)
    info = machine_info()
    scratch = Path(tempfile.mkdtemp(prefix="blocklab-bench-"))
    echo(f"bench: {len(todo)} runs x ({warmup_steps} warm-up + {steps} timed) steps; lanes: "
         + "; ".join(f"{l.name} = {l.workers} process(es) x {l.threads or 'default'} thread(s) [{l.describe()}]" for l in lanes)
         + f"; logs in {scratch}")
    pools = {}
    try:
        _start_workers(lanes, scratch, pools)
        measured = _measure(pools, lanes, todo, str(params_path), device, warmup_steps + steps, peak_seconds,
                            floor_repeats, echo)
    finally:
        for pool in pools.values():
            for worker in pool:
                worker.close()
    shutil.rmtree(scratch, ignore_errors=True)  # kept only when something failed: its logs say what
    return summarise(lanes, Measurements(device=device, runs=len(todo), steps=steps, warmup_steps=warmup_steps,
                                         full_steps=Sweep.from_params(params).steps, flops=flops, machine=info, **measured))


def _start_workers(lanes: list[Lane], scratch: Path, pools: dict) -> None:
    """Start every lane's worker processes into ``pools`` (lane -> workers), lane by lane: the caller closes them."""
    base_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # "default threads" means torch's own
    for lane in lanes:
        # A fresh compile cache per lane: compile time is paid in full, as on a first pipeline run.
        env = base_env | {"TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{lane.name}")}
        pools[lane.name] = [Worker(lane.fast, lane.threads, env, scratch / f"{lane.name}-{i}.log") for i in range(lane.workers)]


def _measure(pools: dict, lanes: list[Lane], todo: list, params_path: str, device: str, n_steps: int,
             peak_seconds: float, floor_repeats: int, echo) -> dict:
    """The matmul peak, the interleaved training rounds, the GEMM floor, the peak again: the ``Measurements`` fields."""
    widest = max(lanes, key=lambda l: l.workers)
    round_size = len(todo) if any(l.batched for l in lanes) else widest.workers
    peak_start = _matmul_peak(pools[lanes[0].name][0], pools[widest.name], peak_seconds, device)
    echo(f"bench: fp32 matmul {MATMUL_SIZE}^3: {peak_start['one_process_gflops']:.0f} GFLOPS in one process,"
         f" {peak_start['all_workers_gflops']:.0f} GFLOPS over {widest.workers} workers")
    walls = {lane.name: 0.0 for lane in lanes}
    results = {lane.name: [] for lane in lanes}
    for round_no, start in enumerate(range(0, len(todo), round_size)):
        jobs = [{"op": "train", "params": params_path, "norm": n, "warmup": w, "seed": s, "steps": n_steps,
                 "device": device} for n, w, s in todo[start:start + round_size]]
        shift = round_no % len(lanes)  # rotate the lane order every round: load drift hits every lane alike
        for lane in lanes[shift:] + lanes[:shift]:
            walls[lane.name] += _train_round(pools[lane.name], lane, jobs, results[lane.name])
        echo(f"bench: {start + len(jobs)}/{len(todo)} runs  " + "  ".join(f"{k} {v:.1f} s" for k, v in walls.items()))
    fast_lane = next(l for l in lanes if l.name == "fast")
    floor = None
    if not fast_lane.batched:  # the products of one fast step, replayed alone in every fast worker at once
        floor_jobs = [{"op": "gemm_floor", "params": params_path, "norm": todo[i % len(todo)][0],
                       "repeats": floor_repeats, "device": device} for i in range(fast_lane.workers)]
        _, floor = _concurrent(pools["fast"], floor_jobs)
        echo(f"bench: GEMMs alone: {statistics.median(r['step_s'] for r in floor):.3f} s a step in each of {len(floor)} processes")
    peak_end = _matmul_peak(pools[lanes[0].name][0], pools[widest.name], peak_seconds, device)
    lane_info = {l.name: {"startup": statistics.median(w.startup_s for w in pools[l.name]),
                          "threads": pools[l.name][0].threads, "allocator": pools[l.name][0].allocator_tuned}
                 for l in lanes}
    return {"peak_start": peak_start, "peak_end": peak_end, "results": results, "walls": walls, "lane_info": lane_info,
            "floor": floor}


def _train_round(pool: list[Worker], lane: Lane, jobs: list[dict], results: list[dict]) -> float:
    """One round's runs on one lane (its workers in parallel, or one vmapped job); appends the replies, returns seconds."""
    if lane.batched:
        wall, (reply,) = _concurrent(pool, [{"op": "train_batched", "params": jobs[0]["params"], "steps": jobs[0]["steps"],
                                             "device": jobs[0]["device"], "precision": lane.precision,
                                             "runs": [[j["norm"], j["warmup"], j["seed"]] for j in jobs]}])
        order = [f"{j['norm']}-w{j['warmup']}-s{j['seed']}" for j in jobs]
        results.extend(sorted(reply["runs"], key=lambda r: order.index(r["run"])))
        return wall
    lane_jobs = [job | {"model": lane.model, "precision": lane.precision, "diagnostics": lane.diagnostics} for job in jobs]
    total = 0.0
    for i in range(0, len(jobs), lane.workers):
        wall, replies = _concurrent(pool, lane_jobs[i:i + lane.workers])
        total += wall
        results.extend(replies)
    return total
