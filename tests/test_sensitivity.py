"""The sensitivity study: its plan, early stop, tables, claim x setting, bad input, and the tiny family in Snakemake."""
import copy
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml


from blocklab.model_config import ConfigError
from blocklab.params_file import ParamsError, load_params, validate_params  # every study's checks too
from blocklab.reporting import claims
from blocklab.studies import cells as study_cells
from blocklab.reporting import sensitivity as study_claims  # claim x setting, robustness
from blocklab.studies.sensitivity import aggregate as study_report  # the study's tables
from blocklab.studies.sensitivity import plan as sens
from blocklab.studies.sensitivity import run as sens_run
from blocklab.studies.sensitivity.plan import held_batch
from blocklab.training.train import train

ROOT = Path(__file__).resolve().parents[1]
FULL = load_params(ROOT / "params.yaml")
TINY = load_params(ROOT / "configs/tiny.yaml")


# ---- the plan ------------------------------------------------------------------------------------------------------


def test_cell_names_round_trip_and_bad_names_are_refused():
    cell = study_cells.Cell("learned", 64, 12, 3e-4, "bf16")
    assert cell.name == "learned-b64-L12-lr0.0003-bf16" and study_cells.Cell.parse(cell.name) == cell
    with pytest.raises(Exception, match="not a cell name"):
        study_cells.Cell.parse("learned-32")
    assert re.fullmatch(study_cells.CELL_PATTERN, cell.name)


def test_a_cell_identical_to_a_main_sweep_run_is_that_run():
    plan = sens.plan(FULL)
    base = study_cells.default_cell(FULL).name
    main = plan[plan["main_sweep"]]
    # the default cell, seed 0, at both warm-ups and norms: in both families, pointing at data/sweep/runs
    assert set(main["setting"]) == {base} and set(main["seed"]) == {0}
    assert all(d.startswith("data/sweep/runs/") for d in main["run_dir"])
    # choices contains post/pre x w0/w400 of the default cell (a named cell, batch 64); the depth x lr grid holds its
    # own batch (sensitivity.batch_size: 32, where its runs were recorded), so its L24 lr 1e-3 cell is not the default
    assert held_batch(FULL) == 32 != FULL["copy_task"]["batch_size"]
    assert len(main) == 2 * 2 and set(main["family"]) == {"choices"}
    same = copy.deepcopy(FULL)
    same["sensitivity"]["batch_size"] = same["copy_task"]["batch_size"]  # held at the default: both families share it
    # each family's default-cell runs whose seed the main sweep trained: choices (seed 0) and the depth grid (seeds
    # 0-1 since the extra seeds), post/pre x w0/w400 each
    sweep_seeds = set(FULL["sweep"]["seeds"])
    shared = sum(len(sweep_seeds & set(FULL["sensitivity"][family]["seeds"])) for family in ("choices", "depth_lr"))
    assert shared == 3 and sens.plan(same)["main_sweep"].sum() == 2 * 2 * shared
    assert set(plan.loc[plan["family"] == "depth_lr", "batch_size"]) == {32}
    assert not plan.loc[~plan["main_sweep"], "run_dir"].str.startswith("data/sweep/").any()
    # every other run has a directory of its own, and none is planned twice
    dirs = sens.run_dirs(FULL)
    assert len(dirs) == len(set(dirs)) == plan["run_dir"].nunique()
    choices = plan[plan["family"] == "choices"]
    cases = 2 * 2 * 1  # norms x warm-ups x seeds
    bf16 = sens.available_precisions(FULL, ["bf16"]) == ["bf16"]  # bf16 at the default cell where the CPU has it
    named = len(FULL["sensitivity"]["choices"].get("cells", []))  # single cells beside the grid (batch 64)
    assert len(choices) == (2 * 3 + bf16 + named) * cases  # positions x batch sizes (crossed), + the other precision
    assert set(choices["precision"]) == ({"fp32", "bf16"} if bf16 else {"fp32"})
    held = study_cells.Cell.parse(base).__class__(FULL["copy_model"]["position"], 32, 24, 1e-3, "bf16").name
    assert set(choices.loc[choices["precision"] == "bf16", "setting"]) <= {held}  # at the held batch, as recorded


def test_status_tells_finished_checkpointed_and_untouched_runs_and_projects_from_the_trained_ones(tmp_path):
    planned = sens.plan(FULL).drop_duplicates("run_dir").set_index("run_dir")
    steps = FULL["sweep"]["steps"]
    finished = planned.index[planned["main_sweep"]][0]  # batch 32, 24 blocks
    (tmp_path / finished).mkdir(parents=True)
    (tmp_path / finished / "meta.json").write_text(json.dumps({"wall_time_s": 1200.0, "stopped_step": None}))
    deep = planned[(planned["depth"] == 24) & (planned["batch_size"] == 16) & (planned["precision"] == "fp32")].index[0]
    (tmp_path / deep).mkdir(parents=True)
    torch.save({"step": 300, "seconds": 150.0}, tmp_path / deep / "checkpoint.pt")
    frame = sens_run.status(FULL, tmp_path).set_index("run_dir")
    assert frame.loc[finished, "status"] == "finished" and frame.loc[finished, "steps_left"] == 0
    assert frame.loc[deep, ["status", "steps_done", "steps_left", "seconds"]].tolist() == ["checkpointed", 300, steps - 300, 150.0]
    assert (frame.drop([finished, deep])["status"] == "not started").all()
    left = sens_run.projected_seconds(frame.reset_index()).set_axis(frame.index)
    assert left[finished] == 0
    # one factor for fp32: the median of the two trained runs' seconds per step per batch x (depth + 1)
    per_unit = sorted([1200.0 / steps / (planned.loc[finished, "batch_size"] * 25), 150.0 / 300 / (16 * 25)])
    unit = (per_unit[0] + per_unit[1]) / 2
    assert left[deep] == pytest.approx((steps - 300) * 16 * 25 * unit)
    shallow = frame[(frame["depth"] == 2) & (frame["status"] == "not started") & (frame["precision"] == "fp32")].index[0]
    assert left[shallow] == pytest.approx(steps * frame.loc[shallow, "batch_size"] * 3 * unit)


