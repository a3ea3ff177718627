"""The inference study's tables: the document's unstated setup, inferred rather than tuned (docs/dynamics.md),
by the fitting score of the procedure stated there before any fitting run.

For each candidate setting and each of the document's five early losses (the ``loss_at_step`` claims named in
``FIT_CLAIMS``, with the document's values as claims.yaml gives them), the distance in ln(loss) from the median over
the setting's seeds to the document's value or range (0 inside it); the setting's score is the mean of the five. Lower
is better. The per-seed scores' range is reported beside it, so that ties within the seed spread show as ties.
``blocklab inference score`` ranks whatever recorded runs it is given (snapshots of the sensitivity study, the main
sweep's losses); it trains nothing and says how many seeds each score rests on.

Also the fitting runs' losses (``collect``: from snapshots or run directories), the held-out runs' losses, and
snapshots of finished fitting runs. The document's numbers it scores against are claims: the reporting level reads
them and ranks (``reporting.inference``), so this module reads no claim.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ...model_config import NORM_POSITIONS, ConfigError
from ...integrity import begin_snapshot, read_run, record_snapshot, verify_snapshot
from ...io import read_table, write_table
from ...run_settings import Sweep
from ..cells import default_cell
from .plan import CASES, holdout_plan, plan, sources

def distance(loss: float, low: float, high: float) -> float:
    """|ln loss - ln range|: 0 inside [low, high]; low 0 means "below high"."""
    if low <= loss <= high:
        return 0.0
    return math.log(loss / high) if loss > high else math.log(low / loss)


def score(losses: pd.DataFrame, targets: list[dict], post_warmup: int | None = None) -> pd.DataFrame:
    """One row per setting: the score (mean distance of the seed-median losses), the per-seed score range, the seeds
    it rests on and each target's distance. ``losses``: setting, run (``{norm}-w{warmup}-s{seed}``), step, loss;
    ``targets``: the document's numbers (id, norm, warmup, step, low, high; ``reporting.inference.targets``).
    ``post_warmup``: read the post-norm targets at this warm-up instead of the document's (a configuration that is not
    the document's, e.g. the tiny one; such a ranking exercises the code and says nothing about the document)."""
    ids = [t["id"] for t in targets]
    columns = ["rank", "setting", *ids, "score", "seeds", "seed_score_min", "seed_score_max"]
    frame = losses.copy()
    parts = frame["run"].str.extract(rf"(?P<norm>{'|'.join(NORM_POSITIONS)})-w(?P<warmup>\d+)-s(?P<seed>\d+)")
    frame = pd.concat([frame, parts.astype({"warmup": int, "seed": int})], axis=1)
    rows = []
    for setting, runs in frame.groupby("setting", sort=True):
        row, per_seed = {"setting": setting}, {}
        complete = True
        for target in targets:
            if post_warmup is not None and target["norm"] == "post":
                target = {**target, "warmup": post_warmup}
            at = runs[(runs["norm"] == target["norm"]) & (runs["warmup"] == target["warmup"])
                      & (runs["step"] == target["step"])]
            if at.empty:
                complete = False
                break
            row[target["id"]] = distance(float(at["loss"].median()), target["low"], target["high"])
            for seed, value in zip(at["seed"], at["loss"]):
                per_seed.setdefault(seed, []).append(distance(float(value), target["low"], target["high"]))
        if not complete:
            continue
        seeds = sorted(s for s, d in per_seed.items() if len(d) == len(ids))
        seed_scores = [float(np.mean(per_seed[s])) for s in seeds]
        row.update(score=float(np.mean([row[i] for i in ids])), seeds=len(seeds),
                   seed_score_min=min(seed_scores), seed_score_max=max(seed_scores))
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=columns)
    ranked = pd.DataFrame(rows).sort_values("score", ignore_index=True)
    ranked.insert(0, "rank", range(1, len(ranked) + 1))
    return ranked[columns]


def read_losses(snapshots: list[str | Path], sweep_losses: list[str | Path], setting_of_sweep: str) -> pd.DataFrame:
    """Losses from sensitivity snapshots (setting, run, step, loss) and main-sweep tables (run, step, loss: one
    setting, named by ``setting_of_sweep``); a run recorded twice (the default cell's seed 0) is kept once."""
    for d in snapshots:
        verify_snapshot(d)
    frames = [read_table(Path(d) / "losses.csv")[["setting", "run", "step", "loss"]] for d in snapshots]
    frames += [read_table(p)[["run", "step", "loss"]].assign(setting=setting_of_sweep) for p in sweep_losses]
    losses = pd.concat(frames, ignore_index=True)
    losses = losses[losses["setting"].str.endswith("-fp32")]  # the procedure's candidates are fp32 (step 1)
    return losses.drop_duplicates(["setting", "run", "step"], keep="last")


# ---- the fitting runs' losses ----------------------------------------------------------------------------------------


