"""Precursors tested like detectors: the onset rule, the firing rules, hits, late firings, false
alarms over event-free windows and the resolution rule, on hand-made runs whose answers are known."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from blocklab.model_config import ConfigError
from blocklab.studies.dynamics import detectors as det
from blocklab.studies.dynamics.aggregate import wilson
from blocklab.records import DYNAMICS

RULE = {"learned_below": 0.05, "learned_for": 20, "spike_above": 0.5, "collapse_at": 0.9, "collapse_for": 100}
STEPS = np.arange(1, 601)
EVENT, ONSET, WARMUP = 400, 396, 100


def loss_curve(event: bool) -> np.ndarray:
    """Chance until step 29, then 0.01 (learned at step 30); with an event: 0.1 from the onset (396), 0.7 at 400, back
    to 0.01 after it (a spike)."""
    loss = np.where(STEPS < 30, 4.0, 0.01)
    if event:
        loss[(STEPS >= ONSET) & (STEPS < EVENT)] = 0.1
        loss[STEPS == EVENT] = 0.7
    return loss


def make(metric_values: dict, every: dict | None = None):
    """(runs, losses, diagnostics) for runs 'e0', 'e1' (an event each, at 400) and 'q0', 'q1' (stable). ``metric_values``:
    metric -> function(run, steps) giving block 1's value (block 0 is always 0.5, so the max over blocks is block 1's);
    ``every``: metric -> recording interval (default: every step)."""
    names = ["e0", "e1", "q0", "q1"]
    runs = pd.DataFrame({"setting": "s", "run": names, "seed": range(4), "warmup": WARMUP, "machine": "m",
                         "vocab_size": 64, "source": "hand", "key": names})
    losses = pd.concat([pd.DataFrame({"step": STEPS, "loss": loss_curve(n.startswith("e")), "key": n}) for n in names],
                       ignore_index=True)
    frames = []
    for metric, value in metric_values.items():
        step = STEPS[STEPS % (every or {}).get(metric, 1) == 0]
        for n in names:
            v = np.asarray(value(n, step), dtype=float)
            frames += [pd.DataFrame({"step": step, "block": 1, "metric": metric, "value": v, "key": n}),
                       pd.DataFrame({"step": step, "block": 0, "metric": metric, "value": 0.5, "key": n})]
    columns = ["step", "block", "metric", "value", "key"]
    return runs, losses, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def run(metric_values, detectors, every=None):
    runs, losses, diagnostics = make(metric_values, every)
    judged = det.judge_runs(runs, losses, RULE)
    table, per_event = det.evaluate(judged, diagnostics, detectors)
    return judged, table.set_index(["detector", "resolution"]), per_event


D = det.Detector("m", "m", "max", "median")


def test_the_onset_is_the_first_rise_above_twice_the_running_median_and_learned_below():
    steps = np.arange(1, 301)
    loss = np.full(300, 0.01)
    loss[99] = 0.2     # step 100: a blip outside the 100 steps up to the event (201..300)
    loss[219] = 0.03   # step 220: 3x the median but below learned_below: not an onset
    loss[[239, 240]] = 0.08  # steps 240-241: the rise
    loss[299] = 0.7    # step 300: the event
    assert det.onset(steps, loss, 300, start=50, learned_below=0.05) == 240
    assert det.onset(steps, loss, 300, start=241, learned_below=0.05) == 241  # not before the run had learned
    # a rise too slow to double the previous 20 steps' median at any step: the event step itself
    slow = 0.01 * 1.03 ** np.clip(steps - 200, 0, None)
    slow[299] = 0.7
    assert det.onset(steps, slow, 300, start=50, learned_below=0.05) == 300
    # on the hand-made runs below
    judged = det.judge_runs(*make({})[:2], RULE)
    event = judged.set_index("run").loc["e0"]
    assert (event["learned_step"], event["event_step"], event["onset"]) == (30, EVENT, ONSET)
    assert (event["quiet_from"], event["quiet_to"]) == (WARMUP + 1, EVENT - det.EXCLUDE_BEFORE - 1)


def test_a_detector_that_fires_before_every_event_and_never_elsewhere_hits_all_with_no_false_alarm():
    jump = lambda n, s: np.where(n.startswith("e") & (s >= ONSET - 10) & (s <= EVENT), 10.0, 1.0)  # noqa: E731
    _, table, per_event = run({"m": jump}, [D])
    row = table.loc[("m", "every step")]
    assert (row["events_evaluable"], row["hits"], row["late"], row["missed"]) == (2, 2, 0, 0)
    assert row["hit_rate"] == 1.0 and (row["hit_low"], row["hit_high"]) == pytest.approx(wilson(2, 2))
    assert row["lead_median"] == 10 and row["samples_per_hit_window"] == det.WINDOW
    # false alarms only in the phase where events happen: from the earliest onset's hit window (346) to the
    # latest event (400): the stable runs' window 351-400; the event runs' quiet windows end at 299, before it
    assert (row["windows"], row["false_alarms"], row["fa_rate"], row["runs"], row["runs_with_fa"]) == (2, 0, 0.0, 2, 0)
    # the interval resamples runs, and is at least the Wilson interval with the 2 runs (not the windows) as its n
    assert (row["fa_low"], row["fa_high"]) == pytest.approx(wilson(0, 2))
    grid = table.loc[("m", "every 10th step")]  # the first sample inside the jump is step 390: 6 steps of lead
    assert (grid["hits"], grid["lead_median"], grid["samples_per_hit_window"], grid["false_alarms"]) == (2, 6, 5, 0)
    # on the 10-step grid the rule reads 20 samples = 200 steps back; the phase window 351-400 has that history
    assert grid["windows"] == 2 and grid["windows_not_evaluable"] == 0


def test_a_detector_that_fires_everywhere_hits_every_event_and_alarms_in_every_window():
    every_fifth = lambda n, s: np.where(s % 5 == 0, 10.0, 1.0)  # noqa: E731
    _, table, _ = run({"m": every_fifth}, [D])
    row = table.loc[("m", "every step")]
    assert (row["hits"], row["false_alarms"], row["windows"], row["runs_with_fa"]) == (2, 2, 2, 2)
    assert row["fa_rate"] == 1.0
    # sampled every 10th step it sees only the 10s: no step stands out, it never fires
    grid = table.loc[("m", "every 10th step")]
    assert (grid["hits"], grid["missed"], grid["false_alarms"]) == (0, 2, 0)


def test_runs_without_an_event_write_tables_every_reader_can_parse(tmp_path):
    """Stable runs only (as in the tiny pipeline): no event row, yet every table is written with its header, so that a
    reader (pd.read_csv, the pipeline tests' table comparison) gets an empty table, not 'No columns to parse'."""
    runs, losses, diagnostics = make({"m": lambda n, s: np.ones(len(s))})
    quiet = runs["run"].str.startswith("q")
    runs = runs[quiet].reset_index(drop=True)
    losses, diagnostics = losses[losses["key"].isin(runs["key"])], diagnostics[diagnostics["key"].isin(runs["key"])]
    judged = det.judge_runs(runs, losses, RULE)
    table, per_event = det.evaluate(judged, diagnostics, [D])
    det.write_tables({"detectors": table, "detector_events": per_event, "detector_runs": judged}, tmp_path)
    events = pd.read_csv(tmp_path / "detector_events.csv")
    assert events.empty and list(events.columns) == det.EVENT_COLUMNS
    table = pd.read_csv(tmp_path / "detectors.csv").set_index(["detector", "resolution"])
    assert table.loc[("m", "every step"), ["events", "hits", "windows"]].tolist() == [0, 0, 20]  # windows 101-150 ... 551-600, two runs


def test_a_firing_at_or_after_the_onset_is_late_not_a_hit():
    at_onset = lambda n, s: np.where(n.startswith("e") & (s >= ONSET), 10.0, 1.0)  # noqa: E731
    _, table, per_event = run({"m": at_onset}, [D])
    row = table.loc[("m", "every step")]
    assert (row["hits"], row["late"], row["hit_rate"]) == (0, 2, 0.0) and np.isnan(row["lead_median"])
    late = per_event[(per_event["resolution"] == "every step")]
    assert set(late["status"]) == {"late"} and set(late["first_fire"]) == {ONSET}


def test_a_metric_sampled_every_10_steps_cannot_see_a_jump_between_its_samples():
    """The jump is at steps 391-395 only (no multiple of 10): recorded every step it is a hit; recorded every 10th
    step it is a miss on the grid and not evaluable at every step (never counted as a miss there)."""
    between = lambda n, s: np.where(n.startswith("e") & (s >= 391) & (s <= 395), 10.0, 1.0)  # noqa: E731
    _, dense, _ = run({"m": between}, [D])
    assert dense.loc[("m", "every step"), "hits"] == 2 and dense.loc[("m", "every step"), "lead_median"] == 5
    _, sparse, per_event = run({"m": between}, [D], every={"m": 10})
    row = sparse.loc[("m", "every step")]
    assert (row["events_evaluable"], row["windows"]) == (0, 0) and np.isnan(row["hit_rate"])
    assert set(per_event.loc[per_event["resolution"] == "every step", "status"]) == {"not evaluable"}
    assert (sparse.loc[("m", "every 10th step"), "missed"], sparse.loc[("m", "every 10th step"), "hits"]) == (2, 0)


def test_a_window_without_a_sample_is_not_evaluable_rather_than_quiet():
    runs, losses, diagnostics = make({"m": lambda n, s: np.where(n.startswith("e") & (s >= 390), 10.0, 1.0)},
                                     every={"m": 10})
    gap = (diagnostics["key"] == "e0") & diagnostics["step"].between(ONSET - det.WINDOW, ONSET - 1)
    table, per_event = det.evaluate(det.judge_runs(runs, losses, RULE), diagnostics[~gap], [D])
    got = per_event[per_event["resolution"] == "every 10th step"].set_index("run")["status"]
    assert got.to_dict() == {"e0": "not evaluable", "e1": "hit"}
    assert table.set_index("resolution").loc["every 10th step", "events_evaluable"] == 1


def test_the_fixed_adam_rule_is_strict_and_reads_steps_t_minus_60_to_t_minus_11_while_the_generic_rule_is_not():
    exactly_three = lambda n, s: np.where(n.startswith("e") & (s == ONSET - 5), 3.0, 1.0)  # noqa: E731
    fixed = det.Detector("adam", "adam_rms", "max", "fixed")
    _, table, _ = run({"adam_rms": exactly_three}, [fixed, det.Detector("adam20", "adam_rms", "max", "median")])
    assert table.loc[("adam", "every step"), "hits"] == 0  # 3.0 is not > 3 x 1.0
    assert table.loc[("adam20", "every step"), "hits"] == 2  # >= 3 x median
    series = pd.Series(np.r_[np.full(60, 1.0), 5.0], index=np.arange(1, 62))
    got = det.firing(series, fixed)
    assert np.isnan(got.loc[15, "reference"]) and got.loc[16, "reference"] == 1.0  # t-60..t-11 holds 5 values at t=16
    assert bool(got.loc[61, "fires"]) and got.loc[61, "ratio"] == 5.0


def test_attention_entropy_fires_on_a_drop_to_a_third_of_the_min_over_blocks():
    drop = lambda n, s: np.where(n.startswith("e") & (s >= ONSET - 3), 0.1, 3.0)  # noqa: E731
    entropy = det.Detector("ent", "attn_entropy", "min", "median")
    runs, losses, diagnostics = make({"attn_entropy": drop})
    diagnostics.loc[diagnostics["block"] == 0, "value"] = 5.0  # the other block stays high: min over blocks is block 1
    table, _ = det.evaluate(det.judge_runs(runs, losses, RULE), diagnostics, [entropy])
    row = table.set_index("resolution").loc["every step"]
    assert (row["hits"], row["lead_median"], row["false_alarms"]) == (2, 3, 0)


def test_sources_are_deduplicated_by_run_keeping_the_densest_one_processor_per_seed(tmp_path):
    def write(path, machine, every, run="post-w400-s0"):
        path.mkdir()
        pd.DataFrame([{"setting": "s", "run": run, "norm": "post", "warmup": WARMUP, "seed": 0, "vocab_size": 64,
                       "machine": machine}]).to_csv(path / "runs.csv", index=False)
        pd.DataFrame({"setting": "s", "run": run, "step": STEPS, "loss": loss_curve(True), "lr": 1e-3}).to_csv(
            path / "losses.csv", index=False)
        step = STEPS[STEPS % every == 0]
        pd.DataFrame({"step": step, "block": 0, "metric": "adam_rms", "value": 1.0, "setting": "s",
                      "run": run}).to_parquet(path / "diagnostics.parquet")

    write(tmp_path / "thin", "amd", 10)
    write(tmp_path / "dense", "amd", 1)
    write(tmp_path / "other", "intel", 10)
    runs, losses, diagnostics = det.load_sources([tmp_path / "thin", tmp_path / "dense", tmp_path / "other"], 64)
    assert list(runs["machine"]) == ["amd"]  # the same seed on another processor is the same run: counted once
    amd = runs.set_index("machine").loc["amd"]
    assert amd["source"].endswith("dense") and (diagnostics["key"] == amd["key"]).sum() == len(STEPS)
    assert det.run_bootstrap(pd.DataFrame({"fires": [1, 0, 0, 0], "windows": [10, 10, 10, 10]}))[1] > 0.025
    with pytest.raises(ConfigError, match=r"neither runs.csv nor summary.csv\); allowed"):
        det.load_sources([tmp_path / "nothing"], 64)


def test_the_recorded_runs_give_the_tables_the_docs_quote():
    """On the runs recorded in git: every event of the post-norm + warm-up runs is judged once per detector and
    resolution. The two collapses were followed at every step, so the forward metrics are judged at
    every step too, and none of them fired before either event (docs/dynamics.md quotes 0 of 2)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tables = det.detector_tables([root / f"{DYNAMICS}/validation"], RULE, 64)
    runs = tables["detector_runs"]
    assert set(runs.loc[runs["outcome"] == "collapsed", "seed"]) == {0, 5}
    table = tables["detectors"].set_index(["detector", "resolution"])
    assert (table["events"] == 2).all()
    for metric in ("attn_logit_max", "attn_entropy", "output_logit_max", "stream_norm"):
        for resolution in ("every step", "every 10th step"):
            assert table.loc[(metric, resolution), "events_evaluable"] == 2
            assert table.loc[(metric, resolution), "hits"] == 0 and table.loc[(metric, resolution), "late"] == 0
    assert table.loc[("update_ratio", "every step"), "hits"] == 2  # the relative update fired before both


# ---- the figures: the value at the step, told apart, and per-step data where a run has it --------


def _compare_frames(steps=range(1, 1201)):
    """Two compare runs (post/pre, warm-up 0 and 400 -> figure steps 1, 200, 400, 800), 4 blocks; at step s block b's
    gradient is (b + 1) * s, so the value at a step and a +-5-step mean differ."""
    summary = pd.DataFrame({"compare": True, "collapse": False, "setting": "s", "seed": 0,
                            "run": ["post-w0-s0", "pre-w0-s0", "post-w400-s0", "pre-w400-s0"],
                            "norm": ["post", "pre", "post", "pre"], "warmup": [0, 0, 400, 400]})
    steps = np.asarray(list(steps))
    diagnostics = pd.concat([pd.DataFrame({"step": np.repeat(steps, 4), "block": np.tile(range(4), len(steps)),
                                           "metric": "grad_ffn_out", "setting": "s", "run": run,
                                           "value": np.tile(range(1, 5), len(steps)) * np.repeat(steps, 4)})
                             for run in summary["run"]], ignore_index=True)
    return summary, diagnostics


def test_the_gradnorm_figure_draws_the_value_at_each_step_with_a_style_per_step_and_a_readable_legend():
    import matplotlib.pyplot as plt

    from blocklab.studies.dynamics.figures import gradnorm_through_training_figure

    summary, diagnostics = _compare_frames()
    fig = gradnorm_through_training_figure(diagnostics, summary, lang="en", steps=1200)
    plt.close(fig)
    lines = [line for ax in fig.axes for line in ax.get_lines()]
    assert len(lines) == 4 * 2 * 2  # 4 steps x 2 norms x 2 panels
    first = fig.axes[0].get_lines()[0]  # post-norm, step 1: exactly (b + 1) x 1, not the mean of steps 1..6
    assert list(first.get_ydata()) == [1.0, 2.0, 3.0, 4.0]
    styles = {(line.get_linestyle(), line.get_marker()) for line in fig.axes[0].get_lines()}
    assert len(styles) == 4  # one line style and marker per step, the same for both norms
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["post-norm", "pre-norm", "step 1", "step 200", "step 400", "step 800"], labels
    assert min(t.get_fontsize() for t in legend.get_texts()) >= 10
    # a step the run did not record (thinned): the mean over +-5 recorded steps, and the legend says so
    summary, diagnostics = _compare_frames([s for s in range(1, 1201) if s != 200])
    fig = gradnorm_through_training_figure(diagnostics, summary, lang="en", steps=1200)
    plt.close(fig)
    assert "step 200 (±5 mean)" in [t.get_text() for t in fig.legends[0].get_texts()]


def _collapse_frames(every: int):
    """One collapsed run (event at step 300) and one calm run; every metric recorded every ``every`` steps."""
    summary = pd.DataFrame({"compare": False, "collapse": True, "setting": "s", "seed": [0, 1],
                            "run": ["post-w100-s0", "post-w100-s1"], "norm": "post", "warmup": 100,
                            "outcome": ["collapsed", "stable"], "spike_step": [300.0, np.nan],
                            "spike_loss": [4.0, np.nan], "collapse_step": [300.0, np.nan],
                            "max_after_learned": [4.2, 0.02]})
    steps = np.arange(1, 501)
    losses = pd.concat([pd.DataFrame({"setting": "s", "run": run, "step": steps,
                                      "loss": np.where((steps >= 300) & (run.endswith("0")), 4.2, 0.01)})
                        for run in summary["run"]], ignore_index=True)
    kept = steps[(steps % every == 0)]
    from blocklab.studies.dynamics.figures import ANATOMY

    diagnostics = pd.concat([pd.DataFrame({"step": kept, "block": 0, "metric": metric, "value": 1.0 + kept / 100,
                                           "setting": "s", "run": run})
                             for run in summary["run"] for metric, *_ in ANATOMY if metric != "loss"],
                            ignore_index=True)
    return diagnostics, losses, summary


@pytest.mark.parametrize("every", [1, 10])
def test_the_anatomy_draws_per_step_data_as_a_line_and_says_when_a_metric_is_sampled_sparser(every):
    import matplotlib.pyplot as plt

    from blocklab.studies.dynamics.figures import collapse_anatomy_figure

    diagnostics, losses, summary = _collapse_frames(every)
    fig = collapse_anatomy_figure(diagnostics, losses, summary, "s", lang="en", warmup=100)
    plt.close(fig)
    logit = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("largest attention logit"))
    line = logit.get_lines()[0]
    assert len(line.get_xdata()) == len(range(150, 401, every))  # every recorded step of the window 150..400
    title = logit.get_title(loc="left")
    if every == 1:
        assert "sampled" not in title and line.get_marker() in (None, "None", "")
    else:
        assert title.endswith("(sampled every 10 steps)") and line.get_marker() == "."


def test_the_anatomy_says_which_seed_is_sampled_when_only_one_is():
    """The collapse followed at every step beside a stable seed recorded every 10th step (the batch-64 validation
    snapshot): the title names the sparse seed instead of calling the whole panel sampled."""
    import matplotlib.pyplot as plt

    from blocklab.studies.dynamics.figures import collapse_anatomy_figure

    diagnostics, losses, summary = _collapse_frames(1)
    diagnostics = diagnostics[(diagnostics["run"] == "post-w100-s0") | (diagnostics["step"] % 10 == 0)]
    fig = collapse_anatomy_figure(diagnostics, losses, summary, "s", lang="en", warmup=100)
    plt.close(fig)
    logit = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("largest attention logit"))
    dense, sparse = logit.get_lines()[:2]
    assert len(dense.get_xdata()) == 251 and len(sparse.get_xdata()) == 26
    assert logit.get_title(loc="left").endswith("(seed 1: sampled every 10 steps; the other at every step)")
