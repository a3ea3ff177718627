"""The fault suite: each fault that happens on shared machines and in copies between them, injected on the
tiny configuration. The pipeline either repairs the run to byte-identical results or stops with one line that names
what is damaged and how to repair it; it never computes on damaged data. docs/reproducibility.md, "Faults", has the
table these tests back."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
import torch

from blocklab.integrity import (MANIFEST, DamagedArtifact, interrupted, record_snapshot, seal_run, verify_run,
                                verify_snapshot, verify_tree)
from blocklab.io import OutputError, read_table, write_table
from blocklab.params_file import load_params
from blocklab.training.sweep import aggregate, run_state, train_copy_run
from blocklab.records import DYNAMICS, GALLERY

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
STEPS, EVERY, KILLED_AT = 12, 5, 11  # the interrupted run stops after step 11: its checkpoint is step 10's


def tiny_params() -> dict:
    params = load_params(TINY)
    params["sweep"].update(steps=STEPS, checkpoint_every=EVERY)
    return params


def tiny_yaml(checkpoint_every: int = EVERY) -> str:
    """configs/tiny.yaml at ``STEPS`` steps, for the command line (its warm-ups shortened to fit: they must)."""
    text = TINY.read_text(encoding="utf-8")  # Korean comments: never the locale's codec
    for old, new in [("  steps: 60", f"  steps: {STEPS}"), ("  checkpoint_every: 20", f"  checkpoint_every: {checkpoint_every}"),
                     ("warmups: [0, 20]", "warmups: [0, 5]"), ("    warmup: 20", "    warmup: 5"),
                     ("collapse_for: 10", "collapse_for: 3")]:
        assert old in text, old
        text = text.replace(old, new)
    return text


class Killed(Exception):
    pass


def killed_at(step: int):
    """A stop rule that kills the run after ``step`` (as SIGKILL would, but in-process: the checkpoint stays)."""
    def stop(losses):
        if len(losses) >= step:
            raise Killed
        return False
    return stop


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, and the checkpoint an interrupted one left behind (step 10)."""
    root = tmp_path_factory.mktemp("faults")
    train_copy_run(tiny_params(), "pre", 0, 0, root / "whole")
    with pytest.raises(Killed):
        train_copy_run(tiny_params(), "pre", 0, 0, root / "killed", stop_when=killed_at(KILLED_AT))
    assert torch.load(root / "killed" / "checkpoint.pt", weights_only=True)["step"] == 10
    return root


