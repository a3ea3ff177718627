"""The lab's tables, figure and page: lab.csv (one row a run), rates.csv (each outcome's rate per warm-up with its 95 %
Wilson interval), lab.png (the loss curves beside the recorded pre- and post-norm runs of the same setup, and the
gradient per block at init) and README.md (what was measured and what it cannot decide)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import binomtest  # noqa: E402

from ..model_config import NORM_POSITION_SPECS  # noqa: E402
from ..io import read_table  # noqa: E402
from ..records import GALLERY  # noqa: E402
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
    """The recorded pre- and post-norm runs of the same setup (the gallery's default sweep), or None and why not."""
    import yaml

    losses, params_file = root / "sweep" / "losses.csv", root / "params.yaml"
    if not losses.is_file() or not params_file.is_file():
        return None, f"no recorded runs found ({losses} missing)"
    from .spec import profile_setup

    recorded = profile_setup(yaml.safe_load(params_file.read_text(encoding="utf-8")), "document")
    mine, theirs = spec.setup.__dict__.copy(), recorded.__dict__.copy()
    for key in ("warmups", "seeds", "checkpoint_every"):
        mine.pop(key), theirs.pop(key)
    if mine != theirs:
        differ = sorted(k for k in mine if mine[k] != theirs[k])
        return None, f"the recorded runs are of another setup (they differ in {', '.join(differ)})"
    frame = read_table(losses)
    return frame[frame["norm"].isin(["pre", "post"])], "records/gallery/sweep/losses.csv (the default run's sweep)"


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
        if reference is not None:
            for norm in ("post", "pre"):
                if norm == label:
                    continue
                part = reference[(reference["norm"] == norm) & (reference["warmup"] == warmup)]
                for k, (_, run) in enumerate(part.groupby("seed")):
                    ax.plot(run["step"], run["loss"], color=NORM_POSITION_SPECS[norm].colour, lw=0.8, alpha=0.45,
                            label=f"{NORM_POSITION_SPECS[norm].label_en} (recorded)" if k == 0 else None)
                    shown += run["loss"].tolist()
        part = curves[curves["warmup"] == warmup]
        for k, seed in enumerate(sorted(spec.setup.seeds)):
            run = part[part["seed"] == seed]
            style = SEED_STYLES[k % len(SEED_STYLES)]
            ax.plot(run["step"], run["loss"], color=colour, lw=1.6, ls=style, label=f"{label} seed {seed} (this lab)")
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
        ax.plot(mean.index, mean.values, marker="o", ms=3, color=c, label=f"{kind} (mean of {part['seed'].nunique()})")
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

