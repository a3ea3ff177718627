"""Figures of the training dynamics: Xiong et al.'s Fig. 3 through training, and the anatomy of a collapse.

Each function takes tidy frames (``data/dynamics/``) and ``lang``; ``save_figures`` draws them all with sidecars.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from ...figures import style
from ...figures.doc000 import NORM_COLORS, norm_label, warmup_label
from ...figures.style import log_y, text
from ...io import read_table
from ...run_settings import Sweep
from .aggregate import ANATOMY_AFTER, ANATOMY_BEFORE, at_step, figure_steps
from .plan import FIGURES, TABLES


ANATOMY = [  # (metric, how the blocks are folded into one line, Korean label, English label, log scale)
    ("loss", None, "손실", "loss", True),
    ("grad_ffn_out", "max", "MLP 둘째 가중치 그래디언트 (블록 최대)", "2nd MLP weight gradient (max over blocks)", True),
    ("adam_rms", "max", "Adam √mean(g²/v) (블록 최대)", "Adam √mean(g²/v) (max over blocks)", True),
    ("update_ratio", "max", "상대 갱신 ‖Δθ‖/‖θ‖ (블록 최대)", "relative update ‖Δθ‖/‖θ‖ (max over blocks)", True),
    ("attn_logit_max", "max", "최대 어텐션 로짓", "largest attention logit", False),
    ("attn_entropy", "min", "어텐션 엔트로피 (블록 최소)", "attention entropy (min over blocks)", False),
    ("output_logit_max", "max", "최대 출력 로짓", "largest output logit", False),
]


STEP_STYLES = [("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 3)), "P")]


def gradnorm_through_training_figure(diagnostics: pd.DataFrame, summary: pd.DataFrame, lang: str = "ko",
                                     steps: int = 1200, seed: int = 0):
    """Per-block gradient norm of the second MLP weight, post vs pre, at several steps, one panel per warm-up. Each
    line is the value at that step (one batch's gradient), a colour per norm and a line style and marker per step."""
    from matplotlib.lines import Line2D

    style.setup(lang)
    compare = summary[summary["compare"].astype(bool) & (summary["seed"] == seed)]
    warmups = sorted(compare["warmup"].unique())
    fig, axes = plt.subplots(1, len(warmups), figsize=(5.6 * len(warmups), 5.0), squeeze=False, sharey=True,
                             layout="constrained")
    grads = diagnostics[diagnostics["metric"] == "grad_ffn_out"]
    at = figure_steps(max(warmups), steps)
    styles = dict(zip(at, STEP_STYLES))
    averaged = set()
    for ax, warmup in zip(axes[0], warmups):
        for run in compare[compare["warmup"] == warmup].itertuples():
            frame = grads[(grads["setting"] == run.setting) & (grads["run"] == run.run)]
            for step in at:
                per_block, exact = at_step(frame, step)
                if per_block.empty:
                    continue
                if not exact:
                    averaged.add(step)
                ls, marker = styles[step]
                ax.plot(per_block.index + 1, per_block.values, ls=ls, marker=marker, markersize=4, lw=1.5,
                        color=NORM_COLORS[run.norm], markerfacecolor="white" if run.norm == "pre" else None)
        log_y(ax)
        ax.set_title(warmup_label(int(warmup), lang))
        ax.set_xlabel(text(lang, "블록 (1 = 입력 쪽)", "block (1 = input side)"))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    norms = [n for n in NORM_COLORS if n in set(compare["norm"])]
    handles = [Line2D([], [], color=NORM_COLORS[n], lw=2.5, marker="o", markerfacecolor="white" if n == "pre" else None,
                      label=norm_label(n, lang)) for n in norms]
    step_word = text(lang, "스텝", "step")
    handles += [Line2D([], [], color="#333333", ls=styles[s][0], marker=styles[s][1], markersize=6, lw=1.5,
                       markerfacecolor="white",
                       label=f"{step_word} {s}" + (text(lang, " (±5 평균)", " (±5 mean)") if s in averaged else ""))
                for s in at]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=11, handlelength=3.2,
               frameon=False)
    axes[0, 0].set_ylabel(text(lang, "‖∇W₂‖ (그 스텝의 배치 하나)", "‖∇W₂‖ (at the step: one batch)"))
    fig.suptitle(text(lang, f"학습 중의 블록별 그래디언트 (Xiong et al. 2020 그림 3, 시드 {seed})",
                      f"Per-block gradient during training (Xiong et al. 2020, Fig. 3; seed {seed})"))
    return fig


