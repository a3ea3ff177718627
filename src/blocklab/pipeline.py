"""What the Snakefile needs from the package: config checks, run lists, code dependencies, the figure list.

The DAG itself is defined once, in the Snakefile and workflow/rules/*.smk; dvc.yaml runs that DAG.
"""
from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path


from .params_file import ParamsError, read_params_file, validate_params
from .run_settings import Sweep

PARAMS_FILE = "params.yaml"

# Every figure the analysis notebook writes into figs/ (name -> the data it is drawn from).
FIGURES = {
    "gradnorm_at_init": ["data/gradnorm/gradnorm.csv"],
    "loss_curves": ["data/sweep/losses.csv"],
    "problem9_scores": ["data/problem9/scores.csv"],
    "problem10_residual_growth": ["data/residual_sim/curve.csv"],
    "problem11_norm_warmup": ["data/sweep/summary.csv"],
    "activation_norms": ["data/activation_norms/norms.csv"],
    "residual_ablation": ["data/activation_norms/residual_ablation.csv"],
    "reverse_copy": ["data/reverse_copy/losses.csv", "data/reverse_copy/summary.csv"],
    "param_counts": ["data/param_counts/blocks.csv"],
    "residual_growth_trained": ["data/probe/lm.csv", "data/probe/copy.csv"],
}

_SOURCE = Path(__file__).resolve().parent
# Source files whose change alters a trained model (so Snakemake retrains); figure code is not among them.
MODEL_CODE = ["model_config", "run_settings", "model/layers", "model/blocks", "model/models", "model/init", "training/tasks",
              "training/train", "training/copy_model", "training/sweep"]


def check_config(config: dict, params_file: str = PARAMS_FILE) -> dict:
    """Validate Snakemake's config and insist it equals params.yaml, which every command and DVC read."""
    # the file first, with the loader that refuses a repeated key (Snakemake's keeps the last one without a word, and
    # every job, reading the file itself, would then refuse it)
    on_disk = read_params_file(params_file)
    validate_params(on_disk, source=params_file)
    if config != on_disk:
        raise ParamsError(
            f"the Snakemake config differs from {params_file}; edit {params_file} (or use `dvc exp run -S key=value`) "
            "instead of --config/--configfile overrides, so that DVC and every command see the same parameters"
        )
    return config


