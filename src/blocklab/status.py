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
# Snakemake's start measures this machine, now, under its present load (measure_here): as many fresh Pythons as jobs
# run side by side, started together, each importing what every job imports (a job's start, as the jobs will see it:
# sharing the cores with each other and with whatever else runs), and in one of them three short runs of this
# configuration's sweep run through the real training code (its diagnostics and files included), so that a step's
# cost and a run's fixed cost come apart (TIMED_STEPS). The estimate is then made of four parts, each said in the line
# (pipeline_eta, eta_line):
#   training: the steps left (a resumed run's less those its log reports) x a step, plus each run's fixed cost;
#   the jobs: each job left starts a Python that imports torch and pandas, and does a little more (ORDINARY_JOB
#     starts in all, Snakemake's own work for the job included); a training job adds its run's training to that; the
#     tiny configuration's runs train for a second or two, so the starts are most of its time;
#   the SmolLM2 probe (probe_lm: it loads and dequantizes a 135M-parameter model) and the claims and the report (the
#     notebook render), in starts (HEAVY_JOBS); the claims, metrics, report and the last check run one after another
#     at the end, alone (SERIAL_JOBS); everything else shares the lanes side by side.
# The multiples of a start (a start timed two side by side, as the jobs run on 2 cores), from the smoke of 2026-12-06
# (Intel Xeon, 2 shared cores, load 3.6 at its start, 7 to 8 later): each job's time on its lane, Snakemake's own work
# for it included, was 6-14 s for the jobs that plan, aggregate or draw (10 s on average), 19-24 s for a training job
# (the tiny runs train for a second of it), 63 s for the probe, 28 s for the claims, 24 s for the report, where a
# start, two side by side, took 3.5-4.7 s beside it. Alone, by CPU seconds against a start's (/usr/bin/time), the
# probe is 10.5 starts, the claims 15.5 and the report 7.8: these vary with the load; within twice is what is asked.
# Since then the probe reads SmolLM2's file once, not three times: 2.1-2.2x less wall time in alternated runs of the
# job (experiments/residual_trained.load_gguf_once), so half its multiple.
ORDINARY_JOB = 2.5
HEAVY_JOBS = {"probe_lm": 7.0, "claims": 9.0, "report": 6.0, "all": 0.0}  # all: Snakemake's target, no command
SERIAL_JOBS = ("claims", "metrics", "report", "verify_and_record")
GALLERY = Path(__file__).resolve().parents[2] / records.GALLERY
# The recorded default run's step cost stands for another configuration's only when that one is at least this share
# of its size in floating-point operations a step: a small model's step is its fixed costs, which FLOPs do not count.
SCALED_AT_LEAST = 0.25
# The short runs' steps: the first run of a process pays its one-time costs (lazy imports, the code version from git),
# which every training job pays once; the next two time a step. After a first run over SLOW_RUN_S, only that one.
TIMED_STEPS = (2, 2, 12)
SLOW_RUN_S = 5.0


def _family_steps(family: str, config: dict) -> int:
    if family == "reverse_copy":
        return int(config["reverse_copy"]["steps"])
    if family == "inference":
        return int(config["inference"].get("fit_steps", config["sweep"]["steps"]))
    return int(config["sweep"]["steps"])  # the sweep, and the studies' runs (sweep runs of their cells)


def _step_flops(params: dict) -> float:
    from .params_file import FLOPS_CEILING, STEP_OVERHEAD_S, training_cost

    return (training_cost(params["copy_model"], params["copy_task"], 1)[1] - STEP_OVERHEAD_S) * FLOPS_CEILING


def finished_step_seconds(root: Path) -> tuple[float, str] | None:
    """(seconds a sweep step took, where): the median of this project's finished sweep runs; None without one."""
    import statistics

    per_step = []
    for meta_path in (root / "data" / "sweep" / "runs").glob("*/meta.json"):
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            per_step.append(float(meta["wall_time_s"]) / int(meta["loss_steps"]))
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, UnicodeDecodeError):
            continue
    return (statistics.median(per_step), f"median of the {len(per_step)} finished sweep run(s) here") if per_step else None


def recorded_step_seconds(config: dict) -> tuple[float, str] | None:
    """(seconds a sweep step takes, where): the recorded default run's, scaled by the FLOPs of a step, where this
    configuration is near its size (``SCALED_AT_LEAST``); None otherwise."""
    import statistics

    import yaml

    try:
        recorded = yaml.safe_load((GALLERY / "params.yaml").read_text(encoding="utf-8"))
        lines = (GALLERY / "sweep" / "summary.csv").read_text(encoding="utf-8").splitlines()
        column = lines[0].split(",").index("wall_time_s")
        seconds = statistics.median(float(line.split(",")[column]) for line in lines[1:])
        recorded_step = seconds / int(recorded["sweep"]["steps"])
        scale = _step_flops(config) / _step_flops(recorded)
    except (OSError, ValueError, KeyError, TypeError, IndexError, statistics.StatisticsError, yaml.YAMLError):
        return None
    if scale < SCALED_AT_LEAST:
        return None
    return (recorded_step * scale, f"the recorded default run's {recorded_step:.2f} s a step (docs/gallery) x "
            f"{scale:.3g}, this configuration's FLOPs a step against its")


