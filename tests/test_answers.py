"""The report's answers on hand-made data whose answers are known (every number in them comes from the data)."""
import copy
import math
import string
from pathlib import Path

import numpy as np
import pandas as pd

from blocklab.experiments.problem9 import standardized_scores
from blocklab.params_file import load_params
from blocklab.reporting import answers
from blocklab.reporting.claims import NOT_CHECKABLE, NOT_REPRODUCED, PARTLY, REPRODUCED, Data

TINY = load_params(Path(__file__).parents[1] / "configs" / "tiny.yaml")


def data(tables, **params):
    p = copy.deepcopy(TINY)
    for section, values in params.items():
        p[section].update(values)
    return Data("/nonexistent", p, tables=tables)


def claims_table(**verdicts):
    return pd.DataFrame([{"id": k.replace("_", "-"), "verdict": v} for k, v in verdicts.items()])


# ---- one source, two languages -------------------------------------------------------------------------------------


def _fields(node, path=""):
    if isinstance(node, dict) and set(node) == {"ko", "en"}:
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _fields(value, f"{path}.{key}")


def test_every_text_has_both_languages_with_the_same_placeholders():
    t = answers.texts()
    pairs = list(_fields(t))
    assert len(pairs) > 60
    for path, text in pairs:
        names = {lang: {f for _, f, _, _ in string.Formatter().parse(text[lang]) if f} for lang in ("ko", "en")}
        assert names["ko"] == names["en"], path
    assert set(t["answers"]) == set(answers.ORDER) == set(answers.COMPUTE)
    for key, spec in t["answers"].items():
        assert spec["problem"] in t["problems"], key


