"""A block's learning-rate sensitivity: the field's small-scale stability measure, run by ``blocklab lab --lr-sweep``.

Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities" (ICLR 2024), Sec. 2:
train the same model at every learning rate η of a grid; with ℓ(η) the final loss, ℓ* = min over the grid of ℓ(η) and
ℓ₀ the loss at initialization,

    LR sensitivity = mean over η of ( min(ℓ(η), ℓ₀) − ℓ* )

(the clamp at ℓ₀ keeps a diverged run from counting more than a run that never left the start). A block that trains
well only in a narrow band of learning rates scores high; one that trains at every rate scores near 0.

Here, stated before any run: the grid ``LRS`` (5 points, half-decades over 1e-4 … 1e-2); ℓ(η) the mean training loss
of the last ``FINAL_WINDOW`` steps (one step's loss at batch 16 is noisy); ℓ₀ = ln(vocabulary), the copy task's loss
at chance (an untrained model's); a run that diverged (a non-finite loss) has ℓ = ℓ₀. The sensitivity is computed per
seed (each seed's own curve and ℓ*) and reported as the mean over seeds with its 95 % t interval.

The recorded study (``records/lab/lr-sweep``) runs the built-in blocks at the ``lr-sweep`` profile
(``PROFILE``); any block runs the same grid at any lab profile (``blocklab lab BLOCK --lr-sweep``).
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..model_config import ConfigError
from ..records import LAB_LR_RUNS

LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
FINAL_WINDOW = 10
PROFILE = "lr-sweep"
# the recorded study: the seven built-in blocks, in this order on every page
BLOCKS = ("pre", "post", "deepnorm", "admin", "b2t", "rezero", "sandwich")
SEEDS = (0, 1, 2)


NAME = re.compile(r"^(?P<block>[a-z0-9]+)-lr(?P<lr>[0-9.e+-]+)-w(?P<warmup>\d+)-s(?P<seed>\d+)$")
REPO = Path(__file__).resolve().parents[3]


def run_name(block: str, lr: float, seed: int, warmup: int = 0) -> str:
    """``<block>-lr<lr>-w<warmup>-s<seed>``, e.g. ``post-lr0.001-w0-s2`` (the lr as Python's ``g`` format writes it)."""
    return f"{block}-lr{lr:g}-w{warmup}-s{seed}"


def check_lr(lr) -> float:
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and 0 < lr < 1):
        raise ConfigError(f"--lr {lr!r}: give a learning rate in (0, 1), e.g. one of {', '.join(f'{x:g}' for x in LRS)}")
    return float(lr)


def lr_setup(setup, lr: float):
    """The profile's setup at one learning rate of the grid."""
    return replace(setup, lr=check_lr(lr))


def plan(blocks=BLOCKS, lrs=LRS, seeds=SEEDS) -> list[tuple[str, float, int]]:
    """Every run of the recorded study, seed by seed (so that a stopped study has whole seeds), then lr, then block."""
    return [(block, lr, seed) for seed in seeds for lr in lrs for block in blocks]


def train_builtin(params: dict, block: str, lr: float, seed: int, out_dir: Path, profile: str = PROFILE,
                  warmup: int = 0) -> dict:
    """One run of a built-in block at ``profile`` and learning rate ``lr``, through the sweep's own training
    (``training.sweep.train_copy_run``: resumes from its checkpoint, writes meta.json last)."""
    from ..runtime import set_threads
    from ..training.sweep import train_copy_run
    from .spec import params_for, profile_setup

    setup = lr_setup(profile_setup(params, profile, seeds=[seed], warmups=[warmup]), lr)
    set_threads(1)
    return train_copy_run(params_for(params, setup), block, warmup, seed, Path(out_dir), "cpu",
                          lab={"lr_sweep": {"profile": profile, "block": block, "lr": lr, "grid": list(LRS)}})


# ---- the measure --------------------------------------------------------------------------------------------------


