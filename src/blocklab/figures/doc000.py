"""Figures of document 000 (transformer block, pre- vs post-norm). Each function takes tidy frames and ``lang``."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from ..model_config import NORM_POSITION_SPECS
from . import style
from .style import log_y, text

# Every norm position of model_config.NORM_POSITION_SPECS, in the order the figures draw them, with its colour (declared there; tests/test_layout.py
# checks that the two name the same positions: a new one without a colour fails there, not at report time).
NORM_COLORS = {name: position.colour for name, position in NORM_POSITION_SPECS.items()}
OUTCOME_COLORS = {"learned": "#5aae61", "partial": "#e6c65c", "stuck": "#9e9e9e", "collapsed": "#e08214",
                  "diverged": "#8e44ad"}
OUTCOME_ORDER = list(OUTCOME_COLORS)


def norm_label(norm: str, lang: str) -> str:
    return text(lang, NORM_POSITION_SPECS[norm].label_ko, NORM_POSITION_SPECS[norm].label_en)


def warmup_label(warmup: int, lang: str) -> str:
    if warmup == 0:
        return text(lang, "워밍업 없음", "no warm-up")
    return text(lang, f"워밍업 {warmup}스텝", f"warm-up {warmup} steps")


def outcome_label(outcome: str, lang: str) -> str:
    ko = {"learned": "학습됨", "partial": "일부 학습", "stuck": "못 배움", "collapsed": "무너짐", "diverged": "발산"}
    return text(lang, ko.get(outcome, outcome), outcome)


# --- Xiong et al. 2020 Fig. 3 ------------------------------------------------------------------------------------------


def gradnorm_figure(gradnorm_df: pd.DataFrame, lang: str = "ko"):
    """Gradient norm of each block's 2nd MLP weight at init: one panel per norm position, shared y.

    Seeds are thin lines, their mean the thick line.
    """
    style.setup(lang)
    norms = [n for n in NORM_COLORS if n in set(gradnorm_df["norm"])]
    fig, axes = plt.subplots(1, len(norms), figsize=(5.2 * len(norms), 3.8), sharey=True, squeeze=False)
    for ax, norm in zip(axes[0], norms):
        part = gradnorm_df[gradnorm_df["norm"] == norm]
        color = NORM_COLORS[norm]
        for k, (_, run) in enumerate(part.groupby("seed")):
            ax.plot(run["block"], run["grad_norm"], color=color, lw=0.9, alpha=0.45,
                    label=text(lang, "시드마다", "each seed") if k == 0 else None)
        mean = part.groupby("block")["grad_norm"].mean()
        ax.plot(mean.index, mean.values, color=color, lw=2.6, marker="o", ms=3.5,
                label=text(lang, f"평균 (시드 {part['seed'].nunique()}개)", f"mean of {part['seed'].nunique()} seeds"))
        last = mean.index.max()
        ax.annotate(f"{mean[last]:.2f}", (last, mean[last]), xytext=(4, 6), textcoords="offset points",
                    color=color, fontsize=10, fontweight="bold")
        ax.set_title(norm_label(norm, lang))
        first, last_block = part["block"].min(), part["block"].max()
        ax.set_xlabel(text(lang, f"블록 번호 ({first}: 입력 쪽, {last_block}: 출력 쪽)",
                           f"block ({first}: input side, {last_block}: output side)"))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # block numbers (a 3-block stack had 1.25, 1.5, ...)
        ax.legend(loc="best", fontsize=9)  # wherever it covers the fewest lines (upper right hid the last block's value)
    top = gradnorm_df["grad_norm"].max()
    axes[0, 0].set_ylim(0, top * 1.3)  # headroom for the last block's value and the legend
    axes[0, 0].set_ylabel(text(lang, "MLP 둘째 층 무게의 그래디언트 크기", "grad norm of 2nd MLP weight"))
    fig.suptitle(text(lang, "학습을 시작할 때 블록마다의 그래디언트 (자비에 초기화)",
                      "Gradient per block at initialization (Xavier init)"), y=1.02)
    fig.tight_layout()
    return fig


# --- copy-task loss curves -------------------------------------------------------------------------------------------


def loss_curves_figure(losses_df: pd.DataFrame, lang: str = "ko", vocab_size: int = 64):
    """Copy-task loss, one panel per (norm, warm-up); seeds as thin lines on a log axis, ln(vocab) dotted.

    A run whose curve stops before the longest run (diverged, loss no longer finite) ends with an x.
    """
    style.setup(lang)
    finite = losses_df[np.isfinite(losses_df["loss"])]
    norms = [n for n in NORM_COLORS if n in set(finite["norm"])]
    warmups = sorted(finite["warmup"].unique())
    seeds = sorted(finite["seed"].unique())
    palette = dict(zip(seeds, sns.color_palette("deep", len(seeds))))
    last_step = losses_df["step"].max()
    fig, axes = plt.subplots(len(norms), len(warmups), figsize=(4.6 * len(warmups), 3.3 * len(norms)),
                             sharex=True, sharey=True, squeeze=False)
    chance = math.log(vocab_size)
    for (i, norm), (j, warmup) in ((a, b) for a in enumerate(norms) for b in enumerate(warmups)):
        ax = axes[i, j]
        cell = finite[(finite["norm"] == norm) & (finite["warmup"] == warmup)]
        for seed, run in cell.groupby("seed"):
            run = run.sort_values("step")
            ax.plot(run["step"], run["loss"], color=palette[seed], lw=0.9, alpha=0.85,
                    label=text(lang, f"시드 {seed}", f"seed {seed}"))
            if run["step"].iloc[-1] < last_step:
                ax.plot(run["step"].iloc[-1], run["loss"].iloc[-1], marker="x", ms=9, mew=2, color=palette[seed])
        ax.axhline(chance, color="black", ls=":", lw=1.3,
                   label=text(lang, f"ln {vocab_size} = {chance:.3f} (못 배움)", f"ln {vocab_size} = {chance:.3f} (chance)"))
        if warmup > 0:
            ax.axvline(warmup, color="grey", lw=0.8, ls="--")
        log_y(ax)
        ax.set_title(f"{norm_label(norm, lang)} · {warmup_label(warmup, lang)}", fontsize=11)
        if i == len(norms) - 1:
            ax.set_xlabel(text(lang, "스텝", "step"))
        if j == 0:
            ax.set_ylabel(text(lang, "베끼기 손실 (로그 축)", "copy loss (log scale)"))
    # shared y: room above ln V so runs that jump past it stay visible
    axes[0, 0].set_ylim(finite["loss"].min() / 2, max(finite["loss"].max(), chance) * 1.8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if any(w > 0 for w in warmups):
        handles.append(Line2D([], [], color="grey", lw=0.8, ls="--"))
        labels.append(text(lang, "워밍업 끝", "end of warm-up"))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.06), frameon=False)
    fig.tight_layout()
    return fig


# --- problem 9 -------------------------------------------------------------------------------------------------------


def problem9_figure(scores_df: pd.DataFrame, lang: str = "ko", words=None):
    """Raw scores, scores standardized per student (part a) and per subject over the pair (part b). ``words``: the
    report's translation of the data's Korean words (the subjects as the document names them), for an English page
    (``reporting.answers.in_english``; passed in, since figures sit below reporting)."""
    style.setup(lang)
    if lang == "en" and words is not None:
        scores_df = scores_df.assign(subject=scores_df["subject"].map(words))
    pair = list(scores_df.loc[scores_df["in_pair"], "student"].unique())
    panels = [
        ("raw", text(lang, "원점수", "raw scores"), text(lang, "점수", "score")),
        ("per_student", text(lang, "(가) 학생마다 표준화", "(a) standardized per student"), "z"),
        ("per_subject_pair", text(lang, f"(나) 과목마다 {'·'.join(pair)} 표준화", f"(b) per subject over {', '.join(pair)}"), "z"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.8))
    z_limit = 1.4 * np.nanmax(np.abs(scores_df[["per_student", "per_subject_pair"]].to_numpy(dtype=float)))
    students = list(scores_df["student"].unique())
    palette = dict(zip(students, sns.color_palette("Set2", len(students))))
    for ax, (column, title, ylabel) in zip(axes, panels):
        data = scores_df.dropna(subset=[column])
        sns.barplot(data=data, x="subject", y=column, hue="student", hue_order=[s for s in students if s in set(data["student"])],
                    palette=palette, ax=ax, errorbar=None)
        for container in ax.containers:
            ax.bar_label(container, fmt="%.3g" if column == "raw" else "%.2f", fontsize=8, padding=2)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("")
        ax.set_ylabel(ylabel)
        if column != "raw":
            ax.axhline(0, color="black", lw=0.8)
            ax.set_ylim(-z_limit, z_limit)
        else:
            ax.set_ylim(0, data[column].max() * 1.15)
        ax.get_legend().remove()
    handles = [Patch(fc=palette[s], label=s) for s in students]
    fig.legend(handles=handles, title=text(lang, "학생", "student"), loc="center right", bbox_to_anchor=(1.0, 0.5),
               frameon=False)
    fig.tight_layout(rect=(0, 0, 0.94, 1))
    return fig


# --- problem 10 ------------------------------------------------------------------------------------------------------


def problem10_figure(curve_df: pd.DataFrame, lang: str = "ko"):
    """Left: stream length vs blocks (mean, ±1 std band) against sqrt(L+1). Right: relative change per block vs 1/sqrt(L)."""
    style.setup(lang)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.9))
    L, mean, std = curve_df["blocks"], curve_df["mean_length"], curve_df["std_length"]
    left.fill_between(L, mean - std, mean + std, color="#1f6f8b", alpha=0.2, lw=0,
                      label=text(lang, "평균 ± 표준편차", "mean ± std"))
    left.plot(L, mean, color="#1f6f8b", lw=2.2, label=text(lang, "시뮬레이션 평균 길이", "simulated mean length"))
    left.plot(L, curve_df["sqrt_L_plus_1"], color="black", ls="--", lw=1.2, label=r"$\sqrt{L+1}$")
    left.set_xlabel(text(lang, "지난 블록 수 L", "blocks passed L"))
    left.set_ylabel(text(lang, "줄기의 길이 |h|", "stream length |h|"))
    left.set_title(text(lang, "(가) 줄기의 길이", "(a) stream length"), fontsize=11)
    left.legend(fontsize=9)
    steps = curve_df[curve_df["blocks"] >= 1]
    right.plot(steps["blocks"], steps["rel_change"], color="#c0392b", lw=2.2, marker="o", ms=3,
               label=text(lang, "측정: |Δ| / |h(L-1)|", "measured |Δ| / |h(L-1)|"))
    right.plot(steps["blocks"], 1 / np.sqrt(steps["blocks"]), color="black", ls="--", lw=1.2, label=r"$1/\sqrt{L}$")
    right.set_ylim(0, 1.05)
    right.set_xlabel(text(lang, "블록 번호 L", "block L"))
    right.set_ylabel(text(lang, "블록 하나가 줄기를 바꾸는 비율", "relative change by one block"))
    right.set_title(text(lang, "(나) 블록 하나의 몫", "(b) share of one block"), fontsize=11)
    right.legend(fontsize=9)
    fig.tight_layout()
    return fig


# --- problem 11 ------------------------------------------------------------------------------------------------------


def _box(ax, x, y, label, color, w=1.0, h=0.7):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04", fc=color, ec="black", lw=1))
    ax.text(x, y, label, ha="center", va="center", fontsize=11)


def _arrow(ax, start, end):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, lw=1.3, color="black", shrinkA=0, shrinkB=0))


# Problem 11's wiring diagrams, one per declared norm position (model_config.NORM_POSITION_SPECS): the boxes on the
# sub-layer's branch before the sum, a weight on the residual path (or None), the boxes after the sum, and the update in
# mathtext. A declared position without a line here is drawn as its label and formula with "wiring not drawn" (and
# tests/test_layout.py names it), never left out silently.
DIAGRAMS = {
    "post": (("F",), None, ("LN",), r"$h \leftarrow \mathrm{LN}(h + F(h))$"),
    "pre": (("LN", "F"), None, (), r"$h \leftarrow h + F(\mathrm{LN}(h))$"),
    "deepnorm": (("F",), r"$\alpha$", ("LN",), r"$h \leftarrow \mathrm{LN}(\alpha h + F(h))$"),
    "admin": (("F",), r"$\omega\odot$", ("LN",), r"$h \leftarrow \mathrm{LN}(\omega \odot h + F(h))$"),
    "b2t": (("F",), None, ("LN",), r"$h \leftarrow \mathrm{LN}(h + F(h) + x_{\mathrm{in}})$"),
    "rezero": (("F", r"$\alpha$"), None, (), r"$h \leftarrow h + \alpha F(h)$,  $\alpha_0 = 0$"),
    "sandwich": (("LN", "F", "LN"), None, (), r"$h \leftarrow h + \mathrm{LN}(F(\mathrm{LN}(h)))$"),
}


def _block_diagram(ax, norm: str, lang: str) -> None:
    """Left to right: h, the sub-layer F and its norms in the order the norm position dictates (``DIAGRAMS``), the
    residual path above (with its weight where the position has one), the sum, and what follows it."""
    ln_color, f_color, gate_color = "#f6d18b", "#bcd9ea", "#d9ead3"
    colour = lambda label: ln_color if label == "LN" else f_color if label == "F" else gate_color  # noqa: E731
    y, half, step = 0.0, 0.4, 1.05
    ax.set_title(norm_label(norm, lang), fontsize=12, color=NORM_COLORS[norm], loc="left")
    ax.axis("off")
    if norm not in DIAGRAMS:  # declared, but no drawing of its wiring: say so, with its formula
        ax.text(0.0, 0.6, text(lang, "배선도 없음 (figures/doc000.py의 DIAGRAMS에 없다)",
                               "wiring not drawn (no line in figures/doc000.py's DIAGRAMS)"), fontsize=10)
        ax.text(0.0, -0.3, NORM_POSITION_SPECS[norm].formula, fontsize=10)
        ax.set_xlim(-0.3, 6.4)
        ax.set_ylim(-1.2, 1.5)
        return
    branch, weight, after, formula = DIAGRAMS[norm]
    split = 1.0
    ax.text(0.0, y, "h", ha="center", va="center", fontsize=13, style="italic")
    _arrow(ax, (0.2, y), (split, y))
    ax.plot(split, y, "ko", ms=4)
    x = split
    for label in branch:
        centre = x + 0.15 + half if x == split else x + step
        _box(ax, centre, y, label, colour(label), w=2 * half)
        _arrow(ax, (x if x == split else x + half, y), (centre - half, y))
        x = centre
    plus = x + half + 0.55
    _arrow(ax, (x + half, y), (plus - 0.25, y))
    ax.add_patch(Circle((plus, y), 0.25, fc="white", ec="black", lw=1.2))
    ax.text(plus, y, "+", ha="center", va="center", fontsize=13)
    # the residual path: straight over the branch into the addition, through its weight where there is one
    ax.plot([split, split, plus], [y, 1.0, 1.0], color="#555555", lw=1.6)
    if weight:
        _box(ax, (split + plus) / 2, 1.0, weight, gate_color, w=0.7, h=0.45)
    _arrow(ax, (plus, 1.0), (plus, y + 0.25))
    ax.text((split + plus) / 2, 1.3 if weight else 1.12, text(lang, "잔차 줄기", "residual path"), ha="center",
            va="bottom", fontsize=9, color="#555555")
    out = plus + 0.25
    for label in after:
        centre = out + 0.3 + half
        _arrow(ax, (out, y), (centre - half, y))
        _box(ax, centre, y, label, colour(label), w=2 * half)
        out = centre + half
    end = max(5.7, out + 0.5)
    _arrow(ax, (out, y), (end, y))
    ax.text(end + 0.15, y, "h'", ha="left", va="center", fontsize=13, style="italic")
    ax.text(3.0, -0.85, formula, ha="center", va="center", fontsize=11)
    ax.set_xlim(-0.3, end + 0.7)
    ax.set_ylim(-1.2, 1.7)
    ax.set_aspect("equal")


def _cell_text(row, lang: str) -> str:
    if row["outcome"] == "diverged" or not np.isfinite(row["final_loss"]):
        step = "" if pd.isna(row.get("diverged_step")) else text(lang, f" ({int(row['diverged_step'])}스텝)",
                                                                  f" (step {int(row['diverged_step'])})")
        return text(lang, f"시드 {row['seed']}: 발산{step}", f"seed {row['seed']}: diverged{step}")
    loss = format_loss(row["final_loss"])
    return text(lang, f"시드 {row['seed']}: {loss}  {outcome_label(row['outcome'], lang)}",
                f"seed {row['seed']}: {loss}  {row['outcome']}")


def format_loss(value: float) -> str:
    return f"{value:.4f}" if value >= 0.01 else f"{value:.1e}"


def _outcome_grid(ax, summary_df: pd.DataFrame, lang: str) -> None:
    """Rows: norm position; columns: warm-up. Each cell lists every seed's final loss on its outcome's colour."""
    norms = [n for n in NORM_COLORS if n in set(summary_df["norm"])]
    warmups = sorted(summary_df["warmup"].unique())
    for i, norm in enumerate(norms):
        for j, warmup in enumerate(warmups):
            runs = summary_df[(summary_df["norm"] == norm) & (summary_df["warmup"] == warmup)].sort_values("seed")
            x0, y0 = j, len(norms) - 1 - i
            ax.add_patch(Rectangle((x0, y0), 1, 1, fc="white", ec="black", lw=1.2))
            height = 0.86 / max(len(runs), 1)
            for k, (_, row) in enumerate(runs.iterrows()):
                top = y0 + 0.93 - k * height
                ax.add_patch(Rectangle((x0 + 0.05, top - height + 0.02), 0.9, height - 0.04,
                                       fc=OUTCOME_COLORS.get(row["outcome"], "white"), ec="none", alpha=0.85))
                ax.text(x0 + 0.5, top - height / 2, _cell_text(row, lang), ha="center", va="center", fontsize=9.5)
    for j, warmup in enumerate(warmups):
        ax.text(j + 0.5, len(norms) + 0.04, warmup_label(warmup, lang), ha="center", va="bottom", fontsize=11)
    for i, norm in enumerate(norms):
        ax.text(-0.04, len(norms) - 0.5 - i, norm_label(norm, lang), ha="right", va="center", fontsize=11,
                color=NORM_COLORS[norm], rotation=90)
    present = [o for o in OUTCOME_ORDER if o in set(summary_df["outcome"])]
    ax.legend(handles=[Patch(fc=OUTCOME_COLORS[o], label=outcome_label(o, lang)) for o in present],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=len(present), frameon=False, fontsize=9)
    ax.set_xlim(-0.15, len(warmups) + 0.02)
    ax.set_ylim(-0.02, len(norms) + 0.3)
    ax.set_title(text(lang, "마지막 손실과 결과 (시드마다)", "final loss and outcome per seed"), fontsize=12, pad=14)
    ax.axis("off")


def problem11_figure(summary_df: pd.DataFrame, lang: str = "ko"):
    """Left: the wiring diagram of every declared norm position the sweep trained, in the declared order (post and
    pre at the document's setup). Right: the sweep's norm x warm-up grid of outcomes."""
    style.setup(lang)
    norms = [n for n in NORM_COLORS if n in set(summary_df["norm"])] or ["post", "pre"]
    rows = max(len(norms), 2)
    fig = plt.figure(figsize=(13, 2.6 * rows))
    grid = fig.add_gridspec(rows, 2, width_ratios=[1, 1.25], wspace=0.08, hspace=0.15)
    for i, norm in enumerate(norms):
        _block_diagram(fig.add_subplot(grid[i, 0]), norm, lang)
    _outcome_grid(fig.add_subplot(grid[:, 1]), summary_df, lang)
    return fig
