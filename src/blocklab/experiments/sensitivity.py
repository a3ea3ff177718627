"""What document 000 leaves open: the copy-task sweep under other position signals, batch sizes and precisions at the
document's size, and a depth x learning-rate grid (the document's "the difference grows with depth").

A *cell* is one setting of the open choices, named ``{position}-b{batch}-L{depth}-lr{lr}-{precision}``; each of its
runs (norm x warm-up x seed) is an ordinary sweep run (``sweep.train_copy_run``: same code, artifacts, checkpoints,
resume, provenance) in ``data/sensitivity/runs/<cell>/<norm>-w<warmup>-s<seed>/``. A run identical to a main-sweep run
is not trained again: the plan points at ``data/sweep/runs/...`` instead. Runs at the document's size (its depth and
learning rate, i.e. ``copy_model.n_layers`` and ``sweep.lr``) train the full ``sweep.steps``; the other depth x lr cells
stop early once the loss has stayed below ``sensitivity.early_stop.loss_below`` for ``for_steps`` steps in a row.
"""
from __future__ import annotations

import copy
import logging
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from ..config import ConfigError
from ..io import read_json, read_table, write_json, write_table
from ..params import load_params
from ..provenance import stamp

log = logging.getLogger("blocklab.sensitivity")

ROOT = "data/sensitivity"
RUNS = f"{ROOT}/runs"
TABLES = {"losses": f"{ROOT}/losses.csv", "summary": f"{ROOT}/summary.csv",
          "claims_by_setting": f"{ROOT}/claims_by_setting.csv"}
GRADNORM = f"{ROOT}/gradnorm.csv"
PLAN = f"{ROOT}/plan.csv"  # every planned run and its directory: made by every pipeline run, studied or not
FIGURES = {  # figure -> the tables it is drawn from
    "sensitivity_phase": [TABLES["summary"]],
    "sensitivity_loss_curves": [TABLES["losses"]],
    "sensitivity_gradnorm": [GRADNORM],
}
CELL_PATTERN = r"[a-z]+-b\d+-L\d+-lr[0-9.e+-]+-(?:fp32|bf16)"


@dataclass(frozen=True)
class Cell:
    position: str
    batch_size: int
    depth: int
    lr: float
    precision: str = "fp32"

    @property
    def name(self) -> str:
        return f"{self.position}-b{self.batch_size}-L{self.depth}-lr{self.lr:g}-{self.precision}"

    @classmethod
    def parse(cls, name: str) -> "Cell":
        match = re.fullmatch(r"([a-z]+)-b(\d+)-L(\d+)-lr([0-9.e+-]+)-(fp32|bf16)", name)
        if not match:
            raise ConfigError(f"--cell={name!r} is not a cell name; allowed: {{position}}-b{{batch}}-L{{depth}}-lr{{lr}}-"
                              "{fp32|bf16}, e.g. learned-b32-L24-lr0.001-fp32")
        position, batch, depth, lr, precision = match.groups()
        return cls(position, int(batch), int(depth), float(lr), precision)


def default_precision(params: dict) -> str:
    return params["sweep"].get("precision", "fp32")


def default_cell(params: dict) -> Cell:
    """The main sweep's own setting."""
    return Cell(params["copy_model"]["position"], params["copy_task"]["batch_size"], params["copy_model"]["n_layers"],
                params["sweep"]["lr"], default_precision(params))


def at_document_size(params: dict, cell: Cell) -> bool:
    """The document's depth and learning rate: such runs never stop early (its claims include what follows learning)."""
    return cell.depth == params["copy_model"]["n_layers"] and cell.lr == params["sweep"]["lr"]


def cell_params(params: dict, cell: Cell) -> dict:
    """params.yaml with the cell's choices in place: what ``train_copy_run`` trains."""
    out = copy.deepcopy(params)
    out["copy_model"]["position"] = cell.position
    out["copy_model"]["n_layers"] = cell.depth
    out["copy_task"]["batch_size"] = cell.batch_size
    out["sweep"]["lr"] = cell.lr
    if cell.precision != "fp32" or "precision" in out["sweep"]:
        out["sweep"]["precision"] = cell.precision
    return out


def run_identity(params: dict, cell_name: str) -> dict:
    """Everything that decides a cell's numbers (Snakemake's params for the training rule): a change retrains it."""
    cell = Cell.parse(cell_name)
    p = cell_params(params, cell)
    training = {k: v for k, v in p["sweep"].items() if k not in ("norms", "warmups", "seeds", "checkpoint_every",
                                                                   "compile", "fast_path", "batched")}
    early = None if at_document_size(params, cell) else params["sensitivity"]["early_stop"]
    return {"model": p["copy_model"], "task": p["copy_task"], "training": training, "early_stop": early}


