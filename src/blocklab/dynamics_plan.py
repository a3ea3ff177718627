"""The dynamics family's plan, from the parameters alone (the params layer, as ``blocklab.study`` for the sensitivity
study): which runs it has and where, the snapshots it may be read from, the names of the training-time diagnostics,
and the cross-field checks of the ``diagnostics`` and ``dynamics`` sections (``params.validate_params`` runs them before
any compute). Training, events, rates and aggregation are in ``blocklab.experiments.dynamics``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .config import ConfigError
from .integrity import verify_snapshot
from .io import read_table
from .study import Cell, default_cell, run_name

ROOT = "data/dynamics"
RUNS = f"{ROOT}/runs"
PLAN = f"{ROOT}/plan.csv"
TABLES = {"losses": f"{ROOT}/losses.csv", "diagnostics": f"{ROOT}/diagnostics.parquet",
          "summary": f"{ROOT}/summary.csv", "rates": f"{ROOT}/rates.csv"}
SNAPSHOT_FILES = ("runs.csv", "losses.csv", "diagnostics.parquet")
FIGURES = {  # figure -> the tables it is drawn from
    "dynamics_gradnorm": [TABLES["diagnostics"], TABLES["summary"]],
    "dynamics_collapse": [TABLES["diagnostics"], TABLES["losses"], TABLES["summary"]],
}


@dataclass(frozen=True)
class Metric:
    scope: str      # "block" (one value per block) or "model"
    cadence: str    # "step" (every step) or "every" (every `every` steps: read from the step's forward by hooks)
    label: str      # what it is, in words (figure axes, the README)


METRICS = {
    "grad_ffn_out": Metric("block", "step", "gradient norm of the block's second MLP weight (Xiong et al. 2020, Fig. 3)"),
    "grad_attn": Metric("block", "step", "gradient norm of the attention sub-layer (its norm included)"),
    "grad_ffn": Metric("block", "step", "gradient norm of the MLP sub-layer (its norm included)"),
    "update_ratio": Metric("block", "step", "Adam's relative update ||dtheta|| / ||theta|| of the block"),
    "adam_rms": Metric("block", "step", "sqrt(mean(g^2 / v_hat)) over the block, v_hat before the step (Wortsman et al. 2023)"),
    "stream_norm": Metric("block", "every", "mean L2 norm of the residual stream entering the block"),
    "attn_entropy": Metric("block", "every", "mean attention entropy of the block's heads (nats; Zhai et al. 2023)"),
    "attn_logit_max": Metric("block", "every", "largest attention logit q.k/sqrt(d_head) of the block"),
    "output_logit_max": Metric("model", "every", "largest output logit of the model"),
}
MODEL_BLOCK = -1  # the block index of whole-model metrics
COLUMNS = ["step", "block", "metric", "value"]


def check_settings(settings: dict | None, key: str = "diagnostics") -> dict:
    """The ``diagnostics`` section of params.yaml, checked: unknown metric names and a non-positive interval fail here,
    naming the key and the allowed values, before anything trains."""
    settings = dict(settings or {"enabled": False})
    allowed = {"enabled", "every", "metrics"}
    unknown = set(settings) - allowed
    if unknown:
        raise ConfigError(f"{key}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    every = settings.get("every", 10)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ConfigError(f"{key}.every={every!r} is not allowed; choose an integer >= 1 (steps between forward metrics)")
    metrics = settings.get("metrics", list(METRICS))
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics or len(set(metrics)) != len(metrics):
        why = f"unknown {bad}" if bad else "empty" if not metrics else "repeated names"
        raise ConfigError(f"{key}.metrics: {why}; allowed: {list(METRICS)} (each at most once)")
    return {"enabled": bool(settings.get("enabled", False)), "every": every, "metrics": list(metrics)}


PLAN_COLUMNS = ["setting", "norm", "warmup", "seed", "run", "run_dir", "main_sweep", "compare", "collapse"]


def plan(params: dict) -> pd.DataFrame:
    """Every run of the family once: the cell, norm, warm-up, seed, its run directory and its groups (compare,
    collapse: booleans)."""
    dyn, sweep = params["dynamics"], params["sweep"]
    base = default_cell(params)
    rows = [("compare", base, norm, warmup, seed)
            for norm in sweep["norms"] for warmup in sweep["warmups"] for seed in dyn["compare_seeds"]]
    collapse = dyn["collapse"]
    rows += [("collapse", Cell.parse(name), "post", collapse["warmup"], seed)
             for name in collapse["settings"] for seed in collapse["seeds"]]
    records: dict[str, dict] = {}
    for group, cell, norm, warmup, seed in rows:
        in_main = cell == base and norm in sweep["norms"] and warmup in sweep["warmups"] and seed in sweep["seeds"]
        run = run_name(norm, warmup, seed)
        run_dir = f"data/sweep/runs/{run}" if in_main else f"{RUNS}/{cell.name}/{run}"
        record = records.setdefault(run_dir, {"setting": cell.name, "norm": norm, "warmup": warmup, "seed": seed,
                                              "run": run, "run_dir": run_dir, "main_sweep": in_main,
                                              "compare": False, "collapse": False})
        record[group] = True  # a run can be in both groups (post-norm with warm-up at a compare seed): listed once
    return pd.DataFrame(list(records.values()), columns=PLAN_COLUMNS)


def read_snapshots(dirs, verify: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    runs, losses, diags = [], [], []
    for d in map(Path, dirs):
        missing = [name for name in SNAPSHOT_FILES if not (d / name).is_file()]
        if missing:
            raise ConfigError(f"{d}: no dynamics snapshot there (missing {', '.join(missing)}); allowed: directories "
                              "written by `blocklab dynamics snapshot`")
        if verify:
            verify_snapshot(d)
        runs.append(read_table(d / "runs.csv"))
        losses.append(read_table(d / "losses.csv"))
        diags.append(pd.read_parquet(d / "diagnostics.parquet").astype({"value": "float64", "step": "int64", "block": "int64"}))
    runs = pd.concat(runs, ignore_index=True)
    doubled = runs[runs.duplicated(["setting", "run"], keep=False)]
    if len(doubled):
        raise ConfigError(f"dynamics.from_snapshots: runs recorded twice: {sorted(set(doubled['setting'] + '/' + doubled['run']))}")
    return runs, pd.concat(losses, ignore_index=True), pd.concat(diags, ignore_index=True)


def unrecorded(runs: pd.DataFrame, planned: pd.DataFrame) -> str | None:
    have = set(zip(runs["setting"], runs["run"])) if len(runs) else set()
    missing = [f"{s}/{r}" for s, r in zip(planned["setting"], planned["run"]) if (s, r) not in have]
    if missing:
        return (f"{len(missing)} planned run(s) not in the snapshots: {', '.join(missing[:6])}"
                f"{' ...' if len(missing) > 6 else ''}; allowed: snapshots that record every run of the plan, or "
                "dynamics.from_snapshots: [] to train them here")
    return None


def snapshots(params: dict) -> list[str]:
    return list(params["dynamics"].get("from_snapshots", []))


def from_runs(params: dict) -> pd.DataFrame:
    """The planned runs read from their own directories: all of them, or with ``dynamics.from_snapshots`` the main
    sweep's (the pipeline trains those anyway, with their diagnostics); the snapshots give the rest."""
    planned = plan(params)
    return planned[planned["main_sweep"]] if snapshots(params) else planned


