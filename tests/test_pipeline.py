"""The whole DAG on the tiny configuration, in scratch copies: real Snakemake, real DVC, real papermill."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from blocklab.studies.dynamics.plan import FIGURES as DYNAMICS_FIGURES
from blocklab.pipeline import FIGURES
from blocklab.smoke import make_scratch_project

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "MPLBACKEND": "Agg"}
VERDICTS = {"reproduced", "partly", "not reproduced", "not checkable here", "inconclusive"}


def run(cmd, cwd, check=True):
    # the scratch copy's own code, so that edits to the working tree during a run cannot leak in
    env = {**ENV, "PYTHONPATH": f"{Path(cwd) / 'src'}{os.pathsep}{ENV.get('PYTHONPATH', '')}"}
    done = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def start(cmd, cwd, log: Path) -> subprocess.Popen:
    """Start ``cmd`` in a process group of its own (so that the test can SIGKILL exactly it, as a power loss would)."""
    env = {**ENV, "PYTHONPATH": f"{Path(cwd) / 'src'}{os.pathsep}{ENV.get('PYTHONPATH', '')}"}
    return subprocess.Popen([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def kill_group_when(proc: subprocess.Popen, ready, what: str, timeout=600) -> None:
    """SIGKILL ``proc``'s whole process group (only the group this test started) as soon as ``ready()``."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def snakemake_locks(project) -> list[Path]:
    return sorted((Path(project) / ".snakemake" / "locks").glob("*.lock"))


def tables(project) -> dict:
    """Every CSV the pipeline wrote, without wall-time columns (they measure the machine, not the result)."""
    out = {}
    for path in sorted((Path(project) / "data").rglob("*.csv")):
        frame = pd.read_csv(path)
        out[str(path.relative_to(project))] = frame.drop(columns=[c for c in frame.columns if "wall_time" in c])
    return out


def assert_same_tables(project, reference) -> None:
    """Same machine, same code path, same seeds: the tables are identical, not just close (resume is bit-exact)."""
    ours, theirs = tables(project), tables(reference)
    assert list(ours) == list(theirs)
    for name, frame in ours.items():
        pd.testing.assert_frame_equal(frame, theirs[name], check_exact=True, obj=name)


def planned_jobs(project, *targets) -> dict:
    """Snakemake's dry-run job table (for ``targets``, default: all): rule -> number of jobs it would run now."""
    out = run(["snakemake", "--dry-run", "--cores", "2", *targets], project).stdout
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def jobs_after_edit(project, old, new, *targets) -> dict:
    """The jobs Snakemake would run after replacing ``old`` by ``new`` in params.yaml (restored afterwards)."""
    path = Path(project) / "params.yaml"
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    try:
        return planned_jobs(project, *targets)
    finally:
        path.write_text(text, encoding="utf-8")


# snake_project (the tiny DAG run with Snakemake, once per session) is in tiny_dag.py, via conftest.py: test_report.py
# uses the same run.


# The sweep run a kill test deletes, trains again and kills while it trains, with the jobs that must follow it. Snakemake's
# hard kill: seed 0 with warm-up, which the probe, the dynamics family and the sensitivity study read too, so the kill
# during the report lands after all of them. DVC's: a run only the sweep's tables read (DVC runs the same Snakemake DAG;
# what is DVC's own is the stage, its lock and its records, which any retrained run exercises).
WIDE = ("post-w20-s0", {"aggregate_sweep", "probe_copy", "aggregate_dynamics", "aggregate_sensitivity", "claims", "report"})
NARROW = ("post-w0-s1", {"aggregate_sweep", "claims", "report"})