def early_stop_rule(params: dict, cell: Cell):
    """(callable, words) for a depth x lr cell, (None, None) at the document's size."""
    if at_document_size(params, cell):
        return None, None
    rule = params["sensitivity"]["early_stop"]
    below, n = rule["loss_below"], rule["for_steps"]

    def stop(losses: list[float]) -> bool:
        return len(losses) >= n and all(value < below for value in losses[-n:])

    return stop, f"loss < {below:g} for {n} consecutive steps"


def steps_to_learn(losses: pd.Series, steps: pd.Series, below: float, for_steps: int) -> float:
    """The first step of the first run of ``for_steps`` consecutive losses below ``below`` (NaN: never)."""
    streak = 0
    for step, value in zip(steps, losses):
        streak = streak + 1 if value < below else 0
        if streak == for_steps:
            return float(step - for_steps + 1)
    return float("nan")


def relapse(losses: pd.Series, steps: pd.Series, below: float, for_steps: int) -> tuple[float, float]:
    """The worst loss after a run had learned (``for_steps`` consecutive losses below ``below``, as steps_to_learn),
    and its step: how far it fell back (a spike it recovered from, or the document's collapse). (NaN, NaN): it never
    learned, or nothing came after."""
    learned = steps_to_learn(losses, steps, below, for_steps)
    if math.isnan(learned):
        return float("nan"), float("nan")
    losses, steps = pd.Series(list(losses)), pd.Series(list(steps))
    after = losses[steps >= learned + for_steps]
    if after.empty:
        return float("nan"), float("nan")
    return float(after.max()), float(steps[after.idxmax()])


def available_precisions(params: dict, precisions: list[str]) -> list[str]:
    """The precisions this machine's training device can run; bf16 without bf16 units is left out of the plan, with a
    warning (the study is made of the rest), rather than failing its jobs one by one."""
    if "bf16" not in precisions:
        return list(precisions)
    from ..training.precision import bf16_support
    from ..runtime import resolve_device

    ok, why = bf16_support(resolve_device(params["device"]))
    if not ok:
        log.warning("sensitivity.choices.precisions: bf16 left out of the study here: %s", why)
    return [p for p in precisions if p != "bf16" or ok]


# ---- the plan ----------------------------------------------------------------------------------------------------------


def plan(params: dict) -> pd.DataFrame:
    """Every run of the study: family (choices | depth_lr), the cell, norm, warm-up, seed and its run directory."""
    from ..training.sweep import run_name

    sens, sweep = params["sensitivity"], params["sweep"]
    base = default_cell(params)
    rows = []
    choices = sens["choices"]
    # positions x batch sizes, crossed (an effect of one may show only under a value of the other), at the default
    # precision; each other precision at the default position and batch size (a faster arithmetic, not a choice of
    # the document's: does it change any verdict?)
    cells = [Cell(position, batch, base.depth, base.lr, base.precision)
             for position in choices["positions"] for batch in choices["batch_sizes"]]
    cells += [Cell(base.position, base.batch_size, base.depth, base.lr, precision)
              for precision in available_precisions(params, choices.get("precisions", [])) if precision != base.precision]
    for cell in dict.fromkeys(cells):
        for norm in sweep["norms"]:
            for warmup in sweep["warmups"]:
                for seed in choices["seeds"]:
                    rows.append(("choices", cell, norm, warmup, seed))
    grid = sens["depth_lr"]
    for depth in grid["depths"]:
        for lr in grid["lrs"]:
            cell = Cell(base.position, base.batch_size, depth, float(lr), base.precision)
            for norm in grid["norms"]:
                for warmup in grid["warmups"]:
                    for seed in grid["seeds"]:
                        rows.append(("depth_lr", cell, norm, warmup, seed))
    records = []
    for family, cell, norm, warmup, seed in rows:
        in_main = (cell == base and norm in sweep["norms"] and warmup in sweep["warmups"] and seed in sweep["seeds"])
        run = run_name(norm, warmup, seed)
        run_dir = f"data/sweep/runs/{run}" if in_main else f"{RUNS}/{cell.name}/{run}"
        records.append({"family": family, "setting": cell.name, **asdict(cell), "norm": norm, "warmup": warmup,
                        "seed": seed, "run": run, "run_dir": run_dir, "main_sweep": in_main})
    columns = ["family", "setting", "position", "batch_size", "depth", "lr", "precision", "norm", "warmup", "seed",
               "run", "run_dir", "main_sweep"]
    return pd.DataFrame(records, columns=columns)


