"""The stability lab's runs recorded in git at the document's setup: where they are (``RUNS``, the one place that says
so) and what they show, read back with their checksums (``integrity.read_run``).

A recorded run is a folder ``<norm>-w<warmup>-s<seed>`` with the loss.csv and meta.json its training wrote
(``blocklab lab-job record``). Its outcome is computed here from its losses with the lab's own thresholds
(``run.outcome``), never stored by hand, so the claims, the docs and the gallery read the same outcome.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..integrity import _differences, _loss_problems, _meta_problems, expected_loss_steps
from ..io import DamagedArtifact
from .outcomes import COLUMNS, outcome
from ..records import LAB_RUNS

REPO = Path(__file__).resolve().parents[3]
RUNS = LAB_RUNS  # the recorded lab runs, relative to the repository root (named once, in blocklab.records)
NAME = re.compile(r"^(?P<norm>[a-z0-9]+)-w(?P<warmup>\d+)-s(?P<seed>\d+)$")
# What makes two runs the same setup: (meta.json's section, key) -> the params.yaml (section, key) it was made from.
SETUP_KEYS = {("model_config", "n_layers"): ("copy_model", "n_layers"), ("model_config", "d_model"): ("copy_model", "d_model"),
              ("model_config", "n_heads"): ("copy_model", "n_heads"), ("model_config", "position"): ("copy_model", "position"),
              ("copy_task", "vocab_size"): ("copy_task", "vocab_size"), ("copy_task", "seq_len"): ("copy_task", "seq_len"),
              ("copy_task", "batch_size"): ("copy_task", "batch_size"), ("sweep", "lr"): ("sweep", "lr"),
              ("sweep", "steps"): ("sweep", "steps")}


def runs_dir(root: Path | str = REPO) -> Path:
    return Path(root) / RUNS


RECORDED_FILES = ("loss.csv", "meta.json")  # what `lab-job record` copies of a finished run (no weights, no checkpoint)


def read_run(run_dir: Path | str) -> tuple[dict, pd.DataFrame]:
    """A recorded run's meta.json (checked against its own checksum) and loss.csv (against meta.json's record of it
    and its steps); ``DamagedArtifact`` otherwise. The weights were not recorded, so they are not asked for."""
    run_dir = Path(run_dir)
    meta, problems = _meta_problems(run_dir)
    if not problems:
        problems = _differences(run_dir, {"loss.csv": meta["artifacts"].get("loss.csv", {"bytes": -1, "sha256": ""})})
    if not problems:
        problems = _loss_problems(run_dir / "loss.csv", expected_loss_steps(meta))
    if problems:
        raise DamagedArtifact(f"{run_dir}: damaged recorded run: {'; '.join(problems)}; record it again (`blocklab "
                              "lab-job record`) from the machine that trained it")
    return meta, pd.read_csv(run_dir / "loss.csv")


def setup_of(meta: dict) -> dict:
    """The setup a recorded run was trained at, keyed as params.yaml ("copy_model.n_layers": 24, ...)."""
    return {f"{p[0]}.{p[1]}": meta.get(m[0], {}).get(m[1]) for m, p in SETUP_KEYS.items()}


def params_setup(params: dict) -> dict:
    """The same keys from a params.yaml (copy_model.position absent: learned, the schema's default)."""
    out = {}
    for section, key in SETUP_KEYS.values():
        value = params.get(section, {}).get(key)
        out[f"{section}.{key}"] = "learned" if key == "position" and value is None else value
    return out


def setup_differs(meta: dict, params: dict) -> list[str]:
    """The keys in which a recorded run's setup differs from ``params`` ('key=run's (params ...)'); [] when the same."""
    mine, theirs = setup_of(meta), params_setup(params)
    return [f"{k}={mine[k]} (params {theirs[k]})" for k in mine
            if not (mine[k] == theirs[k] or (isinstance(mine[k], float) and theirs[k] is not None
                                             and abs(mine[k] - float(theirs[k])) <= 1e-12 * abs(mine[k])))]


def recorded(root: Path | str = REPO, norm: str | None = None, warmup: int | None = None) -> pd.DataFrame:
    """One row a recorded run (checked against its checksums): the lab.csv columns, its run name, setup and
    processor; narrowed to ``norm`` and ``warmup`` when given. Empty (with the columns) when none is recorded."""
    rows = []
    folder = runs_dir(root)
    for run_dir in sorted(folder.iterdir()) if folder.is_dir() else []:
        named = NAME.match(run_dir.name)
        if not named or not (run_dir / "meta.json").is_file():
            continue
        if (norm is not None and named["norm"] != norm) or (warmup is not None and int(named["warmup"]) != warmup):
            continue
        meta, loss = read_run(run_dir)
        found = outcome(loss["step"].tolist(), loss["loss"].tolist(), meta["copy_task"]["vocab_size"],
                        meta.get("diverged_step"))
        rows.append({"run": run_dir.name, "block": meta["norm"], "n_layers": meta["model_config"]["n_layers"],
                     "warmup": int(meta["warmup"]), "seed": int(meta["seed"]), **found,
                     "steps": len(loss), "cpu": meta.get("libraries", {}).get("cpu") or "",
                     "wall_time_s": meta.get("wall_time_s"), **setup_of(meta)})
    columns = ["run", *COLUMNS, "steps", "cpu", "wall_time_s", *(f"{p[0]}.{p[1]}" for p in SETUP_KEYS.values())]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["block", "warmup", "seed"], ignore_index=True) if len(frame) else frame


