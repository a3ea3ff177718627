"""Training-time diagnostics: they never change the losses, each metric equals an independent computation,
they survive a resume, and bad settings fail before any compute. Plus the collapse events and their Wilson interval."""
import copy
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from blocklab import ModelConfig
from blocklab.studies.dynamics.aggregate import rates, wilson
from blocklab.studies.dynamics.plan import plan
from blocklab.studies.dynamics.plan import collapse_stop, events
from blocklab.model_config import ConfigError
from blocklab.params_file import ParamsError, load_params, validate_params  # every study's checks too
from blocklab.integrity import record_snapshot, run_record, seal_meta
from blocklab.training.diagnostics import METRICS, Recorder
from blocklab.training.copy_model import build_copy_model
from blocklab.training.sweep import train_copy_run
from blocklab.training.tasks import copy_batch, copy_loss
from blocklab.training.train import train

ROOT = Path(__file__).resolve().parents[1]
TINY = load_params(ROOT / "configs/tiny.yaml")
FULL = load_params(ROOT / "params.yaml")


def _tiny(steps=30, enabled=True, every=5):
    params = copy.deepcopy(TINY)
    params["sweep"]["steps"] = steps
    params["diagnostics"].update(enabled=enabled, every=every)
    return params


@pytest.mark.parametrize("norm, warmup", [("post", 20), ("pre", 0)])
def test_losses_are_bit_identical_with_and_without_diagnostics(tmp_path, norm, warmup):
    off = train_copy_run(_tiny(enabled=False), norm, warmup, 0, tmp_path / "off")
    on = train_copy_run(_tiny(enabled=True), norm, warmup, 0, tmp_path / "on")
    loss_off = pd.read_csv(tmp_path / "off" / "loss.csv")["loss"].tolist()
    loss_on = pd.read_csv(tmp_path / "on" / "loss.csv")["loss"].tolist()
    assert loss_off == loss_on  # exact: the diagnostics only read
    assert off["diagnostics"] is None and on["diagnostics"]["from_step"] == 1
    assert pd.read_parquet(tmp_path / "off" / "diagnostics.parquet").empty  # not recorded, and says so
    table = pd.read_parquet(tmp_path / "on" / "diagnostics.parquet")
    blocks = TINY["copy_model"]["n_layers"]
    counts = table.groupby("metric").size()
    for name, metric in METRICS.items():
        per_step = blocks if metric.scope == "block" else 1
        steps = 30 if metric.cadence == "step" else len([s for s in range(1, 31) if s == 1 or s % 5 == 0])
        assert counts[name] == per_step * steps, name


def test_the_metric_list_is_the_one_list_the_schema_and_the_recorder_follow(tmp_path):
    """A new metric is one entry of ``METRICS`` (name, when it is read, how): params.schema.yaml's enum must name the
    same metrics in the same order, and the Recorder reads each wanted metric at its moment in that order."""
    schema = yaml.safe_load((ROOT / "src/blocklab/params.schema.yaml").read_text(encoding="utf-8"))
    enum = schema["properties"]["diagnostics"]["properties"]["metrics"]["items"]["enum"]
    assert enum == list(METRICS)
    assert {m.when for m in METRICS.values()} <= {"gradient", "optimizer", "update", "forward", "output"}
    train_copy_run(_tiny(steps=2, every=1), "post", 0, 0, tmp_path)
    table = pd.read_parquet(tmp_path / "diagnostics.parquet")
    step = table[table["step"] == 2]
    moments = ["forward", "output", "gradient", "optimizer", "update"]  # as a step reaches them
    order = [name for when in moments for name, m in METRICS.items() if m.when == when]
    first_rows = step.drop_duplicates("metric")["metric"].tolist()
    assert [m for m in order if m in first_rows] == first_rows  # grouped by moment, in METRICS order


def test_a_dense_window_records_the_forward_metrics_at_every_step_of_it_and_changes_no_loss(tmp_path):
    """The re-run of the steps before an event (`dynamics train --dense FIRST:LAST`): every forward metric at every step
    of the window, on the usual cadence elsewhere; the losses bit-identical to the run without the window."""
    plain = train_copy_run(_tiny(), "post", 20, 0, tmp_path / "plain")
    dense = train_copy_run(_tiny(), "post", 20, 0, tmp_path / "dense", dense_steps=(12, 17))
    assert pd.read_csv(tmp_path / "plain" / "loss.csv").equals(pd.read_csv(tmp_path / "dense" / "loss.csv"))
    assert "dense_steps" not in plain["diagnostics"] and dense["diagnostics"]["dense_steps"] == [12, 17]
    table = pd.read_parquet(tmp_path / "dense" / "diagnostics.parquet")
    steps = sorted(table.loc[table["metric"] == "attn_logit_max", "step"].unique())
    assert steps == [1, 5, 10, 12, 13, 14, 15, 16, 17, 20, 25, 30]  # every 5, and every step of 12..17
    from blocklab.studies.dynamics.run import parse_window

    assert parse_window("450:600", 1200) == (450, 600) and parse_window(None, 1200) is None
    for bad in ("600:450", "0:10", "10:1300", "ten"):
        with pytest.raises(ConfigError, match="--dense"):
            parse_window(bad, 1200)


def test_a_snapshot_at_every_step_keeps_every_recorded_step(tmp_path):
    """`dynamics snapshot --every-step`: a run recorded at every step keeps all of it (the detectors' false alarms
    need the loss's own resolution); the default snapshot thins it (kept_steps)."""
    from blocklab.studies.dynamics.aggregate import write_snapshot
    from blocklab.studies.dynamics.plan import plan as dynamics_plan, read_snapshots

    params = _tiny(steps=TINY["sweep"]["steps"], every=1)
    row = dynamics_plan(params).iloc[0]
    train_copy_run(params, row["norm"], int(row["warmup"]), int(row["seed"]), tmp_path / row["run_dir"])
    recorded = pd.read_parquet(tmp_path / row["run_dir"] / "diagnostics.parquet")
    write_snapshot(params, tmp_path / "all", root=tmp_path, thinned=False)
    write_snapshot(params, tmp_path / "thin", root=tmp_path)
    every = read_snapshots([tmp_path / "all"])[2]
    thin_ = read_snapshots([tmp_path / "thin"])[2]
    assert len(every) == len(recorded) and set(every["step"]) == set(range(1, TINY["sweep"]["steps"] + 1))
    assert set(thin_["step"]) <= set(every["step"])  # (the tiny run's 60 steps are all within the kept early steps)


def _one_step(seed=0, n_layers=2):
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=n_layers, vocab_size=12, max_len=12)
    model = build_copy_model(cfg, seed)
    batch = copy_batch(4, 6, 12, torch.Generator().manual_seed(seed))
    return cfg, model, batch