def run_dirs(params: dict) -> list[str]:
    """Each run directory once (a run can belong to both families: the default cell at the document's size)."""
    return list(dict.fromkeys(plan(params)["run_dir"]))


SNAPSHOT_FILES = ("runs.csv", "losses.csv")


def snapshots(params: dict) -> list[str]:
    """``sensitivity.from_snapshots``: snapshot directories the study is aggregated from instead of its trained runs."""
    return list(params["sensitivity"].get("from_snapshots") or [])


def aggregate_inputs(params: dict) -> list[str]:
    """What the study's tables are made from (the aggregation rule's input): every planned run's meta.json, or, with
    ``sensitivity.from_snapshots``, the snapshots' files (then nothing of the study is trained)."""
    if snapshots(params):
        return [f"{d}/{name}" for d in snapshots(params) for name in SNAPSHOT_FILES]
    return [f"{run}/meta.json" for run in run_dirs(params)]


# ---- aggregation ------------------------------------------------------------------------------------------------------

LOSS_AT = (100, 200, 300)
# What a run's summary needs from its meta.json besides its losses: a snapshot (``record_runs``) keeps exactly these,
# so a reader can re-aggregate and re-judge the study from git without the trained runs.
RECORD_FIELDS = ("vocab_size", "diverged_step", "stopped_step", "stop_reason", "wall_time_s", "machine", "git_commit")
RUN_KEY = ["setting", "run"]  # names a run of the plan once (a run shared by two families has one setting and run)


def _record(meta: dict) -> dict:
    libraries, code = meta.get("libraries", {}), meta.get("code", {})
    return {"vocab_size": meta["copy_task"]["vocab_size"], "diverged_step": meta.get("diverged_step"),
            "stopped_step": meta.get("stopped_step"), "stop_reason": meta.get("stop_reason"),
            "wall_time_s": meta["wall_time_s"], "machine": libraries.get("cpu") or None,
            "git_commit": code.get("git_commit")}


def _runs_from_dirs(root: Path, planned: pd.DataFrame):
    for row in planned.itertuples(index=False):
        yield row, _record(read_json(root / row.run_dir / "meta.json")), read_table(root / row.run_dir / "loss.csv")


def unrecorded(records: pd.DataFrame, planned: pd.DataFrame) -> str | None:
    """Which planned runs no snapshot records, in words (None: every one is recorded)."""
    recorded = set(zip(records["setting"], records["run"]))
    missing = [f"{s}/{r}" for s, r in planned[RUN_KEY].drop_duplicates().itertuples(index=False) if (s, r) not in recorded]
    if not missing:
        return None
    return (f"the snapshots lack {len(missing)} planned run(s): {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else "")
            + "; allowed: snapshots that record every run of the sensitivity section's plan (record them with "
            "`blocklab sensitivity-snapshot`), fewer axis values, or sensitivity.from_snapshots: [] to train the "
            "study for these parameters")


def _runs_from_records(records: pd.DataFrame, losses: pd.DataFrame, planned: pd.DataFrame):
    if why := unrecorded(records, planned):
        raise ConfigError(why)
    records = records.drop_duplicates(RUN_KEY).set_index(RUN_KEY)
    by_run = {key: part for key, part in losses.groupby(RUN_KEY, sort=False)}
    for row in planned.itertuples(index=False):
        record = {k: (None if pd.isna(v) else v) for k, v in records.loc[(row.setting, row.run)].to_dict().items()}
        loss = by_run.get((row.setting, row.run), losses.iloc[:0])[["step", "loss"]].sort_values("step", ignore_index=True)
        yield row, record, loss


