"""What the Snakefile needs from the package: config checks, run lists, code dependencies, the figure list.

The DAG itself is defined once, in the Snakefile and workflow/rules/*.smk; dvc.yaml runs that DAG.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from .params import ParamsError, validate_params

PARAMS_FILE = "params.yaml"

# Every figure the analysis notebook writes into figs/ (name -> the data it is drawn from).
FIGURES = {
    "gradnorm_at_init": ["data/gradnorm/gradnorm.csv"],
    "loss_curves": ["data/sweep/losses.csv"],
    "problem9_scores": ["data/problem9/scores.csv"],
    "problem10_residual_growth": ["data/residual_sim/curve.csv"],
    "problem11_norm_warmup": ["data/sweep/summary.csv"],
    "activation_norms": ["data/activation_norms/norms.csv"],
    "residual_ablation": ["data/activation_norms/residual_ablation.csv"],
    "reverse_copy": ["data/reverse_copy/losses.csv", "data/reverse_copy/summary.csv"],
    "param_counts": ["data/param_counts/blocks.csv"],
    "residual_growth_trained": ["data/probe/lm.csv", "data/probe/copy.csv"],
}

_SOURCE = Path(__file__).resolve().parent
# Source files whose change alters a trained model (so Snakemake retrains); figure code is not among them.
MODEL_CODE = ["config", "layers", "blocks", "models", "init", "tasks", "train", "sweep"]


def check_config(config: dict, params_file: str = PARAMS_FILE) -> dict:
    """Validate Snakemake's config and insist it equals params.yaml, which every command and DVC read."""
    validate_params(config, source="snakemake config")
    on_disk = yaml.safe_load(Path(params_file).read_text(encoding="utf-8"))
    if config != on_disk:
        raise ParamsError(
            f"the Snakemake config differs from {params_file}; edit {params_file} (or use `dvc exp run -S key=value`) "
            "instead of --config/--configfile overrides, so that DVC and every command see the same parameters"
        )
    return config


def code_files(*modules: str, root: str = "src/blocklab") -> list[str]:
    """Paths (relative to the project) of package modules, for rules whose results depend on that code."""
    return [f"{root}/{m}.py" for m in modules]


def sweep_batched(config: dict) -> bool:
    """Whether the DAG trains each norm position's sweep runs as one batched job (``sweep.batched``; auto: on CUDA).

    Decided where Snakemake plans the DAG; torch is imported (to look for CUDA) only when the setting is auto and the
    device may be CUDA. On a cluster whose submit host has no GPU, set ``sweep.batched: true``.
    """
    setting = config["sweep"]["batched"]
    if setting != "auto":
        return bool(setting)
    if config["device"] == "cpu":
        return False
    from .runtime import resolve_device

    return resolve_device(config["device"]).type == "cuda"


def sweep_group_files(config: dict, name: str) -> list[str]:
    """One file of every run of a norm position (``{norm}`` left as a wildcard): a batched job's outputs."""
    return [f"data/sweep/runs/{{norm}}-w{warmup}-s{seed}/{name}"
            for warmup in config["sweep"]["warmups"] for seed in config["sweep"]["seeds"]]


# Keys added after runs were cached, with the value every earlier run had: left out of the identity at that value, so
# adding the key does not retrain finished runs, while any other value (e.g. sweep.precision: bf16) is part of it.
IDENTITY_DEFAULTS = {"precision": "fp32"}


def training_settings(section: dict, *loop_keys: str) -> dict:
    """The part of a section that decides a run's numbers: not the lists of runs to make, nor execution settings
    (checkpoint interval, torch.compile, device), which change speed, not results beyond float rounding, nor a key of
    ``IDENTITY_DEFAULTS`` at its old implicit value."""
    return {k: v for k, v in section.items()
            if k not in loop_keys and not (k in IDENTITY_DEFAULTS and v == IDENTITY_DEFAULTS[k])}
