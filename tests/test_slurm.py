"""The SLURM scale-out path: the profiles, and (opt-in) the whole tiny pipeline on a real one-node SLURM cluster.

The opt-in test (BLOCKLAB_SLURM_TEST=1, as root on Debian/Ubuntu; see docs/slurm.md) starts a local cluster with
scripts/slurm_local_cluster.sh, runs the tiny pipeline once with the local executor and once with
`snakemake --executor slurm --profile profiles/slurm` in two scratch copies, and checks that
  - every rule job of the DAG (counted from Snakemake's own dry run) ran as exactly one SLURM job, COMPLETED, under the
    profile's account, according to sacct, with one executor log per job;
  - the artifacts are the same: every CSV (timing columns aside) and every trained model's weights, exactly.
Extra Snakemake arguments for both runs (e.g. `--omit-from report` to skip a step): BLOCKLAB_SLURM_EXTRA_ARGS.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from blocklab.smoke import make_scratch_project

PROJECT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLUSTER_SCRIPT = PROJECT / "scripts" / "slurm_local_cluster.sh"
ACCOUNT = "blocklab"  # created by the cluster script
TIMING_COLUMN = re.compile(r"time|seconds")  # wall-clock measurements differ between any two runs
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
EXTRA_ARGS = shlex.split(os.environ.get("BLOCKLAB_SLURM_EXTRA_ARGS", ""))

_skip_unless_asked = pytest.mark.skipif(
    os.environ.get("BLOCKLAB_SLURM_TEST") != "1",
    reason="starts a SLURM cluster and runs the pipeline twice (minutes): set BLOCKLAB_SLURM_TEST=1 (see docs/slurm.md)",
)


def opt_in(test):
    return pytest.mark.slurm(_skip_unless_asked(test))


def scratch(dest: Path) -> Path:
    """A scratch copy of the working tree: tracked files (make_scratch_project) plus files not yet added to git."""
    make_scratch_project(dest)
    untracked = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=PROJECT,
                               capture_output=True, text=True, check=True).stdout
    for name in filter(None, untracked.split("\0")):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT / name, dest / name)
    return dest


def snakemake(project: Path, *args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    # Jobs import the scratch copy's own package (SLURM passes the environment on with --export=ALL), not the
    # editable install: the code that runs is the code that was copied, whatever happens to the work tree meanwhile.
    env = {**ENV, "PYTHONPATH": str(project / "src")}
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=timeout)


def failure_report(result: subprocess.CompletedProcess, project: Path) -> str:
    """Snakemake's error blocks and the end of each failed job's log, which a plain tail of the output misses."""
    output = result.stdout + result.stderr
    blocks = re.findall(r"^Error in rule .*\n(?:[ \t].*\n?)*", output, flags=re.M)
    logs = re.findall(r"^\s+log: (\S+)", "".join(blocks), flags=re.M)
    tails = [f"--- {log}:\n" + (project / log).read_text(errors="replace")[-3000:]
             for log in dict.fromkeys(logs) if (project / log).is_file()]
    return "\n".join(blocks + tails) or output[-5000:]


def planned_jobs(output: str) -> tuple[Counter, Counter]:
    """Rule jobs with a command in a dry run's job list: those for the executor, and `localrule`s run on the host.
    Jobs without a command (the target rule `all`: "Shell command: None") are completed by Snakemake itself."""
    jobs = re.findall(r"^(local)?rule (\w+):\n(?:[ \t].*\n)*Shell command: (.*)$", output, flags=re.M)
    remote = Counter(rule for local, rule, command in jobs if not local and command != "None")
    local = Counter(rule for local, rule, command in jobs if local and command != "None")
    return remote, local


# ---- the profiles (no cluster needed) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def profile_project(tmp_path_factory):
    return scratch(tmp_path_factory.mktemp("slurm-profile"))


@pytest.mark.parametrize("profile,gpu", [("profiles/slurm", None), ("profiles/slurm-gpu", "1")])
def test_profile_sets_resources_per_rule(profile_project, profile, gpu):
    targets = ["data/sweep/runs/pre-w0-s0/meta.json", "data/reverse_copy/runs/classic-s0/meta.json",
               "data/problem9/scores.csv"]
    result = snakemake(profile_project, "-n", "--profile", profile, "--workflow-profile", "none", *targets, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    blocks = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", result.stdout, flags=re.M)
    resources = {rule: dict(item.split("=", 1) for item in text.split(", ")) for rule, text in blocks}
    assert set(resources) == {"train_copy", "train_reverse", "problem9"}
    profile_file = yaml.safe_load((PROJECT / profile / "config.yaml").read_text())
    assert profile_file["executor"] == "slurm"
    for rule, wanted in profile_file["set-resources"].items():
        for name, value in wanted.items() if rule in resources else []:
            assert resources[rule][name] == str(value), (rule, name)
    assert resources["problem9"]["mem_mb"] == str(profile_file["default-resources"]["mem_mb"])
    assert resources["train_copy"].get("gpu") == gpu and resources["train_reverse"].get("gpu") == gpu
    assert "gpu" not in resources["problem9"]


def test_gpu_profile_gives_the_batched_sweep_job_a_gpu(profile_project):
    params = profile_project / "params.yaml"
    text = params.read_text(encoding="utf-8")
    params.write_text(text.replace("batched: auto", "batched: true", 1), encoding="utf-8")
    try:
        result = snakemake(profile_project, "-n", "--profile", "profiles/slurm-gpu", "--workflow-profile", "none",
                           "data/sweep/runs/pre-w0-s0/meta.json", timeout=600)
    finally:
        params.write_text(text, encoding="utf-8")
    assert result.returncode == 0, result.stdout + result.stderr
    (block,) = re.findall(r"^rule train_copy_group:\n(?:    .*\n)*?    resources: (.*)$", result.stdout, flags=re.M)
    resources = dict(item.split("=", 1) for item in block.split(", "))
    wanted = yaml.safe_load((PROJECT / "profiles/slurm-gpu/config.yaml").read_text())["set-resources"]["train_copy_group"]
    assert resources["gpu"] == "1" and resources["mem_mb"] == str(wanted["mem_mb"])


# ---- the whole pipeline on a local SLURM cluster (opt-in) ----------------------------------------------

def _cluster_is_up() -> bool:
    return shutil.which("scontrol") is not None and subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def cluster():
    was_up = _cluster_is_up()
    started = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True, timeout=1800)
    assert started.returncode == 0, started.stdout + started.stderr
    yield
    if not was_up:  # leave a cluster someone else started as it was
        subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """The tiny pipeline run locally and on SLURM, each in its own scratch copy."""
    local, remote = (scratch(tmp_path_factory.mktemp(name)) for name in ("local", "slurm"))
    profile = remote / "profiles" / "slurm-test"
    profile.mkdir()
    settings = yaml.safe_load((PROJECT / "profiles/slurm/config.yaml").read_text())
    settings["default-resources"]["slurm_account"] = ACCOUNT  # as a user fills it in for their cluster
    (profile / "config.yaml").write_text(yaml.safe_dump(settings))

    dry = snakemake(remote, "-n", "--printshellcmds", "--profile", str(profile), "--workflow-profile", "none",
                    *EXTRA_ARGS, timeout=600)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    seconds = {}
    began = time.monotonic()
    on_slurm = snakemake(remote, "--executor", "slurm", "--profile", str(profile), "--workflow-profile", "none",
                         "--jobs", "4", *EXTRA_ARGS)
    seconds["slurm"] = time.monotonic() - began
    began = time.monotonic()
    on_host = snakemake(local, "--cores", "2", *EXTRA_ARGS)
    seconds["local"] = time.monotonic() - began
    print(f"\ntiny pipeline: SLURM {seconds['slurm']:.0f} s, local {seconds['local']:.0f} s")
    assert on_slurm.returncode == 0, failure_report(on_slurm, remote)
    assert on_host.returncode == 0, failure_report(on_host, local)
    return {"local": local, "slurm": remote, "dry": dry.stdout, "log": on_slurm.stdout + on_slurm.stderr}


def _sacct(run_id: str) -> pd.DataFrame:
    out = subprocess.run(
        ["sacct", "-X", "--parsable2", "--noheader", "--starttime", "now-2days", "--name", run_id,
         "--format=JobIDRaw,State,Account,Comment%300"],
        capture_output=True, text=True, check=True,
    ).stdout
    rows = [line.split("|", 3) for line in out.splitlines() if line]
    jobs = pd.DataFrame(rows, columns=["job", "state", "account", "comment"])
    # The executor's comment is rule_<rule> or rule_<rule>_wildcards_<values>.
    jobs["rule"] = jobs["comment"].str.extract(r"^rule_(\w+?)(?:_wildcards_.*)?$", expand=False)
    return jobs


@opt_in
def test_every_rule_job_ran_as_one_slurm_job(runs):
    remote, local = planned_jobs(runs["dry"])
    assert remote, "the dry run lists no jobs"
    assert not local, f"rules run outside SLURM: {local}"
    run_id = re.search(r"SLURM run ID: (\S+)", runs["log"]).group(1)
    jobs = _sacct(run_id)
    assert jobs["rule"].notna().all(), jobs
    assert Counter(jobs["rule"]) == remote
    assert set(jobs["state"]) == {"COMPLETED"}
    assert set(jobs["account"]) == {ACCOUNT}
    logs = list((runs["slurm"] / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert Counter(p.relative_to(runs["slurm"] / ".snakemake" / "slurm_logs").parts[0] for p in logs) == \
        Counter({f"rule_{rule}": n for rule, n in remote.items()})
    assert sorted(p.stem for p in logs) == sorted(jobs["job"])


def _csvs(project: Path) -> list[Path]:
    return sorted(p.relative_to(project) for p in (project / "data").rglob("*.csv"))


@opt_in
def test_slurm_artifacts_equal_local_artifacts(runs):
    local, remote = runs["local"], runs["slurm"]
    assert _csvs(local) == _csvs(remote) and _csvs(local)
    for name in _csvs(local):
        ours, theirs = (pd.read_csv(root / name) for root in (local, remote))
        timing = [c for c in ours.columns if TIMING_COLUMN.search(c)]
        # Same code, same seeds, same thread count (1 per job): bit-identical on the CPU, so no tolerance.
        pd.testing.assert_frame_equal(ours.drop(columns=timing), theirs.drop(columns=timing), check_exact=True,
                                      obj=str(name))
    weights = sorted(p.relative_to(local) for p in (local / "data").rglob("*.safetensors"))
    assert weights == sorted(p.relative_to(remote) for p in (remote / "data").rglob("*.safetensors")) and weights
    for name in weights:
        assert (local / name).read_bytes() == (remote / name).read_bytes(), name
    figures = sorted(p.name for p in (local / "figs").glob("*.png"))
    assert figures == sorted(p.name for p in (remote / "figs").glob("*.png"))