def without_a_sweep_run(snake_project, dest: Path, retrained=WIDE) -> Path:
    """A copy of the session's finished tiny run (files, Snakemake's records, git) without one sweep run, the sweep's
    tables and the report: the README's command then retrains that run and remakes what depends on it, and nothing else
    is trained again. One run, not the whole sweep (CI time: the other seven added ~30 s to each of the two tests that
    use this and tested nothing more: the kill lands in one run's training either way). With the sweep's tables or the
    report present, Snakemake finds every requested file and runs nothing (or only the report)."""
    name, following = retrained
    project = Path(shutil.copytree(snake_project, dest, symlinks=True))
    shutil.rmtree(project / "data" / "sweep" / "runs" / name)
    for table in ("summary.csv", "losses.csv"):
        (project / "data" / "sweep" / table).unlink()
    shutil.rmtree(project / "reports")
    planned = planned_jobs(project)
    assert planned.get("train_copy") == 1 and "train_reverse" not in planned and following <= set(planned), planned
    return project


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory, snake_project):
    """`dvc repro`, its process group SIGKILLed during training and started again: the README's "kill it and start
    it again" for DVC (DVC clears its own stale lock; the Snakefile clears Snakemake's, see pipeline.hold_run_lock).
    From the session's run without one sweep run (``without_a_sweep_run``): DVC has never run there, so `dvc repro` runs
    its stage (the Snakemake DAG), which retrains that run and remakes what depends on the sweep; the rest of the DAG is the
    same Snakemake code the session's run has already exercised."""
    project = without_a_sweep_run(snake_project, tmp_path_factory.mktemp("dvc") / "project", NARROW)
    killed = start(["dvc", "repro"], project, project.parent / "killed.log")
    kill_group_when(killed, lambda: any((project / "data/sweep/runs").glob("*/checkpoint.pt")), "training checkpoint")
    assert snakemake_locks(project), "the kill left no stale lock, so this would not test the recovery"
    run(["dvc", "repro"], project)
    assert not snakemake_locks(project)
    return project


def check_outputs(project: Path):
    for name, sources in FIGURES.items():
        png = project / "figs" / f"{name}.png"
        with Image.open(png) as image:
            image.verify()
            assert image.format == "PNG" and min(image.size) > 100, name
        sidecar = json.loads((project / "figs" / f"{name}.json").read_text(encoding="utf-8"))
        assert sidecar["sources"] and all((project / s).exists() or Path(s).exists() for s in sidecar["sources"])
    executed = json.loads((project / "reports" / "analysis.ipynb").read_text(encoding="utf-8"))
    assert executed["metadata"]["papermill"]["parameters"]["lang"] == "ko"
    errors = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors
    assert "<html" in (project / "reports" / "analysis.html").read_text(encoding="utf-8")[:2000].lower()

    summary = pd.read_csv(project / "data/sweep/summary.csv")
    assert len(summary) == 2 * 2 * 2 and set(summary["outcome"]) <= {"learned", "stuck", "collapsed", "partial", "diverged"}
    losses = pd.read_csv(project / "data/sweep/losses.csv")
    assert list(losses.columns) == ["run", "norm", "warmup", "seed", "step", "loss", "lr"] and losses["step"].max() == 60
    for run_dir in (project / "data/sweep/runs").iterdir():
        meta = json.loads((run_dir / "meta.json").read_text(encoding="utf-8"))
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
    # its last step checked every run and table and recorded the outputs for DVC
    assert "dvc.lock: recorded" in (snake_project / "logs/verified.txt").read_text(encoding="utf-8")
    assert "up to date" in run(["dvc", "status"], snake_project).stdout


TRAINING_RULES = re.compile(r"^(?:local)?rule (train\w*):", re.M)


