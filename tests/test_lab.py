"""The literature's norm positions (each against its paper's formula) and the stability lab (`blocklab lab`)."""
import json
import math
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from torch import nn

from blocklab.model_config import NORM_POSITIONS, NORM_POSITION_SPECS, ConfigError, ModelConfig
from blocklab.model import blocks
from blocklab.model.counting import decoder_lm_params
from blocklab.model.layers import LayerNorm
from blocklab.model.models import DecoderLM
from blocklab.records import GALLERY

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(d_model=16, n_heads=2, n_layers=3, vocab_size=11, max_len=12)


def _cfg(norm, **kw):
    return ModelConfig(**{**TINY, **kw}, norm_position=norm)


@pytest.mark.parametrize("norm", NORM_POSITIONS)
def test_every_norm_position_builds_counts_and_trains_one_step(norm):
    cfg = _cfg(norm)
    torch.manual_seed(0)
    model = DecoderLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == decoder_lm_params(cfg)
    assert isinstance(model.norm, LayerNorm) == NORM_POSITION_SPECS[norm].final_norm
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.max_len))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(2):
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[1] != losses[0]


def _linear_sublayer(d, seed):
    torch.manual_seed(seed)
    return nn.Linear(d, d)


@pytest.mark.parametrize("norm", NORM_POSITIONS)
def test_each_residual_computes_its_papers_formula(norm):
    """Each wrapper against its formula written out here with torch's own layer_norm (same float32 ops, bit-equal up
    to the order of the two additions: 1e-6 relative)."""
    cfg = _cfg(norm)
    wrapper = blocks.RESIDUAL[norm](cfg, _linear_sublayer(16, 1))
    with torch.no_grad():
        for p in wrapper.parameters():
            if p.dim() == 1 and p is not getattr(wrapper.sublayer, "bias", None):
                p.add_(0.1 * torch.randn_like(p))  # norms and gates away from their init: each must enter the formula
        if norm == "rezero":
            wrapper.alpha.fill_(0.7)
    h, x0 = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    F_ = wrapper.sublayer

    def ln(m, x):
        return nn.functional.layer_norm(x, (16,), m.weight, m.bias, m.eps)

    n = cfg.n_layers
    expected = {
        "pre": lambda: h + F_(ln(wrapper.norm, h)),
        "post": lambda: ln(wrapper.norm, h + F_(h)),
        "deepnorm": lambda: ln(wrapper.norm, (2 * n) ** 0.25 * h + F_(h)),
        "admin": lambda: ln(wrapper.norm, wrapper.omega * h + F_(h)),
        "b2t": lambda: ln(wrapper.norm, h + F_(h) + x0),
        "rezero": lambda: h + 0.7 * F_(h),
        "sandwich": lambda: h + ln(wrapper.out_norm, F_(ln(wrapper.norm, h))),
    }[norm]()
    with torch.no_grad():
        torch.testing.assert_close(wrapper(h, block_input=x0), expected, rtol=1e-6, atol=1e-6)


def test_the_fixes_initialise_as_their_papers_say_and_draw_no_random_numbers():
    torch.manual_seed(0)
    post = DecoderLM(_cfg("post"))
    torch.manual_seed(0)
    deep = DecoderLM(_cfg("deepnorm"))
    beta = (8 * TINY["n_layers"]) ** -0.25
    for a, b in zip(post.blocks, deep.blocks):  # same draws, then value, output and FFN matrices times beta
        assert torch.equal(b.attn.sublayer.q.weight, a.attn.sublayer.q.weight)
        torch.testing.assert_close(b.attn.sublayer.v.weight, beta * a.attn.sublayer.v.weight, rtol=0, atol=0)
        torch.testing.assert_close(b.ffn.sublayer.down.weight, beta * a.ffn.sublayer.down.weight, rtol=0, atol=0)
        assert torch.equal(b.attn.sublayer.v.bias, a.attn.sublayer.v.bias)  # the paper's formula: weights only
    torch.manual_seed(0)
    b2t = DecoderLM(_cfg("b2t"))
    # the authors' rescaling_init: every sub-layer parameter named "weight" outside a layer norm, times N^-1/2
    scale = TINY["n_layers"] ** -0.5
    for a, b in zip(post.blocks, b2t.blocks):
        for name, p in a.named_parameters():
            mine = b.get_parameter(name)
            rescaled = "sublayer." in name and name.endswith("weight")
            torch.testing.assert_close(mine, scale * p if rescaled else p, rtol=0, atol=0, msg=name)
    admin = DecoderLM(_cfg("admin"))
    m = 2 * TINY["n_layers"]
    assert torch.allclose(admin.blocks[0].attn.omega, torch.tensor(math.sqrt((m + 1) / math.log(m + 1) - 1)))
    rezero = DecoderLM(_cfg("rezero"))
    tokens = torch.randint(0, 11, (2, 12))
    with torch.no_grad():  # alpha = 0: every block is the identity, the logits are the head of the embedding
        torch.testing.assert_close(rezero(tokens), rezero.head(rezero.position(rezero.embed(tokens))))
    for norm in NORM_POSITIONS:
        model = DecoderLM(_cfg(norm))
        state = torch.get_rng_state()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        blocks.init_residuals(model)
        assert torch.equal(torch.get_rng_state(), state), norm
        if norm in ("pre", "post"):
            assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_outcomes_of_synthetic_curves():
    from blocklab.lab.run import outcome

    chance = math.log(64)
    steps = list(range(1, 11))
    learned = [4.1, 3.0, 1.0, 0.2, 0.1, 0.05, 0.02, 0.01, 0.01, 0.01]
    assert outcome(steps, learned, 64, None) == {"outcome": "learned", "final_loss": 0.01, "step_learned": 4,
                                                 "step_collapsed": None}
    assert outcome(steps, [4.1] * 10, 64, None)["outcome"] == "never"
    collapsed = learned[:6] + [4.0, 4.1, 4.15, 4.16]
    assert outcome(steps, collapsed, 64, None) == {"outcome": "collapsed", "final_loss": 4.16, "step_learned": 4,
                                                   "step_collapsed": 7}
    spiked = learned[:6] + [0.95 * chance, 0.1, 0.01, 0.01]  # back at chance once, recovered: learned, step kept
    assert outcome(steps, spiked, 64, None)["outcome"] == "learned"
    assert outcome(steps, spiked, 64, None)["step_collapsed"] == 7
    assert outcome(steps[:3], learned[:3], 64, 4)["outcome"] == "diverged"


def test_rates_use_the_wilson_interval():
    from blocklab.lab.report import rates

    lab = pd.DataFrame({"block": "x", "warmup": 0, "seed": [0, 1, 2], "outcome": ["never"] * 3})
    row = rates(lab).set_index("outcome").loc["learned"]
    z2 = 1.959963984540054 ** 2
    assert row["k"] == 0 and row["ci_low"] == pytest.approx(0, abs=1e-12)
    assert row["ci_high"] == pytest.approx(z2 / (3 + z2), rel=1e-9)  # Wilson's upper bound at k = 0


