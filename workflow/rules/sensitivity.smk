# What document 000 leaves open: the sweep under other position signals, batch sizes and precisions at the
# document's size, and a depth x learning-rate grid. `snakemake --cores 4 sensitivity`; part of `all` (and so of
# `dvc repro`) when sensitivity.in_report is true. A run identical to a main-sweep run is that run (data/sweep/runs).
from blocklab.studies.cells import CELL_PATTERN
from blocklab.studies.sensitivity.plan import PLAN as SENSITIVITY_PLAN, FIGURES as SENSITIVITY_FIGURES, GRADNORM as SENSITIVITY_GRADNORM, TABLES as SENSITIVITY_TABLES, aggregate_inputs as sensitivity_aggregate_inputs, run_identity

SENSITIVITY_OUTPUTS = [SENSITIVITY_PLAN, *SENSITIVITY_TABLES.values(), *expand("figs/{figure}.png", figure=SENSITIVITY_FIGURES)]
STUDY_TARGETS["sensitivity"] = {"outputs": SENSITIVITY_OUTPUTS, "plan": SENSITIVITY_PLAN,
                                "runs": lambda: sensitivity_aggregate_inputs(config)}  # what `all` asks (Snakefile)


# The plan (every cell, run and directory) is cheap and made by every pipeline run, so data/sensitivity exists for DVC
# even when the study itself is not part of `all`.
rule sensitivity_plan:
    input:
        code_files("studies/cells", "studies/sensitivity/plan"),
    output:
        SENSITIVITY_PLAN,
    params:
        sensitivity=config["sensitivity"], model=config["copy_model"], task=config["copy_task"], sweep=config["sweep"],
    shell:
        "blocklab sensitivity plan --params {PARAMS_FILE} --out {output}"


rule train_sensitivity:
    output:
        loss="data/sensitivity/runs/{cell}/{norm}-w{warmup}-s{seed}/loss.csv",
        weights="data/sensitivity/runs/{cell}/{norm}-w{warmup}-s{seed}/model.safetensors",
        meta="data/sensitivity/runs/{cell}/{norm}-w{warmup}-s{seed}/meta.json",
    wildcard_constraints:
        cell=CELL_PATTERN,
    params:
        # only what decides this cell's numbers: adding a value to an axis trains the new cells alone
        run=lambda wildcards: run_identity(config, wildcards.cell),
    log:
        "data/sensitivity/runs/{cell}/{norm}-w{warmup}-s{seed}/train.log",
    priority: resume_first("data/sensitivity/runs/{cell}/{norm}-w{warmup}-s{seed}/checkpoint.pt")  # runs with a checkpoint first
    threads: config["threads_per_run"]
    resources:
        mem_mb=2000,
        runtime=480,
    shell:
        "blocklab sensitivity train --params {PARAMS_FILE} --cell {wildcards.cell} --norm {wildcards.norm}"
        " --warmup {wildcards.warmup} --seed {wildcards.seed} --threads {threads} --out-dir $(dirname {output.meta})"
        " 2>&1 | tee -ia {log} >&2"


rule sensitivity_gradnorm:
    input:
        code_files(*MODEL_CODE, "experiments/gradnorm", "studies/cells", "studies/sensitivity/plan", "studies/sensitivity/run"),
    output:
        SENSITIVITY_GRADNORM,
    params:
        choices=config["sensitivity"]["choices"],
        gradnorm=config["gradnorm"], model=config["copy_model"], task=config["copy_task"],
    threads: config["threads_per_run"]
    shell:
        "blocklab sensitivity gradnorm --params {PARAMS_FILE} --out {output}"


rule aggregate_sensitivity:
    input:
        # every planned run's meta.json (they train first), or the snapshots of sensitivity.from_snapshots (none train)
        sensitivity_aggregate_inputs(config),
        SENSITIVITY_GRADNORM,
        code=code_closure("studies/sensitivity/aggregate", "reporting/sensitivity"),  # the verb: reporting.sensitivity
        claims="src/blocklab/reporting/claims.yaml",
    output:
        *SENSITIVITY_TABLES.values(),
    params:
        sensitivity=config["sensitivity"],
    shell:
        "blocklab sensitivity aggregate --params {PARAMS_FILE}"


rule sensitivity_figures:
    input:
        *SENSITIVITY_TABLES.values(),
        SENSITIVITY_GRADNORM,
        code=code_closure("studies/sensitivity/figures", "studies/sensitivity/commands"),
    output:
        [report(f"figs/{name}.png", caption="../report/sensitivity_figure.rst", category="sensitivity (document 000)",
                labels={"figure": name, "data": ", ".join(SENSITIVITY_FIGURES[name])}) for name in SENSITIVITY_FIGURES],
    params:
        figures=config["figures"],
    shell:
        "blocklab sensitivity figures --params {PARAMS_FILE} --data data --figs figs"


rule sensitivity:
    input:
        SENSITIVITY_OUTPUTS,
