"""Why post-norm fails, measured while it trains (issue 23): the training-time diagnostics of the copy-task runs, and
how often post-norm with warm-up collapses after its warm-up, over enough seeds to give the rate an interval.

Two groups of runs, each an ordinary sweep run (``sweep.train_copy_run``) with its diagnostics:
- ``compare``: the default cell's norm x warm-up runs at ``dynamics.compare_seeds`` (the main sweep's own runs), for
  Xiong et al.'s Fig. 3 through training;
- ``collapse``: post-norm with warm-up at each setting of ``dynamics.collapse.settings`` (sensitivity's cell names)
  and ``dynamics.collapse.seeds``, for the collapse rate. Such a run stops once it has collapsed (``dynamics.events``):
  a run that never collapses trains the full ``sweep.steps``.

A run identical to a main-sweep run is that run (``data/sweep/runs``); the others are in
``data/dynamics/runs/<cell>/<run>/``. Events are judged from the loss alone, with thresholds fixed in params.yaml
before any of these runs trained:
- learned: the loss below ``learned_below`` for ``learned_for`` consecutive steps (the first of them: the step it learned);
- collapse: after learning, the loss at or above ``collapse_at`` x ln(vocab) (chance) for ``collapse_for`` steps in a row;
- spike: after learning, the loss above ``spike_above`` at some step, without a collapse (it came back).
"""
from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import pandas as pd

from ..config import ConfigError
from ..dynamics_plan import (FIGURES, PLAN, PLAN_COLUMNS, ROOT, RUNS, SNAPSHOT_FILES, TABLES,  # noqa: F401  (re-exported)
                             aggregate_inputs, check_problems, from_records, from_runs, plan, read_snapshots, snapshots,
                             unrecorded)
from .family import add_command, add_plan, add_train
from ..integrity import begin_snapshot, interrupted, read_run, record_snapshot, snapshot_file, verify_unfinished
from ..io import read_json, read_table, write_table
from ..params import load_params
from ..study import Cell, cell_params, default_cell, require_cell_names

log = logging.getLogger("blocklab.dynamics")

OUTCOMES = ("never learned", "stable", "spiked", "collapsed")
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



# ---- the plan ----------------------------------------------------------------------------------------------------------


def collapse_params(params: dict, cell_name: str) -> dict:
    """params.yaml with the cell's choices in place (what a collapse run trains)."""
    return cell_params(params, Cell.parse(cell_name))


def run_identity(params: dict, cell_name: str) -> dict:
    """What decides a collapse run's numbers (Snakemake params of its rule): the cell and the events that stop it."""
    p = collapse_params(params, cell_name)
    training = {k: v for k, v in p["sweep"].items() if k not in ("norms", "warmups", "seeds", "checkpoint_every",
                                                                   "compile", "fast_path", "batched")}
    return {"model": p["copy_model"], "task": p["copy_task"], "training": training,
            "events": params["dynamics"]["events"]}


# ---- events --------------------------------------------------------------------------------------------------------


def _first_streak(flags, steps, length: int, start: int = 0) -> int | None:
    """Index of the first element of the first run of ``length`` True flags at or after index ``start``."""
    streak = 0
    for i in range(start, len(flags)):
        streak = streak + 1 if flags[i] else 0
        if streak == length:
            return i - length + 1
    return None


def events(losses, steps, rule: dict, vocab_size: int) -> dict:
    """The run's outcome (never learned | stable | spiked | collapsed) and the steps of its events (NaN: none)."""
    losses, steps = list(map(float, losses)), list(map(int, steps))
    chance = math.log(vocab_size)
    nan = float("nan")
    out = {"outcome": "never learned", "learned_step": nan, "spike_step": nan, "spike_loss": nan, "collapse_step": nan,
           "max_after_learned": nan, "reached_chance": False}
    learned = _first_streak([x < rule["learned_below"] for x in losses], steps, rule["learned_for"])
    if learned is None:
        return out
    out["learned_step"] = steps[learned]
    after = learned + rule["learned_for"]
    if after >= len(losses):
        out["outcome"] = "stable"
        return out
    worst = max(range(after, len(losses)), key=lambda i: losses[i])
    out["max_after_learned"] = losses[worst]
    # back at chance for at least one step after learning, whether it stayed there (a collapse) or recovered: the
    # document's "4.32 at step 460" as far as a single number shows (a reading added after the first runs; see rates)
    out["reached_chance"] = losses[worst] >= rule["collapse_at"] * chance
    collapse = _first_streak([x >= rule["collapse_at"] * chance for x in losses], steps, rule["collapse_for"], after)
    spike = next((i for i in range(after, len(losses)) if losses[i] > rule["spike_above"]), None)
    if collapse is not None:
        out.update(outcome="collapsed", collapse_step=steps[collapse])
    elif spike is not None:
        out["outcome"] = "spiked"
    else:
        out["outcome"] = "stable"
    if spike is not None:
        out.update(spike_step=steps[spike], spike_loss=losses[spike])
    return out