def in_one_line(check, *args):
    """For the Snakefile: ``check(*args)``, a parameter error (exit status 2) or an output folder that cannot be
    written (``io.OutputError``, exit status 1) ending Snakemake with its one line, as every blocklab command (not
    Snakemake's "ParamsError in file ..." and the lines of its traceback)."""
    import sys

    from .model_config import ConfigError
    from .io import OutputError

    try:
        return check(*args)
    except (ConfigError, OutputError) as err:
        print(f"blocklab: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        sys.exit(2 if isinstance(err, ConfigError) else 1)


def check_writable(workdir: str | Path = ".") -> None:
    """``io.OutputError`` naming the first output folder (OUTPUT_DIRS) that exists and cannot be written (a read-only
    mount, no permission): the pipeline stops before any job, in one line, instead of Snakemake's "Write-protected
    output files" for one rule or a job's failure after the others ran."""
    from .io import OutputError

    for name in OUTPUT_DIRS:
        folder = Path(workdir) / name
        if not folder.is_dir():
            continue
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            cause = "is on a read-only filesystem"
        elif not os.access(folder, os.W_OK):
            cause = f"is not writable by user {os.getuid()}"
        else:
            continue
        raise OutputError(f"{folder}/ {cause}, and the pipeline writes its results there; no job was started and "
                          "nothing was changed; make it writable and run the same command again")


def package_modules(root: str | Path = _SOURCE) -> dict[str, Path]:
    """Every module of the package under ``root`` (dotted name, e.g. blocklab.figures.style -> its file)."""
    root, found = Path(root), {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(module: str, path: Path, known) -> list[tuple[str, int]]:
    """(imported blocklab module, line) for every import statement of ``module``, at any depth of its code (an import
    inside a function is a dependency too); ``from . import style`` names the module blocklab.<package>.style."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == "blocklab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "blocklab":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in known else target, node.lineno))
    return found


def code_closure(*modules: str, root: str = "src/blocklab") -> list[str]:
    """Like ``code_files``, plus every package module they import, transitively (the import statements read with
    ast): the code inputs of a rule whose output a change anywhere in that code may change (claims, report), so no
    module is left off by hand. Not for training rules: those retrain on MODEL_CODE only (an hour a run)."""
    known = package_modules(Path(root))
    name = lambda m: "blocklab." + m.replace("/", ".")  # noqa: E731
    todo = [n for m in modules for n in ([k for k in known if k.startswith(name(m) + ".")] + [name(m)]) if n in known]
    seen = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [t for t, _ in imports_of(module, known[module], known) if t in known]
        todo += [p for p in (module.rpartition(".")[0],) if p in known]  # importing a.b runs a/__init__.py first
    missing = [m for m in modules if name(m) not in known]
    if missing:
        raise ValueError(f"{', '.join(missing)}: no such module under {root}")
    return sorted(known[m].as_posix() for m in seen)


def code_files(*modules: str, root: str = "src/blocklab") -> list[str]:
    """Paths (relative to the project) of package modules, for rules whose results depend on that code; a module that is
    a package (a directory, e.g. studies/sensitivity) stands for every .py file in it."""
    paths = []
    for m in modules:
        package = Path(root) / m
        paths += sorted(str(p) for p in package.glob("*.py")) if package.is_dir() else [f"{root}/{m}.py"]
    return paths


def sweep_batched(config: dict) -> bool:
    """Whether the DAG trains each norm position's sweep runs as one batched job (``sweep.batched``; auto: on CUDA).

    Decided where Snakemake plans the DAG; torch is imported (to look for CUDA) only when the setting is auto and the
    device may be CUDA. On a cluster whose submit host has no GPU, set ``sweep.batched: true``.
    """
    setting = Sweep.from_params(config).batched
    if setting != "auto":
        return bool(setting)
    if config["device"] == "cpu":
        return False
    from .runtime import resolve_device

    return resolve_device(config["device"]).type == "cuda"


def sweep_group_files(config: dict, name: str) -> list[str]:
    """One file of every run of a norm position (``{norm}`` left as a wildcard): a batched job's outputs."""
    sweep = Sweep.from_params(config)
    return [f"data/sweep/runs/{{norm}}-w{warmup}-s{seed}/{name}" for warmup in sweep.warmups for seed in sweep.seeds]


# Keys added after runs were cached, with the value every earlier run had: left out of the identity at that value, so
# adding the key does not retrain finished runs, while any other value (e.g. sweep.precision: bf16) is part of it.
IDENTITY_DEFAULTS = {"precision": "fp32"}


def training_settings(section: dict, *loop_keys: str) -> dict:
    """The part of a section that decides a run's numbers: not the lists of runs to make, nor execution settings
    (checkpoint interval, torch.compile, device), which change speed, not results beyond float rounding, nor a key of
    ``IDENTITY_DEFAULTS`` at its old implicit value."""
    return {k: v for k, v in section.items()
            if k not in loop_keys and not (k in IDENTITY_DEFAULTS and v == IDENTITY_DEFAULTS[k])}


# ---- on a restart, runs with a checkpoint first ----------------------------------------------------------------------
# Snakemake starts the ready jobs of highest priority first. A run killed halfway holds a checkpoint (hours of
# training, perhaps): it resumes before any fresh run starts, so that a restart finishes what was under way instead
# of leaving it waiting behind the runs not yet begun. The training rules' `priority:` is this function of the job's
# wildcards, evaluated when the DAG is planned, so it sees the checkpoints on disk at that moment.
RESUME_PRIORITY = 100  # above every rule's own priority (the probe's 10)


def resume_first(*checkpoints: str):
    """A Snakemake ``priority:`` for a training rule: ``RESUME_PRIORITY`` when one of ``checkpoints`` (patterns in
    the rule's wildcards, e.g. ``data/sweep/runs/{norm}-w{warmup}-s{seed}/checkpoint.pt``; a batched job names all
    its runs') is on disk, else 0."""

    def priority(wildcards) -> int:
        values = dict(wildcards.items()) if hasattr(wildcards, "items") else dict(wildcards)
        return RESUME_PRIORITY if any(Path(c.format(**values)).is_file() for c in checkpoints) else 0

    return priority


# ---- stale Snakemake locks after a hard kill --------------------------------------------------------------------------
# Snakemake marks a running directory with files in .snakemake/locks/ and removes them when it ends; a SIGKILL (power
# loss, OOM killer, closed laptop) leaves them behind, and every later run refuses until `snakemake --unlock`. A lock
# file cannot tell a dead run from a live one, but an flock can: the kernel releases it when its holder dies, however it
# dies. So every main Snakemake process of this project holds a *shared* flock on RUN_LOCK for its whole life, taken
# while the Snakefile is parsed, which is before Snakemake checks or writes its own locks. A process that gets the
# flock *exclusively* therefore knows that no Snakemake process of this directory is alive, and that whatever is in
# .snakemake/locks/ is stale. If it cannot, another run is live: the locks stay, and Snakemake refuses (or, for
# targets that do not overlap, runs) exactly as it would without this.
RUN_LOCK = ".snakemake/blocklab-run.lock"
OUTPUT_DIRS = ("data", "figs", "reports", "logs")  # where the pipeline writes (dvc.yaml's outs, and logs/)
_held_run_locks: list = []  # the open lock files; never closed: the kernel releases them when the process ends
_alone: list = []  # [True] once hold_run_lock found no other run of the directory alive


RUN_OWNERS = "blocklab-run.owners"  # beside RUN_LOCK: one JSON line a run that held it (pid, host, start, command)


def _this_run() -> dict:
    import socket
    import sys
    import time

    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200]}


