"""`blocklab gallery`: the README's figure gallery, redrawn from a finished run's cached data, with where it came from.

The gallery is documentation, kept in git (docs/gallery/); figs/ and data/ are outputs and are not. Every image is
drawn again from data/ by the same plotting functions as the pipeline (so it cannot drift from the data), at a
smaller dpi, each with its JSON sidecar; the page records the parameters file's hash, the code version, the training
runs' wall times and the claims' verdicts.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pandas as pd

from ..integrity import begin_snapshot, record_snapshot, verify_run
from ..io import atomic_path, read_table
from ..params_file import load_params
from ..studies.dynamics.plan import FIGURES as DYNAMICS_FIGURES, PLAN as DYNAMICS_PLAN, TABLES as DYNAMICS_TABLES
from ..studies.dynamics.plan import snapshots as dynamics_snapshots
from ..pipeline import FIGURES
from ..records import GALLERY

CAPTIONS = {
    "loss_curves": "Copy-task loss, norm position × warm-up; seeds as thin lines, ln 64 dotted (document 000).",
    "problem11_norm_warmup": "Problem 11: the two block forms, and what the sweep measured in each of the four cases.",
    "gradnorm_at_init": "Gradient norm of each block's second MLP weight at init, Xavier (Xiong et al. 2020, Fig. 3).",
    "problem10_residual_growth": "Problem 10: residual-stream length after L random unit updates vs √(L+1).",
    "problem9_scores": "Problem 9: the three students' scores, raw and standardized per student and per subject.",
    "residual_growth_trained": "Residual-stream norms per layer: SmolLM2-135M and the trained copy models.",
    "activation_norms": "Document 004: hidden-state norm after every block at init, 12/24/48 blocks.",
    "residual_ablation": "Document 004: gradient per layer at init with and without residual connections.",
    "reverse_copy": "Document 004: encoder–decoder reverse copy, classic vs each modern swap.",
    "param_counts": "Document 004: parameters of one block by part, closed form (= numel).",
    "sensitivity_phase": "Sensitivity: steps to learn, post vs pre, over depth × learning rate (every seed in its cell).",
    "sensitivity_loss_curves": "Sensitivity: the four norm × warm-up cases under each position signal and batch size.",
    "sensitivity_gradnorm": "Sensitivity: gradient norm per block at init under each position signal.",
    "dynamics_gradnorm": "Dynamics: gradient norm per block through training, post vs pre, with and without warm-up "
                         "(Xiong et al. 2020, Fig. 3, during training).",
    "dynamics_collapse": "Dynamics: a post-norm collapse or spike after warm-up, its loss and diagnostics on one step axis, "
                         "beside a seed that stayed learned.",
}


def training_runs(data: Path) -> pd.DataFrame:
    """One row per finished sweep run: wall time, threads, device, code version, whether it resumed.

    meta.json is written by the process that finished the run: a run resumed from a checkpoint records that
    process's code version and fast-path setting; the steps before ``resumed_from_step`` may have run on others.
    """
    rows = []
    for meta_file in sorted((data / "sweep" / "runs").glob("*/meta.json")):
        meta = verify_run(meta_file.parent)
        rows.append({
            "run": meta["run"], "wall_time_s": meta["wall_time_s"], "threads": meta["threads"], "device": meta["device"],
            "fast_path_at_finish": meta["sweep"].get("fast_path", False), "resumed_from_step": meta["resumed_from_step"],
            "git_commit": (meta["code"].get("git_commit") or "")[:10], "status": meta["status"],
        })
    return pd.DataFrame(rows)


# Beside the figures, the small tables they and the claims are computed from (data/ layout, a few MB), so that a reader
# can re-plot (`blocklab report figure NAME --data records/gallery`) and re-judge (`blocklab report claims --data records/gallery`)
# without retraining. Weights, checkpoints and per-run directories are not copied.
SNAPSHOT_EXTRA = ["data/param_counts/models.csv", "data/param_counts/audit.csv", "data/residual_sim/table.csv",
                  "data/claims/claims.csv", "data/sensitivity/plan.csv", "data/sensitivity/summary.csv",
                  "data/sensitivity/losses.csv", "data/sensitivity/gradnorm.csv",
                  "data/sensitivity/claims_by_setting.csv", DYNAMICS_PLAN, *DYNAMICS_TABLES.values()]


# Made from recorded runs (sensitivity.from_snapshots), the study's per-step losses are those snapshots' losses.csv, in
# git already (records/sensitivity/): the gallery does not store them a second time (5 MB), it says how to rebuild them.
FROM_SNAPSHOTS_SKIP = {"data/sensitivity/losses.csv"}


def snapshot_tables(data: Path, out: Path, params: dict, skip: set[str] = frozenset()) -> list[Path]:
    """Copy every table the figures and claims read (those that exist, less ``skip``) into ``out`` in the data/ layout:
    every table a claim's check reads in a run of ``params`` (``claims.inputs``: the held-out losses included), so that
    the gallery's claims table can be re-judged from the gallery alone."""
    from .claims import inputs as claim_inputs

    judged = set(claim_inputs(params))
    wanted = sorted(({src for sources in FIGURES.values() for src in sources} | set(SNAPSHOT_EXTRA) | judged) - set(skip))
    copied = []
    for rel in wanted:
        source = data / Path(rel).relative_to("data")
        if source.exists():
            target = out / Path(rel).relative_to("data")
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(target) as tmp:
                shutil.copyfile(source, tmp)
            copied.append(target)
    return copied


