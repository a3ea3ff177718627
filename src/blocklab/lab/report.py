"""The lab's tables, figure and page: lab.csv (one row a run), rates.csv (each outcome's rate per warm-up with its 95 %
Wilson interval), lab.png (the loss curves beside the recorded pre- and post-norm runs of the same setup, and the
gradient per block at init) and README.md (what was measured and what it cannot decide)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import binomtest  # noqa: E402

from ..model_config import NORM_POSITION_SPECS  # noqa: E402
from ..io import read_table  # noqa: E402
from ..records import GALLERY, LAB_LR_RUNS, SENSITIVITY  # noqa: E402
from .outcomes import CHANCE, COLUMNS, ENDS_COLLAPSED, LEARNED, OUTCOMES  # noqa: E402
from .spec import PROFILE_TRADES, Spec  # noqa: E402

# The recorded default run (docs/gallery): its sweep's losses and the parameters that made them.
RECORDED = Path(__file__).resolve().parents[3] / GALLERY


def wilson(k: int, n: int) -> tuple[float, float]:
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def rates(lab: pd.DataFrame) -> pd.DataFrame:
    """k of n runs per warm-up and outcome, with the 95 % Wilson interval of the rate."""
    rows = []
    for (block, warmup), part in lab.groupby(["block", "warmup"], sort=True):
        n = len(part)
        for kind in OUTCOMES:
            k = int((part["outcome"] == kind).sum())
            low, high = wilson(k, n)
            rows.append({"block": block, "warmup": int(warmup), "outcome": kind, "k": k, "n": n, "rate": k / n,
                         "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)


def recorded_reference(spec: Spec, root: Path = RECORDED) -> tuple[pd.DataFrame | None, str]:
    """The recorded pre- and post-norm runs of the lab's setup (columns norm, warmup, seed, step, loss), or None and
    why not. Where they are looked for, in this order (a run found in two places is taken from the first): the gallery's
    default sweep (``root``: the document profile's setup), the learning-rate study's runs (``records/lab/lr-sweep``:
    batch 16, 300 steps, each rate of the grid) and the sensitivity study's open choices (``records/sensitivity/
    choices``: each cell at 1,200 steps, seed 0). A run recorded longer than the lab's steps is the same run up to
    them (the learning rate does not depend on the steps planned: warm-up, then constant), so its first steps are
    drawn. The setup must match in everything else; warm-ups not in the lab are left out."""
    frames, notes = [], []
    gallery, why = _gallery_reference(spec, root)
    if gallery is not None:
        frames.append(gallery)
        notes.append("records/gallery/sweep/losses.csv (the default run's sweep)")
    for found, where in ((_lab_lr_reference(spec, root.parents[1]), LAB_LR_RUNS),
                         (_choices_reference(spec, root), f"{SENSITIVITY}/choices/losses.csv")):
        if len(found):
            frames.append(found)
            notes.append(f"{where} (seed{'s' if found['seed'].nunique() > 1 else ''} "
                         f"{', '.join(str(s) for s in sorted(found['seed'].unique()))}"
                         + (f"; their first {spec.setup.steps} steps" if found.attrs.get("longer") else "") + ")")
    if not frames:
        return None, f"none recorded at this setup ({why}; none in {LAB_LR_RUNS} or {SENSITIVITY}/choices either)"
    frame = pd.concat(frames, ignore_index=True).drop_duplicates(["norm", "warmup", "seed", "step"], keep="first")
    frame = frame[frame["warmup"].isin(spec.setup.warmups)]
    if not len(frame):
        return None, f"none recorded at this setup with warm-ups {list(spec.setup.warmups)}"
    return frame[["norm", "warmup", "seed", "step", "loss"]].reset_index(drop=True), "; ".join(notes)


def _same_setup(spec: Spec, other, longer_ok: bool = True) -> bool:
    """``other`` (a Setup) is the lab's setup but for warm-ups, seeds, checkpoints and (``longer_ok``) more steps."""
    mine, theirs = spec.setup.__dict__.copy(), other.__dict__.copy()
    for key in ("warmups", "seeds", "checkpoint_every", "steps"):
        mine.pop(key), theirs.pop(key)
    if any(not (mine[k] == theirs[k] or (isinstance(mine[k], float) and math.isclose(mine[k], theirs[k])))
           for k in mine):
        return False
    return other.steps == spec.setup.steps or (longer_ok and other.steps > spec.setup.steps)