def collect(params: dict, root: str | Path = ".", only_finished: bool = False,
            planned: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, losses up to ``fit_steps``) of the planned runs (default ``plan``): from ``inference.from_snapshots``
    where they record them, else from the run directories. ``only_finished``: the finished fitting runs trained here
    only (what ``inference snapshot`` records: the ranking's and the held-out ones)."""
    root = Path(root)
    if only_finished:
        own = pd.concat([plan(params), holdout_plan(params)], ignore_index=True) if planned is None else planned
        own, runs, losses = own[~own["main_sweep"]], pd.DataFrame(), pd.DataFrame()
    else:
        own, runs, losses = sources(params, root, planned)
    records, curves = [], []
    for row in own.itertuples(index=False):
        meta_path = root / row.run_dir / "meta.json"
        if not meta_path.is_file():
            if only_finished:
                continue
            raise ConfigError(f"{row.run_dir}: not trained yet; `snakemake --cores 4 inference` trains it")
        meta, loss = read_run(root / row.run_dir)  # checked against its checksums and recorded steps
        records.append({"setting": row.setting, "run": row.run, "wall_time_s": meta.get("wall_time_s"),
                        "machine": meta.get("libraries", {}).get("cpu"),
                        "git_commit": meta.get("code", {}).get("git_commit")})
        curves.append(loss[["step", "loss"]].assign(setting=row.setting, run=row.run))
    columns = ["setting", "run", "step", "loss"]
    runs = pd.concat([frame for frame in (pd.DataFrame(records), runs) if len(frame)], ignore_index=True) \
        if len(records) or len(runs) else pd.DataFrame(columns=["setting", "run"])
    losses = pd.concat([frame[columns] for frame in (*curves, losses) if len(frame)], ignore_index=True) \
        if curves or len(losses) else pd.DataFrame(columns=columns)
    losses = losses[losses["step"] <= params["inference"]["fit_steps"]].reset_index(drop=True)
    return runs, losses


def holdout_table(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """The held-out runs' losses up to ``fit_steps``, one row per run and step, with norm, warm-up and seed."""
    planned = holdout_plan(params)
    _, losses = collect(params, root, planned=planned)
    ident = planned[["setting", "run", "norm", "warmup", "seed"]]
    return ident.merge(losses, on=["setting", "run"]).sort_values(["norm", "seed", "step"], ignore_index=True)


def sweep_fitting_runs(data: str | Path, fit_steps: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, losses up to ``fit_steps``) of the fitting cases (``CASES``) among a finished run's main sweep, read from
    its tables (``DATA/sweep/losses.csv``, ``summary.csv``) and named by the cell of the parameters that made it
    (``DATA/params.yaml``). For a main sweep that stops being the default's (the default batch went from 32
    to 64), so that the fitting runs it gave the ranking stay recorded. The runs' wall time is left empty: it is that
    of the full-length run, not of its first ``fit_steps`` steps."""
    from ...params_file import load_params

    data = Path(data)
    made_by = load_params(data / "params.yaml")
    setting, warmup = default_cell(made_by).name, max(Sweep.from_params(made_by).warmups)
    summary = read_table(data / "sweep" / "summary.csv")
    cases = [(norm, warmup if w is None else w) for norm, w in CASES]
    chosen = summary[[(n, int(w)) in cases for n, w in zip(summary["norm"], summary["warmup"])]]
    if chosen.empty:
        raise ConfigError(f"{data}/sweep/summary.csv: no run of the fitting cases {cases}; allowed: a main sweep "
                          "with post-norm at its largest warm-up or pre-norm without warm-up")
    losses = read_table(data / "sweep" / "losses.csv")
    losses = losses[losses["run"].isin(chosen["run"]) & (losses["step"] <= fit_steps)]
    runs = pd.DataFrame({"setting": setting, "run": sorted(chosen["run"]), "wall_time_s": float("nan"),
                         "machine": None, "git_commit": None})
    return runs, losses.assign(setting=setting)[["setting", "run", "step", "loss"]].reset_index(drop=True)


def aggregate(params: dict, root: str | Path = ".") -> dict[str, pd.DataFrame]:
    """The study's tables (``studies.protocol.StudyAggregate``): the fitting runs' losses up to ``fit_steps``
    (``collect``). Their ranking by the document's numbers is the reporting level's (``reporting.inference``)."""
    return {"losses": collect(params, root)[1]}


def write_snapshot(params: dict, out: str | Path, root: str | Path = ".",
                   from_sweep: str | Path | None = None) -> pd.DataFrame:
    """Record the finished fitting runs trained here (the ranking's and the held-out ones) in ``out``, a directory kept
    in git; or, with ``from_sweep`` (a finished run's data directory), the fitting cases of its main sweep. Returns the
    runs recorded."""
    runs, losses = (collect(params, root, only_finished=True) if from_sweep is None
                    else sweep_fitting_runs(from_sweep, params["inference"]["fit_steps"]))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    begin_snapshot(out)  # a kill from here on leaves a snapshot that readers refuse, until it is written again
    write_table(runs, out / "runs.csv")
    write_table(losses, out / "losses.csv")
    record_snapshot(out)  # last: the checksums of what was written
    return runs
