# blocklab: every experiment of documents 000 and 004, then every figure.
#   snakemake --cores 4            (local; profiles/default)
#   snakemake --profile profiles/slurm --workflow-profile none   (a SLURM cluster; docs/slurm.md)
# The DAG is defined here and in workflow/rules/*.smk only; dvc.yaml runs it. Rules call `blocklab <group> <verb>`.
from blocklab.model_config import NORM_POSITIONS
from blocklab.studies.protocol import STUDIES
from blocklab.pipeline import FIGURES, MODEL_CODE, PARAMS_FILE, check_config, code_closure, code_files, resume_first, sweep_batched, sweep_group_files, training_settings

# "Kill it and start it again": a hard kill (SIGKILL, power loss, OOM) leaves .snakemake/locks/ behind. The main
# process holds an flock for its whole life, taken here, before Snakemake looks at its own locks; if no other run of
# this directory holds it, those locks are stale and are removed (blocklab.pipeline.hold_run_lock). Jobs skip this.
if workflow.is_main_process:
    from snakemake.logging import logger
    from blocklab.pipeline import hold_run_lock

    hold_run_lock(log=logger.warning)

    # Ctrl-C: one line saying what is kept and the command that resumes, not a traceback per stopped job
    from blocklab.pipeline import say_interrupt_in_one_line

    say_interrupt_in_one_line()

# params.yaml read by blocklab first (its size, its values with YAML aliases expanded, a repeated key): a file that
# would hold Snakemake's own reader for minutes is refused in a second; a parameter error is one line, exit status 2
from blocklab.pipeline import in_one_line
from blocklab.params_file import read_params_file

in_one_line(read_params_file, PARAMS_FILE)
configfile: "params.yaml"
in_one_line(check_config, config)  # schema + cross-field checks: a bad value stops here, before any job, naming the key
if workflow.is_main_process:  # its jobs refuse params.yaml if it is edited while they wait (blocklab.params_file.pin_params)
    from blocklab.params_file import pin_params

    pin_params(PARAMS_FILE)


include: "workflow/rules/doc000.smk"
include: "workflow/rules/doc004.smk"
include: "workflow/rules/probe.smk"
# What `all` asks of each study, registered by its own rules: STUDY_TARGETS[study] = {"outputs": its tables and
# figures, "plan": its plan table, "runs": a function giving its aggregation's inputs (runs, snapshots), and
# optionally "always" / "always_runs": targets wanted whether or not the study is in the report}.
STUDY_TARGETS = {}
for _study in STUDIES:  # the registered studies (blocklab.studies.protocol), each with its rules, in that order
    include: f"workflow/rules/{_study}.smk"
_unregistered = [s for s in STUDIES if s not in STUDY_TARGETS]
if _unregistered:
    raise ValueError(f"workflow/rules/{_unregistered[0]}.smk sets no STUDY_TARGETS[{_unregistered[0]!r}] (the Snakefile says what it holds)")
IN_REPORT = [s for s in STUDIES if config[s]["in_report"]]  # the studies whose tables and figures `all` makes
include: "workflow/rules/report.smk"


# Every finished run a table is made from is a target too: a run removed (`rm -r data/sweep/runs/<run>`) is trained
# again by the same command, and what depends on it is remade (Snakemake would otherwise find the tables present and
# do nothing).
RUN_TARGETS = sorted({path for path in [*[f"{run}/meta.json" for run in SWEEP_RUNS + REVERSE_RUNS],
                                       *[p for s in IN_REPORT for p in STUDY_TARGETS[s]["runs"]()],
                                       *[p for s in STUDIES for p in STUDY_TARGETS[s].get("always_runs", list)()]]
                      if isinstance(path, str) and path.startswith("data/") and path.endswith("/meta.json")})

REMADE = []  # what the main process removed as damaged: made again even where it is an intermediate table
# A damaged finished run (its files unlike its checksums) is trained again too: the main process sets its meta.json
# aside before the DAG is planned (blocklab.pipeline.set_aside_damaged_runs), so the run is missing like a removed one.
if workflow.is_main_process:
    from blocklab.pipeline import check_writable, dry_run, set_aside_damaged_runs

    if not dry_run(workflow):  # a read-only data/ (or figs/, ...): one line before anything is moved or any job runs
        in_one_line(check_writable)
    set_aside_damaged_runs(RUN_TARGETS, dry_run=dry_run(workflow), log=logger.warning)
    # and a damaged figure, sidecar, report or table (unlike its checksum record) is removed, so that it is made again
    from blocklab.pipeline import remove_damaged_outputs

    REMADE = remove_damaged_outputs(dry_run=dry_run(workflow), log=logger.warning)  # targets of `all` (below)



# Once, when the jobs are about to start (not on a dry run): the jobs left and their ETA, from this machine measured
# now: a job's start (as many side by side as run at once) and a few training steps of this configuration
# (blocklab.status.measure_here, pipeline_eta).
onstart:
    from blocklab.status import eta_line, lanes_of, measure_here, pipeline_eta

    cores, jobs = workflow.resource_settings.cores or 1, list(workflow.dag.needrun_jobs())
    logger.warning(eta_line(pipeline_eta(RUN_TARGETS, config, cores, rules=[job.rule.name for job in jobs],
                                         measured=measure_here(PARAMS_FILE, lanes_of(config, cores),
                                                               train=any(j.rule.name.startswith("train_") for j in jobs)),
                                         todo={str(path) for job in jobs for path in job.output})))

PIPELINE_TARGETS = [
    *[STUDY_TARGETS[s]["outputs"] if s in IN_REPORT else STUDY_TARGETS[s]["plan"] for s in STUDIES],
    *[STUDY_TARGETS[s].get("always", []) for s in STUDIES],
    expand("figs/{figure}.png", figure=FIGURES),
    "reports/analysis.html",
    "data/claims/claims.csv",
    "data/claims/metrics.json",
    RUN_TARGETS,
]


rule all:
    default_target: True
    input:
        PIPELINE_TARGETS,
        REMADE,
        "logs/verified.txt",


# The last step: every finished run, table, figure, sidecar and the report checked against its checksums, then the
# outputs recorded in dvc.lock
# (`dvc commit`; inside `dvc repro` DVC records them itself), so that `dvc repro` / `dvc exp run` after `snakemake`
# keep everything Snakemake made, and nothing damaged is recorded as the truth.
rule verify_and_record:
    input:
        PIPELINE_TARGETS,
    output:
        "logs/verified.txt",
    localrule: True
    shell:
        "blocklab verify data figs reports --dvc-cache --record-dvc pipeline > {output}"
