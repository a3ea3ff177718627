"""Document 000's sweep: the 24-block copy task over norm position x warm-up x seed, one cached artifact per run."""
from __future__ import annotations

import logging
import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from .. import provenance
from ..model_config import NORM_POSITIONS, ConfigError, ModelConfig
from ..integrity import read_run
from ..io import read_json
from ..model.fastpath import PLAIN, FastPath, apply_fast_path
from ..params_file import load_params
from ..runtime import resolve_device, set_threads
from ..run_settings import CopyTask, Sweep, run_name
from .commands import add_aggregate, add_train
from .copy_model import build_copy_model, copy_model_config
from .diagnostics import Recorder, check_settings as check_diagnostics, table as diagnostics_table
from .precision import check_precision
from .tasks import copy_batch, copy_loss
from .train import CheckpointMismatch, read_checkpoint, train, write_run

log = logging.getLogger("blocklab.sweep")

RUN_FILES = ("loss.csv", "diagnostics.parquet", "model.safetensors", "meta.json")  # meta.json is written last: it marks a finished run


def train_copy_run(params: dict, norm: str, warmup: int, seed: int, out_dir: Path, device: str = "cpu",
                   stop_when=None, stop_rule: str | None = None, dense_steps: tuple[int, int] | None = None,
                   **extra_meta) -> dict:
    """Train one run of the sweep and write its artifacts into ``out_dir``; resumes from ``out_dir/checkpoint.pt``.

    ``stop_when`` (losses so far -> bool) may end the run early; ``stop_rule`` says in words what it tests (meta.json).
    ``sweep.precision`` (fp32 | bf16; absent: fp32) is checked against the device before anything runs.
    ``dense_steps`` (first, last): the forward diagnostics at every step of that window too (it changes no number).
    """
    provenance.code_version()  # taken now, at launch (it is cached): the code that trains, not the tree at the end
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    task, settings = CopyTask.from_params(params), Sweep.from_params(params)
    cfg = copy_model_config(params, norm)
    device = resolve_device(device)
    precision = check_precision(settings.precision, device)
    model = build_copy_model(cfg, seed).to(device)
    fast = FastPath() if settings.fast_path else PLAIN
    apply_fast_path(model, fast)
    generator = torch.Generator().manual_seed(seed)

    def next_batch(gen):
        return copy_batch(task.batch_size, task.seq_len, task.vocab_size, gen, device=device)

    def loss_fn(m, batch):
        inputs, targets = batch
        return copy_loss(m(inputs).float(), targets)  # the loss in fp32 also under bf16 autocast

    recorder = diagnostics_recorder(params, model, dense_steps)
    checkpoint = out_dir / "checkpoint.pt"
    identity = {"run": run_name(norm, warmup, seed), "model_config": cfg.to_dict(), "copy_task": asdict(task),
                "lr": settings.lr, "code": provenance.numbers_code_version()}
    result = train(
        model, next_batch, loss_fn, steps=settings.steps, lr=settings.lr, warmup=warmup, generator=generator,
        checkpoint=checkpoint, checkpoint_every=settings.checkpoint_every, compile=settings.compile,
        fused_adam=fast.fused_adam, precision=precision, stop_when=stop_when,
        desc=run_name(norm, warmup, seed), diagnostics=recorder, identity=identity,
    )
    meta = run_meta(params, cfg, norm, warmup, seed, device, result, **extra_meta,
                    stopped_step=result.stopped_step, stop_reason=stop_reason(result, stop_rule),
                    diagnostics=diagnostics_meta(recorder, result))
    write_run(out_dir, result, model, meta, recorder.table() if recorder is not None else diagnostics_table([]))
    checkpoint.unlink(missing_ok=True)
    return meta


def run_state(run_dir: Path, steps: int) -> dict:
    """Where one run stands (a study may span sessions): ``status`` finished (its meta.json), checkpointed or not
    started; ``steps_done`` (a finished run's stop or divergence step, else ``steps``) and ``seconds``, the run time
    spent (a finished run's wall time, a checkpoint's saved seconds)."""
    run_dir = Path(run_dir)
    if (run_dir / "meta.json").is_file():
        meta = read_json(run_dir / "meta.json")
        return {"status": "finished", "steps_done": int(meta.get("stopped_step") or meta.get("diverged_step") or steps),
                "seconds": float(meta["wall_time_s"])}
    if (run_dir / "checkpoint.pt").is_file():
        try:
            state = read_checkpoint(run_dir / "checkpoint.pt")
        except CheckpointMismatch:  # moved aside when the run starts again: it starts over
            return {"status": "not started", "steps_done": 0, "seconds": 0.0}
        return {"status": "checkpointed", "steps_done": int(state["step"]), "seconds": float(state.get("seconds", 0.0))}
    return {"status": "not started", "steps_done": 0, "seconds": 0.0}