def aggregate(params: dict, root: str | Path = ".", planned: pd.DataFrame | None = None,
              records: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy per-step losses and one summary row per (family, run) of the plan (or of ``planned``, some of its rows),
    read from the runs' own files, or from ``records``: (runs, losses) tables of snapshots (``read_records``)."""
    from ..training.sweep import classify

    rule = params["sensitivity"]["early_stop"]
    curves, rows = [], []
    planned = plan(params) if planned is None else planned
    runs = _runs_from_dirs(Path(root), planned) if records is None else _runs_from_records(*records, planned)
    for row, record, loss in runs:
        ident = {k: getattr(row, k) for k in ("family", "setting", "position", "batch_size", "depth", "lr",
                                             "precision", "norm", "warmup", "seed", "run")}
        curves.append(loss[["step", "loss"]].assign(**ident))
        diverged, stopped = record["diverged_step"], record["stopped_step"]
        outcome = "diverged" if diverged or not len(loss) else classify(loss["loss"], record["vocab_size"])
        if stopped and not diverged:
            outcome = "learned"  # the stop rule fired: the loss stayed below its threshold (the run has learned)
        at = {f"loss_at_{s}": float(loss.loc[loss["step"] == s, "loss"].iloc[0]) if (loss["step"] == s).any()
              else float("nan") for s in LOSS_AT}
        worst, worst_step = relapse(loss["loss"], loss["step"], rule["loss_below"], rule["for_steps"])
        rows.append({
            **ident, **at,
            "final_loss": float(loss["loss"].iloc[-1]) if len(loss) else float("nan"),
            "min_loss": float(loss["loss"].min()) if len(loss) else float("nan"),
            "outcome": outcome,
            "steps_to_learn": steps_to_learn(loss["loss"], loss["step"], rule["loss_below"], rule["for_steps"]),
            "relapse_loss": worst, "relapse_step": worst_step,
            "trained_steps": int(loss["step"].max()) if len(loss) else 0,
            "stop_reason": record["stop_reason"] or ("diverged" if diverged else "trained the full budget"),
            "main_sweep": bool(row.main_sweep),
            "wall_time_s": record["wall_time_s"],
            "machine": record["machine"],
            "run_dir": row.run_dir,
        })
    losses = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame()
    return losses, pd.DataFrame(rows)


def record_runs(params: dict, root: str | Path = ".", planned: pd.DataFrame | None = None,
                machine: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A snapshot of the finished runs among ``planned`` (default: the whole plan), small enough for git: (runs: one
    row per run with what its summary needs from meta.json, losses: every step, summary: the study's own summary of
    them). ``machine`` names the processor where the runs' meta.json does not (runs trained before it was recorded)."""
    root = Path(root)
    planned = plan(params) if planned is None else planned
    finished = planned[[(root / d / "meta.json").exists() for d in planned["run_dir"]]]
    rows, curves = [], []
    for row, record, loss in _runs_from_dirs(root, finished.drop_duplicates("run_dir")):
        rows.append({"setting": row.setting, "run": row.run, **record, "machine": record["machine"] or machine,
                     "run_dir": row.run_dir})
        curves.append(loss[["step", "loss"]].assign(setting=row.setting, precision=row.precision, run=row.run))
    columns = [*RUN_KEY, *RECORD_FIELDS, "run_dir"]
    runs = pd.DataFrame(rows, columns=columns)
    losses = (pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=["step", "loss", *RUN_KEY]))
    losses = losses[["setting", "precision", "run", "step", "loss"]]  # unrounded: re-aggregating gives the same numbers
    _, summary = aggregate(params, planned=finished, records=(runs, losses))  # the files once, from what is recorded
    return runs, losses, summary


def read_records(dirs, losses: bool = True) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The (runs, losses) tables of one or more snapshot directories (``record_runs``), concatenated; a run recorded
    twice is an error (which one would count?). ``losses=False``: the runs table only (losses None)."""
    runs = pd.concat([read_table(Path(d) / "runs.csv").assign(snapshot=str(d)) for d in dirs], ignore_index=True)
    twice = runs[runs.duplicated(RUN_KEY, keep=False)]
    if len(twice):
        first = twice.iloc[0]
        raise ConfigError(f"run {first.setting}/{first.run} is in more than one snapshot: "
                          f"{', '.join(twice[(twice.setting == first.setting) & (twice.run == first.run)].snapshot)}")
    if not losses:
        return runs, None
    return runs, pd.concat([read_table(Path(d) / "losses.csv") for d in dirs], ignore_index=True)


def as_sweep_tables(losses: pd.DataFrame, summary: pd.DataFrame, setting: str):
    """One choices cell's runs in the main sweep's table layout, so the sweep's claim checks read them unchanged."""
    # both tables already name each run as the main sweep does (sweep.run_name), so the checks match them unchanged
    s = summary[(summary["family"] == "choices") & (summary["setting"] == setting)]
    l = losses[(losses["family"] == "choices") & (losses["setting"] == setting)]
    return l, s.sort_values(["norm", "warmup", "seed"], ignore_index=True)


def claims_by_setting(params: dict, losses: pd.DataFrame, summary: pd.DataFrame, gradnorm: pd.DataFrame) -> pd.DataFrame:
    """Every sweep claim's verdict under every setting of the open choices (claim x setting), from the cells' runs."""
    from ..reporting import claims

    rows = []
    settings = summary.loc[summary["family"] == "choices", ["setting", "position", "batch_size", "precision"]]
    for setting in settings.drop_duplicates("setting").itertuples(index=False):
        cell = Cell.parse(setting.setting)
        sweep_losses, sweep_summary = as_sweep_tables(losses, summary, setting.setting)
        tables = {"sweep/losses.csv": sweep_losses, "sweep/summary.csv": sweep_summary,
                  "gradnorm/gradnorm.csv": gradnorm[gradnorm["position"] == cell.position]}
        data = claims.Data(".", cell_params(params, cell), tables=tables)
        table = claims.evaluate_data(data, only=claims.SWEEP_CHECKS)
        seeds = sorted(sweep_summary["seed"].unique())
        for claim in table.itertuples(index=False):
            rows.append({"id": claim.id, "where": claim.where, "claim": claim.claim, "setting": setting.setting,
                         "position": setting.position, "batch_size": setting.batch_size,
                         "precision": setting.precision, "seeds": len(seeds),
                         "default": setting.setting == default_cell(params).name, "measured": claim.measured,
                         "verdict": claim.verdict})
    return pd.DataFrame(rows)


def robustness(by_setting: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: its verdict under the default setting (else the commonest), how many settings agree with
    it, the settings that do not, and ``robust``: judged ("not checkable here" is no verdict) under at least one
    setting, and the same verdict under every setting."""
    from ..reporting.claims import NOT_CHECKABLE

    rows = []
    for claim_id, group in by_setting.groupby("id", sort=False):
        default = group[group["default"].astype(bool)]
        ref = default["verdict"].iloc[0] if len(default) else group["verdict"].mode().iloc[0]
        checkable = bool((group["verdict"] != NOT_CHECKABLE).any())
        rows.append({"id": claim_id, "default_verdict": ref,
                     "settings": len(group), "agree": int((group["verdict"] == ref).sum()), "checkable": checkable,
                     "robust": checkable and bool((group["verdict"] == ref).all()),
                     "differ": "; ".join(f"{r.setting}: {r.verdict}" for r in group[group["verdict"] != ref].itertuples())})
    return pd.DataFrame(rows)


def progress(params: dict, root: str | Path = ".") -> pd.DataFrame:
    """Where each planned run stands (the study may span sessions): finished, checkpointed at a step, or not started.

    ``seconds`` is the run time spent so far (a finished run's ``wall_time_s``, a checkpoint's saved seconds), and
    ``steps_left`` the most steps still to train (an early-stoppable run may need fewer).
    """
    import torch

    root, steps = Path(root), params["sweep"]["steps"]
    rows = []
    for row in plan(params).drop_duplicates("run_dir").itertuples(index=False):
        run_dir = root / row.run_dir
        status, done, seconds = "not started", 0, 0.0
        if (run_dir / "meta.json").exists():
            meta = read_json(run_dir / "meta.json")
            done = int(meta.get("stopped_step") or meta.get("diverged_step") or steps)
            status, seconds = "finished", float(meta["wall_time_s"])
        elif (run_dir / "checkpoint.pt").exists():
            state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
            status, done, seconds = "checkpointed", int(state["step"]), float(state["seconds"])
        rows.append({"setting": row.setting, "run": row.run, "batch_size": row.batch_size, "depth": row.depth,
                     "precision": row.precision, "status": status, "steps_done": done,
                     "steps_left": 0 if status == "finished" else steps - done, "seconds": seconds,
                     "run_dir": row.run_dir})
    return pd.DataFrame(rows)


def projected_seconds(frame: pd.DataFrame) -> pd.Series:
    """A projection of each run's remaining run time from the runs that have trained: seconds per step taken to scale
    with batch size x (depth + 1) (the blocks plus embedding and head), one factor per precision (median over runs)."""
    work = frame["batch_size"] * (frame["depth"] + 1)
    trained = frame[frame["steps_done"] > 0]
    per_unit = (trained["seconds"] / trained["steps_done"] / work[trained.index]).groupby(trained["precision"]).median()
    fallback = per_unit.get("fp32", per_unit.max() if len(per_unit) else float("nan"))
    unit = frame["precision"].map(per_unit).fillna(fallback)
    return frame["steps_left"] * work * unit


def finished_verdicts(params: dict, root: str | Path = ".") -> tuple[pd.DataFrame, int, int]:
    """Claim x setting for the open-choice cells whose runs have all finished, while the study is still training:
    (the table, cells judged, cells planned). The same aggregation and checks as the study's own table."""
    root = Path(root)
    planned = plan(params)
    status = progress(params, root).drop_duplicates("run_dir").set_index("run_dir")["status"]
    choices = planned[planned["family"] == "choices"]
    complete = choices.groupby("setting")["run_dir"].agg(lambda dirs: bool((status[dirs] == "finished").all()))
    cells = choices["setting"].nunique()
    judged = choices[choices["setting"].map(complete)]
    if judged.empty or not (root / GRADNORM).exists():
        return pd.DataFrame(), 0, cells
    losses, summary = aggregate(params, root, planned=judged)
    return claims_by_setting(params, losses, summary, read_table(root / GRADNORM)), judged["setting"].nunique(), cells


def _status_main(args) -> None:
    params = load_params(args.params)
    if args.verdicts:
        _verdicts_main(params, args)
        return
    frame = progress(params, args.root)
    frame["projected_s"] = projected_seconds(frame)
    by_status = frame["status"].value_counts()
    print(frame.groupby("setting", sort=False).agg(
        runs=("run", "size"), finished=("status", lambda s: int((s == "finished").sum())),
        steps_done=("steps_done", "sum"), hours=("seconds", lambda s: round(s.sum() / 3600, 2)),
        projected_hours_left=("projected_s", lambda s: round(s.sum() / 3600, 2))).to_string())
    jobs = max(1, args.cores // params["threads_per_run"])
    spent, left = frame["seconds"].sum() / 3600, frame["projected_s"].sum() / 3600
    print(f"\n{len(frame)} runs: " + ", ".join(f"{n} {s}" for s, n in by_status.items())
          + f". Run time so far {spent:.2f} h (about {spent / jobs:.2f} h of wall time with {jobs} jobs side by side); "
          f"at most {left:.2f} h of run time left (projected from the runs so far; early stops shorten it), "
          f"about {left / jobs:.2f} h of wall time with {jobs} jobs.")


def _verdicts_main(params: dict, args) -> None:
    table, judged, cells = finished_verdicts(params, args.root)
    if table.empty:
        print(f"No open-choice cell has finished all its runs yet (0 of {cells}), or {GRADNORM} is missing.")
        return
    wide = table.pivot_table(index="id", columns="setting", values="verdict", aggfunc="first", sort=False)
    print(f"Claim x setting for the {judged} of {cells} open-choice cells whose runs have all finished "
          f"(seeds per cell: {', '.join(sorted({str(n) for n in table['seeds']}))}); not the study's table until "
          f"every cell has trained:\n")
    print(wide.to_string())
    if args.out:
        write_table(table, args.out)


def gradnorm_by_position(params: dict) -> pd.DataFrame:
    """Gradient norms at init (the gradnorm section's init, norms and seeds) under each position signal of the study."""
    from .gradnorm import gradnorm_frame

    parts = []
    for position in params["sensitivity"]["choices"]["positions"]:
        p = copy.deepcopy(params)
        p["copy_model"]["position"] = position
        parts.append(gradnorm_frame(p).assign(position=position))
    return pd.concat(parts, ignore_index=True)[["position", "norm", "seed", "block", "grad_norm", "loss"]]


# ---- figures ----------------------------------------------------------------------------------------------------------


def save_figures(params: dict, data: str | Path = "data", figs: str | Path = "figs", lang: str | None = None) -> list:
    from ..figures import sensitivity as draw
    from ..figures import style

    lang = lang or params["figures"]["lang"]
    data = Path(data)
    where = lambda rel: data / Path(rel).relative_to("data")  # noqa: E731  (the tables' paths under another data dir)
    table = lambda rel: read_table(where(rel))  # noqa: E731
    vocab = params["copy_task"]["vocab_size"]
    rule = params["sensitivity"]["early_stop"]
    made = {
        "sensitivity_phase": lambda: draw.phase_figure(table(TABLES["summary"]), lang=lang, budget=params["sweep"]["steps"],
                                                     rule=rule),
        "sensitivity_loss_curves": lambda: draw.loss_curves_by_setting_figure(table(TABLES["losses"]), lang=lang,
                                                                             vocab_size=vocab,
                                                                             default=default_cell(params).name),
        "sensitivity_gradnorm": lambda: draw.gradnorm_by_position_figure(table(GRADNORM), lang=lang),
    }
    out = []
    for name, build in made.items():
        style.setup(lang)
        out.append(style.save(build(), Path(figs) / f"{name}.png", dpi=params["figures"]["dpi"],
                              sources=[str(where(s)) for s in FIGURES[name]],
                              params={"figures": params["figures"], "lang": lang, "sensitivity": params["sensitivity"]}))
    return out


# ---- command line ------------------------------------------------------------------------------------------------------


def register(subparsers) -> None:
    p = subparsers.add_parser("train-sensitivity", help="train one run of a sensitivity cell (open choices of document 000)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--cell", required=True, help="e.g. learned-b32-L24-lr0.001-fp32")
    p.add_argument("--norm", required=True, choices=["post", "pre"])
    p.add_argument("--warmup", required=True, type=int)
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=_train_main)

    p = subparsers.add_parser("sensitivity-plan", help="list every run of the sensitivity study and where it lives")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=lambda a: write_table(plan(load_params(a.params)), a.out))

    p = subparsers.add_parser("sensitivity-gradnorm", help="gradient norms at init under each position signal")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, type=Path)
    p.set_defaults(func=_gradnorm_main)

    p = subparsers.add_parser("aggregate-sensitivity", help="the study's loss and summary tables, and claim x setting")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--root", default=".", type=Path, help="project root holding data/ (default: here)")
    p.add_argument("--from", dest="snapshots", nargs="+", type=Path, default=None, metavar="DIR",
                   help="instead of the trained runs, the runs recorded in these snapshot directories (a run in one "
                        "only), e.g. from git: docs/sensitivity/choices docs/sensitivity/depth_lr")
    p.set_defaults(func=_aggregate_main)

    p = subparsers.add_parser("sensitivity-snapshot",
                              help="record the finished runs of the study (losses and what their summary needs) in DIR")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--root", default=".", type=Path, help="project root holding data/ (default: here)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--family", choices=["choices", "depth_lr"], default=None, help="only this family's runs")
    p.add_argument("--setting", nargs="+", default=None, help="only these cells (e.g. learned-b32-L24-lr0.001-bf16)")
    p.add_argument("--machine", default=None, help="the processor, for runs whose meta.json does not name it")
    p.set_defaults(func=_snapshot_main)

    p = subparsers.add_parser("sensitivity-status", help="which runs of the study are finished, checkpointed or to do; hours")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--root", default=".", type=Path, help="project root holding data/ (default: here)")
    p.add_argument("--cores", default=2, type=int, help="cores the study runs on (jobs = cores / threads_per_run)")
    p.add_argument("--verdicts", action="store_true",
                   help="instead: claim x setting so far, for the open-choice cells whose runs have all finished")
    p.add_argument("--out", type=Path, default=None, help="with --verdicts: also write that table (CSV)")
    p.set_defaults(func=_status_main)

    p = subparsers.add_parser("sensitivity-figures", help="draw the sensitivity study's figures from its tables")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--data", default="data")
    p.add_argument("--figs", default="figs")
    p.add_argument("--lang", choices=["ko", "en"], default=None)
    p.set_defaults(func=_figures_main)


