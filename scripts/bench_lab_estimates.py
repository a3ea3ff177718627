"""How close `blocklab lab`'s estimates come to the time they estimate, on this machine, now.

    nice -n 10 python scripts/bench_lab_estimates.py                  # a tiny lab, a tiny --lr-sweep, a run's ETAs
    nice -n 10 python scripts/bench_lab_estimates.py --skip-sweep     # without the sweep (about 6 minutes less)

Three parts, each against the real time measured from the moment the estimate was printed:

1. ``blocklab lab pre --profile tiny``, twice: the cost line said before anything trains, and every "ETA of the
   whole lab" line, against the time from that line to the lab's last line. The labs keep their calibration in a cache
   of their own, empty at first: the first lab's estimates are those of a machine where no lab has finished yet, the
   second's read the calibration the first left.
2. ``blocklab lab pre --profile tiny --lr-sweep``: each rate's cost line (against the end of that rate's lab), its
   "ETA of the whole lab" lines, and the whole sweep's estimate said with each rate (against the sweep's end).
3. A run's own ETA (``training.train``'s progress line, its seconds a step over its recent past) on a small model
   whose steps become three times slower half-way (a sleep in the loss: a load change made on purpose), beside the
   ETA the average since the run began would have said, both against the run's real end. Its line interval and window
   are five times shorter than a lab job's (2 s and 12 s), so that a run of under a minute spans several windows. No
   estimate can see the change coming: the ratios before it say how far each is off then, those after it how soon
   each catches up.

Each estimate's ratio (estimate / real) is printed and appended to ``performance/measured/lab_estimates.csv`` with the
date, the commit, the processor (``lscpu``), the cores, the nice level and the 1-minute load average before and after.
Not a test: the ratios depend on what else the machine runs.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "performance" / "measured" / "lab_estimates.csv"
CLOCK = r"(\d+):(\d\d):(\d\d)"
COLUMNS = ["date", "commit", "machine", "cores", "nice", "load_before", "load_after", "part", "estimate", "at_s",
           "estimated_s", "real_s", "ratio"]


def seconds(match) -> int:
    h, m, s = (int(x) for x in match)
    return h * 3600 + m * 60 + s


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    name, family, model = (re.search(rf"^{key}:\s*(.+)$", out, re.M) for key in ("Model name", "CPU family", "Model"))
    return (name[1].strip() if name else "unknown") + (f" (family {family[1].strip()}, model {model[1].strip()})"
                                                      if family and model else "")


def append_rows(path: Path, columns: list[str], rows: list[dict]) -> None:
    """Append ``rows`` to the CSV at ``path``, with a header when the file is new."""
    new = not path.is_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def timed_lines(command: list[str], cwd: Path) -> tuple[list[tuple[float, str]], float, int]:
    """Run ``command``; every line it prints (stdout and stderr) with the monotonic time it arrived, the time it ended
    and its exit status."""
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    lines = []

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read)
    reader.start()
    code = proc.wait()
    ended = time.monotonic()
    reader.join()
    return lines, ended, code


def lab_ratios(lines, ended: float, part: str) -> list[dict]:
    """Each cost line, whole-lab ETA and sweep estimate against the time from it to the end it estimates: a lab's end
    is its last line (its files named); the sweep's, the process's end."""
    ends = [t for t, line in lines if re.match(r"blocklab lab: /\S+README\.md", line)]
    rows = []
    for t, line in lines:
        lab_end = next((e for e in ends if e >= t), ended)
        if cost := re.search(r"blocklab lab: cost ≈ " + CLOCK, line):
            rows.append({"estimate": "cost line", "at": t, "estimated": seconds(cost.groups()), "real": lab_end - t})
        elif eta := re.search(r"ETA of the whole lab ≈ " + CLOCK, line):
            rows.append({"estimate": "whole-lab ETA", "at": t, "estimated": seconds(eta.groups()), "real": lab_end - t})
        elif sweep := re.search(r"the whole sweep ≈ " + CLOCK + r", ≈ " + CLOCK + " left", line):
            rows.append({"estimate": "sweep left", "at": t, "estimated": seconds(sweep.groups()[3:]),
                         "real": ended - t})
    began = lines[0][0] if lines else ended
    return [{**r, "part": part, "at": round(r["at"] - began, 1)} for r in rows]


def run_eta_ratios(steps: int = 1000, slow_from: int = 500, fast_s: float = 0.02, slow_s: float = 0.06,
                   scale: float = 5.0) -> list[dict]:
    """A small model trained by ``training.train.train``; a sleep in its loss of ``fast_s`` a step, then ``slow_s``
    from step ``slow_from``. Each progress line's ETA (its printed s/step x steps left) and the average since the
    start's, against the real time left. The line interval and the window are ``scale`` times shorter than a lab
    job's (2 s and 12 s for 10 s and 60 s), so that a run of about a minute spans several windows, as a lab run does."""
    import logging

    import torch

    from blocklab.training import train as training

    lines = []

    class Catch(logging.Handler):
        def emit(self, record):
            lines.append((time.perf_counter(), record.getMessage()))

    handler = Catch()
    logging.getLogger("blocklab.train").addHandler(handler)
    logging.getLogger("blocklab.train").setLevel(logging.INFO)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    step = {"n": 0}

    def next_batch(generator):
        return torch.randn(8, 16, generator=generator), torch.randn(8, 1, generator=generator)

    def loss_fn(m, batch):
        step["n"] += 1
        time.sleep(fast_s if step["n"] < slow_from else slow_s)
        x, y = batch
        return torch.nn.functional.mse_loss(m(x), y)

    training._Progress.EVERY_S /= scale
    training._Progress.WINDOW_S /= scale
    began = time.perf_counter()
    try:
        training.train(model, next_batch, loss_fn, steps=steps, lr=1e-3, warmup=0,
                       generator=torch.Generator().manual_seed(0), desc="bench")
    finally:
        logging.getLogger("blocklab.train").removeHandler(handler)
    ended = time.perf_counter()
    rows = []
    for t, line in lines:
        found = re.search(r"step (\d+)/(\d+) .* ([\d.]+) s/step ETA", line)
        if not found or int(found[1]) == steps:
            continue
        done, left = int(found[1]), steps - int(found[1])
        real = ended - t
        rows.append({"part": "run ETA", "estimate": "recent window (printed)", "at": round(t - began, 1),
                     "estimated": float(found[3]) * left, "real": real})
        rows.append({"part": "run ETA", "estimate": "average since start (before)", "at": round(t - began, 1),
                     "estimated": (t - began) / done * left, "real": real})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-sweep", action="store_true", help="leave out the tiny --lr-sweep")
    parser.add_argument("--skip-run-eta", action="store_true", help="leave out the run's ETA (part 3: needs the "
                        "code's windowed ETA; off to time an older commit's lab estimates)")
    parser.add_argument("--csv", type=Path, default=CSV, help=f"where the rows are appended (default {CSV})")
    parser.add_argument("--commit", help="the commit of the code timed, where it is not this checkout's HEAD (a copy "
                        "of another commit put first on PYTHONPATH, e.g. `git archive COMMIT | tar -x -C DIR`)")
    args = parser.parse_args()
    import blocklab as package

    if args.commit:
        commit = args.commit
    elif Path(package.__file__).resolve().is_relative_to(ROOT):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        commit += "+dirty" if dirty else ""
    else:
        print(f"the code timed ({package.__file__}) is not this checkout's: give its commit with --commit",
              file=sys.stderr)
        return 2
    blocklab = Path(sys.executable).with_name("blocklab")
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-lab-") as folder:
        # the labs keep their calibration in a cache of their own, empty at first: the first lab's estimate is a
        # machine's first (no lab finished here), the labs after it read the calibration it left; the user's is untouched
        os.environ["BLOCKLAB_CACHE"] = str(Path(folder) / "cache")
        labs = [("tiny lab, first here", "first", []), ("tiny lab", "lab", [])] + (
            [] if args.skip_sweep else [("tiny lr-sweep", "sweep", ["--lr-sweep"])])
        for part, name, extra in labs:
            lines, ended, code = timed_lines([str(blocklab), "lab", "pre", "--profile", "tiny", *extra, "--out",
                                              str(Path(folder) / name)], Path(folder))
            if code:
                print("\n".join(line for _, line in lines[-30:]), file=sys.stderr)
                return code
            rows += lab_ratios(lines, ended, part)
    if not args.skip_run_eta:
        rows += run_eta_ratios()
    load_after = os.getloadavg()[0]
    common = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit,
              "machine": machine(), "cores": os.cpu_count(), "nice": os.nice(0), "load_before": round(load_before, 2),
              "load_after": round(load_after, 2)}
    out = [{**common, "part": r["part"], "estimate": r["estimate"], "at_s": r["at"],
            "estimated_s": round(r["estimated"], 1), "real_s": round(r["real"], 1),
            "ratio": round(r["estimated"] / r["real"], 3) if r["real"] > 0 else ""} for r in rows]
    append_rows(args.csv, COLUMNS, out)
    print(f"{common['machine']}, {common['cores']} cores, nice {common['nice']}, load {load_before:.1f} before, "
          f"{load_after:.1f} after; commit {commit}")
    for r in out:
        print(f"{r['part']:14} {r['estimate']:30} at {r['at_s']:7.1f} s: estimated {r['estimated_s']:7.1f} s, "
              f"real {r['real_s']:7.1f} s, ratio {r['ratio']}")
    print("summary (median ratio, range, estimates within 25 % of the real time):")
    for part, estimate in dict.fromkeys((r["part"], r["estimate"]) for r in out):
        ratios = sorted(r["ratio"] for r in out if (r["part"], r["estimate"]) == (part, estimate) and r["ratio"] != "")
        if ratios:
            within = sum(abs(x - 1) <= 0.25 for x in ratios)
            print(f"  {part:14} {estimate:30} median {ratios[len(ratios) // 2]:.2f}, {ratios[0]:.2f} to "
                  f"{ratios[-1]:.2f}, {within} of {len(ratios)} within 25 %")
    print(f"appended {len(out)} rows to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
