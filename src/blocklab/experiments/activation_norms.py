"""Document 004, exercise 2: the hidden-state norm after every block of a stack at initialization, post- vs pre-norm.

A random standard-normal input passes through L encoder blocks (classic Vaswani block: LayerNorm, ReLU FFN,
PyTorch's default init); we record the per-token L2 norm after every block. For pre-norm the *raw* residual stream
is reported, before any final norm: that stream is what can grow, and a final norm would hide it by construction.
Post-norm ends every sub-layer with LayerNorm(gain 1, bias 0 at init), so its per-token norm is sqrt(d) by
construction: the measurement checks that, it does not assume it.

Claim 4 of the document ("without residuals, gradients vanish after about 6 layers") is measured with the same
pre-norm blocks, as they are (h <- h + F(LN h)), with the skip removed (h <- F(LN h)), and, to tell the skip's part
from the norm's, with the norm removed as well; every wiring shares the same weights.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..model_config import ModelConfig
from ..io import write_json, write_table
from ..model.blocks import EncoderBlock, PreNormResidual
from ..model.init import initialize
from ..params_file import load_params
from ..provenance import stamp
from ..runtime import set_threads

# Vaswani et al. 2017 used ReLU; the exercise swaps only the norm position of that classic block.
FFN_KIND = "relu"
# "Explodes" = the norm grows by an order of magnitude over the stack. A drift of 2x is growth, not an explosion;
# the growth factor itself is reported beside the verdict so a reader can apply another threshold.
EXPLODE_FACTOR = 10.0
DOCUMENT_EXPECTS = {"post": "explode", "pre": "bounded"}
# The document speaks of "about 6 layers"; 24 blocks leave room to see that and are cheap at any width.
ABLATION_MAX_DEPTH = 24
VANISH_THRESHOLDS = (1e-1, 1e-2, 1e-3)


def stack_config(section: dict, norm_position: str) -> ModelConfig:
    """The block of params["activation_norms"]; the input is already a hidden state, so no position signal."""
    return ModelConfig(
        d_model=section["d_model"], n_heads=section["n_heads"], n_layers=1, ffn_kind=FFN_KIND, norm_kind="layernorm",
        norm_position=norm_position, position="none", max_len=section["seq_len"], init="default",
    )


def build_stack(cfg: ModelConfig, depth: int, seed: int) -> nn.ModuleList:
    """``depth`` encoder blocks at initialization; the same seed always gives the same weights."""
    torch.manual_seed(seed)
    return initialize(nn.ModuleList(EncoderBlock(cfg) for _ in range(depth)), cfg.init)


def random_input(section: dict, seed: int) -> torch.Tensor:
    """(batch, seq_len, d_model) standard normal from its own generator, so it does not depend on the model's size."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(section["batch_size"], section["seq_len"], section["d_model"], generator=generator)


def run_stack(stack: nn.ModuleList, x: torch.Tensor) -> list[torch.Tensor]:
    """The stream before block 1 and after every block (``len(stack) + 1`` tensors), no final norm."""
    hidden = [x]
    for block in stack:
        hidden.append(block(hidden[-1]))
    return hidden


def stream_stats(h: torch.Tensor) -> dict:
    """Statistics of one hidden state (batch, time, d).

    mean_token_norm: per-token L2 norm, mean over tokens; rms: root mean square over all entries (= token norm / sqrt d
    for equal-norm tokens); max_feature_rms: the largest per-feature RMS over tokens (an outlier feature shows here);
    mean_vector_norm: norm of the per-sequence mean over tokens, i.e. the part of the stream every token shares.
    """
    token_norms = torch.linalg.vector_norm(h, dim=-1)
    return {
        "mean_token_norm": token_norms.mean().item(),
        "max_token_norm": token_norms.max().item(),
        "rms": h.pow(2).mean().sqrt().item(),
        "max_feature_rms": h.pow(2).flatten(0, 1).mean(0).sqrt().max().item(),
        "mean_vector_norm": torch.linalg.vector_norm(h.mean(-2), dim=-1).mean().item(),
    }


@torch.no_grad()
def measure_norms(stack: nn.ModuleList, x: torch.Tensor) -> pd.DataFrame:
    """One row per block index (0 = the input, i = after block i)."""
    rows = [{"block": i, **stream_stats(h)} for i, h in enumerate(run_stack(stack, x))]
    return pd.DataFrame(rows)


