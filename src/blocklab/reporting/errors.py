"""How often each verdict rule is right (issue 44): two error rates per claim, by simulation at the claim's own seed
count and measured spread, and the gate they put on a verdict.

For each part of a claim, the rule of its kind (``verdicts.judge_part``, the very function that judged the data) is
applied to ``SIMULATIONS`` synthetic measurements in two worlds:

- **true**: the document's statement holds exactly; ``p_reproduced_if_true`` is how often the rule says
  "reproduced" there;
- **off**: the truth is off by the smallest difference the claim's words make meaningful (``OFF`` says it per kind);
  ``p_rejected_if_off`` is how often the rule says "not reproduced" there.

Every world draws as many seeds as the claim measured, with the spread it measured (normal draws; counts binomial).
A claim of several parts: ``p_reproduced_if_true`` is the chance that every part says reproduced when every part
holds (what "reproduced" for the claim needs), ``p_rejected_if_off`` the weakest part's. A claim computed without
randomness (a closed form, a fixed checkpoint, a shape) has no error rates (empty). The simulation is seeded by the
claim's id and part, so the table is the same on every machine.

The gate (``gate``): a decided verdict stands only where the error it risks is at most 1 − ``POWER`` = 0.2 at its
seed count. A "reproduced" (or "partly") risks being said of an off truth: P(reproduced | off) above 0.2 makes it
"inconclusive"; a "not reproduced" risks being said of a true statement: P(not reproduced | true) above 0.2 makes
it "inconclusive". Either comes with the seeds at which both columns reach 0.8 (searched at the same spread). Where
a column is below 0.8 and the verdict stands, the margin says why (the rule's other outcomes in that world are
"inconclusive", not the wrong verdict).
"""
from __future__ import annotations

import math
import zlib
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from . import verdicts
from .verdicts import INCONCLUSIVE, NOT_REPRODUCED, PARTLY, REPRODUCED, rounding

SIMULATIONS = 1000  # synthetic measurements per world and part (the rates' standard error is at most 0.016)
SEARCH_SIMULATIONS = 1000  # per seed count while searching the seeds that would reach POWER (as SIMULATIONS: the
# search's answer must not hinge on its own noise; a closed form checks it, tests/test_claims.py)
POWER = 0.8
SEED_GRID = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)
SEARCH_CAP = 64  # seeds_to_decide searches no further: beyond it the table says "more than 64"
Z99 = 2.3263  # the 99th percentile of the normal: "every run" read as 99 % of runs

# The smallest difference the claim's words make meaningful, per kind: the 'off' world (docs/doc000.md#claims).
OFF = {
    "value": "the document's number off by its rounding + 3 sd of one run (a run that far is 1 in 370)",
    "value-mean": "the document's mean off by its rounding + 3 se of the difference of the two means",
    "range": "the distribution's centre half the range's width beyond its nearer end (widened by the rounding)",
    "inequality-every": "half the runs on the wrong side of the bound ('every run' true: 99 % on the claimed side)",
    "inequality-typical": "the typical run on the wrong side: 99 % of runs across the bound (true: 99 % on the claimed side)",
    "count": "the rate half the scale away from the document's count (1 of 3: 0.83; 4 of 6: 0.17)",
    "count-every": "half the runs do not do it (true: every run does)",
    "contrast": "the claimed size (or, with none written, 3 sd of the difference of one run per arm) the other way",
    "contrast-noninferior": "worse by twice the margin (true: no difference)",
    "trend": "the claimed direction reversed, by 3 sd per seed (true: 3 sd the claimed way)",
    "trend-flat": "the ratio half the band's width beyond its nearer edge (true: the band's centre)",
    "trend-levels": "the measured per-level shares in the reverse order of levels (true: in the claimed order)",
    "rates": "the first arm no different from the reference: both at the reference's measured rate (true: the first "
             "arm does it in every run, the reference at its measured rate)",
}


@dataclass(frozen=True)
class Rates:
    p_true: float | None   # p_reproduced_if_true
    p_off: float | None    # p_rejected_if_off
    off: str = ""          # the OFF key
    why: str = ""          # why there are none (not a random quantity, one seed ...)
    false_accept: float | None = None  # P(says reproduced | off): what a "reproduced" risks
    false_reject: float | None = None  # P(says not reproduced | true): what a "not reproduced" risks


@contextmanager
def _quiet():
    before = verdicts.SEARCH["on"]
    verdicts.SEARCH["on"] = False
    try:
        yield
    finally:
        verdicts.SEARCH["on"] = before


def _rng(key: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(key.encode("utf-8")))


def _finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[np.isfinite(values)]


