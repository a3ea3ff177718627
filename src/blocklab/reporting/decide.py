"""The plan that turns compute into decisions (docs/decide/plan.md): each planned row's runs, the claims they feed,
what is recorded and what is left, rendered from the records (``blocklab docs``'s ``decide-plan`` block), never
typed by hand.

A row's cost is estimated from the recorded runs of the same kind on the same processor family: the lab's runs of
that norm (``records/lab/runs``), or the gallery sweep's runs of that norm and warm-up (their ``wall_time_s``), the
median of their own wall times. A run's wall time counts whatever else the machine ran then.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from ..io import read_table
from ..lab import records
from ..records import GALLERY

PLAN = Path("configs/decide_plan.yaml")  # relative to the project root


def plan_rows(root: Path) -> list[dict]:
    rows = yaml.safe_load((Path(root) / PLAN).read_text(encoding="utf-8"))["rows"]
    for i, row in enumerate(rows):
        if row.get("kind") not in ("lab", "sweep"):
            raise ValueError(f"{PLAN}: rows[{i}].kind: {row.get('kind')!r}; allowed: lab, sweep")
    return rows


def snapshot_runs(root: Path, norm: str, warmup: int) -> pd.DataFrame:
    """The default cell's runs of ``norm`` and ``warmup`` that a study's snapshot in git already holds (the dynamics
    study's, ``dynamics.from_snapshots`` of the gallery's params: the sweep's own function at the sweep's budget), as
    the claims count them (``claims.snapshot_cell_runs``): seed, wall_time_s and the folder. Such a run is read, not
    trained again."""
    from ..params_file import load_params
    from . import claims

    data = Path(root) / GALLERY
    found = claims.snapshot_cell_runs(claims.Data(data, load_params(data / "params.yaml")), norm, warmup)
    return pd.DataFrame([{"seed": meta["seed"], "wall_time_s": meta["wall_time_s"], "recorded": where}
                         for meta, _, where in found], columns=["seed", "wall_time_s", "recorded"])


def queue_lines(root: Path) -> list[str]:
    """Every row's runs as the lanes' queue lines ("lab NORM WARMUP SEED": `blocklab lab-job run-builtin`, recorded in
    records/lab/runs), in the plan's order. A sweep row's run is the same run as the sweep's of that seed (the sweep's
    training function at the document's setup); the default cell's claims count it beside the sweep's
    (``claims.reads_lab_records``). A sweep row's seed that a study's snapshot already holds (``snapshot_runs``) is not
    queued: that run is recorded."""
    lines = []
    for r in plan_rows(root):
        held = set(snapshot_runs(root, r["norm"], int(r["warmup"]))["seed"]) if r["kind"] == "sweep" else set()
        lines += [f"lab {r['norm']} {r['warmup']} {s}" for s in r["seeds"] if s not in held]
    return lines


def _hours(values) -> str:
    return f"{values:.1f}"


def plan_block(data: Path, root: Path) -> str:
    lab = records.recorded(root)
    sweep = read_table(Path(data) / "sweep" / "summary.csv")
    claims = read_table(Path(data) / "claims" / "claims.csv").set_index("id")
    lines = ["| order | runs | claims (verdict now; seeds per arm that decide) | recorded | run-hours recorded | "
             "a run (median of this kind's recorded runs) | run-hours left (estimate) |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    total_left = total_done = 0.0
    for order, row in enumerate(plan_rows(root), 1):
        norm, warmup, seeds = row["norm"], int(row["warmup"]), list(row["seeds"])
        if row["kind"] == "lab":
            mine = lab[(lab["block"] == norm) & (lab["warmup"] == warmup)]
            done = mine[mine["seed"].isin(seeds)]
            like = mine
            what = f"{norm}, warm-up {warmup}, seeds {seeds[0]}–{seeds[-1]} (lab, document 000's setup)"
        else:  # the gallery sweep's runs of the cell and the same cell's runs recorded by the lanes
            recorded = lab[(lab["block"] == norm) & (lab["warmup"] == warmup)]
            mine = sweep[(sweep["norm"] == norm) & (sweep["warmup"] == warmup)]
            held = snapshot_runs(root, norm, warmup)  # a study's snapshot of the same cell: read, not trained
            held = held[~held["seed"].isin(set(mine["seed"]) | set(recorded["seed"]))]
            done = pd.concat([mine[mine["seed"].isin(seeds)], recorded[recorded["seed"].isin(seeds)],
                              held[held["seed"].isin(seeds)]])
            like = pd.concat([mine, recorded, held])
            what = f"{norm}-norm, warm-up {warmup}, seeds {seeds[0]}–{seeds[-1]} (the default cell, 1,200 steps)"
            inside = sorted(int(s) for s in held["seed"] if s in seeds)
            if inside:
                what += (f"; seeds {', '.join(map(str, inside))} already recorded in "
                         f"{', '.join(sorted(set(held['recorded'])))}, read there")
        per_run = like["wall_time_s"].dropna().median() / 3600 if len(like) else float("nan")
        left = (len(seeds) - len(done)) * per_run
        hours_done = done["wall_time_s"].dropna().sum() / 3600
        total_left += left if pd.notna(left) else 0.0
        total_done += hours_done
        said = "; ".join(
            f"`{c}` {claims.loc[c, 'verdict']}"
            + (f", {int(float(claims.loc[c, 'seeds_to_decide']))}" if pd.notna(claims.loc[c, "seeds_to_decide"])
               and str(claims.loc[c, "seeds_to_decide"]).strip() not in ("", "nan") else "")
            if c in claims.index else f"`{c}` (not in the claims table)" for c in row["claims"])
        lines.append(f"| {order} | {what} | {said} | {len(done)} of {len(seeds)} | {_hours(hours_done)} | "
                     f"{'—' if pd.isna(per_run) else _hours(per_run)} h | {_hours(left)} |")
    lines += ["", f"In all: {_hours(total_done)} run-hours recorded, about {_hours(total_left)} run-hours left "
                  f"(about {_hours(total_left / 2)} wall-hours on two lanes, one a core)."]
    note = (f"<sub>Generated by `blocklab docs` from `{PLAN.as_posix()}`, `{records.RUNS}`, `{GALLERY}/sweep/summary.csv`, "
            f"`{GALLERY}/claims/claims.csv` and the dynamics study's snapshots of the default cell (`dynamics.from_snapshots`); "
            "do not edit by hand.</sub>")
    return "\n".join(lines) + "\n\n" + note + "\n"
