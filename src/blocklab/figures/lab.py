"""The stability lab's figure for the gallery: each literature fix's recorded loss curves beside the recorded pre- and
post-norm runs of the same setup. Plotting only: it takes a tidy frame (``reporting.lab_docs.gallery_curves``)."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd

from ..config import POSITIONS
from . import style
from .doc000 import norm_label, warmup_label
from .style import text

REFERENCES = ("post", "pre")


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
                    ax.plot(run["step"], run["loss"], color=POSITIONS[norm].colour, lw=0.8, alpha=0.5,
                            label=norm_label(norm, lang) if k == 0 else None)
            mine = curves[(curves["source"] == "lab") & (curves["block"] == fix) & (curves["warmup"] == warmup)]
            for k, (seed, run) in enumerate(mine.groupby("seed")):
                ax.plot(run["step"], run["loss"], color=POSITIONS[fix].colour, lw=1.6,
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
