"""Copy-task data, loss masking, the warm-up schedule, resumable training and divergence handling."""
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from blocklab import DecoderLM, ModelConfig
from blocklab.params_file import load_params
from blocklab.training.copy_model import build_copy_model, copy_model_config
from blocklab.training.sweep import aggregate, classify, train_copy_run
from blocklab.training.tasks import copy_batch, copy_loss
from blocklab.training.train import train, warmup_factor

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"


def test_copy_batch_repeats_and_masks_the_first_half():
    inputs, targets = copy_batch(5, 7, 64, torch.Generator().manual_seed(0))
    sequence = torch.cat([inputs, targets[:, -1:]], dim=1)  # inputs are the sequence without its last token
    assert inputs.shape == (5, 13) and targets.shape == (5, 13)
    assert torch.equal(sequence[:, :7], sequence[:, 7:])
    # exactly the 7 copy-half tokens are scored, and they are the first half again
    scored = targets != -100
    assert scored.sum(1).tolist() == [7] * 5
    assert torch.equal(targets[scored].view(5, 7), sequence[:, :7])


def test_uniform_prediction_costs_ln_vocab():
    inputs, targets = copy_batch(4, 8, 64, torch.Generator().manual_seed(1))
    assert math.isclose(copy_loss(torch.zeros(4, 15, 64), targets).item(), math.log(64), rel_tol=1e-6)


def test_perfect_copier_costs_nothing_on_the_copy_half():
    inputs, targets = copy_batch(3, 6, 10, torch.Generator().manual_seed(2))
    logits = torch.full((3, 11, 10), -1e4)
    logits.scatter_(2, targets.clamp(min=0).unsqueeze(-1), 1e4)  # right answers everywhere a target is scored
    logits[:, :5] = torch.randn(3, 5, 10)  # garbage on the unscored first half must not matter
    assert copy_loss(logits, targets).item() < 1e-6


def test_warmup_schedule():
    assert [warmup_factor(s, 0) for s in (1, 2, 500)] == [1.0, 1.0, 1.0]
    assert warmup_factor(1, 400) == 1 / 400
    assert warmup_factor(200, 400) == 0.5
    assert warmup_factor(400, 400) == 1.0 and warmup_factor(900, 400) == 1.0


def _tiny_setup(seed=0):
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=2, vocab_size=12, max_len=12)
    model = build_copy_model(cfg, seed)
    gen = torch.Generator().manual_seed(seed)

    def loss_fn(m, batch):
        return copy_loss(m(batch[0]), batch[1])

    return model, gen, (lambda g: copy_batch(4, 6, 12, g)), loss_fn


def test_lr_follows_warmup_in_training():
    model, gen, next_batch, loss_fn = _tiny_setup()
    result = train(model, next_batch, loss_fn, steps=6, lr=1e-2, warmup=4, generator=gen)
    assert result.lrs == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2])


def test_resume_after_interruption_is_bit_identical(tmp_path):
    model, gen, next_batch, loss_fn = _tiny_setup()
    full = train(model, next_batch, loss_fn, steps=12, lr=1e-2, warmup=3, generator=gen)

    model2, gen2, next_batch2, _ = _tiny_setup()
    calls = {"n": 0}

    def dying_batch(g):
        calls["n"] += 1
        if calls["n"] == 9:  # after the checkpoint at step 8
            raise KeyboardInterrupt
        return next_batch2(g)

    ckpt = tmp_path / "ckpt.pt"
    with pytest.raises(KeyboardInterrupt):
        train(model2, dying_batch, loss_fn, steps=12, lr=1e-2, warmup=3, generator=gen2, checkpoint=ckpt, checkpoint_every=4)
    model3, gen3, next_batch3, _ = _tiny_setup(seed=0)
    torch.manual_seed(123)  # the checkpoint must restore every generator, whatever the process did before
    resumed = train(model3, next_batch3, loss_fn, steps=12, lr=1e-2, warmup=3, generator=gen3, checkpoint=ckpt, checkpoint_every=4)
    assert resumed.resumed_from == 8
    assert resumed.losses == full.losses  # exact float equality
    for (name, a), (_, b) in zip(model.state_dict().items(), model3.state_dict().items()):
        assert torch.equal(a, b), name


