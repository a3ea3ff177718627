"""Figures of document 004 (full transformer), exercises 2 and 3. Each function takes tidy frames and ``lang``."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from . import style
from .doc000 import NORM_COLORS, norm_label
from .style import text

VARIANT_COLORS = {"classic": "#7f7f7f", "rmsnorm": "#1f77b4", "swiglu": "#2ca02c", "rope": "#ff7f0e",
                  "modern": "#9467bd"}
WIRING_COLORS = {(True, True): "#1f6f8b", (True, False): "#5aae61", (False, True): "#e08214", (False, False): "#c0392b"}


def variant_label(variant: str, lang: str) -> str:
    ko = {"classic": "고전 (LN·ReLU·사인파)", "rmsnorm": "RMSNorm만 교체", "swiglu": "SwiGLU만 교체",
          "rope": "RoPE만 교체", "modern": "현대 (RMSNorm·SwiGLU·RoPE)"}
    en = {"classic": "classic (LN, ReLU, sinusoidal)", "rmsnorm": "RMSNorm only", "swiglu": "SwiGLU only",
          "rope": "RoPE only", "modern": "modern (RMSNorm, SwiGLU, RoPE)"}
    return text(lang, ko.get(variant, variant), en.get(variant, variant))


def wiring_label(residual: bool, normalized: bool, lang: str) -> str:
    ko = {(True, True): "잔차 + 정규화 (앞 정규화 블록)", (False, True): "잔차 없음, 정규화 있음",
          (True, False): "잔차만, 정규화 없음", (False, False): "잔차·정규화 모두 없음"}
    en = {(True, True): "residual + norm (pre-norm block)", (False, True): "no residual, norm kept",
          (True, False): "residual, no norm", (False, False): "neither residual nor norm"}
    return text(lang, ko[(residual, normalized)], en[(residual, normalized)])


def _log_y(ax) -> None:
    """Log axis with plain tick labels (1e-06, 0.1, 10): the Korean font has no mathtext minus sign.

    Call after plotting: a range of under two decades also labels the 2s and 5s, else one decade has one label.
    """
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    if high / low < 100:
        ax.yaxis.set_minor_locator(LogLocator(subs=(2, 5)))
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


def _seeds_and_mean(ax, frame, x, y, color, label, **mean_style):
    """Every seed as a thin line, their mean as a thick one."""
    for _, run in frame.groupby("seed"):
        run = run.sort_values(x)
        ax.plot(run[x], run[y], color=color, lw=0.7, alpha=0.35)
    mean = frame.groupby(x)[y].mean()
    ax.plot(mean.index, mean.values, color=color, lw=2.2, label=label, **mean_style)
    return mean


# --- exercise 2: activation norms ------------------------------------------------------------------------------------


def activation_norms_figure(norms_df: pd.DataFrame, lang: str = "ko"):
    """Per-token norm of the hidden state after every block at init: one panel per depth, post vs pre, shared y.

    Pre-norm is the raw residual stream (no final norm). Dashed: the part every token shares (norm of the token
    mean); dotted black: sqrt(d), where LayerNorm with unit gain puts each token.
    """
    style.setup(lang)
    depths = sorted(norms_df["depth"].unique())
    fig, axes = plt.subplots(1, len(depths), figsize=(4.4 * len(depths), 3.8), sharey=True, squeeze=False)
    sqrt_d = math.sqrt(norms_df["d_model"].iloc[0])
    for ax, depth in zip(axes[0], depths):
        panel = norms_df[norms_df["depth"] == depth]
        for norm in [n for n in NORM_COLORS if n in set(panel["norm"])]:
            part, color = panel[panel["norm"] == norm], NORM_COLORS[norm]
            mean = _seeds_and_mean(ax, part, "block", "mean_token_norm", color, norm_label(norm, lang),
                                   marker="o", ms=2.5)
            shared = part.groupby("block")["mean_vector_norm"].mean()
            ax.plot(shared.index, shared.values, color=color, lw=1.2, ls="--",
                    label=text(lang, f"{norm_label(norm, lang)}: 토큰 공통 성분", f"{norm_label(norm, lang)}: shared part"))
            ax.annotate(f"{mean.iloc[-1]:.1f}", (mean.index[-1], mean.iloc[-1]), xytext=(3, 4),
                        textcoords="offset points", color=color, fontsize=9, fontweight="bold")
        ax.axhline(sqrt_d, color="black", ls=":", lw=1.1, label=rf"$\sqrt{{d}}$ = {sqrt_d:.1f}")
        ax.set_title(text(lang, f"블록 {depth}개", f"{depth} blocks"))
        ax.set_xlabel(text(lang, "블록 번호 (0 = 입력)", "block (0 = input)"))
    top = max(norms_df["mean_token_norm"].max(), sqrt_d)
    axes[0, 0].set_ylim(0, 1.08 * top)  # shared y: set once, after every panel is drawn
    axes[0, 0].set_ylabel(text(lang, "토큰 벡터 길이의 평균", "mean per-token L2 norm"))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.08), frameon=False,
               fontsize=9)
    fig.suptitle(text(lang, "초기화 직후 블록을 지날 때마다 은닉 상태의 크기 (앞 정규화는 최종 정규화 전 줄기)",
                      "Hidden-state norm after every block at init (pre-norm: raw stream, before any final norm)"),
                 y=1.02)
    fig.tight_layout()
    return fig


def residual_ablation_figure(ablation_df: pd.DataFrame, lang: str = "ko", threshold: float = 1e-3):
    """Gradient norm relative to the top block vs layers below the top, per wiring: one panel for the gradient with
    respect to each block's input, one for its weights. Log y; a value that underflowed to 0 is not drawn."""
    style.setup(lang)
    targets = [t for t in ("input", "weights") if t in set(ablation_df["target"])]
    fig, axes = plt.subplots(1, len(targets), figsize=(5.6 * len(targets), 4.0), sharey=True, squeeze=False)
    drawable = ablation_df[ablation_df["relative"] > 0]
    titles = {"input": text(lang, "블록 입력에 대한 그래디언트", "gradient w.r.t. each block's input"),
              "weights": text(lang, "블록 무게에 대한 그래디언트", "gradient w.r.t. each block's weights")}
    for ax, target in zip(axes[0], targets):
        panel = drawable[drawable["target"] == target]
        for (residual, normalized), color in WIRING_COLORS.items():
            part = panel[(panel["residual"] == residual) & (panel["normalized"] == normalized)]
            if len(part):
                label = wiring_label(residual, normalized, lang)
                _seeds_and_mean(ax, part, "layers_from_top", "relative", color, label, marker="o", ms=2.5)
        ax.axhline(threshold, color="black", ls=":", lw=1.1,
                   label=text(lang, f"맨 위의 {threshold:g}배", f"{threshold:g} x top"))
        ax.axvline(6, color="grey", ls="--", lw=1.0, label=text(lang, "문서: 약 6계층", "document: about 6 layers"))
        _log_y(ax)
        ax.set_title(titles[target], fontsize=11)
        ax.set_xlabel(text(lang, "맨 위 블록에서 아래로 몇 계층", "layers below the top block"))
    axes[0, 0].set_ylabel(text(lang, "그래디언트 크기 / 맨 위 블록의 값", "grad norm / top block's"))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.14), frameon=False, fontsize=9)
    fig.suptitle(text(lang, "초기화 직후 잔차 연결이 없을 때 그래디언트가 사라지는가",
                      "Does the gradient vanish without residual connections? (at initialization)"), y=1.02)
    fig.tight_layout()
    return fig


