"""One verdict rule per kind of claim, written once.

Every rule is a pure function of the measured numbers and the claim's own words (its target, as claims.yaml writes the
document's numbers: strings, so that their written precision is kept). It returns a ``Judged``: the verdict, the rule
in words, the margin (the numbers it compared and how they were derived) and, for "inconclusive", how many seeds would
decide it at the measured spread. There is no blanket factor anywhere: a tolerance is either the document's own
rounding (``rounding``) or our measured spread over seeds (a t-interval).

Verdicts: reproduced, partly, not reproduced, inconclusive (the interval spans both outcomes), not checkable here (the
data cannot measure it at all; raised as ``NotCheckable`` by the checks).

The kinds and their rules:

- **value** ("4.0", "0.0003"): the document's number x written to d decimals stands for [x - r, x + r], r = 0.5·10^-d.
  The document reports one run, so it is compared with our 95 % prediction interval for one run, mean ± t(0.975, n-1)
  · sd · √(1 + 1/n) over n seeds; a mean with a standard error (a simulation's trials) uses mean ± 1.96 · se; one
  seed of a random quantity has no spread: inconclusive, whatever its point; a computation without randomness (a closed
  form, a fixed checkpoint's forward: ``computed``) is compared with r alone. Reproduced when the two intervals meet,
  else not reproduced.
- **range** ("0.16 – 0.71"): the document's range is what its few seeds spanned, a sample, and so are ours: the 95 %
  t-interval of our seeds' mean must meet [lo - r_lo, hi + r_hi] (each end's own rounding): reproduced; entirely
  outside it: not reproduced; one seed: inconclusive ("every seed inside" said reproduced about a fifth of
  the time when the seeds came from exactly the document's distribution).
- **inequality** ("below 0.007"): ``scope: every seed``: each seed against the bound widened only by its rounding r;
  the words are about every run, so one seed on the other side refutes them (all: reproduced, else not reproduced).
  ``scope: typical``: the one-sided 95 % t-bound of the mean
  clear of the bound on the claimed side: reproduced; the other one-sided bound on the other side: not reproduced;
  spanning it, or one run of a random quantity: inconclusive.
- **count** ("1 of 3"): Fisher's exact test of k of n against the document's count: p < 0.05: not reproduced;
  p >= 0.05 and the same shape (none / some / all of the runs): reproduced; p >= 0.05 and another shape: inconclusive,
  with the number of seeds at which the observed rate would make the test decide. When no count of our n runs could
  differ at 5 % (4 of 6 against 6 runs), the margin says so: the test cannot refute there, only the shape can.
- **contrast** ("A explodes while B stays bounded", "lowers by about 0.5", "at least as good as"): the difference of
  the arms' means, a - b, with a 95 % Welch t-interval over seeds. ``side: above`` / ``below``: the interval on the
  claimed side of 0: reproduced (and when a ``size`` is claimed, the size ± its rounding must meet the interval, else
  partly); on the reverse side (or at 0): not reproduced; spanning 0: inconclusive. ``side: not above`` / ``not
  below`` (non-inferiority, "a at least as good as b"): the interval entirely within the margin (default 0):
  reproduced; entirely on the worse side of it: not reproduced; spanning it: inconclusive. Seeds per arm that would
  decide at the measured spread: the least n with t(0.975, df) · √((sa² + sb²) / n) < |d - margin|.
- **trend** ("grows toward the output", "grows with depth"): the ratio output end / input end (or last / first) per
  seed, with a 95 % t-interval on its log (``scale: difference``: the difference last - first, for a quantity that
  can be 0); ``grows``: above 1 (0): reproduced, at or below: not reproduced, spanning: inconclusive; ``shrinks``
  mirrored; ``flat``: the ratio's interval within the stated ``band``: reproduced; outside it: not reproduced;
  across an edge: inconclusive. A ratio measured as a mean with a standard error uses ± 1.96 · se. ``scale: levels``
  (outcomes of few values at every recorded level, "grows with depth"): the exact stratified permutation test of
  level rank x value (``levels_trend``).
- **exact**: a property computed without randomness (a shape, a closed form, an arithmetic step): holds: reproduced;
  fails: not reproduced.

A claim of several parts ("grows; last block 1.07", a value per step) is judged part by part and ``combine``d: all
reproduced -> reproduced; none reproduced (nor partly) and some not reproduced -> not reproduced; inconclusive parts
with the rest reproduced -> inconclusive; any other mix -> partly.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import numpy as np
from scipy import special, stats

from ..model_config import ConfigError

REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "partly", "not reproduced", "inconclusive"
NOT_CHECKABLE = "not checkable here"
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE, NOT_CHECKABLE)
ALPHA = 0.05  # every interval is a 95 % one, every test at 5 %
Z_TWO_SIDED = float(stats.norm.ppf(1 - ALPHA / 2))  # 1.96: once, not in every simulated judgement
MAX_SEEDS = 10_000  # seeds_to_decide searches no further (beyond it: "no practical number of seeds")


class NotCheckable(Exception):
    """The data cannot decide this claim (the reason is the message)."""


@dataclass(frozen=True)
class Judged:
    verdict: str
    rule: str
    margin: str
    seeds_to_decide: int | None = None
    p_reproduced_if_true: float | None = None  # the rule's error rates at this seed count (``errors``)
    p_rejected_if_off: float | None = None
    rates_why: str = ""  # why a decided verdict stands without both error rates at 0.8 (``errors.gate_claim``)
    off_world: str = ""  # the world p_rejected_if_off is simulated in, in words (``errors.OFF``)
    p_reproduced_if_off: float | None = None  # how often the rule says "reproduced" in that world


def g(value: float) -> str:
    return f"{value:.4g}"


def rounding(written: str) -> float:
    """The half-width of the rounding of a number as written: "4.0" -> 0.05, "0.0003" -> 0.00005, "6" -> 0.5,
    "8.5e5" -> 5e3 (half a unit of its last written digit)."""
    try:
        number = Decimal(str(written).strip())
    except InvalidOperation:
        raise ValueError(f"{written!r} is not a number") from None
    if not number.is_finite():  # "nan", "inf": no written precision (their exponent is a letter)
        raise ValueError(f"{written!r} is not a finite number")
    return 0.5 * 10.0 ** number.as_tuple().exponent


def _finite(samples) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    return values[np.isfinite(values)]


@functools.lru_cache(maxsize=None)
def _t(q: float, df: float) -> float:
    """Student's t quantile (cached: the error-rate simulations ask for the same few (q, df) thousands of times).
    scipy's own ``stats.t.ppf`` is ``special.stdtrit(df, q)`` behind argument checks that cost more than the
    quantile: called directly, the same numbers (tests/test_claims.py compares them) at a fraction of the time."""
    return float(special.stdtrit(df, q))


SEARCH = {"on": True}  # off while ``errors`` simulates a rule thousands of times: no seeds-to-decide search there


def _least_n(decides, start: int) -> int | None:
    """The least n >= start for which ``decides(n)`` holds (None: not within MAX_SEEDS)."""
    if not SEARCH["on"]:
        return None
    for n in range(max(2, start), MAX_SEEDS + 1):
        if decides(n):
            return n
    return None


# ---- value -------------------------------------------------------------------------------------------------------------


def value(written: str, samples=(), mean: float | None = None, se: float | None = None,
          half_width: float | None = None, trials: int | None = None, n: int | None = None,
          computed: bool = False) -> Judged:
    """The document's one number, written as ``written``, against our 95 % prediction interval for one run over the
    seeds (``samples``), or against mean ± 1.96 se (``mean``, ``se``: a simulation's mean over its ``n`` trials).
    ``trials``: the document's number is itself a mean over that many trials, so the difference of the two means has
    se √(se² + se_doc²), se_doc = se √(n / trials) (its spread taken as ours). ``computed``: the samples are a
    computation without randomness (a closed form, a fixed checkpoint's forward): one of them is the answer, and the
    margin is the rounding alone; one run of a random quantity has no known spread and decides nothing."""
    x = float(written)
    r = rounding(written) if half_width is None else half_width
    doc = f"the document's {written} ± {g(r)} (its rounding)"
    if mean is not None:
        if trials is not None and n is None:
            raise ValueError("a value with the document's trials needs our number of trials (n)")
        se_doc = se * math.sqrt(n / trials) if trials is not None else 0.0
        both = math.sqrt(se ** 2 + se_doc ** 2)
        half = Z_TWO_SIDED * both
        centre, how = mean, (f"mean ± 1.96 × se {g(se)}" if trials is None else
                             f"mean ± 1.96 × √(se² + se_doc²) = {g(both)}: se {g(se)} over our {n} trials, "
                             f"se_doc {g(se_doc)} over the document's {trials}")
    else:
        values, n_all = _finite(samples), len(np.atleast_1d(samples))
        missing = f"; {n_all - len(values)} of {n_all} runs without a finite value" if len(values) < n_all else ""
        if not len(values):
            return Judged(NOT_REPRODUCED, "value: no run has a finite value to compare",
                          f"{doc}; none of the {n_all} runs has a finite value (never reached, or no value at that step)")
        centre, n = float(values.mean()), len(values)
        if n == 1 and (computed or n_all > 1):
            half, how = 0.0, ("computed without randomness: the margin is the rounding alone" if computed else
                              "one run: no spread known, the margin is the rounding alone") + missing
        elif n == 1:  # one run in all (beside runs without a value, the one that has one is judged by its point
            # above: at most partly, since the others never got there)
            return Judged(INCONCLUSIVE, "value: the document's number ± its rounding must meet our 95 % prediction "
                          "interval for one run; one run of a random quantity has no interval: inconclusive whatever "
                          "its point",
                          f"{doc} vs one run {g(centre)} (no spread known; the two differ by {g(abs(centre - x))}; "
                          f"at least 2 seeds give a spread){missing}")
        else:
            sd = float(values.std(ddof=1))
            t = _t(1 - ALPHA / 2, n - 1)
            half = t * sd * math.sqrt(1 + 1 / n)
            how = f"t(0.975, {n - 1}) = {t:.3g} × sd {g(sd)} × √(1 + 1/{n}), {n} seeds{missing}"
    meets = x - r <= centre + half and x + r >= centre - half
    rule = ("value: the document's number ± its rounding must meet our 95 % "
            + (("interval of the mean" if trials is None else "interval of the difference of the two means (both are "
                "means over trials)") if mean is not None else "prediction interval for one run")
            + ("; a run without a value (diverged, or never there) makes a meeting partly" if mean is None else ""))
    verdict = (PARTLY if mean is None and n < n_all else REPRODUCED) if meets else NOT_REPRODUCED
    return Judged(verdict, rule,
                  f"{doc} vs {g(centre)} ± {g(half)} ({how})")


# ---- range -------------------------------------------------------------------------------------------------------------


def range_(low: str, high: str, samples) -> Judged:
    """A range the document's seeds spanned ("0.16 – 0.71") is a sample of its distribution, and so are our seeds: the
    95 % t-interval of our seeds' mean must meet [low - r_low, high + r_high] (our centre consistent with a centre
    inside the range): reproduced; entirely outside it: not reproduced. One seed has no interval: inconclusive. A seed
    without a value (diverged, never there) makes a meeting partly. (An earlier rule had each seed lie inside: with
    three seeds drawn from exactly the document's distribution that said "reproduced" about a fifth of the time.)"""
    lo, hi = float(low) - rounding(low), float(high) + rounding(high)
    values = np.asarray(samples, dtype=float)
    finite = _finite(values)
    inside = int(((finite >= lo) & (finite <= hi)).sum())
    rule = "range: the 95 % t-interval of our seeds' mean must meet the document's range widened by its ends' rounding"
    band = (f"[{g(lo)}, {g(hi)}] = {low} − {g(rounding(low))} … {high} + {g(rounding(high))}; {inside} of "
            f"{len(values)} seeds inside")
    if len(finite) == 0:
        return Judged(NOT_REPRODUCED, rule, f"{band}; no seed has a finite value")
    if len(finite) == 1:
        return Judged(INCONCLUSIVE, rule + "; one seed has no interval: inconclusive whatever its point",
                      f"{band}; one seed {g(finite[0])}: no spread known")
    n, mean, sd = len(finite), float(finite.mean()), float(finite.std(ddof=1))
    t = _t(1 - ALPHA / 2, n - 1)
    a, b = mean - t * sd / math.sqrt(n), mean + t * sd / math.sqrt(n)
    meets = a <= hi and b >= lo
    verdict = (PARTLY if n < len(values) else REPRODUCED) if meets else NOT_REPRODUCED
    seeds = None
    return Judged(verdict, rule + ("; a seed without a value makes a meeting partly" if n < len(values) else ""),
                  f"{band}; mean {g(mean)}, 95 % interval [{g(a)}, {g(b)}] (t(0.975, {n - 1}) = {t:.3g} × sd {g(sd)} "
                  f"/ √{n})", seeds)


def _share(parts: list[bool]) -> str:
    return REPRODUCED if parts and all(parts) else PARTLY if any(parts) else NOT_REPRODUCED


def _every(parts: list[bool]) -> str:
    """Words about every run ("in all three seeds", "every seed below"): one run that does not is a counter-example,
    so anything short of all is not reproduced ("partly" there could never reject the words)."""
    return REPRODUCED if parts and all(parts) else NOT_REPRODUCED


# ---- inequality --------------------------------------------------------------------------------------------------------


def inequality(bound: str, side: str, scope: str, samples, unit: str = "seeds", computed: bool = False,
               half_width: float | None = None) -> Judged:
    """``side``: below / above the bound; ``scope``: every seed (each seed a part) or typical (the mean's one-sided
    95 % t-bounds; one run decides only when ``computed`` without randomness, as for ``value``). ``half_width``: the
    bound's margin when it is not its written rounding (a bound the project reads into the words has none: 0)."""
    r = rounding(bound) if half_width is None else half_width
    edge = float(bound) + (r if side == "below" else -r)
    values = np.asarray(samples, dtype=float)
    if scope == "every seed":
        ok = [bool(v < edge if side == "below" else v > edge) for v in values]
        return Judged(_every(ok), f"inequality, every seed: each seed {side} the bound widened by its rounding; one "
                      "seed on the other side refutes 'every'",
                      f"{side} {g(edge)} = {bound} {'+' if side == 'below' else '−'} {g(r)}; {sum(ok)} of {len(ok)} {unit}")
    n_all, values = len(values), _finite(values)
    n, mean = len(values), float(values.mean()) if len(values) else float("nan")
    if n == 0:
        raise NotCheckable("no finite measurement to compare with the bound")
    rule = f"inequality, typical run: the mean's one-sided 95 % t-bounds against the bound ({side})"
    if n < n_all:  # a diverged run is not a typical run left out: what the others show is at most partly the claim
        judged = inequality(bound, side, scope, values, unit, computed or n == 1, half_width)  # one left: its point
        verdict = PARTLY if judged.verdict == REPRODUCED else judged.verdict
        return Judged(verdict, rule + "; a run without a value makes a meeting partly",
                      f"{judged.margin}; {n_all - n} of {n_all} runs without a finite value", judged.seeds_to_decide)
    if n == 1:
        ok = mean < edge if side == "below" else mean > edge
        if not computed:  # (beside runs without a value, the one left is compared by its point: at most partly)
            return Judged(INCONCLUSIVE, rule + "; one run of a random quantity has no bound: inconclusive whatever its "
                          "point", f"one run {g(mean)} vs {g(edge)} (bound ± rounding); no spread known, at least 2 "
                          "seeds give one")
        return Judged(REPRODUCED if ok else NOT_REPRODUCED, rule,
                      f"one value {g(mean)} vs {g(edge)} (bound ± rounding), compared by its point")
    sd = float(values.std(ddof=1))
    t = _t(1 - ALPHA, n - 1)
    upper, lower = mean + t * sd / math.sqrt(n), mean - t * sd / math.sqrt(n)
    claimed, other = (upper < edge, lower >= edge) if side == "below" else (lower > edge, upper <= edge)
    verdict = REPRODUCED if claimed else NOT_REPRODUCED if other else INCONCLUSIVE
    seeds = None
    if verdict == INCONCLUSIVE:
        gap = abs(mean - edge)
        seeds = _least_n(lambda m: _t(1 - ALPHA, m - 1) * sd / math.sqrt(m) < gap, n + 1) if gap > 0 else None
    return Judged(verdict, rule, f"mean {g(mean)}, one-sided 95 % bounds [{g(lower)}, {g(upper)}] (t(0.95, {n - 1}) = "
                  f"{t:.3g} × sd {g(sd)} / √{n}) vs {g(edge)} = {bound} ± its rounding", seeds)


# ---- count -------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher's exact test of k1/n1 vs k2/n2: the probability, with the margins fixed, of a table no more
    likely than the one observed (hypergeometric; the 1e-9 relative slack absorbs float ties). Cached: a pure function
    of four counts, called for the same few tables hundreds of thousands of times by the error-rate simulations."""
    total, successes = n1 + n2, k1 + k2
    prob = lambda a: math.comb(successes, a) * math.comb(total - successes, n1 - a) / math.comb(total, n1)  # noqa: E731
    observed = prob(k1)
    return min(1.0, sum(prob(a) for a in range(max(0, successes - n2), min(successes, n1) + 1)
                        if prob(a) <= observed * (1 + 1e-9)))


def shape(k: int, n: int) -> str:
    return "none" if k == 0 else "all" if k == n else "some"


def count(count_: int, of: int, k: int, n: int, key: str = "the count", scope: str = "rate") -> Judged:
    """k of n measured against the document's ``count_`` of ``of``; ``key`` names what was counted (for the error when
    there is nothing to count). ``scope``: ``rate`` (the document's count is a sample of a rate: Fisher's exact test,
    then the shape) or ``every seed`` (the words say every run does it, "in all three seeds": each of our runs a part,
    as the every-seed inequality)."""
    if n <= 0:
        raise NotCheckable(f"{key}: no runs to count (0 runs); a rate needs at least one")
    if not 0 <= k <= n:
        raise ValueError(f"{key}: {k} of {n} is not a count")
    if scope == "every seed":
        if count_ != of:
            raise ValueError(f"{key}: scope every seed is for a claim about all runs ({count_} of {of} is not all)")
        verdict = REPRODUCED if k == n else NOT_REPRODUCED
        return Judged(verdict, "count, every seed: each of our runs must do it, as the document's words say of theirs; "
                      "one run that does not refutes 'every'",
                      f"{k} of {n} runs (the document: {count_} of {of})")
    p = fisher_exact(k, n, count_, of)
    same = shape(k, n) == shape(count_, of)
    verdict = NOT_REPRODUCED if p < ALPHA else REPRODUCED if same else INCONCLUSIVE
    seeds = None
    if verdict == INCONCLUSIVE:
        rate = k / n
        seeds = _least_n(lambda m: fisher_exact(round(rate * m), m, count_, of) < ALPHA, n + 1)
    margin = (f"Fisher's exact test, {k} of {n} vs {count_} of {of}: p = {p:.2g} "
              f"({'<' if p < ALPHA else '≥'} 0.05); shape {shape(k, n)} vs {shape(count_, of)}")
    if all(fisher_exact(j, n, count_, of) >= ALPHA for j in range(n + 1)):  # a test with no power at this size
        margin += (f"; no count of {n} could differ from {count_} of {of} at 5 %: the test cannot refute it here, "
                   "only the shape can")
    return Judged(verdict, "count: Fisher's exact test against the document's count, then the shape (none/some/all)",
                  margin, seeds)


# ---- rates ---------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval of the rate k of n (cached, as ``fisher_exact``)."""
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - ALPHA, method="wilson")
    return float(ci.low), float(ci.high)


