"""The document's unstated setup, inferred rather than tuned (issue 23, docs/dynamics.md): the fitting score of the
procedure stated there before any fitting run.

For each candidate setting and each of the document's five early losses (the ``loss_at_step`` claims named in
``FIT_CLAIMS``, with the document's values as claims.yaml gives them), the distance in ln(loss) from the median over
the setting's seeds to the document's value or range (0 inside it); the setting's score is the mean of the five. Lower
is better. The per-seed scores' range is reported beside it, so that ties within the seed spread show as ties.
``blocklab inference score`` ranks whatever recorded runs it is given (snapshots of the sensitivity study, the main
sweep's losses); it trains nothing and says how many seeds each score rests on.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import NORM_POSITIONS
from ..integrity import verify_snapshot
from ..io import read_table, write_table
from .claims import load_claims

FIT_CLAIMS = ("d000-post-warm-step100", "d000-post-warm-step200", "d000-post-warm-step300", "d000-pre-nowarm-step100",
              "d000-pre-nowarm-step200")


def _range(claim: dict) -> tuple[float, float]:
    """The document's number as a range: a value (low = high), a range, or "below" a bound (low 0)."""
    if claim["kind"] == "value":
        return float(claim["value"]), float(claim["value"])
    if claim["kind"] == "range":
        return float(claim["low"]), float(claim["high"])
    if claim["kind"] == "inequality" and claim["side"] == "below":
        return 0.0, float(claim["bound"])
    raise ValueError(f"{claim['id']}: a fitted claim of kind {claim['kind']} has no range to score")


def targets() -> list[dict]:
    """The five fitted numbers (the claims marked ``fitted: true``): claim id, norm, warm-up, step and the document's
    range (low = high for one value)."""
    claims = {c["id"]: c for c in load_claims()}
    fitted = {i for i, c in claims.items() if c.get("fitted")}
    if fitted != set(FIT_CLAIMS):
        raise ValueError(f"claims.yaml marks {sorted(fitted)} as fitted; the procedure fitted {list(FIT_CLAIMS)}")
    return [{"id": i, **{k: claims[i]["args"][k] for k in ("norm", "warmup", "step")},
             **dict(zip(("low", "high"), _range(claims[i])))} for i in FIT_CLAIMS]


def distance(loss: float, low: float, high: float) -> float:
    """|ln loss - ln range|: 0 inside [low, high]; low 0 means "below high"."""
    if low <= loss <= high:
        return 0.0
    return math.log(loss / high) if loss > high else math.log(low / loss)


COLUMNS = ["rank", "setting", *FIT_CLAIMS, "score", "seeds", "seed_score_min", "seed_score_max"]


def score(losses: pd.DataFrame, post_warmup: int | None = None) -> pd.DataFrame:
    """One row per setting: the score (mean distance of the seed-median losses), the per-seed score range, the seeds
    it rests on and each target's distance. ``losses``: setting, run (``{norm}-w{warmup}-s{seed}``), step, loss.
    ``post_warmup``: read the post-norm targets at this warm-up instead of the document's (a configuration that is not
    the document's, e.g. the tiny one; such a ranking exercises the code and says nothing about the document)."""
    frame = losses.copy()
    parts = frame["run"].str.extract(rf"(?P<norm>{'|'.join(NORM_POSITIONS)})-w(?P<warmup>\d+)-s(?P<seed>\d+)")
    frame = pd.concat([frame, parts.astype({"warmup": int, "seed": int})], axis=1)
    rows = []
    for setting, runs in frame.groupby("setting", sort=True):
        row, per_seed = {"setting": setting}, {}
        complete = True
        for target in targets():
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
        seeds = sorted(s for s, d in per_seed.items() if len(d) == len(FIT_CLAIMS))
        seed_scores = [float(np.mean(per_seed[s])) for s in seeds]
        row.update(score=float(np.mean([row[i] for i in FIT_CLAIMS])), seeds=len(seeds),
                   seed_score_min=min(seed_scores), seed_score_max=max(seed_scores))
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    ranked = pd.DataFrame(rows).sort_values("score", ignore_index=True)
    ranked.insert(0, "rank", range(1, len(ranked) + 1))
    return ranked[COLUMNS]


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


def register(subparsers) -> None:
    p = subparsers.add_parser("aggregate", help="the fitting runs' losses and the ranking of the candidates")
    p.add_argument("--params", default="params.yaml")
    p.set_defaults(func=_aggregate_main)

    p = subparsers.add_parser("score", help="rank recorded settings by the document's five early losses")
    p.add_argument("--snapshots", nargs="*", default=["docs/sensitivity/choices"])
    p.add_argument("--sweep-losses", nargs="*", default=[], help="main-sweep losses.csv files (their setting: --sweep-setting)")
    p.add_argument("--sweep-setting", default="learned-b32-L24-lr0.001-fp32")
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=_main)


def _aggregate_main(args) -> None:
    from ..experiments.inference import LOSSES, RANKING, collect
    from ..params import load_params

    params = load_params(args.params)
    _, losses = collect(params)
    write_table(losses, LOSSES)
    warmup = max(params["sweep"]["warmups"])
    document_warmup = next(t["warmup"] for t in targets() if t["norm"] == "post")
    if warmup != document_warmup:
        print(f"note: post-norm runs use warm-up {warmup}, the document {document_warmup}: this ranking is not about "
              "the document's setup")
    ranked = score(losses, post_warmup=warmup)
    write_table(ranked, RANKING)
    print(ranked.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def _main(args) -> None:
    ranked = score(read_losses(args.snapshots, args.sweep_losses, args.sweep_setting))
    print(ranked.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        write_table(ranked, args.out)