def anatomy_setting(summary: pd.DataFrame, settings: list[str]) -> str:
    """The collapse setting to dissect: the first (in params order) with a collapse, else the first with a spike, else
    the default (the first). A collapse is the document's event (problem 11), so it is shown wherever one was measured."""
    runs = summary[summary["collapse"].astype(bool)]
    for outcome in ("collapsed", "spiked"):
        found = [s for s in settings if ((runs["setting"] == s) & (runs["outcome"] == outcome)).any()]
        if found:
            return found[0]
    return settings[0]


def pick_anatomy(summary: pd.DataFrame, setting: str) -> tuple[pd.Series | None, pd.Series | None, int | None]:
    """The run to dissect (the first collapse, else the largest spike) of ``setting``'s collapse group, a run of the
    same setting that stayed stable (the one with the lowest loss after learning), and the event's step."""
    runs = summary[summary["collapse"].astype(bool) & (summary["setting"] == setting)]
    collapsed = runs[runs["outcome"] == "collapsed"].sort_values("seed")
    spiked = runs[runs["outcome"] == "spiked"].sort_values("spike_loss", ascending=False)
    event = collapsed.iloc[0] if len(collapsed) else spiked.iloc[0] if len(spiked) else None
    stable = runs[runs["outcome"] == "stable"].sort_values("max_after_learned")
    calm = stable.iloc[0] if len(stable) else None
    if event is None and calm is None and len(runs):  # nothing learned: show the first seed as it is
        calm = runs.sort_values("seed").iloc[0]
    step = None if event is None else int(event["spike_step"] if not math.isnan(event["spike_step"]) else event["collapse_step"])
    return event, calm, step


def collapse_anatomy_figure(diagnostics: pd.DataFrame, losses: pd.DataFrame, summary: pd.DataFrame, setting: str,
                            lang: str = "ko", warmup: int = 400, before: int = ANATOMY_BEFORE,
                            after: int = ANATOMY_AFTER):
    """The loss and the diagnostics of the collapse (or largest spike) of ``setting`` on one step axis, beside a seed
    that did not collapse, zoomed on the event. With no event in any run: both seeds' whole training, saying so."""
    style.setup(lang)
    event, calm, step = pick_anatomy(summary, setting)
    shown = [r for r in (event, calm) if r is not None]
    fig, axes = plt.subplots(len(ANATOMY), 1, figsize=(7.5, 1.55 * len(ANATOMY) + 0.8), sharex=True,
                             layout="constrained")
    lo, hi = (step - before, step + after) if step is not None else (1, int(losses["step"].max()))
    colors = ["#c0392b", "#7f8c8d"]
    sparse: dict[str, dict] = {}  # metric -> {seed: the median spacing of its samples in the window}, runs shown
    for run, color in zip(shown, colors):
        label = f"{text(lang, '시드', 'seed')} {run['seed']} ({_outcome(run['outcome'], lang)})"
        curve = losses[(losses["setting"] == setting) & (losses["run"] == run["run"])]
        curve = curve[(curve["step"] >= lo) & (curve["step"] <= hi)]
        frame = diagnostics[(diagnostics["setting"] == setting) & (diagnostics["run"] == run["run"])]
        frame = frame[(frame["step"] >= lo) & (frame["step"] <= hi)]
        for ax, (metric, fold, ko, en, log) in zip(axes, ANATOMY):
            if metric == "loss":
                x, y = curve["step"], curve["loss"]
            else:
                part = frame[frame["metric"] == metric].groupby("step")["value"]
                series = part.max() if fold == "max" else part.min()
                x, y = series.index, series.values
            every = sampling(x)
            sparse.setdefault(metric, {})[run["seed"]] = every
            # per-step data is a plain line; sparser data shows its samples, so nothing is read between them
            ax.plot(x, y, color=color, lw=1.1, marker="." if every > 1 else None,
                    label=label if metric == "loss" else None)
    for ax, (metric, fold, ko, en, log) in zip(axes, ANATOMY):
        note = _sampling_note(sparse.get(metric, {}), lang)
        ax.set_title(text(lang, ko, en) + note, fontsize=8, loc="left")
        if log:
            log_y(ax)
    for ax in axes:
        if lo <= warmup <= hi:
            ax.axvline(warmup, color="#555555", ls=":", lw=1)
        if step is not None:
            ax.axvline(step, color="#c0392b", ls="--", lw=0.8, alpha=0.6)
    if shown:
        axes[0].legend(fontsize=8, loc="upper left")
    marks = [text(lang, "파선: 사건", "dashed: the event")] if step is not None else []
    marks += [text(lang, "점선: 워밍업 끝", "dotted: end of warm-up")] if lo <= warmup <= hi else []
    axes[-1].set_xlabel(text(lang, "스텝", "step") + (f" ({'; '.join(marks)})" if marks else ""))
    n = int((summary["collapse"].astype(bool) & (summary["setting"] == setting)).sum())
    if event is None:
        title = text(lang, f"포스트-노름 + 워밍업: {n}개 시드 중 붕괴도 스파이크도 없음", f"Post-norm with warm-up: no collapse or spike in {n} seeds")
    else:
        collapsed = event["outcome"] == "collapsed"
        title = text(lang, f"{'붕괴' if collapsed else '스파이크'}의 해부: 시드 {event['seed']}, 스텝 {step} 부근 ({n}개 시드 중)",
                     f"Anatomy of a {'collapse' if collapsed else 'spike'}: seed {event['seed']} "
                     f"near step {step} (of {n} seeds)")
    fig.suptitle(f"{title}\n{setting}", fontsize=11)
    return fig