def diagnostics_recorder(params: dict, model, dense: tuple[int, int] | None = None) -> Recorder | None:
    """The run's diagnostics recorder, or None when params' ``diagnostics.enabled`` is false (an execution setting:
    it changes what is recorded, never the numbers, so it is not part of a run's identity)."""
    settings = check_diagnostics(params.get("diagnostics"))
    if not settings["enabled"]:
        return None
    return Recorder(model, settings["metrics"], settings["every"], dense)


def diagnostics_meta(recorder: Recorder | None, result) -> dict | None:
    """What meta.json says of the diagnostics: which, how often, from which step (None: the run recorded none)."""
    if recorder is None:
        return None
    meta = {"metrics": recorder.metrics, "every": recorder.every, "from_step": result.diagnostics_from}
    if recorder.dense is not None:
        meta["dense_steps"] = list(recorder.dense)
    return meta


def run_meta(params: dict, cfg: ModelConfig, norm: str, warmup: int, seed: int, device, result, **extra) -> dict:
    """A finished sweep run's meta.json: what it is, how it ended, and the parameters and code that made it."""
    return provenance.stamp(
        run=run_name(norm, warmup, seed), norm=norm, warmup=warmup, seed=seed, device=str(device),
        threads=torch.get_num_threads(), status="diverged" if result.diverged_step else "finished",
        diverged_step=result.diverged_step, resumed_from_step=result.resumed_from, wall_time_s=round(result.seconds, 2),
        **extra, model_config=cfg.to_dict(), copy_task=asdict(CopyTask.from_params(params)),
        sweep={k: v for k, v in asdict(Sweep.from_params(params)).items() if k not in ("norms", "warmups", "seeds")},
    )


def stop_reason(result, stop_rule: str | None = None) -> str:
    """Why a run ended: it diverged, an early-stop rule fired, or it trained its whole budget."""
    if result.diverged_step:
        return f"diverged at step {result.diverged_step}"
    if result.stopped_step:
        return f"early stop at step {result.stopped_step}: {stop_rule or 'stop rule'}"
    return "trained the full budget"


def classify(losses: pd.Series, vocab_size: int) -> str:
    """learned / stuck / collapsed / partial, judged against chance level ln(vocab) (never tuned to the document)."""
    chance = math.log(vocab_size)
    final, best = losses.iloc[-1], losses.min()
    if best > 0.9 * chance:
        return "stuck"
    if final < 0.1 * chance:
        return "learned"
    if best < 0.1 * chance and final > 0.5 * chance:
        return "collapsed"
    return "partial"


def run_ident(meta: dict) -> dict:
    return {"run": meta["run"], "norm": meta["norm"], "warmup": meta["warmup"], "seed": meta["seed"]}


def summary_row(meta: dict, loss: pd.DataFrame) -> dict:
    """One run's row of the sweep's summary (its outcome by ``classify``) from its meta.json and per-step losses: the
    sweep's runs and any run of the same function recorded elsewhere (the lab's, ``records/lab/runs``) alike."""
    vocab = meta["copy_task"]["vocab_size"]
    outcome = "diverged" if meta["diverged_step"] else classify(loss["loss"], vocab) if len(loss) else "diverged"
    return {
        **run_ident(meta),
        "final_loss": loss["loss"].iloc[-1] if len(loss) else float("nan"),
        "min_loss": loss["loss"].min(),
        "min_loss_step": int(loss.loc[loss["loss"].idxmin(), "step"]) if len(loss) else None,
        "outcome": outcome,
        "diverged_step": meta["diverged_step"],
        "wall_time_s": meta["wall_time_s"],
    }


def aggregate(run_dirs: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy per-step losses of all runs, and one summary row per run."""
    curves, rows = [], []
    for run_dir in map(Path, run_dirs):
        meta, loss = read_run(run_dir)  # checked against its checksums and recorded steps
        curves.append(loss.assign(**run_ident(meta)))
        rows.append(summary_row(meta, loss))
    columns = ["run", "norm", "warmup", "seed", "step", "loss", "lr"]
    losses = pd.concat(curves, ignore_index=True)[columns] if curves else pd.DataFrame(columns=columns)
    summary = pd.DataFrame(rows).sort_values(["norm", "warmup", "seed"], ignore_index=True)
    return losses, summary


def register(subparsers) -> None:
    p = add_train(subparsers, "train", "train one run of the document-000 copy-task sweep", _train_main)
    p.add_argument("--norm", required=True, choices=list(NORM_POSITIONS))
    p.add_argument("--warmup", required=True, type=int)
    add_aggregate(subparsers, "aggregate", "collect finished sweep runs into tidy tables", aggregate)


def _train_main(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    steps = Sweep.from_params(params).steps
    if args.warmup < 0 or args.warmup > steps:
        raise ConfigError(f"--warmup={args.warmup} is not allowed; choose 0..{steps} (sweep.steps)")
    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed} is not allowed; choose an integer >= 0")
    set_threads(args.threads or params["threads_per_run"])
    meta = train_copy_run(params, args.norm, args.warmup, args.seed, args.out_dir, params["device"])
    log.info("%s %s in %.1f s", meta["run"], meta["status"], meta["wall_time_s"])