def live_run_line(owners: str | Path) -> str:
    """One line for a run that finds another run of its directory alive (it holds RUN_LOCK): which one, from
    RUN_OWNERS, checked alive, and what to do: wait, or stop it, and `--unlock` only once it is dead."""
    import socket

    alive = []
    try:
        lines = Path(owners).read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            run = json.loads(line)
            if run.get("host") != socket.gethostname() or run.get("pid") == os.getpid():
                continue
            os.kill(int(run["pid"]), 0)
        except (ValueError, KeyError, TypeError, ProcessLookupError):
            continue
        except PermissionError:
            pass  # alive, another user's
        alive.append(run)
    who = ("; ".join(f"pid {r['pid']}, `{r['command']}` since {r['since']}" for r in alive)
           if alive else "a process of this directory holds " + RUN_LOCK)
    return (f"blocklab: another run of this directory is alive ({who}): if Snakemake refuses to start below "
            f"(\"Directory cannot be locked\"), wait for that run to finish, or stop it (Ctrl-C in its terminal, or "
            f"`kill {' '.join(str(r['pid']) for r in alive) or 'PID'}`) and start again; do not run `snakemake --unlock` "
            "while it lives (a run that died holds no lock, and the next start removes what it left by itself)")


def hold_run_lock(workdir: str | Path = ".", log=None) -> list[str]:
    """Join the live runs of ``workdir`` (shared flock on RUN_LOCK for this process's life); if there are none,
    remove the Snakemake locks a killed run left behind first. Returns the lock files removed.

    Called from the Snakefile in Snakemake's main process only (``workflow.is_main_process``): the jobs it starts,
    local or on a cluster, never parse the Snakefile in that mode and never write directory locks.
    """
    import fcntl

    dot = Path(workdir) / ".snakemake"
    dot.mkdir(exist_ok=True)
    handle = open(dot / Path(RUN_LOCK).name, "a+")  # Python opens it close-on-exec: jobs do not inherit the lock
    removed = []
    owners = dot / RUN_OWNERS
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another run of this directory is alive: its locks are real
        if log is not None:
            log(live_run_line(owners))
    except OSError as error:  # a file system without flock (some network mounts): cannot tell, so touch nothing
        handle.close()
        if log is not None:
            log(f"blocklab: cannot flock {RUN_LOCK} ({error}); after a hard kill, run `snakemake --unlock` once")
        return removed
    else:
        for stale in sorted((dot / "locks").glob("*.lock")):
            stale.unlink(missing_ok=True)
            removed.append(str(stale))
        # and the temporary files of writes it was killed in (a file being renamed into place, a figure, the report)
        from .io import remove_stale_temps

        temps = remove_stale_temps(*(Path(workdir) / name for name in OUTPUT_DIRS))
        if temps and log is not None:
            log(f"blocklab: removed {len(temps)} temporary file(s) a killed run left: {', '.join(temps)}")
        _alone.append(True)
        owners.unlink(missing_ok=True)  # the runs it names are all dead
    # Shared from here on (waits only while another starting run holds it exclusively for its few-ms cleanup).
    fcntl.flock(handle, fcntl.LOCK_SH)
    _held_run_locks.append(handle)
    with open(owners, "a", encoding="utf-8") as listed:  # who holds it, for a run refused meanwhile (live_run_line)
        listed.write(json.dumps(_this_run()) + "\n")
    if removed and log is not None:
        log(f"blocklab: no run of this directory is alive; removed the Snakemake locks a killed run left: {', '.join(removed)}")
    return removed


