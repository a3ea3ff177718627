"""The whole DAG on the tiny configuration, in scratch copies: real Snakemake, real DVC, real papermill."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from blocklab.pipeline import FIGURES
from blocklab.smoke import make_scratch_project

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "MPLBACKEND": "Agg"}
VERDICTS = {"reproduced", "partly", "not reproduced", "not checkable here"}


def run(cmd, cwd, check=True):
    # the scratch copy's own code, so that edits to the working tree during a run cannot leak in
    env = {**ENV, "PYTHONPATH": f"{Path(cwd) / 'src'}{os.pathsep}{ENV.get('PYTHONPATH', '')}"}
    done = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def planned_jobs(project) -> dict:
    """Snakemake's dry-run job table: rule -> number of jobs it would run now."""
    out = run(["snakemake", "--dry-run", "--cores", "2"], project).stdout
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def jobs_after_edit(project, old, new) -> dict:
    """The jobs Snakemake would run after replacing ``old`` by ``new`` in params.yaml (restored afterwards)."""
    path = Path(project) / "params.yaml"
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    try:
        return planned_jobs(project)
    finally:
        path.write_text(text, encoding="utf-8")


# snake_project (the tiny DAG run with Snakemake, once per session) is in tiny_dag.py, via conftest.py: test_report.py
# uses the same run.


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory):
    project = make_scratch_project(tmp_path_factory.mktemp("dvc") / "project")
    run(["dvc", "repro"], project)
    return project


def check_outputs(project: Path):
    for name, sources in FIGURES.items():
        png = project / "figs" / f"{name}.png"
        with Image.open(png) as image:
            image.verify()
            assert image.format == "PNG" and min(image.size) > 100, name
        sidecar = json.loads((project / "figs" / f"{name}.json").read_text())
        assert sidecar["sources"] and all((project / s).exists() or Path(s).exists() for s in sidecar["sources"])
    executed = json.loads((project / "reports" / "analysis.ipynb").read_text())
    assert executed["metadata"]["papermill"]["parameters"]["lang"] == "ko"
    errors = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors
    assert "<html" in (project / "reports" / "analysis.html").read_text()[:2000].lower()

    summary = pd.read_csv(project / "data/sweep/summary.csv")
    assert len(summary) == 2 * 2 * 2 and set(summary["outcome"]) <= {"learned", "stuck", "collapsed", "partial", "diverged"}
    losses = pd.read_csv(project / "data/sweep/losses.csv")
    assert list(losses.columns) == ["run", "norm", "warmup", "seed", "step", "loss", "lr"] and losses["step"].max() == 60
    for run_dir in (project / "data/sweep/runs").iterdir():
        meta = json.loads((run_dir / "meta.json").read_text())
        assert meta["code"]["blocklab_source_sha256"] and meta["libraries"]["torch"] and meta["wall_time_s"] > 0
        assert (run_dir / "train.log").exists() and not (run_dir / "checkpoint.pt").exists()
    gradnorm = pd.read_csv(project / "data/gradnorm/gradnorm.csv")
    assert len(gradnorm) == 2 * 2 * 3 and (gradnorm["grad_norm"] > 0).all()
    claims = pd.read_csv(project / "data/claims/claims.csv")
    assert set(claims["verdict"]) <= VERDICTS and claims["measured"].notna().all()
    assert {"000", "004"} <= set(claims["document"].astype(str).str.zfill(3))


def test_snakemake_builds_every_figure_and_artifact(snake_project):
    check_outputs(snake_project)
    assert planned_jobs(snake_project) == {}


def test_adding_a_seed_trains_only_the_new_runs(snake_project):
    jobs = jobs_after_edit(snake_project, "seeds: [0, 1]\n  steps: 60", "seeds: [0, 1, 2]\n  steps: 60")
    assert jobs.get("train_copy") == 2 * 2  # one new seed x 2 norms x 2 warm-ups
    assert "train_reverse" not in jobs and "gradnorm" not in jobs


def test_changing_a_plot_option_redraws_without_retraining(snake_project):
    jobs = jobs_after_edit(snake_project, "lang: ko", "lang: en")
    assert set(jobs) == {"report", "all"}


def test_changing_a_model_parameter_retrains_what_depends_on_it(snake_project):
    jobs = jobs_after_edit(snake_project, "n_layers: 3", "n_layers: 2")  # copy_model only
    assert jobs.get("train_copy") == 8 and jobs.get("gradnorm") == 1
    assert not {"train_reverse", "activation_norms", "residual_sim", "problem9", "param_counts"} & set(jobs)