def test_gradient_and_update_metrics_equal_an_independent_computation():
    cfg, model, batch = _one_step()
    reference = copy.deepcopy(model)
    # the reference: one plain Adam step, gradients and weights read directly
    opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    copy_loss(reference(batch[0]), batch[1]).backward()
    grads = {i: torch.linalg.vector_norm(b.ffn.sublayer.down.weight.grad).item() for i, b in enumerate(reference.blocks)}
    attn = {i: torch.cat([p.grad.flatten() for p in b.attn.parameters()]).norm().item() for i, b in enumerate(reference.blocks)}
    before = {i: torch.cat([p.detach().flatten().clone() for p in b.parameters()]) for i, b in enumerate(reference.blocks)}
    opt.step()
    ratio = {i: ((torch.cat([p.detach().flatten() for p in b.parameters()]) - before[i]).norm() / before[i].norm()).item()
             for i, b in enumerate(reference.blocks)}

    recorder = Recorder(model, every=1)
    train(model, lambda g: batch, lambda m, b: copy_loss(m(b[0]), b[1]), steps=1, lr=1e-2, warmup=0,
          generator=torch.Generator(), diagnostics=recorder)
    got = recorder.table().set_index(["metric", "block"])["value"]
    # foreach norms vs one concatenated norm: the same sums in another order, float32 rounding (~1e-7 relative)
    for i in range(cfg.n_layers):
        assert got["grad_ffn_out", i] == pytest.approx(grads[i], rel=1e-5)
        assert got["grad_attn", i] == pytest.approx(attn[i], rel=1e-5)
        assert got["update_ratio", i] == pytest.approx(ratio[i], rel=1e-4)  # a difference of close weights: 1e-4
        assert math.isnan(got["adam_rms", i])  # no second-moment estimate before the first step


def test_adam_rms_is_one_when_the_gradient_never_changes():
    # with a constant gradient g, Adam's bias-corrected v_hat equals g^2 exactly in real arithmetic: g^2 / v_hat = 1
    cfg, model, batch = _one_step()
    recorder = Recorder(model, metrics=["adam_rms"], every=1)
    fixed = {}

    def loss_fn(m, b):
        return sum((p * fixed.setdefault(n, torch.randn_like(p))).sum() for n, p in m.named_parameters())

    train(model, lambda g: batch, loss_fn, steps=4, lr=1e-3, warmup=0, generator=torch.Generator(), diagnostics=recorder)
    values = recorder.table().query("step > 1")["value"]
    assert len(values) == 3 * cfg.n_layers
    assert values.tolist() == pytest.approx([1.0] * len(values), rel=1e-4)  # float32 EMA of g^2: ~1e-6; 1e-4 margin


def test_attention_metrics_on_a_hand_made_uniform_attention():
    # zero query weights: every logit is 0, so causal attention is uniform over the t+1 visible tokens
    cfg, model, batch = _one_step(n_layers=1)
    attention = model.blocks[0].attn.sublayer
    with torch.no_grad():
        attention.q.weight.zero_()
        attention.q.bias.zero_()
    recorder = Recorder(model, metrics=["attn_entropy", "attn_logit_max", "stream_norm", "output_logit_max"], every=1)
    with recorder.watch(1):
        logits = model(batch[0])
    got = recorder.table().set_index("metric")["value"]
    time_ = batch[0].shape[1]
    assert got["attn_entropy"] == pytest.approx(sum(math.log(t + 1) for t in range(time_)) / time_, rel=1e-6)
    assert got["attn_logit_max"] == 0.0
    stream = model.position(model.embed(batch[0]))
    assert got["stream_norm"] == pytest.approx(stream.norm(dim=-1).mean().item(), rel=1e-6)
    assert got["output_logit_max"] == pytest.approx(logits.max().item(), rel=1e-6)


@pytest.mark.parametrize("time_", [2, 8, 63, 64])
def test_the_attention_entropy_from_row_maxima_equals_entr_in_float64(time_):
    """_causal_stats takes one log a row (the row's largest score and weight) and reads rows through an overlapping
    view: against entr of the weights in float64 and amax row by row, from uniform to nearly one-hot rows, in every
    head (row 0 of each head is the view's special case), contiguous or not; a NaN score stays NaN."""
    from blocklab.training.diagnostics import _causal_stats, _row_max

    gen = torch.Generator().manual_seed(time_)
    mask = torch.full((time_, time_), float("-inf")).triu_(1)
    for scale in (0.0, 1.0, 30.0, 300.0):
        q, k = torch.randn(12, time_, 8, generator=gen) * scale, torch.randn(12, time_, 8, generator=gen)
        scores = torch.baddbmm(mask, q, k.transpose(-1, -2), alpha=8**-0.5)
        probs = scores.softmax(-1)
        assert torch.equal(_row_max(scores), scores.amax(-1).flatten())
        assert torch.equal(_row_max(probs), probs.amax(-1).flatten())
        for s, p in ((scores, probs), (scores.view(3, 4, time_, time_), probs.view(3, 4, time_, time_)),
                     (scores[::2], probs[::2])):
            entropy, largest = _causal_stats(s, p)
            spare = s.clone()  # the fast attention's way: m - s written over its dead scores, the same values
            assert all(torch.equal(a, b) for a, b in zip(_causal_stats(spare, p, scratch=True), (entropy, largest)))
            want = torch.special.entr(p.double()).sum(-1).mean().item()
            assert entropy.item() == pytest.approx(want, rel=1e-6, abs=1e-12)
            assert largest.item() == s.max().item()
    scores[5, time_ - 1, 0] = float("nan")
    assert all(math.isnan(x.item()) for x in _causal_stats(scores, scores.softmax(-1)))


def test_diagnostics_survive_a_resume(tmp_path):
    params = _tiny(steps=40)
    params["sweep"]["checkpoint_every"] = 10
    whole = tmp_path / "whole"
    train_copy_run(params, "post", 20, 1, whole)
    # interrupt after the checkpoint at step 20: the resumed run must record the same table
    killed = tmp_path / "killed"
    calls = {"n": 0}
    import blocklab.training.sweep as sweep

    real = sweep.copy_batch

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 25:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    sweep.copy_batch = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            train_copy_run(params, "post", 20, 1, killed)
    finally:
        sweep.copy_batch = real
    assert (killed / "checkpoint.pt").exists() and not (killed / "meta.json").exists()
    meta = train_copy_run(params, "post", 20, 1, killed)
    assert meta["resumed_from_step"] == 20 and meta["diagnostics"]["from_step"] == 1
    pd.testing.assert_frame_equal(pd.read_parquet(whole / "diagnostics.parquet"),
                                  pd.read_parquet(killed / "diagnostics.parquet"))