def measured_step_seconds(root: Path, config: dict, measured: dict | None = None) -> tuple[float, str] | None:
    """(seconds a sweep step takes, where that was measured): this project's finished sweep runs, else the steps
    ``measure_here`` timed now, else the recorded default run's (``recorded_step_seconds``); None when none of these."""
    if (found := finished_step_seconds(root)) is not None:
        return found
    if measured and measured.get("step_s"):
        return measured["step_s"], f"{measured['timed']} steps timed here now"
    return recorded_step_seconds(config)


# What measure_here's fresh Python runs: it prints when its imports were done, then each short run's seconds.
_MEASURE = """
import json, sys, time
from pathlib import Path
import pandas, torch
from blocklab.params_file import load_params
from blocklab.runtime import set_threads
from blocklab.training.sweep import train_copy_run
print(json.dumps({"imported": time.time()}), flush=True)
import copy, tempfile
params = load_params(sys.argv[1])
set_threads(params["threads_per_run"])
for steps in map(int, sys.argv[3:]):
    p = copy.deepcopy(params)
    p["sweep"]["steps"] = steps
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        train_copy_run(p, p["sweep"]["norms"][0], 0, 0, Path(folder) / "run", p["device"])
        seconds = time.perf_counter() - began
    print(json.dumps({"steps": steps, "seconds": seconds}), flush=True)
    if seconds > float(sys.argv[2]):
        break
"""


_START = """
import json, time
import pandas, torch, blocklab.training.train
print(json.dumps({"imported": time.time()}), flush=True)
"""