def test_combine_verdicts():
    assert answers.combine([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert answers.combine([REPRODUCED, NOT_REPRODUCED]) == PARTLY
    assert answers.combine([NOT_REPRODUCED, NOT_CHECKABLE]) == NOT_REPRODUCED
    assert answers.combine([NOT_CHECKABLE]) == NOT_CHECKABLE == answers.combine([])


def test_numbers_are_formatted_the_same_in_both_languages():
    assert answers.num(1.22474) == "1.225" and answers.num(0.00031) == "0.00031" and answers.num(float("nan")) == "—"
    assert answers.vector([1.2247, -1e-12, -1.2247]) == "1.225, 0.000, -1.225"


# ---- problem 9 ---------------------------------------------------------------------------------------------------------


SCORES = {"subjects": ["국어", "영어", "수학"], "scores": {"A": [90, 80, 70], "B": [60, 50, 40], "C": [90, 50, 70]}}


def test_problem9_answers_give_the_hand_computed_values():
    d = data({"problem9/scores.csv": standardized_scores(SCORES)})
    table = claims_table(d000_p9_A=REPRODUCED, d000_p9_B=REPRODUCED, d000_p9_C=REPRODUCED, d000_p9_subject=REPRODUCED)
    a = answers.answer("p9a", d, table, "ko")
    # A: mean 80, population std sqrt(200/3) = 8.165 -> (10, 0, -10) / 8.165
    assert "평균 80.0, 표준편차 8.165" in a.text and "(1.225, 0.000, -1.225)" in a.text
    assert "C는 평균 70.0" in a.text and "(1.225, -1.225, 0.000)" in a.text
    assert a.verdict == REPRODUCED and a.claim_ids == ["d000-p9-A", "d000-p9-B", "d000-p9-C"]
    b = answers.answer("p9b", d, table, "en")
    assert "A (1.000, 1.000, 1.000)" in b.text and "B (-1.000, -1.000, -1.000)" in b.text
    c = answers.answer("p9c", d, table, "en")
    assert "30.0-point gap" in c.text and "(80.0 vs 50.0)" in c.text and "largest difference 0.000" in c.text
    assert "up to 1.225" in c.text and c.verdict == REPRODUCED


def test_problem9_c_is_not_reproduced_when_the_pair_keeps_different_shapes():
    scores = {"subjects": ["x", "y", "z"], "scores": {"A": [90, 80, 70], "B": [60, 55, 40], "C": [1, 2, 3]}}
    c = answers.answer("p9c", data({"problem9/scores.csv": standardized_scores(scores)}), None, "ko")
    assert c.verdict == NOT_REPRODUCED


# ---- problem 10 --------------------------------------------------------------------------------------------------------


def _curve(rel_change):
    blocks = np.arange(37)
    length = np.sqrt(blocks + 1.0)
    return pd.DataFrame({"blocks": blocks, "mean_length": length, "std_length": 0.1, "mean_sq_length": (blocks + 1) * 1.01,
                         "se_sq_length": 0.0, "sqrt_L_plus_1": length, "rel_change": rel_change,
                         "turn_deg": np.r_[np.nan, np.degrees(np.arctan(1 / length[:-1]))]})


def test_problem10_answers():
    curve = _curve(np.r_[np.nan, 1 / np.sqrt(np.arange(1, 37))])
    table = curve.set_index("blocks").loc[[1, 4, 16, 36]].reset_index()
    d = data({"residual_sim/curve.csv": curve, "residual_sim/table.csv": table}, residual_sim={"trials": 2000})
    a = answers.answer("p10a", d, None, "en")
    assert "6.083 after 36 block(s)" in a.text and "2,000 streams" in a.text and "within 1.0%" in a.text
    assert a.verdict == NOT_CHECKABLE  # no claims table given: its claims are not judged
    b = answers.answer("p10b", d, None, "ko")
    assert "블록 1에서 1.000, 블록 36에서 0.167" in b.text and b.verdict == REPRODUCED  # the document's one sixth
    flat = _curve(np.r_[np.nan, np.ones(36)])
    d = data({"residual_sim/curve.csv": flat, "residual_sim/table.csv": table})
    assert answers.answer("p10b", d, None, "ko").verdict == NOT_REPRODUCED


def test_problem10_c_names_the_missing_qwen_checkpoint():
    layers = np.arange(5)
    lm = pd.DataFrame({"model": "m", "prompt": "en", "layer": layers, "norm_of_mean": [1, 2, 4, 8, 16.0],
                       "token_norm_p50": [1, 2, 4, 8, 32.0]})
    a = answers.answer("p10c", data({"probe/lm.csv": lm}), claims_table(d000_trained_faster_than_sqrt=REPRODUCED), "en")
    assert "2.0 after layer 1, 4.0 after 2, 16.0 after 4" in a.text and "grows ×16.0" in a.text
    assert "×1.6 for random directions" in a.text  # sqrt((4 + 1) / 2)
    assert "Qwen3-VL-4B checkpoint is not configured" in a.text and a.verdict == REPRODUCED


# ---- problem 11 --------------------------------------------------------------------------------------------------------


def _sweep():
    """post w0: stuck at 4.16; post w20: learns, first below 0.4159 at step 30; pre w0: first below at step 10."""
    steps = np.arange(1, 61)
    rows, summary = [], []
    for norm, warmup, first in (("post", 0, None), ("post", 20, 30), ("pre", 0, 10), ("pre", 20, 20)):
        for seed in (0, 1):
            run = f"{norm}-w{warmup}-s{seed}"
            loss = np.full(60, 4.16 + 0.0001 * seed) if first is None else np.where(steps < first + seed, 4.0, 0.01)
            rows.append(pd.DataFrame({"run": run, "norm": norm, "warmup": warmup, "seed": seed, "step": steps,
                                      "loss": loss, "lr": 1e-3}))
            summary.append({"run": run, "norm": norm, "warmup": warmup, "seed": seed, "final_loss": loss[-1],
                            "outcome": "stuck" if first is None else "learned"})
    return {"sweep/losses.csv": pd.concat(rows, ignore_index=True), "sweep/summary.csv": pd.DataFrame(summary)}


def test_problem11_a_and_b():
    d = data(_sweep())
    a = answers.answer("p11a", d, claims_table(d000_post_nowarm_stuck=REPRODUCED), "en")
    assert "seed 0 4.1600, seed 1 4.1601" in a.text and "2 of 2 seeds stayed above" in a.text
    assert "ln 64 = 0.9 × 4.159" in a.text and a.verdict == REPRODUCED
    b = answers.answer("p11b", d, None, "en")
    assert "below 0.416" in b.text
    assert "post-norm · no warm-up: no seed ever" in b.text
    assert "post-norm · 20-step warm-up: seed 0 30, seed 1 31" in b.text and "pre-norm · no warm-up: seed 0 10, seed 1 11" in b.text
    assert "trains 60 steps only" in b.text  # no step 100: the document's steps cannot be read


def test_problem11_c_without_and_with_the_sensitivity_study():
    tables = _sweep()
    absent = answers.answer("p11c", data(tables, sensitivity={"in_report": False}), None, "ko")
    assert "post" not in absent.text and "8번 가운데" not in absent.text
    assert "뒤 정규화는 4번 가운데 2번 끝에 배운 상태가 아니었고" in absent.text and "2번 가운데 2번 배웠다" in absent.text
    assert "민감도 연구는 이 실행에서 돌리지 않았다" in absent.text
    # present: two claims under two settings; one claim changes its verdict with the setting
    by_setting = pd.DataFrame([
        {"id": "c1", "setting": "s-default", "default": True, "verdict": REPRODUCED},
        {"id": "c1", "setting": "s-other", "default": False, "verdict": REPRODUCED},
        {"id": "c2", "setting": "s-default", "default": True, "verdict": REPRODUCED},
        {"id": "c2", "setting": "s-other", "default": False, "verdict": NOT_REPRODUCED},
        {"id": "c3", "setting": "s-default", "default": True, "verdict": NOT_CHECKABLE},
        {"id": "c3", "setting": "s-other", "default": False, "verdict": NOT_CHECKABLE}])
    summary = pd.DataFrame([
        {"family": "choices", "setting": "s-default", "norm": "post", "warmup": 0, "depth": 3, "outcome": "stuck"},
        {"family": "choices", "setting": "s-other", "norm": "post", "warmup": 0, "depth": 3, "outcome": "learned"},
        *[{"family": "depth_lr", "setting": f"g{d}{n}", "norm": n, "warmup": 0, "depth": d, "lr": 1e-3, "outcome": o}
          for d, n, o in ((1, "pre", "learned"), (1, "post", "learned"), (3, "pre", "learned"), (3, "post", "stuck"))]])
    tables = {**tables, "sensitivity/claims_by_setting.csv": by_setting, "sensitivity/summary.csv": summary}
    present = answers.answer("p11c", data(tables, sensitivity={"in_report": True}), None, "en")
    assert "2 settings: s-default, s-other" in present.text and "1 of 3 sweep claims keep their verdict" in present.text
    assert "(1 cannot be judged under any setting)" in present.text and "changes with the setting: c2." in present.text
    assert "s-default stuck 1; s-other learned 1" in present.text
    assert "1 blocks 100% vs 100%, 3 blocks 100% vs 0%" in present.text
    assert "Post-norm without warm-up learned at 1 blocks, lr 0.001, and did not at 3 blocks, lr 0.001." in present.text
    assert "jumped back" not in present.text  # a summary without the relapse columns (older tables): no sentence
    # with them: a learned run that fell back above 10% of ln 64 = 0.416 counts; one that stayed below, or never learned, not
    relapse = {("s-other", "post"): (5.28, 506), ("g1pre", "pre"): (0.02, 40), ("g1post", "post"): (0.3, 50)}
    summary = summary.assign(run=summary["norm"] + "-w0-s0",
                             relapse_loss=[relapse.get((s, n), (math.nan,))[0] for s, n in zip(summary["setting"], summary["norm"])],
                             relapse_step=[relapse.get((s, n), (0, math.nan))[1] for s, n in zip(summary["setting"], summary["norm"])])
    tables["sensitivity/summary.csv"] = summary
    present = answers.answer("p11c", data(tables, sensitivity={"in_report": True}), None, "en")
    assert ("above 10% of ln 64 (0.416) after they had learned (every run of the study): post-norm 1 of 2 "
            "(s-other post-w0-s0 5.280 at step 506), pre-norm 0 of 1.") in present.text, present.text
    assert "not trained here" not in present.text  # trained where it ran: no snapshot sentence
    # made from snapshots: the report says so, and on which processors the runs were trained (one count per run)
    summary = summary.assign(run_dir=[f"runs/{s}/{r}" for s, r in zip(summary["setting"], summary["run"])],
                             machine=["Intel Xeon"] * 2 + ["AMD EPYC"] * 4)
    tables["sensitivity/summary.csv"] = pd.concat([summary, summary.iloc[:1]], ignore_index=True)  # a run in both families
    present = answers.answer("p11c", data(tables, sensitivity={"in_report": True, "from_snapshots": ["snap/a", "snap/b"]}),
                             None, "en")
    assert ("The study's 6 runs were not trained here but read from the runs recorded in git (snap/a, snap/b; "
            "sensitivity.from_snapshots), trained on: AMD EPYC (4 runs); Intel Xeon (2 runs).") in present.text, present.text


# ---- document 004 ------------------------------------------------------------------------------------------------------


def test_exercise_answers():
    blocks = pd.DataFrame([{"case": "exercise1", "variant": "modern", "d_model": 512, "n_heads": 8, "ffn_ratio": 4.0,
                            "closed_form_total": 4195328, "built_numel": 4195328, "document_approx": 4194304.0,
                            "document_approx_rel_error": 4194304 / 4195328 - 1}])
    e1 = answers.answer("e1", data({"param_counts/blocks.csv": blocks}), claims_table(d004_exercise1=REPRODUCED), "en")
    assert "with RMSNorm, no biases, 4,195,328 by hand and 4,195,328 by numel (equal)" in e1.text and "the document's formula 4,194,304 (-0.02%)" in e1.text
    assert e1.verdict == REPRODUCED
    summary = pd.DataFrame([{"variant": v, "match_params": False, "seed": s, "steps": 100, "n_params": 1,
                             "final_loss": loss, "seq_accuracy": 0.5, "token_accuracy": 0.5}
                            for v, losses in (("classic", (1.0, 1.2)), ("modern", (0.5, 0.7)))
                            for s, loss in enumerate(losses)])
    e3 = answers.answer("e3", data({"reverse_copy/summary.csv": summary}), None, "en")
    assert "after 100 steps" in e3.text and "classic (LN, ReLU, sinusoidal) 1.100 ± 0.141" in e3.text
    assert "changes the loss by -0.500 (perplexity 3.00 → 1.82)" in e3.text  # exp(1.1), exp(0.6)


def test_exercise2_reads_the_twelve_block_stack():
    rows = [{"depth": 12, "norm": norm, "seed": 0, "block": b, "d_model": 16, "mean_token_norm": value(b),
             "mean_vector_norm": 1.0}
            for norm, value in (("post", lambda b: 4.0), ("pre", lambda b: 1.0 + b)) for b in range(13)]
    e2 = answers.answer("e2", data({"activation_norms/norms.csv": pd.DataFrame(rows)}), None, "en")
    assert "post-norm: input 4.00 → last block 4.00 (×1.00" in e2.text and "pre-norm: input 1.00 → last block 13.00 (×13.00" in e2.text
    assert "√d = 4.0" in e2.text and "changed ×13.00 over the 12 blocks" in e2.text


def test_markdown_carries_the_verdict_and_the_document_value():
    d = data({"problem9/scores.csv": standardized_scores(SCORES)})
    md = answers.answer("p9b", d, claims_table(d000_p9_subject=REPRODUCED), "ko").markdown("ko")
    assert 'data-answer="p9b"' in md and "재현됨" in md and "*문서의 값:* 과목마다 A가 +1" in md
    assert len(answers.ORDER) == 12
