"""`blocklab lab`: put a block through document 000's copy-task stress test, as Snakemake jobs.

    blocklab lab deepnorm --out lab/deepnorm                      # a built-in norm position
    blocklab lab --module my_block.py:Block --out lab/mine        # your own block (imports and runs your code)
    blocklab lab --hf-config llama --profile quick --out lab/llama

Everything is checked first (the profile, the seeds, the block: built at the lab's width, read by the reviewer, one
forward through the whole stack), then ``spec.json`` is written to the output folder and ``workflow/rules/lab.smk``
trains the runs in it (``--cores``; ``--slurm`` uses profiles/slurm). Before anything trains it prints the cost, from
a few steps timed here; each run prints a progress line (s/step, ETA) to the terminal and its train.log, the lab a line
for the whole lab. A finished run is cached; a killed run resumes from its checkpoint; a changed spec retrains. Ctrl-C
saves every running job's current step, ends every job and prints the one command that resumes (exit 130). Runs from
any folder (the project's params.yaml). Exit status: 2 bad options, 3 a block that cannot be built, called or trained
on the copy task (nothing runs), 1 a failed job or another `blocklab lab` running in --out (its pid said), 130
interrupted.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from ..model_config import NORM_POSITIONS, ConfigError
from ..io import write_table

REPO = Path(__file__).resolve().parents[3]
SNAKEFILE = REPO / "workflow" / "rules" / "lab.smk"


def register(subparsers) -> None:
    if "lab" not in subparsers.choices:
        _register_front(subparsers)


def _register_front(subparsers) -> None:
    p = subparsers.add_parser("lab", help="put a block through document 000's copy-task stress test (24 blocks, no "
                              "warm-up vs warm-up, seeds): lab.csv, rates with intervals, a figure and a page",
                              description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("block", nargs="?", choices=list(NORM_POSITIONS), metavar="BLOCK",
                   help=f"a built-in norm position: one of {', '.join(NORM_POSITIONS)}")
    p.add_argument("--module", help="your block: FILE.py:Class or package.module:Class (imported and run: it is "
                   "your code); built as the reviewer builds it (`blocklab review --help`), given the stack's depth "
                   "where its constructor takes n_layers, num_layers, n_layer, num_hidden_layers or depth (another name "
                   "that looks like a depth is said, not passed); a transformers layer class "
                   "(LlamaDecoderLayer, GPT2Block) is built inside its own model from its config, as --hf-config does")
    p.add_argument("--kwargs", help="JSON of extra constructor arguments for --module")
    p.add_argument("--hf-config", help="a transformers model type (llama, qwen2, gpt2, ...): its causal LM at the copy "
                   "task's size")
    p.add_argument("--profile", default="document", choices=["document", "quick", "lr-sweep", "tiny"],
                   help="document (default: params.yaml's setup; about 36 min a run on an idle core, hours under "
                   "load), quick (about 10 min a run idle: batch 16, 400 steps, no warm-up arm), tiny (tests, seconds);"
                   " the lab prints its own estimate, from steps timed here, before anything trains")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the profile's)")
    p.add_argument("--warmups", nargs="+", type=int, help="warm-up steps compared (default: the profile's)")
    p.add_argument("--lr", type=float, help="the learning rate (default: the profile's, params.yaml's sweep.lr)")
    p.add_argument("--lr-sweep", action="store_true", help="the block's learning-rate sensitivity (Wortsman et al. "
                   "2023): the lab at each learning rate of a five-point grid, 1e-4 to 1e-2 (one folder each under "
                   "--out), then lr_sensitivity.csv and lr_sensitivity.png in --out (docs/lab.md)")
    p.add_argument("--out", required=True, type=Path, help="output folder (runs, lab.csv, rates.csv, lab.png, "
                   "README.md)")
    p.add_argument("--params", default=REPO / "params.yaml", type=Path,
                   help="the parameter file whose copy-task setup the profiles start from (default: the project's own, "
                   f"{REPO / 'params.yaml'}, from whatever folder the lab is run)")
    p.add_argument("--cores", type=int, default=2, help="Snakemake --cores (one run a core)")
    p.add_argument("--slurm", action="store_true", help="submit the runs to SLURM (profiles/slurm)")
    p.add_argument("--dry-run", action="store_true", help="check and plan only")
    p.add_argument("--retrain", action="store_true", help="train every run here, even one recorded in git at the same "
                   "setup (by default a built-in block's recorded runs are adopted: copied, not retrained)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    if getattr(args, "lr", None) is not None:  # a bad learning rate is a bad option: exit 2, before anything
        from .lrsweep import check_lr

        check_lr(args.lr)
    if getattr(args, "lr_sweep", False):
        from .lrsweep import sweep_main

        return sweep_main(args, _main)
    from .spec import check_model, make_spec, profile_setup

    from ..params_file import load_params

    if args.kwargs:
        try:
            kwargs = json.loads(args.kwargs)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--kwargs is not JSON: {err}") from None
        if not isinstance(kwargs, dict):
            raise ConfigError("--kwargs must be a JSON object")
    else:
        kwargs = {}
    if sum(bool(x) for x in (args.block, args.module, args.hf_config)) != 1:
        raise ConfigError("give exactly one block: a built-in name (one of " + ", ".join(NORM_POSITIONS) +
                          "), --module FILE.py:Class, or --hf-config MODEL_TYPE")
    profile_setup(load_params(args.params, studies=False), args.profile, args.seeds, args.warmups)  # bad options: exit 2, first
    try:
        spec = make_spec(args.params, args.profile, args.block, args.module, args.hf_config, kwargs, args.seeds,
                         args.warmups)
        if getattr(args, "lr", None) is not None:
            from .lrsweep import lr_setup

            spec.setup = lr_setup(spec.setup, args.lr)
        size = check_model(spec)
        if spec.block.kind != "builtin":  # its runs and checkpoints are keyed on its source and weights at init
            from .spec import block_digest

            spec.block.digest = block_digest(spec.block, size["weights_sha256"])
    except ConfigError as err:  # the block: built, called, read; nothing has run
        print(f"blocklab lab: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 3
    spec.read["params_path"] = str(Path(args.params).resolve())
    out = args.out.resolve()
    text = spec.to_json()
    same = (out / "spec.json").is_file() and (out / "spec.json").read_text(encoding="utf-8") == text
    # --dry-run writes nothing into --out: a folder that does not exist yet, or whose spec differs (every run would
    # train), is planned in a scratch folder, removed after
    scratch = tempfile.TemporaryDirectory(prefix="blocklab-lab-plan-") if args.dry_run and not same else None
    held = None
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        from . import launch

        held = launch.hold_folder(out)  # one lab a folder: a second says which lab holds it, before writing anything
        if isinstance(held, str):
            print(held, file=sys.stderr)
            return 1
    try:
        return _plan_and_run(args, spec, size, out, text, same, scratch)
    finally:
        if held is not None:
            held.close()


def _plan_and_run(args, spec, size, out: Path, text: str, same: bool, scratch) -> int:
    workdir = Path(scratch.name) if scratch else out
    if not same and spec.block.digest and (out / "spec.json").is_file():
        try:
            before = json.loads((out / "spec.json").read_text(encoding="utf-8"))["block"].get("digest")
        except (ValueError, KeyError, TypeError, AttributeError):
            before = None
        if before != spec.block.digest:
            print(f"blocklab lab: {spec.block.source}: its source or its weights at init differ from those of the runs"
                  f" in {out}: every run retrains from step 0 (a checkpoint of the other source is not resumed)",
                  file=sys.stderr)
    if not same and (scratch or not args.dry_run):
        from ..io import write_bytes

        write_bytes(text.encode(), workdir / "spec.json")  # rewritten only when it changed: a changed spec retrains
    from ..params_file import load_params as _load_params
    from .records import adopt

    found = [] if args.retrain else adopt(spec, _load_params(args.params, studies=False), out, dry_run=args.dry_run)
    for record in found:
        print(f"blocklab lab: run {record['run']} is recorded at this setup ({record['from']}, trained on "
              f"{record['cpu']}, commit {record['git_commit']}): {'would be adopted' if args.dry_run else 'adopted'}, "
              "not retrained (--retrain trains it here)", file=sys.stderr)
    runs = len(spec.runs())
    print(f"blocklab lab: {spec.block.label} ({size['parameters']:,} parameters), {spec.profile} profile: {runs} runs "
          f"of {spec.setup.steps} steps (warm-ups {list(spec.setup.warmups)} x seeds {list(spec.setup.seeds)}) into "
          f"{out}", file=sys.stderr)
    for key, what in (("layer_class", "built as"), ("depth", "depth-aware block"), ("final_norm_kind", "final norm"),
                      ("depth_not_passed", "note")):
        if spec.read.get(key):
            print(f"blocklab lab: {what}: {spec.read['how' if key == 'layer_class' else key]}", file=sys.stderr)
    from . import launch
    from .run import time_steps

    # what a job spends before its first step (Python, torch, blocklab): fresh Pythons started side by side as the jobs
    # are, alone on this command's side (not beside its own checks); under --lr-sweep once, for every rate
    sweep = getattr(args, "sweep_state", None)
    start_s, basis, measured_s = (sweep or {}).get("job_s"), (sweep or {}).get("job_basis"), None
    report_s, report_basis = (sweep or {}).get("report_s"), (sweep or {}).get("report_basis")
    if start_s is None:
        measured_s = launch.JobStart(launch._lanes(min(args.cores, os.cpu_count() or 1), len(spec.runs()) + 1)).seconds()
        # scaled by this machine's last finished lab, if any
        start_s, basis, report_s, report_basis = launch.calibrated(measured_s)
        if sweep is not None:
            sweep.update(job_s=start_s, job_basis=basis, report_s=report_s, report_basis=report_basis)
    timed = 3
    per_step = time_steps(spec, timed)
    load = launch.load_now()
    said, seconds = launch.estimate(spec, out, per_step, start_s, args.cores, timed, load,
                                    **({"job_basis": basis} if basis else {}), report_s=report_s,
                                    report_basis=report_basis)
    print(said, file=sys.stderr, flush=True)
    if sweep is not None:
        from .lrsweep import sweep_estimate

        # what the next rate reads its start-up from: this one's workflow, once it has ended (lrsweep.sweep_main)
        sweep["workflow"] = {"run_steps": [n for n in launch.steps_left(spec, out).values() if n],
                             "per_step": per_step, "cores": args.cores, "load": load, "report_s": report_s}
        print(sweep_estimate(sweep, seconds, start_s), file=sys.stderr, flush=True)
    snakemake = Path(sys.executable).with_name("snakemake")
    command = [str(snakemake) if snakemake.exists() else "snakemake", "--snakefile", str(SNAKEFILE), "--directory",
               str(workdir), "--cores", str(args.cores), "--config", "spec=spec.json", "--rerun-incomplete"]
    command += ["--profile", str(REPO / "profiles" / "slurm")] if args.slurm else ["--workflow-profile", "none"]
    if args.dry_run:
        command.append("--dry-run")
    elif said := launch.remove_stale_locks(out):
        print(said, file=sys.stderr)
    # the jobs call `blocklab`: this environment's, also when it is not on PATH (.venv/bin/blocklab run directly)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    planned = launch.steps_left(spec, out)
    seen = {"at": time.monotonic(), "finished": None}

    def tick():
        finished = sum(launch.finished_run(spec, out / "runs" / spec.run_name(w, s)) for w, s in spec.runs())
        if finished != seen["finished"] or time.monotonic() - seen["at"] >= launch.LAB_LINE_EVERY_S:
            seen.update(at=time.monotonic(), finished=finished)
            print(launch.lab_line(spec, out, per_step, start_s, args.cores, planned, report_s=report_s),
                  file=sys.stderr, flush=True)

    # a lab trained from its start (no run resumed, no gradient at init yet) reads its start-up back when it ends
    fresh = all(n == spec.setup.steps for n in planned.values()) and not (out / "gradnorm.csv").is_file()
    began = time.monotonic()
    try:
        code, signals = launch.run_workflow(command, workdir, env, tick if not args.dry_run else lambda: None)
    finally:
        if scratch:
            scratch.cleanup()
    trained = [n for n in planned.values() if n]
    if not code and not signals and not args.dry_run and trained and measured_s and fresh:
        # what a job's start-up really was here, read back from this workflow's real time, and the report's tail
        # (from the last run's meta.json, written last, to now): the next lab's estimate
        ends = [(out / "runs" / spec.run_name(w, s) / "meta.json") for w, s in spec.runs()]
        tail = (time.time() - max(p.stat().st_mtime for p in ends)) if all(p.is_file() for p in ends) else None
        real_job_s = launch.job_s_from(time.monotonic() - began, trained, per_step, args.cores, load, report_s=tail)
        if real_job_s > 0:
            launch.record_calibration(measured_s, real_job_s, tail)
    if signals:
        print(launch.kept_line(spec, out), file=sys.stderr, flush=True)
        return 130
    if code:
        print(f"blocklab lab: a job failed (exit {code}); finished runs are kept, checkpointed ones resume: "
              f"{launch.resume_command()}", file=sys.stderr)
        return 1
    if not args.dry_run:
        print(f"blocklab lab: {out / 'README.md'}, {out / 'lab.png'}, {out / 'lab.csv'}", file=sys.stderr)
    return 0


# --- the jobs workflow/rules/lab.smk runs ---------------------------------------------------------------------------


def register_jobs(subparsers) -> None:
    run = subparsers.add_parser("run", help="train one lab run")
    run.add_argument("--spec", required=True, type=Path)
    run.add_argument("--warmup", required=True, type=int)
    run.add_argument("--seed", required=True, type=int)
    run.add_argument("--out-dir", required=True, type=Path)
    run.add_argument("--threads", type=int, default=1)
    run.set_defaults(func=_job_run)
    grad = subparsers.add_parser("gradnorm", help="the gradient per block at init")
    grad.add_argument("--spec", required=True, type=Path)
    grad.add_argument("--out", required=True, type=Path)
    grad.set_defaults(func=_job_gradnorm)
    rep = subparsers.add_parser("report", help="lab.csv, rates.csv, lab.png, README.md from the finished runs")
    rep.add_argument("--spec", required=True, type=Path)
    rep.add_argument("--out", required=True, type=Path)
    rep.set_defaults(func=_job_report)
    one = subparsers.add_parser("run-builtin", help="train one built-in norm position at the document's setup (the "
                                "recorded runs of docs/lab; the same numbers as `blocklab lab NAME`'s run)")
    one.add_argument("--norm", required=True, choices=list(NORM_POSITIONS))
    one.add_argument("--warmup", required=True, type=int)
    one.add_argument("--seed", required=True, type=int)
    one.add_argument("--out-dir", required=True, type=Path)
    one.add_argument("--params", default="params.yaml", type=Path)
    one.set_defaults(func=_job_run_builtin)
    lr = subparsers.add_parser("lr-run", help="train one built-in block at one learning rate of the LR-sensitivity "
                               "grid (the recorded runs of records/lab/lr-sweep; `blocklab lab BLOCK --lr-sweep` "
                               "trains the same run)")
    lr.add_argument("--norm", required=True, choices=list(NORM_POSITIONS))
    lr.add_argument("--lr", required=True, type=float)
    lr.add_argument("--seed", required=True, type=int)
    lr.add_argument("--profile", default="lr-sweep", choices=["document", "quick", "lr-sweep", "tiny"])
    lr.add_argument("--out-dir", required=True, type=Path)
    lr.add_argument("--params", default="params.yaml", type=Path)
    lr.set_defaults(func=_job_lr_run)
    lrr = subparsers.add_parser("lr-record", help="record finished runs of the LR-sensitivity study in git (loss.csv, "
                                "meta.json, checked against their checksums) in records/lab/lr-sweep/runs")
    lrr.add_argument("--runs", required=True, type=Path, help="a folder of run folders (<block>-lr<lr>-w0-s<seed>)")
    lrr.set_defaults(func=_job_lr_record)
    und = subparsers.add_parser("underflow", help="the share of subnormal gradient entries in each finished run's "
                                "final weights, and a forward and backward pass's seconds with them kept and flushed "
                                "(records/lab/lr-sweep/underflow.csv)")
    und.add_argument("--runs", required=True, type=Path, help="a folder of finished run folders (model.safetensors)")
    und.add_argument("--out", required=True, type=Path, help="the CSV to write")
    und.add_argument("--repeats", type=int, default=2, help="passes timed each way; the fastest counts (default 2)")
    und.set_defaults(func=_job_underflow)
    STATUS_PAGE = "docs/lab/STATUS.md"  # a page: docs/ holds pages, records/ the data
    rec = subparsers.add_parser("record", help="record finished runs in git (loss.csv, meta.json) and write STATUS.md")
    rec.add_argument("--runs", required=True, type=Path, help="a folder of run folders (<norm>-w<warmup>-s<seed>)")
    rec.add_argument("--status", default=Path(STATUS_PAGE), type=Path,
                     help=f"the page saying where every run stands (default: {STATUS_PAGE})")
    from .records import RUNS

    rec.add_argument("--to", default=Path(RUNS).parent, type=Path,
                     help=f"the folder whose runs/ receives them (default: {Path(RUNS).parent}, where lab.records.RUNS "
                     "reads them)")
    rec.set_defaults(func=_job_record)


def _job_run_builtin(args) -> int:
    from ..params_file import load_params
    from ..runtime import set_threads
    from ..training.sweep import train_copy_run
    from .spec import params_for, profile_setup

    params = load_params(args.params, studies=False)
    setup = profile_setup(params, "document", seeds=[args.seed], warmups=[args.warmup])
    set_threads(1)
    _log_progress()
    _resume_line("scripts/train_lab_runs.sh")
    train_copy_run(params_for(params, setup), args.norm, args.warmup, args.seed, args.out_dir, "cpu")
    return 0


def _resume_line(script: str) -> None:
    """What a Ctrl-C line tells the maintainer of a recorded run (not Snakemake's resume: this job is not a rule):
    the same command resumes from the checkpoint, and so does the study's script, which skips finished runs."""
    import os

    from ..training.train import RESUME_ENV

    os.environ.setdefault(RESUME_ENV, f"the same command (or `bash {script}`, which skips finished runs)")


def _job_lr_run(args) -> int:
    from ..params_file import load_params
    from .lrsweep import train_builtin

    _log_progress()
    _resume_line("scripts/train_lab_lr_sweep.sh")
    train_builtin(load_params(args.params, studies=False), args.norm, args.lr, args.seed, args.out_dir, args.profile)
    return 0


def _job_lr_record(args) -> int:
    from .lrsweep import record

    done = record(args.runs)
    print(f"blocklab lab-job lr-record: {len(done)} finished run(s) recorded: {', '.join(done) or 'none'}",
          file=sys.stderr)
    return 0


def _job_underflow(args) -> int:
    from ..io import write_json
    from ..provenance import code_version, library_versions
    from .underflow import UNDERFLOWING, probe_runs, summary

    if args.repeats < 1:
        raise ConfigError(f"--repeats must be 1 or more, not {args.repeats}")

    table = probe_runs(args.runs, args.repeats)
    write_table(table, args.out)
    write_json({"command": f"blocklab lab-job underflow --runs {args.runs} --out {args.out} --repeats {args.repeats}",
                "code": code_version(), "libraries": library_versions(), "rows": len(table)},
               args.out.with_suffix(".json"))
    said = summary(table)
    print(f"blocklab lab-job underflow: {args.out}: {said['with_any']} of {said['runs']} runs have subnormal entries "
          f"in their backward pass, {said['underflowing']} a block with over {UNDERFLOWING * 100:g} % of them", file=sys.stderr)
    return 0


def _job_record(args) -> int:
    """Copy each finished run's loss.csv and meta.json (checked against its checksums) to ``--to/runs/<run>/``, and
    write ``--status`` (docs/lab/STATUS.md): every run found, finished (outcome, final loss) or checkpointed (its step),
    and every run already recorded in ``--to/runs/`` that this folder lacks (trained on another machine or in a runs
    folder since cleared), so the page and its run-hours never drop a recorded run."""
    import shutil

    import pandas as pd

    from ..integrity import read_run
    from ..training.sweep import run_state
    from .outcomes import outcome
    from .records import RECORDED_FILES
    from .records import read_run as read_recorded

    rows, hours, finished = {}, 0.0, 0

    def finished_row(name: str, state: str, meta: dict, loss: pd.DataFrame) -> str:
        nonlocal hours, finished
        found = outcome(loss["step"].tolist(), loss["loss"].tolist(), meta["copy_task"]["vocab_size"],
                        meta.get("diverged_step"))
        wall = meta.get("wall_time_s")
        hours += (wall or 0) / 3600
        finished += 1
        return (f"| {name} | {state} | {len(loss)} | {found['outcome']} | {found['final_loss']:.4g} |"
                f" {'' if wall is None else f'{wall / 3600:.2f}'} | {meta.get('libraries', {}).get('cpu') or ''} |")

    for run_dir in sorted(p for p in args.runs.iterdir() if p.is_dir()):
        state = run_state(run_dir, 0)
        if state["status"] == "finished":
            meta, loss = read_run(run_dir)
            target = args.to / "runs" / run_dir.name
            target.mkdir(parents=True, exist_ok=True)
            for name in RECORDED_FILES:
                shutil.copyfile(run_dir / name, target / name)
            rows[run_dir.name] = finished_row(run_dir.name, "finished", meta, loss)
        else:
            rows[run_dir.name] = f"| {run_dir.name} | {state['status']} | {state['steps_done']} | | | | |"
    recorded_dir = args.to / "runs"
    for run_dir in sorted(p for p in recorded_dir.iterdir() if p.is_dir()) if recorded_dir.is_dir() else []:
        if run_dir.name not in rows:  # recorded before, and not in this runs folder
            rows[run_dir.name] = finished_row(run_dir.name, "finished, recorded", *read_recorded(run_dir))
    try:  # the page names the runs folder as it lies in the project, not this machine's absolute path
        runs_named = Path(args.runs).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        runs_named = str(args.runs)
    text = ["# Stability lab runs at the document's setup: where they stand", "",
            f"Generated by `blocklab lab-job record --runs {runs_named} --to {args.to}`; do not edit by hand. A finished"
            f" run's loss.csv and meta.json are in `{args.to.as_posix()}/runs/<run>/`; a run started but not yet at its"
            " first checkpoint shows as not started; a checkpointed one resumes on the machine that holds"
            " its checkpoint (`bash scripts/train_lab_runs.sh`); \"finished, recorded\": in git, not in this runs folder (trained"
            " on another machine, or before the folder was cleared).", "",
            "| run | state | steps | outcome | final loss | wall time (h) | processor |", "|---|---|---:|---|---:|---:|---|",
            *(rows[name] for name in sorted(rows)), "",
            f"Spent so far: {hours:.1f} run-hours on the {finished} finished runs (each run's own wall time, under whatever"
            " else the machine ran then; the plan's budget, in [cost.md](cost.md), is counted in idle hours).", ""]
    args.status.parent.mkdir(parents=True, exist_ok=True)
    args.status.write_text("\n".join(text), encoding="utf-8")
    return 0


def _load(path: Path):
    from ..params_file import load_params
    from .spec import Spec, params_sha256

    spec = Spec.from_file(path)
    from .spec import check_digest

    check_digest(spec)  # the block the jobs import is the one planned
    params_path = spec.read.get("params_path")
    if not params_path or not Path(params_path).is_file():
        raise ConfigError(f"{path}: its params file {params_path!r} is gone; run `blocklab lab` again")
    if params_sha256(params_path) != spec.params_sha256:
        raise ConfigError(f"{params_path} changed since this lab was planned; run `blocklab lab` again (it replans)")
    return spec, load_params(params_path, studies=False)


def _log_progress() -> None:
    """A run's progress lines (training.train: step, loss, s/step, its ETA, at least every 10 s; its resume) on stderr,
    which the rule tees to the terminal and to the run's train.log."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def _job_run(args) -> int:
    from .run import train_lab_run

    _log_progress()
    spec, params = _load(args.spec)
    if (args.warmup, args.seed) not in spec.runs():
        raise ConfigError(f"run w{args.warmup}-s{args.seed} is not in {args.spec}'s plan {spec.runs()}")
    train_lab_run(spec, params, args.warmup, args.seed, args.out_dir, args.threads)
    return 0


def _job_gradnorm(args) -> int:
    from .run import gradnorm_at_init

    spec, _ = _load(args.spec)
    write_table(gradnorm_at_init(spec, spec.setup.seeds), args.out)
    return 0


def _job_report(args) -> int:
    from ..io import read_table
    from .report import write_report
    from .run import row_of

    spec, _ = _load(args.spec)
    run_dirs = {(w, s): args.out / "runs" / spec.run_name(w, s) for w, s in spec.runs()}
    rows = [row_of(spec, d) for d in run_dirs.values()]
    write_report(spec, rows, run_dirs, read_table(args.out / "gradnorm.csv"), args.out)
    return 0
