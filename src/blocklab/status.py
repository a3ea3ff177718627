"""`blocklab status`: where the whole pipeline stands, from what is on disk: every training run under ``data/``
(finished, in progress, or planned by the main sweep and not started), its step and its latest loss.

It reads files only (meta.json, loss.csv, train.log): no torch, nothing is written, and it is safe to run beside a
training pipeline. A finished run's step and loss are its loss table's last row; a run in progress shows the last
line its training log wrote (every 50 steps). The studies' plans hold more runs than are on disk: `blocklab
<study> status` lists each planned run with its projected time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from . import records

# What the training loop logs (blocklab.training.train): "<run>: step 150/1200 loss 4.1432 lr 3.75e-04 2.512 s/step
# ETA 0:43:57" (the seconds a step and the ETA are missing from older logs; at least every 10 s)
LOG_LINE = re.compile(r": step (\d+)/(\d+) loss (\S+)(?: lr \S+ (\S+) s/step ETA (\S+))?")
RUNNING_S = 300  # a log written to in the last five minutes: the run is taken to be training now
STUDIES = ("sensitivity", "dynamics", "inference")
SWEEP_RUNS = "data/sweep/runs"


def _last_line(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        handle.seek(max(0, handle.tell() - 4096))
        lines = handle.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


def _last_logged(log: Path) -> tuple[int, int, float, str, str] | None:
    """The last (step, steps, loss, seconds a step, ETA) a training log reports ('' where it did not), or None."""
    with open(log, "rb") as handle:
        handle.seek(0, 2)
        handle.seek(max(0, handle.tell() - 65536))
        found = LOG_LINE.findall(handle.read().decode("utf-8", "replace"))
    if not found:
        return None
    step, steps, loss, per_step, eta = found[-1]
    return int(step), int(steps), float(loss), per_step, eta


def run_row(run_dir: Path, steps: int | None = None, now: float | None = None) -> dict:
    """One run's state from its directory: ``state`` (finished, diverged, training, stopped, not started), ``step``
    of ``steps``, the latest ``loss`` and the ``minutes`` of training recorded (a finished run's wall time)."""
    now = time.time() if now is None else now
    row = {"state": "not started", "step": None, "steps": steps, "loss": None, "minutes": None, "s/step": "", "ETA": ""}
    meta_path, log = run_dir / "meta.json", run_dir / "train.log"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return {**row, "state": "damaged (meta.json; `blocklab verify`)"}
        row["state"] = "diverged" if meta.get("status") == "diverged" else "finished"
        row["steps"] = (meta.get("sweep") or {}).get("steps", steps)
        if isinstance(meta.get("wall_time_s"), (int, float)):
            row["minutes"] = meta["wall_time_s"] / 60
        if (run_dir / "loss.csv").is_file():
            last = _last_line(run_dir / "loss.csv").split(",")
            if len(last) >= 2 and last[0].isdigit():
                row["step"], row["loss"] = int(last[0]), float(last[1])
        return row
    logged = _last_logged(log) if log.is_file() else None
    if logged is not None:
        row["step"], row["steps"], row["loss"], row["s/step"], row["ETA"] = logged
    if log.is_file() or (run_dir / "checkpoint.pt").is_file():
        if log.is_file() and now - log.stat().st_mtime < RUNNING_S:
            row["state"] = "training"
        else:
            resumes = (run_dir / "checkpoint.pt").is_file()
            row["state"] = f"stopped ({'resumes from its checkpoint' if resumes else 'starts over'} when rerun)"
    return row


def run_dirs(data: Path) -> list[Path]:
    """Every run directory under ``data`` (``.../runs/[<cell>/]<run>`` holding a meta.json, a log or a checkpoint)."""
    found = set()
    for name in ("meta.json", "train.log", "checkpoint.pt"):
        found |= {p.parent for p in data.glob(f"**/runs/**/{name}")}
    return sorted(found)


def planned_sweep_runs(params_path: Path) -> tuple[list[str], int | None]:
    """The main sweep's run names and steps from params.yaml (read, not validated: status must work on any state)."""
    import yaml

    from .run_settings import run_name

    try:
        sweep = yaml.safe_load(params_path.read_text(encoding="utf-8"))["sweep"]
        return ([run_name(n, w, s) for n in sweep["norms"] for w in sweep["warmups"] for s in sweep["seeds"]],
                int(sweep["steps"]))
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return [], None


def status(root: Path, params_path: Path) -> list[dict]:
    """Every run, on disk or planned by the main sweep: its directory (relative to ``root``) and its ``run_row``."""
    data = root / "data"
    planned, steps = planned_sweep_runs(params_path)
    dirs = {d: None for d in run_dirs(data)}
    dirs |= {data / "sweep" / "runs" / name: steps for name in planned if data / "sweep" / "runs" / name not in dirs}
    now = time.time()
    return [{"run": str(d.relative_to(root)), **run_row(d, s, now)} for d, s in sorted(dirs.items())]


def format_status(rows: list[dict]) -> str:
    def cell(value, fmt):
        return "" if value is None else format(value, fmt)

    table = [("run", "state", "step", "loss", "minutes", "s/step", "ETA")]
    table += [(r["run"], r["state"], f"{cell(r['step'], 'd')}/{cell(r['steps'], 'd')}" if r["step"] is not None
               else "", cell(r["loss"], ".4g"), cell(r["minutes"], ".1f"), r.get("s/step", ""),
               r.get("ETA", "") if r["state"] == "training" else "") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(7)]
    lines = ["  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
             for row in table]
    counts = {}
    for r in rows:
        state = r["state"].split(" (")[0]
        counts[state] = counts.get(state, 0) + 1
    summary = f"{len(rows)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    return "\n".join(lines + ["", summary])


# ---- the whole pipeline's ETA, said once when Snakemake starts ------------------------------------------------------
# From the measured step cost: the finished runs of this project (a run's wall time over its loss rows: the same
# machine and configuration), else the recorded default run of records/gallery (its 12 sweep runs' wall times, two
# side by side on 2 cores), scaled to this configuration by the floating-point operations of a training step
# (params_file.training_cost). Each run left trains its steps less those its log reports (a resumed run); the runs train
# cores / threads_per_run side by side. Every job also starts a Python that imports torch and pandas: seconds each on
# 2 idle cores, half a minute on loaded ones, and most of the tiny configuration's time (its runs train for seconds);
# Snakemake's start measures that start once (job_start_seconds) and counts JOB_OVER_START times it for each job left.
# JOB_OVER_START: the tiny DAG's jobs took 487 CPU seconds in all (56 jobs: 8.7 s each, the smoke of 2026-12-06 on an
# Intel Xeon, 2 shared cores) where that start took 2.65 (pandas, torch and the training code imported).
JOB_OVER_START = 3.3
GALLERY = Path(__file__).resolve().parents[2] / records.GALLERY


def _family_steps(family: str, config: dict) -> int:
    if family == "reverse_copy":
        return int(config["reverse_copy"]["steps"])
    if family == "inference":
        return int(config["inference"].get("fit_steps", config["sweep"]["steps"]))
    return int(config["sweep"]["steps"])  # the sweep, and the studies' runs (sweep runs of their cells)


def _step_flops(params: dict) -> float:
    from .params_file import FLOPS_CEILING, STEP_OVERHEAD_S, training_cost

    return (training_cost(params["copy_model"], params["copy_task"], 1)[1] - STEP_OVERHEAD_S) * FLOPS_CEILING


def measured_step_seconds(root: Path, config: dict) -> tuple[float, str] | None:
    """(seconds a sweep step takes, where that was measured): this project's finished sweep runs (the median), else
    the recorded default run scaled by the FLOPs of a step; None when neither exists."""
    import statistics

    import yaml

    per_step = []
    for meta_path in (root / "data" / "sweep" / "runs").glob("*/meta.json"):
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            per_step.append(float(meta["wall_time_s"]) / int(meta["loss_steps"]))
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, UnicodeDecodeError):
            continue
    if per_step:
        return statistics.median(per_step), f"median of the {len(per_step)} finished sweep run(s) here"
    try:
        recorded = yaml.safe_load((GALLERY / "params.yaml").read_text(encoding="utf-8"))
        lines = (GALLERY / "sweep" / "summary.csv").read_text(encoding="utf-8").splitlines()
        column = lines[0].split(",").index("wall_time_s")
        seconds = statistics.median(float(line.split(",")[column]) for line in lines[1:])
        recorded_step = seconds / int(recorded["sweep"]["steps"])
        scale = _step_flops(config) / _step_flops(recorded)
    except (OSError, ValueError, KeyError, TypeError, IndexError, statistics.StatisticsError, yaml.YAMLError):
        return None
    return (recorded_step * scale, f"the recorded default run's {recorded_step:.2f} s a step (docs/gallery) x "
            f"{scale:.3g}, this configuration's FLOPs a step against its")