def rate_contrast(side: str, k: int, n: int, k_ref: int, n_ref: int, arms: tuple[str, str] = ("a", "b"),
                  what: str = "rate") -> Judged:
    """Two rates, k of n (``arms[0]``) against k_ref of n_ref (``arms[1]``, a recorded reference at the same setup):
    Fisher's exact two-sided test of the 2 x 2 table; p < 0.05 with the rates in the claimed direction (``side``: the
    first above / below the second): reproduced; p < 0.05 the other way: not reproduced; p >= 0.05: inconclusive, with
    the runs of the first arm at which its observed rate would make the test decide against the reference as recorded
    (none when the two rates are equal). The margin shows both rates with their 95 % Wilson intervals."""
    if n <= 0 or n_ref <= 0:
        raise NotCheckable(f"an arm has no runs ({arms[0]}: {n}, {arms[1]}: {n_ref})")
    p = fisher_exact(k, n, k_ref, n_ref)
    up = k / n > k_ref / n_ref
    down = k / n < k_ref / n_ref
    claimed, reverse = (up, down) if side == "above" else (down, up)
    verdict = REPRODUCED if p < ALPHA and claimed else NOT_REPRODUCED if p < ALPHA and reverse else INCONCLUSIVE
    seeds = None
    if verdict == INCONCLUSIVE and (up or down):
        rate = k / n
        seeds = _least_n(lambda m: fisher_exact(round(rate * m), m, k_ref, n_ref) < ALPHA, n + 1)
    (lo, hi), (lo_r, hi_r) = wilson(k, n), wilson(k_ref, n_ref)
    margin = (f"{arms[0]} {k} of {n} {what} (95 % Wilson {lo:.0%}–{hi:.0%}) vs {arms[1]} {k_ref} of {n_ref} "
              f"({lo_r:.0%}–{hi_r:.0%}); Fisher's exact test p = {p:.2g} ({'<' if p < ALPHA else '≥'} 0.05)")
    if all(fisher_exact(j, n, k_ref, n_ref) >= ALPHA for j in range(n + 1)):
        margin += f"; no count of {n} runs could differ from {k_ref} of {n_ref} at 5 %"
    return Judged(verdict, f"rates: Fisher's exact test of {arms[0]}'s rate against {arms[1]}'s recorded rate "
                  f"({side}), p < 0.05 decides; the reverse direction is not reproduced", margin, seeds)


