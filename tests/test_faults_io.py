"""More faults, injected on the tiny configuration: every output the pipeline writes is under a checksum record that
`blocklab verify` reads (figures, their sidecars, the report, as tables); every artifact a finished run records must
be there; parameter files that would hold every reader for minutes are refused at once, naming the key or the size;
the key blamed is the one that drives the estimate; a run refused by a live one is told to wait; the temporary file
of a killed write goes at the next start. docs/reproducibility.md, "Faults", has the table these tests back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from blocklab.integrity import run_record, seal_meta, verify_run, verify_tree
from blocklab.io import atomic_path, recorded_path, table_record_path, write_table
from blocklab.params_file import MAX_PARAMS_BYTES, MAX_PARAMS_VALUES, ParamsError, load_params

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
TINY_TEXT = TINY.read_text(encoding="utf-8")


def blocklab(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blocklab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def flip_a_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x80
    path.write_bytes(bytes(data))


# ---- figures, sidecars and the report: the same records as tables ------------------------------------------------------


def draw_outputs(root: Path) -> dict[str, Path]:
    """A figure with its sidecar (the figure writer of every figure) and a report, as the pipeline writes them."""
    import matplotlib.pyplot as plt

    from blocklab.figures.style import save

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3, 1, 2])
    figure = save(fig, root / "figs" / "problem11_norm_warmup.png", dpi=30, sources=["data/sweep/summary.csv"],
                  params={"lang": "ko"})
    report = root / "reports" / "analysis.html"
    with recorded_path(report) as tmp:
        tmp.write_text("<html><body>보고서</body></html>\n", encoding="utf-8")
    write_table(__import__("pandas").DataFrame({"run": ["a"], "final_loss": [1.0]}), root / "data/sweep/summary.csv")
    return {"figure": figure, "sidecar": figure.with_suffix(".json"), "report": report,
            "table": root / "data/sweep/summary.csv"}


def test_every_figure_sidecar_and_report_has_a_record_that_verify_checks(tmp_path):
    outputs = draw_outputs(tmp_path)
    for path in outputs.values():
        record = table_record_path(path).read_text(encoding="utf-8").split()
        assert record[1] == path.name and len(record[0]) == 64, record
        assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".")], "no temporary file left"
    for folder in ("figs", "reports", "data"):
        assert verify_tree(tmp_path / folder)[1] == [], folder
    done = blocklab("verify", "data", "figs", "reports", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("verified 4 of 4 "), done.stdout


@pytest.mark.parametrize("which", ["figure", "sidecar", "report"])
def test_a_flipped_byte_in_a_figure_sidecar_or_report_fails_verify_naming_it(tmp_path, which):
    outputs = draw_outputs(tmp_path)
    damaged = outputs[which]
    flip_a_byte(damaged)
    folder = damaged.parent.name
    checked, failures = verify_tree(tmp_path / folder)
    assert len(failures) == 1 and failures[0].startswith(f"{tmp_path / folder / damaged.name}: damaged file: "
                                                         f"{damaged.name} has another sha256"), failures
    if which != "figure":
        return  # the command line once (a process start costs seconds)
    done = blocklab("verify", "data", "figs", "reports", cwd=tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and f"{folder}/{damaged.name}: damaged file" in done.stderr
    assert "verified 3 of 4" in done.stdout
    bare = blocklab("verify", cwd=tmp_path)  # the README's check: what the pipeline makes, not data/ alone
    assert bare.returncode == 3 and f"{folder}/{damaged.name}: damaged file" in bare.stderr, bare.stderr
    assert bare.stdout.strip().splitlines()[-1] == ("verified 3 of 4 run(s), table(s), snapshot(s) and cache object(s) "
                                                    "in data/, figs/, reports/ (DVC's cache: none here); 1 damaged "
                                                    "(above)"), bare.stdout


def test_the_pipeline_start_removes_a_damaged_figure_and_its_sidecar_so_that_it_is_drawn_again(tmp_path, monkeypatch):
    from blocklab.pipeline import hold_run_lock, remove_damaged_outputs

    outputs = draw_outputs(tmp_path)
    flip_a_byte(outputs["sidecar"])  # the sidecar is no rule's output: its picture goes with it
    flip_a_byte(outputs["report"], at=3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("blocklab.pipeline._alone", [])
    said = []
    assert remove_damaged_outputs(log=said.append) == [] and not said, "another run may be alive: nothing touched"
    hold_run_lock()  # alone: no other run of the directory
    remade = remove_damaged_outputs(dry_run=True, log=said.append)
    assert remade == ["figs/problem11_norm_warmup.png", "reports/analysis.html"], remade  # the sidecar's picture
    assert all(p.is_file() for p in outputs.values()), "a dry run only says so"
    assert any("a run without -n removes it" in line for line in said)
    said.clear()
    remove_damaged_outputs(log=said.append)
    gone = [outputs[k] for k in ("figure", "sidecar", "report")]
    assert not any(p.exists() or table_record_path(p).exists() for p in gone)
    assert outputs["table"].is_file(), "what is whole stays"
    assert len(said) == 2 and "figs/problem11_norm_warmup.json: damaged: problem11_norm_warmup.json has another " \
        "sha256" in said[0] + said[1]
    # drawn before drawings had records (an older project): drawn again, with one; a table without one is left
    (tmp_path / "figs" / "loss_curves.png").write_bytes(b"old")
    (tmp_path / "data" / "plan.csv").write_text("a\n1\n")
    assert remove_damaged_outputs() == ["figs/loss_curves.png"]
    assert not (tmp_path / "figs" / "loss_curves.png").exists() and (tmp_path / "data" / "plan.csv").exists()


def test_gallery_copies_keep_no_records(tmp_path):
    """docs/ holds pages and pictures only: a figure copied there for git (``relative_sidecar``) drops its records."""
    from blocklab.figures.style import relative_sidecar

    outputs = draw_outputs(tmp_path)
    relative_sidecar(outputs["sidecar"], tmp_path / "data")
    assert not list((tmp_path / "figs").glob("*.sha256"))
    assert json.loads(outputs["sidecar"].read_text(encoding="utf-8"))["sources"] == ["data/sweep/summary.csv"]


def test_a_figures_sidecar_records_its_data_relative_to_the_project(tmp_path, monkeypatch):
    """A source given as an absolute path under the project (where the jobs run) is recorded as data/...; one outside
    it as given (before: the drawing machine's absolute paths)."""
    import matplotlib.pyplot as plt

    from blocklab.figures.style import save

    monkeypatch.chdir(tmp_path)
    fig, ax = plt.subplots()
    ax.plot([1, 2], [2, 1])
    outside = tmp_path.parent / "elsewhere.csv"
    figure = save(fig, tmp_path / "figs" / "x.png", dpi=30, sources=[tmp_path / "data/sweep/summary.csv",
                                                                     "data/sweep/losses.csv", outside])
    recorded = json.loads(figure.with_suffix(".json").read_text(encoding="utf-8"))["sources"]
    assert recorded == ["data/sweep/summary.csv", "data/sweep/losses.csv", str(outside)], recorded


# ---- every artifact a finished run records must be there ---------------------------------------------------------------


def finished_run(run: Path) -> Path:
    """A finished run as write_run leaves it: three artifacts, then meta.json recording them."""
    run.mkdir(parents=True)
    (run / "loss.csv").write_text("step,loss\n1,4.1\n2,4.0\n", encoding="utf-8")
    (run / "diagnostics.parquet").write_bytes(b"PAR1" + bytes(range(64)) + b"PAR1")
    (run / "model.safetensors").write_bytes(b"\x08\x00" + bytes(200))
    meta = seal_meta({"run": run.name, **run_record(run, ("loss.csv", "diagnostics.parquet", "model.safetensors"), 2)})
    (run / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    verify_run(run)
    return run


@pytest.mark.parametrize("gone", ["model.safetensors", "loss.csv", "diagnostics.parquet"])
def test_a_missing_artifact_of_a_finished_run_fails_verify_naming_it_and_is_counted(tmp_path, gone):
    runs = [finished_run(tmp_path / "data/sweep/runs" / name) for name in ("pre-w0-s0", "post-w0-s0")]
    assert verify_tree(tmp_path / "data") == (2, [])
    (runs[0] / gone).unlink()
    checked, failures = verify_tree(tmp_path / "data")
    assert checked == 2, "a run whose artifact is gone is still counted"
    assert len(failures) == 1 and failures[0].startswith(f"{runs[0]}: damaged finished run: {gone} is missing")
    if gone != "model.safetensors":
        return  # the command line once
    done = blocklab("verify", cwd=tmp_path)
    assert done.returncode == 3 and f"{gone} is missing" in done.stderr and "verified 1 of 2" in done.stdout


# ---- parameter files that would hold every reader: refused at once, naming the key or the size ------------------------


def _levels(name: str, depth: int = 9) -> list[str]:
    """YAML anchors 10 aliases wide, ``depth`` deep: 10^depth values once expanded, a few hundred bytes of text."""
    return [f"&{name}0 [a, a, a, a, a, a, a, a, a, a]"] + [
        f"&{name}{k} [" + ", ".join([f"*{name}{k - 1}"] * 10) + "]" for k in range(1, depth)]


BOMB_TOP = "".join(f"x{k}: {level}\n" for k, level in enumerate(_levels("x"))) + TINY_TEXT
BOMB_SUBJECTS = TINY_TEXT.replace("  subjects: [국어, 영어, 수학]", "  subjects: [" + ", ".join(_levels("s")) + "]")
SEEDS = TINY_TEXT.replace("  seeds: [0, 1]\n  steps: 60",
                          "  seeds: [" + ", ".join(map(str, range(200_000))) + "]\n  steps: 60")
HUGE = TINY_TEXT + ("# " + "x" * 98 + "\n") * (MAX_PARAMS_BYTES // 100 + 10)
# level k of _levels is a list of 10 of level k-1: 1 + 10 x level(k-1) values with level 0 = 11, so k + 2 ones (level 8:
# 1,111,111,111, of which 10^9 leaves); problem9.subjects holds levels 0..8 in one list: 11 + 111 + ... + 1,111,111,111 + 1
HANGING = {  # name: (text, what the one line says)
    "anchor-bomb-top-level": (BOMB_TOP, "x8: holds 1,111,111,111 values with its YAML aliases (*name) expanded; "
                                        f"allowed: at most {MAX_PARAMS_VALUES:,} values"),
    "anchor-bomb-in-subjects": (BOMB_SUBJECTS, "problem9.subjects: holds 1,234,567,900 values with its YAML aliases"),
    "200000-seeds": (SEEDS, f"sweep.seeds: holds 200,001 values; allowed: at most {MAX_PARAMS_VALUES:,} values"),
    "2-MiB-file": (HUGE, f"the file is 2.0 MiB; allowed: a parameter file of at most {MAX_PARAMS_BYTES >> 20} MiB"),
}


def test_the_hanging_inputs_are_what_they_claim():
    assert BOMB_SUBJECTS != TINY_TEXT and SEEDS != TINY_TEXT and len(HUGE.encode()) > MAX_PARAMS_BYTES
    bomb = yaml.compose(BOMB_TOP, Loader=yaml.CSafeLoader)
    x8 = next(v for k, v in bomb.value if k.value == "x8")
    assert len(x8.value) == 10 and x8.value[0] is next(v for k, v in bomb.value if k.value == "x7"), "aliases shared"


@pytest.mark.parametrize("name", list(HANGING))
def test_a_file_that_would_hang_every_reader_is_refused_naming_the_key_or_the_size(tmp_path, name):
    text, says = HANGING[name]
    (tmp_path / "params.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ParamsError) as err:
        load_params(tmp_path / "params.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'params.yaml'}: ") and says in str(err.value), str(err.value)
    if name not in ("anchor-bomb-top-level", "200000-seeds"):
        return  # the command line for two of them (a process start costs seconds)
    # the command line too, and `sweep train` (once 30-60 s): the timeout guards against a hang, it measures nothing
    done = blocklab("sweep", "train", "--params", "params.yaml", "--norm", "pre", "--warmup", "0", "--seed", "0",
                    "--out-dir", "run", cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_an_anchor_inside_itself_is_refused():
    with pytest.raises(ParamsError, match=r"a: holds an unbounded number of values \(an anchor inside itself\)"):
        from blocklab.params_file import read_params_file

        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"blocklab-recursive-{os.getpid()}.yaml"
        path.write_text("a: &a [1, *a]\n", encoding="utf-8")
        try:
            read_params_file(path)
        finally:
            path.unlink()


def test_a_long_seed_list_under_the_value_limit_is_refused_by_the_schema(tmp_path):
    (tmp_path / "p.yaml").write_text(TINY_TEXT.replace("  seeds: [0, 1]\n  steps: 60", "  seeds: ["
                                     + ", ".join(map(str, range(5000))) + "]\n  steps: 60"), encoding="utf-8")
    with pytest.raises(ParamsError, match=r"sweep\.seeds: has 5,000 entries; allowed: at most 1,000"):
        load_params(tmp_path / "p.yaml")


# ---- the key blamed is the one that drives the estimate, and the advice can be followed -----------------------------


@pytest.mark.parametrize("key,value", [("copy_task.vocab_size", 10 ** 9), ("copy_model.d_model", 2 ** 20),
                                       ("copy_model.n_layers", 10 ** 7)])
def test_the_memory_estimate_blames_the_key_that_drives_it(tmp_path, key, value):
    from blocklab.params_file import _largest_fitting, machine_memory, training_cost

    params = yaml.safe_load(TINY_TEXT)
    section, name = key.split(".")
    params[section][name] = value
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    with pytest.raises(ParamsError) as err:
        load_params(tmp_path / "p.yaml")
    message = str(err.value)
    assert message.split(": ")[1] == key, message
    assert "<= 0" not in message and "d_model <= 1 " not in message, "advice a person can follow"
    # the advice holds: the value it names fits this machine, the next one does not (the estimate's own function)
    largest = int(message.split(f"{key} <= ")[1].split(" ")[0].replace(",", ""))
    model, task = params["copy_model"], params["copy_task"]

    def cost(v):
        return training_cost({**model, name: v} if section == "copy_model" else model,
                             {**task, name: v} if section == "copy_task" else task, 1)[0]

    assert cost(largest) <= machine_memory() < cost(largest + (model["n_heads"] if name == "d_model" else 1))
    assert _largest_fitting(model, task, "task" if section == "copy_task" else "model", name, machine_memory()) == largest


# ---- the memory limit is this process's own cgroup's (the smallest up its hierarchy), and the estimate holds ----------


GIB = 1 << 30


def cgroup_tree(root: Path, version: int, limits: dict[str, str]) -> Path:
    """A cgroup file system under ``root`` (v1: the memory controller mounted at memory/, v2: one hierarchy) holding
    ``limits`` (the cgroup's path -> its limit file's text), and a /proc/self/cgroup that puts this process in the
    deepest of them, as SLURM or a systemd slice does. Returns that /proc/self/cgroup."""
    mount = root / "sys/fs/cgroup" / ("memory" if version == 1 else "")
    name = "memory.limit_in_bytes" if version == 1 else "memory.max"
    for path, text in limits.items():
        (mount / path.strip("/")).mkdir(parents=True, exist_ok=True)
        (mount / path.strip("/") / name).write_text(text + "\n")
    own = max(limits, key=len)
    proc = root / "proc/self/cgroup"
    proc.parent.mkdir(parents=True)
    proc.write_text(f"12:pids:{own}\n4:cpu,cpuacct:/\n3:memory:{own}\n1:name=systemd:/\n0::/\n" if version == 1
                    else f"0::{own}\n")
    return proc


@pytest.mark.parametrize("version", [1, 2])
def test_the_memory_limit_is_the_smallest_of_this_processs_cgroup_and_those_above_it(tmp_path, version):
    from blocklab.params_file import cgroup_memory_limit

    unlimited = "9223372036854771712" if version == 1 else "max"
    limits = {"/": unlimited, "/slurm": str(64 * GIB), "/slurm/uid_0/job_7": str(3 * GIB),
              "/slurm/uid_0/job_7/step_0": unlimited, "/other": str(GIB)}  # /other is not this process's: ignored
    proc = cgroup_tree(tmp_path, version, limits)
    root = tmp_path / "sys/fs/cgroup"
    name = "memory.limit_in_bytes" if version == 1 else "memory.max"
    found = cgroup_memory_limit(root, proc)
    assert found == (3 * GIB, root / ("memory" if version == 1 else "") / "slurm/uid_0/job_7" / name), found
    (root / ("memory" if version == 1 else "") / "slurm" / name).write_text(str(2 * GIB))  # a smaller one above it
    assert cgroup_memory_limit(root, proc)[0] == 2 * GIB
    # a container: its own cgroup at the mount's root, the path in /proc/self/cgroup absent there
    (root / ("memory" if version == 1 else "") / name).write_text(str(GIB // 2))
    proc.write_text(proc.read_text().replace("/slurm/uid_0/job_7/step_0", "/docker/0123abcd"))
    assert cgroup_memory_limit(root, proc)[0] == GIB // 2
    proc.write_text(proc.read_text().replace("/docker/0123abcd", "/"))
    (root / ("memory" if version == 1 else "") / name).write_text(unlimited)
    found = cgroup_memory_limit(root, proc)  # v1 writes "no limit" as a number above any machine's memory
    assert found is None or found[0] > 1 << 62, "no limit: the machine's memory counts"


def test_a_huge_vocabulary_is_refused_inside_a_small_cgroup_naming_the_key_the_estimate_and_the_limit(tmp_path,
                                                                                                     monkeypatch):
    """The case measured: 8,000,000 words at the tiny sizes (the logits alone ~4 GB each) inside a 3 GiB job, whose
    limit is set on the job's cgroup, not the root's."""
    from blocklab import params_file

    proc = cgroup_tree(tmp_path, 2, {"/": "max", "/system.slice": "max", "/system.slice/job.scope": str(3 * GIB)})
    monkeypatch.setattr(params_file, "CGROUP_ROOT", tmp_path / "sys/fs/cgroup")
    monkeypatch.setattr(params_file, "PROC_SELF_CGROUP", proc)
    (tmp_path / "p.yaml").write_text(TINY_TEXT.replace("  vocab_size: 64 ", "  vocab_size: 8000000 "), encoding="utf-8")
    with pytest.raises(ParamsError) as err:
        load_params(tmp_path / "p.yaml")
    message = str(err.value)
    estimate = params_file.training_cost(yaml.safe_load(TINY_TEXT)["copy_model"],
                                         {**yaml.safe_load(TINY_TEXT)["copy_task"], "vocab_size": 8_000_000}, 1)[0]
    assert estimate > 3 * GIB
    assert message.split(": ")[1] == "copy_task.vocab_size", message
    assert f"needs an estimated {estimate / GIB:.1f} GiB" in message and "this process may use 3.0 GiB" in message
    assert str(tmp_path / "sys/fs/cgroup/system.slice/job.scope/memory.max") in message, message
    (tmp_path / "p.yaml").write_text(TINY_TEXT, encoding="utf-8")
    load_params(tmp_path / "p.yaml")  # the tiny configuration fits the same cgroup


PEAK = """
import json, resource, sys, tempfile
from pathlib import Path
import psutil, torch, yaml
torch.set_num_threads(1)
import pandas, pyarrow, safetensors  # noqa: F401  imported before the baseline
from blocklab.training.sweep import train_copy_run

params = yaml.safe_load(Path(sys.argv[1]).read_text(encoding="utf-8"))
params["sweep"]["steps"] = 2
out = Path(tempfile.mkdtemp(dir=sys.argv[3]))
train_copy_run(params, "pre", 0, 0, out / "warm")  # the lazy imports and first-call buffers, at the tiny size
for section, values in json.loads(sys.argv[2]).items():
    params[section].update(values)
base = psutil.Process().memory_info().rss
train_copy_run(params, "pre", 0, 0, out / "run")  # the sweep's job: two steps, a checkpoint, its artifacts
print(json.dumps({"base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""
# measured 2026-12-07 on 2 busy cores: 200,000 words 493 MB (estimate 514), d_model 256 x 4 layers, batch 32 x 64
# tokens 238 MB (estimate 237); without the logits the first estimate was 207 MB, 2.4 x under
SIZES = {"vocabulary-bound": {"copy_task": {"vocab_size": 200_000}},
         "width-bound": {"copy_model": {"d_model": 256, "n_layers": 4}, "copy_task": {"batch_size": 32, "seq_len": 32}}}
FACTOR = 1.5  # the estimate (less its runtime allowance) and the measured peak of the job's own memory, either way


@pytest.mark.skipif(not os.environ.get("BLOCKLAB_MEMORY_PEAK"), reason=(
    "measures two training jobs' peak memory (minutes on 2 cores): BLOCKLAB_MEMORY_PEAK=1. Within the whole suite "
    "(pytest-xdist, 2 workers) it once read the vocabulary-bound job at 2,696 MB against an estimate of 514 MB, where "
    "alone it reads 493 MB: not yet explained, so it is not a pass/fail gate of `make test`"))
def test_the_memory_estimate_is_within_its_factor_of_a_measured_training_jobs_peak(tmp_path):
    """Two steps of the sweep's own job (checkpoint and artifacts written) in a fresh process at two sizes, one where
    the logits dominate: the peak resident memory it added is within FACTOR of the estimate less its runtime allowance,
    and under the whole estimate (the check refuses nothing that runs)."""
    from blocklab.params_file import RUNTIME_BYTES, training_cost

    tiny = yaml.safe_load(TINY_TEXT)
    started = {name: subprocess.Popen([sys.executable, "-c", PEAK, str(TINY), json.dumps(size), str(tmp_path)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, size in SIZES.items()}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        measured = json.loads(out.strip().splitlines()[-1])
        size = SIZES[name]
        estimate = training_cost({**tiny["copy_model"], **size.get("copy_model", {})},
                                 {**tiny["copy_task"], **size.get("copy_task", {})}, 1)[0]
        added = measured["peak"] - measured["base"]
        assert 1 / FACTOR <= (estimate - RUNTIME_BYTES) / added <= FACTOR, (name, estimate - RUNTIME_BYTES, added)
        assert measured["peak"] <= estimate, (name, measured, estimate)


# ---- a write over the process's file-size limit (EFBIG) names the file ------------------------------------------------


def test_a_write_over_the_file_size_limit_names_the_file_and_the_limit(tmp_path):
    """Under `ulimit -f` (a batch job's limit), a write that would exceed it said only "[Errno 27] File too large"."""
    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
              "from blocklab.io import write_bytes\n"
              "write_bytes(bytes(1 << 20), sys.argv[1])\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "big.bin")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "OutputError" in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert f"cannot write {tmp_path / 'big.bin'}: the file would exceed this process's file-size limit (64.0 KiB; " \
        "`ulimit -f`" in line and "nothing was written under that name" in line, line
    assert not list(tmp_path.iterdir()), "no temporary file left"


# ---- a run's command typed by hand, interrupted: the same command resumes it -------------------------------------------


INTERRUPT_AT_3 = ("import os, signal, sys, runpy; import blocklab.training.train as t\n"
                  "made = t._make_step\n"
                  "def make(*a, **k):\n"
                  "    step = made(*a, **k)\n"
                  "    def once(batch, number=0):\n"
                  "        loss = step(batch, number)\n"
                  "        if number == 3: os.kill(os.getpid(), signal.SIGINT)\n"
                  "        return loss\n"
                  "    return once\n"
                  "t._make_step = make\n"
                  "sys.argv = ['blocklab'] + sys.argv[1:]; runpy.run_module('blocklab.cli', run_name='__main__')\n")


def test_sweep_train_typed_by_hand_and_interrupted_names_itself_as_the_command_that_resumes(tmp_path):
    (tmp_path / "params.yaml").write_text(TINY_TEXT, encoding="utf-8")
    command = ["sweep", "train", "--params", "params.yaml", "--norm", "pre", "--warmup", "0", "--seed", "0",
               "--out-dir", "run"]
    env = {k: v for k, v in os.environ.items() if k not in ("BLOCKLAB_RESUME", "BLOCKLAB_INTERRUPT_SAID_BY")}
    done = subprocess.run([sys.executable, "-c", INTERRUPT_AT_3, *command], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300)
    line = next((x for x in done.stderr.splitlines() if "interrupted;" in x), done.stderr[-3000:])
    assert "its checkpoint at step 3 of 60 is kept" in line, line
    assert line.endswith(f"resume with the same command (`blocklab {' '.join(command)}`, from {tmp_path})"), line
    assert "snakemake" not in line and "dvc repro" not in line


# ---- a run refused by a live one: told to wait, not to unlock -----------------------------------------------------------


HOLD = "from blocklab.pipeline import hold_run_lock; [print(line, flush=True) for line in hold_run_lock(log=print)]"


def test_a_second_run_is_told_which_run_lives_and_to_wait_and_the_locks_go_once_it_is_dead(tmp_path):
    first = subprocess.Popen([sys.executable, "-c", HOLD + "; print('held', flush=True); import time; time.sleep(60)"],
                             cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    lock = tmp_path / ".snakemake" / "locks" / "0.output.lock"
    try:
        assert first.stdout.readline().strip() == "held"
        lock.parent.mkdir()
        lock.write_text("x")  # what Snakemake writes while it runs
        said = subprocess.run([sys.executable, "-c", HOLD], cwd=tmp_path, capture_output=True, text=True).stdout
        assert lock.is_file(), "a live run's locks stay"
        assert said.count("\n") == 1 and f"another run of this directory is alive (pid {first.pid}, " in said, said
        assert f"`kill {first.pid}`" in said and "do not run `snakemake --unlock` while it lives" in said
    finally:
        first.kill()
        first.wait()
    said = subprocess.run([sys.executable, "-c", HOLD], cwd=tmp_path, capture_output=True, text=True).stdout
    assert not lock.exists() and "no run of this directory is alive; removed the Snakemake locks" in said, said


# ---- the temporary file of a killed write: removed at the next start -----------------------------------------------------


def test_a_temporary_file_whose_writer_died_is_removed_at_the_next_start_however_fresh(tmp_path, monkeypatch):
    from blocklab.pipeline import hold_run_lock

    monkeypatch.chdir(tmp_path)
    script = ("import os, sys; from blocklab.io import atomic_path\n"
              "with atomic_path('figs/dynamics_collapse.png') as tmp:\n"
              "    tmp.write_bytes(b'half'); print(tmp, flush=True); os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL
    left = Path(done.stdout.strip())
    assert left.is_file() and left.name.startswith(".dynamics_collapse.png.") and left.name.endswith(".tmp.png")
    with atomic_path("figs/loss_curves.png") as live:  # a write in progress, by a live process: kept
        live.write_bytes(b"writing")
        said = []
        hold_run_lock(log=said.append)
        assert not left.exists() and live.exists()
    assert said and f"removed 1 temporary file(s) a killed run left: {left.relative_to(tmp_path)}" in said[-1], said


# ---- params.yaml edited while a pipeline runs: its jobs refuse it, the finished ones stay --------------------------------


def test_a_job_refuses_a_params_file_changed_since_the_pipeline_started(tmp_path, monkeypatch):
    from blocklab.params_file import PINNED_ENV, pin_params

    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text(TINY_TEXT, encoding="utf-8")
    monkeypatch.delenv(PINNED_ENV, raising=False)
    pin_params("params.yaml")  # what Snakemake's main process does; its jobs inherit the variable
    assert load_params("params.yaml")["sweep"]["steps"] == 60
    Path("params.yaml").write_text(TINY_TEXT.replace("  steps: 60", "  steps: 40"), encoding="utf-8")
    with pytest.raises(ParamsError, match=r"^params\.yaml: changed while the pipeline runs .* this job does not start"):
        load_params("params.yaml")
    done = blocklab("exp", "problem9", "--params", "params.yaml", "--out", "scores.csv", cwd=tmp_path)
    assert done.returncode == 2 and "changed while the pipeline runs" in done.stderr and not Path("scores.csv").exists()
    other = Path("other.yaml")  # any other parameter file is not the pipeline's
    other.write_text(TINY_TEXT, encoding="utf-8")
    assert load_params(other)["sweep"]["steps"] == 60


# ---- a read-only data/: the pipeline stops before any job, in one line -------------------------------------------------


def test_a_read_only_data_folder_stops_the_pipeline_before_any_job_in_one_line(tmp_path):
    from blocklab.io import OutputError
    from blocklab.pipeline import check_writable

    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "figs").mkdir()
    check_writable(tmp_path)  # writable: nothing said
    if os.geteuid() != 0:
        pytest.skip("a read-only mount needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(data)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with pytest.raises(OutputError) as err:
            check_writable(tmp_path)
        script = "from blocklab.pipeline import check_writable, in_one_line; in_one_line(check_writable)"
        said = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    finally:
        subprocess.run(["umount", str(data)], check=False)
    assert str(err.value) == (f"{data}/ is on a read-only filesystem, and the pipeline writes its results there; no job "
                              "was started and nothing was changed; make it writable and run the same command again")
    assert said.returncode == 1 and said.stderr.count("\n") == 1
    assert said.stderr.startswith("blocklab: error: data/ is on a read-only filesystem"), said.stderr


def test_a_hanging_parameter_file_is_refused_before_torch_is_imported(tmp_path):
    """The command line refuses a parameter file that would hang its readers before it imports the command's module:
    torch (seconds to import) is never loaded, so the refusal takes the time of reading the file's first nodes."""
    import subprocess
    import sys

    (tmp_path / "params.yaml").write_text(BOMB_TOP, encoding="utf-8")
    code = ("import sys; from blocklab.cli import main; rc = main(['sweep', 'train', '--params', 'params.yaml', "
            "'--norm', 'pre', '--warmup', '0', '--seed', '0', '--out-dir', 'run']); print(rc, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)
    assert "x8: holds 1,111,111,111 values" in done.stderr and done.stderr.count("\n") == 1