def job_start_seconds(python: str = sys.executable) -> float:
    """Seconds a pipeline job takes to start on this machine now: a fresh Python importing what every `blocklab` job
    imports (torch, pandas, the training code), timed once."""
    started = time.perf_counter()
    subprocess.run([python, "-c", "import pandas, torch, blocklab.training.train"], capture_output=True, check=False)
    return time.perf_counter() - started


def pipeline_eta(run_targets, config: dict, cores: int, root: str | Path = ".", jobs: int | None = None,
                 job_start_s: float | None = None) -> dict:
    """The training left in the DAG's run targets (their meta.json paths): ``runs`` and ``steps`` left, ``lanes``
    (runs side by side), ``seconds`` (wall time, None without a measurement) and ``basis`` (where the step cost
    comes from); with the DAG's ``jobs`` left and ``job_start_s`` (a job's start, measured), their starts too."""
    root = Path(root)
    left, steps = 0, 0
    for target in run_targets:
        run_dir = root / Path(target).parent
        if (run_dir / "meta.json").is_file():
            continue
        family = Path(target).parts[1] if len(Path(target).parts) > 1 else "sweep"
        total = _family_steps(family, config)
        logged = _last_logged(run_dir / "train.log") if (run_dir / "checkpoint.pt").is_file() and (run_dir / "train.log").is_file() else None
        left += 1
        steps += max(0, total - (logged[0] if logged and logged[1] == total else 0))
    lanes = max(1, int(cores) // max(1, int(config.get("threads_per_run", 1))))
    measured = measured_step_seconds(root, config)
    seconds = None if measured is None else steps * measured[0] / min(lanes, max(left, 1))
    starts = (jobs or 0) * (job_start_s or 0) * JOB_OVER_START / lanes
    return {"runs": left, "steps": steps, "lanes": lanes, "seconds": seconds if seconds is None else seconds + starts,
            "step_s": None if measured is None else measured[0], "basis": None if measured is None else measured[1],
            "jobs": jobs, "job_start_s": job_start_s}


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eta_line(eta: dict) -> str:
    jobs = eta.get("jobs") is not None and eta.get("job_start_s") is not None
    starts = (f"{eta['jobs']} job(s) at about {eta['job_start_s'] * JOB_OVER_START:.0f} s each ({JOB_OVER_START} x a "
              f"job's start measured now, {eta['job_start_s']:.1f} s)" if jobs else "")
    if not eta["runs"]:
        return ("blocklab: no training run left to do; "
                + (f"{starts} on {eta['lanes']} lane(s): about "
                   f"{_clock(eta['jobs'] * eta['job_start_s'] * JOB_OVER_START / eta['lanes'])}" if jobs
                   else "the rest of the pipeline takes minutes"))
    what = f"{eta['runs']} training run(s) left, {eta['steps']:,} steps on {eta['lanes']} lane(s)"
    if eta["seconds"] is None:
        return f"blocklab: {what}; no measured step cost yet (the first runs' logs will give their ETA)"
    if jobs:
        return (f"blocklab: {what}, {starts}: about {_clock(eta['seconds'])} in all, training at {eta['step_s']:.3g} "
                f"s a step ({eta['basis']}); `blocklab status` shows each run")
    return (f"blocklab: {what}: about {_clock(eta['seconds'])} of training at {eta['step_s']:.3g} s a step "
            f"({eta['basis']}), then minutes for the rest; `blocklab status` shows each run")


def register(subparsers) -> None:
    p = subparsers.add_parser("status", help="every run of the pipeline on disk: its state, step and loss",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("."), help="the project directory (default: here)")
    p.add_argument("--params", type=Path, default=None, help="its parameters (default: ROOT/params.yaml)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="cores the pipeline uses, for the sweep's ETA (default: all, as `make run`)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    # a checkout without runs (a fresh clone's data/ holds a README) after `make smoke`: the smoke's, said so first
    smoke = records.smoke_copy(SWEEP_RUNS, args.root) if args.params is None and not run_dirs(args.root / "data") else None
    if smoke is not None:
        print(smoke[1] + ":")
        args.root = smoke[0].parents[len(Path(SWEEP_RUNS).parts) - 1]
    if not (args.root / "data").is_dir():
        raise FileNotFoundError(f"no data/ under {args.root.resolve()}: run this in the project directory, or give "
                                "--root (the pipeline writes data/: `make run`, `snakemake --cores 2`; `make smoke`, "
                                "a tiny one in a scratch copy)")
    rows = status(args.root, args.params or args.root / "params.yaml")
    print(format_status(rows) if rows else "no training run on disk yet, and no main sweep planned in params.yaml")
    planned, _ = planned_sweep_runs(args.params or args.root / "params.yaml")
    if planned:  # the main sweep's training left, at the measured step cost (Snakemake says the whole DAG's at start)
        import yaml

        config = yaml.safe_load((args.params or args.root / "params.yaml").read_text(encoding="utf-8"))
        eta = pipeline_eta([f"data/sweep/runs/{name}/meta.json" for name in planned], config, args.cores, args.root)
        print("main sweep: " + eta_line(eta).removeprefix("blocklab: ").replace("then minutes for the rest; "
                                                                              "`blocklab status` shows each run", "").rstrip(", "))
    studies = [s for s in STUDIES if (args.root / "data" / s / "plan.csv").is_file()]
    if studies:
        print("Each study's plan, run by run, with its projected time: "
              + ", ".join(f"`blocklab {s} status`" for s in studies))
    return 0