def norms_frame(params: dict) -> pd.DataFrame:
    """Tidy frame (depth, norm, seed, block, d_model, statistics...) over every depth, norm position and seed."""
    section = params["activation_norms"]
    parts = []
    for depth in section["depths"]:
        for norm in ("post", "pre"):
            cfg = stack_config(section, norm)
            for seed in section["seeds"]:
                one = measure_norms(build_stack(cfg, depth, seed), random_input(section, seed))
                parts.append(one.assign(depth=depth, norm=norm, seed=seed, d_model=cfg.d_model))
    frame = pd.concat(parts, ignore_index=True)
    first = ["depth", "norm", "seed", "block", "d_model"]
    return frame[first + [c for c in frame.columns if c not in first]]


def _loglog_slope(blocks: pd.Series, norms: pd.Series) -> float:
    """Exponent a of norm ~ block^a fitted over blocks >= 1 (a = 0.5 is the sqrt(L) law, 0 a flat stream)."""
    keep = blocks >= 1
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(blocks[keep]), np.log(norms[keep]), 1)[0])


def verdict(norms: pd.DataFrame) -> pd.DataFrame:
    """Per (depth, norm): input and last-block norm (mean over seeds), growth, and whether the document's expectation
    ("post-norm explodes, pre-norm stays bounded") holds by the EXPLODE_FACTOR criterion."""
    mean = norms.groupby(["depth", "norm", "block"], as_index=False)[["mean_token_norm", "mean_vector_norm"]].mean()
    rows = []
    for (depth, norm), curve in mean.groupby(["depth", "norm"]):
        curve = curve.sort_values("block")
        last_by_seed = norms[(norms["depth"] == depth) & (norms["norm"] == norm) & (norms["block"] == depth)]
        start, last = curve["mean_token_norm"].iloc[0], curve["mean_token_norm"].iloc[-1]
        explodes = last / start >= EXPLODE_FACTOR
        expects = DOCUMENT_EXPECTS[norm]
        rows.append({
            "depth": depth, "norm": norm,
            "input_norm": start, "last_norm": last, "last_norm_std": last_by_seed["mean_token_norm"].std(ddof=1),
            "growth": last / start, "peak_growth": curve["mean_token_norm"].max() / start,
            "loglog_slope": _loglog_slope(curve["block"], curve["mean_token_norm"]),
            "last_mean_vector_norm": curve["mean_vector_norm"].iloc[-1],
            "sqrt_d": math.sqrt(last_by_seed["d_model"].iloc[0]),
            "document_expects": expects, "explodes": bool(explodes),
            "matches_document": bool(explodes) == (expects == "explode"),
        })
    return pd.DataFrame(rows)


# --- claim 4: residual ablation --------------------------------------------------------------------------------------


class WithoutResidual(nn.Module):
    """A pre-norm sub-layer with the skip removed: h <- F(LN(h)). Shares the wrapped module's norm and weights."""

    def __init__(self, wrapped: PreNormResidual):
        super().__init__()
        self.norm, self.sublayer = wrapped.norm, wrapped.sublayer

    def forward(self, h, *args, block_input=None, **kwargs):  # like every wrapper (model.blocks); no skip: unused
        return self.sublayer(self.norm(h))


def rewire(stack: nn.ModuleList, residual: bool, normalized: bool) -> nn.ModuleList:
    """The same pre-norm blocks (in place) without their skip connections and/or without their norms.

    Dropping the norm too separates the two things that could keep a gradient alive at init: the skip path and the
    norm's rescaling of a shrinking signal.
    """
    for block in stack:
        for name in ("attn", "ffn"):
            wrapper = getattr(block, name)
            if not normalized:
                wrapper.norm = nn.Identity()
            if not residual:
                setattr(block, name, WithoutResidual(wrapper))
    return stack


def readout(d_model: int, seed: int) -> torch.Tensor:
    """A fixed random direction; loss = sum over tokens of <h_top, r>. Its own stream, so not the input's numbers."""
    return torch.randn(d_model, generator=torch.Generator().manual_seed(10_000 + seed))


def measure_gradients(stack: nn.ModuleList, x: torch.Tensor, direction: torch.Tensor) -> pd.DataFrame:
    """Per block l (1 = nearest the input): the norms of d loss / d (input of block l) and d loss / d (its weights)."""
    stack.zero_grad(set_to_none=True)
    hidden = run_stack(stack, x.clone().requires_grad_(True))
    for h in hidden:
        h.retain_grad()
    loss = (hidden[-1] * direction).sum()
    loss.backward()
    rows = []
    for layer, block in enumerate(stack, start=1):
        weight_sq = sum(p.grad.pow(2).sum() for p in block.parameters() if p.grad is not None)
        rows.append({"layer": layer, "target": "input", "grad_norm": hidden[layer - 1].grad.norm().item()})
        rows.append({"layer": layer, "target": "weights", "grad_norm": float(torch.as_tensor(weight_sq).sqrt())})
    return pd.DataFrame(rows)


def ablation_depth(section: dict) -> int:
    return min(max(section["depths"]), ABLATION_MAX_DEPTH)


