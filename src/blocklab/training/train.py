"""A small, resumable training loop: Adam, linear warm-up, atomic checkpoints, divergence detection.

Everything that decides the numbers (model, optimizer, every random-number generator, step, losses so far) is in the
checkpoint, so a run killed at any point and resumed gives bit-identical losses and weights on the CPU.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import pickle
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
from tqdm import tqdm

from ..io import atomic_path, write_bytes
from .precision import autocast

log = logging.getLogger("blocklab.train")


def warmup_factor(step: int, warmup: int) -> float:
    """Linear warm-up: step s (1-based) trains at lr * min(1, s / warmup); no warm-up means the full rate from step 1."""
    return 1.0 if warmup <= 0 else min(1.0, step / warmup)


@dataclass
class TrainResult:
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    diverged_step: int | None = None
    stopped_step: int | None = None  # set when ``stop_when`` ended training before ``steps``
    resumed_from: int = 0
    seconds: float = 0.0
    diagnostics_from: int | None = None  # the first step with diagnostics recorded (None: recorded none)


def _save_checkpoint(path: Path, model, optimizer, generator, result: TrainResult, step: int, precision: str,
                     diagnostics=None, identity: dict | None = None) -> None:
    state = {
        "step": step,
        "precision": precision,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data_rng": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "steps": result.steps,
        "losses": result.losses,
        "lrs": result.lrs,
        "seconds": result.seconds,
        "diagnostics": diagnostics.state_dict() if diagnostics is not None else None,
        "identity": identity,
    }
    buffer = io.BytesIO()  # serialized in memory, written by Python: a full disk is an OSError (ENOSPC), not torch's
    torch.save(state, buffer)
    write_bytes(buffer.getbuffer(), path)


class CheckpointMismatch(Exception):
    """A checkpoint that cannot be resumed from: unreadable, damaged, or not this run's. ``reason`` names the file
    it is moved aside to (``checkpoint.pt.corrupt-<reason>``)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def read_checkpoint(path: Path) -> dict:
    """A checkpoint's state, verified: torch writes a zip archive with a CRC-32 of every record, which ``torch.load``
    does not check (a flipped bit in a tensor loads silently); ``zipfile`` checks them all first. Raises
    ``CheckpointMismatch("unreadable", ...)`` for a truncated, bit-flipped or otherwise unreadable file."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is None:
            return torch.load(path, map_location="cpu", weights_only=True)
        detail = f"record {bad} fails its CRC-32 check"
    except OSError:
        raise  # the environment (permissions, I/O), not the file's content: said as such by the CLI
    except (zipfile.BadZipFile, RuntimeError, EOFError, ValueError, KeyError, TypeError, pickle.UnpicklingError) as err:
        detail = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
    raise CheckpointMismatch("unreadable", f"cannot be read ({detail})")


def check_checkpoint(state: dict, steps: int, identity: dict | None) -> None:
    """Raise ``CheckpointMismatch`` unless ``state`` is a consistent checkpoint of the run ``identity`` describes:
    its step agrees with its recorded losses and lies within ``steps``, and its identity (the run's parameters and
    code, recorded by checkpoints since the checksums; older ones have none and are taken as they are) matches."""
    try:
        step = int(state["step"])
        recorded = [list(state[k]) for k in ("steps", "losses", "lrs")]
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointMismatch("unreadable", f"lacks a field of a checkpoint ({err})") from None
    if not 0 < step <= steps or recorded[0] != list(range(1, step + 1)) or len(set(map(len, recorded))) != 1:
        raise CheckpointMismatch("step", f"says step {step}, but records {len(recorded[0])} steps of losses"
                                 f" (this run trains {steps} steps)")
    saved = state.get("identity")
    if identity is not None and saved is not None and saved != identity:
        differ = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
        reason = "code" if differ == ["code"] else "params"
        raise CheckpointMismatch(reason, f"was written by another {'code version' if reason == 'code' else 'run'}"
                                 f" (differs in {', '.join(differ)})")


def move_aside(path: Path, reason: str) -> Path:
    """Rename a checkpoint that cannot be resumed from to ``<name>.corrupt-<reason>`` (numbered if one exists)."""
    target = path.with_name(f"{path.name}.corrupt-{reason}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{reason}-{n}")
    path.rename(target)
    return target


def _load_checkpoint(state: dict, model, optimizer, generator, result: TrainResult, diagnostics=None) -> int:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    result.steps, result.losses, result.lrs = list(state["steps"]), list(state["losses"]), list(state["lrs"])
    result.seconds = float(state["seconds"])
    if diagnostics is not None:
        # a checkpoint written with diagnostics off resumes with none recorded before it (TrainResult.diagnostics_from)
        saved = state.get("diagnostics")
        diagnostics.load_state_dict(saved or {})
        result.diagnostics_from = 1 if saved is not None else int(state["step"]) + 1
    return int(state["step"])


def train(
    model: torch.nn.Module,
    next_batch: Callable[[torch.Generator], tuple],
    loss_fn: Callable[[torch.nn.Module, tuple], torch.Tensor],
    *,
    steps: int,
    lr: float,
    warmup: int,
    generator: torch.Generator,
    checkpoint: Path | None = None,
    checkpoint_every: int = 100,
    compile: bool = False,
    fused_adam: bool = False,
    precision: str = "fp32",
    stop_when: Callable[[list[float]], bool] | None = None,
    desc: str = "train",
    diagnostics=None,
    identity: dict | None = None,
) -> TrainResult:
    """Train ``model`` for ``steps`` Adam steps; resume from ``checkpoint`` if it exists.

    ``next_batch(generator)`` draws a batch from the data generator (its state is checkpointed);
    ``loss_fn(model, batch)`` returns a scalar loss. Training stops at the first non-finite loss (recorded as diverged).
    ``fused_adam`` updates every parameter in one kernel: the same Adam update up to float rounding, fewer memory passes.
    ``precision`` "bf16" runs ``loss_fn`` (forward and loss) under bf16 autocast, weights and Adam staying fp32
    (``blocklab.training.precision``); a checkpoint of the other precision is not resumed from (training starts afresh).
    ``stop_when(losses)`` is asked after every step with the losses so far; True ends training there (an early stop,
    recorded in ``result.stopped_step``). It sees the restored losses after a resume, so a resumed run stops at the
    same step as an uninterrupted one.
    ``diagnostics`` (a ``blocklab.training.diagnostics.Recorder``) records per-block gradients, Adam's update and the
    attention while training; it only reads, so the losses are bit-identical with and without it.
    ``identity`` (JSON-like: the run's parameters and code version) is stored in every checkpoint; a checkpoint that
    cannot be read, whose step disagrees with its losses, or of another identity is moved aside as
    ``<checkpoint>.corrupt-<reason>`` with a warning, and training starts over (same numbers: runs are deterministic).
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=fused_adam or None)
    result = TrainResult(diagnostics_from=1 if diagnostics is not None else None)
    start = 0
    if checkpoint is not None and Path(checkpoint).exists():
        start = result.resumed_from = _resume(Path(checkpoint), model, optimizer, generator, result, diagnostics,
                                              steps=steps, precision=precision, identity=identity, desc=desc)
    step_fn = _make_step(model, loss_fn, optimizer, compile, precision, diagnostics)
    began = time.perf_counter() - result.seconds
    progress = tqdm(total=steps, initial=start, desc=desc, file=sys.stderr, disable=None, mininterval=2.0)
    clock = _Progress(desc, start, steps)

    def on_interrupt(step):  # SIGINT or SIGTERM: the step under way has finished; keep it, say so, stop
        kept = f"nothing after step {step} of {steps} is kept (this run writes no checkpoint)"
        if checkpoint is not None and step < steps:
            result.seconds = time.perf_counter() - began
            _save_checkpoint(Path(checkpoint), model, optimizer, generator, result, step, precision, diagnostics,
                             identity)
            kept = f"its checkpoint at step {step} of {steps} is kept ({checkpoint})"
        resume = os.environ.get(RESUME_ENV) or "the same command (`snakemake --cores N` or `dvc repro`)"
        said = f"{desc}: interrupted; {kept}; resume with {resume}"
        _say_interrupted(said, Path(checkpoint).parent / "train.log" if checkpoint is not None else None)

    for step in _steps_until_interrupted(start, steps, on_interrupt):
        rate = lr * warmup_factor(step, warmup)
        for group in optimizer.param_groups:
            group["lr"] = rate
        loss = step_fn(next_batch(generator), step)
        if not math.isfinite(loss):
            result.diverged_step = step
            log.warning("%s: loss became %s at step %d; recorded as diverged", desc, loss, step)
            break
        result.steps.append(step)
        result.losses.append(loss)
        result.lrs.append(rate)
        progress.update(1)
        if step % 50 == 0 or step == steps or clock.due():
            log.info("%s", clock.line(step, loss, rate))
        if stop_when is not None and step < steps and stop_when(result.losses):
            result.stopped_step = step
            log.info("%s: early stop at step %d (loss %.4f)", desc, step, loss)
            break
        if checkpoint is not None and step % checkpoint_every == 0 and step < steps:
            result.seconds = time.perf_counter() - began
            _save_checkpoint(Path(checkpoint), model, optimizer, generator, result, step, precision, diagnostics,
                             identity)
    progress.close()
    result.seconds = time.perf_counter() - began
    return result