def collapse_stop(params: dict):
    """(callable, words): stop a run once it has collapsed (it learned, then sat at chance for ``collapse_for`` steps)."""
    rule, vocab = params["dynamics"]["events"], params["copy_task"]["vocab_size"]

    def stop(losses: list[float]) -> bool:
        tail = rule["collapse_for"]
        if len(losses) < tail or losses[-1] < rule["collapse_at"] * math.log(vocab):
            return False
        return events(losses, range(1, len(losses) + 1), rule, vocab)["outcome"] == "collapsed"

    words = (f"collapsed: learned (loss < {rule['learned_below']:g} for {rule['learned_for']} steps), then loss >= "
             f"{rule['collapse_at']:g} x ln {vocab} for {rule['collapse_for']} steps")
    return stop, words


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
    return {"vocab_size": meta["copy_task"]["vocab_size"], "diverged_step": meta.get("diverged_step"),
            "stopped_step": meta.get("stopped_step"), "stop_reason": meta.get("stop_reason"),
            "wall_time_s": meta.get("wall_time_s"), "machine": meta.get("libraries", {}).get("cpu"),
            "git_commit": meta.get("code", {}).get("git_commit"),
            "diagnostics": "recorded" if diagnostics else "not recorded"}


def collect(planned: pd.DataFrame, root: str | Path = ".", only_finished: bool = False):
    """(runs, losses, diagnostics) of the planned runs from their directories; a missing run is an error unless
    ``only_finished`` (a snapshot of the runs finished so far)."""
    from ..training.diagnostics import table

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
    for at in figure_steps(max(params["sweep"]["warmups"]), params["sweep"]["steps"]):
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


# ---- the command line: blocklab dynamics <verb> ----------------------------------------------------------------------


def register(subparsers) -> None:
    p = add_train(subparsers, "train one collapse-rate run (post-norm with warm-up, a setting, a seed)", _train_main,
                  norm_and_warmup=False)
    p.add_argument("--follow", action="store_true",
                   help="train to the last step (sweep.steps) instead of stopping once it collapsed: what happens after")
    p.add_argument("--dense", default=None, metavar="FIRST:LAST",
                   help="also record the forward diagnostics at every step from FIRST to LAST (the steps before an event)")
    add_plan(subparsers, "every run of the dynamics family and its directory", plan, PLAN)
    add_command(subparsers, "aggregate", "the dynamics family's tables (losses, diagnostics, events, rates)", _aggregate_main)
    p = add_command(subparsers, "status", "which dynamics runs are finished, checkpointed, recorded or to do", _status_main,
                    root=True)
    p.add_argument("--add-setting", action="append", default=[], dest="setting",
                   help="also list this collapse setting's runs, before params.yaml lists it (repeatable)")
    p = add_command(subparsers, "snapshot", "record the finished dynamics runs in a directory kept in git", _snapshot_main)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--add-setting", action="append", default=[], dest="setting",
                   help="also record this collapse setting (a sensitivity cell name) at dynamics.collapse.seeds, "
                        "before params.yaml lists it (repeatable)")
    p.add_argument("--every-step", action="store_true",
                   help="keep every recorded diagnostic step (no thinning): runs recorded at every step, for the "
                        "detectors' false alarms at the loss's own resolution")


