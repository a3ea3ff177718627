"""Mechanisms tested like detectors: for each candidate precursor of a spike or collapse, over every
recorded post-norm + warm-up run, the hit rate over events and the false-alarm rate over event-free windows of the
same length, with 95 % Wilson intervals, and the lead time before the loss starts to rise.

The procedure was fixed before the numbers were looked at (docs/dynamics.md, "Precursors as detectors"):
- event: a run's first spike or collapse as ``dynamics.events`` defines it (``events()``: the first step after learning
  with loss > spike_above). Onset, "the loss starts to rise": the first step in the ONSET_SEARCH steps up to and
  including the event step, and at or after learned_step + learned_for, at which the loss is above ONSET_FACTOR x the
  median of its previous ONSET_HISTORY steps and above learned_below;
- a detector on metric m (block metrics folded to the max over blocks, the min for attention entropy) fires at a
  recorded step t when m(t) >= FACTOR x the median of m over the previous HISTORY recorded steps (attention entropy: a
  drop, m(t) <= median / FACTOR). Adam's ratio also by the fixed 3x rule of docs/dynamics.md (``ADAM_JUMP``; its
  reference: the median over steps t-60..t-11, fires when m(t) > 3 x it, strictly);
- hit: it fires in the WINDOW steps before the onset (t in [onset - WINDOW, onset - 1]); lead time: onset - its first
  firing there. Late: no firing there, but one from the onset to the event step;
- false alarm: over non-overlapping WINDOW-step windows of each run, from max(learned_step + learned_for, warm-up + 1)
  to EXCLUDE_BEFORE + 1 steps before its event (or its last step), and only within the phase of training where the
  events happen (from the earliest onset's hit window to the latest event step of the table; a quiet window
  at step 150 says nothing about step 550): the fraction of windows in which it fires.

Intervals: windows of one run are not independent, so the false-alarm rate's 95 % interval is a bootstrap
that resamples runs (``BOOTSTRAP`` resamples, seeded), widened where needed to the Wilson interval with the runs as
its sample size (a run's windows as one observation; a rate of 0 keeps an upper bound), not a Wilson interval over
windows; the hit rate counts one
event per run (a run's first), so its Wilson interval is over runs. A seed recorded on two processors is one run (the
record with the most diagnostic steps is kept): it is counted once.

Every rate is given at two resolutions, never mixed in one row: ``every step`` (only the windows where the metric is
recorded at every step of the window and of the history the rule reads: the recorded snapshots keep every step only
near events and up to step 60, ``dynamics.kept_steps``) and ``every 10th step`` (the metric at the steps that are
multiples of 10, which every recorded run has everywhere). A window without the history or the samples is "not
evaluable" at that resolution and counted apart, never as a miss or a quiet window.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...model_config import ConfigError
from ...io import read_table, write_table
from ...run_settings import CopyTask
from .aggregate import ADAM_JUMP, wilson
from .plan import events

WINDOW = 50          # L: the hit window before the onset, and the length of an event-free window
HISTORY = 20         # the detector's reference: the median over the previous 20 recorded steps
FACTOR = 3.0         # ... fires at >= 3x it (a drop to <= 1/3 for attention entropy)
ONSET_FACTOR, ONSET_HISTORY, ONSET_SEARCH = 2.0, 20, 100   # the onset: loss > 2 x median of the previous 20 steps
EXCLUDE_BEFORE = 100  # event-free windows end more than 100 steps before an event
FIXED_REF = (60, 11)  # the fixed 3x rule's reference: steps t-60 .. t-11 (docs/dynamics.md's e-60..e-11 before e-10..e-1)
FIXED_MIN = 5         # ... evaluable when that reference holds at least 5 recorded values (the 10-step grid has 5)
RESOLUTIONS = {"every step": 1, "every 10th step": 10}
BOOTSTRAP = 2000      # resamples of runs for the false-alarm rate's interval (seeded: the same table on every machine)


def run_bootstrap(per_run: pd.DataFrame, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile interval of sum(fires) / sum(windows) when the runs (rows: ``fires``, ``windows``) are
    resampled with replacement; (nan, nan) without windows."""
    if per_run.empty or per_run["windows"].sum() == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    f, m = per_run["fires"].to_numpy(dtype=float), per_run["windows"].to_numpy(dtype=float)
    pick = rng.integers(0, len(f), size=(BOOTSTRAP, len(f)))
    tot = m[pick].sum(axis=1)
    rates = np.where(tot > 0, f[pick].sum(axis=1) / np.where(tot > 0, tot, 1), np.nan)
    low, high = np.nanpercentile(rates, [2.5, 97.5])
    return float(low), float(high)


