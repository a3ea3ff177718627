"""One lab run and what it shows: learned, never, collapsed or diverged; the gradient per block at init.

A built-in norm position trains through the sweep's own code (``training.sweep.train_copy_run``): the same numbers as a
sweep run of that position at the same setup and seed. A user's block or a Hugging Face layer trains through the same
loop (``training.train.train``: Adam, linear warm-up, checkpoints every ``checkpoint_every`` steps, resumed after a kill,
a non-finite loss ends the run as diverged) with the same data stream.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from .. import provenance
from ..integrity import read_run
from ..runtime import set_threads
from ..training.tasks import copy_batch, copy_loss
from ..training.train import train, write_run
from .spec import Spec, build_model, params_for

from .outcomes import CHANCE, COLUMNS, ENDS_COLLAPSED, LEARNED, OUTCOMES, outcome  # noqa: F401 (the lab's API)


def train_lab_run(spec: Spec, params: dict, warmup: int, seed: int, out_dir: Path, threads: int = 1) -> dict:
    """Train one run of the lab into ``out_dir`` (resuming from its checkpoint) and return its row of lab.csv."""
    set_threads(threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if spec.block.kind == "builtin":
        from ..training.sweep import train_copy_run

        train_copy_run(params_for(params, spec.setup), spec.block.source, warmup, seed, out_dir, "cpu",
                       lab={"spec": spec_identity(spec)})
    else:
        _train_other(spec, warmup, seed, out_dir)
    return row_of(spec, out_dir)


def spec_identity(spec: Spec) -> dict:
    return {"block": spec.block.as_dict(), "profile": spec.profile, "setup": spec.setup.__dict__}


def _train_other(spec: Spec, warmup: int, seed: int, out_dir: Path) -> dict:
    provenance.code_version()
    setup = spec.setup
    model = build_model(spec, seed)
    generator = torch.Generator().manual_seed(seed)

    def next_batch(gen):
        return copy_batch(setup.batch_size, setup.seq_len, setup.vocab_size, gen)

    def loss_fn(m, batch):
        inputs, targets = batch
        return copy_loss(m(inputs).float(), targets)

    identity = {"lab": spec_identity(spec), "warmup": warmup, "seed": seed, "code": provenance.numbers_code_version()}
    history = _note_resume(out_dir, setup.steps, identity)
    result = train(model, next_batch, loss_fn, steps=setup.steps, lr=setup.lr, warmup=warmup, generator=generator,
                   checkpoint=out_dir / "checkpoint.pt", checkpoint_every=setup.checkpoint_every,
                   desc=f"{spec.block.label} {spec.run_name(warmup, seed)}", identity=identity)
    meta = provenance.stamp(
        run=spec.run_name(warmup, seed), norm=spec.block.label, warmup=warmup, seed=seed, device="cpu",
        threads=torch.get_num_threads(), status="diverged" if result.diverged_step else "finished",
        diverged_step=result.diverged_step, resumed_from_step=result.resumed_from,
        resumes=history if result.resumed_from else [], wall_time_s=round(result.seconds, 2),
        lab=spec_identity(spec), read=spec.read,
        copy_task={"vocab_size": setup.vocab_size, "seq_len": setup.seq_len, "batch_size": setup.batch_size})
    write_run(out_dir, result, model, meta)
    (out_dir / "checkpoint.pt").unlink(missing_ok=True)
    (out_dir / RESUMES).unlink(missing_ok=True)
    return meta


RESUMES = "resumes.json"  # beside a run's checkpoint: every resume of it so far (meta.json's ``resumes`` at the end)


def _note_resume(out_dir: Path, steps: int, identity: dict) -> list[dict]:
    """Every resume of this run, this one included: ``[{"step": N, "at": time}, ...]``, kept in ``RESUMES`` beside the
    checkpoint while the run is unfinished (an interrupted attempt never reaches meta.json). A checkpoint this run will
    not resume (none, unreadable, another identity: it starts from step 0) clears the list."""
    import json
    import time

    from ..training.train import CheckpointMismatch, check_checkpoint, read_checkpoint

    path, checkpoint = Path(out_dir) / RESUMES, Path(out_dir) / "checkpoint.pt"
    try:
        state = read_checkpoint(checkpoint) if checkpoint.is_file() else None
        if state is not None:
            check_checkpoint(state, steps, identity)
    except CheckpointMismatch:
        state = None
    if state is None:
        path.unlink(missing_ok=True)
        return []
    try:
        history = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
        history = [h for h in history if isinstance(h, dict) and int(h.get("step", 0)) <= int(state["step"])]
    except (OSError, ValueError, TypeError):
        history = []
    history.append({"step": int(state["step"]), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    path.write_text(json.dumps(history) + "\n", encoding="utf-8")
    return history


def time_steps(spec: Spec, steps: int = 3) -> float:
    """Seconds one training step of the lab's stack takes on this machine, at one thread as each job trains: one
    untimed step, then the mean of ``steps`` (forward, backward and Adam on copy batches of the profile's size). The
    thread count is put back after."""
    import time

    setup, threads = spec.setup, torch.get_num_threads()
    model = build_model(spec, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=setup.lr)
    generator = torch.Generator().manual_seed(0)
    torch.set_num_threads(1)
    try:
        for n in range(steps + 1):
            if n == 1:
                began = time.perf_counter()
            inputs, targets = copy_batch(setup.batch_size, setup.seq_len, setup.vocab_size, generator)
            optimizer.zero_grad(set_to_none=True)
            copy_loss(model(inputs).float(), targets).backward()
            optimizer.step()
        return (time.perf_counter() - began) / steps
    finally:
        torch.set_num_threads(threads)


def row_of(spec: Spec, run_dir: Path) -> dict:
    """A finished run's row of lab.csv, from its files (checked against their recorded checksums)."""
    from .records import adopted, read_run as read_recorded

    # a run adopted from the records (``records.adopt``) has its loss.csv and meta.json, not its weights
    meta, loss = read_recorded(run_dir) if adopted(run_dir) else read_run(Path(run_dir))
    steps, losses = loss["step"].tolist(), loss["loss"].tolist()
    found = outcome(steps, losses, spec.setup.vocab_size, meta.get("diverged_step"))
    if found["outcome"] == "diverged":
        found["final_loss"] = float("nan")
    return {"block": spec.block.label, "n_layers": spec.setup.n_layers, "warmup": int(meta["warmup"]),
            "seed": int(meta["seed"]), **found}


def gradnorm_at_init(spec: Spec, seeds) -> pd.DataFrame:
    """Xiong et al. 2020 Fig. 3 for this block: the norm of d(copy loss)/d(every parameter of block i) at init, one
    batch, for each seed; beside it the same for the built-in pre- and post-norm blocks at the same setup (the whole
    block's gradient, so that any block can be measured the same way)."""
    from .spec import Block, Spec as _Spec, builtin_read

    rows = []
    subjects = [(spec.block.label, spec)]
    for norm in ("pre", "post"):
        if not (spec.block.kind == "builtin" and spec.block.source == norm):
            subjects.append((norm, _Spec(Block("builtin", norm), spec.profile, spec.setup, spec.params_sha256,
                                         builtin_read(norm))))
    setup = spec.setup
    for label, subject in subjects:
        for seed in seeds:
            model = build_model(subject, seed)
            inputs, targets = copy_batch(setup.batch_size, setup.seq_len, setup.vocab_size,
                                         torch.Generator().manual_seed(seed))
            loss = copy_loss(model(inputs).float(), targets)
            loss.backward()
            for i, block in enumerate(model.blocks, start=1):
                grads = [p.grad for p in block.parameters() if p.grad is not None]
                norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item() if grads else 0.0
                rows.append({"block_kind": label, "seed": seed, "block": i, "grad_norm": norm,
                             "initial_loss": loss.item()})
    return pd.DataFrame(rows)
