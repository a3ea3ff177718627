# The document's unstated setup, inferred (the procedure is in docs/dynamics.md, stated before these runs):
# 300-step fitting runs of every candidate setting, ranked by the document's five early losses.
# `snakemake --cores 4 inference`; part of `all` when inference.in_report is true.
from blocklab.studies.inference.plan import PLAN as INFERENCE_PLAN, LOSSES as INFERENCE_LOSSES, RANKING as INFERENCE_RANKING, HOLDOUT as INFERENCE_HOLDOUT, aggregate_inputs as inference_aggregate_inputs, holdout_plan as inference_holdout_plan, run_identity as inference_identity

INFERENCE_OUTPUTS = [INFERENCE_PLAN, INFERENCE_LOSSES, INFERENCE_RANKING]


rule inference_plan:
    input:
        code_files("studies/cells", "studies/inference/plan"),
    output:
        INFERENCE_PLAN,
    params:
        inference=config["inference"], model=config["copy_model"], task=config["copy_task"], sweep=config["sweep"],
    shell:
        "blocklab inference plan --params {PARAMS_FILE} --out {output}"


rule train_inference:
    output:
        loss="data/inference/runs/{cell}/{norm}-w{warmup}-s{seed}/loss.csv",
        diagnostics="data/inference/runs/{cell}/{norm}-w{warmup}-s{seed}/diagnostics.parquet",
        weights="data/inference/runs/{cell}/{norm}-w{warmup}-s{seed}/model.safetensors",
        meta="data/inference/runs/{cell}/{norm}-w{warmup}-s{seed}/meta.json",
    wildcard_constraints:
        cell=CELL_PATTERN,
    params:
        run=lambda wildcards: inference_identity(config, wildcards.cell),
    log:
        "data/inference/runs/{cell}/{norm}-w{warmup}-s{seed}/train.log",
    priority: resume_first("data/inference/runs/{cell}/{norm}-w{warmup}-s{seed}/checkpoint.pt")  # runs with a checkpoint first
    threads: config["threads_per_run"]
    resources:
        mem_mb=2000,
        runtime=240,
    shell:
        "blocklab inference train --params {PARAMS_FILE} --cell {wildcards.cell} --norm {wildcards.norm}"
        " --warmup {wildcards.warmup} --seed {wildcards.seed} --threads {threads} --out-dir $(dirname {output.meta})"
        " 2>&1 | tee -ia {log} >&2"


rule aggregate_inference:
    input:
        inference_aggregate_inputs(config),
        code=code_closure("studies/inference/aggregate", "reporting/inference"),  # the verb: reporting.inference
        claims="src/blocklab/reporting/claims.yaml",
    output:
        INFERENCE_LOSSES,
        INFERENCE_RANKING,
    params:
        inference=config["inference"],
    shell:
        "blocklab inference aggregate --params {PARAMS_FILE}"


rule inference:
    input:
        INFERENCE_OUTPUTS,


# The held-out runs: the default cell's fitted cases at inference.holdout_seeds, seeds no fitting run used;
# the claims judge the five fitted numbers on them. Part of `all` whenever holdout seeds are set (recorded runs are read).
HOLDOUT_OUTPUTS = [INFERENCE_HOLDOUT] if config["inference"].get("holdout_seeds") else []
STUDY_TARGETS["inference"] = {  # what `all` asks (Snakefile): the held-out runs whether or not the study is in the report
    "outputs": INFERENCE_OUTPUTS, "plan": INFERENCE_PLAN, "runs": lambda: inference_aggregate_inputs(config),
    "always": HOLDOUT_OUTPUTS,
    "always_runs": lambda: inference_aggregate_inputs(config, inference_holdout_plan(config)) if HOLDOUT_OUTPUTS else []}


rule aggregate_holdout:
    input:
        inference_aggregate_inputs(config, inference_holdout_plan(config)),
        code=code_closure("studies/inference/aggregate", "studies/inference/commands"),
    output:
        INFERENCE_HOLDOUT,
    params:
        holdout=config["inference"].get("holdout_seeds", []),
    shell:
        "blocklab inference aggregate-holdout --params {PARAMS_FILE} --out {output}"
