"""Figures of the sensitivity study (what document 000 leaves open). Each function takes tidy frames and ``lang``;
``save_figures`` draws them all from the study's tables, with sidecars."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize
from matplotlib.lines import Line2D

from ...figures import style
from ...figures.doc000 import NORM_COLORS, norm_label, warmup_label
from ...figures.style import log_y, text
from ...io import read_table
from ...run_settings import CopyTask, Sweep
from ..cells import default_cell
from .plan import FIGURES, GRADNORM, TABLES

POSITION_COLORS = {"learned": "#2a9d8f", "sinusoidal": "#e76f51", "rope": "#6d597a", "none": "#8d99ae"}


def setting_label(setting: str, lang: str) -> str:
    """'learned-b32-L24-lr0.001-fp32' -> 'learned, batch 32' (+ precision when not fp32)."""
    position, batch, _depth, _lr, precision = setting.split("-")
    ko = {"learned": "학습 위치", "sinusoidal": "사인 위치", "rope": "RoPE", "none": "위치 없음"}
    label = text(lang, f"{ko.get(position, position)}, 배치 {batch[1:]}", f"{position}, batch {batch[1:]}")
    return label if precision == "fp32" else f"{label}, {precision}"


def phase_figure(summary: pd.DataFrame, lang: str = "ko", budget: int = 1200, rule: dict | None = None):
    """Post vs pre over depth x learning rate: each cell coloured by the median steps to learn over its seeds (grey:
    no seed learned within the budget), with every seed's value written in the cell ('—': never)."""
    style.setup(lang)
    grid = summary[summary["family"] == "depth_lr"]
    warmups = sorted(grid["warmup"].unique())
    norms = [n for n in NORM_COLORS if n in set(grid["norm"])]
    depths, lrs = sorted(grid["depth"].unique()), sorted(grid["lr"].unique())
    fig, axes = plt.subplots(len(warmups), len(norms), figsize=(3.9 * len(norms) + 1.2, 2.9 * len(warmups) + 0.6),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    cmap = plt.get_cmap("viridis_r").copy()
    cmap.set_bad("#d9d9d9")
    scale = Normalize(vmin=0, vmax=budget)
    image = None
    for (i, warmup), (j, norm) in ((a, b) for a in enumerate(warmups) for b in enumerate(norms)):
        ax = axes[i, j]
        part = grid[(grid["warmup"] == warmup) & (grid["norm"] == norm)]
        values = np.full((len(depths), len(lrs)), np.nan)
        for (y, depth), (x, lr) in ((a, b) for a in enumerate(depths) for b in enumerate(lrs)):
            runs = part[(part["depth"] == depth) & (part["lr"] == lr)].sort_values("seed")
            if runs.empty:
                continue
            learned = runs["steps_to_learn"].dropna()
            if len(learned) * 2 > len(runs):  # a majority of seeds learned: the cell's median is a step count
                values[y, x] = np.median(runs["steps_to_learn"].fillna(np.inf))
            labels = ["-" if math.isnan(v) else f"{v:.0f}" for v in runs["steps_to_learn"]]
            ax.text(x, y, "·".join(labels), ha="center", va="center", fontsize=8.5,
                    color="white" if not math.isnan(values[y, x]) and values[y, x] > budget * 0.5 else "black")  # dark end of viridis_r
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=scale, origin="lower", aspect="auto")
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(depths)), [str(d) for d in depths])
        ax.grid(False)
        ax.set_title(f"{norm_label(norm, lang)} · {warmup_label(warmup, lang)}", fontsize=11, color=NORM_COLORS[norm])
        if i == len(warmups) - 1:
            ax.set_xlabel(text(lang, "학습률", "learning rate"))
        if j == 0:
            ax.set_ylabel(text(lang, "블록 수", "blocks"))
    bar = fig.colorbar(image, ax=axes, shrink=0.85, pad=0.02)
    bar.set_label(text(lang, "배우기까지 걸린 스텝 (중앙값)", "steps to learn (median)"))
    seeds = grid["seed"].nunique()
    what = ""
    if rule:
        what = text(lang, f"배움 = 손실 < {rule['loss_below']:g}이 {rule['for_steps']}스텝 이어짐",
                    f"learned = loss < {rule['loss_below']:g} for {rule['for_steps']} steps")
    title = text(lang, f"깊이 × 학습률: 배우기까지 걸린 스텝 (시드 {seeds}개)", f"Depth × learning rate: steps to learn ({seeds} seed(s))")
    key = text(lang, f"칸 안 숫자 = 시드마다, - = {budget}스텝 안에 못 배움", f"numbers = each seed, - = not within {budget} steps")
    fig.suptitle(f"{title}\n{key}" + (f"; {what}" if what else ""), fontsize=10.5)
    return fig