def test_nonfinite_loss_is_recorded_as_diverged():
    model, gen, next_batch, loss_fn = _tiny_setup()
    calls = {"n": 0}

    def poisoned(m, batch):
        calls["n"] += 1
        return loss_fn(m, batch) * (float("nan") if calls["n"] >= 5 else 1.0)

    result = train(model, next_batch, poisoned, steps=10, lr=1e-2, warmup=0, generator=gen)
    assert result.diverged_step == 5 and result.steps == [1, 2, 3, 4]
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad step was not applied


def test_classify_outcomes():
    chance = math.log(64)
    assert classify(pd.Series([4.2, 4.17, 4.16]), 64) == "stuck"
    assert classify(pd.Series([4.2, 1.0, 0.01]), 64) == "learned"
    assert classify(pd.Series([4.2, 0.01, 0.7, 4.3, 4.16]), 64) == "collapsed"
    assert classify(pd.Series([4.2, 2.0, 1.5]), 64) == "partial"
    assert 0.9 * chance < 4.16


def _tiny_params():
    return load_params(TINY)


def test_same_seed_same_numbers(tmp_path):
    params = _tiny_params()
    params["sweep"]["steps"] = 15
    a = train_copy_run(params, "post", 5, 1, tmp_path / "a")
    b = train_copy_run(params, "post", 5, 1, tmp_path / "b")
    assert pd.read_csv(tmp_path / "a" / "loss.csv").equals(pd.read_csv(tmp_path / "b" / "loss.csv"))
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["model_config"]["norm_position"] == "post" and a["status"] == "finished"
    assert not (tmp_path / "a" / "checkpoint.pt").exists()
    losses, summary = aggregate([tmp_path / "a", tmp_path / "b"])
    assert len(losses) == 30 and list(summary["final_loss"]) == [a_loss := losses["loss"].iloc[14], a_loss]


def test_build_copy_model_is_seeded():
    params = _tiny_params()
    cfg = copy_model_config(params, "pre")
    a, b, c = build_copy_model(cfg, 3), build_copy_model(cfg, 3), build_copy_model(cfg, 4)
    assert torch.equal(a.head.weight, b.head.weight) and not torch.equal(a.head.weight, c.head.weight)
    assert cfg.max_len == 2 * params["copy_task"]["seq_len"] and isinstance(a, DecoderLM)


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    """Kill the real command with SIGKILL after a checkpoint, start it again: same losses and weights, bit for bit."""
    params_file = tmp_path / "params.yaml"
    text = TINY.read_text(encoding="utf-8").replace("  steps: 60", "  steps: 150").replace("  checkpoint_every: 20", "  checkpoint_every: 10")
    params_file.write_text(text, encoding="utf-8")  # the config has Korean comments: never the locale's codec
    cmd = [sys.executable, "-m", "blocklab.cli", "sweep", "train", "--params", str(params_file), "--norm", "pre",
           "--warmup", "20", "--seed", "0", "--threads", "1", "--out-dir"]
    subprocess.run(cmd + [str(tmp_path / "whole")], check=True, capture_output=True)

    victim = subprocess.Popen(cmd + [str(tmp_path / "killed")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = tmp_path / "killed" / "checkpoint.pt"
    deadline = time.time() + 120
    while not ckpt.exists() and time.time() < deadline:
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert ckpt.exists(), "no checkpoint was written before the kill"
    assert not (tmp_path / "killed" / "meta.json").exists()  # nothing that looks finished
    subprocess.run(cmd + [str(tmp_path / "killed")], check=True, capture_output=True)

    meta = (tmp_path / "killed" / "meta.json").read_text(encoding="utf-8")
    assert '"resumed_from_step": 0' not in meta
    assert (tmp_path / "whole" / "loss.csv").read_bytes() == (tmp_path / "killed" / "loss.csv").read_bytes()
    wa, wb = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "killed" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_artifacts_appear_whole_and_readable(tmp_path):
    """atomic_path: nothing under the final name when the block fails; the finished file has the usual permissions
    (mkstemp's 0600 would hide a shared lab's artifacts from everyone else)."""
    import stat

    from blocklab import io
    from blocklab.io import atomic_path, write_json

    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    write_json({"a": 1}, target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~io._UMASK  # 0644 under the usual umask 022