def flip_a_tensor_bit(path: Path) -> None:
    """Flip one bit in the middle of the largest record's data (a tensor): torch.load alone would not notice."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = (int.from_bytes(data[info.header_offset + o:info.header_offset + o + 2], "little")
                           for o in (26, 28))
    data[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x04
    path.write_bytes(bytes(data))


def rewrite(path: Path, change) -> None:
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


DAMAGE = {  # reason in the moved file's name -> how the checkpoint is damaged
    "unreadable": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),  # a partial copy
    "unreadable-bitflip": flip_a_tensor_bit,
    "step": lambda p: rewrite(p, lambda s: s.update(step=7)),  # says step 7, records 10 losses
    "params": lambda p: rewrite(p, lambda s: s["identity"].update(lr=3e-3)),  # another run's checkpoint
    "code": lambda p: rewrite(p, lambda s: s["identity"].update(code="0" * 16)),  # written by other code
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint_is_moved_aside_and_the_run_ends_as_an_uninterrupted_one(reference, tmp_path, damage, caplog):
    run = tmp_path / "run"
    shutil.copytree(reference / "killed", run)
    DAMAGE[damage](run / "checkpoint.pt")
    reason = damage.split("-")[0]
    assert run_state(run, STEPS)["status"] == ("not started" if reason == "unreadable" else "checkpointed")
    with caplog.at_level(logging.WARNING, logger="blocklab.train"):
        meta = train_copy_run(tiny_params(), "pre", 0, 0, run)
    moved = run / f"checkpoint.pt.corrupt-{reason}"
    assert moved.is_file() and not (run / "checkpoint.pt").exists()
    assert any(str(moved) in r.getMessage() and "starts over" in r.getMessage() for r in caplog.records), caplog.text
    assert meta["resumed_from_step"] == 0
    for name in ("loss.csv", "diagnostics.parquet"):  # every number as the uninterrupted run's, byte for byte
        assert (run / name).read_bytes() == (reference / "whole" / name).read_bytes(), name


def test_good_checkpoint_still_resumes(reference, tmp_path):
    """The other side: an intact checkpoint (the old format without an identity included) is resumed from."""
    run = tmp_path / "run"
    shutil.copytree(reference / "killed", run)
    rewrite(run / "checkpoint.pt", lambda s: s.pop("identity"))  # as written before identities were recorded
    meta = train_copy_run(tiny_params(), "pre", 0, 0, run)
    assert meta["resumed_from_step"] == 10 and not list(run.glob("checkpoint.pt.corrupt-*"))
    assert (run / "loss.csv").read_bytes() == (reference / "whole" / "loss.csv").read_bytes()


def test_sigint_writes_a_checkpoint_at_the_step_it_stopped_says_so_and_resumes_bit_identical(reference, tmp_path, capsys):
    """Ctrl-C (SIGINT; SIGTERM the same) during step 7, with checkpoints every 5 steps: step 7 finishes, its checkpoint
    is written (before: the run went back to step 5), one line says what was kept and how to resume; the resumed run
    ends byte-identical to an uninterrupted one."""
    run = tmp_path / "run"

    def ctrl_c_at_7(losses):
        if len(losses) == 7:
            os.kill(os.getpid(), signal.SIGINT)
        return False

    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        train_copy_run(tiny_params(), "pre", 0, 0, run, stop_when=ctrl_c_at_7)
    assert signal.getsignal(signal.SIGINT) is previous  # the training loop's handler is gone again
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 7
    lines = [line for line in capsys.readouterr().err.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and "checkpoint at step 7 of 12 is kept" in lines[0] and "snakemake --cores N" in lines[0]
    meta = train_copy_run(tiny_params(), "pre", 0, 0, run)
    assert meta["resumed_from_step"] == 7
    for name in ("loss.csv", "diagnostics.parquet"):
        assert (run / name).read_bytes() == (reference / "whole" / name).read_bytes(), name


def test_damaged_checkpoint_twice_keeps_both(reference, tmp_path):
    run = tmp_path / "run"
    for _ in range(2):
        shutil.copytree(reference / "killed", run, dirs_exist_ok=True)
        DAMAGE["unreadable"](run / "checkpoint.pt")
        with pytest.raises(Killed):
            train_copy_run(tiny_params(), "pre", 0, 0, run, stop_when=killed_at(1))
    assert sorted(p.name for p in run.glob("checkpoint.pt.corrupt-*")) == ["checkpoint.pt.corrupt-unreadable",
                                                                          "checkpoint.pt.corrupt-unreadable-2"]


# ---- finished runs: checksums ----------------------------------------------------------------------------------------


def test_finished_run_records_its_artifacts(reference):
    meta = verify_run(reference / "whole")
    assert meta["loss_steps"] == STEPS
    assert set(meta["artifacts"]) == {"loss.csv", "diagnostics.parquet", "model.safetensors"}
    assert meta["artifacts"]["loss.csv"]["bytes"] == (reference / "whole" / "loss.csv").stat().st_size


def _truncate_rows(path: Path):  # the second half of the rows lost, cut at a line: still a valid CSV
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: 1 + STEPS // 2]))


def _edit_a_loss(path: Path):  # one digit changed: the same size
    text = path.read_text()
    at = text.index("\n", text.index("\n") + 1) - 3
    path.write_text(text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1:])


def _truncate_bytes(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_bit(path: Path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


FINISHED_DAMAGE = [("loss.csv", _truncate_rows, "loss.csv has"), ("loss.csv", _edit_a_loss, "another sha256"),
                   ("diagnostics.parquet", _truncate_bytes, "diagnostics.parquet has"),
                   ("diagnostics.parquet", _flip_a_bit, "another sha256"),
                   ("model.safetensors", _flip_a_bit, "another sha256"), ("meta.json", _truncate_bytes, "not valid JSON")]


@pytest.mark.parametrize("name,damage,says", FINISHED_DAMAGE,
                         ids=[f"{n}-{d.__name__.strip('_')}" for n, d, _ in FINISHED_DAMAGE])
def test_damaged_finished_run_stops_the_aggregation_naming_it_and_the_fix(reference, tmp_path, name, damage, says):
    run = tmp_path / "pre-w0-s0"
    shutil.copytree(reference / "whole", run)
    damage(run / name)
    with pytest.raises(DamagedArtifact, match=says) as caught:
        aggregate([run])
    message = str(caught.value)
    assert message.startswith(f"{run}: damaged finished run") and f"rm -r {run}" in message and "\n" not in message
    assert verify_tree(tmp_path)[1] == [message]


def old_format(run: Path) -> None:
    """A finished run as written before the checksums: meta.json without artifacts, loss_steps or its own checksum."""
    meta_file = run / "meta.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    del meta["artifacts"], meta["loss_steps"], meta["meta_sha256"]
    meta_file.write_text(json.dumps(meta, indent=2), encoding="utf-8")


def test_old_run_is_refused_until_sealed_and_sealing_checks_its_loss_table(reference, tmp_path):
    """A meta.json without its records is damage until shown otherwise (a flipped bit in "artifacts" must not switch
    the checks off): refused, naming `blocklab verify --seal`, which checks the loss table first."""
    run = tmp_path / "pre-w0-s0"
    shutil.copytree(reference / "whole", run)
    old_format(run)
    with pytest.raises(DamagedArtifact, match=r"meta.json has no meta_sha256 .*blocklab verify --seal"):
        aggregate([run])
    _truncate_rows(run / "loss.csv")  # a truncated table: half the steps left, which once became the "final loss"
    with pytest.raises(DamagedArtifact, match=rf"loss.csv has 6 rows \(steps 1..6\), meta.json says the run trained "
                                              rf"steps 1..{STEPS}"):
        seal_run(run)
    shutil.copy2(reference / "whole" / "loss.csv", run / "loss.csv")
    assert "sealed" in seal_run(run)
    losses, _ = aggregate([run])
    assert len(losses) == STEPS and verify_run(run)["loss_steps"] == STEPS


def _meta_edit(old: str, new: str):
    def damage(path: Path):
        text = path.read_text(encoding="utf-8")
        assert old in text, old
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
    damage.__name__ = f"_{old.strip()}"
    return damage


def _meta_not_utf8(path: Path):
    data = path.read_bytes()
    at = data.index(b'"norm"')
    path.write_bytes(data[:at + 2] + b"\xff" + data[at + 3:])


META_DAMAGE = [  # a flipped bit in a key, a changed value, a byte that is not UTF-8
    (_meta_edit('"artifacts"', '"Artifacts"'), "differs from its own checksum"),
    (_meta_edit('"warmup": 0', '"warmup": 1'), "differs from its own checksum"),
    (_meta_edit('"meta_sha256"', '"meta_sha257"'), "has no meta_sha256"),
    (_meta_not_utf8, r"meta.json is not UTF-8 text \(byte b'\\xff' at offset \d+\)"),
]


@pytest.mark.parametrize("damage,says", META_DAMAGE, ids=[d.__name__.strip("_") for d, _ in META_DAMAGE])
def test_damaged_meta_json_is_refused_by_readers_and_verify(reference, tmp_path, damage, says):
    run = tmp_path / "data" / "pre-w0-s0"
    shutil.copytree(reference / "whole", run)
    damage(run / "meta.json")
    with pytest.raises(DamagedArtifact, match=says):
        aggregate([run])
    done = subprocess.run([sys.executable, "-m", "blocklab.cli", "verify", str(tmp_path / "data")], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert re.search(says, done.stdout) and f"rm -r {run}" in done.stdout, done.stdout


def test_edited_aggregated_table_is_refused_by_readers_and_verify(reference, tmp_path):
    """data/sweep/summary.csv with one digit changed, a parquet table with 4 bytes changed: every reader (io.read_table)
    and `blocklab verify` refuse them, naming the table and the repair (before: read as the truth)."""
    data = tmp_path / "data"
    losses, summary = aggregate([reference / "whole"])
    write_table(summary, data / "sweep" / "summary.csv")
    write_table(losses, data / "dynamics" / "diagnostics.parquet")
    assert (data / "sweep" / "summary.csv.sha256").is_file() and verify_tree(data) == (2, [])
    pd.testing.assert_frame_equal(read_table(data / "sweep" / "summary.csv"), pd.read_csv(data / "sweep" / "summary.csv"))
    _edit_a_loss(data / "sweep" / "summary.csv")
    parquet = data / "dynamics" / "diagnostics.parquet"
    raw = bytearray(parquet.read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 4] = bytes(b ^ 0xFF for b in raw[len(raw) // 2: len(raw) // 2 + 4])
    parquet.write_bytes(bytes(raw))
    for table in (data / "sweep" / "summary.csv", parquet):
        with pytest.raises(DamagedArtifact, match=rf"{table}: damaged table: {table.name} has another sha256"):
            read_table(table)
    done = subprocess.run([sys.executable, "-m", "blocklab.cli", "verify", str(data)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 3 and "verified 0 of 2" in done.stdout and "rm " in done.stdout, done.stdout + done.stderr


def test_aggregate_sweep_command_fails_with_one_line_and_status_3(reference, tmp_path):
    run = tmp_path / "pre-w0-s0"
    shutil.copytree(reference / "whole", run)
    _truncate_rows(run / "loss.csv")
    done = subprocess.run([sys.executable, "-m", "blocklab.cli", "sweep", "aggregate", "--runs", str(run), "--out-losses",
                           str(tmp_path / "l.csv"), "--out-summary", str(tmp_path / "s.csv")], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert re.match(rf"blocklab sweep aggregate: error: {run}: damaged finished run: loss.csv has \d+ bytes, \d+ recorded;",
                    done.stderr), done.stderr
    assert not (tmp_path / "l.csv").exists() and not (tmp_path / "s.csv").exists()


# ---- snapshots -------------------------------------------------------------------------------------------------------


def test_snapshot_manifest_catches_damage_and_an_interrupted_write(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    write_table(pd.DataFrame({"setting": ["a"] * 3, "run": ["r"] * 3, "step": [1, 2, 3], "loss": [4.0, 3.0, 2.0]}),
                snap / "losses.csv")
    write_table(pd.DataFrame({"setting": ["a"], "run": ["r"], "stopped_step": [3]}), snap / "runs.csv")
    # no manifest: refused, even when consistent, because a truncated or edited copy looks the same (losses.csv cut to
    # two steps and runs.csv's stop step with it would pass any check of the losses against the runs)
    with pytest.raises(DamagedArtifact, match="no MANIFEST.json.*blocklab verify --record"):
        verify_snapshot(snap)
    record_snapshot(snap)
    verify_snapshot(snap)
    _edit_a_loss(snap / "losses.csv")
    with pytest.raises(DamagedArtifact, match="losses.csv has another sha256.*git checkout"):
        verify_snapshot(snap)
    (snap / MANIFEST).write_text('{"status": "writing"}')  # what a snapshot command killed halfway leaves
    with pytest.raises(DamagedArtifact, match="incomplete snapshot: its writing was interrupted"):
        verify_snapshot(snap)


def _recorded_snapshots() -> list[str]:
    """Every snapshot params.yaml reads runs from (each study's from_snapshots), every one `blocklab docs` reads
    (records/dynamics/*), and the gallery's tables."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    return sorted({d for study in ("sensitivity", "dynamics", "inference") for d in params[study]["from_snapshots"]}
                  | {d.relative_to(ROOT).as_posix() for d in (ROOT / DYNAMICS).iterdir() if d.is_dir()}
                  | {GALLERY})


@pytest.mark.parametrize("snapshot", _recorded_snapshots())
def test_recorded_snapshots_in_git_verify(snapshot):
    assert (ROOT / snapshot / MANIFEST).is_file(), f"record it: blocklab verify --record {snapshot}"
    verify_snapshot(ROOT / snapshot)


# ---- the environment: full disk, read-only directory ------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs, where the test may mount one (root, and mount allowed), else skipped with the reason."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full filesystem needs a small tmpfs, and mounting one needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield where
    subprocess.run(["umount", str(where)], check=False)


def test_full_disk_says_so_in_one_line_keeps_the_checkpoint_and_resumes(reference, small_disk, tmp_path):
    run = small_disk / "run"
    shutil.copytree(reference / "killed", run)  # the step-10 checkpoint (about 0.6 MiB)
    # leaves about half a checkpoint free: the next one (step 11) cannot be written
    free, size = shutil.disk_usage(small_disk).free, (run / "checkpoint.pt").stat().st_size
    (small_disk / "ballast").write_bytes(b"\0" * (free - size // 2))
    cmd = [sys.executable, "-m", "blocklab.cli", "sweep", "train", "--params", str(tmp_path / "params.yaml"), "--norm", "pre",
           "--warmup", "0", "--seed", "0", "--threads", "1", "--out-dir", str(run)]
    (tmp_path / "params.yaml").write_text(tiny_yaml(checkpoint_every=1), encoding="utf-8")
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert last.startswith(f"blocklab sweep train: error: no space left on device writing {run}/checkpoint.pt (")
    assert f"free on {small_disk})" in last and "the previous checkpoint.pt is kept unchanged" in last
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 10  # the good one, intact
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")], "no temporary file left behind"
    (small_disk / "ballast").unlink()  # the cause is gone: the same command resumes and finishes
    subprocess.run(cmd, check=True, capture_output=True)
    assert (run / "loss.csv").read_bytes() == (reference / "whole" / "loss.csv").read_bytes()


def test_read_only_filesystem_says_so_in_one_line_and_the_command_works_once_writable(small_disk):
    args = [sys.executable, "-m", "blocklab.cli", "exp", "problem9", "--params", str(TINY), "--out",
            str(small_disk / "out" / "scores.csv")]
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        done = subprocess.run(args, capture_output=True, text=True)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"blocklab exp problem9: error: cannot write {small_disk}/out/scores.csv: {small_disk} is on "
                                   "a read-only filesystem; nothing was written under that name; fix that and run the "
                                   "same command again")
    assert subprocess.run(args, capture_output=True).returncode == 0 and (small_disk / "out" / "scores.csv").is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories: run as another user to test it")
def test_read_only_output_directory_says_so_in_one_line(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        done = subprocess.run([sys.executable, "-m", "blocklab.cli", "exp", "problem9", "--params", str(TINY), "--out",
                               str(out / "scores.csv")], capture_output=True, text=True)
    finally:
        out.chmod(0o755)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"blocklab exp problem9: error: cannot write {out}/scores.csv: permission denied in {out} "
                                   f"(user {os.getuid()} cannot write there); nothing was written under that name; "
                                   "fix that and run the same command again")


def test_output_errors_name_the_path_and_what_was_kept(tmp_path, monkeypatch):
    """The messages themselves, for every cause, without needing root: the write fails as the OS would fail it."""
    from blocklab import io

    target = tmp_path / "out" / "table.csv"
    io.write_json({"old": 1}, target)

    def failing(code):
        def replace(src, dst):
            raise OSError(code, os.strerror(code), src)
        return replace

    for code, says in [(errno.ENOSPC, "no space left on device writing"), (errno.EROFS, "is on a read-only filesystem"),
                       (errno.EDQUOT, "no space left on device writing")]:
        monkeypatch.setattr(io.os, "replace", failing(code))
        with pytest.raises(OutputError) as caught:
            io.write_json({"new": 2}, target)
        message = str(caught.value)
        assert says in message and str(target) in message and "the previous table.csv is kept unchanged" in message
        assert io.read_json(target) == {"old": 1} and sorted(p.name for p in target.parent.iterdir()) == ["table.csv"]
    monkeypatch.undo()
    with pytest.raises(OutputError, match="a part of .* is a file, not a directory"):
        io.write_json({}, tmp_path / "out" / "table.csv" / "x.json")


# ---- SIGKILL during an aggregation and during a snapshot ---------------------------------------------------------------


# A real SIGKILL at an exact point: the command's process kills itself at its N-th os.replace (the rename that puts a
# finished temporary file under its final name), through a sitecustomize module on its path.
KILLER = """
import os, signal
_left = int(os.environ["BLOCKLAB_KILL_AT_REPLACE"])
_replace = os.replace
def _replace_or_die(*args, **kwargs):
    global _left
    _left -= 1
    if _left == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return _replace(*args, **kwargs)
os.replace = _replace_or_die
"""


def blocklab(args: list[str], cwd: Path, kill_at: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    if kill_at is not None:
        (cwd / "killer").mkdir(exist_ok=True)
        (cwd / "killer" / "sitecustomize.py").write_text(KILLER)
        env.update(PYTHONPATH=f"{cwd / 'killer'}{os.pathsep}{env['PYTHONPATH']}", BLOCKLAB_KILL_AT_REPLACE=str(kill_at))
    return subprocess.run([sys.executable, "-m", "blocklab.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)


def finals(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")}


def test_sigkill_during_aggregation_leaves_no_half_table_and_the_rerun_is_identical(reference, tmp_path):
    shutil.copytree(reference / "whole", tmp_path / "runs" / "pre-w0-s0")
    args = ["sweep", "aggregate", "--runs", "runs/pre-w0-s0", "--out-losses", "out/losses.csv", "--out-summary",
            "out/summary.csv"]
    assert blocklab(args, tmp_path).returncode == 0
    clean = finals(tmp_path / "out")
    shutil.rmtree(tmp_path / "out")
    killed = blocklab(args, tmp_path, kill_at=3)  # losses.csv and its record are in place, summary.csv is about to be
    assert killed.returncode == -signal.SIGKILL
    assert finals(tmp_path / "out") == {name: clean[name] for name in ("losses.csv", "losses.csv.sha256")}  # never half
    assert blocklab(args, tmp_path).returncode == 0
    assert finals(tmp_path / "out") == clean


def test_sigkill_during_a_snapshot_is_refused_until_it_is_written_again(reference, tmp_path):
    from blocklab.studies.dynamics.plan import plan

    for run_dir in plan(load_params(TINY))["run_dir"]:  # every planned run finished (the same one, copied)
        shutil.copytree(reference / "whole", tmp_path / run_dir)
    args = ["dynamics", "snapshot", "--params", str(TINY), "--out", "snap"]
    assert blocklab(args, tmp_path).returncode == 0, "clean"
    clean = finals(tmp_path / "snap")
    assert set(clean) == {"runs.csv", "losses.csv", "diagnostics.parquet", MANIFEST}
    shutil.rmtree(tmp_path / "snap")
    # renames: 1 the manifest says "writing", 2 it records runs.csv's new record, 3 runs.csv takes its place, 4 the
    # record of losses.csv (killed here: runs.csv is new, losses.csv not yet there)
    killed = blocklab(args, tmp_path, kill_at=4)
    assert killed.returncode == -signal.SIGKILL
    assert set(finals(tmp_path / "snap")) == {MANIFEST, "runs.csv"}
    with pytest.raises(DamagedArtifact, match="incomplete snapshot"):
        verify_snapshot(tmp_path / "snap")
    refused = blocklab(["verify", "snap"], tmp_path)
    assert refused.returncode == 3 and "snap: incomplete snapshot: its writing was interrupted" in refused.stderr
    assert blocklab(args, tmp_path).returncode == 0, "the same command again"
    assert finals(tmp_path / "snap") == clean
    verify_snapshot(tmp_path / "snap")
    # killed after its last file, before the manifest says "complete" (rename 8): a redo reads the runs the files
    # record, so a file changed since the kill is refused, not taken into the new snapshot
    assert blocklab(args, tmp_path, kill_at=8).returncode == -signal.SIGKILL
    assert set(finals(tmp_path / "snap")) == set(clean) and interrupted(tmp_path / "snap")
    kept = (tmp_path / "snap" / "runs.csv").read_bytes()
    (tmp_path / "snap" / "runs.csv").write_bytes(kept.replace(b"post", b"pOst", 1))
    damaged = blocklab(args, tmp_path)
    assert damaged.returncode == 3 and "a killed write left files unlike any record: runs.csv" in damaged.stderr
    (tmp_path / "snap" / "runs.csv").write_bytes(kept)
    assert blocklab(args, tmp_path).returncode == 0 and finals(tmp_path / "snap") == clean


def test_the_checkpoint_identity_changes_with_the_code_that_decides_the_numbers_only(tmp_path):
    """A run may be stopped and resumed later: an edit to the reporting code keeps its checkpoints, an edit to the model does not."""
    import shutil

    from blocklab import provenance

    package = tmp_path / "blocklab"
    shutil.copytree(Path(provenance.__file__).parent, package)
    before = provenance.numbers_code_version(package)
    (package / "reporting" / "claims.py").write_text("# edited\n", encoding="utf-8")
    assert provenance.numbers_code_version(package) == before
    reverse = ("experiments/reverse_copy.py",)  # the reverse copy's identity: the same files and its own module
    reverse_before = provenance.numbers_code_version(package, extra=reverse)
    assert reverse_before != before
    module = package / "experiments" / "reverse_copy.py"
    module.write_text(module.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert provenance.numbers_code_version(package) == before  # the copy task's runs keep their checkpoints
    assert provenance.numbers_code_version(package, extra=reverse) != reverse_before
    layers = package / "model" / "layers.py"
    layers.write_text(layers.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert provenance.numbers_code_version(package) != before


def test_report_with_a_missing_input_stops_in_one_line_before_papermill(tmp_path):
    """A missing table the report draws from: one line naming it and the command that makes it, exit status 2
    (before: papermill started and ended in a 100-line traceback from inside a cell)."""
    done = blocklab(["report", "notebook", "--params", str(TINY), "--notebook", str(ROOT / "notebooks/analysis.ipynb"),
                     "--out-notebook", "r/a.ipynb", "--out-html", "r/a.html"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "data/sweep/summary.csv" in done.stderr
    assert "snakemake --cores N" in done.stderr and not (tmp_path / "r").exists()


def test_status_shows_seconds_a_step_and_eta_of_a_training_run(reference, tmp_path):
    """`blocklab status`: a run in training shows the seconds a step and the ETA of its last progress line (the
    training loop writes one at least every 10 s; before, a line every 50 steps with neither)."""
    (tmp_path / "params.yaml").write_text(TINY.read_text(encoding="utf-8"), encoding="utf-8")
    going = tmp_path / "data" / "sweep" / "runs" / "pre-w0-s1"
    going.mkdir(parents=True)
    (going / "train.log").write_text(
        "2026-12-04 21:00:00,000 blocklab.train pre-w0-s1: step 10/60 loss 4.1000 lr 1.00e-03 0.250 s/step ETA 0:00:13\n")
    done = blocklab(["status"], tmp_path)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("data/sweep/runs/pre-w0-s1"))
    assert row.split()[1:] == ["training", "10/60", "4.1", "0.250", "0:00:13"], row


def test_damaged_dvc_cache_object_is_found_by_verify(tmp_path):
    """Each object of DVC's cache is named by the md5 of its bytes: one flipped bit and `blocklab verify --dvc-cache`
    names it and the repair (before: DVC restored it silently). The repair itself (`--record-dvc`: the object removed
    and recorded again from the verified workspace, byte-identical) was checked by hand on the tiny pipeline."""
    import hashlib

    write_table(pd.DataFrame({"step": [1], "loss": [4.1]}), tmp_path / "data" / "sweep" / "summary.csv")
    objects = []
    for text in (b"step,loss\n1,4.1\n", b"[]"):
        digest = hashlib.md5(text).hexdigest()
        obj = tmp_path / ".dvc" / "cache" / "files" / "md5" / digest[:2] / digest[2:]
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(text)
        objects.append(obj)
    assert blocklab(["verify", "data", "--dvc-cache"], tmp_path).returncode == 0
    _flip_a_bit(objects[0])
    done = blocklab(["verify", "data", "--dvc-cache"], tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert f"{objects[0].relative_to(tmp_path)}: damaged DVC cache object" in done.stdout
    assert "blocklab verify --dvc-cache --record-dvc pipeline" in done.stdout and "verified 2 of 3" in done.stdout
    bare = blocklab(["verify"], tmp_path)  # the README's check: the cache too, where there is one
    assert bare.returncode == 3 and f"{objects[0].relative_to(tmp_path)}: damaged DVC cache object" in bare.stdout
    assert "verified 2 of 3 run(s), table(s), snapshot(s) and cache object(s) in data/, DVC's cache (figs/, reports/: " \
        "none here)" in bare.stdout, bare.stdout