def worlds(words: dict, measure: dict, n: int | None = None):
    """(off key, draw(world, rng) -> a synthetic measure) for one part, or (None, why) when the part is not a random
    quantity or has no spread to simulate with. ``n``: the seeds per arm to simulate (default: the measured count)."""
    kind = words["kind"]
    if kind == "exact" or measure.get("computed"):
        return None, "computed without randomness"
    if kind == "value" and "mean" in measure:
        se, n_trials, trials = measure["se"], measure.get("n"), words.get("trials")
        both = se * math.sqrt(1 + n_trials / trials) if trials else se
        if not both > 0:
            return None, "no standard error"
        x, r = float(words["value"]), float(words.get("rounding", rounding(words["value"])))
        scale = math.sqrt(n / n_trials) if n and n_trials else 1.0  # more trials: a smaller se

        def draw(world, rng):
            shift = 0.0 if world == "true" else rng.choice((-1, 1)) * (r + 3 * both)
            return {"mean": x + shift + rng.normal(0, both * scale), "se": se * scale,
                    "n": int(n or n_trials)}
        return "value-mean", draw
    if kind == "trend" and "ratio" in measure:
        se, ratio = measure["se"], measure["ratio"]
        lo, hi = (math.log(float(b)) for b in words["band"])
        sl = se / ratio  # the se on the log scale
        width = hi - lo

        def draw(world, rng):
            centre = (lo + hi) / 2 if world == "true" else (hi + width / 2 if rng.random() < 0.5 else lo - width / 2)
            return {"ratio": math.exp(centre + rng.normal(0, sl)), "se": se, "what": measure.get("what")}
        return "trend-flat", draw
    if kind == "trend" and words.get("scale") == "levels":
        rows = np.asarray(measure["rows"], dtype=float)
        rows = rows[np.isfinite(rows).all(axis=1)]
        per_seed = int(measure.get("per_seed", 1)) or 1
        seeds = n or max(1, len(rows) // per_seed)
        plus, minus = (rows > 0).mean(axis=0), (rows < 0).mean(axis=0)
        order = np.argsort(plus - minus, kind="stable")  # the measured shares, ordered the claimed way over the levels
        if words["direction"] == "shrinks":
            order = order[::-1]
        plus, minus = plus[order], minus[order]

        def draw(world, rng):
            p, m = (plus, minus) if world == "true" else (plus[::-1], minus[::-1])
            u = rng.random((seeds * per_seed, len(p)))
            return {"rows": (u < p).astype(float) - ((u >= p) & (u < p + m)).astype(float),
                    "levels": measure["levels"], "per_seed": per_seed}
        return "trend-levels", draw
    if kind == "count":
        k_n = int(n or measure["n"])
        if words.get("scope") == "every seed":
            return "count-every", lambda world, rng: {"k": int(rng.binomial(k_n, 1.0 if world == "true" else 0.5)),
                                                      "n": k_n}
        p = words["count"] / words["of"]
        p_off = p + 0.5 if p <= 0.5 else p - 0.5
        return "count", lambda world, rng: {"k": int(rng.binomial(k_n, p if world == "true" else p_off)), "n": k_n}
    if kind == "rates":
        k_n, n_ref, p_ref = int(n or measure["n"]), int(measure["n_ref"]), measure["k_ref"] / measure["n_ref"]
        p_true = 1.0 if words["side"] == "above" else 0.0

        def draw(world, rng):
            return {"k": int(rng.binomial(k_n, p_true if world == "true" else p_ref)), "n": k_n,
                    "k_ref": int(rng.binomial(n_ref, p_ref)), "n_ref": n_ref, "arms": measure.get("arms", ("a", "b"))}
        return "rates", draw
    if kind == "contrast":
        a, b = _finite(measure["a"]), _finite(measure["b"])
        log = words.get("scale") == "log"
        if log:
            if (a <= 0).any() or (b <= 0).any():
                return None, "non-positive values on a log scale"
            a, b = np.log(a), np.log(b)
        if len(a) < 2 or len(b) < 2:
            return None, "an arm of one seed: no spread to simulate with"
        sa, sb = float(a.std(ddof=1)), float(b.std(ddof=1))
        if not (sa + sb) > 0:
            return None, "no spread in either arm"
        na, nb = (n, n) if n else (len(a), len(b))
        side = words["side"]
        if side.startswith("not "):
            m = float(words.get("margin", "0"))
            worse = 1.0 if side == "not above" else -1.0
            off_d = worse * (2 * m if m else 3 * math.hypot(sa, sb))
            key = "contrast-noninferior"

            def diff(world, rng):
                return 0.0 if world == "true" else off_d
        else:
            sign = 1.0 if side == "above" else -1.0
            size = float(words["size"]) if "size" in words else 3 * math.hypot(sa, sb)
            key = "contrast"

            def diff(world, rng):
                return sign * size * (1 if world == "true" else -1)
        centre = float(b.mean())

        def draw(world, rng):
            xa = rng.normal(centre + diff(world, rng), sa, na)
            xb = rng.normal(centre, sb, nb)
            return {"a": np.exp(xa) if log else xa, "b": np.exp(xb) if log else xb, "arms": measure.get("arms", ("a", "b"))}
        return key, draw
    # the kinds that take one number per seed: value, range, inequality, trend (ratios)
    values = _finite(measure["ratios"] if kind == "trend" else measure["samples"])
    if kind == "trend" and words.get("scale", "ratio") == "ratio":
        values = np.log(values[values > 0])
    if len(values) < 2:
        return None, "one seed: no spread to simulate with"
    sd = float(values.std(ddof=1))
    if not sd > 0:
        return None, "no spread among the seeds"
    k = int(n or len(values))
    if kind == "value":
        x, r = float(words["value"]), float(words.get("rounding", rounding(words["value"])))
        return "value", lambda world, rng: {"samples": rng.normal(
            x + (0.0 if world == "true" else rng.choice((-1, 1)) * (r + 3 * sd)), sd, k)}
    if kind == "range":
        lo = float(words["low"]) - rounding(words["low"])
        hi = float(words["high"]) + rounding(words["high"])
        half = (float(words["high"]) - float(words["low"])) / 2

        def draw(world, rng):
            centre = (lo + hi) / 2 if world == "true" else (hi + half if rng.random() < 0.5 else lo - half)
            return {"samples": rng.normal(centre, sd, k)}
        return "range", draw
    if kind == "inequality":
        r = float(words.get("rounding", rounding(words["bound"])))
        below = words["side"] == "below"
        edge = float(words["bound"]) + (r if below else -r)
        claimed = edge - Z99 * sd if below else edge + Z99 * sd
        every = words["scope"] == "every seed"
        wrong = edge if every else (edge + Z99 * sd if below else edge - Z99 * sd)
        return ("inequality-every" if every else "inequality-typical"), lambda world, rng: {
            "samples": rng.normal(claimed if world == "true" else wrong, sd, k)}
    if kind == "trend":
        ratio_scale = words.get("scale", "ratio") == "ratio"
        if words["direction"] == "flat":
            lo, hi = (float(b) for b in words["band"])
            if ratio_scale:
                lo, hi = math.log(lo), math.log(hi)
            width = hi - lo

            def centre(world, rng):
                return (lo + hi) / 2 if world == "true" else (hi + width / 2 if rng.random() < 0.5 else lo - width / 2)
            key = "trend-flat"
        else:
            sign = 1.0 if words["direction"] == "grows" else -1.0

            def centre(world, rng):
                return sign * 3 * sd * (1 if world == "true" else -1)
            key = "trend"

        def draw(world, rng):
            x = rng.normal(centre(world, rng), sd, k)
            return {"ratios": np.exp(x) if ratio_scale else x, "what": measure.get("what")}
        return key, draw
    return None, f"no simulation for kind {kind}"


def _rates(words: dict, measure: dict, key: str, n: int | None = None, sims: int = SIMULATIONS):
    off, draw = worlds(words, measure, n)
    if off is None:
        return None, draw
    rng = _rng(f"{key}|{n}")
    with _quiet():
        true = [verdicts.judge_part(words, draw("true", rng)).verdict for _ in range(sims)]
        wrong = [verdicts.judge_part(words, draw("off", rng)).verdict for _ in range(sims)]
    return (true, wrong), off


def part_rates(words: dict, measure: dict, key: str) -> tuple[Rates, list[str] | None]:
    """The two rates of one part at its measured seed count, and the verdicts of the true world (for the claim's
    joint rate)."""
    got, off = _rates(words, measure, key)
    if got is None:
        return Rates(None, None, why=off), None
    true, wrong = got
    return Rates(float(np.mean([v == REPRODUCED for v in true])),
                 float(np.mean([v == NOT_REPRODUCED for v in wrong])), off,
                 false_accept=float(np.mean([v == REPRODUCED for v in wrong])),
                 false_reject=float(np.mean([v == NOT_REPRODUCED for v in true]))), true


def candidates(now: int) -> list[int]:
    """The seed counts searched above ``now``: every count up to 16, then SEED_GRID's (20, 24, 32, 48, 64): the least
    count where it is small (where a seed costs most), the grid beyond. SEARCH_CAP is the last."""
    return [n for n in sorted({*range(2, 17), *SEED_GRID}) if now < n <= SEARCH_CAP]


def seeds_needed(words: dict, measure: dict, key: str, now: int) -> int | None:
    """The least seed count (of ``candidates``, above ``now``) at which both rates of one part reach POWER at the
    measured spread; None: no count up to SEARCH_CAP does."""
    return claim_seeds([words], [measure], [key], now)


def rates_at(words_list, measures, keys, n: int | None, sims: int = SIMULATIONS) -> tuple[float, float] | None:
    """A claim's two rates with every random part simulated at ``n`` seeds per arm (None: the measured counts):
    p_reproduced_if_true the product of its parts', p_rejected_if_off the weakest part's (as ``judge_parts``
    combines them). None when no part is a random quantity with a spread."""
    p_true, p_off = [], []
    for words, measure, key in zip(words_list, measures, keys):
        got, _ = _rates(words, measure, key, n, sims)
        if got is None:
            continue
        true, wrong = got
        p_true.append(float(np.mean([v == REPRODUCED for v in true])))
        p_off.append(float(np.mean([v == NOT_REPRODUCED for v in wrong])))
    if not p_true:
        return None
    return float(np.prod(p_true)), min(p_off)


def claim_seeds(words_list, measures, keys, now: int | None = None, sims: int = SEARCH_SIMULATIONS) -> int | None:
    """seeds_to_decide: the least seed count per arm (of ``candidates``, above ``now``: default the most any random
    part measured) at which the claim's two rates both reach POWER, every random part simulated at that count with
    its measured spread, by the same rule and worlds as the rates at the measured count. None: no count up to
    SEARCH_CAP does (or nothing to simulate)."""
    if now is None:
        now = max([seeds_of(w, m) for w, m in zip(words_list, measures) if worlds(w, m)[0] is not None] or [0])
    for n in candidates(now):
        got = rates_at(words_list, measures, keys, n, sims)
        if got is None:
            return None
        if min(got) >= POWER:
            return n
    return None


def seeds_of(words: dict, measure: dict) -> int:
    """How many seeds (per arm) the part measured."""
    if "samples" in measure:
        return len(_finite(measure["samples"]))
    if "ratios" in measure:
        return len(_finite(measure["ratios"]))
    if "rows" in measure:
        return max(1, len(measure["rows"]) // max(1, int(measure.get("per_seed", 1))))
    if "a" in measure:
        return min(len(_finite(measure["a"])), len(_finite(measure["b"])))
    if "k" in measure:
        return int(measure["n"])
    return int(measure.get("n") or 0)


def gate(words: dict, measure: dict, judged: verdicts.Judged, key: str) -> tuple[verdicts.Judged, Rates, list | None]:
    """The part's verdict, kept or made inconclusive by its rule's error rates at its seed count (module docstring)."""
    rates, true = part_rates(words, measure, key)
    if rates.p_true is None or judged.verdict not in (REPRODUCED, NOT_REPRODUCED, PARTLY):
        return judged, rates, true
    # what a verdict risks: "reproduced" (or partly) of an off truth, "not reproduced" of a true statement
    risk = rates.false_accept if judged.verdict in (REPRODUCED, PARTLY) else rates.false_reject
    weak = risk > 1 - POWER
    said = (f"error rates at {seeds_of(words, measure)} seeds: reproduced if true {rates.p_true:.2f}, rejected if off "
            f"{rates.p_off:.2f} (off: {OFF[rates.off]})")
    if not weak:
        note = "" if min(rates.p_true, rates.p_off) >= POWER else (
            f"; below 0.8, the verdict stands: the rule says not reproduced of a true statement {risk:.2f} of the "
            "time (its other outcomes there are inconclusive)" if judged.verdict == NOT_REPRODUCED else
            f"; below 0.8, the verdict stands: the rule says reproduced of an off truth {risk:.2f} of the time (its "
            "other outcomes there are inconclusive)")
        return verdicts.Judged(judged.verdict, judged.rule, f"{judged.margin}; {said}{note}",
                               judged.seeds_to_decide), rates, true
    seeds = seeds_needed(words, measure, key, seeds_of(words, measure))
    what = "reproduced of an off truth" if judged.verdict != NOT_REPRODUCED else "not reproduced of a true statement"
    return verdicts.Judged(INCONCLUSIVE, judged.rule + "; a decided verdict must risk at most 0.2 of being wrong",
                           f"{judged.margin} → the rule alone: {judged.verdict}; {said}; it would say {what} "
                           f"{risk:.2f} of the time: inconclusive", seeds), rates, true