# ---- contrast ----------------------------------------------------------------------------------------------------------


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float, float, float]:
    """(difference of means, its standard error, Welch's df, the arms' variances)."""
    va = float(a.var(ddof=1)) if len(a) > 1 else 0.0
    vb = float(b.var(ddof=1)) if len(b) > 1 else 0.0
    se2 = va / len(a) + vb / len(b)
    terms = [(v / n) ** 2 / (n - 1) for v, n in ((va, len(a)), (vb, len(b))) if n > 1 and v > 0]
    df = se2 ** 2 / sum(terms) if terms else float("inf")
    return float(a.mean() - b.mean()), math.sqrt(se2), df, va, vb


def contrast(side: str, a, b, size: str | None = None, margin: str | None = None, log: bool = False,
             arms: tuple[str, str] = ("a", "b")) -> Judged:
    """a - b over seeds (Welch). ``side``: above / below (the claimed direction) or not above / not below
    (non-inferiority within ``margin``, default 0); ``size``: the claimed |a - b| as written; ``log``: compare
    logarithms (growth factors)."""
    a, b = _finite(a), _finite(b)
    if not len(a) or not len(b):
        raise NotCheckable(f"an arm has no finite measurement ({arms[0]}: {len(a)}, {arms[1]}: {len(b)})")
    if log:
        a, b = np.log(a), np.log(b)
    d, se, df, va, vb = _welch(a, b)
    single = min(len(a), len(b)) == 1 and se > 0  # an arm of one seed: its own spread is unknown, not zero
    point = se == 0 or (len(a) == 1 and len(b) == 1)
    t = 0.0 if point else _t(1 - ALPHA / 2, df)
    lo, hi = d - t * se, d + t * se
    what = f"{'ln ' if log else ''}{arms[0]} − {'ln ' if log else ''}{arms[1]}"
    if point:
        interval = f"{what} = {g(d)} ({'one seed per arm' if len(a) == len(b) == 1 else 'no spread'}: no interval)"
    else:
        interval = (f"{what} = {g(d)}, 95 % Welch interval [{g(lo)}, {g(hi)}] (t(0.975, {df:.3g}) = {t:.3g} × se "
                    f"{g(se)}; {len(a)} and {len(b)} seeds)")
    if side in ("not above", "not below"):
        m = float(margin) if margin is not None else 0.0
        worse = (lambda x: x > m) if side == "not above" else (lambda x: x < m)
        inside = hi <= m if side == "not above" else lo >= m
        outside = worse(lo) if side == "not above" else worse(hi)
        verdict = REPRODUCED if inside else NOT_REPRODUCED if outside else INCONCLUSIVE
        rule = f"contrast, non-inferiority: {what} {side} the margin {g(m)}, by its 95 % Welch interval"
        gap = abs(d - m)
    else:
        claimed = lo > 0 if side == "above" else hi < 0
        reverse = hi <= 0 if side == "above" else lo >= 0
        verdict = REPRODUCED if claimed else NOT_REPRODUCED if reverse else INCONCLUSIVE
        rule = f"contrast: {what} {side} 0 by its 95 % Welch interval; the reverse direction is not reproduced"
        if verdict == REPRODUCED and size is not None:
            s, r = float(size), rounding(size)
            want_lo, want_hi = (s - r, s + r) if side == "above" else (-s - r, -s + r)
            if not (want_lo <= hi and want_hi >= lo):
                verdict = PARTLY
            rule += f"; the claimed size {size} ± {g(r)} must meet it"
            interval += f"; claimed {'+' if side == 'above' else '−'}{size} ± {g(r)}"
        gap = abs(d)
    if (single or (point and se == 0 and len(a) == len(b) == 1)) and verdict != INCONCLUSIVE:
        # one seed per arm, or one arm of one seed: no interval; a computation without randomness is the exact kind
        verdict, rule = INCONCLUSIVE, rule + "; an arm of one seed has no spread: inconclusive whatever its point"
    seeds = None
    if verdict == INCONCLUSIVE and gap > 0 and (va + vb) > 0:
        def decides(n: int) -> bool:
            terms = sum((v / n) ** 2 / (n - 1) for v in (va, vb) if v > 0)
            dfn = ((va + vb) / n) ** 2 / terms
            return _t(1 - ALPHA / 2, dfn) * math.sqrt((va + vb) / n) < gap
        seeds = _least_n(decides, max(len(a), len(b)) + 1)
    return Judged(verdict, rule, interval, seeds)


