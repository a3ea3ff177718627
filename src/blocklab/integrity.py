"""Finished results that prove they are whole: checksums of a run's artifacts and of a recorded snapshot, and
``blocklab verify``.

A finished run's meta.json (written last) records the size and sha256 of each artifact written before it
(``artifacts``), how many loss rows it has (``loss_steps``) and its own checksum (``meta_sha256``); a table the
pipeline writes has a ``NAME.sha256`` record beside it (``io.write_table``); a snapshot directory's
``MANIFEST.json`` (written last) records its files. Every reader that trusts a finished run, a table or a snapshot
checks it first (``verify_run``, ``io.read_table``, ``verify_snapshot``): a damaged one raises ``DamagedArtifact``, one
line that names it, says what differs and how to repair it. A meta.json without its records is damage, never taken
for an old run; runs finished before meta.json carried its own checksum are sealed once by ``blocklab verify --seal``
after the checks their content allows. Snapshots recorded before manifests existed get one from ``blocklab verify
--record``. Bare ``blocklab verify`` checks what the pipeline makes: data/, and figs/, reports/ and DVC's cache
where they exist (its last line names what it checked and what was not there). ``blocklab verify --dvc-cache``
checks DVC's cache objects too, and ``--record-dvc`` records the checked outputs in dvc.lock (the Snakefile's last
step).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import pandas as pd

from .io import RECORD_SUFFIX, DamagedArtifact, atomic_path, check_table, read_json, write_json

MANIFEST = "MANIFEST.json"
RUN_ARTIFACTS = ("loss.csv", "diagnostics.parquet", "model.safetensors")  # what write_run writes before meta.json
WRITING = "writing"  # a manifest's status while its snapshot is being rewritten: a kill leaves it, readers refuse it


def file_record(path: Path) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": Path(path).stat().st_size, "sha256": digest.hexdigest()}


def _differences(directory: Path, recorded: dict) -> list[str]:
    found = []
    for name, want in recorded.items():
        path = directory / name
        if not path.is_file():
            found.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        if size != want["bytes"]:
            found.append(f"{name} has {size} bytes, {want['bytes']} recorded")
        elif file_record(path)["sha256"] != want["sha256"]:
            found.append(f"{name} has another sha256 than recorded (same size: edited or bit-flipped)")
    return found


# ---- finished runs ---------------------------------------------------------------------------------------------------


def run_fix(run_dir: Path) -> str:
    return (f"to repair, rerun the pipeline (`snakemake --cores N` sets a damaged run's meta.json aside and trains "
            f"that run only, again), or delete the run (`rm -r {run_dir}`) and rerun it, or restore the good copy with "
            f"`dvc checkout` where DVC holds it")


def expected_loss_steps(meta: dict) -> int | None:
    """How many rows the run's loss.csv has (steps 1..N): recorded by runs since the checksums; for older runs
    the step it stopped or diverged at, else its training budget; None where meta.json says neither."""
    if meta.get("loss_steps") is not None:
        return int(meta["loss_steps"])
    if meta.get("stopped_step"):
        return int(meta["stopped_step"])
    if meta.get("diverged_step"):
        return int(meta["diverged_step"]) - 1
    for section in ("sweep", "reverse_copy"):
        if isinstance(meta.get(section), dict) and meta[section].get("steps") is not None:
            return int(meta[section]["steps"])
    return None


def run_record(run_dir: Path, names, loss_steps: int) -> dict:
    """What meta.json records of a run's artifacts ``names``: their sizes and sha256, and its loss table's rows."""
    return {"loss_steps": loss_steps, "artifacts": {name: file_record(Path(run_dir) / name) for name in names}}


# meta.json carries its own checksum: the sha256 of its content without that key, as canonical JSON (sorted keys, no
# spaces). A flipped bit anywhere in it (a value, a key such as "artifacts") no longer matches.
META_SEAL = "meta_sha256"


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def meta_digest(meta: dict) -> str:
    return hashlib.sha256(_canonical({k: v for k, v in meta.items() if k != META_SEAL}).encode("utf-8")).hexdigest()


def seal_meta(meta: dict) -> dict:
    """``meta`` as it will read back from JSON, with its own checksum (``META_SEAL``) added."""
    plain = json.loads(_canonical(meta))
    plain.pop(META_SEAL, None)
    return {**plain, META_SEAL: meta_digest(plain)}


def _meta_problems(run_dir: Path) -> tuple[dict | None, list[str]]:
    """(meta.json's content, what is wrong with it): not UTF-8, not JSON, not its own checksum, a key missing."""
    try:
        raw = (run_dir / "meta.json").read_bytes()
    except FileNotFoundError:
        return None, ["meta.json is missing"]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, [f"meta.json is not UTF-8 text (byte {raw[err.start:err.start + 1]!r} at offset {err.start})"]
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        return None, [f"meta.json is not valid JSON ({err})"]
    if not isinstance(meta, dict):
        return None, [f"meta.json holds a {type(meta).__name__}, not an object"]
    if META_SEAL not in meta:
        return meta, [f"meta.json has no {META_SEAL} (its own checksum): damaged, or written before meta.json "
                      f"recorded one (then `blocklab verify --seal {run_dir}` checks its artifacts and records it)"]
    if meta[META_SEAL] != meta_digest(meta):
        return meta, [f"meta.json differs from its own checksum {META_SEAL} (edited or bit-flipped)"]
    missing = [key for key in ("artifacts", "loss_steps") if key not in meta]
    if missing or not isinstance(meta["artifacts"], dict):
        return meta, [f"meta.json lacks {', '.join(missing) or 'a valid artifacts record'}"]
    return meta, []


def verify_run(run_dir: str | Path) -> dict:
    """The meta.json of a finished run, after checking it against its own checksum and its artifacts against it;
    ``DamagedArtifact`` otherwise (a missing key is damage too, never taken for an old run)."""
    run_dir = Path(run_dir)
    meta, problems = _meta_problems(run_dir)
    if not problems:
        problems = _differences(run_dir, meta["artifacts"])
    if not problems:
        problems = _loss_problems(run_dir / "loss.csv", expected_loss_steps(meta))
    if problems:
        raise DamagedArtifact(f"{run_dir}: damaged finished run: {'; '.join(problems)}; {run_fix(run_dir)}")
    return meta


def seal_run(run_dir: str | Path) -> str:
    """Give a run finished before meta.json carried its own checksum that checksum, after the checks its content
    allows (its recorded artifacts, or for still older runs its loss table against the steps it trained, whose
    artifacts are recorded now). Returns one line saying what was done."""
    run_dir = Path(run_dir)
    meta, problems = _meta_problems(run_dir)
    if meta is None or (problems and META_SEAL in meta):
        raise DamagedArtifact(f"{run_dir}: damaged finished run: {'; '.join(problems)}; {run_fix(run_dir)}")
    if not problems:
        return f"{run_dir}: already sealed"
    if isinstance(meta.get("artifacts"), dict):
        problems = _differences(run_dir, meta["artifacts"])
    else:
        names = [n for n in RUN_ARTIFACTS if (run_dir / n).is_file()]
        problems = [] if "loss.csv" in names else ["loss.csv is missing"]
        steps = expected_loss_steps(meta)
        if steps is None and not problems:
            steps = len(pd.read_csv(run_dir / "loss.csv"))
        meta = {**meta, **run_record(run_dir, names, steps or 0)}
    problems = problems or _loss_problems(run_dir / "loss.csv", expected_loss_steps(meta))
    if problems:
        raise DamagedArtifact(f"{run_dir}: damaged finished run: {'; '.join(problems)}; {run_fix(run_dir)}")
    write_json(seal_meta(meta), run_dir / "meta.json")
    return f"{run_dir}: checked and sealed (meta.json records its own checksum)"


def _loss_problems(path: Path, steps: int | None) -> list[str]:
    try:
        loss = pd.read_csv(path)
        got = loss["step"].tolist()
    except (ValueError, KeyError, pd.errors.ParserError, UnicodeDecodeError) as err:
        return [f"loss.csv cannot be read ({type(err).__name__})"]
    if steps is not None and got != list(range(1, steps + 1)):
        return [f"loss.csv has {len(got)} rows (steps {got[0] if got else '-'}..{got[-1] if got else '-'}), "
                f"meta.json says the run trained steps 1..{steps}"]
    return []


def read_run(run_dir: str | Path) -> tuple[dict, pd.DataFrame]:
    """A verified finished run's meta.json and loss table."""
    meta = verify_run(run_dir)
    return meta, pd.read_csv(Path(run_dir) / "loss.csv")


# ---- recorded snapshots ----------------------------------------------------------------------------------------------


def _snapshot_files(directory: Path) -> list[str]:
    """The files a manifest covers: every file under ``directory`` except the manifest, hidden files and prose (.md)."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() and p.name != MANIFEST and p.suffix != ".md"
                  and not any(part.startswith(".") for part in p.relative_to(directory).parts))


def _records(directory: Path) -> tuple[dict, dict]:
    """(the records a snapshot write started from, those of the files it wrote): a complete manifest's files and
    nothing written; after a killed write, what its manifest kept of both."""
    try:
        manifest = read_json(directory / MANIFEST)
    except (OSError, json.JSONDecodeError):
        return {}, {}
    if manifest.get("status") == WRITING:
        return manifest.get("previous", {}), manifest.get("written", {})
    return (manifest.get("files", {}) if manifest.get("status") == "complete" else {}), {}


def begin_snapshot(directory: str | Path) -> None:
    """Mark ``directory`` as being written: a process killed before ``record_snapshot`` leaves a snapshot that every
    reader refuses (no mix of old and new files is ever read). The manifest keeps the records it starts from
    (``previous``; after a killed write, each file's last record) and ``snapshot_file`` adds each file's new record
    before the file takes its place, so that a redo can check every file the kill left (``verify_unfinished``)."""
    directory = Path(directory)
    previous, written = _records(directory)
    write_json({"status": WRITING, "previous": {**previous, **written}, "written": {}}, directory / MANIFEST)


@contextlib.contextmanager
def snapshot_file(directory: str | Path, name: str):
    """Write one file of a snapshot being written (``begin_snapshot``): yields a temporary path; its record joins the
    manifest's ``written`` before it is renamed into place, so a kill at any point leaves every file either as its
    last record or as its new one."""
    directory = Path(directory)
    with atomic_path(directory / name) as tmp:
        yield tmp
        manifest = read_json(directory / MANIFEST)
        manifest.setdefault("written", {})[name] = file_record(tmp)
        write_json(manifest, directory / MANIFEST)


def verify_unfinished(directory: str | Path) -> None:
    """Before a killed snapshot write is redone from the files it left: each file must match its record from before
    that write or the one that write gave it; ``DamagedArtifact`` otherwise (damaged or edited since)."""
    directory = Path(directory)
    previous, written = _records(directory)
    problems = []
    for name in _snapshot_files(directory):
        records = [r for r in (written.get(name), previous.get(name)) if r is not None]
        if not records:
            problems.append(f"{name} has no record")
        elif all(_differences(directory, {name: r}) for r in records):
            problems.append(_differences(directory, {name: records[0]})[0])
    if problems:
        raise DamagedArtifact(f"{directory}: a killed write left files unlike any record: {'; '.join(problems)}; "
                              f"{snapshot_fix(directory)}")


def interrupted(directory: str | Path) -> bool:
    """Whether ``directory``'s last snapshot write was killed before it finished (its manifest says "writing")."""
    try:
        return read_json(Path(directory) / MANIFEST).get("status") == WRITING
    except (OSError, json.JSONDecodeError):
        return False


def record_snapshot(directory: str | Path) -> dict:
    """Write ``directory``'s MANIFEST.json (last): the size and sha256 of every file it covers."""
    directory = Path(directory)
    manifest = {"status": "complete", "files": {name: file_record(directory / name) for name in _snapshot_files(directory)}}
    write_json(manifest, directory / MANIFEST)
    return manifest


def snapshot_fix(directory: Path) -> str:
    return (f"to repair, restore it (`git checkout -- {directory}` for a snapshot in git, `dvc checkout` for one DVC "
            f"holds) or write it again with its snapshot command")


def verify_snapshot(directory: str | Path) -> None:
    """Check a recorded snapshot against its manifest; ``DamagedArtifact`` otherwise, and for a snapshot without one:
    its losses alone cannot tell an edited or truncated file from a complete one (runs.csv does not say how many steps
    a run had), so it is refused until `blocklab verify --record` has checked what it can and recorded its checksums."""
    directory = Path(directory)
    manifest_file = directory / MANIFEST
    if manifest_file.is_file():
        try:
            manifest = read_json(manifest_file)
        except json.JSONDecodeError:
            manifest = {"status": "unreadable"}
        if manifest.get("status") != "complete" or not isinstance(manifest.get("files"), dict):
            raise DamagedArtifact(f"{directory}: incomplete snapshot: its writing was interrupted ({MANIFEST} says "
                                  f"{manifest.get('status')!r}); {snapshot_fix(directory)}")
        problems = _differences(directory, manifest["files"])
        extra = sorted(set(_snapshot_files(directory)) - set(manifest["files"]))
        problems += [f"{name} is not in {MANIFEST}" for name in extra]
    else:
        raise DamagedArtifact(f"{directory}: no {MANIFEST}: an unrecorded snapshot cannot be told from a damaged one; "
                              f"`blocklab verify --record {directory}` checks its losses against its runs and records "
                              f"its checksums, or restore it (`git checkout -- {directory}`)")
    if problems:
        raise DamagedArtifact(f"{directory}: damaged snapshot: {'; '.join(problems)}; {snapshot_fix(directory)}")


def _snapshot_loss_problems(directory: Path) -> list[str]:
    """An older snapshot's runs.csv and losses.csv: every run's steps run 1..N, N its stop or divergence step where
    runs.csv says one."""
    if not (directory / "runs.csv").is_file() or not (directory / "losses.csv").is_file():
        return []
    try:
        runs, losses = pd.read_csv(directory / "runs.csv"), pd.read_csv(directory / "losses.csv")
    except (ValueError, KeyError, pd.errors.ParserError, UnicodeDecodeError) as err:
        return [f"runs.csv or losses.csv cannot be read ({type(err).__name__})"]
    keys = [k for k in ("setting", "run") if k in runs and k in losses]
    problems = []
    steps = {key: group["step"].tolist() for key, group in losses.groupby(keys)}
    for row in runs.to_dict("records"):
        key = tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]
        got = steps.get(key, [])
        end = row.get("stopped_step") if pd.notna(row.get("stopped_step", float("nan"))) else None
        if end is None and pd.notna(row.get("diverged_step", float("nan"))):
            end = int(row["diverged_step"]) - 1
        want = list(range(1, int(end) + 1)) if end is not None else list(range(1, len(got) + 1))
        if not got or got != want:
            name = "/".join(map(str, key)) if isinstance(key, tuple) else key
            problems.append(f"losses.csv has {len(got)} steps for run {name}, runs.csv says 1..{len(want)}")
    return problems


# ---- blocklab verify -------------------------------------------------------------------------------------------------


def _is_run(meta: Path) -> bool:
    """Whether a meta.json is a finished run's: its loss table beside it, or in a runs/ folder, or recording
    artifacts (a run whose loss.csv is gone is still a run, and then a damaged one)."""
    if (meta.parent / "loss.csv").is_file() or "runs" in meta.parent.parts:
        return True
    try:
        return "artifacts" in meta.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return True  # unreadable: verify_run says what is wrong with it


def _covered(root: Path) -> tuple[list[Path], set[Path]]:
    """(finished runs, recorded snapshots) under ``root``: what their own records cover."""
    if not root.is_dir():
        return [], set()
    snapshots = {p.parent for p in root.rglob(MANIFEST)}
    runs = [m.parent for m in sorted(root.rglob("meta.json")) if not any(s in m.parents for s in snapshots) and _is_run(m)]
    return runs, snapshots


def recorded_files(root: str | Path) -> list[Path]:
    """Every file under ``root`` with a checksum record beside it (``NAME.sha256``: tables, figures, their sidecars,
    the report; ``io.recorded_path``), outside finished runs and recorded snapshots, which their own records cover;
    a record whose file is gone is listed too (the file then fails its check as missing)."""
    root = Path(root)
    if not root.is_dir():
        return []
    runs, snapshots = _covered(root)
    covered = set(runs) | snapshots
    return [record.with_name(record.name[: -len(RECORD_SUFFIX)]) for record in sorted(root.rglob("*" + RECORD_SUFFIX))
            if record.parent not in runs and not any(c in record.parents for c in covered)]


def verify_tree(path: str | Path) -> tuple[int, list[str]]:
    """Verify every finished run (a directory with meta.json: all the artifacts it records must be there), file with a
    checksum record (``NAME.sha256``: tables, figures, sidecars, the report) and snapshot (a directory with a manifest,
    or the path itself when it holds nothing else, which is then refused) under ``path``: (how many were checked, the
    failures' messages)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    runs, snapshots = _covered(path)
    checks = [(verify_run, run) for run in runs] + [(check_table, table) for table in recorded_files(path)]
    if not checks and not snapshots and path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")]
        if files and not any(p.name in ("runs.csv", "losses.csv") for p in files):
            # figures or a report drawn before they had records (a snapshot has its runs' tables)
            return 1, [f"{path}: none of its {len(files)} file(s) has a checksum record (NAME.sha256): drawn before "
                       "figures and the report had one; the next `snakemake --cores N` (or `dvc repro`) draws them "
                       "again with their records"]
        snapshots = {path}  # a snapshot without a manifest: refused by verify_snapshot, naming --record
    checks += [(verify_snapshot, snapshot) for snapshot in sorted(snapshots)]
    failures = []
    for check, item in checks:
        try:
            check(item)
        except DamagedArtifact as err:
            failures.append(str(err))
    return len(checks), failures


def register(subparsers) -> None:
    p = subparsers.add_parser("verify", help="check finished runs and recorded snapshots against their checksums")
    p.add_argument("paths", nargs="*", type=Path, default=[],
                   help="data directories, run directories or snapshot directories (default: what the pipeline makes: "
                        "data, and figs, reports and DVC's cache where they exist)")
    p.add_argument("--record", action="store_true",
                   help="write the MANIFEST.json of each snapshot directory given, after checking what its content "
                        "allows (for snapshots recorded before manifests existed)")
    p.add_argument("--seal", action="store_true",
                   help="give each finished run directory given (or every run under it) the checksum of its own "
                        "meta.json, after checking its artifacts (for runs finished before meta.json recorded one)")
    p.add_argument("--dvc-cache", action="store_true",
                   help="check every object of DVC's cache (.dvc/cache) against the md5 it is named by; with "
                        "--record-dvc, a damaged object is removed and recorded again from the verified workspace copy")
    p.add_argument("--record-dvc", metavar="STAGE", default=None,
                   help="after a clean check, record the outputs in dvc.lock (`dvc commit --force STAGE`), so that "
                        "`dvc repro` and `dvc exp run` keep what Snakemake made (the Snakefile's last step); skipped "
                        "inside a DVC stage, which records its own outputs")
    p.set_defaults(func=_verify_main)


BARE = ("data", "figs", "reports")  # what the pipeline makes (the Snakefile's last step checks the same, and the cache)


def _bare_targets(args) -> str:
    """Bare `blocklab verify`: what the pipeline makes, data/ (always: its absence is said) and figs/, reports/ and
    DVC's cache where they exist; returns the words for the last line."""
    args.paths = [Path(BARE[0])] + [Path(name) for name in BARE[1:] if Path(name).is_dir()]
    cache = Path(".dvc") / "cache"
    args.dvc_cache = args.dvc_cache or cache.is_dir()
    names = [f"{path}/" for path in args.paths] + (["DVC's cache"] if args.dvc_cache else [])
    absent = [f"{name}/" for name in BARE[1:] if not Path(name).is_dir()] + ([] if args.dvc_cache else ["DVC's cache"])
    return (" in " + ", ".join(names) + (f" ({', '.join(absent)}: none here)" if absent else ""))


def _verify_main(args) -> int:
    scope = ""
    if not args.paths:  # argparse gives [] to a bare command
        if args.seal or args.record:
            args.paths = [Path(BARE[0])]
        else:
            scope = _bare_targets(args)
    if args.seal:
        for path in args.paths:
            runs = [path] if (path / "meta.json").is_file() else sorted(
                m.parent for m in path.rglob("meta.json") if (m.parent / "loss.csv").is_file())
            for run_dir in runs:
                print(seal_run(run_dir))
        return 0
    if args.record:
        for path in args.paths:
            if (path / MANIFEST).is_file():
                verify_snapshot(path)  # a manifest there: it must hold before it is rewritten
            elif problems := _snapshot_loss_problems(path):
                raise DamagedArtifact(f"{path}: damaged snapshot: {'; '.join(problems)}; {snapshot_fix(path)}")
            manifest = record_snapshot(path)
            print(f"{path}: recorded {len(manifest['files'])} file(s) in {MANIFEST}")
        return 0
    total, failures = 0, []
    for path in args.paths:
        checked, failed = verify_tree(path)
        total += checked
        failures += failed
    damaged_objects = []
    if args.dvc_cache:
        checked, damaged_objects = verify_dvc_cache()
        total += checked
        if not args.record_dvc or failures:  # repaired below from the workspace, once the workspace is verified
            failures += [f"{obj}: damaged DVC cache object (its md5 is not its name); to repair, run `blocklab verify "
                         f"--dvc-cache --record-dvc pipeline` (records it again from the verified workspace copy)"
                         for obj in damaged_objects]
            damaged_objects = []
    for obj in damaged_objects:
        Path(obj).unlink()
        print(f"{obj}: damaged DVC cache object removed; recorded again from the verified workspace below")
    for message in failures:
        print(message)
    print(f"verified {total - len(failures)} of {total} run(s), table(s), snapshot(s) and cache object(s){scope}"
          + (f"; {len(failures)} damaged (above)" if failures else ""))
    if failures:
        raise DamagedArtifact(f"{len(failures)} damaged: {failures[0]}" + (" (and more above)" if len(failures) > 1 else ""))
    if args.record_dvc:
        print(record_dvc(args.record_dvc))
    return 0


def verify_dvc_cache(root: str | Path = ".") -> tuple[int, list[str]]:
    """(how many objects were checked, the damaged ones) of DVC's local cache: each object under
    .dvc/cache/files/md5 is named by the md5 of its bytes (a directory listing's name ends in .dir)."""
    cache = Path(root) / ".dvc" / "cache" / "files" / "md5"
    checked, damaged = 0, []
    for obj in sorted(cache.rglob("*")) if cache.is_dir() else []:
        if not obj.is_file() or obj.name.endswith((".tmp", ".lock")) or obj.name.startswith("."):
            continue
        checked += 1
        digest = hashlib.md5()
        with open(obj, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        if obj.parent.name + obj.name.removesuffix(".dir") != digest.hexdigest():
            damaged.append(str(obj))
    return checked, damaged


def record_dvc(stage: str, root: str | Path = ".") -> str:
    """Record the outputs Snakemake made in dvc.lock (`dvc commit --force STAGE`): the two front doors (`snakemake`,
    `dvc repro` / `dvc exp run`) then share one state, and DVC neither deletes nor retrains what Snakemake finished.
    Inside a DVC stage (DVC_STAGE set) DVC records the outputs itself when the stage ends; outside a DVC project
    (no .dvc/) there is nothing to record. Returns one line saying what was done."""
    import os
    import subprocess

    root = Path(root)
    if os.environ.get("DVC_STAGE"):
        return f"dvc.lock: recorded by DVC itself when its stage {os.environ['DVC_STAGE']} ends"
    if not (root / ".dvc").is_dir():
        return "dvc.lock: not a DVC project (no .dvc/), nothing to record"
    import importlib.util
    import sys

    if importlib.util.find_spec("dvc") is None:
        raise OSError("dvc is not installed beside blocklab: cannot record the outputs in dvc.lock, so `dvc repro` "
                      "would run the pipeline again; install the project (`make install`) and run the same command again")
    done = subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", "--quiet", stage], cwd=root,
                          capture_output=True, text=True)
    if done.returncode:
        raise OSError(f"`dvc commit --force {stage}` failed ({done.returncode}): "
                      f"{' '.join((done.stderr or done.stdout).split())[-600:]}")
    return f"dvc.lock: recorded the outputs of stage {stage} (`dvc commit --force {stage}`)"