# ---- Ctrl-C: one line, not Snakemake's tracebacks ------------------------------------------------------------------------
# Ctrl-C reaches every process of the terminal's foreground group: make, Snakemake and each training job. The jobs
# finish the step under way, write its checkpoint and exit 130 (blocklab.training.train); Snakemake would then log
# each of them as a failed job with its traceback, and make add "Error 1". Here Snakemake's main process, on the first
# SIGINT, silences its own log and stops as Snakemake does (it waits for its jobs), and at exit says in one line what
# is kept and the command that resumes. The jobs of its process group leave the saying to it (INTERRUPT_ENV); their
# own line goes to their train.log. A second Ctrl-C stops at once (the last checkpoints stay).
INTERRUPT_ENV = "BLOCKLAB_INTERRUPT_SAID_BY"
INTERRUPTED_LINE = re.compile(r"interrupted; its checkpoint at step (\d+) of (\d+) is kept")
RESUME = "`make run` (or `snakemake --cores N`)"
# Under `dvc repro` (DVC sets DVC_STAGE in its stage's environment) the same command resumes it; DVC then adds a line of
# its own ("ERROR: failed to reproduce 'pipeline'"): the stage did not finish, so DVC records nothing of it.
RESUME_DVC = "`dvc repro` (DVC's ERROR line next says only that the stage did not finish: dvc.lock is unchanged)"


def say_interrupt_in_one_line(root: str | Path = ".", stream=None) -> None:
    """Called from the Snakefile in Snakemake's main process: Ctrl-C ends in one line (``kept_line``), exit status 1
    from Snakemake (make: 130, see the Makefile)."""
    import atexit
    import logging
    import signal
    import sys

    os.environ[INTERRUPT_ENV] = str(os.getpgrp())  # inherited by the jobs: "the main process says it"
    interrupted = []

    def on_sigint(signum, frame):
        if not interrupted:
            interrupted.append(True)
            for name in ("snakemake", "snakemake.logging"):
                logging.getLogger(name).disabled = True
        raise KeyboardInterrupt

    def at_exit():
        if interrupted:
            print(kept_line(root), file=stream or sys.stderr, flush=True)

    signal.signal(signal.SIGINT, on_sigint)
    atexit.register(at_exit)


def kept_line(root: str | Path = ".") -> str:
    """One line: the finished runs and the checkpoints under ROOT/data (each with the step its last interrupt kept,
    from its train.log), and the command that resumes (``BLOCKLAB_RESUME`` where `blocklab smoke` set it)."""
    data = Path(root) / "data"
    finished = sum(1 for _ in data.glob("**/runs/**/meta.json"))
    kept = []
    for checkpoint in sorted(data.glob("**/runs/**/checkpoint.pt")):
        run, log = checkpoint.parent, checkpoint.parent / "train.log"
        found = INTERRUPTED_LINE.findall(log.read_text(encoding="utf-8", errors="replace")) if log.is_file() else []
        name = run.relative_to(root).as_posix() if run.is_relative_to(root) else str(run)
        kept.append(f"{name} at step {found[-1][0]} of {found[-1][1]}" if found else name)
    checkpoints = f"{len(kept)} checkpoint{'s' * (len(kept) != 1)}" + (f" ({', '.join(kept)})" if kept else "")
    return (f"blocklab: interrupted; kept {finished} finished run{'s' * (finished != 1)} and {checkpoints}; "
            f"resume with {os.environ.get('BLOCKLAB_RESUME') or (RESUME_DVC if os.environ.get('DVC_STAGE') else RESUME)}")


# ---- damaged finished runs: set aside, so that the same command trains them again --------------------------------------