def finished_runs(project) -> dict:
    """Every finished run's meta.json (path -> bytes and mtime): a run trained again changes both."""
    return {str(p.relative_to(project)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(Path(project, "data").rglob("runs/**/meta.json"))}


def test_snakemake_then_dvc_exp_run_trains_nothing(snake_project, tmp_path):
    """One state for both front doors: after `snakemake`, the README's `dvc exp run -S figures.lang=en` redraws the
    figures and the report and trains nothing (before: no dvc.lock, so DVC deleted every output and retrained it all);
    then `snakemake` and `dvc status` find nothing to do either way round."""
    project = Path(shutil.copytree(snake_project, tmp_path / "project", symlinks=True))
    before = finished_runs(project)
    assert len(before) >= 8
    done = run(["dvc", "exp", "run", "-S", "figures.lang=en"], project)
    out = done.stdout + done.stderr
    assert TRAINING_RULES.findall(out) == [] and "won't be created" not in out, out[-3000:]
    assert "rule report" in out  # the figures and the report were redrawn, in English
    assert finished_runs(project) == before
    assert planned_jobs(project) == {}
    assert "up to date" in run(["dvc", "status"], project).stdout


def test_removed_or_damaged_run_is_trained_again_by_the_readme_command(snake_project, tmp_path):
    """The repair `blocklab verify` and docs/reproducibility.md give: `rm -r` a finished run, run `snakemake --cores N`
    again: that run (only) is trained again, with the same losses, and what depends on it is remade (before: "Nothing
    to be done", and the run stayed lost). A damaged run (one digit of its loss.csv changed) is found before the DAG is
    planned, its meta.json set aside, and it is trained again by the same command (a dry run only says so)."""
    project = Path(shutil.copytree(snake_project, tmp_path / "project", symlinks=True))
    removed, damaged = NARROW[0], "pre-w0-s1"
    shutil.rmtree(project / "data/sweep/runs" / removed)
    loss = project / "data/sweep/runs" / damaged / "loss.csv"
    text = loss.read_text(encoding="utf-8")
    at = text.index("\n", text.index("\n") + 1) - 3
    loss.write_text(text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1:], encoding="utf-8")
    planned = planned_jobs(project)
    assert planned.get("train_copy") == 1 and NARROW[1] <= set(planned), planned
    assert not {"train_reverse", "train_dynamics", "train_sensitivity", "train_inference"} & set(planned), planned
    assert (project / "data/sweep/runs" / damaged / "meta.json").is_file()  # the dry run moved nothing
    done = run(["snakemake", "--cores", "2"], project)
    out = done.stdout + done.stderr
    assert sorted(TRAINING_RULES.findall(out)) == ["train_copy", "train_copy"], out[-3000:]
    assert f"{damaged} is damaged (loss.csv has another sha256" in out
    assert (project / "data/sweep/runs" / damaged / "meta.json.damaged").is_file()
    for name in (removed, damaged):
        assert (project / "data/sweep/runs" / name / "loss.csv").read_bytes() == \
            (snake_project / "data/sweep/runs" / name / "loss.csv").read_bytes(), name
    assert (project / "data/sweep/losses.csv").read_bytes() == (snake_project / "data/sweep/losses.csv").read_bytes()
    assert planned_jobs(project) == {}
    assert "up to date" in run(["dvc", "status"], project).stdout


def test_changing_a_plot_option_redraws_without_retraining(snake_project):
    jobs = jobs_after_edit(snake_project, "lang: ko", "lang: en")
    # only jobs that draw: the report, and the sensitivity and dynamics families' own figures (in_report in tiny)
    assert "report" in jobs and set(jobs) <= {"report", "sensitivity_figures", "dynamics_figures", "verify_and_record", "all"}


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
    # Two kernel paths (vmapped math attention + stacked Adam vs fast per-run jobs), 60 steps: the losses agree to
    # float rounding, as in test_fast_path.LOSS_RTOL (observed <= 3.4e-7 relative on every forced kernel path).
    assert ((grouped["loss"] - single["loss"]).abs() <= 1e-5 * single["loss"].abs()).all()
    meta = json.loads((project / "data/sweep/runs/post-w0-s0/meta.json").read_text(encoding="utf-8"))
    assert meta["batched_group"] == ["post-w0-s0", "post-w0-s1", "post-w20-s0", "post-w20-s1"]


def test_dvc_repro_builds_the_same_artifacts(dvc_project, snake_project):
    check_outputs(dvc_project)
    for table in ("sweep/losses.csv", "gradnorm/gradnorm.csv", "reverse_copy/losses.csv", "residual_sim/curve.csv"):
        # Exact, not a tolerance: two runs on this machine, same code path (same kernels, `threads_per_run` threads a
        # job whatever --cores is), same seeds; the dvc run was killed and resumed, which is bit-exact (test_train).
        # (The sweep's tables were made again by the dvc run, one run retrained; the others came with the copy: see
        # without_a_sweep_run.)
        # Across machines these bytes differ by float rounding: see docs/portability.md.
        assert (dvc_project / "data" / table).read_bytes() == (snake_project / "data" / table).read_bytes(), table
    assert_same_tables(dvc_project, snake_project)
    assert "up to date" in run(["dvc", "status"], dvc_project).stdout
    assert "didn't change" in run(["dvc", "repro"], dvc_project).stdout
    assert planned_jobs(dvc_project) == {}  # the other way round: `snakemake` after `dvc repro` has nothing to do