def final_loss(steps, losses, vocab_size: int, diverged_step=None, steps_planned: int | None = None) -> float:
    """ℓ(η): the mean loss of the last ``FINAL_WINDOW`` steps; ℓ₀ = ln(vocab_size) for a diverged run."""
    chance = math.log(vocab_size)
    losses = np.asarray(losses, dtype=float)
    if diverged_step is not None or not len(losses) or not np.isfinite(losses).all():
        return chance
    if steps_planned is not None and int(max(steps)) < steps_planned:
        raise ConfigError(f"a run stopped at step {int(max(steps))} of {steps_planned}: not a finished run")
    return float(losses[-FINAL_WINDOW:].mean())


def sensitivity(curve: pd.Series, chance: float) -> float:
    """Wortsman et al.'s LR sensitivity of one curve (final loss indexed by learning rate): mean of
    min(ℓ(η), ℓ₀) − ℓ* over the grid."""
    clamped = np.minimum(curve.to_numpy(dtype=float), chance)
    return float(np.mean(clamped - clamped.min()))


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """The mean of ``values`` and its two-sided ``level`` t interval (scipy.stats.t; NaN bounds for one value)."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return mean, mean - half, mean + half


def table(runs: pd.DataFrame, chance: float, lrs=LRS) -> pd.DataFrame:
    """One row per block: the LR sensitivity's mean over the seeds that have the whole grid ``lrs`` (``seeds``: how
    many), with its 95 % t interval; the best learning rate (of the mean curve) and the mean final loss at every
    learning rate recorded. ``runs``: one row per run with block, lr, seed, final_loss; where it has ``learned`` (the
    lab's outcome rule, ``lab.outcomes``), the block's ``runs`` and ``runs_learned`` too: the measure is each block's
    excess over its own best loss, so a block that learns at no rate of the grid scores low, and these say so."""
    if runs.duplicated(["block", "lr", "seed"]).any():
        twice = runs[runs.duplicated(["block", "lr", "seed"], keep=False)].iloc[0]
        raise ConfigError(f"run {run_name(twice.block, twice.lr, int(twice.seed))} is counted twice")
    rows = []
    for block, part in runs.groupby("block", sort=False):
        wide = part.pivot(index="seed", columns="lr", values="final_loss").sort_index(axis=1)
        complete = wide.reindex(columns=sorted(lrs)).dropna()  # a seed counts once its whole grid is recorded
        per_seed = [sensitivity(row, chance) for _, row in complete.iterrows()]
        mean, low, high = t_interval(per_seed) if per_seed else (float("nan"),) * 3
        curve = wide.mean()
        learned = ({"runs": len(part), "runs_learned": int(part["learned"].sum())} if "learned" in part else {})
        rows.append({"block": block, "seeds": len(complete), "lr_sensitivity": mean, "low": low, "high": high,
                     "per_seed": ", ".join(f"{v:.3f}" for v in per_seed), "best_lr": float(curve.idxmin()),
                     **learned, **{f"loss_lr{lr:g}": float(curve[lr]) for lr in curve.index}})
    return pd.DataFrame(rows)


# ---- the recorded study ---------------------------------------------------------------------------------------------


def record(runs: Path, to: Path | None = None) -> list[str]:
    """Copy each finished run of ``runs`` (folders named by ``run_name``) into ``to`` (default: the records,
    ``records.LAB_LR_RUNS``): its loss.csv and meta.json, read first with their checksums (``integrity.read_run``);
    a run without meta.json (not finished) is left out. Returns the runs recorded."""
    import shutil

    from ..integrity import read_run
    from .records import RECORDED_FILES

    to = Path(to) if to is not None else REPO / LAB_LR_RUNS
    done = []
    for run_dir in sorted(p for p in Path(runs).iterdir() if p.is_dir() and NAME.match(p.name)):
        if not (run_dir / "meta.json").is_file():
            continue
        read_run(run_dir)  # a damaged run is refused, not recorded
        target = to / run_dir.name
        target.mkdir(parents=True, exist_ok=True)
        for name in RECORDED_FILES:
            shutil.copyfile(run_dir / name, target / name)
        done.append(run_dir.name)
    return done


def recorded(root: Path | str = REPO) -> pd.DataFrame:
    """One row a recorded run of the study: block, lr, warmup, seed, final loss (``final_loss``), whether it diverged,
    whether it learned (the lab's outcome rule, ``lab.outcomes``: below a tenth of chance and not collapsed), its
    steps, wall time and processor; each read with its checksums (``lab.records.read_run``)."""
    from .outcomes import learned
    from .records import read_run

    rows = []
    folder = Path(root) / LAB_LR_RUNS
    for run_dir in sorted(folder.iterdir()) if folder.is_dir() else []:
        named = NAME.match(run_dir.name)
        if not named or not (run_dir / "meta.json").is_file():
            continue
        meta, loss = read_run(run_dir)
        planned = int(meta["sweep"]["steps"])
        rows.append({"run": run_dir.name, "block": meta["norm"], "lr": float(meta["sweep"]["lr"]),
                     "warmup": int(meta["warmup"]), "seed": int(meta["seed"]),
                     "final_loss": final_loss(loss["step"], loss["loss"], meta["copy_task"]["vocab_size"],
                                              meta.get("diverged_step"), planned),
                     "diverged": meta.get("diverged_step") is not None,
                     "learned": learned(loss["step"].tolist(), loss["loss"].tolist(), meta["copy_task"]["vocab_size"],
                                        meta.get("diverged_step")),
                     "steps": len(loss), "steps_planned": planned,
                     "vocab_size": int(meta["copy_task"]["vocab_size"]),
                     "n_layers": int(meta["model_config"]["n_layers"]), "batch_size": int(meta["copy_task"]["batch_size"]),
                     "wall_time_s": meta.get("wall_time_s"), "cpu": meta.get("libraries", {}).get("cpu") or ""})
    return pd.DataFrame(rows, columns=["run", "block", "lr", "warmup", "seed", "final_loss", "diverged", "learned",
                                       "steps", "steps_planned", "vocab_size", "n_layers", "batch_size", "wall_time_s", "cpu"])


def chance_of(runs: pd.DataFrame) -> float:
    """ℓ₀ = ln V of the recorded runs (one vocabulary: the study's setup)."""
    vocab = set(runs["vocab_size"])
    if len(vocab) != 1:
        raise ConfigError(f"the recorded LR-sweep runs have vocabularies {sorted(vocab)}: one setup only")
    return math.log(vocab.pop())


def losses(runs: pd.DataFrame, root: Path | str = REPO) -> pd.DataFrame:
    """The per-step losses of recorded runs (rows of ``recorded``): step, loss, run, block, lr, seed."""
    from .records import read_run

    frames = [read_run(Path(root) / LAB_LR_RUNS / r.run)[1][["step", "loss"]].assign(run=r.run, block=r.block, lr=r.lr,
                                                                                     seed=r.seed)
              for r in runs.itertuples()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["step", "loss", "run", "block",
                                                                                      "lr", "seed"])


def ranking(table_: pd.DataFrame, learned: list[str], failed: list[str]) -> tuple[str, str]:
    """The check stated before any run (docs/lab.md): the profile ranks the blocks as the document profile's recorded
    outcomes do if every block that learned in every recorded document-profile run without warm-up (``learned``) has
    a lower mean LR sensitivity than every block that learned in none (``failed``); decisively if the 95 % intervals
    do not overlap (every ``learned`` block's upper bound below every ``failed`` block's lower bound). Returns
    (verdict, why): agrees decisively | agrees | disagrees | not yet (a block lacks its full grid over the seeds)."""
    by = table_.set_index("block") if len(table_) else pd.DataFrame()
    missing = [b for b in [*learned, *failed] if b not in by.index or by.loc[b, "seeds"] < len(SEEDS)]
    if missing or not learned or not failed:
        return "not yet", f"{', '.join(missing) or 'a group'} lack{'s' if len(missing) == 1 else ''} the full grid over seeds {list(SEEDS)}"
    worst_learned = max(learned, key=lambda b: by.loc[b, "lr_sensitivity"])
    best_failed = min(failed, key=lambda b: by.loc[b, "lr_sensitivity"])
    means = (by.loc[worst_learned, "lr_sensitivity"], by.loc[best_failed, "lr_sensitivity"])
    if means[0] >= means[1]:
        above = [b for b in learned if by.loc[b, "lr_sensitivity"] >= means[1]]
        return "disagrees", (f"{len(above)} of the {len(learned)} learning block{'s' if len(learned) != 1 else ''} "
                             f"{'are' if len(above) != 1 else 'is'} not below {best_failed} "
                             f"({means[1]:.3f}): " + ", ".join(f"{b} {by.loc[b, 'lr_sensitivity']:.3f}" for b in above))
    high = max(by.loc[b, "high"] for b in learned)
    low = min(by.loc[b, "low"] for b in failed)
    if high < low:
        return "agrees decisively", f"every learning block's interval ends below {low:.3f}, the failing blocks' lowest bound"
    return "agrees", (f"every learning block's mean is below every failing block's ({worst_learned} {means[0]:.3f} < "
                      f"{best_failed} {means[1]:.3f}), the intervals overlap (up to {high:.3f} vs from {low:.3f})")


# ---- `blocklab lab BLOCK --lr-sweep` ---------------------------------------------------------------------------------


def sweep_main(args, lab_main) -> int:
    """The lab once per learning rate of ``LRS`` (``--out``/lr<lr>, each its own Snakemake DAG: cached, resumable),
    then the block's sensitivity over the seeds that finished the whole grid: ``lr_sensitivity.csv`` (one row: the
    measure, its interval, the final loss at each rate), ``lr_runs.csv`` (one row a run) and ``lr_sensitivity.png``."""
    import copy
    import sys

    if args.lr is not None:
        raise ConfigError(f"--lr {args.lr:g} with --lr-sweep: the sweep sets the learning rate itself "
                          f"({', '.join(f'{lr:g}' for lr in LRS)}); give one or the other")
    import time

    out = Path(args.out)
    # shared by every rate's lab: the job start-up measured once, each rate's seconds, for the whole sweep's estimate
    state = {"job_s": None, "job_basis": None, "began": time.monotonic(), "rates": [], "n": len(LRS)}
    for i, lr in enumerate(LRS, start=1):
        print(f"blocklab lab --lr-sweep: learning rate {lr:g} ({i} of {len(LRS)}) into {out / f'lr{lr:g}'}",
              file=sys.stderr, flush=True)
        one = copy.copy(args)
        one.lr_sweep, one.lr, one.out = False, lr, out / f"lr{lr:g}"
        state.update(i=i, rate_began=time.monotonic(), said_at=None)
        one.sweep_state = state
        status = lab_main(one)
        if state["said_at"] is not None and not args.dry_run:  # this rate's workflow: from its cost line to its end
            state["rates"].append(time.monotonic() - state["said_at"])
            if state.get("workflow", {}).get("run_steps"):  # the next rates' start-up: as this rate's jobs took it
                # (a rate with every run finished says nothing of it)
                from .launch import job_s_from

                state["job_s"] = job_s_from(state["rates"][-1], **state["workflow"])
                state["job_basis"] = f"as the jobs of the rate before took it: {state['rates'][-1]:.0f} s in all"
        if status:
            return status
    if args.dry_run:
        return 0
    return write_sweep(out, args)


def sweep_left_s(rate: int, rates: int, planned_s: float, this_rate_s: float, done_s: list[float],
                 end_s: float) -> tuple[float, float]:
    """(seconds the sweep has left, seconds a later rate takes) when rate ``rate`` of ``rates`` is estimated at
    ``this_rate_s`` from its cost line on: a later rate takes what the workflows of the rates done took from their cost
    lines (their mean, ``done_s``; this rate's estimate before any is done) plus its checks before its cost line, as
    this rate's took (``planned_s``; the first rate's are not counted: they hold the imports and the start-up's timing,
    done once); then the sweep's tables and figure (``end_s``)."""
    each = (sum(done_s) / len(done_s) if done_s else this_rate_s) + (planned_s if rate > 1 else 0.0)
    return this_rate_s + (rates - rate) * each + end_s, each


def sweep_estimate(state: dict, this_rate_s: float, job_s: float) -> str:
    """The whole sweep's estimate, said with each rate's cost line (``sweep_main``'s ``state``)."""
    import time

    from .launch import clock

    now = time.monotonic()
    state["said_at"] = now
    left, each = sweep_left_s(state["i"], state["n"], now - state["rate_began"], this_rate_s, state["rates"], job_s)
    more = state["n"] - state["i"]
    basis = (f"the mean of the {len(state['rates'])} rate(s) done" if state["rates"] else "this rate's estimate")
    return (f"blocklab lab --lr-sweep: the whole sweep ≈ {clock(now - state['began'] + left)}, "
            f"≈ {clock(left)} left: this rate ≈ {clock(this_rate_s)}"
            + (f", then {more} more at ≈ {clock(each)} each ({basis})" if more else "")
            + f", then the sweep's tables and figure (≈ {job_s:.0f} s)")


def _lab_runs(out: Path) -> pd.DataFrame:
    """Every finished run of the sweep's labs under ``out``: block, lr, warmup, seed, final_loss, diverged, learned."""
    from .outcomes import learned
    from .records import adopted, read_run as read_recorded
    from ..integrity import read_run
    from .spec import Spec

    rows = []
    for lr in LRS:
        folder = out / f"lr{lr:g}"
        spec = Spec.from_file(folder / "spec.json")
        for warmup, seed in spec.runs():
            run_dir = folder / "runs" / spec.run_name(warmup, seed)
            meta, loss = read_recorded(run_dir) if adopted(run_dir) else read_run(run_dir)
            rows.append({"block": spec.block.label, "lr": lr, "warmup": warmup, "seed": seed,
                         "final_loss": final_loss(loss["step"], loss["loss"], spec.setup.vocab_size,
                                                  meta.get("diverged_step"), spec.setup.steps),
                         "diverged": meta.get("diverged_step") is not None,
                         "learned": learned(loss["step"].tolist(), loss["loss"].tolist(), spec.setup.vocab_size,
                                            meta.get("diverged_step")),
                         "vocab_size": spec.setup.vocab_size})
    return pd.DataFrame(rows)


def _panel(label: str, warmup: int, warmups) -> str:
    """The name of one warm-up's curve: the block's own name when the sweep has one warm-up."""
    return label if len(warmups) == 1 else f"{label}, {'no warm-up' if not warmup else f'warm-up {warmup}'}"


def builtin_references(spec, root: Path | str = REPO) -> pd.DataFrame:
    """The recorded study's built-in blocks (``records/lab/lr-sweep``) at the sweep's setup, when it is theirs (depth,
    batch, vocabulary and steps the same, no warm-up): one row a run, as ``recorded``; empty otherwise."""
    found = recorded(root)
    s = spec.setup
    same = ((found["n_layers"] == s.n_layers) & (found["batch_size"] == s.batch_size)
            & (found["vocab_size"] == s.vocab_size) & (found["steps_planned"] == s.steps) & (found["warmup"] == 0))
    return found[same]


def meaning(result: pd.DataFrame, runs: pd.DataFrame, chance: float, references: pd.DataFrame) -> list[str]:
    """What each row's number means for this block, in words: the rates at which its runs learned (k of n each), its
    best loss ℓ* against chance, the built-in blocks' values at the same setup where they are recorded, and the
    measure's blind spot said for this block (a block that learns at no rate scores low)."""
    ref = table(references, chance) if len(references) else pd.DataFrame()
    if len(ref):  # the recorded study's order (docs/lab.md's table)
        ref = ref.sort_values("block", key=lambda b: b.map({n: i for i, n in enumerate(BLOCKS)}), ignore_index=True)
    lines = []
    for r in result.itertuples():
        part = runs[(runs["block"] == r.block) & (runs["warmup"] == r.warmup)]
        at = part.groupby("lr")["learned"].agg(["sum", "count"])
        learned_at = [f"{lr:g} ({int(k)} of {int(n)})" for lr, (k, n) in at.iterrows() if k]
        curve = part.groupby("lr")["final_loss"].mean()
        best = float(curve.min())
        line = (f"LR sensitivity {r.lr_sensitivity:.3f}" + (f" [{r.low:.3f}, {r.high:.3f}]" if r.seeds >= 2 else "")
                + f" over {int(r.seeds)} seed(s); {int(r.runs_learned)} of {int(r.runs)} runs learned"
                + (f", at lr {', '.join(learned_at)}" if learned_at else ", at no rate of the grid")
                + f"; best final loss ℓ* {best:.3g} at lr "
                f"{float(curve.idxmin()):g}, {best / chance:.2g} × chance (ln V = {chance:.3f})")
        if learned_at:
            line += ("; the number is the mean excess over that best across the grid: a rate where the block stays at "
                     "chance adds up to ln V − ℓ* to it")
        else:
            line += (f"; so the number compares failures with the block's own best failure: a low value "
                     f"here means it failed alike everywhere, not that it is robust (the measure's blind spot: "
                     f"post-norm scores low in the recorded study for the same reason)")
        if len(ref):
            line += ("; the built-in blocks at this setup (recorded, records/lab/lr-sweep): " + ", ".join(
                f"{b.block} {b.lr_sensitivity:.3f} ({int(b.runs_learned)} of {int(b.runs)} learned)"
                for b in ref.itertuples()))
        lines.append(f"{r.block}: {line}")
    return lines


def write_sweep(out: Path, args) -> int:
    """The sweep's tables, figure and page from its finished labs: one row of ``lr_sensitivity.csv`` a warm-up (the
    measure is over learning rates at one warm-up; runs of two warm-ups are two curves), ``lr_runs.csv``,
    ``lr_sensitivity.png`` (the block's panels, beside the recorded built-in blocks' at the same setup), README.md."""
    import sys

    from ..figures import style
    from ..figures.lab import lr_sensitivity_figure
    from ..io import atomic_path, write_table
    from .spec import Spec

    out = Path(out)
    runs = _lab_runs(out)
    vocab = int(runs["vocab_size"].iloc[0])
    chance = math.log(vocab)
    label = runs["block"].iloc[0]
    warmups = sorted(int(w) for w in runs["warmup"].unique())
    result = pd.concat([table(runs[runs["warmup"] == w], chance).assign(block=_panel(label, w, warmups))
                        .assign(warmup=w) for w in warmups], ignore_index=True)
    result.insert(1, "warmup", result.pop("warmup"))
    panels = runs.assign(block=[_panel(label, int(w), warmups) for w in runs["warmup"]])
    references = builtin_references(Spec.from_file(out / f"lr{LRS[0]:g}" / "spec.json"))
    references = references[references["block"] != label]  # a built-in's own sweep is not its own reference
    shown = [*result["block"]] + [b for b in BLOCKS if b in set(references["block"])]
    figure_runs = pd.concat([panels, references[panels.columns.intersection(references.columns)]], ignore_index=True)
    figure_table = pd.concat([result, table(references, chance)], ignore_index=True) if len(references) else result
    write_table(runs.drop(columns=["vocab_size"]), out / "lr_runs.csv")
    write_table(result, out / "lr_sensitivity.csv")
    fig = lr_sensitivity_figure(figure_runs, figure_table, shown, "en", vocab, lrs=LRS)
    style.save(fig, out / "lr_sensitivity.png", sources=["lr_runs.csv"], params={"grid": list(LRS)})
    said = meaning(result, panels, chance, references)
    page = [f"# Learning-rate sensitivity: {label}", "",
            f"Wortsman et al. 2023's measure over the grid {', '.join(f'{lr:g}' for lr in LRS)} (docs/lab.md, "
            "\"Learning-rate sensitivity\"): the mean over the grid of min(ℓ(η), ℓ₀) − ℓ*, per seed, then over seeds.", "",
            *(f"- {line}" for line in said), "",
            "Files: `lr_sensitivity.csv` (one row a warm-up), `lr_runs.csv` (one row a run), `lr_sensitivity.png`, "
            "`lr<rate>/` (each rate's lab: its runs, tables, figure and page).", ""]
    with atomic_path(out / "README.md") as tmp:
        Path(tmp).write_text("\n".join(page), encoding="utf-8")
    for line in said:
        print(f"blocklab lab --lr-sweep: {line}", file=sys.stderr)
    print(f"blocklab lab --lr-sweep: {out / 'README.md'}, {out / 'lr_sensitivity.csv'}, "
          f"{out / 'lr_sensitivity.png'}", file=sys.stderr)
    return 0