def test_batched_sweep_trains_one_job_per_norm_position(tmp_path, snake_project):
    """sweep.batched: true swaps the per-run rule for one vmapped job per norm position, with the same artifacts."""
    project = make_scratch_project(tmp_path / "project")
    params = project / "params.yaml"
    params.write_text(params.read_text(encoding="utf-8").replace("batched: auto", "batched: true", 1), encoding="utf-8")
    assert planned_jobs(project)["train_copy_group"] == 2 and "train_copy" not in planned_jobs(project)
    run(["snakemake", "--cores", "2", "data/sweep/summary.csv"], project)
    grouped = pd.read_csv(project / "data/sweep/losses.csv")
    single = pd.read_csv(snake_project / "data/sweep/losses.csv")
    assert list(grouped[["run", "step"]].itertuples(index=False)) == list(single[["run", "step"]].itertuples(index=False))
    assert ((grouped["loss"] - single["loss"]).abs() <= 1e-4 * single["loss"].abs() + 1e-6).all()
    meta = json.loads((project / "data/sweep/runs/post-w0-s0/meta.json").read_text())
    assert meta["batched_group"] == ["post-w0-s0", "post-w0-s1", "post-w20-s0", "post-w20-s1"]


def test_dvc_repro_builds_the_same_artifacts(dvc_project, snake_project):
    check_outputs(dvc_project)
    for table in ("sweep/losses.csv", "gradnorm/gradnorm.csv", "reverse_copy/losses.csv", "residual_sim/curve.csv"):
        # two independent runs, same parameters and seeds: identical numbers
        assert (dvc_project / "data" / table).read_bytes() == (snake_project / "data" / table).read_bytes(), table
    assert "up to date" in run(["dvc", "status"], dvc_project).stdout
    assert "didn't change" in run(["dvc", "repro"], dvc_project).stdout


def test_dvc_params_and_plots(dvc_project, tmp_path):
    run(["dvc", "params", "diff"], dvc_project)
    run(["dvc", "plots", "show", "-o", str(tmp_path / "plots")], dvc_project)
    html = (tmp_path / "plots" / "index.html").read_text()
    assert "loss_curves" in html or "Copy-task loss" in html


def test_dvc_remote_push_pull_round_trip(dvc_project, tmp_path):
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "--local", "-f", "-d", "scratch", str(remote)], dvc_project)
    run(["dvc", "push"], dvc_project)
    before = (dvc_project / "data/sweep/losses.csv").read_bytes()
    for out in ("data/sweep", "data/gradnorm", "figs", "reports", ".dvc/cache"):
        shutil.rmtree(dvc_project / out)
    run(["dvc", "pull"], dvc_project)
    assert (dvc_project / "data/sweep/losses.csv").read_bytes() == before
    assert (dvc_project / "figs/loss_curves.png").exists()
    assert "up to date" in run(["dvc", "status"], dvc_project).stdout
    assert "didn't change" in run(["dvc", "repro"], dvc_project).stdout


def test_gallery_redraws_every_figure_with_its_provenance(snake_project, tmp_path):
    out = tmp_path / "gallery"
    run(["blocklab", "gallery", "--out", str(out), "--dpi", "40", "--wall-time", "measured by the test"], snake_project)
    page = (out / "README.md").read_text(encoding="utf-8")
    for name in FIGURES:
        with Image.open(out / f"{name}.png") as image, Image.open(snake_project / "figs" / f"{name}.png") as full:
            assert image.format == "PNG"
            assert image.size[0] < full.size[0]  # redrawn at the gallery's dpi, so smaller than the pipeline's figure
        assert f"]({name}.png)" in page
    runs = pd.read_csv(snake_project / "data/sweep/summary.csv")["run"]
    assert all(f"| {r} " in page for r in runs)  # every training run's wall time is listed
    assert "measured by the test" in page and "Claims: " in page


def test_gallery_refuses_an_unfinished_run(tmp_path):
    (tmp_path / "data").mkdir()
    done = run(["blocklab", "gallery", "--params", str(Path(__file__).parents[1] / "configs/tiny.yaml"),
                "--data", str(tmp_path / "data"), "--out", str(tmp_path / "g")], tmp_path, check=False)
    assert done.returncode == 2 and "missing: data/" in done.stderr and not (tmp_path / "g").exists()