# ---- trend -------------------------------------------------------------------------------------------------------------


def sign_trend(direction: str, differences, per_seed: int = 1, what: str = "difference last − first") -> Judged:
    """A trend over paired outcomes that take few values (a run learned or not: differences of -1, 0, 1): the exact
    two-sided sign test over the pairs that moved (scipy's binomtest, p < 0.05), not a t-interval on 0/1 data.
    ``per_seed``: how many pairs one seed gives (the grid's settings), so that the seeds that would decide are counted
    in seeds, at the measured shares of moved pairs and of their direction."""
    values = _finite(differences)
    if not len(values):
        raise NotCheckable("no finite difference to judge a trend on")
    up, down = int((values > 0).sum()), int((values < 0).sum())
    moved = up + down
    p = float(stats.binomtest(up, moved, 0.5).pvalue) if moved else 1.0
    claimed, against = (up, down) if direction == "grows" else (down, up)
    verdict = (REPRODUCED if p < ALPHA and claimed > against else NOT_REPRODUCED if p < ALPHA and against > claimed
               else NOT_REPRODUCED if not moved  # no pair moved at all: the measured change is zero, not a trend
               else INCONCLUSIVE)
    seeds = None
    if verdict == INCONCLUSIVE and moved and claimed != against:
        share_moved, share_major = moved / len(values), max(claimed, against) / moved

        def decides(n_pairs: int) -> bool:
            m = round(n_pairs * share_moved)
            k = round(m * share_major)
            return m > 0 and float(stats.binomtest(k, m, 0.5).pvalue) < ALPHA

        pairs = _least_n(decides, len(values) + 1)
        seeds = None if pairs is None else math.ceil(pairs / per_seed)
    rule = (f"trend, {direction}: the {what}, pair by pair, by the exact two-sided sign test over the pairs that "
            "moved (p < 0.05 in the claimed direction; in the other, not reproduced)")
    shown = (f"{what}: {up} up, {down} down, {len(values) - moved} unchanged of {len(values)} pairs "
             f"({per_seed} per seed); sign test p = {p:.3g}")
    return Judged(verdict, rule, shown, seeds)


