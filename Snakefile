# blocklab: every experiment of documents 000 and 004, then every figure.
#   snakemake --cores 4            (local; profiles/default)
#   snakemake --profile profiles/slurm --workflow-profile none   (a SLURM cluster; docs/slurm.md)
# The DAG is defined here and in workflow/rules/*.smk only; dvc.yaml runs it. Rules call `blocklab <command>`.
from blocklab.pipeline import FIGURES, MODEL_CODE, PARAMS_FILE, check_config, code_files, sweep_batched, sweep_group_files, training_settings

configfile: "params.yaml"
check_config(config)  # schema + cross-field checks: a bad value stops here, before any job, naming the key


include: "workflow/rules/doc000.smk"
include: "workflow/rules/doc004.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/sensitivity.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        SENSITIVITY_OUTPUTS if config["sensitivity"]["in_report"] else SENSITIVITY_PLAN,
        expand("figs/{figure}.png", figure=FIGURES),
        "reports/analysis.html",
        "data/claims/claims.csv",
