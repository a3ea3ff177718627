"""Document 004, exercise 3: a 4-layer encoder + 4-layer decoder learns to output its source reversed.

The classic block (LayerNorm, ReLU FFN, sinusoidal positions) is swapped one piece at a time for its 2026 replacement
(RMSNorm, SwiGLU, RoPE), then all three at once. Pre-norm everywhere. One cached run per (variant, seed), written
like a document-000 sweep run: loss.csv, model.safetensors, meta.json last. After training the model decodes a fixed
held-out batch greedily (its own predictions fed back, not teacher forcing) and meta.json records the accuracies.

Two properties of the code base matter for reading the results:
- SwiGLU keeps the same hidden width r·d by default, so its FFN holds 1.5x the parameters of the ReLU FFN (the
  document's own count, 3·d·(r·d), uses the same r). ``match_params=True`` gives the Llama paper's 2/3·r·d instead.
- RoPE rotates queries and keys of self-attention only; cross-attention gets no position signal (as in T5, whose
  relative positions are also self-attention only). With RoPE the decoder must find "source position L-1-t" by
  content the encoder put there, not by an additive position vector shared by both stacks.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import torch

from .. import provenance
from ..model_config import ConfigError, ModelConfig
from ..integrity import read_run
from ..model.counting import count_parameters
from ..model.models import EncoderDecoder
from ..params_file import load_params
from ..runtime import resolve_device, set_threads
from ..training.sweep import classify
from ..training.commands import add_aggregate, add_train
from ..training.tasks import copy_loss, reverse_batch
from ..training.train import train, write_run

log = logging.getLogger("blocklab.reverse_copy")

VARIANTS = {  # variant -> (norm_kind, ffn_kind, position)
    "classic": ("layernorm", "relu", "sinusoidal"),
    "rmsnorm": ("rmsnorm", "relu", "sinusoidal"),
    "swiglu": ("layernorm", "swiglu", "sinusoidal"),
    "rope": ("layernorm", "relu", "rope"),
    "modern": ("rmsnorm", "swiglu", "rope"),
}
START_TOKEN = 0  # reverse_batch draws source tokens from 1..V-1 and starts every decoder input with 0
EVAL_SEQUENCES = 512
# One held-out batch for every variant and seed; its seed is far from the training seeds (0, 1, 2, ...), whose
# generators draw the training batches.
EVAL_SEED = 1_000_003
FINAL_WINDOW = 10  # final_loss = mean of the last 10 steps: one batch of 32 sequences is a noisy estimate
CHECKPOINT_EVERY = 100


def run_name(variant: str, seed: int, match_params: bool = False) -> str:
    return f"{variant}{'-matched' if match_params else ''}-s{seed}"


def variant_config(params: dict, variant: str, match_params: bool = False) -> ModelConfig:
    """The encoder-decoder of params["reverse_copy"] with the variant's norm, FFN and position signal."""
    if variant not in VARIANTS:
        raise ConfigError(f"variant={variant!r} is not allowed; choose one of {list(VARIANTS)}")
    section = params["reverse_copy"]
    norm_kind, ffn_kind, position = VARIANTS[variant]
    d, ratio = section["d_model"], section["ffn_ratio"]
    hidden = round(2 / 3 * ratio * d) if match_params and ffn_kind == "swiglu" else None
    return ModelConfig(
        d_model=d, n_heads=section["n_heads"], n_layers=section["n_layers"], n_encoder_layers=section["n_layers"],
        ffn_kind=ffn_kind, ffn_ratio=ratio, ffn_hidden=hidden, norm_kind=norm_kind, norm_position="pre",
        position=position, vocab_size=section["vocab_size"], max_len=section["seq_len"], init="default",
    )


def build_model(cfg: ModelConfig, seed: int) -> EncoderDecoder:
    """The run's model at initialization: the same seed always gives the same weights."""
    torch.manual_seed(seed)
    return EncoderDecoder(cfg)


def reverse_loss(model, batch):
    """Teacher forcing: cross-entropy of every target position given the true prefix."""
    source, decoder_input, target = batch
    return copy_loss(model(source, decoder_input), target)


@torch.no_grad()
def greedy_decode(model, source: torch.Tensor, length: int, start_token: int = START_TOKEN) -> torch.Tensor:
    """Autoregressive argmax decoding: each step feeds back the model's own previous predictions. (batch, length)."""
    memory = model.encode(source)
    out = torch.full((source.shape[0], 1), start_token, dtype=source.dtype, device=source.device)
    for _ in range(length):
        next_token = model.decode(out, memory)[:, -1].argmax(-1)
        out = torch.cat([out, next_token[:, None]], dim=1)
    return out[:, 1:]


def eval_batch(section: dict, device="cpu"):
    generator = torch.Generator().manual_seed(EVAL_SEED)
    return reverse_batch(EVAL_SEQUENCES, section["seq_len"], section["vocab_size"], generator, device=device)


@torch.no_grad()
def evaluate(model, section: dict, device="cpu") -> dict:
    """Greedy sequence and token accuracy on the held-out batch, plus its teacher-forced loss for comparison."""
    model.eval()
    batch = eval_batch(section, device)
    source, _, target = batch
    predicted = greedy_decode(model, source, target.shape[1])
    correct = predicted == target
    return {
        "n_sequences": int(source.shape[0]), "eval_seed": EVAL_SEED,
        "seq_accuracy": correct.all(dim=1).float().mean().item(),
        "token_accuracy": correct.float().mean().item(),
        "teacher_forced_loss": reverse_loss(model, batch).item(),
    }


