# Document 000: the norm x warm-up x seed sweep, gradient norms at init, the residual simulation, problem 9.

wildcard_constraints:
    norm="|".join(NORM_POSITIONS),
    warmup=r"\d+",
    seed=r"\d+",
    variant="[a-z]+",

SWEEP_RUNS = expand(
    "data/sweep/runs/{norm}-w{warmup}-s{seed}",
    norm=config["sweep"]["norms"], warmup=config["sweep"]["warmups"], seed=config["sweep"]["seeds"],
)


# Hours of training are not redone for a code edit: each run's meta.json records the code version (git commit and
# package source hash); retrain deliberately with `snakemake --forcerun train_copy` (or train_copy_group).
# Execution settings (checkpoints, compile, fast path, batching) are left out of params: they change speed, not results.
TRAINING = training_settings(config["sweep"], "norms", "warmups", "seeds", "checkpoint_every", "compile", "fast_path", "batched")

if sweep_batched(config):

    # One job per norm position trains all its runs as one vmapped model (on a GPU a single run cannot fill it).
    rule train_copy_group:
        output:
            loss=sweep_group_files(config, "loss.csv"),
            diagnostics=sweep_group_files(config, "diagnostics.parquet"),
            weights=sweep_group_files(config, "model.safetensors"),
            meta=sweep_group_files(config, "meta.json"),
        params:
            model=config["copy_model"],
            task=config["copy_task"],
            training=TRAINING,
        log:
            "data/sweep/logs/train-{norm}.log",
        priority: resume_first(*sweep_group_files(config, "checkpoint.pt"))  # runs with a checkpoint first
        threads: config["threads_per_run"]
        resources:
            mem_mb=8000,
            runtime=60,
        shell:
            "blocklab sweep train-group --params {PARAMS_FILE} --norm {wildcards.norm} --threads {threads}"
            " --out-root data/sweep/runs 2>&1 | tee -ia {log} >&2"

else:

    rule train_copy:
        output:
            loss="data/sweep/runs/{norm}-w{warmup}-s{seed}/loss.csv",
            diagnostics="data/sweep/runs/{norm}-w{warmup}-s{seed}/diagnostics.parquet",
            weights="data/sweep/runs/{norm}-w{warmup}-s{seed}/model.safetensors",
            meta="data/sweep/runs/{norm}-w{warmup}-s{seed}/meta.json",
        params:
            model=config["copy_model"],
            task=config["copy_task"],
            training=TRAINING,
        log:
            "data/sweep/runs/{norm}-w{warmup}-s{seed}/train.log",
        priority: resume_first("data/sweep/runs/{norm}-w{warmup}-s{seed}/checkpoint.pt")  # runs with a checkpoint first
        threads: config["threads_per_run"]
        resources:
            mem_mb=2000,
            runtime=240,
        shell:
            "blocklab sweep train --params {PARAMS_FILE} --norm {wildcards.norm} --warmup {wildcards.warmup}"
            " --seed {wildcards.seed} --threads {threads} --out-dir $(dirname {output.meta}) 2>&1 | tee -ia {log} >&2"


rule aggregate_sweep:
    input:
        [f"{run}/meta.json" for run in SWEEP_RUNS],
    output:
        losses="data/sweep/losses.csv",
        summary="data/sweep/summary.csv",
    shell:
        "blocklab sweep aggregate --runs {SWEEP_RUNS} --out-losses {output.losses} --out-summary {output.summary}"


rule gradnorm:
    input:
        code_files(*MODEL_CODE, "experiments/gradnorm"),
    output:
        "data/gradnorm/gradnorm.csv",
    params:
        gradnorm=config["gradnorm"], model=config["copy_model"], task=config["copy_task"],
    threads: config["threads_per_run"]
    shell:
        "blocklab exp gradnorm --params {PARAMS_FILE} --out {output}"


rule residual_sim:
    input:
        code_files("experiments/residual_sim"),
    output:
        curve="data/residual_sim/curve.csv",
        table="data/residual_sim/table.csv",
    params:
        sim=config["residual_sim"],
    shell:
        "blocklab exp residual-sim --params {PARAMS_FILE} --out-curve {output.curve} --out-table {output.table}"


rule problem9:
    input:
        code_files("experiments/problem9"),
    output:
        "data/problem9/scores.csv",
    params:
        problem9=config["problem9"],
    shell:
        "blocklab exp problem9 --params {PARAMS_FILE} --out {output}"