def _train_main(args) -> None:
    from ..runtime import set_threads
    from ..training.sweep import train_copy_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params(args.params)
    cell = Cell.parse(args.cell)
    planned = plan(params)
    mine = planned[(planned["setting"] == cell.name) & (planned["norm"] == args.norm)
                   & (planned["warmup"] == args.warmup) & (planned["seed"] == args.seed)]
    if mine.empty:
        raise ConfigError(f"--cell={args.cell} --norm={args.norm} --warmup={args.warmup} --seed={args.seed} is not a run "
                          f"of the sensitivity section of {args.params}; allowed cells: "
                          f"{sorted(planned['setting'].unique())}")
    set_threads(args.threads or params["threads_per_run"])
    stop, words = early_stop_rule(params, cell)
    meta = train_copy_run(cell_params(params, cell), args.norm, args.warmup, args.seed, args.out_dir, params["device"],
                          stop_when=stop, stop_rule=words, sensitivity_cell=asdict(cell) | {"name": cell.name})
    log.info("%s/%s %s (%s) in %.1f s", cell.name, meta["run"], meta["status"], meta["stop_reason"], meta["wall_time_s"])


def _figures_main(args) -> None:
    for path in save_figures(load_params(args.params), args.data, args.figs, args.lang):
        print(path)