def _lab(*args, cwd=ROOT):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "blocklab.cli", "lab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


@pytest.mark.parametrize("block, message", [
    ("WideningBlock", "one block maps (2, 15, 16) to (2, 15, 17)"), ("PeekingBlock", "not causal"),
    ("Nowhere", "no attribute"),
    ("NaNWeightsBlock", "NaN/inf in the weights at init (one block built at width 16): proj.weight (1 NaN, 0 inf of "
                        "256)"),
])
def test_a_block_the_copy_task_cannot_train_stops_with_exit_3_before_any_run(tmp_path, block, message):
    done = _lab("--module", f"tests/lab_blocks.py:{block}", "--profile", "tiny", "--out", str(tmp_path / "lab"))
    assert done.returncode == 3, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert block == "PeekingBlock" or "not causal" not in done.stderr
    assert not (tmp_path / "lab" / "spec.json").exists()


@pytest.mark.parametrize("args, message", [
    (["nonesuch"], "invalid choice"), (["pre", "--profile", "fast"], "invalid choice"),
    (["pre", "--module", "tests/lab_blocks.py:TinyPreNormBlock"], "exactly one block"),
    (["pre", "--seeds", "-1"], "--seeds"),
])
def test_bad_options_name_the_allowed_values(tmp_path, args, message):
    done = _lab(*args, "--out", str(tmp_path / "lab"))
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_users_block_through_the_lab_nan_is_diverged_and_a_rerun_trains_nothing(tmp_path):
    """A block of a test file, run from another folder by its path; its loss turns NaN after
    the first step, so the run is `diverged` and the lab still writes every table, the figure and the page."""
    out = tmp_path / "lab"
    path = ROOT / "tests" / "lab_blocks.py"
    done = _lab("--module", f"{path}:NaNAfterStepsBlock", "--params", str(ROOT / "params.yaml"), "--profile", "tiny",
                "--warmups", "0", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lab = pd.read_csv(out / "lab.csv")
    assert list(lab.columns) == ["block", "n_layers", "warmup", "seed", "outcome", "final_loss", "step_learned",
                                 "step_collapsed"]
    assert lab["outcome"].tolist() == ["diverged"] and lab["n_layers"].tolist() == [2]
    rates = pd.read_csv(out / "rates.csv").set_index("outcome")
    assert rates.loc["diverged", "k"] == 1 and rates.loc["diverged", "n"] == 1
    grad = pd.read_csv(out / "gradnorm.csv")
    assert set(grad["block_kind"]) == {"NaNAfterStepsBlock", "pre", "post"} and (grad["grad_norm"] > 0).all()
    page = (out / "README.md").read_text(encoding="utf-8")
    assert "Norm placement as read**: pre" in page and "one LayerNorm after the last block" in page
    assert (out / "lab.png").stat().st_size > 10_000
    meta = out / "runs" / "w0-s0" / "meta.json"
    stamp = meta.stat().st_mtime_ns
    again = _lab("--module", f"{path}:NaNAfterStepsBlock", "--params", str(ROOT / "params.yaml"), "--profile", "tiny",
                 "--warmups", "0", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0 and meta.stat().st_mtime_ns == stamp, again.stderr[-2000:]


def _edit_attention(path):
    """The user's edit: the attention branch x 0.5 (the same weights at init, another source)."""
    text = path.read_text()
    old = "return self.proj(y.transpose(1, 2).reshape(b, t, d))"
    assert text.count(old) == 2
    path.write_text(text.replace(old, old + " * 0.5", 1))


def test_an_edited_block_retrains_from_step_0_after_a_finished_lab(tmp_path):
    """The block's file edited after its lab finished: the same command retrains its run from step 0 (not "every run
    is finished"), and the tables are the edited block's; spec.json keys the runs on the block's source."""
    shutil_copy = __import__("shutil").copy
    shutil_copy(ROOT / "tests" / "lab_blocks.py", tmp_path / "lab_blocks.py")
    out = tmp_path / "lab"
    args = ("--module", "lab_blocks.py:TinyPreNormBlock", "--params", str(ROOT / "params.yaml"), "--profile", "tiny",
            "--warmups", "0", "--out", str(out))
    first = _lab(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = out / "runs" / "w0-s0"
    before = pd.read_csv(run / "loss.csv")["loss"]
    digest = json.loads((out / "spec.json").read_text())["block"]["digest"]
    assert json.loads((run / "meta.json").read_text())["lab"]["block"]["digest"] == digest
    _edit_attention(tmp_path / "lab_blocks.py")
    again = _lab(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "every run retrains from step 0" in again.stderr and "every run is finished" not in again.stderr
    # the first lab, trained from its start, left this machine's start-up calibration; the second one's cost uses it
    import os

    assert (Path(os.environ["BLOCKLAB_CACHE"]) / "lab_job_start.json").is_file()
    assert "this machine's last finished lab's start-up read back from its real time" in again.stderr, again.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert meta["resumed_from_step"] == 0 and meta["lab"]["block"]["digest"] != digest
    after = pd.read_csv(run / "loss.csv")
    assert after["step"].tolist() == list(range(1, 13)) and not np.allclose(after["loss"], before)
    assert pd.read_csv(out / "lab.csv")["final_loss"].iloc[0] == pytest.approx(after["loss"].iloc[-1])


# ---- the recorded runs and the literature's claims -------------------------------------------------------


def _fake_records(tmp_path, seeds, source="deepnorm-w0-s0", name="deepnorm"):
    """Copies of one recorded run under other seeds' names (the outcome is the run's; the point is the counting)."""
    import shutil

    from blocklab.lab import records

    for seed in seeds:
        shutil.copytree(records.runs_dir() / source, tmp_path / f"{name}-w0-s{seed}")
    return tmp_path


def test_recorded_runs_are_read_with_their_checksums_and_a_damaged_one_is_refused(tmp_path, monkeypatch):
    from blocklab.io import DamagedArtifact
    from blocklab.lab import records

    from blocklab.training import lab_records  # where the records are read (below the lab)

    monkeypatch.setattr(lab_records, "RUNS", str(_fake_records(tmp_path, [0, 1])))
    table = records.recorded(norm="deepnorm", warmup=0)
    assert list(table["run"]) == ["deepnorm-w0-s0", "deepnorm-w0-s1"] and set(table["outcome"]) <= {"learned", "never", "collapsed", "diverged"}
    assert records.recorded(norm="admin").empty
    loss = tmp_path / "deepnorm-w0-s1" / "loss.csv"
    loss.write_text(loss.read_text().replace("\n2,", "\n2,9", 1))
    with pytest.raises(DamagedArtifact, match="loss.csv"):
        records.recorded()


def test_rates_rule_decides_only_where_fishers_test_can():
    from blocklab.reporting import verdicts

    assert verdicts.rate_contrast("above", 4, 4, 0, 3).verdict == verdicts.REPRODUCED
    assert verdicts.rate_contrast("above", 0, 4, 3, 3).verdict == verdicts.NOT_REPRODUCED
    one = verdicts.rate_contrast("above", 1, 1, 0, 3)
    assert one.verdict == verdicts.INCONCLUSIVE and one.seeds_to_decide == 4 and "Wilson" in one.margin
    assert verdicts.rate_contrast("above", 3, 3, 0, 3).verdict == verdicts.INCONCLUSIVE  # p = 0.1 at 3 vs 3
    assert verdicts.rate_contrast("above", 0, 3, 0, 3).seeds_to_decide is None  # equal rates: no seeds decide


def _literature(params_change=None):
    import copy

    from blocklab.params_file import load_params
    from blocklab.reporting import claims

    data = ROOT / GALLERY
    params = copy.deepcopy(load_params(data / "params.yaml"))
    if params_change:
        params_change(params)
    return claims.evaluate_data(claims.Data(data, params), only={"literature_fix"}).set_index("id")


def test_the_literatures_claims_are_judged_from_the_recorded_runs(tmp_path, monkeypatch):
    from blocklab.lab import records
    from blocklab.reporting import claims

    ids = {c["id"] for c in claims.load_claims() if c["source"] == "literature"}
    assert {f"lit-{n}-nowarm" for n in ("deepnorm", "admin", "b2t", "rezero", "sandwich")} <= ids
    from blocklab.training import lab_records  # where the records are read (below the lab)

    monkeypatch.setattr(lab_records, "RUNS", str(_fake_records(tmp_path, [0])))
    one = _literature()
    assert one.loc["lit-deepnorm-nowarm", "verdict"] == claims.INCONCLUSIVE  # one seed decides nothing
    # the rates part alone can never say "not reproduced" against a reference that never learned; the claim as a
    # whole can, by its every-seed part, and its two parts are drawn as one (docs/lab.md): eight seeds bring both
    # error rates to 0.8 against a fix that fails one run in five (1 - 0.8^8 = 0.83)
    assert one.loc["lit-deepnorm-nowarm", "seeds_to_decide"] == 8
    assert "8 seeds per arm would bring both error rates to 0.8" in one.loc["lit-deepnorm-nowarm", "margin"]
    assert one.loc["lit-admin-nowarm", "verdict"] == claims.NOT_CHECKABLE  # none recorded here
    _fake_records(tmp_path, [1, 2, 3])
    four = _literature()  # 4 of 4: a fix failing one run in five says so 0.8^4 = 0.41 of the time: not yet decided
    assert four.loc["lit-deepnorm-nowarm", "verdict"] == claims.INCONCLUSIVE, four.loc["lit-deepnorm-nowarm", "margin"]
    assert "4 of 4 recorded runs learned" in four.loc["lit-deepnorm-nowarm", "measured"]
    assert four.loc["lit-deepnorm-nowarm", "p_reproduced_if_off"] == pytest.approx(0.8 ** 4, abs=1e-3)
    _fake_records(tmp_path, [4, 5, 6, 7])
    eight = _literature()
    assert eight.loc["lit-deepnorm-nowarm", "verdict"] == claims.REPRODUCED, eight.loc["lit-deepnorm-nowarm", "margin"]
    assert min(eight.loc["lit-deepnorm-nowarm", ["p_reproduced_if_true", "p_rejected_if_off"]]) >= 0.8
    other = _literature(lambda p: p["copy_task"].update(batch_size=32))
    assert other.loc["lit-deepnorm-nowarm", "verdict"] == claims.NOT_CHECKABLE
    assert "copy_task.batch_size=64 (params 32)" in other.loc["lit-deepnorm-nowarm", "measured"]


def _cell_run(folder, norm, warmup, seed, curve_of, batch_size=64):
    """A recorded lab run of the sweep's cell as `blocklab lab-job record` leaves one: a real recorded run's meta.json
    (its setup) renamed to ``norm``, ``warmup`` and ``seed``, with the gallery sweep's loss curve of run ``curve_of``
    as its loss.csv, both checksummed, so that it is read back by the same checks as a trained one (the counting is
    the point, not the curve)."""
    from blocklab.integrity import file_record, seal_meta
    from blocklab.records import LAB_RUNS

    meta = json.loads((ROOT / LAB_RUNS / "deepnorm-w0-s0" / "meta.json").read_text(encoding="utf-8"))
    run = folder / f"{norm}-w{warmup}-s{seed}"
    run.mkdir(parents=True)
    losses = pd.read_csv(ROOT / GALLERY / "sweep" / "losses.csv")
    losses[losses["run"] == curve_of][["step", "loss", "lr"]].to_csv(run / "loss.csv", index=False)
    meta.update(run=run.name, norm=norm, warmup=warmup, seed=seed, diverged_step=None, loss_steps=1200,
                artifacts={"loss.csv": file_record(run / "loss.csv")})
    meta["model_config"]["norm_position"] = norm
    meta["copy_task"]["batch_size"] = batch_size
    (run / "meta.json").write_text(json.dumps(seal_meta(meta), indent=2), encoding="utf-8")
    return folder


def test_the_default_cells_claims_count_its_runs_recorded_after_the_sweep(tmp_path, monkeypatch):
    """The default cell's claims read the sweep's runs and the same cell's runs the lab recorded in git (the lanes'
    `lab-job run-builtin` of pre and post: the sweep's training function at the document's setup), each run once:
    a recorded seed the sweep holds is the sweep's run, a run of another setup is another cell, and the held-out
    losses stay on their held-out runs. Their rows are the ones `blocklab docs` re-judges (``reads_lab_records``)."""
    from blocklab.params_file import load_params
    from blocklab.reporting import claims
    from blocklab.training import lab_records

    folder = tmp_path / "runs"
    monkeypatch.setattr(lab_records, "RUNS", str(folder))
    # the dynamics study's recorded runs of this cell are counted too (tests/test_claims_snapshot_runs.py): not here
    monkeypatch.setattr(claims, "SNAPSHOT_ROOT", str(tmp_path / "no-snapshots"))
    for norm, warmup, seed, curve in (("post", 0, 3, "post-w0-s0"), ("post", 0, 4, "post-w0-s1"),
                                      ("pre", 0, 3, "pre-w0-s0"), ("post", 400, 3, "post-w400-s0"),
                                      ("post", 0, 0, "post-w0-s2")):  # seed 0: the sweep's own run, not counted again
        _cell_run(folder, norm, warmup, seed, curve)
    _cell_run(folder, "pre", 0, 4, "post-w0-s0", batch_size=32)  # another setup: another cell, not counted
    ids = ["d000-post-nowarm-stuck", "d000-pre-trains-without-warmup", "d000-post-4of6-failed",
           "d000-11c-scoped-answer", "d000-pre-nowarm-final", "d000-pre-nowarm-step200"]
    data = ROOT / GALLERY
    table = claims.evaluate_data(claims.Data(data, load_params(data / "params.yaml")),
                                 only={c["check"] for c in claims.load_claims() if c["id"] in ids},
                                 error_rates=False).set_index("id")
    stuck = table.loc["d000-post-nowarm-stuck", "measured"]
    assert "5 of 5 runs stayed near" in stuck and f"seeds 3, 4: the same cell's runs recorded in {folder}" in stuck
    assert table.loc["d000-pre-trains-without-warmup", "measured"].startswith("4 of 4 learned")
    assert table.loc["d000-post-4of6-failed", "measured"].startswith("7 of 9 did not learn")  # 4 of 6, and 3 of 3
    assert "warm-up/seed 0/0, 0/1" in table.loc["d000-post-4of6-failed", "measured"]
    scoped = table.loc["d000-11c-scoped-answer", "measured"]
    assert "5 of 5 did not learn" in scoped and "2 of 4 did not end learned" in scoped and "4 of 4 learned" in scoped
    assert "4 of the same cell recorded in" in scoped
    assert len(table.loc["d000-pre-nowarm-final", "measured"].split(" [")[0].split(",")) == 4  # 3 + 1 final losses
    held = table.loc["d000-pre-nowarm-step200", "measured"]
    # the held-out claim: the recorded pre-w0-s3 is its held-out seed 3's run (at more steps), not counted again;
    # seed 6, used by no fit and no held-out run, joins the held-out seeds
    assert held.startswith("held-out seeds 3 4 5:") and held.endswith(
        "the fit's seeds 0 1 2: 0.005599, 0.005766, 0.005575") and "recorded in" not in held
    _cell_run(folder, "pre", 0, 6, "pre-w0-s1")
    one = claims.evaluate_data(claims.Data(data, load_params(data / "params.yaml")), only={"loss_at_step"},
                               error_rates=False).set_index("id").loc["d000-pre-nowarm-step200", "measured"]
    assert one.startswith("held-out seeds 3 4 5 and 6 (the same cell's runs recorded in")
    assert len(one.split(": ")[1].split(";")[0].split(",")) == 4
    picked = {c["id"] for c in claims.load_claims() if claims.reads_lab_records(c)}
    assert set(ids) <= picked
    # the sensitivity study compares its cells on their own seeds: there the recorded runs are not counted
    alone = claims.evaluate_data(claims.Data(data, load_params(data / "params.yaml"), recorded_runs=False),
                                 only={"outcome_count"}, error_rates=False).set_index("id")
    assert alone.loc["d000-pre-trains-without-warmup", "measured"] == "3 of 3 learned (outcomes: learned, learned, learned)"
    # the lab's pages say where each group's runs come from
    from blocklab.reporting.lab_docs import _from

    mixed = pd.DataFrame({"source": ["gallery", "gallery", "lab"], "seed": [0, 1, 3]})
    assert _from(mixed) == "the gallery sweep (seeds 0, 1); lab, recorded (seed 3)"
    assert _from(mixed.iloc[:2]) == "the gallery sweep"


def test_the_lanes_pre_and_post_runs_are_the_gallery_sweeps_cell():
    """What makes a recorded `lab-job run-builtin --norm pre|post` run the gallery sweep's run of its seed: the same
    function (``train_copy_run``) given the same model, task and optimisation settings. Checked here setting by
    setting (the model config of each norm, the task, lr, steps, precision, the fast path); by hand, the first
    four losses of post-norm seed 0 matched the gallery's recorded ones to 5e-7 (another processor's rounding)."""
    from blocklab.lab.spec import params_for, profile_setup
    from blocklab.params_file import load_params
    from blocklab.training.copy_model import copy_model_config
    from blocklab.run_settings import CopyTask, Sweep

    gallery = load_params(ROOT / GALLERY / "params.yaml", studies=False)
    lab = params_for(load_params(ROOT / "params.yaml", studies=False),
                     profile_setup(load_params(ROOT / "params.yaml", studies=False), "document", seeds=[3], warmups=[0]))
    for norm in ("pre", "post"):
        assert copy_model_config(lab, norm) == copy_model_config(gallery, norm)
    assert CopyTask.from_params(lab) == CopyTask.from_params(gallery)
    mine, theirs = Sweep.from_params(lab), Sweep.from_params(gallery)
    for key in ("lr", "steps", "precision", "fast_path", "compile"):
        assert getattr(mine, key) == getattr(theirs, key), key


def test_docs_rewrites_the_galleries_literature_rows_alone_when_a_run_is_recorded(tmp_path):
    """`blocklab docs` re-judges the literature's rows of the gallery's claims table from the recorded runs (a snapshot
    edit: the manifest is re-recorded), every other row byte for byte as it was; --check only says so."""
    import shutil

    from blocklab.integrity import verify_snapshot
    from blocklab.reporting import literature

    data = tmp_path / "data"
    shutil.copytree(ROOT / GALLERY, data)
    claims_csv = data / literature.CLAIMS
    shipped = claims_csv.read_text(encoding="utf-8")
    others = [line for line in shipped.splitlines() if not line.startswith("lit-")]
    stale = "\n".join(others) + "\n"  # as if written before the lab's runs were recorded
    claims_csv.write_text(stale, encoding="utf-8")
    from blocklab.integrity import record_snapshot

    record_snapshot(data)
    assert literature.refresh(data, check=True) and claims_csv.read_text(encoding="utf-8") == stale
    assert literature.refresh(data)
    verify_snapshot(data)
    again = claims_csv.read_text(encoding="utf-8").splitlines()
    assert again[: len(others)] == others and any(line.startswith("lit-deepnorm-nowarm,") for line in again)
    assert not literature.refresh(data, check=True)


def test_a_builtin_block_adopts_its_recorded_runs_at_the_same_setup_and_its_page_says_so(tmp_path):
    import copy

    from blocklab.lab import records
    from blocklab.lab.report import page, rates
    from blocklab.lab.run import row_of
    from blocklab.lab.spec import make_spec
    from blocklab.params_file import load_params

    params = load_params(ROOT / "params.yaml")
    spec = make_spec(ROOT / "params.yaml", "document", builtin="deepnorm", seeds=[0, 9], warmups=[0])
    assert records.adopt(spec, params, tmp_path, dry_run=True)[0]["run"] == "w0-s0"
    assert not (tmp_path / "runs").exists()  # a dry run copies nothing
    found = records.adopt(spec, params, tmp_path)
    assert [a["run"] for a in found] == ["w0-s0"] and found[0]["from"] == f"{records.RUNS}/deepnorm-w0-s0"
    run = tmp_path / "runs" / "w0-s0"
    assert sorted(p.name for p in run.iterdir()) == ["adopted.json", "loss.csv", "meta.json"]
    assert not (tmp_path / "runs" / "w0-s9").exists()  # not recorded: trained by its job
    row = row_of(spec, run)
    assert row["outcome"] == records.recorded(norm="deepnorm", warmup=0).set_index("seed").loc[0, "outcome"]
    text = page(spec, pd.DataFrame([row]), rates(pd.DataFrame([row])), "-", found)
    assert "Adopted, not retrained" in text and "deepnorm-w0-s0" in text
    assert records.adopt(spec, params, tmp_path) == found  # copied again: newer than a rewritten spec.json
    (run / "adopted.json").unlink()
    assert records.adopt(spec, params, tmp_path) == []  # a run trained there is left as it is
    import yaml

    other = copy.deepcopy(params)
    other["copy_task"]["batch_size"] = 32
    (tmp_path / "b32.yaml").write_text(yaml.safe_dump(other), encoding="utf-8")
    again = make_spec(tmp_path / "b32.yaml", "document", builtin="deepnorm", seeds=[0], warmups=[0])
    assert records.adopt(again, other, tmp_path / "b32") == []  # another setup: retrained
    warm = records.adopt(make_spec(ROOT / "params.yaml", "document", builtin="admin", seeds=[0], warmups=[400, 100]),
                         params, tmp_path / "w400")  # admin-w400-s0 is recorded; no run with warm-up 100 ever is
    assert [a["run"] for a in warm] == ["w400-s0"] and warm[0]["from"] == f"{records.RUNS}/admin-w400-s0"


def test_the_reports_answer_to_11c_says_what_to_do_instead_from_the_literatures_verdicts():
    from blocklab.params_file import load_params
    from blocklab.reporting import answers

    data, claims = answers.load(ROOT / GALLERY, load_params(ROOT / f"{GALLERY}/params.yaml"))
    t = answers.texts()["answers"]["p11c"]
    lit = claims[claims["source"] == "literature"].copy()
    text = answers._instead_text(data, t, "en")
    judged = lit[lit["verdict"] != "not checkable here"]
    assert all(r.id.removeprefix("lit-").removesuffix("-nowarm") in text for r in judged.itertuples())
    # the conclusion follows the verdicts: rewrite them and it changes
    data.tables["claims/claims.csv"] = claims.assign(verdict=claims["verdict"].where(claims["source"] != "literature",
                                                                                        "reproduced"))
    assert "more often than post-norm: deepnorm, admin, b2t, rezero, sandwich" in answers._instead_text(data, t, "en")
    data.tables["claims/claims.csv"] = claims.assign(verdict=claims["verdict"].where(claims["source"] != "literature",
                                                                                        "not reproduced"))
    assert "워밍업 없이 모든 시드에 출발하지 못한" in answers._instead_text(data, t, "ko")
    # each failed fix with its warm-up arm's recorded runs (admin's seed 0 with warm-up 400 is in git)
    import re
    assert re.search(r"admin \(with warm-up 400: learned in \d+ of \d+ runs\)", answers._instead_text(data, t, "en"))
    data.tables["claims/claims.csv"] = claims.assign(verdict=claims["verdict"].where(claims["source"] != "literature",
                                                                                        "not checkable here"))
    assert answers._instead_text(data, t, "en") == t["instead_none"]["en"]
    data.tables["claims/claims.csv"] = claims[claims["source"] != "literature"]
    assert answers._instead_text(data, t, "en") == ""


def _project_with_records(tmp_path, runs):
    """A project root holding copies of recorded runs under the names given (name -> recorded run copied)."""
    import shutil

    from blocklab.lab import records

    for name, source in runs.items():
        shutil.copytree(records.runs_dir() / source, tmp_path / records.RUNS / name)
    return tmp_path


def test_the_lab_tables_and_the_answer_follow_the_records_and_the_verdicts(tmp_path):
    import shutil

    from blocklab.reporting import lab_docs

    data = tmp_path / "data"
    shutil.copytree(ROOT / GALLERY, data)
    root = _project_with_records(tmp_path / "project", {"deepnorm-w0-s0": "deepnorm-w0-s0",
                                                        "deepnorm-w0-s1": "deepnorm-w0-s0",
                                                        "admin-w400-s0": "admin-w400-s0"})
    table = lab_docs.runs_block(data, root)
    assert "| admin | 400 | 1 (seed 0) | 1 of 1 (0.21–1.00) | learned |" in table
    assert "| deepnorm | 0 | 2 (seeds 0, 0) | 2 of 2 (0.34–1.00) |" in table  # the seed is the run's own, not its folder's
    assert "| post | 0 | 3 (seeds 0, 1, 2) | 0 of 3 (0.00–0.56) | never, never, never |" in table  # Wilson, scipy's
    assert "Not recorded yet: b2t, rezero, sandwich." in table
    claims = pd.read_csv(data / "claims" / "claims.csv", dtype=str, keep_default_na=False)
    lit = claims["source"] == "literature"
    claims.loc[lit, "verdict"] = "not reproduced"
    claims.to_csv(data / "claims" / "claims.csv", index=False)
    answer = lab_docs.instead_block(data, root)
    assert "did not start without warm-up in every recorded seed here" in answer
    # the gallery's post-norm with warm-up 400: seed 0 learned, then collapsed (records/gallery/sweep)
    assert "with warm-up 400: pre-norm 3 of 3 learned, post-norm 2 of 3 (1 collapsed after learning)." in answer
    assert "deepnorm, admin (with warm-up 400: 1 of 1 recorded runs learned), b2t, rezero, sandwich" in answer
    assert "`admin`: no run without warm-up recorded yet: **not reproduced** ([`lit-admin-nowarm`](lab.md)); with warm-up 400: " \
        "1 of 1 learned (median step 213; 95 % interval 0.21–1.00, no claim judged on it)" in answer
    assert "`deepnorm`: 2 of 2 recorded runs learned without warm-up" in answer
    claims.loc[lit, "verdict"] = "reproduced"
    claims.to_csv(data / "claims" / "claims.csv", index=False)
    assert "more often than post-norm: deepnorm, admin" in lab_docs.instead_block(data, root)


def test_the_gallerys_lab_figure_is_redrawn_when_a_run_is_recorded(tmp_path):
    import json

    from blocklab.reporting import lab_docs

    data = ROOT / GALLERY
    root = _project_with_records(tmp_path / "project", {"deepnorm-w0-s0": "deepnorm-w0-s0"})
    out = tmp_path / "gallery"
    assert lab_docs.gallery_figures(data, root, out, check=True) == [out / "lab_fixes.png", out / "en" / "lab_fixes.png"]
    assert not out.exists()  # --check draws nothing
    drawn = lab_docs.gallery_figures(data, root, out)
    assert all(p.is_file() and p.with_suffix(".json").is_file() for p in drawn)
    runs = json.loads((out / "lab_fixes.json").read_text())["params"]["runs"]
    assert "deepnorm-w0-s0" in runs and "post-w0-s0" in runs and "pre-w0-s2" in runs and "post-w400-s0" not in runs
    assert lab_docs.gallery_figures(data, root, out, check=True) == []
    # a change to how the figure is drawn redraws it too (the sidecar keys the figure modules' hash)
    sidecar = json.loads((out / "lab_fixes.json").read_text())
    assert sidecar["params"]["figure_code"] == lab_docs.figure_code()
    sidecar["params"]["figure_code"] = "drawn-by-older-code"
    (out / "lab_fixes.json").write_text(json.dumps(sidecar))
    assert lab_docs.gallery_figures(data, root, out, check=True) == [out / "lab_fixes.png"]
    lab_docs.gallery_figures(data, root, out)
    assert lab_docs.gallery_figures(data, root, out, check=True) == []
    _project_with_records(root, {"admin-w0-s0": "admin-w0-s0"})
    assert len(lab_docs.gallery_figures(data, root, out, check=True)) == 2
    curves = lab_docs.gallery_curves(data, root)
    assert set(curves["source"]) == {"lab", "reference"} and set(curves.loc[curves["source"] == "lab", "block"]) == \
        {"deepnorm", "admin"}


def test_lab_job_record_copies_finished_runs_and_says_where_every_run_stands(tmp_path):
    """`blocklab lab-job record`: a finished run's loss.csv and meta.json copied into --to/runs/, checked first; the
    status page lists every run folder (finished: outcome, final loss, wall time; not started) and the run-hours spent,
    the sum of the finished runs' own wall times."""
    import json

    from blocklab.cli import main
    from blocklab.lab.spec import params_for, profile_setup
    from blocklab.params_file import load_params
    from blocklab.training.sweep import train_copy_run

    params = load_params(ROOT / "params.yaml", studies=False)
    setup = profile_setup(params, "tiny", seeds=[0], warmups=[0])
    runs = tmp_path / "runs"
    train_copy_run(params_for(params, setup), "deepnorm", 0, 0, runs / "deepnorm-w0-s0", "cpu")
    (runs / "admin-w0-s1").mkdir()  # started, no checkpoint yet
    status = tmp_path / "STATUS.md"
    assert main(["lab-job", "record", "--runs", str(runs), "--to", str(tmp_path / "rec"), "--status", str(status)]) == 0
    for name in ("loss.csv", "meta.json"):
        assert (tmp_path / "rec/runs/deepnorm-w0-s0" / name).read_bytes() == (runs / "deepnorm-w0-s0" / name).read_bytes()
    assert not (tmp_path / "rec/runs/admin-w0-s1").exists()
    page = status.read_text(encoding="utf-8")
    wall = json.loads((runs / "deepnorm-w0-s0/meta.json").read_text())["wall_time_s"]
    steps = len(pd.read_csv(runs / "deepnorm-w0-s0/loss.csv"))
    assert re.search(rf"^\| deepnorm-w0-s0 \| finished \| {steps} \| \w+ \| [\d.e+-]+ \| {wall / 3600:.2f} \| ", page, re.M)
    assert "| admin-w0-s1 | not started | 0 |" in page
    assert f"Spent so far: {wall / 3600:.1f} run-hours on the 1 finished runs" in page
    # a runs folder without that run (a new machine, a cleared folder) keeps it on the page, from the record
    other = tmp_path / "runs-elsewhere"
    (other / "admin-w0-s2").mkdir(parents=True)
    assert main(["lab-job", "record", "--runs", str(other), "--to", str(tmp_path / "rec"), "--status", str(status)]) == 0
    page = status.read_text(encoding="utf-8")
    assert re.search(rf"^\| deepnorm-w0-s0 \| finished, recorded \| {steps} \| \w+ \| [\d.e+-]+ \| {wall / 3600:.2f} \| ",
                     page, re.M)
    assert "| admin-w0-s2 | not started | 0 |" in page and "admin-w0-s1" not in page
    assert f"Spent so far: {wall / 3600:.1f} run-hours on the 1 finished runs" in page
    # a damaged finished run is refused (exit 3), naming it, and nothing of it is copied
    (runs / "deepnorm-w0-s0/loss.csv").write_text("step,loss\n1,0.5\n", encoding="utf-8")
    assert main(["lab-job", "record", "--runs", str(runs), "--to", str(tmp_path / "rec2"), "--status", str(status)]) == 3
    assert not (tmp_path / "rec2/runs/deepnorm-w0-s0").exists()


# ---- the learning-rate sensitivity (lab.lrsweep) ---------------------------------------------------------------------


def test_lr_sensitivity_is_wortsmans_measure_on_hand_made_curves():
    """Wortsman et al. 2023: mean over the grid of min(loss, loss at init) - the best loss. A flat curve scores 0; a
    block that learns at one rate only scores near (chance - best) x 4/5; a diverged rate counts as chance, no more;
    the interval over seeds is scipy's t interval."""
    from blocklab.lab import lrsweep

    chance = math.log(64)
    lrs = list(lrsweep.LRS)
    flat = pd.Series([0.01] * 5, index=lrs)
    assert lrsweep.sensitivity(flat, chance) == 0.0
    narrow = pd.Series([chance, chance, 0.01, chance, chance], index=lrs)
    assert lrsweep.sensitivity(narrow, chance) == pytest.approx((chance - 0.01) * 4 / 5)
    blown = pd.Series([0.5, 0.1, 0.01, 0.2, 1e9], index=lrs)  # 1e9: worse than chance, clamped to it
    assert lrsweep.sensitivity(blown, chance) == pytest.approx((0.49 + 0.09 + 0 + 0.19 + chance - 0.01) / 5)
    assert lrsweep.final_loss([1, 2, 3], [4.0, 3.0, float("nan")], 64, diverged_step=3) == chance
    assert lrsweep.final_loss(list(range(1, 21)), [1.0] * 10 + [0.5] * 10, 64) == 0.5  # the last 10 steps
    with pytest.raises(ConfigError, match="not a finished run"):
        lrsweep.final_loss([1, 2], [1.0, 1.0], 64, steps_planned=300)
    values = [0.2, 0.4, 0.9]
    mean, low, high = lrsweep.t_interval(values)
    sem = stats.sem(values)
    assert (low, high) == pytest.approx(stats.t.interval(0.95, 2, loc=np.mean(values), scale=sem))
    runs = pd.DataFrame([{"block": b, "lr": lr, "seed": s, "final_loss": c.iloc[i] + 0.001 * s}
                         for b, c in (("pre", flat), ("post", narrow)) for s in (0, 1, 2) for i, lr in enumerate(lrs)])
    table = lrsweep.table(runs, chance).set_index("block")
    assert table.loc["pre", "seeds"] == 3 and table.loc["pre", "lr_sensitivity"] == pytest.approx(0.0)
    assert table.loc["post", "lr_sensitivity"] > 3 and table.loc["post", "best_lr"] == 1e-3
    assert lrsweep.ranking(table.reset_index(), ["pre"], ["post"])[0] == "agrees decisively"
    assert lrsweep.ranking(table.reset_index(), ["post"], ["pre"]) == (
        "disagrees", f"1 of the 1 learning block is not below pre (0.000): post {table.loc['post', 'lr_sensitivity']:.3f}")
    assert lrsweep.ranking(table.reset_index().iloc[:1], ["pre"], ["post"])[0] == "not yet"
    part = runs[~((runs["block"] == "pre") & (runs["seed"] == 2) & (runs["lr"] == 1e-2))]  # one rate of one seed missing
    assert lrsweep.table(part, chance).set_index("block").loc["pre", "seeds"] == 2  # a seed counts with its whole grid
    with pytest.raises(ConfigError, match="counted twice"):
        lrsweep.table(pd.concat([runs, runs.iloc[:1]]), chance)
    # a block that learns nowhere: its ℓ* is near chance, so its excess over it is small; the runs that learned say so
    stuck = pd.Series([chance - 0.3, chance, chance, chance, chance], index=lrs)
    runs = pd.DataFrame([{"block": b, "lr": lr, "seed": 0, "final_loss": c.iloc[i], "learned": c.iloc[i] < 0.1 * chance}
                         for b, c in (("pre", narrow), ("post", stuck)) for i, lr in enumerate(lrs)])
    table = lrsweep.table(runs, chance).set_index("block")
    assert table.loc["post", "lr_sensitivity"] < table.loc["pre", "lr_sensitivity"]  # the blind spot, as measured
    assert (table.loc["post", "runs_learned"], table.loc["pre", "runs_learned"], table.loc["pre", "runs"]) == (0, 1, 5)


def test_the_lr_studys_cost_line_projects_from_seconds_a_step_measured_in_the_recorded_runs():
    """docs/lab.md's cost of the LR study: from each recorded run's own seconds a step (its wall time over the steps it
    ran: a diverged run stops early), read here from the runs' meta.json and loss.csv directly."""
    from blocklab.lab import lrsweep
    from blocklab.records import GALLERY, LAB_LR_RUNS
    from blocklab.reporting.lab_docs import lr_block

    rates, planned, cells = [], set(), {}
    for meta_file in sorted((ROOT / LAB_LR_RUNS).glob("*/meta.json")):
        meta = json.loads(meta_file.read_text())
        rates.append(meta["wall_time_s"] / len(pd.read_csv(meta_file.with_name("loss.csv"))))
        planned.add(meta["sweep"]["steps"])
        cells.setdefault((meta["norm"], float(meta["sweep"]["lr"])), []).append(rates[-1])
    if not rates:
        pytest.skip("no run of the LR study recorded")
    left = len(lrsweep.plan()) - len(rates)
    block = lr_block(ROOT / GALLERY, ROOT)
    assert f"from {min(rates):.2f} to {max(rates):.2f}, median {np.median(rates):.2f}" in block, block
    (block_, lr), slowest = max(((k, np.median(v)) for k, v in cells.items()), key=lambda kv: kv[1])
    assert f"the slowest cell, {block_} at lr {lr:g}: median {slowest:.2f} s a step" in block, block
    if left:
        assert f"about {left * planned.pop() * min(rates) / 7200:.1f} wall-hours if every run went at the fastest rate" in block, block
    else:
        assert f"for all {len(rates)} planned runs" in block and "left" not in block.split("Cost:")[1].split("\n")[0], block
    # the blocks named as learning nowhere are those none of whose recorded runs learned (the lab's outcome rule)
    from blocklab.lab.outcomes import outcome

    learned = {}
    for meta_file in sorted((ROOT / LAB_LR_RUNS).glob("*/meta.json")):
        meta, loss = json.loads(meta_file.read_text()), pd.read_csv(meta_file.with_name("loss.csv"))
        got = outcome(loss["step"].tolist(), loss["loss"].tolist(), meta["copy_task"]["vocab_size"],
                      meta.get("diverged_step"))["outcome"]
        learned.setdefault(meta["norm"], []).append(got == "learned")
    nowhere = [b for b in lrsweep.BLOCKS if b in learned and not any(learned[b])]
    said = block.split("Read with it:")[1] if "Read with it:" in block else ""
    for b in lrsweep.BLOCKS:
        assert (f"{b}, 0 of {len(learned.get(b, []))} runs learned" in said) == (b in nowhere), (b, said)


def test_gradient_underflow_counts_subnormal_entries_per_block():
    """`lab.underflow`: an entry is subnormal when non-zero and below float32's smallest normal number; a block's
    gradient scaled into that range is counted there and nowhere else."""
    import torch

    from blocklab.lab.underflow import SUBNORMAL_BELOW, backward_underflow, gradient_underflow, subnormal
    from blocklab.model.models import DecoderLM
    from blocklab.model_config import ModelConfig

    assert SUBNORMAL_BELOW == pytest.approx(1.1754944e-38)
    assert subnormal(torch.tensor([0.0, 1e-39, -1e-40, 1e-30, 2e-38, float("nan")])) == 2
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(d_model=16, n_heads=2, n_layers=3, vocab_size=11, max_len=8,
                                  norm_position="post"))
    model(torch.randint(0, 11, (2, 8))).float().square().mean().backward()
    parts = gradient_underflow(model).set_index("part")
    assert set(parts.index) == {"other", "block 0", "block 1", "block 2"}
    assert parts["subnormal"].sum() == 0
    entries = sum(p.numel() for p in model.blocks[1].parameters())
    assert parts.loc["block 1", "entries"] == entries
    for p in model.blocks[1].parameters():
        p.grad.mul_(1e-39 / p.grad.abs().max().clamp_min(1e-30))  # every entry now at most 1e-39 in size
    parts = gradient_underflow(model).set_index("part")
    nonzero = sum(int((p.grad != 0).sum()) for p in model.blocks[1].parameters())
    assert parts.loc["block 1", "subnormal"] == nonzero > entries // 2
    assert parts.drop("block 1")["subnormal"].sum() == 0
    # the backward stream: a loss scaled into float32's subnormal range sends subnormal gradients out of every layer
    x = torch.randint(0, 11, (2, 8))

    def step(scale):
        return lambda: (model.zero_grad(set_to_none=True), (model(x).float().square().mean() * scale).backward())

    plain = backward_underflow(model, step(1.0))
    tiny = backward_underflow(model, step(1e-36)).set_index("part")
    assert plain["subnormal"].sum() == 0 and set(plain["part"]) == {"other", "block 0", "block 1", "block 2"}
    assert (tiny["subnormal"] > tiny["entries"] / 10).all(), tiny


def test_the_underflow_summary_reads_cells_against_the_runs_without_subnormals():
    """`lab.underflow.summary`: a cell a (block, lr) with any subnormal entry, with its ranges; the control is every
    run with none; Spearman's rho over all runs."""
    from scipy import stats

    from blocklab.lab.underflow import summary

    rows = [("post-a", "post", 0.01, 0.2, 0.15, 8, 5.0, 0.4, 8.0), ("post-b", "post", 0.01, 0.09, 0.001, 0, 3.2, 0.4, 3.0),
            ("pre-a", "pre", 0.01, 0.007, 0.0, 0, 0.6, 0.4, 0.5), ("pre-b", "pre", 0.001, 0.0, 0.0, 0, 0.41, 0.4, 0.42),
            ("rezero-a", "rezero", 0.001, 0.0, 0.0, 0, 0.38, 0.4, 0.39)]
    table = pd.DataFrame([{"run": r, "block": b, "lr": lr, "subnormal_backward": sb, "subnormal_params": sp,
                           "blocks_underflowing": k, "n_blocks": 24, "s_kept": kept, "s_flushed": fl,
                           "s_per_step_trained": st} for r, b, lr, sb, sp, k, kept, fl, st in rows])
    said = summary(table)
    assert (said["runs"], said["with_any"], said["underflowing"]) == (5, 3, 1)
    cells = said["cells"].set_index(["block", "lr"])
    assert list(cells.index) == [("post", 0.01), ("pre", 0.01)]
    post = cells.loc[("post", 0.01)]
    assert post["runs"] == 2 and (post["ratio_low"], post["ratio_high"]) == pytest.approx((8.0, 12.5))
    assert (post["blocks_low"], post["blocks_high"], post["s_low"], post["s_high"]) == (0, 8, 3.0, 8.0)
    assert said["control"]["runs"] == 2 and said["control"]["ratio"] == pytest.approx((0.41 / 0.4 + 0.38 / 0.4) / 2)
    assert said["control"]["ratio_max"] == pytest.approx(0.41 / 0.4)
    rho, _ = stats.spearmanr(table["subnormal_backward"], table["s_kept"] / table["s_flushed"])
    assert said["rho"] == pytest.approx(rho) and rho > 0.8


def test_the_underflow_probe_reads_a_finished_run_and_refuses_bad_input_first(tmp_path):
    """`blocklab lab-job underflow`: one row a finished run (its block, lr, seed, seconds a step in training, subnormal
    share, blocks underflowing out of the stack's, seconds a pass kept and flushed), its CSV checksummed; a folder
    without finished runs, or --repeats 0, is refused before any compute."""
    import subprocess

    blocklab = str(Path(sys.executable).with_name("blocklab"))
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([blocklab, "lab-job", "underflow", "--runs", str(empty), "--out", str(tmp_path / "u.csv")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "holds no finished run" in bad.stderr and not (tmp_path / "u.csv").exists()
    bad = subprocess.run([blocklab, "lab-job", "underflow", "--runs", str(empty), "--out", str(tmp_path / "u.csv"),
                          "--repeats", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--repeats must be 1 or more" in bad.stderr
    runs = tmp_path / "runs"
    trained = subprocess.run([blocklab, "lab-job", "lr-run", "--norm", "post", "--lr", "0.01", "--seed", "0",
                              "--profile", "tiny", "--out-dir", str(runs / "post-lr0.01-w0-s0"),
                              "--params", str(ROOT / "params.yaml")], capture_output=True, text=True)
    assert trained.returncode == 0, trained.stderr[-2000:]
    done = subprocess.run([blocklab, "lab-job", "underflow", "--runs", str(runs), "--out", str(tmp_path / "u.csv"),
                           "--repeats", "1"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    from blocklab.io import read_table
    from blocklab.lab.underflow import COLUMNS

    table = read_table(tmp_path / "u.csv")
    meta = json.loads((runs / "post-lr0.01-w0-s0" / "meta.json").read_text())
    assert list(table.columns) == COLUMNS and len(table) == 1
    row = table.iloc[0]
    assert (row["run"], row["block"], row["lr"], row["seed"]) == ("post-lr0.01-w0-s0", "post", 0.01, 0)
    assert row["n_blocks"] == meta["model_config"]["n_layers"] and 0 <= row["blocks_underflowing"] <= row["n_blocks"]
    assert 0 <= row["subnormal_backward"] <= 1 and 0 <= row["subnormal_params"] <= 1 and row["s_kept"] > 0
    steps = len(pd.read_csv(runs / "post-lr0.01-w0-s0" / "loss.csv"))
    assert row["s_per_step_trained"] == pytest.approx(meta["wall_time_s"] / steps)
    made = json.loads((tmp_path / "u.json").read_text())  # what made the table: its command and code
    assert made["rows"] == 1 and made["code"]["blocklab_source_sha256"] and "--repeats 1" in made["command"]
    assert f"{int(row['subnormal_backward'] > 0)} of 1 runs have subnormal entries in their backward pass, " \
        f"{int(row['blocks_underflowing'] > 0)} a block with over 1 % of them" in done.stderr


def test_the_recorded_underflow_table_bears_out_what_the_lab_page_says_of_it():
    """docs/lab.md says of records/lab/lr-sweep/underflow.csv: post-norm at lr 0.01 is the one cell whose runs have
    over a percent of their backward-pass entries subnormal, and the one several times slower with them kept; flushed,
    its pass is as fast as the others'. Read from the recorded table (in git)."""
    from blocklab.io import read_table
    from blocklab.records import LAB_LR_UNDERFLOW

    path = ROOT / LAB_LR_UNDERFLOW
    if not path.is_file():
        pytest.skip("the underflow probe is not recorded")
    table = read_table(path).assign(ratio=lambda t: t["s_kept"] / t["s_flushed"])
    hit = table["subnormal_backward"] > 0.01
    assert set(map(tuple, table.loc[hit, ["block", "lr"]].values)) == {("post", 0.01)}
    assert hit.sum() == 3 and table.loc[hit, "ratio"].min() > 3 > table.loc[~hit, "ratio"].max()
    assert table.loc[hit, "s_flushed"].max() < 1.5 * table.loc[~hit, "s_flushed"].median()
    assert "Why one cell is slow" in (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