def ablation_frame(params: dict) -> pd.DataFrame:
    """Tidy (residual, normalized, seed, layer, layers_from_top, target, grad_norm, relative) over the 2 x 2 wirings.

    relative = grad_norm / grad_norm of the top block (same wiring, seed and target); the same seed gives the same
    weights in every wiring, so only the wiring differs.
    """
    section = params["activation_norms"]
    depth, cfg = ablation_depth(section), stack_config(section, "pre")
    parts = []
    for residual in (True, False):
        for normalized in (True, False):
            for seed in section["seeds"]:
                stack = rewire(build_stack(cfg, depth, seed), residual, normalized)
                one = measure_gradients(stack, random_input(section, seed), readout(cfg.d_model, seed))
                parts.append(one.assign(residual=residual, normalized=normalized, seed=seed))
    frame = pd.concat(parts, ignore_index=True)
    keys = ["residual", "normalized", "seed", "target"]
    top = frame[frame["layer"] == depth].set_index(keys)["grad_norm"]
    frame["relative"] = frame["grad_norm"] / top.loc[pd.MultiIndex.from_frame(frame[keys])].to_numpy()
    frame["layers_from_top"] = depth - frame["layer"]
    return frame[keys[:3] + ["layer", "layers_from_top", "target", "grad_norm", "relative"]]


def vanishing_summary(frame: pd.DataFrame, thresholds=VANISH_THRESHOLDS) -> pd.DataFrame:
    """Per (residual, normalized, target, threshold): how many layers below the top the seed-mean relative gradient
    first falls below the threshold (NaN: never within the stack), and the relative gradient at the bottom block."""
    keys = ["residual", "normalized", "target"]
    mean = frame.groupby(keys + ["layers_from_top"], as_index=False)["relative"].mean()
    rows = []
    for (residual, normalized, target), curve in mean.groupby(keys):
        curve = curve.sort_values("layers_from_top")
        for threshold in thresholds:
            below = curve.loc[curve["relative"] < threshold, "layers_from_top"]
            rows.append({"residual": residual, "normalized": normalized, "target": target, "threshold": threshold,
                         "layers_from_top": float(below.iloc[0]) if len(below) else float("nan"),
                         "relative_at_bottom": curve["relative"].iloc[-1],
                         "depth": int(curve["layers_from_top"].max()) + 1})
    return pd.DataFrame(rows)


# --- command line ----------------------------------------------------------------------------------------------------


def register(subparsers) -> None:
    p = subparsers.add_parser("activation-norms",
                              help="hidden-state norm after every block at init, post vs pre (doc 004 ex. 2)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, type=Path, help="CSV path; metadata JSON (with the verdict) goes beside it")
    p.add_argument("--out-verdict", type=Path, default=None, help="optional CSV of the per (depth, norm) verdict")
    p.set_defaults(func=_norms_main)

    p = subparsers.add_parser("residual-ablation",
                              help="gradient per layer with and without residuals at init (doc 004 claim 4)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, type=Path, help="CSV path; metadata JSON (with the summary) goes beside it")
    p.set_defaults(func=_ablation_main)


def _records(frame: pd.DataFrame) -> list[dict]:
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _norms_main(args) -> None:
    params = load_params(args.params)
    set_threads(params["threads_per_run"])
    frame = norms_frame(params)
    judged = verdict(frame)
    write_table(frame, args.out)
    if args.out_verdict is not None:
        write_table(judged, args.out_verdict)
    write_json(stamp(
        artifact=args.out.name, params={"activation_norms": params["activation_norms"]}, device="cpu",
        block=stack_config(params["activation_norms"], "pre").to_dict() | {"norm_position": "post and pre"},
        note=("pre-norm rows are the raw residual stream (no final norm); block 0 is the input; "
              f"explodes = last/input >= {EXPLODE_FACTOR}"),
        verdict=_records(judged),
    ), args.out.with_suffix(".json"))


def _ablation_main(args) -> None:
    params = load_params(args.params)
    set_threads(params["threads_per_run"])
    frame = ablation_frame(params)
    write_table(frame, args.out)
    section = params["activation_norms"]
    write_json(stamp(
        artifact=args.out.name, params={"activation_norms": section}, device="cpu", depth=ablation_depth(section),
        block=stack_config(section, "pre").to_dict(),
        note=("residual/normalized: pre-norm blocks h + F(LN h); without residual h <- F(LN h); "
              "without norm LN -> identity; "
              "same weights in every wiring; loss = sum over tokens of <h_top, r> with a fixed random r; "
              "relative = grad / grad at the top block"),
        vanishing=_records(vanishing_summary(frame)),
    ), args.out.with_suffix(".json"))