def test_only_runs_off_the_documents_size_stop_early():
    stop, words = sens.early_stop_rule(FULL, study_cells.Cell("learned", 16, 24, 1e-3))
    assert stop is None and words is None  # the document's depth and learning rate: any batch, any position
    stop, words = sens.early_stop_rule(FULL, study_cells.Cell("sinusoidal", 32, 6, 3e-3))
    rule = FULL["sensitivity"]["early_stop"]
    n, below = rule["for_steps"], rule["loss_below"]
    assert f"{below:g}" in words and str(n) in words
    assert not stop([below / 2] * (n - 1)) and stop([4.0] + [below / 2] * n)
    assert not stop([below / 2] * (n - 1) + [below * 2])


def test_identity_changes_with_what_decides_the_numbers_only():
    name = "learned-b16-L24-lr0.001-fp32"
    base = sens.run_identity(FULL, name)
    more = copy.deepcopy(FULL)
    more["sensitivity"]["choices"]["batch_sizes"].append(128)  # another cell: this one's identity is unchanged
    more["sensitivity"]["depth_lr"]["lrs"].append(1e-2)
    assert sens.run_identity(more, name) == base
    deeper = copy.deepcopy(FULL)
    deeper["copy_model"]["d_model"] = 256
    assert sens.run_identity(deeper, name) != base
    assert base["model"]["position"] == "learned" and base["task"]["batch_size"] == 16 and base["early_stop"] is None
    assert sens.run_identity(FULL, "learned-b32-L6-lr0.001-fp32")["early_stop"] == FULL["sensitivity"]["early_stop"]


def test_steps_to_learn_is_the_first_step_of_the_first_long_enough_run_below_the_threshold():
    steps = pd.Series(range(1, 11))
    losses = pd.Series([4, 0.01, 4, 0.01, 0.01, 0.01, 4, 0.01, 0.01, 0.01])
    assert study_report.steps_to_learn(losses, steps, below=0.05, for_steps=3) == 4
    assert study_report.steps_to_learn(losses, steps, below=0.05, for_steps=4) != study_report.steps_to_learn(losses, steps, 0.05, 3)
    assert math.isnan(study_report.steps_to_learn(losses, steps, below=0.05, for_steps=4))


# ---- early stop in the training loop ---------------------------------------------------------------------------------


def _tiny_problem(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def next_batch(gen):
        idx = torch.randint(0, 64, (16,), generator=gen)
        return x[idx], y[idx]

    return model, next_batch, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1])


def test_early_stop_ends_training_at_the_first_step_the_rule_holds_and_resumes_to_the_same_step(tmp_path):
    rule = lambda losses: len(losses) >= 3 and all(v < 1.0 for v in losses[-3:])  # noqa: E731
    model, next_batch, loss_fn = _tiny_problem()
    whole = train(model, next_batch, loss_fn, steps=400, lr=0.05, warmup=0, generator=torch.Generator().manual_seed(0),
                  stop_when=rule)
    assert whole.stopped_step is not None and whole.stopped_step == len(whole.losses) < 400
    assert all(v < 1.0 for v in whole.losses[-3:]) and not rule(whole.losses[:-1])

    calls = {"n": 0}
    model, next_batch, loss_fn = _tiny_problem()

    def interrupted(gen):
        calls["n"] += 1
        if calls["n"] == whole.stopped_step - 2:
            raise KeyboardInterrupt  # killed a few steps before the rule would fire, after a checkpoint
        return next_batch(gen)

    ckpt = tmp_path / "checkpoint.pt"
    with pytest.raises(KeyboardInterrupt):
        train(model, interrupted, loss_fn, steps=400, lr=0.05, warmup=0, generator=torch.Generator().manual_seed(0),
              stop_when=rule, checkpoint=ckpt, checkpoint_every=2)
    model, next_batch, loss_fn = _tiny_problem()
    resumed = train(model, next_batch, loss_fn, steps=400, lr=0.05, warmup=0,
                    generator=torch.Generator().manual_seed(0), stop_when=rule, checkpoint=ckpt, checkpoint_every=2)
    assert resumed.resumed_from > 0
    assert resumed.stopped_step == whole.stopped_step and resumed.losses == whole.losses  # same path: bit-identical


# ---- claims --------------------------------------------------------------------------------------------------------