def meta_of(run: str, root: Path | str = REPO) -> dict:
    return read_run(runs_dir(root) / run)[0]


def losses(runs, root: Path | str = REPO) -> pd.DataFrame:
    """The per-step losses of the recorded runs named ``runs`` (run, block, warmup, seed, step, loss)."""
    frames = []
    for run in runs:
        meta, loss = read_run(runs_dir(root) / run)
        frames.append(loss[["step", "loss"]].assign(run=run, block=meta["norm"], warmup=int(meta["warmup"]),
                                                    seed=int(meta["seed"])))
    if not frames:
        return pd.DataFrame(columns=["step", "loss", "run", "block", "warmup", "seed"])
    return pd.concat(frames, ignore_index=True)


# ---- `blocklab lab` adopts a recorded run instead of training it again ---------------------------------------------

ADOPTED = "adopted.json"  # in a lab's run folder: the run was copied from the records, not trained here


def matching(norm: str, warmup: int, seed: int, params: dict, root: Path | str = REPO) -> str | None:
    """The recorded run of built-in ``norm`` at ``warmup`` and ``seed`` trained at ``params``' setup (the lab's
    profile applied: ``spec.params_for``), or None."""
    run_dir = runs_dir(root) / f"{norm}-w{warmup}-s{seed}"
    if not (run_dir / "meta.json").is_file():
        return None
    meta = read_run(run_dir)[0]
    precision = (meta.get("sweep", {}).get("precision") or "fp32", params["sweep"].get("precision") or "fp32")
    same = (meta.get("norm") == norm and int(meta["warmup"]) == warmup and int(meta["seed"]) == seed
            and not setup_differs(meta, params) and precision[0] == precision[1])
    return run_dir.name if same else None


def adopt(spec, params: dict, out: Path, root: Path | str = REPO, dry_run: bool = False) -> list[dict]:
    """For a built-in block, copy each planned run that is recorded at the same setup into ``out/runs/<run>/``
    (loss.csv, meta.json and ``ADOPTED``), after ``spec.json`` is written, so that its Snakemake job (whose input is
    spec.json) has nothing to train; a run trained there is left as it is, an adopted one is copied again. Returns what was (or, ``dry_run``, would be) adopted."""
    import json
    import shutil

    from .spec import params_for

    if spec.block.kind != "builtin":
        return []
    at = params_for(params, spec.setup)
    found = []
    for warmup, seed in spec.runs():
        name = matching(spec.block.source, warmup, seed, at, root)
        target = Path(out) / "runs" / spec.run_name(warmup, seed)
        if name is None or ((target / "meta.json").is_file() and not (target / ADOPTED).is_file()):
            continue  # not recorded, or trained here: its job decides; an adopted run is copied again (a newer spec)
        meta = meta_of(name, root)
        record = {"run": spec.run_name(warmup, seed), "from": f"{RUNS}/{name}", "cpu": meta.get("libraries", {}).get("cpu"),
                  "git_commit": (meta.get("code", {}).get("git_commit") or "")[:10], "meta_sha256": meta.get("meta_sha256")}
        found.append(record)
        if dry_run:
            continue
        target.mkdir(parents=True, exist_ok=True)
        for file in RECORDED_FILES:
            shutil.copyfile(runs_dir(root) / name / file, target / file)
        (target / ADOPTED).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return found


def adopted(run_dir: Path) -> dict | None:
    import json

    path = Path(run_dir) / ADOPTED
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
