"""Claim checks on small hand-made data with known verdicts."""
import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from blocklab.params import load_params
from blocklab.reporting import claims

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def document_params():
    return load_params(ROOT / "params.yaml")  # the document's setup


def write(root: Path, relative: str, frame: pd.DataFrame):
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(root / relative, index=False)


def sweep_data(root: Path, curves: dict):
    rows, summary = [], []
    for (norm, warmup, seed), losses in curves.items():
        run = f"{norm}-w{warmup}-s{seed}"
        steps = np.arange(1, len(losses) + 1)
        rows.append(pd.DataFrame({"run": run, "norm": norm, "warmup": warmup, "seed": seed, "step": steps,
                                  "loss": losses, "lr": 1e-3}))
        outcome = claims_outcome(np.asarray(losses))
        summary.append({"run": run, "norm": norm, "warmup": warmup, "seed": seed, "final_loss": losses[-1],
                        "min_loss": min(losses), "outcome": outcome})
    write(root, "sweep/losses.csv", pd.concat(rows))
    write(root, "sweep/summary.csv", pd.DataFrame(summary))


def claims_outcome(losses):
    from blocklab.training.sweep import classify

    return classify(pd.Series(losses), 64)


def test_loss_at_step_judges_order_of_magnitude(tmp_path, document_params):
    learned = [4.2] * 99 + [0.3] + [0.004] * 1100  # step 100: 0.3, step 200: 0.004
    stuck = [4.16] * 1200
    sweep_data(tmp_path, {("pre", 0, 0): learned, ("pre", 0, 1): learned, ("post", 0, 0): stuck, ("post", 0, 1): stuck})
    data = claims.Data(tmp_path, document_params)
    assert claims.loss_at_step(data, "pre", 0, 100, 0.16, 0.71)[1] == claims.REPRODUCED
    assert claims.loss_at_step(data, "pre", 0, 200, 0.0, 0.007)[1] == claims.REPRODUCED
    assert claims.loss_at_step(data, "post", 0, 100, 0.16, 0.71)[1] == claims.NOT_REPRODUCED
    assert claims.final_losses_near_chance(data, "post", 0)[1] == claims.REPRODUCED
    # Near chance a factor on the loss alone would accept a stuck run for "4.0 at step 100": the gap to ln 64 decides.
    assert claims.loss_at_step(data, "post", 0, 100, 4.0, 4.0)[1] == claims.NOT_REPRODUCED
    assert claims.loss_at_step(data, "pre", 0, 99, 4.0, 4.0)[1] == claims.NOT_REPRODUCED  # 4.2 is above chance
    # Near zero the loss itself decides: 0.004 is not "about 0.0003", but it is "below 0.007".
    assert claims.loss_at_step(data, "pre", 0, "last", 0.0003, 0.0003)[1] == claims.NOT_REPRODUCED
    assert claims.loss_at_step(data, "pre", 0, "last", 0.003, 0.003)[1] == claims.REPRODUCED
    assert claims.final_losses_near_chance(data, "pre", 0)[1] == claims.NOT_REPRODUCED
    assert claims.failed_runs(data, "post", expected=2)[1] == claims.REPRODUCED
    assert claims.failed_runs(data, "post", expected=4)[1] == claims.NOT_REPRODUCED
    # a count the document gives over its own number of runs is undecidable over another number of runs
    with pytest.raises(claims.NotCheckable, match="over 6 runs; this table has 2"):
        claims.failed_runs(data, "post", expected=4, of=6)
    assert claims.failed_runs(data, "post", expected=2, of=2)[1] == claims.REPRODUCED
    with pytest.raises(claims.NotCheckable, match="over 3 runs; this table has 2"):
        claims.outcome_count(data, "pre", 0, "learned", 1, of=3)
    assert claims.outcome_count(data, "pre", 0, "learned", "all")[1] == claims.REPRODUCED  # "all" fits any count


def test_other_setups_are_not_checkable(tmp_path, document_params):
    params = copy.deepcopy(document_params)
    params["sweep"]["steps"] = 60
    sweep_data(tmp_path, {("pre", 0, 0): [4.0] * 60})
    table = claims.evaluate(tmp_path, params).set_index("id")
    assert table.loc["d000-pre-nowarm-step100", "verdict"] == claims.NOT_CHECKABLE
    assert "sweep.steps=60" in table.loc["d000-pre-nowarm-step100", "measured"]
    assert table.loc["d000-sim-L1", "verdict"] == claims.NOT_CHECKABLE  # no simulation data at all