def _grid_summary(learned: dict, seeds: int = 1) -> pd.DataFrame:
    """A hand-made depth x lr summary: learned[(depth, norm)] = how many of the 4 runs of each seed learned."""
    rows = []
    for (depth, norm), k in learned.items():
        for seed in range(seeds):
            for i in range(4):
                rows.append({"family": "depth_lr", "depth": depth, "norm": norm, "lr": [1e-3, 3e-3][i % 2],
                             "warmup": [0, 400][i // 2], "seed": seed, "outcome": "learned" if i < k else "stuck"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("learned, seeds, verdict", [
    # per pairing of lr, warm-up and seed: the gap (pre learned - post learned) at the deepest depth minus at the
    # shallowest (-1, 0 or 1), by the exact sign test over the pairings that moved
    ({(2, "pre"): 4, (2, "post"): 4, (12, "pre"): 4, (12, "post"): 2, (24, "pre"): 4, (24, "post"): 0}, 2,
     "reproduced"),  # 8 of 8 up: p = 0.008 (one seed's 4 of 4 would be p = 0.125: inconclusive)
    ({(2, "pre"): 4, (2, "post"): 4, (24, "pre"): 4, (24, "post"): 1}, 1, "inconclusive"),  # 3 up, 1 unchanged
    ({(2, "pre"): 4, (2, "post"): 0, (24, "pre"): 4, (24, "post"): 4}, 2, "not reproduced"),  # the gap shrinks
    # no gap at all, one seed: the sign test over 4 pairings can never reach p < 0.05, so the rule would say "not
    # reproduced" of a true statement every time (the error rates): that verdict carries nothing, inconclusive
    ({(2, "pre"): 4, (2, "post"): 4, (24, "pre"): 4, (24, "post"): 4}, 1, "inconclusive"),
])
def test_depth_claim_on_hand_made_grids(learned, seeds, verdict):
    data = claims.Data(".", FULL, tables={"sensitivity/summary.csv": _grid_summary(learned, seeds)})
    claim = next(c for c in claims.load_claims() if c["id"] == "d000-depth-gap")
    measured, measures = claims.CHECKS["depth_gap"](data)
    _, judged = claims.judge_claim(claim, measures)
    assert judged.verdict == verdict, (measured, judged.margin)
    # seeds to decide wherever the error rates are below 0.8, a decided verdict's too, never where both are
    low = judged.p_reproduced_if_true is not None and min(judged.p_reproduced_if_true, judged.p_rejected_if_off) < 0.8
    assert (judged.seeds_to_decide is not None or "no count up to" in judged.margin) == low, judged.margin
    assert "24 blocks" in measured and "2 blocks" in measured


def _cell_runs(setting: str, post_w0_final: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hand-made runs of one choices cell at the document's size: three seeds of every norm x warm-up case."""
    cell = study_cells.Cell.parse(setting)
    curves, rows = [], []
    for norm in ("post", "pre"):
        for warmup in (0, 400):
            for seed in range(3):
                final = post_w0_final if (norm, warmup) == ("post", 0) else 1e-3
                loss = [4.16] * 150 + [final] * 1050
                ident = dict(family="choices", setting=setting, position=cell.position, batch_size=cell.batch_size,
                             depth=24, lr=1e-3, precision="fp32", norm=norm, warmup=warmup, seed=seed,
                             run=f"{norm}-w{warmup}-s{seed}")
                curves.append(pd.DataFrame({"step": range(1, 1201), "loss": loss}).assign(**ident))
                rows.append({**ident, "final_loss": final, "min_loss": min(loss),
                             "outcome": "stuck" if final > 4 else "learned"})
    return pd.concat(curves, ignore_index=True), pd.DataFrame(rows)


def test_claim_by_setting_judges_each_setting_on_its_own_runs():
    a = study_cells.default_cell(FULL).name  # the default setting, and the same cell under the other position signal
    other = next(p for p in ("learned", "sinusoidal") if p != study_cells.default_cell(FULL).position)
    b = a.replace(study_cells.default_cell(FULL).position, other, 1)
    batch = study_cells.default_cell(FULL).batch_size
    c = a.replace(f"-b{batch}-", f"-b{2 * batch}-", 1)  # the default cell at twice the batch
    la, sa = _cell_runs(a, post_w0_final=4.1616)  # post-norm without warm-up stuck, as the document says
    lb, sb = _cell_runs(b, post_w0_final=1e-3)    # ... and here it learned
    lc, sc = _cell_runs(c, post_w0_final=4.1616)
    # gradients at init: flat at the default batch, growing toward the output at twice that batch
    gradnorm = pd.DataFrame([{"position": p, "batch_size": bs, "norm": n, "seed": 0, "block": k, "loss": 4.2,
                              "grad_norm": 1.0 if bs == batch else k / 12}
                             for p in ("sinusoidal", "learned") for bs in (batch, 2 * batch) for n in ("post", "pre")
                             for k in range(1, 25)])
    table = study_claims.claims_by_setting(FULL, pd.concat([la, lb, lc]), pd.concat([sa, sb, sc]), gradnorm)
    verdict = table.set_index(["id", "setting"])["verdict"]
    measured = table.set_index(["id", "setting"])["measured"]
    decide = table.set_index(["id", "setting"])["seeds_to_decide"]
    # 3 of 3 stuck, as the document's 3 of 3: the rule says reproduced, but 3 seeds cannot tell "every seed" from
    # one run in five not stuck (the off world: 0.8^3 = 0.51 > 0.2), so the gate keeps it undecided, 8 seeds to decide
    assert verdict[("d000-post-nowarm-stuck", a)] == "inconclusive" and decide[("d000-post-nowarm-stuck", a)] == 8
    assert "the rule alone: reproduced" in table.set_index(["id", "setting"]).loc[("d000-post-nowarm-stuck", a), "margin"]
    # 0 of 3 stuck where the document says "in all three seeds": each run a part (count scope every seed), none
    # meets it: not reproduced, and it stands (never said of a true statement); its p_rejected_if_off is below 0.8
    # at 3 seeds (1 - 0.8^3), so the row still names the 8 seeds at which both rates would reach 0.8 (a † row)
    assert verdict[("d000-post-nowarm-stuck", b)] == "not reproduced" and decide[("d000-post-nowarm-stuck", b)] == 8
    # each cell reads the gradients of its own batch: flat at the default batch, growing at twice it. One seed has no
    # interval, so the trend part and the last block's value part (1.0 and 2.0 against 1.07) are both inconclusive
    # whatever their points: one run of a random quantity decides nothing
    assert "×1.00" in measured[("d000-gradnorm-post-grows", a)] and "×9.00" in measured[("d000-gradnorm-post-grows", c)]
    assert verdict[("d000-gradnorm-post-grows", a)] == "inconclusive"
    assert verdict[("d000-gradnorm-post-grows", c)] == "inconclusive"
    assert {"kind", "margin", "seeds_to_decide"} <= set(table.columns)
    assert set(table["setting"]) == {a, b, c} and table.loc[table["setting"] == a, "default"].all()
    with pytest.raises(ConfigError, match="no batch_size column.*sensitivity gradnorm"):  # a table from before
        study_claims.claims_by_setting(FULL, la, sa, gradnorm.drop(columns="batch_size"))
    assert set(table["id"]) == {c["id"] for c in claims.load_claims() if c["check"] in claims.SWEEP_CHECKS}
    robust = study_claims.robustness(table).set_index("id")
    assert not robust.loc["d000-post-nowarm-stuck", "robust"]
    assert robust.loc["d000-post-nowarm-stuck", "default_verdict"] == "inconclusive"


# ---- bad input -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("edit, key, allowed", [
    (lambda s: s["choices"].update(positions=["learnt"]), "sensitivity.choices.positions[0]", "allowed values"),
    (lambda s: s["choices"].update(positions=[]), "sensitivity.choices.positions", "at least 1"),
    (lambda s: s["choices"].update(batch_sizes=[16, 16]), "sensitivity.choices.batch_sizes", "repeated: 16"),
    (lambda s: s["choices"].update(batch_sizes=[0]), "sensitivity.choices.batch_sizes[0]", ">= 1"),
    (lambda s: s["depth_lr"].update(depths=[-2, 6]), "sensitivity.depth_lr.depths[0]", ">= 1"),
    (lambda s: s["depth_lr"].update(lrs=[0.0, 1e-3]), "sensitivity.depth_lr.lrs[0]", "> 0"),
    (lambda s: s["depth_lr"].update(lrs=[]), "sensitivity.depth_lr.lrs", "at least 1"),
    (lambda s: s["early_stop"].update(for_steps=5000), "sensitivity.early_stop.for_steps", "never fire"),
    (lambda s: s["early_stop"].update(loss_below=4.2), "sensitivity.early_stop.loss_below", "not below chance"),
    (lambda s: s["early_stop"].update(loss_below=0), "sensitivity.early_stop.loss_below", "> 0"),
    (lambda s: s.pop("early_stop"), "sensitivity", "missing required key(s) ['early_stop']"),
    (lambda s: s.update(from_snapshots=["no/such/snapshot"]), "sensitivity.from_snapshots", "sensitivity snapshot"),
    (lambda s: s["choices"].update(cells=["learned-b64"]), "sensitivity.choices.cells[0]", "{position}-b{batch}"),
    (lambda s: s["choices"].update(cells=["learnt-b64-L24-lr0.001-fp32"]), "sensitivity.choices.cells[0]",
     "allowed: learned, sinusoidal, rope, none"),
    (lambda s: s["choices"].update(cells=["learned-b128-L24-lr0.001-fp32"]), "sensitivity.from_snapshots",
     "lack 4 planned run(s): learned-b128-L24-lr0.001-fp32/post-w0-s0"),
])
def test_bad_sensitivity_parameters_name_the_key_and_the_allowed_values(edit, key, allowed):
    params = copy.deepcopy(FULL)
    edit(params["sensitivity"])
    with pytest.raises(ParamsError) as err:
        validate_params(params)
    assert key in str(err.value) and allowed in str(err.value), str(err.value)