def _sampling_note(spacing: dict, lang: str) -> str:
    """'(sampled every 10 steps)' when every run shown is sampled; which seed is, when only some are; '' when none."""
    sparse = {seed: every for seed, every in spacing.items() if every > 1}
    if not sparse:
        return ""
    every = max(sparse.values())
    if len(sparse) == len(spacing):
        return text(lang, f" (표본: {every}스텝마다)", f" (sampled every {every} steps)")
    seeds = ", ".join(str(seed) for seed in sparse)
    return text(lang, f" (시드 {seeds}: {every}스텝마다 표본, 나머지는 매 스텝)",
                f" (seed {seeds}: sampled every {every} steps; the other at every step)")


def sampling(steps) -> int:
    """The median spacing of recorded steps (1: every step); 1 for fewer than two steps."""
    steps = np.unique(np.asarray(steps, dtype=int))
    return int(np.median(np.diff(steps))) if len(steps) > 1 else 1


def _outcome(outcome: str, lang: str) -> str:
    ko = {"collapsed": "붕괴", "spiked": "스파이크 뒤 회복", "stable": "안정", "never learned": "학습 못 함"}
    return text(lang, ko.get(outcome, outcome), outcome)


# ---- all figures of the study, with sidecars -------------------------------------------------------------------------


def save_figures(params: dict, data: str | Path = "data", figs: str | Path = "figs", lang: str | None = None,
                 names=None) -> list:
    """The study's figures (``names``: those of ``plan.FIGURES`` named, default all) drawn from its tables under
    ``data`` into ``figs``, each with its sidecar; a table is read only by the figures drawn from it."""
    lang = lang or params["figures"]["lang"]
    data = Path(data)
    where = lambda rel: data / Path(rel).relative_to("data")  # noqa: E731
    diagnostics = lambda: pd.read_parquet(where(TABLES["diagnostics"]))  # noqa: E731
    losses, summary = (lambda: read_table(where(TABLES["losses"]))), (lambda: read_table(where(TABLES["summary"])))
    dyn = params["dynamics"]
    made = {
        "dynamics_gradnorm": lambda: gradnorm_through_training_figure(diagnostics(), summary(), lang=lang,
                                                                      steps=Sweep.from_params(params).steps,
                                                                      seed=dyn["compare_seeds"][0]),
        "dynamics_collapse": lambda: collapse_anatomy_figure(diagnostics(), losses(), summary(),
                                                             anatomy_setting(summary(), dyn["collapse"]["settings"]),
                                                             lang=lang, warmup=dyn["collapse"]["warmup"]),
    }
    out = []
    for name, build in made.items():
        if names is not None and name not in names:
            continue
        style.setup(lang)
        out.append(style.save(build(), Path(figs) / f"{name}.png", dpi=params["figures"]["dpi"],
                              sources=[str(where(s)) for s in FIGURES[name]],
                              params={"figures": params["figures"], "lang": lang, "dynamics": dyn}))
    return out