@pytest.mark.parametrize("curve,direction,expected", [
    (np.linspace(0.3, 1.1, 24), "grows", claims.REPRODUCED),
    (np.full(24, 1.07), "grows", claims.PARTLY),  # right value, wrong shape
    (np.linspace(3.0, 8.0, 24), "grows", claims.PARTLY),  # right shape, value 7x off
    (np.linspace(1.0, 0.22, 24), "grows", claims.NOT_REPRODUCED),
])
def test_gradnorm_trend(tmp_path, document_params, curve, direction, expected):
    write(tmp_path, "gradnorm/gradnorm.csv", pd.DataFrame({"norm": "post", "seed": 0, "block": range(1, 25),
                                                            "grad_norm": curve}))
    assert claims.gradnorm_trend(claims.Data(tmp_path, document_params), "post", direction, 1.07)[1] == expected


@pytest.mark.parametrize("count, want, runs, expected", [
    (1, 1, 3, claims.REPRODUCED),
    (2, 1, 3, claims.PARTLY),          # some of the runs, as claimed, but another count
    (0, 1, 3, claims.NOT_REPRODUCED),  # none where the claim says some: the opposite shape
    (3, 1, 3, claims.NOT_REPRODUCED),  # all where the claim says some
    (3, 4, 6, claims.PARTLY),
    (6, 4, 6, claims.NOT_REPRODUCED),
])
def test_a_count_claim_is_partly_reproduced_only_when_its_shape_holds(count, want, runs, expected):
    assert claims.judge_count(count, want, runs) == expected


@pytest.mark.parametrize("k, n, p, verdict", [
    # p by hand: the hypergeometric probabilities of the 2x2 table with the margins fixed, summed over the tables no
    # more likely than the observed one (e.g. 1 of 9 vs 1 of 3: P(a) = C(2,a) C(10,9-a) / C(12,9) = 10, 90, 120 / 220)
    (0, 7, 3 / 10, claims.NOT_REPRODUCED),   # no collapse seen: not reproduced, whatever the test says
    (0, 9, 1 / 4, claims.NOT_REPRODUCED),
    (1, 9, 5 / 11, claims.REPRODUCED),       # collapses, at a rate the test cannot tell from 1 of 3
    (8, 9, 7 / 55, claims.REPRODUCED),
    (9, 9, 1 / 22, claims.PARTLY),           # collapses, at a rate the test tells apart: C(10,9) C(2,0) = 10 / 220
])
def test_a_collapse_rate_is_judged_by_fishers_exact_test_against_the_documents_count(k, n, p, verdict):
    measured_p, measured_verdict = claims.collapse_verdict(k, n, 1, 3)
    assert measured_p == pytest.approx(p, rel=1e-12) and measured_verdict == verdict


def test_single_number_claims_are_reproduced_or_not_never_partly(tmp_path, document_params):
    curve = pd.DataFrame({"blocks": [4], "mean_length": [2.236 * 1.03], "std_length": [0.05], "sqrt_L_plus_1": [2.236]})
    write(tmp_path, "residual_sim/curve.csv", curve)  # 3 % off, far outside 4 standard errors (0.004)
    assert claims.residual_sim(claims.Data(tmp_path, document_params), 4, 2.235)[1] == claims.NOT_REPRODUCED
    write(tmp_path, "residual_sim/curve.csv", curve.assign(mean_length=2.2372))
    assert claims.residual_sim(claims.Data(tmp_path, document_params), 4, 2.235)[1] == claims.REPRODUCED


def test_the_inference_score_ranks_hand_made_settings_by_the_documents_early_losses():
    import pandas as pd

    from blocklab.reporting.inference import FIT_CLAIMS, distance, score, targets

    assert distance(0.05, 0.01, 0.08) == 0.0 and distance(0.003, 0.0, 0.007) == 0.0  # inside the range; "below 0.007"
    assert math.isclose(distance(0.16, 0.01, 0.08), math.log(2)) and math.isclose(distance(0.005, 0.01, 0.08), math.log(2))
    rows = []
    for setting, factor in (("near", 1.0), ("far", math.e)):  # "far" misses every target by a factor e: distance 1
        for seed in (0, 1):
            for t in targets():
                value = t["high"] * factor  # near: the range's top (inside it); far: e x the top, distance 1
                rows.append({"setting": setting, "run": f"{t['norm']}-w{t['warmup']}-s{seed}", "step": t["step"],
                             "loss": value})
    ranked = score(pd.DataFrame(rows)).set_index("setting")
    assert list(ranked.index) == ["near", "far"] and ranked.loc["near", "score"] == 0.0
    assert math.isclose(ranked.loc["far", "score"], 1.0) and ranked.loc["far", "seeds"] == 2
    assert set(FIT_CLAIMS) <= set(ranked.columns)
