"""The stability lab's figure for the gallery: each literature fix's recorded loss curves beside the recorded pre- and
post-norm runs of the same setup. Plotting only: it takes a tidy frame (``reporting.lab_docs.gallery_curves``)."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, NullFormatter
import pandas as pd

from ..model_config import NORM_POSITION_SPECS
from . import style
from .doc000 import norm_label, warmup_label
from .style import text

REFERENCES = ("post", "pre")
USER_COLOUR = "#111111"  # a block that is not a built-in norm position (the lab's page draws it so too)


def lab_fixes_figure(curves: pd.DataFrame, fixes, lang: str = "ko", vocab_size: int = 64):
    """One panel per fix (columns) and warm-up (rows): the fix's recorded runs, one line a seed, over the reference
    runs (pre- and post-norm, thin); ln V dotted. ``curves``: block, warmup, seed, step, loss, source (lab or
    reference). A fix with no recorded run at a warm-up says so in its panel."""
    style.setup(lang)
    warmups = sorted(curves.loc[curves["source"] == "lab", "warmup"].unique()) or [0]
    fig, axes = plt.subplots(len(warmups), len(fixes), figsize=(3.3 * len(fixes), 2.9 * len(warmups)),
                             sharex=True, sharey=True, squeeze=False)
    chance = math.log(vocab_size)
    for i, warmup in enumerate(warmups):
        for j, fix in enumerate(fixes):
            ax = axes[i][j]
            ref = curves[(curves["source"] == "reference") & (curves["warmup"] == warmup)]
            for norm in REFERENCES:
                for k, (_, run) in enumerate(ref[ref["block"] == norm].groupby("seed")):
                    ax.plot(run["step"], run["loss"], color=NORM_POSITION_SPECS[norm].colour, lw=0.8, alpha=0.5,
                            label=norm_label(norm, lang) if k == 0 else None)
            mine = curves[(curves["source"] == "lab") & (curves["block"] == fix) & (curves["warmup"] == warmup)]
            for k, (seed, run) in enumerate(mine.groupby("seed")):
                ax.plot(run["step"], run["loss"], color=NORM_POSITION_SPECS[fix].colour, lw=1.6,
                        label=text(lang, f"{norm_label(fix, lang)} (시드 {mine['seed'].nunique()}개)",
                                   f"{norm_label(fix, lang)} ({mine['seed'].nunique()} seed"
                                   f"{'s' if mine['seed'].nunique() != 1 else ''})") if k == 0 else None)
            if mine.empty:
                ax.text(0.5, 0.5, text(lang, "아직 기록 없음", "not recorded yet"), transform=ax.transAxes,
                        ha="center", va="center", color="grey")
            ax.axhline(chance, color="grey", ls=":", lw=0.8)
            style.log_y(ax)
            ax.set_title(f"{norm_label(fix, lang)} · {warmup_label(int(warmup), lang)}", fontsize=10)
            if i == len(warmups) - 1:
                ax.set_xlabel(text(lang, "스텝", "step"))
            if j == 0:
                ax.set_ylabel(text(lang, "베끼기 손실 (로그 축)", "copy loss (log scale)"))
            ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(text(lang, "문헌의 뒤 정규화 고치기, 문서의 설정 (블록 24벌, 학습률 1e-3): 기록된 실행과 앞·뒤 정규화",
                      "The literature's fixes for post-norm at the document's setup (24 blocks, lr 1e-3): recorded runs "
                      "beside pre- and post-norm"), fontsize=11)
    fig.tight_layout()
    return fig


def lr_sensitivity_figure(runs: pd.DataFrame, table: pd.DataFrame, blocks, lang: str = "ko", vocab_size: int = 64,
                          lrs=None):
    """The learning-rate sweep side by side: one panel a block, its final loss (the mean of the last steps) against
    the learning rate (log axes), one line a seed and the mean over seeds thick; a diverged run marked x at chance
    (ln V, dotted), where the measure counts it; each panel's title gives its LR sensitivity with the 95 % interval.
    ``runs``: block, lr, seed, final_loss, diverged; ``table``: ``lab.lrsweep.table``'s rows; ``lrs``: the grid, which
    every panel's x axis spans (so that a block with only its lower rates run is not drawn on a shorter axis)."""
    style.setup(lang)
    fig, axes = plt.subplots(1, len(blocks), figsize=(2.6 * len(blocks), 3.1), sharex=True, sharey=True, squeeze=False)
    chance = math.log(vocab_size)
    by = table.set_index("block") if len(table) else pd.DataFrame()
    # a log y axis where the losses span a factor 10 or more (a power of ten is then in view and labelled); a linear
    # one over a narrower range (a block at chance at every rate: 4.1 to 4.4), where a log axis has no tick to label
    values = [v for v in [*runs.loc[runs["block"].isin(blocks), "final_loss"], chance] if math.isfinite(v) and v > 0]
    log_axis = bool(values) and max(values) / min(values) >= 10
    for ax, block in zip(axes[0], blocks):
        mine = runs[runs["block"] == block]
        colour = NORM_POSITION_SPECS[block].colour if block in NORM_POSITION_SPECS else USER_COLOUR
        for seed, run in mine.groupby("seed"):
            run = run.sort_values("lr")
            ax.plot(run["lr"], run["final_loss"], color=colour, lw=0.8, alpha=0.6, marker="o", ms=3,
                    ls=("-", "--", ":", "-.")[int(seed) % 4])
            bad = run[run["diverged"]]
            ax.plot(bad["lr"], bad["final_loss"], "x", color="black", ms=6)
        if len(mine):
            mean = mine.groupby("lr")["final_loss"].mean()
            seeds = mine["seed"].nunique()
            ax.plot(mean.index, mean.values, color=colour, lw=2.2,
                    label=text(lang, f"시드 {seeds}개의 평균" if seeds > 1 else "시드 1개",
                               f"mean of {seeds} seeds" if seeds > 1 else "one seed"))
        else:
            ax.text(0.5, 0.5, text(lang, "아직 기록 없음", "not recorded yet"), transform=ax.transAxes, ha="center",
                    va="center", color="grey")
        ax.axhline(chance, color="grey", ls=":", lw=0.8)
        if len(mine):
            ax.legend(fontsize=7, loc="lower left")
        ax.set_xscale("log")
        if lrs is not None:
            ax.set_xlim(min(lrs) / 1.6, max(lrs) * 1.6)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # no mathtext minus (NanumGothic)
        ax.xaxis.set_minor_formatter(NullFormatter())
        if log_axis:
            style.log_y(ax)
        else:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        title = norm_label(block, lang) if block in NORM_POSITION_SPECS else str(block)  # a user's block: its name
        if block in by.index and by.loc[block, "seeds"] >= 2:
            r = by.loc[block]
            title += f"\n{text(lang, '민감도', 'sensitivity')} {r.lr_sensitivity:.2f} [{r.low:.2f}, {r.high:.2f}]"
        elif block in by.index and by.loc[block, "seeds"] == 1:
            title += f"\n{text(lang, '민감도', 'sensitivity')} {by.loc[block, 'lr_sensitivity']:.2f} " \
                     f"({text(lang, '시드 1개', 'one seed')})"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(text(lang, "학습률", "learning rate"))
    axes[0][0].set_ylabel(text(lang, "마지막 손실 (로그 축)", "final loss (log scale)") if log_axis
                          else text(lang, "마지막 손실", "final loss"))
    fig.suptitle(text(lang, "학습률 민감도 (Wortsman 외 2023): 학습률마다의 마지막 손실, 블록별",
                      "Learning-rate sensitivity (Wortsman et al. 2023): the final loss at each learning rate, per block"),
                 fontsize=11)
    from matplotlib.lines import Line2D

    key = [Line2D([], [], color="grey", ls=":", lw=0.8),
           Line2D([], [], color="black", marker="x", ls="none", ms=6)]
    fig.legend(key, [text(lang, f"우연 수준 ln {vocab_size}: 발산한 실행은 이 값으로 센다",
                          f"chance, ln {vocab_size}: a diverged run counts as this"),
                     text(lang, "발산한 실행", "a diverged run")],
               loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