def _gallery_reference(spec: Spec, root: Path) -> tuple[pd.DataFrame | None, str]:
    import yaml

    losses, params_file = root / "sweep" / "losses.csv", root / "params.yaml"
    if not losses.is_file() or not params_file.is_file():
        return None, f"no recorded default run ({losses} missing)"
    from .spec import profile_setup

    recorded = profile_setup(yaml.safe_load(params_file.read_text(encoding="utf-8")), "document")
    if not _same_setup(spec, recorded, longer_ok=False):
        mine, theirs = spec.setup.__dict__, recorded.__dict__
        differ = sorted(k for k in mine if k not in ("warmups", "seeds", "checkpoint_every") and mine[k] != theirs[k])
        return None, f"the recorded default run is of another setup (it differs in {', '.join(differ)})"
    frame = read_table(losses)
    return frame[frame["norm"].isin(["pre", "post"])], ""


def _lab_lr_reference(spec: Spec, repo: Path) -> pd.DataFrame:
    """Pre- and post-norm runs of the learning-rate study at the lab's setup (its first steps where they ran longer)."""
    from dataclasses import replace

    from ..training.lab_records import setup_of
    from .lrsweep import NAME
    from .records import read_run

    frames, longer = [], False
    folder = repo / LAB_LR_RUNS
    for run_dir in sorted(folder.iterdir()) if folder.is_dir() else []:
        named = NAME.match(run_dir.name)
        if not named or named["block"] not in ("pre", "post") or not (run_dir / "meta.json").is_file():
            continue
        meta, loss = read_run(run_dir)
        setup = setup_of(meta)
        theirs = replace(spec.setup, n_layers=setup["copy_model.n_layers"], d_model=setup["copy_model.d_model"],
                         n_heads=setup["copy_model.n_heads"], vocab_size=setup["copy_task.vocab_size"],
                         seq_len=setup["copy_task.seq_len"], batch_size=setup["copy_task.batch_size"],
                         lr=float(setup["sweep.lr"]), steps=int(setup["sweep.steps"]),
                         position=setup["copy_model.position"] or "learned")
        if meta.get("diverged_step") is None and _same_setup(spec, theirs):
            longer |= theirs.steps > spec.setup.steps
            frames.append(loss[loss["step"] <= spec.setup.steps][["step", "loss"]].assign(
                norm=named["block"], warmup=int(named["warmup"]), seed=int(named["seed"])))
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["norm", "warmup", "seed", "step",
                                                                                      "loss"])
    frame.attrs["longer"] = longer
    return frame


def _choices_reference(spec: Spec, gallery: Path) -> pd.DataFrame:
    """Pre- and post-norm runs of the sensitivity study's open choices at the lab's setup: each cell is the recorded
    default run's params.yaml with the cell's position, batch, depth and learning rate (``studies.cells``)."""
    import yaml

    from ..studies.cells import Cell, cell_params
    from .spec import profile_setup

    losses, params_file = gallery.parents[0] / "sensitivity" / "choices" / "losses.csv", gallery / "params.yaml"
    empty = pd.DataFrame(columns=["norm", "warmup", "seed", "step", "loss"])
    if not losses.is_file() or not params_file.is_file():
        return empty
    params = yaml.safe_load(params_file.read_text(encoding="utf-8"))
    table = pd.read_csv(losses)
    frames, longer = [], False
    for setting, part in table.groupby("setting"):
        try:
            cell = Cell.parse(setting)
        except Exception:  # noqa: BLE001 (a name this reader does not know is not a reference)
            continue
        if cell.precision != "fp32":
            continue
        theirs = profile_setup(cell_params(params, cell), "document")
        if not _same_setup(spec, theirs):
            continue
        for run, one in part.groupby("run"):
            named = re.fullmatch(r"(pre|post)-w(\d+)-s(\d+)", run)
            if named and int(one["step"].max()) >= spec.setup.steps:
                longer |= int(one["step"].max()) > spec.setup.steps
                frames.append(one[one["step"] <= spec.setup.steps][["step", "loss"]].assign(
                    norm=named[1], warmup=int(named[2]), seed=int(named[3])))
    frame = pd.concat(frames, ignore_index=True) if frames else empty
    frame.attrs["longer"] = longer
    return frame


SEED_STYLES = ("-", (0, (5, 3)), (0, (1, 2)), (0, (6, 2, 1, 2)), (0, (2, 4)))  # identical curves stay distinguishable


def _scale(ax, values) -> None:
    """A log axis where the values span a factor 10 or more; a linear one over a narrower range (a log axis there
    labels its ticks as 4.55×10⁰)."""
    finite = [v for v in values if math.isfinite(v) and v > 0]
    if finite and max(finite) / min(finite) >= 10:
        ax.set_yscale("log")


