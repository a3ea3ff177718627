"""Xiong et al. 2020, Fig. 3: at initialization, the gradient of each block's second MLP weight, post- vs pre-norm.

One copy-task batch, one backward pass, no optimizer step: the measurement is of the model as it starts training.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from ..model_config import ModelConfig
from ..io import write_json, write_table
from ..model.models import DecoderLM
from ..params_file import load_params
from ..provenance import stamp
from ..runtime import set_threads
from ..run_settings import CopyTask
from ..training.copy_model import copy_model_config
from ..training.tasks import copy_batch, copy_loss


def measure_gradnorms(model_cfg: ModelConfig, task: CopyTask, seed: int) -> pd.DataFrame:
    """Frobenius norm of d(copy loss)/d(blocks[i].ffn.sublayer.down.weight) for every block i (1-based).

    The initial loss is kept in ``frame.attrs["loss"]`` as a sanity check (near ln(vocab) for a sane init).
    """
    torch.manual_seed(seed)
    model = DecoderLM(model_cfg)
    generator = torch.Generator().manual_seed(seed)
    inputs, targets = copy_batch(task.batch_size, task.seq_len, task.vocab_size, generator)
    loss = copy_loss(model(inputs), targets)
    loss.backward()
    norms = [block.ffn.sublayer.down.weight.grad.norm().item() for block in model.blocks]
    frame = pd.DataFrame({"block": range(1, len(norms) + 1), "grad_norm": norms})
    frame.attrs["loss"] = loss.item()
    return frame


def gradnorm_frame(params: dict) -> pd.DataFrame:
    """Tidy frame (norm, seed, block, grad_norm, loss) over every norm position and seed of params["gradnorm"]."""
    section, task = params["gradnorm"], CopyTask.from_params(params)
    parts = []
    for norm in section["norms"]:
        cfg = copy_model_config(params, norm, section["init"])
        for seed in section["seeds"]:
            one = measure_gradnorms(cfg, task, seed)
            parts.append(one.assign(norm=norm, seed=seed, loss=one.attrs["loss"]))
    frame = pd.concat(parts, ignore_index=True)
    return frame[["norm", "seed", "block", "grad_norm", "loss"]]


def register(subparsers) -> None:
    p = subparsers.add_parser("gradnorm", help="gradient norm of each block's 2nd MLP weight at init (Xiong et al. 2020 Fig. 3)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, help="CSV path; metadata JSON is written beside it")
    p.set_defaults(func=_main)


def _main(args) -> None:
    params = load_params(args.params)
    set_threads(params["threads_per_run"])
    frame = gradnorm_frame(params)
    out = Path(args.out)
    write_table(frame, out)
    sections = {key: params[key] for key in ("copy_task", "copy_model", "gradnorm")}
    write_json(stamp(artifact=out.name, params=sections, device="cpu",
                     note="copy_model.init is replaced by gradnorm.init; one batch per seed, loss = masked copy loss"),
               out.with_suffix(".json"))