@functools.lru_cache(maxsize=None)  # few patterns (values -1, 0, 1 over a few levels), asked for thousands of times
def _row_distribution(row: tuple) -> tuple[int, np.ndarray]:
    """One stratum's S = sum_j rank_j * x_pi(j) over the permutations pi of its values: (the least S, the
    probability of each S from it on)."""
    from itertools import permutations

    ranks = np.arange(1, len(row) + 1)
    sums = [int(round(float(np.dot(ranks, perm)))) for perm in permutations(row)]
    low = min(sums)
    probs = np.bincount(np.asarray(sums) - low).astype(float) / len(sums)
    return low, probs


def _rank_sum_distribution(rows: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], float]:
    """The exact distribution of S = sum over strata of sum_j rank_j * x_{stratum, pi(j)}, each stratum's values
    permuted over the levels independently (every permutation equally likely when the level does not matter), and
    its mean: ((each possible S, its probability), the mean). ``rows``: strata x levels of small integers. (Convolved
    as arrays, each stratum pattern computed once a process: the error-rate simulation calls it thousands of times at
    up to 64 seeds.)"""
    low, total = 0, np.ones(1)
    for row in map(tuple, np.asarray(rows, dtype=int).tolist()):
        own_low, own = _row_distribution(row)
        low, total = low + own_low, np.convolve(total, own)
    support = np.arange(low, low + len(total))
    kept = total > 0
    return (support[kept], total[kept]), float(np.dot(support, total))


def levels_p(rows: np.ndarray) -> tuple[float, float, float]:
    """(observed S, its mean under no trend, the exact two-sided p) of the stratified rank-sum trend test."""
    (support, probs), mean = _rank_sum_distribution(rows)
    observed = float((rows * np.arange(1, rows.shape[1] + 1)).sum())
    far = abs(observed - mean) - 1e-9
    return observed, mean, float(min(1.0, sum(probs[np.abs(support - mean) >= far].tolist())))  # summed in S order


