# Why post-norm fails, measured while it trains: the diagnostics of the main sweep's runs and how often
# post-norm with warm-up collapses after it (`snakemake --cores 4 dynamics`); part of `all` (and so of `dvc repro`)
# when dynamics.in_report is true. A run identical to a main-sweep run is that run (data/sweep/runs).
from blocklab.studies.dynamics.plan import PLAN as DYNAMICS_PLAN, FIGURES as DYNAMICS_FIGURES, TABLES as DYNAMICS_TABLES, aggregate_inputs as dynamics_aggregate_inputs, run_identity as dynamics_identity
from blocklab.studies.dynamics.detectors import TABLES as DETECTOR_TABLES

DYNAMICS_OUTPUTS = [DYNAMICS_PLAN, *DYNAMICS_TABLES.values(), *DETECTOR_TABLES.values(),
                    *expand("figs/{figure}.png", figure=DYNAMICS_FIGURES)]
STUDY_TARGETS["dynamics"] = {"outputs": DYNAMICS_OUTPUTS, "plan": DYNAMICS_PLAN,
                             "runs": lambda: dynamics_aggregate_inputs(config)}  # what `all` asks (Snakefile)


rule dynamics_plan:
    input:
        code_files("studies/cells", "studies/dynamics/plan"),
    output:
        DYNAMICS_PLAN,
    params:
        dynamics=config["dynamics"], model=config["copy_model"], task=config["copy_task"], sweep=config["sweep"],
    shell:
        "blocklab dynamics plan --params {PARAMS_FILE} --out {output}"


# Collapse runs outside the main sweep: post-norm with warm-up at a setting and a seed; each stops once it collapsed.
rule train_dynamics:
    output:
        loss="data/dynamics/runs/{cell}/post-w{warmup}-s{seed}/loss.csv",
        diagnostics="data/dynamics/runs/{cell}/post-w{warmup}-s{seed}/diagnostics.parquet",
        weights="data/dynamics/runs/{cell}/post-w{warmup}-s{seed}/model.safetensors",
        meta="data/dynamics/runs/{cell}/post-w{warmup}-s{seed}/meta.json",
    wildcard_constraints:
        cell=CELL_PATTERN,
    params:
        run=lambda wildcards: dynamics_identity(config, wildcards.cell),
    log:
        "data/dynamics/runs/{cell}/post-w{warmup}-s{seed}/train.log",
    priority: resume_first("data/dynamics/runs/{cell}/post-w{warmup}-s{seed}/checkpoint.pt")  # runs with a checkpoint first
    threads: config["threads_per_run"]
    resources:
        mem_mb=2000,
        runtime=480,
    shell:
        "blocklab dynamics train --params {PARAMS_FILE} --cell {wildcards.cell} --seed {wildcards.seed}"
        " --threads {threads} --out-dir $(dirname {output.meta}) 2>&1 | tee -ia {log} >&2"


rule aggregate_dynamics:
    input:
        # every planned run's meta.json (they train first), or the snapshots of dynamics.from_snapshots (none train)
        dynamics_aggregate_inputs(config),
        code=code_closure("studies/dynamics/aggregate", "studies/dynamics/commands"),
    output:
        *DYNAMICS_TABLES.values(),
    params:
        dynamics=config["dynamics"],
    shell:
        "blocklab dynamics aggregate --params {PARAMS_FILE}"


# Each precursor as a detector: hit and false-alarm rates with intervals, and lead times (docs/dynamics.md).
rule dynamics_detectors:
    input:
        DYNAMICS_TABLES["losses"], DYNAMICS_TABLES["diagnostics"], DYNAMICS_TABLES["summary"],
        code=code_closure("studies/dynamics/aggregate", "studies/dynamics/detectors"),
    output:
        *DETECTOR_TABLES.values(),
    params:
        events=config["dynamics"]["events"],
    shell:
        "blocklab dynamics detectors --params {PARAMS_FILE} --from data/dynamics --out data/dynamics"


rule dynamics_figures:
    input:
        *DYNAMICS_TABLES.values(),
        code=code_closure("studies/dynamics/figures", "studies/dynamics/commands"),
    output:
        [report(f"figs/{name}.png", caption="../report/dynamics_figure.rst", category="dynamics (document 000)",
                labels={"figure": name, "data": ", ".join(DYNAMICS_FIGURES[name])}) for name in DYNAMICS_FIGURES],
    params:
        figures=config["figures"],
    shell:
        "blocklab dynamics figures --params {PARAMS_FILE} --data data --figs figs"


rule dynamics:
    input:
        DYNAMICS_OUTPUTS,