def _gradnorm_main(args) -> None:
    from ..runtime import set_threads

    params = load_params(args.params)
    set_threads(params["threads_per_run"])
    frame = gradnorm_by_position(params)
    write_table(frame, args.out)
    write_json(stamp(artifact=args.out.name, positions=params["sensitivity"]["choices"]["positions"],
                     params={k: params[k] for k in ("copy_task", "copy_model", "gradnorm")}),
               args.out.with_suffix(".json"))


def _snapshot_main(args) -> None:
    params = load_params(args.params)
    planned = plan(params)
    if args.family:
        planned = planned[planned["family"] == args.family]
    if args.setting:
        unknown = sorted(set(args.setting) - set(planned["setting"]))
        if unknown:
            raise ConfigError(f"--setting: {', '.join(unknown)} not planned{' in ' + args.family if args.family else ''}"
                              f"; allowed: {', '.join(planned['setting'].unique())}")
        planned = planned[planned["setting"].isin(args.setting)]
    runs, losses, summary = record_runs(params, args.root, planned, machine=args.machine)
    write_table(runs, args.out / "runs.csv")
    write_table(losses, args.out / "losses.csv")
    write_table(summary.drop(columns=["family"]).drop_duplicates("run_dir"), args.out / "summary.csv")
    print(f"{len(runs)} finished of {planned['run_dir'].nunique()} planned runs recorded in {args.out}/ "
          "(runs.csv, losses.csv, summary.csv)")