def levels_trend(direction: str, rows, levels, per_seed: int = 1, what: str = "difference") -> Judged:
    """A trend over every recorded level (depths 2, 6, 12, 24), on outcomes that take few values (the pre-/post-norm
    gap: learned or not, -1, 0, 1), paired by stratum (a learning rate, warm-up and seed): the exact stratified
    permutation test of S = sum of level rank x value (each stratum's values permuted over its levels; two-sided,
    p < 0.05). Every level counts, not only the two ends."""
    rows = np.asarray(rows, dtype=float)
    rows = rows[np.isfinite(rows).all(axis=1)]
    if not len(rows):
        raise NotCheckable("no stratum has a value at every level")
    rows = rows.astype(int)
    observed, mean, p = levels_p(rows)
    up = observed > mean
    claimed = up if direction == "grows" else observed < mean
    moved = bool((rows.max(axis=1) != rows.min(axis=1)).any())
    verdict = (REPRODUCED if p < ALPHA and claimed else NOT_REPRODUCED if p < ALPHA or not moved else INCONCLUSIVE)
    seeds = None
    if verdict == INCONCLUSIVE and claimed and SEARCH["on"] and per_seed:
        seeds_now = max(1, len(rows) // per_seed)
        for m in range(seeds_now + 1, 41):  # the same strata, seed after seed
            if levels_p(np.tile(rows, (math.ceil(m * per_seed / len(rows)), 1))[: m * per_seed])[2] < ALPHA:
                seeds = m
                break
    shares = ", ".join(f"{lv}: {np.mean(rows[:, j] > 0):.0%} +, {np.mean(rows[:, j] < 0):.0%} −"
                       for j, lv in enumerate(levels))
    rule = (f"trend, {direction}: the {what} at every level, by the exact stratified permutation test of level rank × "
            "value (each stratum permuted over its levels; two-sided p < 0.05 in the claimed direction; in the other, "
            "not reproduced)")
    shown = (f"{what} per level ({shares}); {len(rows)} strata ({per_seed} per seed); rank sum {observed:.0f} vs "
             f"{mean:.1f} with no trend; exact p = {p:.3g}")
    return Judged(verdict, rule, shown, seeds)


def trend(direction: str, ratios=(), band: tuple[str, str] | None = None, scale: str = "ratio",
          ratio: float | None = None, se: float | None = None, what: str | None = None, per_seed: int = 1,
          rows=None, levels=()) -> Judged:
    """Per-seed ``ratios`` (last / first; ``scale: difference``: per-seed differences last - first; ``scale: sign``:
    paired differences judged by their signs, ``sign_trend``), or one ``ratio`` with its standard error ``se``.
    ``direction``: grows / shrinks / flat (within ``band``, two written numbers)."""
    if scale == "levels":
        if direction == "flat":
            raise ValueError("a levels trend grows or shrinks")
        return levels_trend(direction, rows, levels, per_seed, what or "difference")
    if scale == "sign":
        if direction == "flat":
            raise ValueError("a sign trend grows or shrinks; a flat trend needs a band on a ratio or difference")
        return sign_trend(direction, ratios, per_seed, what or "difference last − first")
    if ratio is not None:
        centre = math.log(ratio) if scale == "ratio" else ratio
        half = Z_TWO_SIDED * (se / ratio if scale == "ratio" else se)
        n, sd, how = None, None, f"± 1.96 × se {g(se)}"
    else:
        values = _finite(ratios)
        if not len(values):
            raise NotCheckable("no finite ratio to judge a trend on")
        if scale == "ratio":
            if (values <= 0).any():
                raise ValueError(f"a ratio trend needs positive ratios, got {fmt_list(values)}")
            values = np.log(values)
        n, centre = len(values), float(values.mean())
        if n == 1:
            sd, half, how = 0.0, 0.0, "one seed: no spread known, so no interval"
        else:
            sd = float(values.std(ddof=1))
            t = _t(1 - ALPHA / 2, n - 1)
            half, how = t * sd / math.sqrt(n), f"t(0.975, {n - 1}) = {t:.3g} × sd {g(sd)} / √{n}"
    lo, hi = centre - half, centre + half
    back = (lambda v: math.exp(v)) if scale == "ratio" else (lambda v: v)  # noqa: E731
    neutral = 0.0  # log 1, or a difference of 0
    word = what or ("ratio last / first" if scale == "ratio" else "difference last − first")
    shown = f"{word} {g(back(centre))}, 95 % interval [{g(back(lo))}, {g(back(hi))}] ({how})"
    if direction == "flat":
        if band is None:
            raise ValueError("a flat trend needs its band")
        b_lo, b_hi = (math.log(float(x)) if scale == "ratio" else float(x) for x in band)
        verdict = (REPRODUCED if b_lo <= lo and hi <= b_hi else NOT_REPRODUCED if hi < b_lo or lo > b_hi
                   else INCONCLUSIVE)
        gap = min(abs(centre - b_lo), abs(centre - b_hi))  # to the nearer edge, from inside the band or outside it
        rule = f"trend, flat: the {word}'s 95 % interval within the band {band[0]} – {band[1]}"
        shown += f" vs band [{band[0]}, {band[1]}]"
    else:
        up = direction == "grows"
        claimed, reverse = (lo > neutral, hi <= neutral) if up else (hi < neutral, lo >= neutral)
        verdict = REPRODUCED if claimed else NOT_REPRODUCED if reverse else INCONCLUSIVE
        gap = abs(centre)
        rule = (f"trend, {direction}: the {word}'s 95 % interval {'above' if up else 'below'} "
                f"{'1' if scale == 'ratio' else '0'}")
    if n == 1:  # seeds scatter (at init, three seeds' output/input ratios were x0.97, x2.38, x0.82): one is no trend
        verdict, rule = INCONCLUSIVE, rule + "; one seed has no interval: inconclusive whatever its point"
    seeds = None
    if verdict == INCONCLUSIVE and n is not None and sd and gap > 0:
        seeds = _least_n(lambda m: _t(1 - ALPHA / 2, m - 1) * sd / math.sqrt(m) < gap, n + 1)
    return Judged(verdict, rule, shown, seeds)


def fmt_list(values) -> str:
    return ", ".join(g(v) for v in np.atleast_1d(values))


# ---- exact -------------------------------------------------------------------------------------------------------------


def exact(holds: bool, what: str = "") -> Judged:
    """A property computed without randomness: it holds or it does not."""
    return Judged(REPRODUCED if holds else NOT_REPRODUCED, "exact: computed without randomness; holds or not",
                  what or ("holds" if holds else "fails"))


# ---- a claim: its parts ------------------------------------------------------------------------------------------------


def combine(verdicts) -> str:
    """The verdict of a claim of several parts (or of several claims): all reproduced -> reproduced; none reproduced
    (nor partly) and some not reproduced -> not reproduced; inconclusive parts with the rest reproduced ->
    inconclusive; any other mix -> partly. Parts that are not checkable do not count; none checkable -> not
    checkable here."""
    judged = [v for v in verdicts if v != NOT_CHECKABLE]
    if not judged:
        return NOT_CHECKABLE
    if all(v == REPRODUCED for v in judged):
        return REPRODUCED
    if NOT_REPRODUCED in judged and not any(v in (REPRODUCED, PARTLY) for v in judged):
        return NOT_REPRODUCED
    if all(v in (REPRODUCED, INCONCLUSIVE) for v in judged):
        return INCONCLUSIVE
    return PARTLY


# The rule keys each kind takes from the claim's words (required, optional), and the values a word may take.
KINDS = {
    "value": ({"value"}, {"rounding", "trials"}),  # rounding: the half-width when not the written precision's;
    # trials: the document's number is a mean over this many trials (a simulation): its own sampling error counts
    "range": ({"low", "high"}, set()),
    "inequality": ({"bound", "side", "scope"}, {"rounding"}),  # rounding "0": a bound read into the words
    "count": ({"count", "of"}, {"scope"}),  # scope: rate (default; Fisher) or every seed (the words say "all N")
    "contrast": ({"side"}, {"size", "margin", "scale"}),
    "trend": ({"direction"}, {"band", "scale"}),
    "exact": (set(), set()),
    "rates": ({"side"}, set()),  # a rate of runs (k of n) against a recorded reference's, at the same setup
}
WORDS = {"side": {"inequality": ("below", "above"), "contrast": ("above", "below", "not above", "not below"),
                  "rates": ("above", "below")},
         "scope": {"inequality": ("every seed", "typical"), "count": ("rate", "every seed")}, "direction": ("grows", "shrinks", "flat"),
         "scale": {"contrast": ("linear", "log"), "trend": ("ratio", "difference", "sign", "levels")}}
NUMBERS = ("value", "low", "high", "bound", "size", "margin", "rounding")  # numbers as the document writes them (strings)


def validate_part(where: str, part: dict) -> None:
    """A ConfigError naming the claim, the key and the allowed values for: an unknown kind, an unknown or missing rule
    key, a word the rule does not know, a number that is not written as one, a margin that cannot be met."""
    kind = part.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind: {kind!r} is not a kind of claim; allowed: {', '.join(KINDS)}")
    required, optional = KINDS[kind]
    keys = set(part) - {"kind"}
    if required - keys:
        raise ConfigError(f"{where}: kind {kind} needs {', '.join(sorted(required - keys))}; "
                          f"its rule keys: {', '.join(sorted(required | optional)) or 'none'}")
    if keys - required - optional:
        raise ConfigError(f"{where}.{sorted(keys - required - optional)[0]}: not a rule key of kind {kind}; allowed: "
                          f"{', '.join(sorted(required | optional)) or 'none'}")
    for key in keys:
        allowed = WORDS.get(key)
        if isinstance(allowed, dict):
            allowed = allowed.get(kind)
        if allowed is not None and part[key] not in allowed:
            raise ConfigError(f"{where}.{key}: {part[key]!r}; allowed: {', '.join(allowed)}")
        if key in NUMBERS:
            if not isinstance(part[key], str):
                raise ConfigError(f"{where}.{key}: {part[key]!r} must be written as a string, as the document writes "
                                  "it (its precision is its rounding); allowed: a number in quotes, e.g. \"4.0\"")
            try:
                rounding(part[key])
            except ValueError:
                raise ConfigError(f"{where}.{key}: {part[key]!r} is not a number; allowed: a number in quotes") from None
    if "rounding" in part and float(part["rounding"]) < 0:
        raise ConfigError(f"{where}.rounding: {part['rounding']} is negative, a margin no value can meet; "
                          "allowed: a number >= 0")
    if kind == "range" and float(part["low"]) > float(part["high"]):
        raise ConfigError(f"{where}.low: {part['low']} is above high {part['high']}, a range no value can meet; "
                          "allowed: low <= high")
    if "trials" in part and (not isinstance(part["trials"], int) or isinstance(part["trials"], bool)
                             or part["trials"] < 1):
        raise ConfigError(f"{where}.trials: {part['trials']!r}; allowed: a whole number >= 1 (the document's trials)")
    if kind == "count":
        for key in ("count", "of"):
            if not isinstance(part[key], int) or isinstance(part[key], bool) or part[key] < 0:
                raise ConfigError(f"{where}.{key}: {part[key]!r}; allowed: a whole number >= 0")
        if part["of"] == 0:
            raise ConfigError(f"{where}.of: 0 runs; allowed: at least 1")
        if part.get("scope") == "every seed" and part["count"] != part["of"]:
            raise ConfigError(f"{where}.scope: every seed is for a claim about all runs, and {part['count']} of "
                              f"{part['of']} is not all; allowed: rate, or count equal to of")
        if part["count"] > part["of"]:
            raise ConfigError(f"{where}.count: {part['count']} is larger than its total of={part['of']}; "
                              f"allowed: 0..{part['of']}")
    if kind == "contrast":
        if "margin" in part and not part["side"].startswith("not "):
            raise ConfigError(f"{where}.margin: a margin is for non-inferiority; allowed with side: not above, not below")
        if "size" in part and (part["side"].startswith("not ") or float(part["size"]) < 0):
            raise ConfigError(f"{where}.size: {part['size']}; allowed: a size >= 0, with side above or below")
    if kind == "trend":
        if part.get("scale") in ("sign", "levels") and part["direction"] == "flat":
            raise ConfigError(f"{where}.scale: sign judges a direction; allowed with flat: ratio, difference")
        if (part["direction"] == "flat") != ("band" in part):
            raise ConfigError(f"{where}.band: a band is needed exactly for direction flat; allowed: [low, high] "
                              "with flat, none with grows or shrinks")
        if "band" in part:
            band = part["band"]
            if (not isinstance(band, list) or len(band) != 2 or not all(isinstance(x, str) for x in band)):
                raise ConfigError(f"{where}.band: {band!r}; allowed: two numbers in quotes, [low, high]")
            for x in band:
                try:
                    rounding(x)
                except ValueError:
                    raise ConfigError(f"{where}.band: {x!r} is not a finite number; allowed: two numbers in quotes, "
                                      "[low, high]") from None
            if float(band[0]) > float(band[1]) or (part.get("scale", "ratio") == "ratio" and float(band[0]) <= 0):
                raise ConfigError(f"{where}.band: {band} cannot be met; allowed: 0 < low <= high (a ratio's band)")


def judge_part(part: dict, measure: dict) -> Judged:
    """One part: the rule of its kind, with the claim's words (``part``) and the measured numbers (``measure``)."""
    words = {k: v for k, v in part.items() if k != "kind"}
    kind = part["kind"]
    if kind == "value":
        half = float(words["rounding"]) if "rounding" in words else None
        return value(words["value"], half_width=half, trials=words.get("trials"), **measure)
    if kind == "range":
        return range_(words["low"], words["high"], measure["samples"])
    if kind == "inequality":
        half = float(words["rounding"]) if "rounding" in words else None
        return inequality(words["bound"], words["side"], words["scope"], half_width=half, **measure)
    if kind == "count":
        return count(words["count"], words["of"], scope=words.get("scope", "rate"), **measure)
    if kind == "contrast":
        return contrast(words["side"], size=words.get("size"), margin=words.get("margin"),
                        log=words.get("scale") == "log", **measure)
    if kind == "trend":
        return trend(words["direction"], band=tuple(words["band"]) if "band" in words else None,
                     scale=words.get("scale", "ratio"), **measure)
    if kind == "rates":
        return rate_contrast(words["side"], **measure)
    return exact(**measure)


def describe(part: dict) -> tuple[str, str]:
    """The rule and the document's side of the margin, from the claim's words alone (for a claim the data cannot
    measure: the table still says how it would be judged)."""
    kind = part["kind"]
    if kind == "value":
        r = float(part["rounding"]) if "rounding" in part else rounding(part["value"])
        return ("value: the document's number ± its rounding must meet our 95 % prediction interval for one run",
                f"the document's {part['value']} ± {g(r)}")
    if kind == "range":
        lo, hi = float(part["low"]) - rounding(part["low"]), float(part["high"]) + rounding(part["high"])
        return "range: each seed inside the document's range widened by its ends' rounding", f"[{g(lo)}, {g(hi)}]"
    if kind == "inequality":
        r = float(part["rounding"]) if "rounding" in part else rounding(part["bound"])
        edge = float(part["bound"]) + (r if part["side"] == "below" else -r)
        return f"inequality, {part['scope']}: {part['side']} the bound widened by its rounding", f"{part['side']} {g(edge)}"
    if kind == "count" and part.get("scope") == "every seed":
        return "count, every seed: each of our runs must do it", f"{part['count']} of {part['of']}: every run"
    if kind == "count":
        return ("count: Fisher's exact test against the document's count, then the shape (none/some/all)",
                f"{part['count']} of {part['of']}, p < 0.05 decides")
    if kind == "contrast":
        return f"contrast: the difference of the arms {part['side']} 0 by its 95 % Welch interval", f"side {part['side']}"
    if kind == "trend":
        band = f" within {part['band'][0]} – {part['band'][1]}" if "band" in part else ""
        if part.get("scale") == "sign":
            return (f"trend, {part['direction']}: the paired differences by the exact two-sided sign test (p < 0.05)",
                    part["direction"])
        what = "the difference last − first" if part.get("scale") == "difference" else "the ratio (on its log)"
        return f"trend, {part['direction']}: the 95 % interval of {what}{band}", part["direction"] + band
    if kind == "rates":
        return (f"rates: Fisher's exact test of the rate against the recorded reference's ({part['side']}), p < 0.05 "
                "decides", f"side {part['side']}")
    return "exact: computed without randomness; holds or not", "holds or not"


def judge_parts(parts: list[dict], measures: list[dict], labels: list[str],
                judged: list[Judged] | None = None) -> tuple[str, Judged]:
    """The kind (words), and the combined Judged of a claim's parts: each part's rule, margin and seeds to decide
    joined with its label (what the part is: "step 200", "12 blocks"). ``judged``: the parts' Judged when already
    judged (``errors.gate_claim``: kept or made inconclusive by their error rates); the claim's error rates are those
    of this combined verdict, its parts drawn in one world."""
    judged = judged if judged is not None else [judge_part(p, m) for p, m in zip(parts, measures)]
    verdict = combine(j.verdict for j in judged)
    rules = list(dict.fromkeys(j.rule for j in judged))
    seeds = [j.seeds_to_decide for j in judged if j.verdict == INCONCLUSIVE]
    kinds = " + ".join(dict.fromkeys(p["kind"] for p in parts))
    if len(judged) == 1:
        margin = judged[0].margin
    else:
        shown = list(enumerate(judged))
        if len(judged) > MAX_SHOWN:  # many parts of one kind (a value per depth): the tally, the first and the last
            tally = ", ".join(f"{sum(j.verdict == v for j in judged)} {v}" for v in VERDICTS
                              if any(j.verdict == v for j in judged))
            shown = [shown[0], shown[-1]]
        margin = "; ".join(f"{labels[i] + ': ' if labels[i] else ''}{j.margin} → {j.verdict}" for i, j in shown)
        if len(judged) > MAX_SHOWN:
            margin = f"{len(judged)} parts: {tally}; the first and the last: {margin}"
    return kinds, Judged(verdict, "; ".join(rules), margin,
                         # seeds to decide: only for a claim left inconclusive (a part's count would mislead beside a
                         # decided verdict)
                         (None if any(s is None for s in seeds) else max(seeds)) if seeds and verdict == INCONCLUSIVE
                         else None)


MAX_SHOWN = 6  # a claim of more parts shows its tally and its first and last part's margins