def test_gradients_at_init_are_measured_at_every_position_and_batch_the_study_plans():
    from blocklab.experiments.gradnorm import gradnorm_frame

    params = copy.deepcopy(TINY)
    params["gradnorm"]["seeds"] = [0]
    params["sensitivity"]["choices"]["cells"] = ["learned-b4-L3-lr0.001-fp32"]  # a named cell at another batch
    frame = sens_run.gradnorm_by_choice(params)
    planned = sens.plan(params)
    pairs = set(planned.loc[planned["family"] == "choices", ["position", "batch_size"]].itertuples(index=False, name=None))
    assert set(frame[["position", "batch_size"]].itertuples(index=False, name=None)) == pairs and (("learned", 4) in pairs)
    # the named cell's rows are the gradnorm experiment run at its own position and batch (same code path, same
    # seed: bit-identical), and differ from the default batch's (another batch of sequences)
    direct = copy.deepcopy(params)
    direct["copy_model"]["position"], direct["copy_task"]["batch_size"] = "learned", 4
    mine = frame[(frame["position"] == "learned") & (frame["batch_size"] == 4)].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine[["norm", "seed", "block", "grad_norm", "loss"]], gradnorm_frame(direct))
    other = frame[(frame["position"] == "learned") & (frame["batch_size"] == params["copy_task"]["batch_size"])]
    assert not np.allclose(other["grad_norm"].to_numpy(), mine["grad_norm"].to_numpy())