# Snakemake's main process (blocklab.pipeline.say_interrupt_in_one_line) sets this to its process group: the jobs of
# that group, stopped by the same Ctrl-C, leave the terminal to its one line and write theirs into their train.log.
INTERRUPT_ENV = "BLOCKLAB_INTERRUPT_SAID_BY"
# The command that resumes, as the process that started the job says it (`blocklab lab` sets it for its jobs).
RESUME_ENV = "BLOCKLAB_RESUME"


def _say_interrupted(line: str, log: Path | None) -> None:
    if os.environ.get(INTERRUPT_ENV) == str(os.getpgrp()) and log is not None and log.is_file():
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        return
    print(line, file=sys.stderr, flush=True)


def recent_seconds_per_step(marks, window_s: float) -> float:
    """Seconds a step over the recent past: ``marks`` are (time, step) pairs, oldest first, the last one now; the rate
    runs from the oldest mark within ``window_s`` seconds of now (at least from the mark before now), so that an ETA
    follows a change of load within a window instead of averaging since the run began."""
    now, step = marks[-1]
    since = next((m for m in marks[:-1] if now - m[0] <= window_s), marks[-2])
    return (now - since[0]) / max(step - since[1], 1)


class _Progress:
    """A progress line at least every ``EVERY_S`` seconds (and every 50 steps): step, loss, seconds a step over the
    last ``WINDOW_S`` seconds, and the ETA at that pace."""
    EVERY_S = 10.0
    WINDOW_S = 60.0

    def __init__(self, desc: str, start: int, steps: int):
        import collections

        self.desc, self.start, self.steps = desc, start, steps
        self.began = self.last = time.perf_counter()
        self.marks = collections.deque([(self.began, start)], maxlen=64)

    def due(self) -> bool:
        return time.perf_counter() - self.last >= self.EVERY_S

    def line(self, step: int, loss: float, rate: float) -> str:
        self.last = time.perf_counter()
        self.marks.append((self.last, step))
        per_step = recent_seconds_per_step(list(self.marks), self.WINDOW_S)
        eta = round(per_step * (self.steps - step))
        return (f"{self.desc}: step {step}/{self.steps} loss {loss:.4f} lr {rate:.2e} {per_step:.3f} s/step "
                f"ETA {eta // 3600}:{eta % 3600 // 60:02d}:{eta % 60:02d}")