# --- exercise 3: reverse copy ----------------------------------------------------------------------------------------


def _per_variant_points(ax, summary_df, column, order, lang):
    """Each seed a dot, spread evenly across +-0.12 in seed order (seaborn's stripplot jitters with NumPy's global
    random state, so the same data drew a different figure each time), the mean a bar mark with its min-max range."""
    for i, variant in enumerate(order):
        values = summary_df[summary_df["variant"] == variant].sort_values("seed")[column].to_numpy(float)
        offsets = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else np.zeros(len(values))
        ax.scatter(i + offsets, values, s=36, color=VARIANT_COLORS[variant], alpha=0.7, edgecolors="none", zorder=3)
    stats = summary_df.groupby("variant")[column].agg(["mean", "min", "max"]).reindex(order)
    x = np.arange(len(order))
    ax.errorbar(x, stats["mean"], yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]], fmt="_",
                color="black", ms=22, mew=2.2, capsize=4, lw=1.2, zorder=5)
    ax.set_xticks(x, [variant_label(v, lang).split(" (")[0] for v in order], rotation=30, ha="right")
    ax.set_xlabel("")


def reverse_copy_figure(losses_df: pd.DataFrame, summary_df: pd.DataFrame, lang: str = "ko",
                        vocab_size: int | None = None):
    """Left: training loss per variant (seeds thin, mean thick, log y). Middle: final loss (mean of the last 10 steps)
    per seed with the mean and min-max range. Right: greedy sequence accuracy on the held-out batch, likewise.

    Runs are keyed by variant: pass one SwiGLU width choice at a time (default or ``match_params`` runs).
    """
    style.setup(lang)
    order = [v for v in VARIANT_COLORS if v in set(summary_df["variant"])]
    fig, (curves, final, accuracy) = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    for variant in order:
        _seeds_and_mean(curves, losses_df[losses_df["variant"] == variant], "step", "loss", VARIANT_COLORS[variant],
                        variant_label(variant, lang))
    if vocab_size is not None:
        curves.axhline(math.log(vocab_size), color="black", ls=":", lw=1.1,
                       label=text(lang, f"ln {vocab_size} (못 배움)", f"ln {vocab_size} (chance)"))
    _log_y(curves)
    curves.set_xlabel(text(lang, "스텝", "step"))
    curves.set_ylabel(text(lang, "학습 손실 (교사 강요, 로그 축)", "training loss (teacher forcing, log)"))
    curves.legend(fontsize=8, loc="lower left")
    curves.set_title(text(lang, "학습 곡선", "training curves"), fontsize=11)
    _per_variant_points(final, summary_df, "final_loss", order, lang)
    final.set_ylabel(text(lang, "마지막 10스텝 평균 손실", "mean loss of the last 10 steps"))
    final.set_ylim(bottom=0)
    final.set_title(text(lang, "최종 손실", "final loss"), fontsize=11)
    _per_variant_points(accuracy, summary_df, "seq_accuracy", order, lang)
    accuracy.set_ylabel(text(lang, "문장 전체가 맞은 비율 (탐욕 복호)", "sequence accuracy (greedy decoding)"))
    accuracy.set_ylim(-0.03, 1.03)
    accuracy.set_title(text(lang, "뒤집기 정확도", "reverse-copy accuracy"), fontsize=11)
    steps = int(losses_df["step"].max()) if len(losses_df) else 0
    fig.suptitle(text(lang, f"4층 인코더-디코더가 입력을 뒤집어 베끼기: {steps}스텝, 부품 교체별",
                      f"4-layer encoder-decoder, reverse copy: {steps} steps, per swap"), y=1.02)
    fig.tight_layout()
    return fig