def test_dvc_params_and_plots(dvc_project, tmp_path):
    run(["dvc", "params", "diff"], dvc_project)
    run(["dvc", "plots", "show", "-o", str(tmp_path / "plots")], dvc_project)
    html = (tmp_path / "plots" / "index.html").read_text(encoding="utf-8")
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
    out, tables = tmp_path / "gallery", tmp_path / "records-gallery"
    run(["blocklab", "gallery", "--out", str(out), "--tables", str(tables), "--dpi", "40", "--wall-time",
         "measured by the test"], snake_project)
    page = (out / "README.md").read_text(encoding="utf-8")
    assert (snake_project / "data/dynamics/summary.csv").exists()  # the tiny DAG runs the dynamics family: its figures too
    for name in [*FIGURES, *DYNAMICS_FIGURES]:
        with Image.open(out / f"{name}.png") as image, Image.open(snake_project / "figs" / f"{name}.png") as full:
            assert image.format == "PNG"
            assert image.size[0] < full.size[0]  # redrawn at the gallery's dpi, so smaller than the pipeline's figure
        assert f"]({name}.png)" in page
    runs = pd.read_csv(snake_project / "data/sweep/summary.csv")["run"]
    assert all(f"| {r} " in page for r in runs)  # every training run's wall time is listed
    assert "measured by the test" in page and "Claims: " in page
    assert (tables / "dynamics/rates.csv").exists()  # the collapse rate's table is kept in records/, not docs/
    assert not list(out.rglob("*.csv")) and not list(out.rglob("*.parquet"))  # the pictures' folder holds no data


def test_gallery_refuses_an_unfinished_run(tmp_path):
    (tmp_path / "data").mkdir()
    done = run(["blocklab", "gallery", "--params", str(Path(__file__).parents[1] / "configs/tiny.yaml"),
                "--data", str(tmp_path / "data"), "--out", str(tmp_path / "g")], tmp_path, check=False)
    assert done.returncode == 2 and "missing: data/" in done.stderr and not (tmp_path / "g").exists()


def test_hard_kill_then_start_again_recovers_the_same_tables(tmp_path, snake_project):
    """The README's "kill it and start it again" after SIGKILL of the whole process group, during training and during
    the report, restarting with the README's command each time; a second run while one is live keeps its locks.

    It starts from the session's run without one sweep run (``without_a_sweep_run``): the kills land in the retraining of
    that run and in the remaking of everything that depends on the sweep."""
    project = without_a_sweep_run(snake_project, tmp_path / "project")
    first = start(["snakemake", "--cores", "2"], project, tmp_path / "first.log")

    def training_and_locked():
        return any((project / "data/sweep/runs").glob("*/checkpoint.pt")) and snakemake_locks(project)

    try:
        deadline = time.monotonic() + 600
        while not training_and_locked():
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        live_locks = {p: p.read_bytes() for p in snakemake_locks(project)}
        second = run(["snakemake", "--cores", "2"], project, check=False)  # while the first is alive
        assert second.returncode != 0 and re.search("LockException|cannot be locked", second.stdout + second.stderr)
        assert first.poll() is None and {p: p.read_bytes() for p in snakemake_locks(project)} == live_locks
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert snakemake_locks(project), "the kill must leave Snakemake's locks behind for this test to mean anything"

    again = start(["snakemake", "--cores", "2"], project, tmp_path / "again.log")
    kill_group_when(again, lambda: "blocklab report notebook" in (tmp_path / "again.log").read_text(errors="replace"), "report job")
    assert snakemake_locks(project) and not (project / "reports/analysis.html").exists()
    assert "removed the Snakemake locks" in (tmp_path / "again.log").read_text(errors="replace")

    run(["snakemake", "--cores", "2"], project)
    assert not snakemake_locks(project) and planned_jobs(project) == {}
    check_outputs(project)
    assert_same_tables(project, snake_project)


def test_run_lock_clears_only_the_locks_of_dead_runs(tmp_path):
    """pipeline.hold_run_lock in separate processes, as Snakemake's main processes would call it."""
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    call = [sys.executable, "-c", "import sys; from blocklab.pipeline import hold_run_lock; "
            "print(len(hold_run_lock(sys.argv[1])), flush=True); sys.stdin.read()", str(tmp_path)]

    def fake_locks():
        for name in ("0.input.lock", "0.output.lock"):
            (locks / name).write_text("data/x.csv\n")

    def holder():
        proc = subprocess.Popen(call, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        return proc, int(proc.stdout.readline())

    fake_locks()
    live, removed = holder()  # nobody else alive: the two locks are stale
    assert removed == 2 and not list(locks.iterdir())
    fake_locks()  # now they belong to the live holder
    second, removed = holder()
    assert removed == 0 and len(list(locks.iterdir())) == 2
    second.communicate("")
    os.killpg(live.pid, signal.SIGKILL)  # the live one dies hard: its locks are stale now
    live.wait()
    third, removed = holder()
    assert removed == 2 and not list(locks.iterdir())
    third.communicate("")