@dataclass(frozen=True)
class Detector:
    name: str       # the table's row name
    metric: str     # the diagnostic (training.diagnostics.METRICS)
    fold: str       # how blocks fold into one series: "max" (the block where it is largest) or "min"
    rule: str       # "median" (the generic rule) or "fixed" (the fixed 3x rule of docs/dynamics.md, Adam's ratio)

    @property
    def drop(self) -> bool:
        return self.fold == "min"

    def need(self, every: int) -> int:
        """Steps of history the rule reads before a window, at a resolution of ``every`` steps."""
        return FIXED_REF[0] if self.rule == "fixed" else HISTORY * every

    def words(self) -> str:
        fold = "min over blocks" if self.fold == "min" else "max over blocks"
        if self.rule == "fixed":
            return f"{fold}; > {ADAM_JUMP:g}x the median of steps t-{FIXED_REF[0]}..t-{FIXED_REF[1]} (the fixed rule)"
        sign = f"<= median / {FACTOR:g}" if self.drop else f">= {FACTOR:g}x median"
        return f"{fold}; {sign} of the previous {HISTORY} recorded steps"


DETECTORS = [
    Detector("adam_rms", "adam_rms", "max", "fixed"),
    Detector("adam_rms (20-step rule)", "adam_rms", "max", "median"),
    Detector("update_ratio", "update_ratio", "max", "median"),
    Detector("grad_ffn_out", "grad_ffn_out", "max", "median"),
    Detector("attn_logit_max", "attn_logit_max", "max", "median"),
    Detector("attn_entropy", "attn_entropy", "min", "median"),
    Detector("output_logit_max", "output_logit_max", "max", "median"),
    Detector("stream_norm", "stream_norm", "max", "median"),
]


# ---- the rules on one series ---------------------------------------------------------------------------------------


def onset(steps, losses, event_step: int, start: int, learned_below: float) -> int | None:
    """The first step s in [event_step - ONSET_SEARCH + 1, event_step], s >= start, with loss(s) > ONSET_FACTOR x the
    median of the ONSET_HISTORY steps before it and loss(s) > learned_below; None when no step qualifies."""
    curve = pd.Series(np.asarray(losses, dtype=float), index=np.asarray(steps, dtype=int)).sort_index()
    reference = curve.shift(1).rolling(ONSET_HISTORY, min_periods=ONSET_HISTORY).median()
    lo = max(int(start), int(event_step) - ONSET_SEARCH + 1)
    span = curve.index[(curve.index >= lo) & (curve.index <= event_step)]
    for s in span:
        if curve[s] > ONSET_FACTOR * reference[s] and curve[s] > learned_below:
            return int(s)
    return None


def firing(series: pd.Series, detector: Detector) -> pd.DataFrame:
    """Per recorded step of ``series`` (index: step, sorted): the reference, the ratio m / reference (reference / m for
    a drop) and whether the detector fires; steps without the history the rule needs have NaN and do not fire."""
    series = series.sort_index().astype(float)
    if detector.rule == "fixed":
        steps, values = series.index.to_numpy(), series.to_numpy()
        ref = np.full(len(series), np.nan)
        for i, t in enumerate(steps):
            lo, hi = np.searchsorted(steps, t - FIXED_REF[0]), np.searchsorted(steps, t - FIXED_REF[1], side="right")
            if hi - lo >= FIXED_MIN:
                ref[i] = np.median(values[lo:hi])
        reference = pd.Series(ref, index=series.index)
        ratio = series / reference
        fires = ratio > ADAM_JUMP
    else:
        reference = series.shift(1).rolling(HISTORY, min_periods=HISTORY).median()
        ratio = reference / series if detector.drop else series / reference
        fires = ratio >= FACTOR
    return pd.DataFrame({"value": series, "reference": reference, "ratio": ratio, "fires": fires & ratio.notna()})


def at_resolution(series: pd.Series, every: int) -> pd.Series:
    return series if every == 1 else series[series.index % every == 0]


