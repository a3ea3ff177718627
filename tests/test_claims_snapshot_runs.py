"""The default cell's claims count the same cell's runs the dynamics study recorded in git (records/dynamics/validation:
post-norm with warm-up 400 at seeds 0-8), each run once, beside the sweep's and the lab's."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from blocklab.params_file import load_params
from blocklab.reporting import claims
from blocklab.training import lab_records

ROOT = Path(__file__).resolve().parents[1]
GALLERY = ROOT / "records" / "gallery"
VALIDATION = "records/dynamics/validation"


@pytest.fixture(autouse=True)
def no_recorded_lab_runs(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(lab_records, "RUNS", str(tmp_path_factory.mktemp("no-recorded-lab-runs")))


def _data(params=None):
    return claims.Data(GALLERY, params or load_params(GALLERY / "params.yaml"))


def test_the_snapshots_runs_at_the_sweeps_seeds_are_the_sweeps_runs_step_for_step():
    """What the join rests on: the dynamics study trains the default cell with the sweep's own function, so its runs at
    the sweep's seeds repeat the sweep's, loss and learning rate at every step (both recorded on one machine kind:
    equal to the bit)."""
    snapshot = pd.read_csv(ROOT / VALIDATION / "losses.csv")
    sweep = pd.read_csv(GALLERY / "sweep" / "losses.csv")
    for run in ("post-w400-s0", "post-w400-s1", "post-w400-s2"):
        a = snapshot[snapshot["run"] == run].set_index("step")[["loss", "lr"]]
        b = sweep[sweep["run"] == run].set_index("step")[["loss", "lr"]]
        assert len(a) == len(b) == 1200
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_post_norm_with_warmup_counts_the_snapshots_seeds_once_and_names_where_they_are():
    data = _data()
    runs = claims._runs(data, "post", 400)
    assert sorted(runs["seed"].astype(int)) == list(range(9))  # 0-2 the sweep's, 3-8 the snapshot's, none twice
    assert set(runs.loc[runs["seed"] >= 3, "recorded"]) == {VALIDATION}
    assert set(runs.loc[runs["seed"] < 3, "recorded"]) == {""}
    # the snapshot's outcomes are the sweep's rule on its losses: seed 5 collapsed as the study's own table says
    assert runs.set_index("seed").loc[5, "outcome"] == "collapsed"
    assert f"3, 4, 5, 6, 7, 8: the same cell's runs recorded in {VALIDATION}" in claims._whence(runs)
    assert len(claims._runs(data, "post", 0)) == 3  # the snapshot holds no run without warm-up: nothing joins
    # held out: seeds 3-5 are the held-out runs (read from the same snapshot), 6-8 join; none counted twice
    text, parts = claims.loss_at_step(data, "post", 400, 200, held_out=True)
    assert text.startswith(f"held-out seeds 3 4 5 and 6 7 8 (the same cell's runs recorded in {VALIDATION}")
    assert len(parts[0]["measure"]["samples"]) == 6


def test_a_snapshot_is_not_joined_when_the_params_leave_it_out_or_its_run_stopped_early(tmp_path, monkeypatch):
    params = load_params(GALLERY / "params.yaml")
    params["dynamics"]["from_snapshots"] = []
    assert len(claims._runs(_data(params), "post", 400)) == 3
    # a copy of the snapshot whose seed-6 run stopped early (its last 100 steps cut, the manifest resealed): not joined
    copy = tmp_path / VALIDATION
    shutil.copytree(ROOT / VALIDATION, copy)
    losses = pd.read_csv(copy / "losses.csv")
    losses = losses[~((losses["run"] == "post-w400-s6") & (losses["step"] > 1100))]
    losses.to_csv(copy / "losses.csv", index=False)
    from blocklab.integrity import file_record

    manifest = json.loads((copy / "MANIFEST.json").read_text(encoding="utf-8"))
    manifest["files"]["losses.csv"] = file_record(copy / "losses.csv")
    (copy / "MANIFEST.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    monkeypatch.setattr(claims, "SNAPSHOT_ROOT", str(tmp_path))
    seeds = sorted(claims._runs(_data(), "post", 400)["seed"].astype(int))
    assert seeds == [0, 1, 2, 3, 4, 5, 7, 8]
    # a damaged snapshot is never read as complete
    (copy / "runs.csv").write_text((copy / "runs.csv").read_text(encoding="utf-8") + "\n", encoding="utf-8")
    with pytest.raises(Exception, match="runs.csv"):
        claims._runs(_data(), "post", 400)