def status(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """Every planned run: finished here, checkpointed (at which step), recorded in a snapshot, or still to train."""
    from ..training.sweep import run_state

    root = Path(root)
    recorded = set()
    for d in snapshots(params) or []:
        if (root / d / "runs.csv").is_file():
            runs = read_table(root / d / "runs.csv")
            recorded |= set(zip(runs["setting"], runs["run"]))
    rows = []
    for row in plan(params).itertuples(index=False):
        got = run_state(root / row.run_dir, params["sweep"]["steps"])
        state = f"checkpointed at step {got['steps_done']}" if got["status"] == "checkpointed" else \
            "to do" if got["status"] == "not started" else "finished"
        wall = got["seconds"] if state == "finished" else None
        rows.append({"setting": row.setting, "run": row.run, "state": state,
                     "in_snapshot": (row.setting, row.run) in recorded, "wall_time_s": wall})
    return pd.DataFrame(rows)


def _status_main(args) -> None:
    params = load_params(args.params)
    settings = params["dynamics"]["collapse"]["settings"]
    settings += [name for name in require_cell_names(args.setting, "--add-setting") if name not in settings]
    frame = status(params, args.root)
    print(frame.to_string(index=False))
    done = frame["state"].eq("finished") | frame["in_snapshot"]
    print(f"{int(done.sum())} of {len(frame)} planned runs finished or recorded; "
          f"{int((~done).sum())} to train (`snakemake --cores 4 dynamics`)")


def _train_main(args) -> None:
    from ..runtime import set_threads
    from ..training.sweep import train_copy_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    Cell.parse(args.cell)
    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed} is not allowed; choose an integer >= 0")
    dense = parse_window(args.dense, params["sweep"]["steps"])
    set_threads(args.threads or params["threads_per_run"])
    stop, words = (None, None) if args.follow else collapse_stop(params)
    p = collapse_params(params, args.cell)
    extra = {"follow": True} if args.follow else {}
    meta = train_copy_run(p, "post", params["dynamics"]["collapse"]["warmup"], args.seed, args.out_dir, params["device"],
                          stop_when=stop, stop_rule=words, dense_steps=dense, setting=args.cell, **extra)
    log.info("%s %s in %.1f s (%s)", meta["run"], meta["status"], meta["wall_time_s"], meta["stop_reason"])


def parse_window(text: str | None, steps: int) -> tuple[int, int] | None:
    """``--dense FIRST:LAST`` checked: 1 <= FIRST <= LAST <= steps (None: no window)."""
    if text is None:
        return None
    try:
        first, last = (int(part) for part in text.split(":"))
    except ValueError:
        raise ConfigError(f"--dense={text!r} is not allowed; choose FIRST:LAST, two step numbers, e.g. 450:600") from None
    if not 1 <= first <= last <= steps:
        raise ConfigError(f"--dense={text!r} is not allowed; choose 1 <= FIRST <= LAST <= {steps} (sweep.steps)")
    return first, last


def _aggregate_main(args) -> None:
    params = load_params(args.params)
    tables = aggregate(params)
    for name, frame in tables.items():
        path = Path(TABLES[name])
        if name == "diagnostics":
            path.parent.mkdir(parents=True, exist_ok=True)
            from ..io import atomic_path

            with atomic_path(path) as tmp:
                frame.to_parquet(tmp, index=False, compression="zstd")
        else:
            write_table(frame, path)
    log.info("%d runs; rates: %s", len(tables["summary"]), tables["rates"].to_dict("records"))


def _snapshot_main(args) -> None:
    """Record every finished planned run, including seeds just added to the plan that ``from_snapshots`` does not yet
    cover (so the parameters are checked with it cleared: recording is how a new seed gets covered), and the runs of
    any ``--add-setting`` not yet in the plan (a setting whose seeds are still training)."""
    import yaml

    from ..params import validate_params

    raw = yaml.safe_load(Path(args.params).read_text(encoding="utf-8"))
    if isinstance(raw, dict) and isinstance(raw.get("dynamics"), dict):
        raw["dynamics"]["from_snapshots"] = []
        settings = raw["dynamics"].get("collapse", {}).get("settings")
        if args.setting and isinstance(settings, list):
            settings += [s for s in args.setting if s not in settings]
    params = validate_params(raw, str(args.params))
    runs = write_snapshot(params, args.out, thinned=not args.every_step)
    print(f"{len(runs)} run(s) recorded in {args.out} (finished here, and kept from its earlier record)")


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

        rows.append({"run": r.run, "norm": r.norm, "warmup": r.warmup, "outcome": r.outcome,
                     "early_update": float(update[update.index <= steps].median()) if len(update) else float("nan"),
                     "init_grad_out_over_in": out_over_in(1), "grad_out_over_in_step2": out_over_in(2),
                     "grad_out_over_in_step5": out_over_in(5), "grad_out_over_in_later": out_over_in(later),
                     "final_logit_max": float(logit.iloc[-1]) if len(logit) else float("nan"),
                     "final_entropy_max": float(entropy.iloc[-1]) if len(entropy) else float("nan")})
    return pd.DataFrame(rows)


def uniform_entropy(time_: int) -> float:
    """Mean entropy of uniform causal attention over ``time_`` positions: the mean of ln(t + 1), t = 0 .. time_-1."""
    return sum(math.log(t + 1) for t in range(time_)) / time_
