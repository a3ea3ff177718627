"""The `blocklab bench` command: its options, their checks, and the output (the readable block, then the JSON line)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import provenance
from ..model_config import ConfigError
from ..io import write_json
from ..model.fastpath import FastPath
from ..params_file import load_params
from ..runtime import resolve_device
from ..training.precision import bf16_support, check_precision
from .lanes import default_lanes, sweep_runs
from .report import JSON_TAG, format_report
from .run import run_bench


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