def loss_curves_by_setting_figure(losses: pd.DataFrame, lang: str = "ko", vocab_size: int = 64, default: str | None = None):
    """Loss curves of the four norm x warm-up cases (rows) under each setting of the open choices (columns)."""
    style.setup(lang)
    part = losses[(losses["family"] == "choices") & np.isfinite(losses["loss"])]
    settings = sorted(part["setting"].unique(), key=lambda s: (s.split("-")[0], int(s.split("-")[1][1:]), s))
    cases = [(n, w) for n in NORM_COLORS for w in sorted(part["warmup"].unique()) if n in set(part["norm"])]
    fig, axes = plt.subplots(len(cases), len(settings), figsize=(2.6 * len(settings) + 0.8, 2.0 * len(cases) + 0.8),
                             sharex=True, sharey=True, squeeze=False)
    chance = math.log(vocab_size)
    for (i, (norm, warmup)), (j, setting) in ((a, b) for a in enumerate(cases) for b in enumerate(settings)):
        ax = axes[i, j]
        runs = part[(part["setting"] == setting) & (part["norm"] == norm) & (part["warmup"] == warmup)]
        for _, run in runs.groupby("seed"):
            ax.plot(run["step"], run["loss"], color=NORM_COLORS[norm], lw=0.8, alpha=0.8)
        ax.axhline(chance, color="black", ls=":", lw=1.0)
        if warmup > 0:
            ax.axvline(warmup, color="grey", lw=0.7, ls="--")
        log_y(ax)
        if i == 0:
            title = setting_label(setting, lang) + (text(lang, " (기본)", " (default)") if setting == default else "")
            ax.set_title(title, fontsize=9.5, fontweight="bold" if setting == default else "normal")
        if j == 0:
            ax.set_ylabel(text(lang, "손실", "loss"), fontsize=9)
        ax.text(0.97, 0.05, f"{norm_label(norm, lang)} · {warmup_label(warmup, lang)}", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color=NORM_COLORS[norm],
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
        if i == len(cases) - 1:
            ax.set_xlabel(text(lang, "스텝", "step"), fontsize=9)
        ax.tick_params(labelsize=8)
    low, high = max(part["loss"].min() / 2, 1e-5), max(part["loss"].max(), chance) * 1.8
    axes[0, 0].set_ylim(low, high)
    # explicit ticks: a short log range (a run near chance throughout) would otherwise get no labelled tick at all
    ticks = [t for t in (1e-4, 1e-3, 1e-2, 0.1, 1.0) if low <= t <= high] + [round(chance, 2)]
    for ax in axes.flat:
        ax.set_yticks(ticks)
    seeds = part["seed"].nunique()
    fig.suptitle(text(lang, f"열린 선택마다 네 경우의 베끼기 손실 (시드 {seeds}개, 점선 = ln {vocab_size})",
                      f"Copy loss of the four cases under each open choice ({seeds} seed(s); dotted = ln {vocab_size})"),
                 fontsize=11)
    fig.tight_layout()
    return fig


def gradnorm_by_position_figure(gradnorm: pd.DataFrame, lang: str = "ko"):
    """Gradient norm per block at init, one panel per norm position, one colour per position signal (seeds thin)."""
    style.setup(lang)
    norms = [n for n in NORM_COLORS if n in set(gradnorm["norm"])]
    fig, axes = plt.subplots(1, len(norms), figsize=(5.0 * len(norms), 3.6), sharey=True, squeeze=False)
    positions = list(dict.fromkeys(gradnorm["position"]))
    for ax, norm in zip(axes[0], norms):
        for position in positions:
            part = gradnorm[(gradnorm["norm"] == norm) & (gradnorm["position"] == position)]
            color = POSITION_COLORS.get(position, "black")
            for _, run in part.groupby("seed"):
                ax.plot(run["block"], run["grad_norm"], color=color, lw=0.7, alpha=0.35)
            mean = part.groupby("block")["grad_norm"].mean()
            ax.plot(mean.index, mean.values, color=color, lw=2.2, marker="o", ms=3)
        ax.set_title(norm_label(norm, lang))
        ax.set_xlabel(text(lang, "블록 번호 (1: 입력 쪽)", "block (1: input side)"))
        ax.set_ylim(bottom=0)
    axes[0, 0].set_ylabel(text(lang, "MLP 둘째 층 무게의 그래디언트 크기", "grad norm of 2nd MLP weight"))
    names = {"learned": text(lang, "학습하는 위치 표", "learned positions"),
             "sinusoidal": text(lang, "사인 위치", "sinusoidal positions"), "rope": "RoPE",
             "none": text(lang, "위치 없음", "no positions")}
    handles = [Line2D([], [], color=POSITION_COLORS.get(p, "black"), lw=2.2, label=names.get(p, p)) for p in positions]
    handles.append(Line2D([], [], color="grey", lw=0.7, alpha=0.5, label=text(lang, "시드마다", "each seed")))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, -0.08), frameon=False)
    fig.suptitle(text(lang, "위치 신호마다 학습 시작 때 블록별 그래디언트", "Gradient per block at init, by position signal"),
                 y=1.02)
    fig.tight_layout()
    return fig


