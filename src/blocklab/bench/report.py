"""What a `blocklab bench` run's measurements say: each lane's rates, the ratios against the fastest baseline, the GEMM
floor and the loss agreement (``summarise``), and the readable block printed on stdout (``format_report``)."""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import pandas as pd

from .flops import FLOP_FORMULA
from .lanes import BASELINES, Lane

JSON_TAG = "bench-json: "


@dataclass(frozen=True)
class Measurements:
    """What one bench run measured, before any ratio is taken."""

    device: str
    runs: int  # how many of the sweep's runs every lane trained
    steps: int  # timed steps per run, after the warm-up steps
    warmup_steps: int
    full_steps: int  # sweep.steps: what the projection is for
    flops: dict  # flops.copy_step_flops of the model
    machine: dict  # machine_info() at the start
    peak_start: dict  # fp32 matmul throughput before the rounds and after them
    peak_end: dict
    results: dict  # lane -> every run's reply, in sweep order
    walls: dict  # lane -> seconds its rounds took
    lane_info: dict  # lane -> process start-up seconds, threads per process, allocator tuned
    floor: list | None  # the fast workers' GEMM-floor replies (None when the fast lane is the batched one)


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



def _lane_summary(lane: Lane, m: Measurements, peak: float) -> dict:
    """One lane's rates: bench window, projected full sweep, steady steps; GFLOPS and share of the matmul peak."""
    done, meta, flops, warmup_steps = m.results[lane.name], m.lane_info[lane.name], m.flops, m.warmup_steps
    run_steps = sum(len(r["step_s"]) for r in done)
    projected = _project(done, lane.workers, m.full_steps, meta["startup"], lane.process_per_run, warmup_steps)
    rate, full_rate = run_steps / m.walls[lane.name], len(done) * m.full_steps / projected
    steady = statistics.median(_steady(r, warmup_steps) for r in done)
    return {
        "fast_path": lane.describe(), "model": lane.model, "precision": lane.precision, "processes": lane.workers, "threads_per_process": meta["threads"],
        "allocator_tuned": meta["allocator"], "run_steps": run_steps, "wall_s": m.walls[lane.name],
        "run_steps_per_s": rate, "steady_step_s": steady, "steady_run_steps_per_s": lane.workers / steady,
        "run_overhead_s": statistics.median(max(0.0, r["total_s"] - len(r["step_s"]) * _steady(r, warmup_steps)) for r in done),
        "process_start_s": meta["startup"], "projected_sweep_s": projected, "projected_run_steps_per_s": full_rate,
        "gflops": rate * flops["step"] / 1e9, "fraction_of_peak": rate * flops["step"] / 1e9 / peak,
        "projected_gflops": full_rate * flops["step"] / 1e9,
        "projected_fraction_of_peak": full_rate * flops["step"] / 1e9 / peak,
    }


def _floor_summary(floor: list[dict], summary: dict, best_steady: str, flops: dict, peak: float) -> dict:
    """The GEMM floor in the lanes' units, against the plain lane and the fastest baseline in steady steps."""
    plain, fast = summary["plain"], summary["fast"]
    floor_step = statistics.median(r["step_s"] for r in floor)
    floor_rate = len(floor) / floor_step
    return {
        "processes": len(floor), "step_s": floor_step, "calls_per_step": floor[0]["calls"],
        "executed_flops_per_step": floor[0]["executed_flops"], "run_steps_per_s": floor_rate,
        "gflops": floor_rate * flops["step"] / 1e9, "fraction_of_peak": floor_rate * flops["step"] / 1e9 / peak,
        "ratio_vs_plain_steady": floor_rate / plain["steady_run_steps_per_s"],
        "ratio_vs_best_baseline_steady": floor_rate / summary[best_steady]["steady_run_steps_per_s"],
        "best_baseline_steady": best_steady,
        "share_of_fast_step": floor_step / fast["steady_step_s"],
    }


def summarise(lanes: list[Lane], m: Measurements) -> dict:
    """Every lane's rates and every ratio the bench reports, as one dict (the JSON line, and --out with provenance)."""
    peak = max(*m.peak_start.values(), *m.peak_end.values())
    summary = {lane.name: _lane_summary(lane, m, peak) for lane in lanes}
    fast, results, flops = summary["fast"], m.results, m.flops
    speedups = speedups_vs_baselines(summary)
    gemm_floor = _floor_summary(m.floor, summary, speedups["fast"]["steady"]["vs"], flops, peak) if m.floor else None
    return {
        "machine": m.machine | ({"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]} if hasattr(os, "getloadavg") else {}),
        "device": m.device, "runs": m.runs, "steps_per_run": m.warmup_steps + m.steps, "timed_steps": m.steps,
        "warmup_steps": m.warmup_steps, "full_sweep_steps_per_run": m.full_steps, "fast_path": fast["fast_path"],
        "flops_per_step": flops["step"], "flop_formula": FLOP_FORMULA,
        "matmul_peak_gflops": peak, "matmul_start": m.peak_start, "matmul_end": m.peak_end,
        "lanes": summary,
        "gemm_floor": gemm_floor,
        # fast against the fastest baseline lane (plain, plain-WxT, peer) of each metric, named in ratio_reference
        "ratio_window": speedups["fast"]["window"]["ratio"],
        "ratio_projected": speedups["fast"]["projected"]["ratio"],
        "ratio_steady": speedups["fast"]["steady"]["ratio"],
        "ratio_reference": {kind: r["vs"] for kind, r in speedups["fast"].items()},
        "speedups": speedups,
        "bf16_vs_fast": ({kind: summary["bf16"][metric] / fast[metric] for kind, metric in RATE_METRICS.items()} if "bf16" in summary else None),
        # extra time a step takes with the diagnostics on: fast's rate over the diagnostics lane's, minus one
        "diagnostics_overhead": ({kind: fast[metric] / summary["diagnostics"][metric] - 1 for kind, metric in RATE_METRICS.items()}
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
             "steady_step_s": _steady(r, m.warmup_steps), "first_step_s": r["step_s"][0] if r["step_s"] else None}
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
        lines.append(f"diagnostics overhead vs fast (same layout, params' diagnostics): {d['window']:+.1%} window, "
                     f"{d['projected']:+.1%} projected, {d['steady']:+.1%} steady (budget: +5% steady; "
                     f"its same-process A/B: performance/ab_diagnostics.py)")
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

