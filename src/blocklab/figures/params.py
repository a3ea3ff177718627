"""Document 004, "파라미터 수": where a block's parameters go (attention, FFN, norms), from blocks.csv."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from .style import setup, text

PARTS = ("attention", "ffn", "norms")
VARIANTS = {"modern": ("현대 블록: RMSNorm, 바이어스 없음", "modern block: RMSNorm, no biases"),
            "classic": ("고전 블록: LayerNorm, 바이어스", "classic block: LayerNorm, biases")}
FFN_NAMES = {"swiglu": "SwiGLU", "relu": "ReLU", "gelu": "GELU"}


def block_breakdown_figure(blocks_df: pd.DataFrame, lang: str = "ko", variant: str = "modern",
                           ffn_kind: str = "swiglu"):
    """Stacked share of attention / FFN / norm parameters per (d_model, r), one bar each, total written at the end."""
    setup(lang)
    rows = blocks_df.query("case == 'grid' and variant == @variant and ffn_kind == @ffn_kind")
    rows = rows.sort_values(["d_model", "ffn_ratio"])
    labels = [f"d={r.d_model}, r={r.ffn_ratio:g}" for r in rows.itertuples()]
    shares = rows[list(PARTS)].div(rows["built_numel"], axis=0)
    names = {"attention": text(lang, "어텐션 $4d^2$", "attention $4d^2$"),
             "ffn": f"FFN ({FFN_NAMES.get(ffn_kind, ffn_kind)})",
             "norms": text(lang, "정규화", "norms")}
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.5))
    left = pd.Series(0.0, index=shares.index)
    for part in PARTS:
        ax.barh(labels, shares[part], left=left, label=names[part])
        left += shares[part]
    for y, total in enumerate(rows["built_numel"]):
        ax.text(1.01, y, f"{total / 1e6:.2f}M", va="center", fontsize=8)
    ax.set_xlim(0, 1.15)
    ax.set_xlabel(text(lang, "블록 파라미터 비율", "share of the block's parameters"))
    ko, en = VARIANTS.get(variant, (variant, variant))
    ax.set_title(text(lang, f"블록 하나의 파라미터 구성 ({ko})", f"Parameters of one block ({en})"))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(rows)), ncol=3, fontsize=8, frameon=False)
    ax.invert_yaxis()
    return fig