@pytest.mark.parametrize("edit, key, allowed", [
    (lambda p: p["diagnostics"].update(metrics=["grad_norm"]), "diagnostics.metrics[0]", "allowed values"),
    (lambda p: p["diagnostics"].update(metrics=[]), "diagnostics.metrics", "at least 1"),
    (lambda p: p["diagnostics"].update(metrics=["adam_rms", "adam_rms"]), "diagnostics.metrics", "repeated"),
    (lambda p: p["diagnostics"].update(every=0), "diagnostics.every", ">= 1"),
    (lambda p: p["dynamics"]["collapse"].update(seeds=[]), "dynamics.collapse.seeds", "at least 1"),
    (lambda p: p["dynamics"]["collapse"].update(seeds=[3, 3]), "dynamics.collapse.seeds", "repeated"),
    (lambda p: p["dynamics"]["collapse"].update(settings=["learned-32"]), "dynamics.collapse.settings[0]", "b{batch}"),
    (lambda p: p["dynamics"]["events"].update(collapse_for=5000), "dynamics.events.collapse_for", "never fire"),
    (lambda p: p["dynamics"]["events"].update(spike_above=3.9), "dynamics.events.spike_above", "collapse level"),
    (lambda p: p["dynamics"]["events"].update(learned_below=0.6), "dynamics.events.learned_below", "every learned run"),
    (lambda p: p["dynamics"]["events"].update(collapse_at=1.5), "dynamics.events.collapse_at", "<= 1"),
    (lambda p: p["dynamics"].update(from_snapshots=["no/such/dir"]), "dynamics.from_snapshots", "dynamics snapshot"),
    (lambda p: p["inference"].update(skip=["learned-b99"]), "inference.skip[0]", "'learned-b16'"),
    (lambda p: p["inference"].update(positions=["learned"], batch_sizes=[16], skip=["learned-b16"]),
     "inference.skip", "a subset of"),
    (lambda p: p["inference"].update(from_snapshots=["no/such/dir"]), "inference.from_snapshots[0]", "inference snapshot"),
    (lambda p: p["inference"].update(seeds=[1, 1]), "inference.seeds", "repeated"),
])
def test_bad_diagnostics_and_dynamics_parameters_name_the_key_and_the_allowed_values(edit, key, allowed):
    params = copy.deepcopy(FULL)
    params["dynamics"]["from_snapshots"] = []
    edit(params)
    with pytest.raises(ParamsError) as err:
        validate_params(params)
    assert key in str(err.value) and allowed in str(err.value), str(err.value)


def test_skipped_candidates_are_named_by_position_and_batch_so_other_depths_still_validate():
    params = copy.deepcopy(FULL)
    params["copy_model"]["n_layers"] = 3  # the candidates become ...-L3-...; the skip list still names them
    params["sensitivity"]["from_snapshots"] = params["dynamics"]["from_snapshots"] = []  # (recorded at depth 24 only)
    from blocklab.studies.inference import plan as inference

    validate_params(params)
    assert not any(s.startswith(("sinusoidal-b64-", "sinusoidal-b128-")) for s in inference.plan(params)["setting"])