def build_gallery(params_file: Path, data: Path, out: Path, dpi: int, lang: str | None = None,
                  pipeline_wall_time: str | None = None, tables: Path = Path(GALLERY)) -> Path:
    """The figures and their page into ``out`` (docs/gallery), the tables behind them and the run's params.yaml into
    ``tables`` (records/gallery: recorded data lives in records/, docs/ holds pages and pictures)."""
    from ..figures.style import relative_sidecar
    from .report import save_figure

    params = load_params(params_file)
    missing = [src for sources in FIGURES.values() for src in sources if not (data / Path(src).relative_to("data")).exists()]
    if missing:
        raise FileNotFoundError(f"the gallery needs a finished run; missing: {', '.join(missing)}")
    shrunk = {**params, "figures": {**params["figures"], "dpi": dpi}}
    out.mkdir(parents=True, exist_ok=True)
    sidecars = {}
    for name in FIGURES:
        save_figure(name, shrunk, data, out, lang)
        sidecars[name] = relative_sidecar(out / f"{name}.json", data)

    study = data / "sensitivity" / "summary.csv"
    if study.exists():  # the sensitivity study was run: its figures too
        from ..studies.sensitivity.figures import save_figures
        from ..studies.sensitivity.plan import FIGURES as STUDY_FIGURES

        save_figures(shrunk, data, out, lang)
        for name in STUDY_FIGURES:
            sidecars[name] = relative_sidecar(out / f"{name}.json", data)
    dynamics = data / "dynamics" / "summary.csv"
    if dynamics.exists():  # the training-dynamics family was run: its figures too
        from ..studies.dynamics.figures import save_figures as save_dynamics_figures

        save_dynamics_figures(shrunk, data, out, lang)
        for name in DYNAMICS_FIGURES:
            sidecars[name] = relative_sidecar(out / f"{name}.json", data)
    from ..studies.sensitivity.plan import snapshots

    from_snapshots = snapshots(params) if "sensitivity" in params else []
    tables.mkdir(parents=True, exist_ok=True)
    begin_snapshot(tables)  # a kill from here on leaves tables that `blocklab docs` refuses until rewritten
    snapshot = snapshot_tables(data, tables, params, FROM_SNAPSHOTS_SKIP if from_snapshots else set())
    with atomic_path(tables / "params.yaml") as tmp:
        tmp.write_bytes(Path(params_file).read_bytes())
    record_snapshot(tables)  # last: the checksums of the tables (`blocklab verify records/gallery`)

    runs = training_runs(data)
    commits = sorted({s.get("git_commit") or "?" for s in sidecars.values()})
    lines = [
        "# Figure gallery",
        "",
        "Generated by `blocklab gallery` from a full run of the default `params.yaml`; every image is redrawn from",
        "`data/` by the pipeline's own plotting functions, and each has a JSON sidecar naming its data files.",
        "",
        f"- parameters: `params.yaml` sha256 `{hashlib.sha256(Path(params_file).read_bytes()).hexdigest()[:16]}`",
        f"- figure code: commit {', '.join(f'`{c[:10]}`' for c in commits)}",
    ]
    if pipeline_wall_time:
        lines.append(f"- pipeline wall time: {pipeline_wall_time}")
    if len(runs):
        lines += [
            f"- training: {len(runs)} sweep runs, {runs['wall_time_s'].sum() / 3600:.2f} h of run time in all "
            f"(longest {runs['wall_time_s'].max() / 60:.0f} min), commits {', '.join(sorted(set(runs['git_commit'])))}",
            "",
            runs.to_markdown(index=False),
        ]
    claims_file = data / "claims" / "claims.csv"
    if claims_file.exists():
        verdicts = read_table(claims_file)["verdict"].value_counts()
        lines += ["", "Claims: " + ", ".join(f"{n} {v}" for v, n in verdicts.items()) + " (table: `data/claims/claims.csv`)."]
    lines += ["", f"Tables behind every figure and claim: `{tables.as_posix()}/`, in the data/ layout ({len(snapshot)} files, "
              f"{sum(p.stat().st_size for p in snapshot) / 1e6:.1f} MB, with the run's `params.yaml`); redraw with "
              "`blocklab report figure NAME --params records/gallery/params.yaml --data records/gallery`, re-judge with "
              "`blocklab report claims --params records/gallery/params.yaml --data records/gallery --out claims.csv`."]
    if from_snapshots and study.exists():
        lines += ["", "The sensitivity study was made from the runs recorded in git (`sensitivity.from_snapshots`: "
                  + ", ".join(f"`{d}`" for d in from_snapshots) + "), not trained in this run; its per-step losses are "
                  "those snapshots' `losses.csv` and are not copied here. To redraw its figures: copy "
                  "`records/gallery/sensitivity/gradnorm.csv` into `/tmp/study/data/sensitivity/`, then `blocklab "
                  "sensitivity aggregate --root /tmp/study --from " + " ".join(from_snapshots) + "` and `blocklab "
                  "sensitivity figures --data /tmp/study/data --figs /tmp/study/figs` (the tables come out byte for "
                  "byte those of the run)."]
    recorded = dynamics_snapshots(params) if dynamics.exists() else []
    if recorded:
        lines += ["", "The training-dynamics family: its main-sweep runs were trained in this run, diagnostics included; "
                  "its other runs were read from the runs recorded in git (`dynamics.from_snapshots`: "
                  + ", ".join(f"`{d}`" for d in recorded) + ")."]
    lines += ["", "The stability lab's recorded runs, the literature's fixes for post-norm at the same setup, beside this "
              "run's pre- and post-norm runs: [lab.md](lab.md) (redrawn by `blocklab docs` when a run is recorded)."]
    for name in sidecars:
        sources = ", ".join(f"`{s}`" for s in sidecars[name]["sources"])
        lines += ["", f"## {name}", "", CAPTIONS.get(name, ""), "", f"![{name}]({name}.png)", "", f"Data: {sources}."]
    page = out / "README.md"
    with atomic_path(page) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return page


def register(subparsers) -> None:
    p = subparsers.add_parser("gallery", help="redraw every figure of a finished run into docs/gallery with provenance")
    p.add_argument("--params", default="params.yaml", type=Path)
    p.add_argument("--data", default="data", type=Path)
    p.add_argument("--out", default="docs/gallery", type=Path)
    p.add_argument("--dpi", default=80, type=int)
    p.add_argument("--lang", choices=["ko", "en"], default=None)
    p.add_argument("--wall-time", default=None, help="the measured pipeline wall time, as text, for the page")
    p.add_argument("--tables", default=GALLERY, type=Path, help=f"where the tables go (default: {GALLERY})")
    p.set_defaults(func=lambda a: print(build_gallery(a.params, a.data, a.out, a.dpi, a.lang, a.wall_time, a.tables)))