def at_batch(gradnorm: pd.DataFrame, params: dict) -> pd.DataFrame:
    """The gradients at init at params.yaml's batch size (the figure compares position signals at one batch)."""
    return gradnorm[gradnorm["batch_size"] == CopyTask.from_params(params).batch_size]


def save_figures(params: dict, data: str | Path = "data", figs: str | Path = "figs", lang: str | None = None,
                 names=None) -> list:
    """The study's figures (``names``: those of ``plan.FIGURES`` named, default all) drawn from its tables under
    ``data`` into ``figs``, each with its sidecar; a table is read only by the figures drawn from it."""
    lang = lang or params["figures"]["lang"]
    data = Path(data)
    where = lambda rel: data / Path(rel).relative_to("data")  # noqa: E731  (the tables' paths under another data dir)
    table = lambda rel: read_table(where(rel))  # noqa: E731
    vocab, steps = CopyTask.from_params(params).vocab_size, Sweep.from_params(params).steps
    rule = params["sensitivity"]["early_stop"]
    made = {
        "sensitivity_phase": lambda: phase_figure(table(TABLES["summary"]), lang=lang, budget=steps,
                                                  rule=rule),
        "sensitivity_loss_curves": lambda: loss_curves_by_setting_figure(table(TABLES["losses"]), lang=lang,
                                                                         vocab_size=vocab,
                                                                         default=default_cell(params).name),
        "sensitivity_gradnorm": lambda: gradnorm_by_position_figure(at_batch(table(GRADNORM), params), lang=lang),
    }
    out = []
    for name, build in made.items():
        if names is not None and name not in names:
            continue
        style.setup(lang)
        out.append(style.save(build(), Path(figs) / f"{name}.png", dpi=params["figures"]["dpi"],
                              sources=[str(where(s)) for s in FIGURES[name]],
                              params={"figures": params["figures"], "lang": lang, "sensitivity": params["sensitivity"]}))
    return out
