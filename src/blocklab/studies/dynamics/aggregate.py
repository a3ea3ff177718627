"""The dynamics study's tables from its runs: per-step losses, the training-time diagnostics, one summary row per run
with its events (judged with ``dynamics.events``: ``plan.events``) and the collapse rates with their intervals; read
from the runs' directories or from snapshots in git, and snapshots of finished runs (thinned to the steps that are
read). Also the one reading of a step that the figures, the claims and the mechanism table share (``at_step``,
``ends_ratio``), and what the diagnostics say about why: the precursors of each event and the first steps' updates.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ...model_config import ConfigError
from ...integrity import begin_snapshot, interrupted, read_run, record_snapshot, snapshot_file, verify_unfinished
from ...run_settings import Sweep
from .plan import SNAPSHOT_FILES, events, from_records, from_runs, plan, read_snapshots, snapshots, unrecorded

WINDOW = 5  # a per-step gradient is one batch's: a point at step s averages the steps within +-5 of it (11 steps)
ANATOMY_BEFORE, ANATOMY_AFTER = 150, 100  # the anatomy figure's window around an event (steps before, after)
EARLY, THIN = 60, 10  # a snapshot keeps every diagnostic step up to EARLY, and every THIN-th after it (kept_steps)


def at_step(frame: pd.DataFrame, step: int) -> tuple[pd.Series, bool]:
    """The per-block values AT ``step`` when the metric is recorded there (exact: True); otherwise the mean over the
    recorded steps within +-WINDOW of it (exact: False, and the figure says so). Empty when neither. The one reading
    of a step that the figure, the claims and the mechanism table share."""
    exact = frame[frame["step"] == step]
    if len(exact):
        return exact.groupby("block")["value"].mean().sort_index(), True
    near = frame[(frame["step"] >= step - WINDOW) & (frame["step"] <= step + WINDOW)]
    return near.groupby("block")["value"].mean().sort_index(), False


def ends_ratio(by_block: pd.Series) -> float:
    """Output end / input end: the mean of the last sixth of the stack over the first sixth (4 blocks of 24); NaN for
    no blocks."""
    if not len(by_block):
        return float("nan")
    by_block = by_block.sort_index()
    ends = max(1, len(by_block) // 6)
    return float(by_block.iloc[-ends:].mean() / by_block.iloc[:ends].mean())


def figure_steps(warmup: int, steps: int) -> list[int]:
    """At init, halfway through warm-up, at its end, and as long again after it (capped at the budget)."""
    return sorted({1, max(1, warmup // 2), max(1, warmup), min(steps, 2 * max(warmup, 1))})


# ---- collapse rates --------------------------------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (95 % by default); (nan, nan) for n = 0."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at k = 0 (k = n) the bound is exactly 0 (1); the formula leaves a rounding residue there
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def rates(summary: pd.DataFrame) -> pd.DataFrame:
    """Per setting, over the collapse group's runs that learned: how many collapsed, how many spiked and recovered, and
    how many went back to chance at least once, recovered or not (``reached_chance``; k of N, 95 % Wilson interval).
    Runs that never learned cannot collapse after learning and are counted apart. Settings in the summary's order
    (the plan's: params.yaml's, the default first)."""
    rows = []
    collapse = summary[summary["collapse"].astype(bool)] if "collapse" in summary else summary
    for setting, runs in collapse.groupby("setting", sort=False):
        learned = runs[runs["outcome"] != "never learned"]
        n = len(learned)
        row = {"setting": setting, "runs": len(runs), "learned": n}
        hits = {"collapsed": learned["outcome"] == "collapsed", "spiked": learned["outcome"] == "spiked"}
        if "reached_chance" in learned:
            hits["to_chance"] = learned["reached_chance"].astype(bool)
        for event, hit in hits.items():
            k = int(hit.sum())
            low, high = wilson(k, n)
            row.update({event: k, f"{event}_rate": k / n if n else float("nan"), f"{event}_low": low,
                        f"{event}_high": high})
        row["seeds"] = " ".join(str(s) for s in sorted(runs["seed"]))
        rows.append(row)
    return pd.DataFrame(rows)


# ---- records: run directories or snapshots in git --------------------------------------------------------------------


RECORD_FIELDS = ("vocab_size", "diverged_step", "stopped_step", "stop_reason", "wall_time_s", "machine", "git_commit",
                 "diagnostics")


def _record(meta: dict) -> dict:
    diagnostics = meta.get("diagnostics")
    reason = meta.get("stop_reason")
    if meta.get("follow"):  # `dynamics train --follow`: no early stop, so its rows go on past any event
        reason = f"{reason} (followed: no early stop after an event)"
    return {"vocab_size": meta["copy_task"]["vocab_size"], "diverged_step": meta.get("diverged_step"),
            "stopped_step": meta.get("stopped_step"), "stop_reason": reason,
            "wall_time_s": meta.get("wall_time_s"), "machine": meta.get("libraries", {}).get("cpu"),
            "git_commit": meta.get("code", {}).get("git_commit"),
            "diagnostics": "recorded" if diagnostics else "not recorded"}


def collect(planned: pd.DataFrame, root: str | Path = ".", only_finished: bool = False):
    """(runs, losses, diagnostics) of the planned runs from their directories; a missing run is an error unless
    ``only_finished`` (a snapshot of the runs finished so far)."""
    from ...training.diagnostics import table

    root = Path(root)
    records, curves, diags = [], [], []
    for row in planned.itertuples(index=False):
        run_dir = root / row.run_dir
        if not (run_dir / "meta.json").is_file():
            if only_finished:
                continue
            raise ConfigError(f"{row.run_dir}: not trained yet (no meta.json); train it with `snakemake --cores 4 "
                              "dynamics` or read the study from snapshots (dynamics.from_snapshots)")
        meta, loss = read_run(run_dir)  # checked against its checksums and recorded steps
        key = {"setting": row.setting, "run": row.run, "norm": row.norm, "warmup": row.warmup,
               "seed": row.seed}
        records.append({**key, **_record(meta), "run_dir": row.run_dir})
        curves.append(loss.assign(setting=row.setting, run=row.run))
        path = run_dir / "diagnostics.parquet"
        frame = pd.read_parquet(path) if path.is_file() else table([])
        diags.append(frame.assign(setting=row.setting, run=row.run))
    runs = pd.DataFrame(records)
    losses = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=["step", "loss", "lr", "setting", "run"])
    diagnostics = pd.concat(diags, ignore_index=True) if diags else table([]).assign(setting=[], run=[])
    return runs, losses, diagnostics


def summarize(params: dict, runs: pd.DataFrame, losses: pd.DataFrame, planned: pd.DataFrame) -> pd.DataFrame:
    """One row per planned run: its identity, how it ended and its events (judged now, with params' thresholds)."""
    rule = params["dynamics"]["events"]
    by_run = {key: frame for key, frame in losses.groupby(["setting", "run"], sort=False)}
    info = runs.set_index(["setting", "run"])
    rows = []
    for row in planned.itertuples(index=False):
        curve = by_run[(row.setting, row.run)].sort_values("step")
        record = info.loc[(row.setting, row.run)]
        rows.append({"compare": row.compare, "collapse": row.collapse, "setting": row.setting, "run": row.run,
                     "norm": row.norm,
                     "warmup": row.warmup, "seed": row.seed,
                     **events(curve["loss"], curve["step"], rule, int(record["vocab_size"])),
                     "final_loss": float(curve["loss"].iloc[-1]), "last_step": int(curve["step"].iloc[-1]),
                     "stop_reason": record["stop_reason"], "diagnostics": record["diagnostics"],
                     "wall_time_s": record["wall_time_s"], "machine": record["machine"]})
    return pd.DataFrame(rows)


def aggregate(params: dict, root: str | Path = ".") -> dict[str, pd.DataFrame]:
    """The family's tables: the main sweep's runs (and, without ``dynamics.from_snapshots``, every run) from their
    directories, the others from the snapshots."""
    planned = plan(params)
    dirs = snapshots(params)
    runs, losses, diagnostics = collect(from_runs(params), root)
    if dirs:
        recorded = from_records(params)
        r, l_, d = read_snapshots([Path(root) / d for d in dirs])
        why = unrecorded(r, recorded)
        if why:
            raise ConfigError(f"dynamics.from_snapshots: {why}")
        wanted = set(zip(recorded["setting"], recorded["run"]))
        mine = lambda frame: frame[[k in wanted for k in zip(frame["setting"], frame["run"])]]  # noqa: E731
        runs = pd.concat([runs, mine(r)], ignore_index=True)
        losses = pd.concat([losses, mine(l_)], ignore_index=True)
        diagnostics = pd.concat([diagnostics, mine(d)], ignore_index=True)
    keys = set(zip(planned["setting"], planned["run"]))
    keep = lambda frame: frame[[k in keys for k in zip(frame["setting"], frame["run"])]].reset_index(drop=True)  # noqa: E731
    losses, diagnostics = keep(losses), keep(diagnostics)
    summary = summarize(params, runs, losses, planned)
    return {"losses": losses, "diagnostics": diagnostics, "summary": summary, "rates": rates(summary)}


def kept_steps(params: dict, summary: pd.DataFrame, steps) -> pd.Series:
    """Which diagnostic steps a snapshot keeps (True) in a setting whose runs are ``summary``: every step that a table,
    figure, answer or claim reads, and every THIN-th step elsewhere (a run's per-step metrics, 24 blocks x 5 metrics a
    step, are most of a snapshot's size). Kept: steps <= EARLY (the first updates, and the gradient ratio at step 50
    +- WINDOW), +- WINDOW around each figure step (Xiong et al.'s Fig. 3 and its claim), and ANATOMY_BEFORE before to
    ANATOMY_AFTER after every spike or collapse of the setting, in all its runs (the precursor windows, and the anatomy
    figure, which shows a calm seed of the same setting on the same axis). ``thin`` adds each metric's last step."""
    steps = pd.Series(steps).astype(int).reset_index(drop=True)
    keep = (steps <= EARLY) | (steps % THIN == 0)
    sweep = Sweep.from_params(params)
    for at in figure_steps(max(sweep.warmups), sweep.steps):
        keep |= (steps - at).abs() <= WINDOW
    for e in pd.concat([summary["spike_step"], summary["collapse_step"]]).dropna():
        keep |= (steps >= e - ANATOMY_BEFORE) & (steps <= e + ANATOMY_AFTER)
    return keep


def thin(params: dict, summary: pd.DataFrame, diagnostics: pd.DataFrame) -> pd.DataFrame:
    """The diagnostics a snapshot records: per setting, the steps ``kept_steps`` keeps, and each run's last recorded
    step of each metric (the final attention logit and entropy)."""
    parts = []
    for setting, frame in diagnostics.groupby("setting", sort=False):
        last = frame["step"] == frame.groupby(["run", "metric"])["step"].transform("max")
        mask = kept_steps(params, summary[summary["setting"] == setting], frame["step"]).to_numpy() | last.to_numpy()
        parts.append(frame[mask])
    return pd.concat(parts, ignore_index=True) if parts else diagnostics


def write_snapshot(params: dict, out: str | Path, root: str | Path = ".", thinned: bool = True) -> pd.DataFrame:
    """Record the finished runs of the plan in ``out`` (kept in git): what the tables need, diagnostics included
    (thinned: ``kept_steps``, unless ``thinned`` is False). Runs ``out`` already records and that did not finish here are kept (a snapshot grows
    seed by seed, across machines); a run finished here replaces its old record."""
    planned = plan(params)
    runs, losses, diagnostics = collect(planned, root, only_finished=True)
    if len(runs) and thinned:
        done = planned.merge(runs[["setting", "run"]], on=["setting", "run"])
        diagnostics = thin(params, summarize(params, runs, losses, done), diagnostics)
    out = Path(out)
    if all((out / name).is_file() for name in SNAPSHOT_FILES):
        here = set(zip(runs["setting"], runs["run"])) if len(runs) else set()
        # an earlier write of this snapshot that was killed is being redone: its files must be as last recorded
        # (by the last complete manifest, or by the killed write for the files it finished), then are read as they are
        if interrupted(out):
            verify_unfinished(out)
        old = [frame[[key not in here for key in zip(frame["setting"], frame["run"])]]
               for frame in read_snapshots([out], verify=not interrupted(out))]
        runs, losses, diagnostics = (pd.concat([o, n], ignore_index=True) if len(n) else o.reset_index(drop=True)
                                     for o, n in zip(old, (runs, losses, diagnostics)))
    out.mkdir(parents=True, exist_ok=True)
    begin_snapshot(out)  # a kill from here on leaves a snapshot that readers refuse, until it is written again
    with snapshot_file(out, "runs.csv") as tmp:
        runs.to_csv(tmp, index=False)
    with snapshot_file(out, "losses.csv") as tmp:
        losses[["setting", "run", "step", "loss", "lr"]].to_csv(tmp, index=False)
    # float16 in git (about 3 significant digits, relative rounding <= 2^-11; below 6.1e-5 the absolute step is 6e-8):
    # a third of float32's size, enough for the figures and for the precursor rules (thresholds of 1.2x and 3x)
    diagnostics = diagnostics.astype({"value": "float16", "step": "int32", "block": "int16"})
    with snapshot_file(out, "diagnostics.parquet") as tmp:
        diagnostics.to_parquet(tmp, index=False, compression="zstd")
    record_snapshot(out)  # last: the checksums of what was written
    return runs


# ---- what the diagnostics say about why ------------------------------------------------------------------------------

LEAD = 10      # the steps just before an event (e-10 .. e-1, the event's own step excluded): where a cause must show
BEFORE = 60    # the reference window before that: steps e-60 .. e-11
ADAM_JUMP = 3.0    # Adam's ratio counts as "jumped" when its peak in the lead exceeds 3x its reference median
LOGIT_GROWTH = 1.2  # the attention logit counts as "grew" when its lead peak exceeds 1.2x its reference peak
VANISHED = 100.0   # the input-side gradient counts as "vanished" when the output end's is over 100x it (step 50)


def _fold(diagnostics: pd.DataFrame, setting: str, run: str, metric: str, fold: str = "max") -> pd.Series:
    part = diagnostics[(diagnostics["setting"] == setting) & (diagnostics["run"] == run) & (diagnostics["metric"] == metric)]
    grouped = part.groupby("step")["value"]
    return grouped.max() if fold == "max" else grouped.min()


def event_precursors(summary: pd.DataFrame, diagnostics: pd.DataFrame) -> pd.DataFrame:
    """For every spike or collapse of the collapse group (the step the loss first rose above spike_above: e), what the
    diagnostics did just before it (steps e-10..e-1) against the steps before that (e-60..e-11): Adam's ratio
    sqrt(mean(g^2/v_hat)) and the gradient (max over blocks), the largest attention logit and the lowest attention
    entropy. Rules, fixed here: Adam's ratio "jumped" when its lead peak exceeds ADAM_JUMP x its reference median; the
    attention logit "grew" when its lead peak exceeds LOGIT_GROWTH x its reference peak."""
    rows = []
    events_ = summary[summary["collapse"].astype(bool) & summary["outcome"].isin(["spiked", "collapsed"])]
    for r in events_.itertuples():
        e = int(r.spike_step)
        out = {"setting": r.setting, "run": r.run, "seed": r.seed, "outcome": r.outcome, "event_step": e,
               "event_loss": r.spike_loss}
        for metric, fold in (("adam_rms", "max"), ("grad_ffn_out", "max"), ("attn_logit_max", "max"),
                             ("attn_entropy", "min")):
            series = _fold(diagnostics, r.setting, r.run, metric, fold)
            ref = series[(series.index >= e - BEFORE) & (series.index <= e - LEAD - 1)]
            lead = series[(series.index >= e - LEAD) & (series.index <= e - 1)]
            out[f"{metric}_ref"] = float(ref.median() if metric in ("adam_rms", "grad_ffn_out") else
                                         (ref.max() if fold == "max" else ref.min())) if len(ref) else float("nan")
            out[f"{metric}_lead"] = float(lead.max() if fold == "max" else lead.min()) if len(lead) else float("nan")
        out["adam_jumped"] = out["adam_rms_lead"] > ADAM_JUMP * out["adam_rms_ref"]
        out["logit_grew"] = out["attn_logit_max_lead"] > LOGIT_GROWTH * out["attn_logit_max_ref"]
        rows.append(out)
    return pd.DataFrame(rows)


def early_updates(summary: pd.DataFrame, diagnostics: pd.DataFrame, steps: int = 10, later: int = 50) -> pd.DataFrame:
    """Per compare run: the median over its first ``steps`` steps of the largest relative update of a block
    (||dtheta||/||theta||); the output-end / input-end ratio of the per-block gradient (second MLP weight; last sixth
    over first sixth of the stack) at step 1, after the first full-rate steps (2 and 5) and at step ``later``, each AT
    the step where it is recorded (else the mean over the recorded steps within WINDOW of it: a +-5 mean at step 1
    would mix in steps 2-6, the very steps that make the imbalance); and at the end of training the largest attention
    logit and the highest attention entropy of a block (uniform causal attention has the most): how hard the first
    steps push, where the gradient goes, and whether attention ever left uniform."""
    rows = []
    for r in summary[summary["compare"].astype(bool)].itertuples():
        update = _fold(diagnostics, r.setting, r.run, "update_ratio")
        logit = _fold(diagnostics, r.setting, r.run, "attn_logit_max")
        entropy = _fold(diagnostics, r.setting, r.run, "attn_entropy", "max")
        grad = diagnostics[(diagnostics["setting"] == r.setting) & (diagnostics["run"] == r.run)
                           & (diagnostics["metric"] == "grad_ffn_out")]

        def out_over_in(step: int) -> float:
            return ends_ratio(at_step(grad, step)[0])

        rows.append({"run": r.run, "norm": r.norm, "warmup": r.warmup, "seed": r.seed, "outcome": r.outcome,
                     "early_update": float(update[update.index <= steps].median()) if len(update) else float("nan"),
                     "init_grad_out_over_in": out_over_in(1), "grad_out_over_in_step2": out_over_in(2),
                     "grad_out_over_in_step5": out_over_in(5), "grad_out_over_in_later": out_over_in(later),
                     "final_logit_max": float(logit.iloc[-1]) if len(logit) else float("nan"),
                     "final_entropy_max": float(entropy.iloc[-1]) if len(entropy) else float("nan")})
    return pd.DataFrame(rows)


def uniform_entropy(time_: int) -> float:
    """Mean entropy of uniform causal attention over ``time_`` positions: the mean of ln(t + 1), t = 0 .. time_-1."""
    return sum(math.log(t + 1) for t in range(time_)) / time_