def from_records(params: dict) -> pd.DataFrame:
    """The planned runs the snapshots must record (none without ``dynamics.from_snapshots``)."""
    planned = plan(params)
    return planned[~planned["main_sweep"]] if snapshots(params) else planned.iloc[0:0]


def aggregate_inputs(params: dict) -> list[str]:
    """What the aggregation reads: the meta.json of every run read from its directory (they train first), and the
    snapshots' files."""
    return ([f"{d}/{name}" for d in snapshots(params) for name in SNAPSHOT_FILES]
            + [f"{d}/meta.json" for d in from_runs(params)["run_dir"]])


def check_problems(params: dict) -> list[tuple[str, str]]:
    """Cross-field checks of ``dynamics`` and ``diagnostics`` (params.validate_params calls this): (key, message)."""
    problems = []
    try:
        check_settings(params.get("diagnostics"))
    except ConfigError as why:
        problems.append(("diagnostics", str(why)))
    dyn = params.get("dynamics")
    if dyn is None:
        return problems
    steps, chance = params["sweep"]["steps"], math.log(params["copy_task"]["vocab_size"])
    rule = dyn["events"]
    if not 0 < rule["learned_below"] < rule["spike_above"]:
        problems.append(("dynamics.events.learned_below", f"{rule['learned_below']} must be below "
                         f"dynamics.events.spike_above={rule['spike_above']}, else every learned run spikes; allowed: "
                         f"a number in (0, {rule['spike_above']})"))
    if rule["spike_above"] >= rule["collapse_at"] * chance:
        problems.append(("dynamics.events.spike_above", f"{rule['spike_above']} is not below the collapse level "
                         f"collapse_at x ln(vocab) = {rule['collapse_at'] * chance:.3f}; allowed: (learned_below, "
                         f"{rule['collapse_at'] * chance:.3f})"))
    if rule["learned_for"] + rule["collapse_for"] > steps:
        problems.append(("dynamics.events.collapse_for", f"learned_for + collapse_for = "
                         f"{rule['learned_for'] + rule['collapse_for']} exceeds sweep.steps={steps}, so a collapse "
                         f"could never fire; allowed: 1..{steps - rule['learned_for']}"))
    warmup = dyn["collapse"]["warmup"]
    if warmup > steps:
        problems.append(("dynamics.collapse.warmup", f"{warmup} is longer than training (sweep.steps={steps}); "
                         f"allowed: 0..{steps}"))
    for i, name in enumerate(dyn["collapse"]["settings"]):
        try:
            Cell.parse(name)
        except ConfigError:
            problems.append((f"dynamics.collapse.settings[{i}]", f"{name!r} is not a setting; allowed: "
                             "{position}-b{batch}-L{depth}-lr{lr}-{fp32|bf16}, e.g. " + default_cell(params).name))
    dirs = snapshots(params)
    if dirs and not problems:
        bad = [d for d in dirs if not all((Path(d) / n).is_file() for n in SNAPSHOT_FILES)]
        if bad:
            problems.append(("dynamics.from_snapshots", f"{', '.join(bad)}: no snapshot there; allowed: directories "
                             "written by `blocklab dynamics snapshot`, e.g. docs/dynamics/collapse"))
        elif dyn.get("in_report", True):  # out of the pipeline, the snapshots need not cover the plan
            try:
                runs, _, _ = read_snapshots(dirs)
                why = unrecorded(runs, from_records(params))
                if why:
                    problems.append(("dynamics.from_snapshots", why))
            except ConfigError as why:
                problems.append(("dynamics.from_snapshots", str(why)))
    return problems
