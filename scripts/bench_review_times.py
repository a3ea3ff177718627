"""How long `blocklab review` takes on each architecture of a recorded table, on this machine, now.

    nice -n 10 python scripts/bench_review_times.py                       # the mixed stacks' table (22 configs)
    nice -n 10 python scripts/bench_review_times.py --table architectures # the uniform stacks' table
    nice -n 10 python scripts/bench_review_times.py llama gemma3n_text    # named ones

Each review runs as a user runs it, ``blocklab review NAME --json FILE`` in a fresh process, one at a time; its wall
time (Python's start and imports included), exit status and verdict are printed and appended to
``performance/measured/review_times.csv`` with the date, the commit, the processor (``lscpu``), the cores, the nice
level and the 1-minute load average before and after. Not a test: the times depend on what else the machine runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_lab_estimates import append_rows, machine  # noqa: E402

CSV = ROOT / "performance" / "measured" / "review_times.csv"
COLUMNS = ["date", "commit", "machine", "cores", "nice", "load_before", "load_after", "subject", "seconds", "exit",
           "verdict"]
LIMIT_S = 15.0  # what a review may take on 2 cores


def recorded_subjects(table: str) -> list[str]:
    """The configs a recorded table (records/reviewer/<table>.json) reviewed, in its order."""
    record = json.loads((ROOT / "records" / "reviewer" / f"{table}.json").read_text(encoding="utf-8"))
    return [r["subject"] for r in record["records"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("subjects", nargs="*", help="model types or config paths (default: the table's)")
    parser.add_argument("--table", default="mixed", choices=["mixed", "architectures"],
                        help="the recorded table whose configs are timed when none are named (default mixed)")
    parser.add_argument("--csv", type=Path, default=CSV, help=f"where the rows are appended (default {CSV})")
    args = parser.parse_args()
    subjects = args.subjects or recorded_subjects(args.table)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    if subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True,
                      text=True).stdout.strip():
        commit += "+dirty"
    blocklab = Path(sys.executable).with_name("blocklab")
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-review-") as folder:
        for subject in subjects:
            out = Path(folder) / "review.json"
            out.unlink(missing_ok=True)
            began = time.monotonic()
            done = subprocess.run([str(blocklab), "review", subject, "--json", str(out)], cwd=ROOT,
                                  capture_output=True, text=True)
            seconds = time.monotonic() - began
            verdict = json.loads(out.read_text(encoding="utf-8")).get("verdict", "") if out.is_file() else ""
            rows.append({"subject": subject, "seconds": round(seconds, 2), "exit": done.returncode,
                         "verdict": verdict})
            print(f"{subject:40} {seconds:6.1f} s  exit {done.returncode}  {verdict}", flush=True)
    load_after = os.getloadavg()[0]
    common = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit,
              "machine": machine(), "cores": os.cpu_count(), "nice": os.nice(0), "load_before": round(load_before, 2),
              "load_after": round(load_after, 2)}
    append_rows(args.csv, COLUMNS, [{**common, **r} for r in rows])
    times = sorted(r["seconds"] for r in rows)
    over = [r["subject"] for r in rows if r["seconds"] > LIMIT_S]
    print(f"{common['machine']}, {common['cores']} cores, nice {common['nice']}, load {load_before:.1f} before, "
          f"{load_after:.1f} after; commit {commit}")
    print(f"{len(rows)} reviews: median {times[len(times) // 2]:.1f} s, longest {times[-1]:.1f} s; over {LIMIT_S:g} s: "
          f"{', '.join(over) if over else 'none'}")
    print(f"appended {len(rows)} rows to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