def _aggregate_main(args) -> None:
    params = load_params(args.params)
    root = args.root
    dirs = args.snapshots or [root / d for d in snapshots(params)]
    records = read_records(dirs) if dirs else None
    losses, summary = aggregate(params, root, records=records)
    gradnorm = read_table(root / GRADNORM)
    by_setting = claims_by_setting(params, losses, summary, gradnorm)
    write_table(losses.round({"loss": 6}), root / TABLES["losses"])
    write_table(summary, root / TABLES["summary"])
    write_table(by_setting, root / TABLES["claims_by_setting"])
    log.info("%d runs, %d claim x setting verdicts", len(summary), len(by_setting))


def check_problems(params: dict) -> list[tuple[str, str]]:
    """Cross-field checks of the sensitivity section (params.validate_params calls this): (key, message) pairs."""
    sens = params.get("sensitivity")
    if sens is None:
        return []
    problems = []
    chance = math.log(params["copy_task"]["vocab_size"])
    rule, steps = sens["early_stop"], params["sweep"]["steps"]
    if rule["loss_below"] >= chance:
        problems.append(("sensitivity.early_stop.loss_below",
                         f"{rule['loss_below']} is not below chance ln(copy_task.vocab_size) = {chance:.3f}, so it would "
                         f"stop an untrained run; allowed: a number in (0, {chance:.3f})"))
    if rule["for_steps"] > steps:
        problems.append(("sensitivity.early_stop.for_steps",
                         f"{rule['for_steps']} exceeds sweep.steps={steps}, so the rule could never fire; allowed: 1..{steps}"))
    problems += _snapshot_problems(params)
    for i, warmup in enumerate(sens["depth_lr"]["warmups"]):
        if warmup > steps:
            problems.append((f"sensitivity.depth_lr.warmups[{i}]", f"{warmup} is longer than training (sweep.steps={steps}); "
                             f"allowed: 0..{steps}"))
    d, heads = params["copy_model"]["d_model"], params["copy_model"]["n_heads"]
    if "rope" in sens["choices"]["positions"] and not d % heads and (d // heads) % 2:
        problems.append(("sensitivity.choices.positions", f"'rope' needs an even head dimension d_model/n_heads={d // heads}; "
                         "allowed: another position or an even head dimension"))
    return problems


def _snapshot_problems(params: dict) -> list[tuple[str, str]]:
    """``sensitivity.from_snapshots``: each directory holds a snapshot, and together they record every planned run
    exactly once (checked before any compute; paths are relative to the project root, where the pipeline runs)."""
    dirs = snapshots(params)
    if not dirs:
        return []
    key = "sensitivity.from_snapshots"
    bad = [d for d in dirs if not all((Path(d) / name).is_file() for name in SNAPSHOT_FILES)]
    if bad:
        return [(key, f"{', '.join(bad)}: no snapshot there ({' and '.join(SNAPSHOT_FILES)}); allowed: directories "
                      "written by `blocklab sensitivity-snapshot`, e.g. docs/sensitivity/choices")]
    try:
        runs, _ = read_records(dirs, losses=False)
    except ConfigError as why:
        return [(key, str(why))]
    why = unrecorded(runs, plan(params))
    return [(key, why)] if why else []