def set_aside_damaged_runs(meta_files, dry_run: bool, log=None) -> list[str]:
    """Check every finished run among ``meta_files`` (the DAG's run targets) against its checksums; a damaged one's
    meta.json is renamed ``meta.json.damaged`` (numbered if taken), so that Snakemake, finding it missing, trains the
    run again and remakes what depends on it; its other files are overwritten by that training. In a dry run only
    say so. Returns the damaged runs' messages."""
    from .integrity import META_SEAL, DamagedArtifact, verify_run

    found, unsealed = [], []
    for meta in map(Path, meta_files):
        if not meta.is_file():
            continue
        try:
            verify_run(meta.parent)
        except DamagedArtifact as err:
            if f"meta.json has no {META_SEAL}" in str(err):
                unsealed.append(str(meta.parent))  # hours of training, likely whole: never set aside unasked
                continue
            found.append(str(err))
            if dry_run:
                if log is not None:
                    log(f"blocklab: {err} (a run without -n sets its meta.json aside and trains it again)")
                continue
            target, n = meta.with_name("meta.json.damaged"), 1
            while target.exists():
                n += 1
                target = meta.with_name(f"meta.json.damaged-{n}")
            meta.rename(target)
            if log is not None:
                log(f"blocklab: {meta.parent} is damaged ({str(err).split(': damaged finished run: ')[-1].split('; to repair')[0]});"
                    f" its meta.json is set aside as {target.name} and the run is trained again")
    if unsealed:
        raise DamagedArtifact(
            f"{len(unsealed)} finished run(s) have a meta.json without its own checksum ({META_SEAL}), e.g. "
            f"{unsealed[0]}: written before meta.json recorded one, or damaged; `blocklab verify --seal data` checks "
            "their artifacts and records it (nothing is trained again), or `rm -r` a run to train it again")
    return found


# ---- damaged figures, sidecars, report and tables: made again -----------------------------------------------------------
# Nothing in the pipeline reads a figure, its sidecar or the report again, so a flipped byte there would wait for the
# last step's `blocklab verify`, which Snakemake skips when it has nothing to do, while `dvc repro` then records the
# damaged file in dvc.lock. So the main process checks every file with a checksum record (``io.recorded_path``) under
# the output folders before the DAG is planned, and removes a damaged one with its record: the rule that made it makes
# it again (a figure's sidecar goes with its picture, the picture being the rule's output), and the last step verifies.
RECORDED_DIRS = ("data", "figs", "reports")
DRAWN_DIRS = ("figs", "reports")  # hold drawings only, each with its record: one without is drawn again


def remove_damaged_outputs(workdir: str | Path = ".", dry_run: bool = False, log=None) -> list[str]:
    """Remove every damaged recorded file (and its record) under RECORDED_DIRS of ``workdir``, outside finished runs
    and recorded snapshots (their own checks), and every drawing without a record (``unrecorded_drawings``); in a dry
    run only say so. Returns what Snakemake must make again (a sidecar's picture, the output Snakemake knows, for a
    sidecar), which the Snakefile makes targets of ``all``: Snakemake would not remake a removed intermediate table
    whose dependants exist. Only when no other run of the directory is alive (``hold_run_lock``): a live one may be
    between a file and its record."""
    from .integrity import recorded_files
    from .io import table_problem, table_record_path

    if not _alone:
        return []
    remake = []
    for root in RECORDED_DIRS:
        unrecorded = unrecorded_drawings(Path(workdir) / root)
        for path in recorded_files(Path(workdir) / root) + unrecorded:
            problem = ("unrecorded: drawn before drawings had a checksum record" if path in unrecorded else
                       (damage := table_problem(path)) and f"damaged: {damage}")
            if not problem:
                continue
            # a sidecar (NAME.json beside NAME.png) is remade with its picture, the output Snakemake knows
            picture = path.with_suffix(".png")
            doomed = [path, picture] if path.suffix == ".json" and picture.is_file() else [path]
            remake.append(Path(os.path.relpath(picture if len(doomed) == 2 else path, workdir)).as_posix())
            if log is not None:
                log(f"blocklab: {path}: {problem}; "
                    + ("a run without -n removes it to make it again" if dry_run else
                       f"removed ({', '.join(d.name for d in doomed)}) to be made again"))
            if not dry_run:
                for doomed_file in doomed:
                    doomed_file.unlink(missing_ok=True)
                    table_record_path(doomed_file).unlink(missing_ok=True)
    return sorted(set(remake))


def unrecorded_drawings(root: Path) -> list[Path]:
    """The files under a folder only drawings go to (figs/, reports/) that have no checksum record: drawn before they
    had one (they are drawn again, with it), or their record removed."""
    from .io import RECORD_SUFFIX, table_record_path

    if root.name not in DRAWN_DIRS or not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(RECORD_SUFFIX)
                  and not any(part.startswith(".") for part in p.relative_to(root).parts)
                  and not table_record_path(p).exists())


def dry_run(workflow, argv=None) -> bool:
    """Whether Snakemake was asked for a dry run (-n, --dry-run, --dryrun, -np...): while the Snakefile is parsed,
    ``workflow.dryrun`` does not say so yet."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    return bool(getattr(workflow, "dryrun", False)) or any(
        a in ("--dry-run", "--dryrun", "--dry") or (a.startswith("-") and not a.startswith("--") and "n" in a[1:])
        for a in argv)