def covered(steps: np.ndarray, lo: int, hi: int, every: int) -> bool:
    """Whether every multiple of ``every`` in [lo, hi] is a recorded step (a rule's history and its window)."""
    want = np.arange(math.ceil(max(lo, 1) / every) * every, hi + 1, every)
    return lo >= 1 and bool(np.isin(want, steps).all())


def fold(diagnostics: pd.DataFrame, metric: str, how: str) -> pd.Series:
    part = diagnostics[diagnostics["metric"] == metric].groupby("step")["value"]
    return (part.max() if how == "max" else part.min()).sort_index().astype(float)


# ---- which runs: snapshots and aggregated tables ---------------------------------------------------------------------


def load_sources(paths, vocab_size: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(runs, losses, diagnostics) of the post-norm + warm-up runs recorded in ``paths``: snapshot directories
    (``blocklab dynamics snapshot``: runs.csv) or aggregated tables (``data/dynamics``: summary.csv). A run is its
    setting and name: the same seed on another processor is the same run, counted once, read from the
    processor that recorded most of the setting's seeds; recorded there in several places, the record with the most
    diagnostic steps is kept (a per-step re-run replaces a thinned snapshot); its machine is the one named."""
    records = []
    for path in map(Path, paths):
        if (path / "runs.csv").is_file():
            runs = read_table(path / "runs.csv")
        elif (path / "summary.csv").is_file():
            runs = read_table(path / "summary.csv")
        else:
            raise ConfigError(f"{path}: no dynamics runs there (neither runs.csv nor summary.csv); allowed: a snapshot "
                              "directory (records/dynamics/<name>) or the aggregated tables (data/dynamics)")
        missing = [n for n in ("losses.csv", "diagnostics.parquet") if not (path / n).is_file()]
        if missing:
            raise ConfigError(f"{path}: missing {', '.join(missing)}; allowed: directories written by "
                              "`blocklab dynamics snapshot` or `blocklab dynamics aggregate`")
        runs = runs[(runs["norm"] == "post") & (runs["warmup"] > 0)].copy()
        if runs.empty:
            continue
        if "vocab_size" not in runs:
            runs["vocab_size"] = vocab_size
        runs["machine"] = runs["machine"].fillna("?") if "machine" in runs else "?"
        runs["source"] = path.as_posix()
        losses = read_table(path / "losses.csv")
        diagnostics = pd.read_parquet(path / "diagnostics.parquet").astype(
            {"value": "float64", "step": "int64", "block": "int64"})
        for r in runs.itertuples(index=False):
            curve = losses[(losses["setting"] == r.setting) & (losses["run"] == r.run)]
            diag = diagnostics[(diagnostics["setting"] == r.setting) & (diagnostics["run"] == r.run)]
            records.append(({"source": r.source, "setting": r.setting, "run": r.run, "seed": int(r.seed),
                             "warmup": int(r.warmup), "machine": r.machine, "vocab_size": int(r.vocab_size)},
                            curve, diag))
    # one processor per seed: a setting's runs are read from the processor that recorded most of its seeds (the same
    # seed can end differently on another processor), the densest record there; other processors fill only the
    # seeds it lacks
    seeds_on: dict[tuple, set] = {}
    for record in records:
        seeds_on.setdefault((record[0]["setting"], record[0]["machine"]), set()).add(record[0]["run"])
    rank = lambda record: (len(seeds_on[(record[0]["setting"], record[0]["machine"])]),  # noqa: E731
                           len(record[2]), len(record[1]))
    best: dict[tuple, tuple] = {}
    for record in records:
        key = (record[0]["setting"], record[0]["run"])
        if key not in best or rank(record) > rank(best[key]):
            best[key] = record
    kept = list(best.values())
    if not kept:
        return pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
    runs = pd.DataFrame([r[0] for r in kept])
    runs["key"] = [f"{r['setting']}/{r['run']}@{r['machine']}" for r in runs.to_dict("records")]
    losses = pd.concat([c.assign(key=k) for (_, c, _), k in zip(kept, runs["key"])], ignore_index=True)
    diagnostics = pd.concat([d.assign(key=k) for (_, _, d), k in zip(kept, runs["key"])], ignore_index=True)
    return runs, losses, diagnostics


# ---- the table -------------------------------------------------------------------------------------------------------


def judge_runs(runs: pd.DataFrame, losses: pd.DataFrame, rule: dict) -> pd.DataFrame:
    """Each run's events (``events()``), its onset, and where its event-free windows may lie."""
    rows = []
    for r in runs.to_dict("records"):
        curve = losses[losses["key"] == r["key"]].sort_values("step")
        got = events(curve["loss"], curve["step"], rule, int(r["vocab_size"]))
        row = {**r, "outcome": got["outcome"], "learned_step": got["learned_step"], "event_step": got["spike_step"],
               "event_loss": got["spike_loss"], "last_step": int(curve["step"].max()), "onset": float("nan"),
               "onset_loss": float("nan")}
        if got["outcome"] != "never learned":
            start = int(got["learned_step"]) + rule["learned_for"]
            row["quiet_from"] = max(start, int(r["warmup"]) + 1)
            if not math.isnan(got["spike_step"]):
                e = int(got["spike_step"])
                at = onset(curve["step"], curve["loss"], e, start, rule["learned_below"])
                row["onset"] = float(at if at is not None else e)
                row["onset_loss"] = float(curve.loc[curve["step"] == row["onset"], "loss"].iloc[0])
                row["quiet_to"] = e - EXCLUDE_BEFORE - 1
            else:
                row["quiet_to"] = row["last_step"]
        rows.append(row)
    return pd.DataFrame(rows)


# one row per event x detector x resolution (``evaluate``); the columns are fixed so that a set of runs with no event
# writes a table with its header, which every reader can parse, not an empty file
EVENT_COLUMNS = ["detector", "resolution", "key", "setting", "run", "machine", "event_step", "onset", "window_samples",
                 "status", "first_fire", "lead", "peak_ratio"]


def evaluate(judged: pd.DataFrame, diagnostics: pd.DataFrame,
             detectors: list[Detector] = DETECTORS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the detector table, one row per event x detector x resolution). Runs that never learned take no part."""
    learned = judged[judged["outcome"] != "never learned"]
    per_event, per_window = [], []
    with_event = learned[learned["event_step"].notna()]
    # the phase of training where the events happen: false alarms are counted there only
    phase = ((int(with_event["onset"].min()) - WINDOW, int(with_event["event_step"].max())) if len(with_event)
             else (-math.inf, math.inf))
    by_key = dict(tuple(diagnostics.groupby("key", sort=False))) if len(diagnostics) else {}
    for r in learned.to_dict("records"):
        diag = by_key.get(r["key"], diagnostics.iloc[0:0])
        for detector in detectors:
            full = fold(diag, detector.metric, detector.fold)
            for resolution, every in RESOLUTIONS.items():
                series = at_resolution(full, every)
                fired = firing(series, detector)
                steps = series.index.to_numpy()
                need = detector.need(every)
                base = {"detector": detector.name, "resolution": resolution, "key": r["key"]}
                if not math.isnan(r["event_step"]):
                    on, e = int(r["onset"]), int(r["event_step"])
                    lo, hi = on - WINDOW, on - 1
                    row = {**base, "setting": r["setting"], "run": r["run"], "machine": r["machine"],
                           "event_step": e, "onset": on, "window_samples": int(((steps >= lo) & (steps <= hi)).sum())}
                    if not covered(steps, lo - need, e, every):
                        row.update(status="not evaluable", first_fire=float("nan"), lead=float("nan"))
                    else:
                        window = fired[(fired.index >= lo) & (fired.index <= hi)]
                        late = fired[(fired.index >= on) & (fired.index <= e)]
                        hits = window.index[window["fires"]]
                        late_hits = late.index[late["fires"]]
                        if len(hits):
                            row.update(status="hit", first_fire=float(hits[0]), lead=float(on - hits[0]))
                        elif len(late_hits):
                            row.update(status="late", first_fire=float(late_hits[0]), lead=float("nan"))
                        else:
                            row.update(status="miss", first_fire=float("nan"), lead=float("nan"))
                        row["peak_ratio"] = float(window["ratio"].max()) if window["ratio"].notna().any() else float("nan")
                    per_event.append(row)
                start, stop = r.get("quiet_from"), r.get("quiet_to")
                if start is None or (isinstance(start, float) and math.isnan(start)):
                    continue
                for a in range(int(start), int(stop) - WINDOW + 2, WINDOW):
                    b = a + WINDOW - 1
                    if a < phase[0] or b > phase[1]:
                        continue
                    ok = covered(steps, a - need, b, every)
                    window = fired[(fired.index >= a) & (fired.index <= b)]
                    per_window.append({**base, "start": a, "evaluable": ok,
                                       "fires": bool(ok and window["fires"].any())})
    events_ = pd.DataFrame(per_event, columns=EVENT_COLUMNS)
    windows = pd.DataFrame(per_window, columns=["detector", "resolution", "key", "start", "evaluable", "fires"])
    return summarize(events_, windows, detectors), events_


def summarize(events_: pd.DataFrame, windows: pd.DataFrame, detectors: list[Detector]) -> pd.DataFrame:
    rows = []
    for detector in detectors:
        for resolution in RESOLUTIONS:
            ev = events_[(events_["detector"] == detector.name) & (events_["resolution"] == resolution)]
            wi = windows[(windows["detector"] == detector.name) & (windows["resolution"] == resolution)
                         & windows["evaluable"]]
            judged = ev[ev["status"] != "not evaluable"]
            n, k = len(judged), int((judged["status"] == "hit").sum())
            m, f = len(wi), int(wi["fires"].sum())
            leads = judged.loc[judged["status"] == "hit", "lead"]
            hit_low, hit_high = wilson(k, n)  # one event per run: over runs
            per_run = wi.groupby("key")["fires"].agg(fires="sum", windows="size").reset_index()
            fa_low, fa_high = run_bootstrap(per_run)
            if m:  # a bootstrap of a rate of 0 (or 1) has no width: at least the Wilson interval with runs as the n
                w_low, w_high = wilson(f / m * len(per_run), len(per_run))
                fa_low, fa_high = min(fa_low, w_low), max(fa_high, w_high)
            rows.append({
                "detector": detector.name, "metric": detector.metric, "rule": detector.words(),
                "resolution": resolution, "events": len(ev), "events_evaluable": n, "hits": k,
                "late": int((judged["status"] == "late").sum()), "missed": int((judged["status"] == "miss").sum()),
                "hit_rate": k / n if n else float("nan"), "hit_low": hit_low, "hit_high": hit_high,
                "lead_median": float(leads.median()) if len(leads) else float("nan"),
                "lead_min": float(leads.min()) if len(leads) else float("nan"),
                "lead_max": float(leads.max()) if len(leads) else float("nan"),
                "samples_per_hit_window": float(judged["window_samples"].median()) if n else float("nan"),
                "windows": m, "false_alarms": f, "fa_rate": f / m if m else float("nan"),
                "fa_low": fa_low, "fa_high": fa_high, "runs": int(wi["key"].nunique()),
                "runs_with_fa": int(wi.loc[wi["fires"], "key"].nunique()),
                "windows_not_evaluable": int(((windows["detector"] == detector.name)
                                              & (windows["resolution"] == resolution) & ~windows["evaluable"]).sum()),
            })
    return pd.DataFrame(rows)


def detector_tables(paths, rule: dict, vocab_size: int) -> dict[str, pd.DataFrame]:
    """The detector table, the per-event rows and each run's events and onset, from snapshot or aggregate dirs."""
    runs, losses, diagnostics = load_sources(paths, vocab_size)
    if runs.empty:
        raise ConfigError(f"{', '.join(map(str, paths))}: no post-norm + warm-up run recorded there; allowed: "
                          "directories with runs of dynamics.collapse")
    return _tables(runs, losses, diagnostics, rule)


def from_frames(summary: pd.DataFrame, losses: pd.DataFrame, diagnostics: pd.DataFrame, rule: dict,
                vocab_size: int, source: str = "data/dynamics") -> dict[str, pd.DataFrame]:
    """The same tables from the aggregated frames already in memory (``data/dynamics``: summary, losses, diagnostics),
    e.g. the report's; empty tables when no post-norm + warm-up run is there."""
    runs = summary[(summary["norm"] == "post") & (summary["warmup"] > 0)]
    if runs.empty:
        return {"detectors": pd.DataFrame(), "detector_events": pd.DataFrame(), "detector_runs": pd.DataFrame()}
    machine = runs["machine"].fillna("?") if "machine" in runs else pd.Series("?", index=runs.index)
    runs = pd.DataFrame({"source": source, "setting": runs["setting"], "run": runs["run"],
                         "seed": runs["seed"].astype(int), "warmup": runs["warmup"].astype(int), "machine": machine,
                         "vocab_size": vocab_size})
    runs["key"] = [f"{s}/{r}@{m}" for s, r, m in zip(runs["setting"], runs["run"], runs["machine"])]
    key = {(s, r): k for s, r, k in zip(runs["setting"], runs["run"], runs["key"])}
    tag = lambda frame: frame.assign(key=[key.get(p) for p in zip(frame["setting"], frame["run"])]).dropna(  # noqa: E731
        subset=["key"])
    return _tables(runs.reset_index(drop=True), tag(losses), tag(diagnostics), rule)


def _tables(runs, losses, diagnostics, rule) -> dict[str, pd.DataFrame]:
    judged = judge_runs(runs, losses, rule)
    table, per_event = evaluate(judged, diagnostics)
    return {"detectors": table, "detector_events": per_event, "detector_runs": judged}


def write_tables(tables: dict[str, pd.DataFrame], out: str | Path) -> None:
    out = Path(out)
    for name, frame in tables.items():
        write_table(frame, out / f"{name}.csv")


TABLES = {"detectors": "data/dynamics/detectors.csv", "detector_events": "data/dynamics/detector_events.csv",
          "detector_runs": "data/dynamics/detector_runs.csv"}


def register(subparsers) -> None:
    p = subparsers.add_parser("detectors",
                              help="hit and false-alarm rates of each precursor of a spike or collapse (detectors.csv)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--from", dest="sources", action="append", type=Path, default=None, metavar="DIR",
                   help="a snapshot directory (records/dynamics/<name>) or aggregated tables (data/dynamics); repeatable; "
                        "default: data/dynamics")
    p.add_argument("--out", type=Path, default=Path("data/dynamics"))
    p.set_defaults(func=_main)


def _main(args) -> None:
    from ...params_file import load_params

    params = load_params(args.params)
    sources = args.sources or [Path("data/dynamics")]
    tables = detector_tables(sources, params["dynamics"]["events"], CopyTask.from_params(params).vocab_size)
    write_tables(tables, args.out)
    print(tables["detectors"][["detector", "resolution", "hits", "events_evaluable", "false_alarms", "windows"]]
          .to_string(index=False))


def _ranges(steps) -> list[tuple[int, int]]:
    """Maximal runs of consecutive steps (first, last)."""
    steps = np.unique(np.asarray(steps, dtype=int))
    if not len(steps):
        return []
    cut = np.flatnonzero(np.diff(steps) != 1)
    return list(zip(steps[np.r_[0, cut + 1]], steps[np.r_[cut, len(steps) - 1]]))


def resolution(runs: pd.DataFrame, diagnostics: pd.DataFrame, metrics=("adam_rms", "attn_logit_max")) -> pd.DataFrame:
    """What each recorded run really has, per metric: the step ranges recorded at every step (10 steps or longer) and
    the spacing elsewhere; runs with the same description are one row (their seeds listed)."""
    rows = []
    by_key = dict(tuple(diagnostics.groupby("key", sort=False))) if len(diagnostics) else {}
    for r in runs.to_dict("records"):
        diag = by_key.get(r["key"], diagnostics.iloc[0:0])
        for metric in metrics:
            steps = np.unique(diag.loc[diag["metric"] == metric, "step"].to_numpy())
            if not len(steps):
                continue
            dense = [(a, b) for a, b in _ranges(steps) if b - a + 1 >= 10]
            inside = np.zeros(len(steps), dtype=bool)
            for a, b in dense:
                inside |= (steps >= a) & (steps <= b)
            gaps = np.diff(steps[~inside]) if (~inside).sum() > 1 else np.array([], dtype=int)
            rows.append({"source": r["source"], "setting": r["setting"], "machine": r["machine"], "metric": metric,
                         "every_step": ", ".join(f"{a}–{b}" for a, b in dense) or "none",
                         "elsewhere": f"every {int(np.median(gaps))}th step" if len(gaps) else "—",
                         "last_step": int(steps[-1]), "seed": int(r["seed"])})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    keys = ["source", "setting", "machine", "metric", "every_step", "elsewhere", "last_step"]
    return (frame.groupby(keys, sort=False)["seed"].apply(lambda s: " ".join(map(str, sorted(s)))).reset_index())