def test_a_bad_setting_fails_before_any_compute_and_touches_nothing(tmp_path):
    from blocklab.cli import main

    out = tmp_path / "run"
    out.mkdir()
    (out / "marker").write_text("kept")
    bad = copy.deepcopy(TINY)
    bad["diagnostics"]["every"] = -3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad, allow_unicode=True), encoding="utf-8")
    assert main(["dynamics", "train", "--params", str(path), "--cell", "learned-b8-L3-lr0.001-fp32", "--seed", "0",
                 "--out-dir", str(out)]) == 2
    assert main(["sweep", "train", "--params", str(path), "--norm", "post", "--warmup", "0", "--seed", "0",
                 "--out-dir", str(out)]) == 2
    # a fitting run outside the inference plan (a batch size the candidates do not list)
    assert main(["inference", "train", "--params", str(ROOT / "params.yaml"), "--cell", "learned-b999-L24-lr0.001-fp32",
                 "--norm", "post", "--warmup", "400", "--seed", "0", "--out-dir", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["marker"]


# ---- events and rates ------------------------------------------------------------------------------------------------

RULE = {"learned_below": 0.05, "learned_for": 3, "spike_above": 0.5, "collapse_at": 0.9, "collapse_for": 4}
CHANCE = math.log(64)


@pytest.mark.parametrize("losses, outcome, learned, spike, collapse, to_chance", [
    ([4.1] * 12, "never learned", None, None, None, False),
    ([4.1, 1.0, 0.04, 0.03, 0.02, 0.01, 0.01, 0.01], "stable", 3, None, None, False),
    ([4.1, 0.04, 0.03, 0.02, 0.01, 0.9, 0.2, 0.01, 0.01], "spiked", 2, 6, None, False),
    ([4.1, 0.04, 0.03, 0.02, 0.7, 4.3, 4.2, 3.9, 4.0, 4.1], "collapsed", 2, 5, 6, True),
    # back at chance for 3 steps only (collapse_for is 4), then recovered: a spike, not a collapse, but at chance once
    ([4.1, 0.04, 0.03, 0.02, 4.3, 4.2, 4.0, 0.02, 0.01], "spiked", 2, 5, None, True),
    # 0.9 x ln 64 = 3.743: a spike to 3.7 does not reach chance
    ([4.1, 0.04, 0.03, 0.02, 3.7, 0.02, 0.01], "spiked", 2, 5, None, False),
    # at chance before it learned is not a collapse
    ([4.2, 4.2, 4.2, 4.2, 4.2, 0.04, 0.03, 0.02, 0.01], "stable", 6, None, None, False),
])
def test_events_on_hand_made_loss_curves(losses, outcome, learned, spike, collapse, to_chance):
    got = events(losses, range(1, len(losses) + 1), RULE, 64)
    assert got["outcome"] == outcome and got["reached_chance"] is to_chance
    for key, want in (("learned_step", learned), ("spike_step", spike), ("collapse_step", collapse)):
        assert (math.isnan(got[key]) if want is None else got[key] == want), (key, got)


def test_collapse_stop_fires_at_the_step_the_collapse_is_complete():
    params = {"dynamics": {"events": RULE}, "copy_task": {"vocab_size": 64}}
    stop, words = collapse_stop(params)
    curve = [4.1, 0.04, 0.03, 0.02, 0.7, 4.3, 4.2, 3.9, 4.0, 4.1]
    fired = [n for n in range(1, len(curve) + 1) if stop(curve[:n])]
    assert fired[0] == 9  # collapse starts at step 6 and has lasted 4 steps at step 9
    assert not any(stop([4.2] * n) for n in range(1, 30))  # never learned: never stopped
    assert "collapsed" in words and "100" not in words


def test_wilson_interval_matches_the_closed_form_values():
    # hand-computed from the closed form: 1 of 3 -> 6 %-79 %, 0 of 3 -> 0 %-56 % (95 %)
    low, high = wilson(1, 3)
    assert (round(low, 3), round(high, 3)) == (0.061, 0.792)
    low, high = wilson(0, 3)
    assert low == 0.0 and round(high, 3) == 0.561
    assert wilson(10, 10)[1] == 1.0 and all(math.isnan(x) for x in wilson(0, 0))


def test_rates_count_only_runs_that_learned():
    summary = pd.DataFrame({"collapse": True, "setting": "s", "seed": range(5),
                            "outcome": ["collapsed", "stable", "spiked", "never learned", "stable"],
                            "reached_chance": [True, False, True, False, False]})
    row = rates(summary).iloc[0]
    assert (row["runs"], row["learned"], row["collapsed"], row["spiked"], row["to_chance"]) == (5, 4, 1, 1, 2)
    assert (row["to_chance_low"], row["to_chance_high"]) == pytest.approx(wilson(2, 4))
    assert (row["collapsed_low"], row["collapsed_high"]) == pytest.approx(wilson(1, 4))


def test_the_anatomy_dissects_the_first_setting_with_a_collapse_else_a_spike_else_the_default():
    from blocklab.studies.dynamics.figures import anatomy_setting

    def summary(*rows):  # (setting, outcome, in the collapse group)
        return pd.DataFrame([{"setting": s, "outcome": o, "collapse": c} for s, o, c in rows])

    settings = ["a", "b", "c"]
    assert anatomy_setting(summary(("a", "spiked", True), ("b", "stable", True), ("c", "collapsed", True)), settings) == "c"
    assert anatomy_setting(summary(("a", "stable", True), ("b", "spiked", True), ("c", "spiked", True)), settings) == "b"
    assert anatomy_setting(summary(("a", "stable", True), ("b", "stable", True)), settings) == "a"
    # a collapse outside the collapse group (a compare run without warm-up) is not the event the figure dissects
    assert anatomy_setting(summary(("a", "stable", True), ("b", "collapsed", False)), settings) == "a"


def test_the_plan_reuses_main_sweep_runs_and_lists_each_run_once():
    planned = plan(FULL)
    assert planned["run_dir"].is_unique
    main = planned[planned["main_sweep"]]
    assert set(main["run_dir"]) >= {"data/sweep/runs/post-w400-s0", "data/sweep/runs/pre-w0-s0"}
    collapse = planned[planned["collapse"]]
    assert set(collapse["warmup"]) == {FULL["dynamics"]["collapse"]["warmup"]} and set(collapse["norm"]) == {"post"}
    settings = FULL["dynamics"]["collapse"]["settings"]
    assert len(collapse) == len(settings) * len(FULL["dynamics"]["collapse"]["seeds"])
    assert set(main["setting"]) == {settings[0]}  # only the default setting's runs can be the main sweep's
    both = planned[planned["compare"] & planned["collapse"]]  # post-w400 at a compare seed: in both groups, listed once
    assert set(both["run"]) == {f"post-w400-s{s}" for s in FULL["dynamics"]["compare_seeds"]}
    assert len(planned) == len(FULL["sweep"]["norms"]) * len(FULL["sweep"]["warmups"]) * len(
        FULL["dynamics"]["compare_seeds"]) + len(collapse) - len(both)


# ---- the tiny family, end to end in Snakemake (the shared tiny DAG, conftest.py) -------------------------------------


def test_the_tiny_dag_records_diagnostics_for_every_run_and_draws_the_dynamics(snake_project):
    import json

    from blocklab.studies.dynamics import plan as dyn

    project = snake_project
    planned = dyn.plan(TINY)
    summary = pd.read_csv(project / dyn.TABLES["summary"])
    assert list(summary["run"]) == list(planned["run"]) and set(summary["diagnostics"]) == {"recorded"}
    trained = {str(p.parent.relative_to(project)) for p in (project / dyn.RUNS).glob("*/*/meta.json")}
    assert trained == set(planned.loc[~planned["main_sweep"], "run_dir"])  # main-sweep runs are not trained twice
    diagnostics = pd.read_parquet(project / dyn.TABLES["diagnostics"])
    assert set(diagnostics["metric"]) == set(METRICS)
    assert set(zip(diagnostics["setting"], diagnostics["run"])) == set(zip(planned["setting"], planned["run"]))
    for run_dir in planned.loc[planned["main_sweep"], "run_dir"]:  # the main sweep's runs record them too
        assert not pd.read_parquet(project / run_dir / "diagnostics.parquet").empty
    rates = pd.read_csv(project / dyn.TABLES["rates"])
    assert list(rates["setting"]) == TINY["dynamics"]["collapse"]["settings"]
    assert list(rates["runs"]) == [len(TINY["dynamics"]["collapse"]["seeds"])] * len(rates)
    for figure in dyn.FIGURES:
        assert (project / "figs" / f"{figure}.png").stat().st_size > 10_000
        sidecar = json.loads((project / "figs" / f"{figure}.json").read_text())
        assert sidecar["sources"] and sidecar["params"]["dynamics"] == TINY["dynamics"]
    page = (project / "reports" / "analysis.html").read_text(encoding="utf-8")
    assert 'data-inference="present"' in page and "learned-b8-L3" in page.split('data-inference="present"')[1]
    assert 'data-dynamics="present"' in page and "dynamics_gradnorm.png" in page and "dynamics_collapse.png" in page
    assert all(s in page.split('id="sec-dynamics"')[0] for s in rates["setting"])  # problem 11 (b): every setting's rate
    claims = pd.read_csv(project / "data/claims/claims.csv").set_index("id")
    assert {"d000-post-warm-collapse-rate", "d000-xiong-output-gradient-training"} <= set(claims.index)


def test_a_dynamics_snapshot_re_aggregates_to_the_same_tables(snake_project, tmp_path):
    from blocklab.studies.dynamics import aggregate as dyn_agg, plan as dyn

    snap = tmp_path / "snap"
    dyn_agg.write_snapshot(TINY, snap, root=snake_project)
    params = copy.deepcopy(TINY)
    params["dynamics"]["from_snapshots"] = [str(snap)]
    from_snap = dyn_agg.aggregate(params, root=snake_project)  # main-sweep runs from their directories, the rest recorded
    direct = dyn_agg.aggregate(TINY, root=snake_project)
    columns = [c for c in direct["summary"].columns if c != "run_dir"]
    pd.testing.assert_frame_equal(from_snap["summary"][columns], direct["summary"][columns])
    pd.testing.assert_frame_equal(from_snap["rates"], direct["rates"])
    assert len(from_snap["diagnostics"]) == len(direct["diagnostics"])  # values stored as float32 in the snapshot
    # a snapshot that lacks a planned run outside the main sweep is named before any compute
    runs = pd.read_csv(snap / "runs.csv")
    lost = runs[~runs["run_dir"].str.startswith("data/sweep/")].iloc[0]
    runs[runs["run"] != lost["run"]].to_csv(snap / "runs.csv", index=False)
    from blocklab.integrity import record_snapshot

    record_snapshot(snap)  # the edit is deliberate: recorded, else every reader refuses the snapshot as damaged
    problems = dyn.check_problems(params)
    assert problems and problems[0][0] == "dynamics.from_snapshots" and lost["run"] in problems[0][1]


def test_precursors_look_strictly_before_the_event_with_the_fixed_rules():
    from blocklab.studies.dynamics.aggregate import event_precursors

    summary = pd.DataFrame({"collapse": True, "setting": "s", "run": ["a", "b"], "seed": [0, 1],
                            "outcome": ["spiked", "collapsed"], "spike_step": [100.0, 100.0], "spike_loss": [0.7, 0.9]})
    rows = []
    for run in ("a", "b"):
        for step in range(30, 111):
            # run a: Adam's ratio jumps at step 95, before the loss; run b: only at the event step itself
            jump = (run == "a" and step >= 95) or (run == "b" and step >= 100)
            rows += [(step, 0, "adam_rms", 2.0 if jump else 0.05), (step, 0, "grad_ffn_out", 1.0),
                     (step, 0, "attn_entropy", 1.0)]
            if step % 10 == 0:
                rows.append((step, 0, "attn_logit_max", 60.0 if run == "b" and step == 90 else 40.0))
    diagnostics = pd.DataFrame(rows, columns=["step", "block", "metric", "value"]).assign(setting="s")
    diagnostics["run"] = [r for r in ("a", "b") for _ in range(len(rows) // 2)]
    got = event_precursors(summary, diagnostics).set_index("run")
    assert bool(got.loc["a", "adam_jumped"]) and not bool(got.loc["b", "adam_jumped"])  # step e itself does not count
    assert not bool(got.loc["a", "logit_grew"]) and bool(got.loc["b", "logit_grew"])  # 60 > 1.2 x 40 at step 90
    assert got.loc["a", "adam_rms_ref"] == 0.05 and got.loc["a", "adam_rms_lead"] == 2.0


def test_a_thinned_snapshot_keeps_every_step_the_tables_figures_and_claims_read():
    """1,200-step runs at the default's figure steps (1, 200, 400, 800): one spiked at step 500, one calm, one compare
    run; the thinned diagnostics give the same precursors and early updates, keep every step of the figure windows and
    the anatomy window of every run of the setting, and drop the rest but every 10th step (so thinning does happen)."""
    import numpy as np

    from blocklab.studies.dynamics import aggregate as dyn_agg

    params = copy.deepcopy(TINY)
    params["sweep"].update(steps=1200, warmups=[0, 400])
    summary = pd.DataFrame({"compare": [False, False, True], "collapse": [True, True, False], "setting": "s",
                            "run": ["spike", "calm", "cmp"], "seed": [0, 1, 2], "norm": "post", "warmup": [400, 400, 0],
                            "outcome": ["spiked", "stable", "never learned"], "spike_step": [500.0, np.nan, np.nan],
                            "spike_loss": [0.9, np.nan, np.nan], "collapse_step": np.nan})
    rng = np.random.default_rng(0)
    steps = np.arange(1, 1201)
    frames = [pd.DataFrame({"step": np.repeat(steps, 3), "block": np.tile([0, 1, 2], len(steps)), "metric": metric,
                            "value": rng.lognormal(size=3 * len(steps)), "setting": "s", "run": run})
              for run in summary["run"] for metric in ("adam_rms", "grad_ffn_out", "update_ratio")]
    frames += [pd.DataFrame({"step": s_, "block": 0, "metric": metric, "value": rng.lognormal(size=len(s_)),
                             "setting": "s", "run": run})
               for run in summary["run"] for metric in ("attn_logit_max", "attn_entropy")
               for s_ in [np.r_[1, np.arange(7, 1200, 7)]]]  # every 7th step: its last (1197) is not a 10th
    full = pd.concat(frames, ignore_index=True)
    thinned = dyn_agg.thin(params, summary, full)
    for f in (dyn_agg.event_precursors, dyn_agg.early_updates):
        pd.testing.assert_frame_equal(f(summary, thinned), f(summary, full))
    per_step = thinned[thinned["metric"] == "grad_ffn_out"]
    for run in summary["run"]:
        kept = set(per_step.loc[per_step["run"] == run, "step"])
        windows = set(range(1, 61)) | set(range(350, 601)) | {s_ + d for s_ in (200, 400, 800) for d in range(-5, 6)}
        assert windows <= kept, sorted(windows - kept)[:5]
        assert kept - windows == {s_ for s_ in range(70, 1201, 10)} - windows  # elsewhere every 10th step only
        attn = thinned[(thinned["run"] == run) & (thinned["metric"] == "attn_logit_max")]["step"]
        assert attn.max() == 1197  # the final attention logit is kept
    assert len(thinned) < 0.5 * len(full)


def test_the_tiny_dag_ranks_its_fitting_runs(snake_project):
    from blocklab.studies.inference import plan as inference

    planned = inference.plan(TINY)
    losses = pd.read_csv(snake_project / inference.LOSSES)
    steps = losses.groupby(["setting", "run"])["step"].max()
    assert len(steps) == len(planned) and set(steps) == {TINY["inference"]["fit_steps"]}  # each run stops at fit_steps
    ranked = pd.read_csv(snake_project / inference.RANKING)
    assert list(ranked["setting"]) == sorted(set(planned["setting"])) and ranked["score"].notna().all()
    # the held-out runs: trained by the DAG, never ranked, one table for the fitted claims
    held = pd.read_csv(snake_project / inference.HOLDOUT)
    assert set(held["seed"]) == set(TINY["inference"]["holdout_seeds"]) and not set(held["seed"]) & set(losses["run"].str[-1].astype(int))
    assert sorted(held["run"].unique()) == sorted(inference.holdout_plan(TINY)["run"])
    assert held.groupby("run")["step"].max().eq(TINY["inference"]["fit_steps"]).all()


def test_held_out_seeds_must_be_seeds_no_fitting_run_uses():
    from blocklab.studies.inference import plan as inference

    held = inference.holdout_plan(FULL)
    assert set(held["setting"]) == {"learned-b64-L24-lr0.001-fp32"} and not held["main_sweep"].any()
    assert sorted(held["run"]) == ["post-w400-s3", "post-w400-s4", "post-w400-s5", "pre-w0-s3", "pre-w0-s4", "pre-w0-s5"]
    params = copy.deepcopy(FULL)
    params["inference"]["holdout_seeds"] = [2, 3]  # seed 2 is a fitting seed (and a sweep seed)
    with pytest.raises(ParamsError, match=r"inference.holdout_seeds.*\[2\].*allowed: seeds in neither"):
        validate_params(params)


def test_the_fitting_plan_reads_main_sweep_runs_and_snapshots_and_trains_only_the_rest(tmp_path):
    from blocklab.studies.inference import plan as inference
    from blocklab.studies.inference import aggregate as inference_agg
    from blocklab.studies.inference import run as inference_run

    params = copy.deepcopy(FULL)
    params["copy_task"]["batch_size"] = 32  # the default cell below is batch 32 (one of the candidates)
    params["inference"].update(positions=["learned"], batch_sizes=[16, 32], seeds=[0, 1], fit_steps=300,
                               from_snapshots=["snap"])
    planned = inference.plan(params)
    main = planned[planned["main_sweep"]]
    # the default cell (batch 32) at the sweep's seeds: its 1,200-step runs begin with the fitting run's 300 steps
    assert set(main["setting"]) == {"learned-b32-L24-lr0.001-fp32"} and len(main) == 4
    assert all(d.startswith("data/sweep/runs/") for d in main["run_dir"])

    def curve(run_dir, steps, value):
        (tmp_path / run_dir).mkdir(parents=True)
        pd.DataFrame({"step": range(1, steps + 1), "loss": [value] * steps}).to_csv(tmp_path / run_dir / "loss.csv",
                                                                                     index=False)
        # as a finished run's meta.json: its loss table's checksum and its own (a meta.json without them is refused)
        meta = seal_meta({"wall_time_s": 1.0, **run_record(tmp_path / run_dir, ["loss.csv"], steps)})
        (tmp_path / run_dir / "meta.json").write_text(json.dumps(meta))

    for d in main["run_dir"]:
        curve(d, 1200, 0.5)
    # a snapshot records batch 16's seed 0 (both cases) and a run outside the plan, which is not read
    snap = tmp_path / "snap"
    snap.mkdir()
    b16 = "learned-b16-L24-lr0.001-fp32"
    pd.DataFrame({"setting": [b16, b16, "other"], "run": ["post-w400-s0", "pre-w0-s0", "pre-w0-s0"]}).to_csv(
        snap / "runs.csv", index=False)
    pd.DataFrame([{"setting": s, "run": r, "step": t, "loss": 0.25} for s, r in
                  [(b16, "post-w400-s0"), (b16, "pre-w0-s0"), ("other", "pre-w0-s0")] for t in range(1, 1201)]).to_csv(
        snap / "losses.csv", index=False)
    record_snapshot(snap)  # as a snapshot command writes it: its checksums last (readers refuse one without them)
    own, _, _ = inference.sources(params, tmp_path)
    trained_here = own[~own["main_sweep"]]
    assert set(trained_here["run"]) == {"post-w400-s1", "pre-w0-s1"} and set(trained_here["setting"]) == {b16}
    with pytest.raises(ConfigError, match="not trained yet"):
        inference_agg.collect(params, tmp_path)
    for d in trained_here["run_dir"]:
        curve(d, 300, 1.0)
    runs, losses = inference_agg.collect(params, tmp_path)
    assert len(runs) == len(planned) == 8 and losses.groupby(["setting", "run"]).size().eq(300).all()
    by_source = losses.groupby(["setting", "run"])["loss"].first()
    assert by_source[(b16, "pre-w0-s0")] == 0.25 and by_source[(b16, "pre-w0-s1")] == 1.0
    assert by_source[("learned-b32-L24-lr0.001-fp32", "pre-w0-s1")] == 0.5
    # the snapshot command records the fitting runs trained here only
    runs, _ = inference_agg.collect(params, tmp_path, only_finished=True)
    assert sorted(runs["run"]) == ["post-w400-s1", "pre-w0-s1"]
    # the status names each run's source and state; the projection scales the timed runs' seconds per step by batch
    state = inference_run.status(params, tmp_path).set_index(["setting", "run"])
    assert state.loc[(b16, "post-w400-s0"), "source"] == "snap" and state.loc[(b16, "post-w400-s0"), "status"] == "recorded"
    assert state.loc[(b16, "pre-w0-s1"), "status"] == "finished" and state.loc[(b16, "pre-w0-s1"), "source"] == "here"
    assert (state["source"] == "main sweep").sum() == 4 and state["steps_left"].eq(0).all()
    # skipping a candidate drops its runs from the plan
    params["inference"]["skip"] = ["learned-b16"]
    assert set(inference.plan(params)["setting"]) == {"learned-b32-L24-lr0.001-fp32"}
    params["inference"]["skip"] = []
    params["inference"]["from_snapshots"] = ["nowhere"]
    with pytest.raises(ConfigError, match="inference.from_snapshots"):
        inference.sources(params, tmp_path)


def _why_tables():
    """A post-norm run whose input-side gradient is flat at step 1 and vanishes after it (1e-6 of the output end's
    from step 2 on), a flat pre-norm run, and a post-norm + warm-up run that spikes at step 150 (learned at step 30;
    its loss starts to rise at step 148; Adam's ratio jumps at step 130 only)."""
    compare = [("post-w0-s0", "post", 0, "never learned"), ("pre-w0-s0", "pre", 0, "stable")]
    summary = pd.DataFrame([{"compare": True, "collapse": False, "setting": "s", "run": run, "norm": norm,
                             "warmup": warmup, "seed": 0, "outcome": outcome, "spike_step": float("nan"),
                             "spike_loss": float("nan")} for run, norm, warmup, outcome in compare]
                           + [{"compare": False, "collapse": True, "setting": "s", "run": "post-w20-s1", "norm": "post",
                               "warmup": 20, "seed": 1, "outcome": "spiked", "spike_step": 150.0, "spike_loss": 0.7}])
    rows = []
    for run, norm, _, _ in compare:
        for step in range(1, 61):
            for block in range(6):
                value = (1e-6 if block == 0 and step > 1 else 1.0) if norm == "post" else 1.0
                rows.append(("s", run, step, block, "grad_ffn_out", value))
            rows += [("s", run, step, 0, "update_ratio", 0.007)]
            if step % 10 == 0:
                rows += [("s", run, step, 0, "attn_logit_max", 5.0), ("s", run, step, 0, "attn_entropy", 3.19)]
    for step in range(1, 251):
        rows += [("s", "post-w20-s1", step, 0, "adam_rms", 2.0 if step == 130 else 0.05),
                 ("s", "post-w20-s1", step, 0, "grad_ffn_out", 1.0)]
        if step % 10 == 0:
            rows += [("s", "post-w20-s1", step, 0, "attn_logit_max", 40.0)]
    diagnostics = pd.DataFrame(rows, columns=["setting", "run", "step", "block", "metric", "value"])
    steps = range(1, 251)
    loss = [4.0 if s < 30 else 0.7 if s == 150 else 0.2 if s in (148, 149) else 0.01 for s in steps]
    losses = pd.DataFrame({"setting": "s", "run": "post-w20-s1", "step": list(steps), "loss": loss})
    rates = pd.DataFrame([{"setting": "s", "runs": 1, "learned": 1, "collapsed": 0, "collapsed_rate": 0.0,
                           "collapsed_low": 0.0, "collapsed_high": 0.79, "spiked": 1, "spiked_rate": 1.0,
                           "spiked_low": 0.21, "spiked_high": 1.0}])
    return {"dynamics/summary.csv": summary, "dynamics/rates.csv": rates, "dynamics/diagnostics.parquet": diagnostics,
            "dynamics/losses.csv": losses}


def test_the_why_answer_says_only_what_the_step_ratios_and_the_detector_rates_give():
    """Problem 11 (c)'s "why": flat at step 1 and output-heavy after it gives the as-measured reading of the no-warm-up
    failure; the precursors are read from their hit and false-alarm intervals (here from the hand-made detector
    table), and the sparse ones say what they cannot rule out; in both languages."""
    from blocklab.reporting import answers
    from blocklab.reporting.claims import Data

    tables = _why_tables()
    detectors = pd.DataFrame([
        {"detector": "adam_rms", "resolution": "every step", "events": 5, "events_evaluable": 5, "hits": 5,
         "hit_low": 0.57, "hit_high": 1.0, "windows": 79, "false_alarms": 15, "fa_low": 0.12, "fa_high": 0.29, "runs": 14},
        {"detector": "grad_ffn_out", "resolution": "every step", "events": 5, "events_evaluable": 5, "hits": 5,
         "hit_low": 0.57, "hit_high": 1.0, "windows": 86, "false_alarms": 45, "fa_low": 0.42, "fa_high": 0.63, "runs": 14},
        {"detector": "attn_logit_max", "resolution": "every step", "events": 5, "events_evaluable": 0, "hits": 0,
         "hit_low": float("nan"), "hit_high": float("nan"), "windows": 0, "false_alarms": 0, "fa_low": float("nan"),
         "fa_high": float("nan"), "runs": 0},
        {"detector": "attn_logit_max", "resolution": "every 10th step", "events": 5, "events_evaluable": 5, "hits": 0,
         "hit_low": 0.0, "hit_high": 0.43, "windows": 221, "false_alarms": 0, "fa_low": 0.0, "fa_high": 0.02, "runs": 15}])
    t = answers.texts()["answers"]["p11c"]
    for lang in ("en", "ko"):
        data = Data("/nonexistent", copy.deepcopy(TINY), tables={**tables, "dynamics/detectors.csv": detectors})
        why = answers._why_text(data, t, lang)
        assert "1e+06" in why, why  # the step ratios as measured (flat at step 1, then 1e6) ...
        assert ("seed 0" in why) if lang == "en" else ("시드 0" in why), why  # ... scoped to the one run a case
        assert "the first updates make it" not in why and "Why (" not in why  # and no reading beyond them
        names = {k: v[lang] for k, v in t["detector_names"].items()}
        apart, not_apart = why.split(t["why_detectors"][lang].split("{apart}")[0][-12:])[-1].split("; ", 1)
        assert names["adam_rms"] in apart and names["grad_ffn_out"] not in apart, why  # 57 % > 29 %; 57 % < 63 %
        assert names["grad_ffn_out"] in not_apart and names["attn_logit_max"] in not_apart
        assert t["why_sparse"][lang].format(names=names["attn_logit_max"], zero="").split("{")[0][:20] in why
        assert "43%" in why  # 0 of 5 is consistent with a precursor in up to 43 % of events
    # without detectors.csv (a data directory made before it) the table is computed from the losses and diagnostics
    data = Data("/nonexistent", copy.deepcopy(TINY), tables=dict(tables))
    table = answers.detector_table(data).set_index(["detector", "resolution"])
    assert table.loc[("adam_rms", "every step"), "hits"] == 1  # step 130: 18 steps before the onset at 148
    assert table.loc[("adam_rms", "every step"), "lead_median"] == 18
    assert table.loc[("attn_logit_max", "every step"), "events_evaluable"] == 0


def test_the_snapshot_command_records_a_seed_its_params_do_not_yet_cover(snake_project, tmp_path, monkeypatch):
    from blocklab.cli import main
    from blocklab.studies.dynamics import aggregate as dyn_agg

    snap = tmp_path / "snap"
    dyn_agg.write_snapshot(TINY, snap, root=snake_project)
    runs = pd.read_csv(snap / "runs.csv")
    lost = runs[~runs["run_dir"].str.startswith("data/sweep/")].iloc[0]
    runs[runs["run"] != lost["run"]].to_csv(snap / "runs.csv", index=False)  # as if the seed were just added
    from blocklab.integrity import record_snapshot

    record_snapshot(snap)  # the edit is deliberate: recorded, else every reader refuses the snapshot as damaged
    params = copy.deepcopy(TINY)
    params["dynamics"]["from_snapshots"] = [str(snap)]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    with pytest.raises(ParamsError):
        load_params(path)  # these parameters are refused until the run is recorded ...
    monkeypatch.chdir(snake_project)
    assert main(["dynamics", "snapshot", "--params", str(path), "--out", str(snap)]) in (0, None)
    assert lost["run"] in set(pd.read_csv(snap / "runs.csv")["run"]) and load_params(path)  # ... and accepted after


def test_the_snapshot_command_records_a_setting_still_training_and_refuses_a_bad_one(tmp_path, monkeypatch, capsys):
    """A validation setting is recorded seed by seed before params.yaml lists it (``--setting``); its seeds then read
    back from the snapshot; a setting that is not a sensitivity cell name fails naming the key, and writes nothing."""
    from blocklab.cli import main

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(TINY, allow_unicode=True), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    cell = "learned-b4-L3-lr0.001-fp32"  # not in the tiny plan's settings
    run_dir = Path("data/dynamics/runs") / cell / "post-w20-s0"
    assert main(["dynamics", "train", "--params", str(path), "--cell", cell, "--seed", "0", "--out-dir", str(run_dir)]) in (0, None)
    assert main(["dynamics", "snapshot", "--params", str(path), "--out", "snap", "--add-setting", cell]) in (0, None)
    runs = pd.read_csv("snap/runs.csv")
    assert list(zip(runs["setting"], runs["run"])) == [(cell, "post-w20-s0")]  # only what finished here
    losses = pd.read_csv("snap/losses.csv")
    assert (losses["setting"] == cell).all() and losses["step"].max() == TINY["sweep"]["steps"]
    # on another machine (seed 0's run directory gone), seed 2 is recorded beside it, and seed 0's record is kept
    import shutil

    shutil.rmtree(run_dir)
    seed2 = run_dir.parent / "post-w20-s2"
    assert main(["dynamics", "train", "--params", str(path), "--cell", cell, "--seed", "2", "--out-dir", str(seed2)]) in (0, None)
    before = pd.read_parquet("snap/diagnostics.parquet")
    assert main(["dynamics", "snapshot", "--params", str(path), "--out", "snap", "--add-setting", cell]) in (0, None)
    assert sorted(pd.read_csv("snap/runs.csv")["run"]) == ["post-w20-s0", "post-w20-s2"]
    after = pd.read_parquet("snap/diagnostics.parquet")
    pd.testing.assert_frame_equal(after[after["run"] == "post-w20-s0"].reset_index(drop=True), before)
    assert sorted(set(pd.read_csv("snap/losses.csv")["run"])) == ["post-w20-s0", "post-w20-s2"]
    capsys.readouterr()
    assert main(["dynamics", "status", "--params", str(path), "--add-setting", cell]) in (0, None)
    listed = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith(cell)]
    assert [row[1] for row in listed] == ["post-w20-s0", "post-w20-s2"]
    assert listed[0][2:4] == ["to", "do"] and listed[1][2] == "finished"  # seed 0's directory is gone from here
    assert main(["dynamics", "snapshot", "--params", str(path), "--out", "bad", "--add-setting", "learned-b4"]) == 2
    err = capsys.readouterr().err
    index = len(TINY["dynamics"]["collapse"]["settings"])  # --add-setting goes after the listed settings
    assert f"dynamics.collapse.settings[{index}]" in err and "'learned-b4' is not a setting; allowed:" in err
    assert not Path("bad").exists()


def test_the_anatomy_axis_names_only_the_lines_it_draws():
    """On the gallery's recorded data (batch 64, seed 0, collapse at step 573): the window starts after the warm-up,
    so the axis names the event's dashed line and not a warm-up line that is not drawn; a window that holds the
    warm-up's end names both."""
    import matplotlib.pyplot as plt

    from blocklab.studies.dynamics import plan as dyn
    from blocklab.studies.dynamics.figures import anatomy_setting, collapse_anatomy_figure

    from blocklab.records import GALLERY

    data = Path(__file__).resolve().parents[1] / GALLERY  # the gallery's tables in the data/ layout, without data/
    table = {k: data / Path(v).relative_to("data") for k, v in dyn.TABLES.items()}
    diagnostics = pd.read_parquet(table["diagnostics"])
    losses, summary = pd.read_csv(table["losses"]), pd.read_csv(table["summary"])
    setting = anatomy_setting(summary, FULL["dynamics"]["collapse"]["settings"])
    def axis_label(lang, warmup):
        fig = collapse_anatomy_figure(diagnostics, losses, summary, setting, lang=lang, warmup=warmup)
        plt.close(fig)
        return fig.axes[-1].get_xlabel()

    for lang, event, warm in (("en", "dashed: the event", "dotted: end of warm-up"), ("ko", "파선: 사건", "점선: 워밍업 끝")):
        label = axis_label(lang, 400)
        assert event in label and warm not in label, label
        label = axis_label(lang, 500)  # the warm-up's end inside the window
        assert event in label and warm in label, label


def test_a_followed_run_goes_past_the_collapse_stop_with_the_same_losses_and_says_so(tmp_path):
    """`dynamics train --follow` (does the loss stay at chance after a collapse?): the same run as the
    early-stopped one, bit for bit over their common steps, then on to the last step; its record says it was followed.
    The event rule is loosened so that a 40-step tiny run "collapses" (learned below 10 nats, then 5 steps at or above
    0.01 x ln V), which makes the stop fire without hours of training."""
    from blocklab.studies.dynamics.aggregate import _record
    from blocklab.studies.dynamics.run import train as train_collapse

    params = _tiny(steps=40, every=1)
    params["dynamics"]["events"].update(learned_below=10.0, learned_for=2, collapse_at=0.01, collapse_for=5)
    cell = params["dynamics"]["collapse"]["settings"][0]
    stopped = train_collapse(params, cell, "post", params["dynamics"]["collapse"]["warmup"], 0, tmp_path / "stopped",
                             threads=1)
    followed = train_collapse(params, cell, "post", params["dynamics"]["collapse"]["warmup"], 0, tmp_path / "followed",
                              threads=1, follow=True)
    with pytest.raises(ConfigError, match="not a dynamics run; allowed: the plan's norm='post'"):
        train_collapse(params, cell, "pre", 0, 0, tmp_path / "pre", threads=1)
    short, full = (pd.read_csv(tmp_path / d / "loss.csv") for d in ("stopped", "followed"))
    assert stopped["stopped_step"] and stopped["stopped_step"] < 40 and len(short) == stopped["stopped_step"]
    assert len(full) == 40 and followed.get("follow") is True and not followed["stopped_step"]
    assert (full["loss"].iloc[: len(short)].to_numpy() == short["loss"].to_numpy()).all()
    assert "followed" in _record(followed)["stop_reason"] and "followed" not in _record(stopped)["stop_reason"]


def test_a_main_sweep_that_stops_being_the_default_keeps_its_fitting_runs_recorded(tmp_path):
    """`inference snapshot --from-sweep DATA` (the default batch went from 32 to 64, and the ranking's batch-32
    seeds were the main sweep's): the fitting cases of DATA's sweep (post-norm at its largest warm-up, pre-norm without
    warm-up), named by the cell of DATA/params.yaml, up to fit_steps, in a snapshot the inference study reads; a sweep
    without those cases is refused, naming the file, before anything is written."""
    from blocklab.integrity import verify_snapshot
    from blocklab.studies.cells import default_cell
    from blocklab.studies.inference.aggregate import write_snapshot
    from blocklab.studies.inference.plan import read_snapshots

    data = tmp_path / "data"
    (data / "sweep").mkdir(parents=True)
    shutil.copyfile(ROOT / "configs/tiny.yaml", data / "params.yaml")
    runs = ["post-w0-s0", "post-w20-s0", "post-w20-s1", "pre-w0-s0", "pre-w20-s0"]
    summary = pd.DataFrame([{"run": r, "norm": r.split("-")[0], "warmup": int(r.split("-")[1][1:]),
                             "seed": int(r[-1]), "wall_time_s": 60.0} for r in runs])
    summary.to_csv(data / "sweep" / "summary.csv", index=False)
    losses = pd.DataFrame([{"run": r, "norm": "x", "warmup": 0, "seed": 0, "step": s, "loss": 10 * i + s / 8, "lr": 1e-3}
                           for i, r in enumerate(runs) for s in range(1, 401)])
    losses.to_csv(data / "sweep" / "losses.csv", index=False)

    out = tmp_path / "snap"
    recorded = write_snapshot(TINY, out, from_sweep=data)
    setting = default_cell(TINY).name
    assert sorted(recorded["run"]) == ["post-w20-s0", "post-w20-s1", "pre-w0-s0"] and set(recorded["setting"]) == {setting}
    verify_snapshot(out)  # complete, with its checksums
    got_runs, got = read_snapshots([out])
    assert got.groupby("run")["step"].max().eq(TINY["inference"]["fit_steps"]).all()  # 400 steps cut to fit_steps
    mine = losses[losses["run"].isin(recorded["run"]) & (losses["step"] <= 300)]
    assert got.sort_values(["run", "step"])["loss"].tolist() == mine.sort_values(["run", "step"])["loss"].tolist()

    summary[summary["norm"] == "post"].assign(warmup=0).to_csv(data / "sweep" / "summary.csv", index=False)
    with pytest.raises(ConfigError, match=r"sweep/summary.csv: no run of the fitting cases"):
        write_snapshot(TINY, tmp_path / "refused", from_sweep=data)
    assert not (tmp_path / "refused").exists()