def _steps_until_interrupted(start: int, steps: int, on_interrupt):
    """Steps start+1..steps. SIGINT (Ctrl-C) or SIGTERM (Snakemake stopping its jobs) during a step lets that step
    finish; then ``on_interrupt(step)`` (the checkpoint) and KeyboardInterrupt (exit status 130). A second signal stops
    at once, keeping the last checkpoint. The previous handlers are back when the loop ends, however it ends."""
    import signal
    import threading

    caught = []

    def handler(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        for step in range(start + 1, steps + 1):
            yield step
            if caught:
                on_interrupt(step)
                raise KeyboardInterrupt
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def write_run(out_dir: Path, result: TrainResult, model: torch.nn.Module, meta: dict,
              diagnostics: pd.DataFrame | None = None) -> None:
    """A finished run's artifacts: loss.csv, diagnostics.parquet (when a table is given: a copy-task run writes one,
    with no rows when it recorded none) and weights first, meta.json last (its presence marks a finished run). meta.json
    records each artifact's size and sha256 and the loss table's length (``blocklab.integrity``), which every reader of
    finished runs checks."""
    from safetensors.torch import save

    from ..integrity import run_record, seal_meta
    from ..io import write_json, write_table

    out_dir = Path(out_dir)
    write_table(pd.DataFrame({"step": result.steps, "loss": result.losses, "lr": result.lrs}), out_dir / "loss.csv",
                record=False)  # meta.json records it
    if diagnostics is not None:
        with atomic_path(out_dir / "diagnostics.parquet") as tmp:
            diagnostics.to_parquet(tmp, index=False, compression="zstd")
    write_bytes(save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}),
                out_dir / "model.safetensors")
    written = ["loss.csv"] + (["diagnostics.parquet"] if diagnostics is not None else []) + ["model.safetensors"]
    write_json(seal_meta({**meta, **run_record(out_dir, written, len(result.steps))}), out_dir / "meta.json")