def train_reverse_run(params: dict, variant: str, seed: int, out_dir: Path, device: str = "cpu",
                      match_params: bool = False) -> dict:
    """Train one (variant, seed) run, evaluate it, write its artifacts; resumes from ``out_dir/checkpoint.pt``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    section = params["reverse_copy"]
    cfg = variant_config(params, variant, match_params)
    device = resolve_device(device)
    model = build_model(cfg, seed).to(device)
    generator = torch.Generator().manual_seed(seed)

    def next_batch(gen):
        return reverse_batch(section["batch_size"], section["seq_len"], section["vocab_size"], gen, device=device)

    checkpoint = out_dir / "checkpoint.pt"
    identity = {"run": run_name(variant, seed, match_params), "model_config": cfg.to_dict(),
                "reverse_copy": {k: v for k, v in section.items() if k not in ("variants", "seeds", "steps")},
                # the code that decides its numbers (the model and training, and this module), not the whole package:
                # an edit to the reporting keeps its checkpoints, as the copy task's
                "code": provenance.numbers_code_version(extra=("experiments/reverse_copy.py",))}
    result = train(model, next_batch, reverse_loss, steps=section["steps"], lr=section["lr"], warmup=0,
                   generator=generator, checkpoint=checkpoint, checkpoint_every=CHECKPOINT_EVERY,
                   desc=run_name(variant, seed, match_params), identity=identity)
    meta = provenance.stamp(
        run=run_name(variant, seed, match_params), variant=variant, seed=seed, match_params=match_params,
        device=str(device),
        threads=torch.get_num_threads(), status="diverged" if result.diverged_step else "finished",
        diverged_step=result.diverged_step, resumed_from_step=result.resumed_from, wall_time_s=round(result.seconds, 2),
        n_params=count_parameters(model), model_config=cfg.to_dict(),
        reverse_copy={k: v for k, v in section.items() if k not in ("variants", "seeds")},
        eval=evaluate(model, section, device),
    )
    write_run(out_dir, result, model, meta)
    checkpoint.unlink(missing_ok=True)
    return meta


# --- aggregation -----------------------------------------------------------------------------------------------------


def aggregate(run_dirs: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy per-step losses of all runs, and one summary row per run (final_loss = mean of the last 10 steps)."""
    curves, rows = [], []
    for run_dir in map(Path, run_dirs):
        meta, loss = read_run(run_dir)  # checked against its checksums and recorded steps
        ident = {"run": meta["run"], "variant": meta["variant"], "seed": meta["seed"]}
        curves.append(loss.assign(**ident))
        ident["match_params"] = meta["match_params"]
        finished = len(loss) and not meta["diverged_step"]
        rows.append({
            **ident,
            "steps": int(loss["step"].max()) if len(loss) else 0,
            "final_loss": loss["loss"].tail(FINAL_WINDOW).mean() if len(loss) else float("nan"),
            "last_step_loss": loss["loss"].iloc[-1] if len(loss) else float("nan"),
            "seq_accuracy": meta["eval"]["seq_accuracy"],
            "token_accuracy": meta["eval"]["token_accuracy"],
            "eval_loss": meta["eval"]["teacher_forced_loss"],
            "n_params": meta["n_params"],
            "outcome": classify(loss["loss"], meta["reverse_copy"]["vocab_size"]) if finished else "diverged",
            "wall_time_s": meta["wall_time_s"],
        })
    columns = ["run", "variant", "seed", "step", "loss", "lr"]
    losses = pd.concat(curves, ignore_index=True)[columns] if curves else pd.DataFrame(columns=columns)
    summary = pd.DataFrame(rows)
    if len(summary):
        summary = summary.sort_values(["variant", "match_params", "seed"], key=_variant_order, ignore_index=True)
    return losses, summary


def _variant_order(column: pd.Series) -> pd.Series:
    order = {v: i for i, v in enumerate(VARIANTS)}
    return column.map(order) if column.name == "variant" else column


def variant_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per variant (and SwiGLU width choice): mean, standard deviation, min and max over seeds of final loss and
    accuracies; parameter count."""
    stats = summary.groupby(["variant", "match_params"]).agg(
        seeds=("seed", "nunique"), steps=("steps", "max"), n_params=("n_params", "first"),
        final_loss_mean=("final_loss", "mean"), final_loss_std=("final_loss", "std"),
        final_loss_min=("final_loss", "min"), final_loss_max=("final_loss", "max"),
        seq_accuracy_mean=("seq_accuracy", "mean"), seq_accuracy_std=("seq_accuracy", "std"),
        seq_accuracy_min=("seq_accuracy", "min"), seq_accuracy_max=("seq_accuracy", "max"),
        token_accuracy_mean=("token_accuracy", "mean"), token_accuracy_std=("token_accuracy", "std"),
    )
    return stats.reset_index().sort_values(["variant", "match_params"], key=_variant_order, ignore_index=True)


# --- command line ----------------------------------------------------------------------------------------------------


def register(subparsers) -> None:
    p = add_train(subparsers, "train-reverse", "train one run of the document-004 reverse-copy comparison", _train_main)
    p.add_argument("--variant", required=True, choices=list(VARIANTS))
    p.add_argument("--match-params", action="store_true",
                   help="SwiGLU hidden width 2/3·r·d (Llama) instead of r·d: about the ReLU FFN's parameter count")
    add_aggregate(subparsers, "aggregate-reverse", "collect finished reverse-copy runs into tidy tables", aggregate)


def _train_main(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    set_threads(args.threads or params["threads_per_run"])
    meta = train_reverse_run(params, args.variant, args.seed, args.out_dir, params["device"], args.match_params)
    log.info("%s %s in %.1f s, greedy sequence accuracy %.3f", meta["run"], meta["status"], meta["wall_time_s"],
             meta["eval"]["seq_accuracy"])