def test_the_recorded_studies_name_their_batch_so_another_default_batch_keeps_them():
    """The study's grids off the batch axis hold sensitivity.batch_size and the collapse family names its settings, so
    the snapshots serve any default batch they record: batch 32 (the default before batch 64) is one -S away, with
    nothing retrained and nothing judged at another batch; a default the snapshots do not record is refused, naming
    the key."""
    params = copy.deepcopy(FULL)
    assert params["copy_task"]["batch_size"] == 64  # the document's most likely setup (docs/dynamics.md)
    params["copy_task"]["batch_size"] = 32
    validate_params(params)
    planned = sens.plan(params)
    assert set(planned.loc[planned["main_sweep"], "setting"]) == {"learned-b32-L24-lr0.001-fp32"}
    assert set(planned["batch_size"]) == {16, 32, 48, 64}  # the grid, the named batch-64 cell, the held batch
    params["copy_task"]["batch_size"] = 24  # no recorded run has this batch: its cells are not in the snapshots
    params["sensitivity"]["choices"]["batch_sizes"] = [16, 24, 32]
    with pytest.raises(ParamsError, match="sensitivity.from_snapshots"):
        validate_params(params)
    params["sensitivity"]["in_report"] = params["dynamics"]["in_report"] = False
    validate_params(params)
    params["sensitivity"]["from_snapshots"] = ["no/such/snapshot"]  # a snapshot that is not there is still refused
    with pytest.raises(ParamsError, match="sensitivity.from_snapshots"):
        validate_params(params)


def test_a_named_cell_is_planned_whole_and_its_positions_are_the_schemas():
    from blocklab.params_file import schema
    from blocklab.model_config import POSITION_KINDS

    params = copy.deepcopy(TINY)
    params["sensitivity"]["choices"]["cells"] = ["learned-b4-L3-lr0.001-fp32", "learned-b8-L3-lr0.001-fp32"]
    planned = sens.plan(params)
    extra = planned[planned["setting"] == "learned-b4-L3-lr0.001-fp32"]
    grid = sens.plan(TINY)
    assert sorted(extra["run"]) == sorted(grid[(grid["family"] == "choices")
                                               & (grid["setting"] == "learned-b8-L3-lr0.001-fp32")]["run"])
    assert len(planned) == len(grid) + len(extra)  # the grid's own cell, named again, is planned once
    assert tuple(schema()["$defs"]["position"]["enum"]) == POSITION_KINDS


def test_a_candidate_cell_is_trained_and_recorded_before_params_name_it(snake_project, tmp_path, capsys):
    """The validation flow: train-sensitivity --add-cell trains a cell the plan lacks (without the flag: refused before
    any compute), sensitivity-snapshot --add-cell records it alone, and params naming the cell are then accepted with
    that snapshot beside the old ones (refused without it)."""
    import shutil

    from blocklab.cli import main

    project = tmp_path / "p"
    shutil.copytree(snake_project / "data" / "sweep" / "runs", project / "data" / "sweep" / "runs")
    tiny = copy.deepcopy(TINY)
    for family in ("choices", "depth_lr"):  # the study recorded as the default params.yaml has it, from the tiny DAG
        assert main(["sensitivity", "snapshot", "--params", str(ROOT / "configs/tiny.yaml"), "--root", str(snake_project),
                     "--family", family, "--out", str(project / "snap" / family)]) == 0
    shared = pd.read_csv(project / "snap/depth_lr/runs.csv")  # the default cell's runs: recorded once
    from blocklab.integrity import record_snapshot
    from blocklab.io import write_table

    # a deliberate edit, written as the pipeline writes tables (with its checksum record), then recorded
    write_table(shared[~shared["run_dir"].isin(pd.read_csv(project / "snap/choices/runs.csv")["run_dir"])],
                project / "snap/depth_lr/runs.csv")

    record_snapshot(project / "snap/depth_lr")  # a deliberate edit, recorded (else refused as damaged)
    tiny["sensitivity"]["from_snapshots"] = [str(project / "snap" / f) for f in ("choices", "depth_lr")]
    path = project / "params.yaml"
    path.write_text(yaml.safe_dump(tiny, allow_unicode=True), encoding="utf-8")
    cell = "learned-b4-L3-lr0.001-fp32"
    runs = [(norm, warmup) for norm in tiny["sweep"]["norms"] for warmup in tiny["sweep"]["warmups"]]
    train = lambda norm, warmup, *flag: main(["sensitivity", "train", "--params", str(path), "--cell", cell, "--norm", norm,  # noqa: E731
                                              "--warmup", str(warmup), "--seed", "0", "--out-dir",
                                              str(project / sens.RUNS / cell / f"{norm}-w{warmup}-s0"), *flag])
    assert train(*runs[0]) == 2 and not (project / sens.RUNS / cell).exists()
    for norm, warmup in runs:
        assert train(norm, warmup, "--add-cell") == 0
    assert main(["sensitivity", "snapshot", "--params", str(path), "--root", str(project), "--setting", cell,
                 "--add-cell", cell, "--out", str(project / "snap" / "candidate")]) == 0
    recorded = pd.read_csv(project / "snap/candidate/runs.csv")
    assert set(recorded["setting"]) == {cell} and len(recorded) == len(runs)
    # on a machine without those runs, rewriting the snapshot would drop them: refused, the snapshot untouched
    shutil.move(project / sens.RUNS, tmp_path / "moved")
    capsys.readouterr()
    assert main(["sensitivity", "snapshot", "--params", str(path), "--root", str(project), "--setting", cell,
                 "--add-cell", cell, "--out", str(project / "snap" / "candidate")]) == 2
    assert "which rewriting it would drop" in capsys.readouterr().err
    pd.testing.assert_frame_equal(pd.read_csv(project / "snap/candidate/runs.csv"), recorded)
    tiny["sensitivity"]["choices"]["cells"] = [cell]
    with pytest.raises(ParamsError, match=f"lack {len(runs)} planned run"):
        validate_params(tiny)
    tiny["sensitivity"]["from_snapshots"].append(str(project / "snap" / "candidate"))
    assert validate_params(tiny)["sensitivity"]["choices"]["cells"] == [cell]