def _checkpoint_precision(path: Path) -> str:
    return read_checkpoint(path).get("precision", "fp32")


def _resume(path: Path, model, optimizer, generator, result: TrainResult, diagnostics, *, steps: int, precision: str,
            identity: dict | None, desc: str) -> int:
    """The step to resume from (0: from the start) after restoring ``path`` into the model, optimizer and generators.
    A checkpoint of the other precision is left in place and overwritten (training starts afresh); one that cannot be
    resumed from is moved aside, so that the next attempt does not fail on it again."""
    try:
        state = read_checkpoint(path)
        if state.get("precision", "fp32") != precision:
            log.warning("%s: checkpoint %s was trained in %s, this run is %s: starting afresh", desc, path,
                        state.get("precision", "fp32"), precision)
            return 0
        check_checkpoint(state, steps, identity)
        before = _state_of(model, optimizer, generator, diagnostics)
        try:
            start = _load_checkpoint(state, model, optimizer, generator, result, diagnostics)
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as err:  # shapes or names of another model
            _restore(before, model, optimizer, generator, diagnostics)
            result.steps, result.losses, result.lrs, result.seconds = [], [], [], 0.0
            result.diagnostics_from = 1 if diagnostics is not None else None
            raise CheckpointMismatch("params", f"does not fit this run's model or optimizer"
                                     f" ({' '.join(str(err).split())[:160]})") from None
    except CheckpointMismatch as err:
        moved = move_aside(path, err.reason)
        log.warning("%s: checkpoint %s %s; moved aside to %s, training starts over from step 0", desc, path, err,
                    moved)
        return 0
    log.info("%s: resumed from checkpoint at step %d", desc, start)
    return start


def _state_of(model, optimizer, generator, diagnostics) -> dict:
    """Everything ``_load_checkpoint`` changes, copied, so that a checkpoint that fails halfway changes nothing."""
    import copy

    return {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
            "data_rng": generator.get_state(), "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "diagnostics": copy.deepcopy(diagnostics.state_dict()) if diagnostics is not None else None}


def _restore(saved: dict, model, optimizer, generator, diagnostics) -> None:
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["data_rng"])
    torch.set_rng_state(saved["torch_rng"])
    if saved["cuda_rng"]:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    if diagnostics is not None:
        diagnostics.load_state_dict(saved["diagnostics"])


def _make_step(model, loss_fn, optimizer, compile: bool, precision: str = "fp32", diagnostics=None):
    # The compiled wrapper shares its parameters with ``model``, so checkpoints keep plain state-dict keys.
    forward_model = torch.compile(model, dynamic=False) if compile else model
    device = next(model.parameters()).device

    watched = diagnostics is not None and not compile  # hooks read the eager forward (compiled: gradients only)

    def step(batch, number: int = 0) -> float:
        optimizer.zero_grad(set_to_none=True)
        watch = diagnostics.watch(number) if watched and diagnostics.forward_due(number) else contextlib.nullcontext()
        with autocast(precision, device), watch:
            loss = loss_fn(forward_model, batch)
        loss.backward()
        loss_value = loss.item()
        if math.isfinite(loss_value):
            if diagnostics is not None:
                diagnostics.before_update(number, optimizer)
            optimizer.step()
            if diagnostics is not None:
                diagnostics.after_update(number)
        return loss_value

    return step