def loss_figure(spec: Spec, curves: pd.DataFrame, gradnorms: pd.DataFrame, reference: pd.DataFrame | None, path: Path,
                diverged=frozenset()):
    """``diverged``: the (warm-up, seed) of the runs that diverged, marked where their loss stopped being finite."""
    from matplotlib.ticker import MaxNLocator

    warmups = list(spec.setup.warmups)
    fig, axes = plt.subplots(1, len(warmups) + 1, figsize=(4.6 * (len(warmups) + 1), 3.8), squeeze=False)
    chance = math.log(spec.setup.vocab_size)
    label = spec.block.label
    colour = NORM_POSITION_SPECS[label].colour if label in NORM_POSITION_SPECS else "#111111"
    for ax, warmup in zip(axes[0], warmups):
        shown = [chance]
        if reference is not None:  # wide pale bands under the lab's thin lines: a block that trains as a built-in
            for norm in ("post", "pre"):  # does shows as its line inside that built-in's band, both seen
                part = reference[(reference["norm"] == norm) & (reference["warmup"] == warmup)]
                seeds = sorted(int(s) for s in part["seed"].unique())
                for k, (_, run) in enumerate(part.groupby("seed")):
                    ax.plot(run["step"], run["loss"], color=NORM_POSITION_SPECS[norm].colour, lw=4.5, alpha=0.3,
                            solid_capstyle="round", zorder=1,
                            label=(f"{NORM_POSITION_SPECS[norm].label_en} (recorded, seed{'s' if len(seeds) > 1 else ''}"
                                   f" {', '.join(map(str, seeds))})") if k == 0 else None)
                    shown += run["loss"].tolist()
        part = curves[curves["warmup"] == warmup]
        for k, seed in enumerate(sorted(spec.setup.seeds)):
            run = part[part["seed"] == seed]
            style = SEED_STYLES[k % len(SEED_STYLES)]
            ax.plot(run["step"], run["loss"], color=colour, lw=1.3, ls=style, zorder=3,
                    label=f"{label} seed {seed} (this lab)")
            shown += run["loss"].tolist()
            if (warmup, seed) in diverged:
                last = (int(run["step"].iloc[-1]), float(run["loss"].iloc[-1])) if len(run) else (0, chance)
                marked = any(line.get_label().startswith("diverged") for line in ax.get_lines())
                ax.plot(*last, marker="x", ms=9, mew=2, color="#c0392b", ls="none",
                        label=None if marked else "diverged (loss not finite after this step)")
                ax.annotate(f"seed {seed} diverged at step {last[0] + 1}", last, xytext=(6, 6),
                            textcoords="offset points", fontsize=7, color="#c0392b")
        ax.axhline(chance, color="grey", ls=":", lw=0.8, label=f"chance, ln {spec.setup.vocab_size} = {chance:.2f}")
        _scale(ax, shown)
        ax.set_xlim(0, spec.setup.steps + 1)  # the whole run, however early a run stopped
        ax.margins(y=0.12)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"warm-up {warmup} steps" if warmup else "no warm-up")
        ax.set_xlabel("step")
        ax.set_ylabel("copy loss (nats)")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for kind, part in gradnorms.groupby("block_kind", sort=False):
        mean = part.groupby("block")["grad_norm"].mean()
        c = colour if kind == label else NORM_POSITION_SPECS[kind].colour if kind in NORM_POSITION_SPECS else "grey"
        own = kind == label  # the built-ins as wide pale bands under the block's thin line: equal values show both
        ax.plot(mean.index, mean.values, marker="o", ms=3 if own else 7, color=c, lw=1.3 if own else 4.5,
                alpha=1.0 if own else 0.35, zorder=3 if own else 1, label=f"{kind} (mean of {part['seed'].nunique()})")
    _scale(ax, gradnorms["grad_norm"].tolist())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("gradient per block at init")
    ax.set_xlabel("block")
    ax.set_ylabel("‖∂loss/∂block parameters‖")
    ax.legend(fontsize=7)
    fig.suptitle(f"{label}: {spec.setup.n_layers} blocks, lr {spec.setup.lr:g}, batch {spec.setup.batch_size} "
                 f"({spec.profile} profile)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def page(spec: Spec, lab: pd.DataFrame, rate_table: pd.DataFrame, reference_note: str,
         adopted: list[dict] | None = None) -> str:
    s = spec.setup
    read = spec.read
    if spec.block.kind == "builtin":
        where = f"built-in `{spec.block.source}`: {read.get('formula')} ({read.get('paper')})"
    else:
        where = f"`{spec.block.source}`, built as {read.get('how')}"
        where += f"; {read['depth']}" if read.get("depth") else ""
        where += f"; {read['depth_not_passed']}" if read.get("depth_not_passed") else ""
    final = read.get("final_norm")
    final_text = (final if isinstance(final, str) else f"one {read['final_norm_class']} after the last block (the "
                  "block's own RMSNorm, as a Llama-style stack ends)" if final and read.get("final_norm_class") else
                  "one LayerNorm after the last block" if final else "none")
    placement = read.get("norm_placement") or ("not read: " + str(read.get("reason")) if read.get("reason") else "—")
    lines = [f"# Stability lab: {spec.block.label}", "",
             f"- **Block**: {where}.",
             f"- **Norm placement as read**: {placement}; **final norm used**: {final_text}.",
             *([f"- **As read**: {read['post_norm']}."] if read.get("post_norm") else []),
             *([f"- **Residual as read**: {'; '.join(read['residual'])}."] if read.get("residual") else []),
             f"- **Setup** (`{spec.profile}` profile): {s.n_layers} blocks, d {s.d_model}, {s.n_heads} heads, FFN "
             f"{s.ffn_ratio:g}×, copy task of {s.seq_len} tokens over {s.vocab_size} symbols, batch {s.batch_size}, "
             f"Adam lr {s.lr:g}, {s.steps} steps, warm-ups {list(s.warmups)}, seeds {list(s.seeds)}. "
             f"What the profile trades: {PROFILE_TRADES[spec.profile]}.",
             f"- **Outcomes** (chance is ln {s.vocab_size} = {math.log(s.vocab_size):.3f}): `learned` fell below "
             f"{LEARNED} × chance and ended below {ENDS_COLLAPSED} × chance; `never` never fell below {LEARNED} × "
             f"chance; `collapsed` learned, then ended above {ENDS_COLLAPSED} × chance (`step_collapsed`: the first "
             f"step back at {CHANCE} × chance); `diverged`: the loss became NaN or infinite.",
             *([f"- **Adopted, not retrained**: {len(adopted)} of {len(lab)} runs were recorded in git at this setup "
                "and copied from there (" + "; ".join(f"{a['run']}: `{a['from']}`, trained on {a['cpu']}, commit "
                                                      f"{a['git_commit']}" for a in adopted)
                + "); `--retrain` trains them here."] if adopted else []),
             "", "## Rates per warm-up (95 % Wilson intervals)", "",
             "| warm-up | outcome | k of n | rate | 95 % interval |", "|---:|---|---:|---:|---|"]
    for r in rate_table.itertuples():
        lines.append(f"| {r.warmup} | {r.outcome} | {r.k} of {r.n} | {r.rate:.0%} | {r.ci_low:.0%}–{r.ci_high:.0%} |")
    lines += ["", "## Runs", "", lab[COLUMNS].to_markdown(index=False, floatfmt=".4g"), "",
              "## What this cannot decide", "",
              f"- {len(s.seeds)} seed(s) per warm-up: a rate of k of n is known only to its interval above (0 of 3 "
              "is compatible with a true rate up to 56 %). More seeds: `--seeds 0 1 2 3 4 5`.",
              "- Which seed collapses is decided by rounding: the same seed can collapse on one processor and not on "
              "another (docs/dynamics.md); only rates over seeds compare across machines.",
              "- One setup: another depth, learning rate or batch can change the answer (the sensitivity study).",
              f"- Recorded pre- and post-norm runs beside it: {reference_note}.", "",
              "Files: `lab.csv` (one row a run), `rates.csv`, `gradnorm.csv` (gradient per block at init, with the "
              "built-in pre- and post-norm blocks at the same setup), `lab.png`, `runs/<run>/` (loss.csv, meta.json "
              "with the parameters and code that made it).", ""]
    return "\n".join(lines)


def write_report(spec: Spec, rows: list[dict], run_dirs: dict, gradnorms: pd.DataFrame, out: Path) -> None:
    from ..io import atomic_path, write_table

    lab = pd.DataFrame(rows, columns=COLUMNS).sort_values(["warmup", "seed"], ignore_index=True)
    rate_table = rates(lab)
    curves = pd.concat([read_table(Path(d) / "loss.csv").assign(warmup=w, seed=s) for (w, s), d in run_dirs.items()],
                       ignore_index=True)
    reference, note = recorded_reference(spec)
    from .records import adopted as adopted_record

    adopted = [a for d in run_dirs.values() if (a := adopted_record(d))]
    write_table(lab, out / "lab.csv")
    write_table(rate_table, out / "rates.csv")
    with atomic_path(out / "lab.png") as tmp:
        loss_figure(spec, curves, gradnorms, reference, tmp,
                    {(r["warmup"], r["seed"]) for r in rows if r["outcome"] == "diverged"})
    with atomic_path(out / "README.md") as tmp:
        Path(tmp).write_text(page(spec, lab, rate_table, note, adopted), encoding="utf-8")