def test_training_a_run_outside_the_plan_or_with_bad_params_fails_before_any_compute(tmp_path):
    from blocklab.cli import main

    out = tmp_path / "run"
    out.mkdir()
    (out / "marker").write_text("kept")
    assert main(["sensitivity", "train", "--params", str(ROOT / "params.yaml"), "--cell", "learned-b999-L24-lr0.001-fp32",
                 "--norm", "pre", "--warmup", "0", "--seed", "0", "--out-dir", str(out)]) == 2
    bad = copy.deepcopy(FULL)
    bad["sensitivity"]["depth_lr"]["depths"] = [0]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad, allow_unicode=True), encoding="utf-8")
    assert main(["sensitivity", "train", "--params", str(path), "--cell", "learned-b16-L24-lr0.001-fp32",
                 "--norm", "pre", "--warmup", "0", "--seed", "0", "--out-dir", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["marker"]


# ---- the tiny family, end to end in Snakemake ---------------------------------------------------------------------


def test_a_main_sweeps_tables_record_its_cell_as_its_run_folders_do(snake_project, tmp_path, capsys):
    """`sensitivity snapshot --from-sweep DATA` (a cell that is a main sweep's own setup, read from that sweep's tables,
    e.g. an old gallery taken from git, instead of training it again) gives the snapshot that the runs' own folders
    give: the same losses and the same summary row for every run, bar the processor it is told. Refused, naming the
    key, when the sweep's setup is not the cell's, and without --machine."""
    import shutil

    from blocklab.cli import main

    cell = "learned-b8-L3-lr0.001-fp32"  # configs/tiny.yaml's main sweep, planned by its study at the document's size
    data = tmp_path / "old-gallery"
    (data / "sweep").mkdir(parents=True)
    shutil.copy(ROOT / "configs/tiny.yaml", data / "params.yaml")
    for table in ("summary.csv", "losses.csv"):
        shutil.copy(snake_project / "data" / "sweep" / table, data / "sweep" / table)
    snapshot = ["sensitivity", "snapshot", "--params", str(ROOT / "configs/tiny.yaml"), "--setting", cell]
    assert main([*snapshot, "--root", str(snake_project), "--out", str(tmp_path / "from-dirs")]) == 0
    assert main([*snapshot, "--from-sweep", str(data), "--machine", "the old processor",
                 "--out", str(tmp_path / "from-sweep")]) == 0
    dirs, sweep = (pd.read_csv(tmp_path / d / "summary.csv") for d in ("from-dirs", "from-sweep"))
    planned = sens.plan(TINY)
    planned = planned[planned["setting"] == cell].drop_duplicates("run_dir")
    assert len(planned) >= 4 and sorted(dirs["run"]) == sorted(planned["run"])
    assert (sweep["machine"] == "the old processor").all()
    pd.testing.assert_frame_equal(dirs.drop(columns="machine"), sweep.drop(columns="machine"), check_exact=True)
    key = ["run", "step"]
    pd.testing.assert_frame_equal(*(pd.read_csv(tmp_path / d / "losses.csv").sort_values(key, ignore_index=True)
                                    for d in ("from-dirs", "from-sweep")), check_exact=True)
    # the seed filter: only the planned seed's runs (the sweep's other seeds are not the study's)
    seed = int(planned["seed"].min())
    assert main([*snapshot, "--from-sweep", str(data), "--machine", "m", "--seed", str(seed), "--out", str(tmp_path / "s")]) == 0
    assert sorted(pd.read_csv(tmp_path / "s" / "runs.csv")["run"]) == sorted(planned.loc[planned["seed"] == seed, "run"])
    capsys.readouterr()
    # refused: no processor named; a sweep of another width (not the cell's runs); an unplanned seed
    assert main([*snapshot, "--from-sweep", str(data), "--out", str(tmp_path / "no")]) == 2
    assert "--from-sweep needs --machine" in capsys.readouterr().err
    other = yaml.safe_load((data / "params.yaml").read_text(encoding="utf-8"))
    other["copy_model"]["d_model"] *= 2
    (data / "params.yaml").write_text(yaml.safe_dump(other), encoding="utf-8")
    assert main([*snapshot, "--from-sweep", str(data), "--machine", "m", "--out", str(tmp_path / "no")]) == 2
    assert "copy_model differs from the study's learned-b8-L3-lr0.001-fp32" in capsys.readouterr().err
    assert main([*snapshot, "--seed", "7", "--root", str(snake_project), "--out", str(tmp_path / "no")]) == 2
    assert f"--seed: 7 not planned; allowed: {', '.join(map(str, sorted(sens.plan(TINY)['seed'].unique())))}" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_the_tiny_study_builds_its_tables_and_figures_and_reuses_main_sweep_runs(snake_project):
    study = snake_project  # the tiny DAG (conftest.py) runs the study: configs/tiny.yaml has sensitivity.in_report: true
    summary = pd.read_csv(study / sens.TABLES["summary"])
    plan = sens.plan(TINY)
    assert len(summary) == len(plan)
    assert set(summary.loc[summary["main_sweep"], "run_dir"]) <= {f"data/sweep/runs/{r}" for r in plan["run"]}
    trained = {str(p.parent.relative_to(study)) for p in (study / sens.RUNS).glob("*/*/meta.json")}
    assert trained == set(plan.loc[~plan["main_sweep"], "run_dir"])  # nothing identical to the main sweep trained twice
    assert {"relapse_loss", "relapse_step"} <= set(summary.columns)
    reasons = set(summary["stop_reason"])
    assert any(r.startswith("early stop at step") for r in reasons), reasons  # tiny's rule fires for some cells
    assert not summary.loc[summary["family"] == "choices", "stop_reason"].str.startswith("early").any()
    for row in summary[summary["stop_reason"].str.startswith("early")].itertuples():
        meta = json.loads((study / row.run_dir / "meta.json").read_text())
        assert meta["stopped_step"] == row.trained_steps < TINY["sweep"]["steps"] and row.outcome == "learned"
        assert meta["sensitivity_cell"]["name"] == row.setting
    by_setting = pd.read_csv(study / sens.TABLES["claims_by_setting"])
    assert set(by_setting["setting"]) == set(plan.loc[plan["family"] == "choices", "setting"])
    assert {"position", "batch_size", "precision", "verdict"} <= set(by_setting.columns)
    for figure in sens.FIGURES:
        assert (study / "figs" / f"{figure}.png").stat().st_size > 10_000
        sidecar = json.loads((study / "figs" / f"{figure}.json").read_text())
        assert sidecar["sources"] and sidecar["params"]["sensitivity"] == TINY["sensitivity"]


def test_adding_a_value_trains_only_the_new_runs(snake_project):
    from test_pipeline import jobs_after_edit

    study = snake_project
    jobs = jobs_after_edit(study, "    lrs: [1.0e-3, 3.0e-3]\n", "    lrs: [1.0e-3, 3.0e-3, 1.0e-2]\n")
    new_runs = len(TINY["sensitivity"]["depth_lr"]["depths"]) * 2 * 1 * 1  # depths x norms x warm-ups x seeds
    assert jobs.get("train_sensitivity") == new_runs and "train_copy" not in jobs, jobs
    jobs = jobs_after_edit(study, "    seeds: [0]\n", "    seeds: [0, 1]\n")  # choices.seeds: seed 1 is in the main sweep
    # the default cell's seed-1 runs are the main sweep's own, already trained; only the learned cell trains
    assert "train_copy" not in jobs and jobs.get("train_sensitivity") == 2 * 2, jobs


def test_verdicts_so_far_judge_only_the_cells_whose_runs_have_all_finished(snake_project, tmp_path, capsys):
    import shutil

    from blocklab.cli import main

    shutil.copytree(snake_project / "data", tmp_path / "data")
    study = pd.read_csv(snake_project / sens.TABLES["claims_by_setting"])
    verdicts = lambda t: dict(zip(zip(t["id"], t["setting"]), t["verdict"]))  # noqa: E731
    table, judged, cells = study_claims.finished_verdicts(TINY, tmp_path)
    assert judged == cells == study["setting"].nunique() and verdicts(table) == verdicts(study)
    # one run of a non-default cell is not finished (its meta.json is what marks a finished run): that cell drops out
    base = study_cells.default_cell(TINY).name
    plan = sens.plan(TINY)
    other = plan[(plan["family"] == "choices") & (plan["setting"] != base)].iloc[0]
    (tmp_path / other.run_dir / "meta.json").unlink()
    table, judged, cells = study_claims.finished_verdicts(TINY, tmp_path)
    assert judged == cells - 1 and other.setting not in set(table["setting"])
    assert verdicts(table) == {k: v for k, v in verdicts(study).items() if k[1] != other.setting}
    out = tmp_path / "so_far.csv"
    assert main(["sensitivity", "verdicts", "--params", str(ROOT / "configs/tiny.yaml"), "--root", str(tmp_path),
                 "--out", str(out)]) == 0
    assert f"{cells - 1} of {cells} open-choice cells" in capsys.readouterr().out
    assert verdicts(pd.read_csv(out)) == verdicts(table)


def test_relapse_is_the_worst_loss_after_the_run_had_learned():
    steps = pd.Series(range(1, 11))
    # learned at step 3 (3 steps below 0.05 from there), spiked at 7, recovered
    losses = pd.Series([4.2, 0.3, 0.01, 0.02, 0.01, 0.03, 5.3, 3.8, 0.02, 0.001])
    assert study_report.relapse(losses, steps, below=0.05, for_steps=3) == (5.3, 7.0)
    assert study_report.relapse(losses.where(steps != 7, 0.04), steps, below=0.05, for_steps=3) == (3.8, 8.0)
    # the streak itself is not a relapse: learned at 3 with for_steps 2, the worst afterwards is at step 7 too
    assert study_report.relapse(losses, steps, below=0.05, for_steps=2) == (5.3, 7.0)
    never = study_report.relapse(pd.Series([4.2, 0.01, 4.0]), pd.Series([1, 2, 3]), below=0.05, for_steps=2)
    assert all(math.isnan(v) for v in never)
    last = study_report.relapse(pd.Series([4.2, 0.01, 0.01]), pd.Series([1, 2, 3]), below=0.05, for_steps=2)
    assert all(math.isnan(v) for v in last)  # nothing after the run had learned


def test_a_snapshot_re_aggregates_to_the_studys_own_tables_and_names_what_it_lacks(snake_project, tmp_path):
    """The study from git without the trained runs: each family recorded on its own (sensitivity-snapshot), then
    aggregated from the records (aggregate-sensitivity --from) gives the study's own summary and claim x setting,
    exactly (the records keep every loss unrounded)."""
    import shutil

    from blocklab.cli import main
    from blocklab.provenance import cpu_name

    tiny = str(ROOT / "configs/tiny.yaml")
    for family in ("choices", "depth_lr"):
        assert main(["sensitivity", "snapshot", "--params", tiny, "--root", str(snake_project), "--family", family,
                     "--machine", "test CPU", "--out", str(tmp_path / family)]) == 0
    runs = pd.concat([pd.read_csv(tmp_path / f / "runs.csv") for f in ("choices", "depth_lr")])
    # the default cell's runs belong to both families: each snapshot recorded them
    assert set(runs["run_dir"]) == set(sens.plan(TINY)["run_dir"])
    assert set(runs["machine"]) == {cpu_name() or "test CPU"}  # meta.json names the processor; --machine fills a gap
    with pytest.raises(ConfigError, match="more than one snapshot"):
        sens.read_records([tmp_path / "choices", tmp_path / "depth_lr"])
    shared = pd.read_csv(tmp_path / "depth_lr" / "runs.csv")
    from blocklab.integrity import record_snapshot
    from blocklab.io import write_table

    # a deliberate edit, written as the pipeline writes tables (with its checksum record), then recorded
    write_table(shared[~shared["run_dir"].str.startswith("data/sweep/")], tmp_path / "depth_lr" / "runs.csv")

    record_snapshot(tmp_path / "depth_lr")  # a deliberate edit, recorded (else refused as damaged)

    root = tmp_path / "study"
    (root / sens.ROOT).mkdir(parents=True)
    shutil.copy(snake_project / sens.GRADNORM, root / sens.GRADNORM)
    assert main(["sensitivity", "aggregate", "--params", tiny, "--root", str(root),
                 "--from", str(tmp_path / "choices"), str(tmp_path / "depth_lr")]) == 0
    for table in ("summary", "claims_by_setting"):
        pd.testing.assert_frame_equal(*(pd.read_csv(r / sens.TABLES[table]) for r in (root, snake_project)))

    # a snapshot that lacks a planned run is refused, naming it
    short = pd.read_csv(tmp_path / "choices" / "runs.csv")
    write_table(short.iloc[1:], tmp_path / "choices" / "runs.csv")
    record_snapshot(tmp_path / "choices")
    with pytest.raises(ConfigError, match=f"lack 1 planned run.*{short.iloc[0].setting}/{short.iloc[0].run}"):
        study_report.aggregate(TINY, root, [tmp_path / "choices", tmp_path / "depth_lr"])


def test_the_pipeline_makes_the_study_from_snapshots_and_trains_none_of_it(snake_project, tmp_path):
    """sensitivity.from_snapshots: Snakemake makes the study's tables and figures from recorded runs, with no run of
    the study trained (there are none in this copy), and they equal the tables made from the trained runs."""
    import shutil

    from tiny_dag import run_in_project

    project = tmp_path / "project"
    shutil.copytree(snake_project, project, symlinks=True, ignore=shutil.ignore_patterns(".snakemake"))
    shutil.rmtree(project / sens.RUNS)
    for family in ("choices", "depth_lr"):  # the default cell's runs are in the choices snapshot only
        run_in_project(["blocklab", "sensitivity", "snapshot", "--root", str(snake_project), "--family", family,
                        "--out", f"snaps/{family}"] + ([] if family == "choices" else
                                                         ["--setting", *sorted(set(sens.plan(TINY).query(
                                                             "family == 'depth_lr' and not main_sweep")["setting"]))]),
                       project)
    params = project / "params.yaml"
    text = params.read_text(encoding="utf-8")
    params.write_text(text.replace("  in_report: true", "  in_report: true\n  from_snapshots: [snaps/choices, snaps/depth_lr]", 1),
                      encoding="utf-8")
    for table in sens.TABLES.values():
        (project / table).unlink()
    done = run_in_project(["snakemake", "--cores", "2", "sensitivity"], project)
    assert "train_sensitivity" not in done.stdout + done.stderr and "train_copy" not in done.stdout + done.stderr
    assert not (project / sens.RUNS).exists()
    for table in ("summary", "claims_by_setting"):
        pd.testing.assert_frame_equal(*(pd.read_csv(r / sens.TABLES[table]) for r in (project, snake_project)))
    assert "sensitivity_figures" in done.stdout + done.stderr  # the tables were remade, so the figures were redrawn
    for figure in sens.FIGURES:
        assert (project / "figs" / f"{figure}.png").stat().st_size > 10_000


def test_the_recorded_plan_is_the_same_on_a_processor_without_bf16_and_a_run_counts_once(monkeypatch):
    """Read from snapshots, the study's plan does not depend on the machine: a processor without bf16 units (AMD
    Zen 1, say) plans the recorded bf16 cell as one with them does (it is read, not trained); training here leaves it
    out. A run directory twice in one family is refused (it would be counted twice)."""
    recorded = sens.plan(FULL)
    assert (recorded["precision"] == "bf16").any()
    monkeypatch.setattr(sens, "bf16_support", lambda device: (False, "no bf16 units (test)"))
    pd.testing.assert_frame_equal(sens.plan(FULL), recorded)
    trained_here = copy.deepcopy(FULL)
    trained_here["sensitivity"]["from_snapshots"] = []
    assert not (sens.plan(trained_here)["precision"] == "bf16").any()
    twice = pd.concat([recorded, recorded[recorded["family"] == "choices"].head(1)], ignore_index=True)
    with pytest.raises(ConfigError, match="a run counts once"):
        study_report.refuse_twice(twice)
    study_report.refuse_twice(recorded)  # the default cell's runs are in both families, once in each