def lanes_of(config: dict, cores: int) -> int:
    """Jobs side by side: the cores Snakemake is given over each job's threads (a training job's threads_per_run)."""
    return max(1, int(cores) // max(1, int(config.get("threads_per_run", 1))))


def measure_here(params_path: str | Path = "params.yaml", lanes: int = 1, python: str = sys.executable,
                 timeout_s: float = 300, train: bool = True) -> dict:
    """This machine, now: ``start_s`` (``lanes`` fresh Pythons started together, each importing pandas, torch and the
    training code: a job's start as jobs side by side see it; the mean), ``step_s`` and ``run_s`` (a training step of
    this configuration's sweep run, and a run's fixed cost in a fresh job: its one-time costs, building, writing its
    files; from short runs of ``TIMED_STEPS``), ``timed`` (the steps timed) and ``load`` (the 1-minute load average
    before measuring). What could not be measured is None. ``train=False`` (no training job left): the starts alone,
    no training step timed (seconds saved at every start of a DAG with only tables, figures or the report to make)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    found = {"start_s": None, "step_s": None, "run_s": None, "timed": 0, "load": load}
    began, children = time.time(), []
    try:
        timed = [_MEASURE, str(params_path), str(SLOW_RUN_S), *map(str, TIMED_STEPS)] if train else [_START]
        children += [subprocess.Popen([python, "-c", *timed], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)]
        children += [subprocess.Popen([python, "-c", _START], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True) for _ in range(max(1, int(lanes)) - 1)]
        outs = [child.communicate(timeout=timeout_s)[0] for child in children]
        said = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out in outs]
    except (OSError, subprocess.SubprocessError, ValueError):
        for child in children:
            child.kill()
        return found
    starts = [lines[0]["imported"] - began for lines in said if lines and "imported" in lines[0]]
    if starts:
        found["start_s"] = max(0.0, sum(starts) / len(starts))
    lines = said[0]
    runs = [(line["steps"], line["seconds"]) for line in lines[1:]]
    if len(runs) >= 3 and runs[2][0] > runs[1][0]:
        (k1, t1), (k2, t2), (k3, t3) = runs[:3]
        found["step_s"] = max((t3 - t2) / (k3 - k2), 1e-6)
        found["run_s"] = max(0.0, t1 - k1 * found["step_s"])
    elif runs:  # slow steps: the first run alone, its fixed cost counted in its steps
        found["step_s"], found["run_s"] = runs[0][1] / runs[0][0], 0.0
    found["timed"] = sum(k for k, _ in runs)
    return found


def pipeline_eta(run_targets, config: dict, cores: int, root: str | Path = ".", rules: list[str] | None = None,
                 measured: dict | None = None, todo: set[str] | None = None) -> dict:
    """The time the DAG's jobs left will take: ``runs`` and ``steps`` left (of the run targets, their meta.json paths),
    ``lanes`` (runs side by side) and, in seconds, ``training`` (None without a step cost), ``jobs_s`` (the jobs' starts
    and their work on the lanes), ``probe_s`` (the SmolLM2 probe), ``serial_s`` (the claims, metrics, report and last
    check, at the end, one after another) and ``seconds``, their sum; ``step_s`` and ``basis`` (where the step cost
    comes from: the finished runs here, else ``measured``'s, else the recorded default run's). ``rules``: the rule of
    each job left; ``measured``: ``measure_here``'s (without it, the training alone); ``todo``: the outputs Snakemake
    will make (a forced rerun's included; without it, the run targets without their meta.json)."""
    root, measured = Path(root), measured or {}
    left, steps = 0, 0
    for target in run_targets:
        run_dir = root / Path(target).parent
        if (target not in todo) if todo is not None else (run_dir / "meta.json").is_file():
            continue
        family = Path(target).parts[1] if len(Path(target).parts) > 1 else "sweep"
        total = _family_steps(family, config)
        logged = _last_logged(run_dir / "train.log") if (run_dir / "checkpoint.pt").is_file() and (run_dir / "train.log").is_file() else None
        left += 1
        steps += max(0, total - (logged[0] if logged and logged[1] == total else 0))
    lanes = lanes_of(config, cores)
    here = measured_step_seconds(root, config, measured)
    run_s = measured.get("run_s") or 0.0
    training = None if here is None else steps * here[0] + left * run_s
    start, rules = measured.get("start_s"), list(rules or [])
    jobs_s = probe_s = serial_s = 0.0
    if start:
        for rule in rules:
            cost = start * HEAVY_JOBS.get(rule, ORDINARY_JOB)
            if rule in SERIAL_JOBS:
                serial_s += cost
            elif rule == "probe_lm":
                probe_s += cost
            else:
                jobs_s += cost
    seconds = None if training is None else (training + jobs_s + probe_s) / min(lanes, max(len(rules), left, 1)) + serial_s
    return {"runs": left, "steps": steps, "lanes": lanes, "training": training,
            "jobs": len(rules), "jobs_s": jobs_s, "probe_s": probe_s, "serial_s": serial_s, "seconds": seconds,
            "step_s": None if here is None else here[0], "basis": None if here is None else here[1],
            "run_s": run_s, "start_s": start, "load": measured.get("load")}


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eta_line(eta: dict) -> str:
    """The ETA in one line: the total, then each part (in work seconds: the training and the jobs share the lanes; the
    serial jobs at the end run alone) and what it was measured from."""
    what = f"{eta['runs']} training run(s) left, {eta['steps']:,} steps"
    if eta["seconds"] is None:
        return (f"blocklab: {what}; no measured step cost yet (the first runs' logs will give their ETA); "
                "`blocklab status` shows each run")
    if not eta.get("start_s"):
        return (f"blocklab: {what} on {eta['lanes']} lane(s): about {_clock(eta['seconds'])} of training at "
                f"{eta['step_s']:.3g} s a step ({eta['basis']}), then the rest; `blocklab status` shows each run")
    lanes = f"{eta['lanes']} lane(s) at load {eta['load']:.1f}" if eta.get("load") is not None else f"{eta['lanes']} lane(s)"
    parts = [f"training {_clock(eta['training'])} ({what} at {eta['step_s']:.3g} s a step, {eta['basis']}, and "
             f"{eta['run_s']:.2g} s a run)",
             f"{eta['jobs']} job(s) starting and working {_clock(eta['jobs_s'])} (a start, {eta['lanes']} side by "
             f"side, measured here now: {eta['start_s']:.1f} s)"]
    if eta["probe_s"]:
        parts.append(f"the SmolLM2 probe {_clock(eta['probe_s'])}")
    if eta["serial_s"]:
        parts.append(f"then the claims and the report render, one after another, {_clock(eta['serial_s'])}")
    return (f"blocklab: about {_clock(eta['seconds'])} on {lanes}: " + "; ".join(parts)
            + "; `blocklab status` shows each run")


def register(subparsers) -> None:
    p = subparsers.add_parser("status", help="every run of the pipeline on disk: its state, step and loss",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("."), help="the project directory (default: here)")
    p.add_argument("--params", type=Path, default=None, help="its parameters (default: ROOT/params.yaml)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="cores the pipeline uses, for the sweep's ETA (default: all, as `make run`)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from .smoke import interrupted_smoke, left_line

    # a smoke killed or interrupted, its scratch copy left (70-80 MB): named, with the commands that resume or free it
    left = interrupted_smoke(args.root)
    if left is not None:
        print(left_line(left))
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
        line = (eta_line(eta).removeprefix("blocklab: ").replace(", then the rest", "")
                .replace("; `blocklab status` shows each run", "")
                .replace(" (the first runs' logs will give their ETA)", " (Snakemake measures one when it starts)"))
        print(f"main sweep: its {len(planned)} runs finished" if not eta["runs"] else f"main sweep: {line}")
    studies = [s for s in STUDIES if (args.root / "data" / s / "plan.csv").is_file()]
    if studies:
        print("Each study's plan, run by run, with its projected time: "
              + ", ".join(f"`blocklab {s} status`" for s in studies))
    return 0
