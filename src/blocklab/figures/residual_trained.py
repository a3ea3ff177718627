"""Problem 10 (c): residual-stream length per layer in a trained LM and in our copy-task models, against sqrt(L + 1)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns
from matplotlib.ticker import LogLocator

from .style import log_y, setup, text


def residual_growth_figure(lm_df, copy_df, lang: str = "ko"):
    """Left: real LM(s), norm of the mean prompt-token vector and median token norm per prompt. Right: our 24-block copy
    models, mean token norm at init and after training. Dotted: layer 0's value times sqrt(l + 1) (random directions)."""
    setup(lang)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.4), constrained_layout=True)
    _lm_panel(left, lm_df, lang)
    _copy_panel(right, copy_df, lang)
    return fig


def _lm_panel(ax, lm_df, lang):
    several = lm_df["model"].nunique() > 1
    palette = sns.color_palette("deep")
    for i, ((model, prompt), g) in enumerate(lm_df.groupby(["model", "prompt"], sort=False)):
        color, name = palette[i % len(palette)], f"{model} · {prompt}" if several else prompt
        g = g.sort_values("layer")
        ax.plot(g["layer"], g["norm_of_mean"], color=color, lw=2,
                label=text(lang, f"{name}: 토큰 평균 벡터의 크기", f"{name}: norm of mean token vector"))
        ax.plot(g["layer"], g["token_norm_p50"], color=color, lw=1.2, ls="--",
                label=text(lang, f"{name}: 토큰 크기의 중앙값", f"{name}: median token norm"))
        ax.plot(g["layer"], g["sqrt_ref_norm_of_mean"], color=color, lw=1.2, ls=":",
                label=text(lang, f"{name}: 0층 × √(L+1)", f"{name}: layer 0 × √(L+1)"))
    models = ", ".join(lm_df["model"].unique())
    log_y(ax)
    ax.set(xlabel=text(lang, "층 (0 = 첫 블록의 입력)", "layer (0 = input of block 1)"),
           ylabel=text(lang, "줄기의 크기", "stream norm"), title=text(lang, f"학습을 마친 LM ({models})", f"trained LM ({models})"))
    ax.legend(fontsize="small", ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: the data fill the axes


def _copy_panel(ax, copy_df, lang):
    states = {"init": text(lang, "초기화", "init"), "trained": text(lang, "학습 후", "trained")}
    norms = {"post": text(lang, "뒤 정규화", "post-norm"), "pre": text(lang, "앞 정규화", "pre-norm")}
    data = copy_df.assign(state=copy_df["state"].map(states), norm=copy_df["norm"].map(norms))
    sns.lineplot(data=data, x="layer", y="mean_token_norm", ax=ax, errorbar=("pi", 100),  # band: min-max over seeds
                 hue="norm", hue_order=[v for k, v in norms.items() if k in set(copy_df["norm"])],
                 style="state", style_order=[v for k, v in states.items() if k in set(copy_df["state"])],
                 dashes={states["init"]: (4, 2), states["trained"]: ""})  # trained solid, as in the LM panel
    ref = copy_df[copy_df["state"] == "init"].groupby("layer")["sqrt_ref_token_norm"].mean()
    ax.plot(ref.index, ref.to_numpy(), color="gray", ls=":", lw=1.5, label=text(lang, "0층 × √(L+1)", "layer 0 × √(L+1)"))
    seeds = copy_df["seed"].nunique()
    log_y(ax)
    low, high = ax.get_ylim()  # the curves span a decade or less: label 1-2-5 (or every integer) steps, not decades
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if high / low > 4 else tuple(range(1, 10))))
    ax.set(xlabel=text(lang, "층 (0 = 첫 블록의 입력)", "layer (0 = input of block 1)"),
           ylabel=text(lang, "토큰 크기의 평균", "mean token norm"),
           title=text(lang, f"베끼기 태스크 모델 (블록 {copy_df['layer'].max()}벌, 시드 {seeds}개)",
                      f"copy-task model ({copy_df['layer'].max()} blocks, {seeds} seed(s))"))
    handles, labels = ax.get_legend_handles_labels()
    headers = {"norm": text(lang, "정규화 자리", "norm position"), "state": text(lang, "상태", "state")}
    # below the axes, as in the LM panel: inside, the legend covered the curves and the y label
    ax.legend(handles, [headers.get(label, label) for label in labels], fontsize="small", ncol=3, loc="upper center",
              bbox_to_anchor=(0.5, -0.14))
