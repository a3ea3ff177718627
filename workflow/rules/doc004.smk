# Document 004: parameter counts, activation norms at init, encoder-decoder reverse copy with modern swaps.

REVERSE_RUNS = expand(
    "data/reverse_copy/runs/{variant}-s{seed}",
    variant=config["reverse_copy"]["variants"], seed=config["reverse_copy"]["seeds"],
)


rule param_counts:
    input:
        code_files("model_config", "model/layers", "model/blocks", "model/counting", "model/hf_config", "experiments/param_counts"),
    output:
        blocks="data/param_counts/blocks.csv",
        models="data/param_counts/models.csv",
        audit="data/param_counts/audit.csv",
    params:
        counts=config["param_counts"],
    shell:
        "blocklab exp param-counts --params {PARAMS_FILE} --out-dir $(dirname {output.blocks})"


rule activation_norms:
    input:
        code_files("model_config", "model/layers", "model/blocks", "model/init", "experiments/activation_norms"),
    output:
        "data/activation_norms/norms.csv",
    params:
        section=config["activation_norms"],
    threads: config["threads_per_run"]
    shell:
        "blocklab exp activation-norms --params {PARAMS_FILE} --out {output}"


rule residual_ablation:
    input:
        code_files("model_config", "model/layers", "model/blocks", "model/init", "experiments/activation_norms"),
    output:
        "data/activation_norms/residual_ablation.csv",
    params:
        section=config["activation_norms"],
    threads: config["threads_per_run"]
    shell:
        "blocklab exp residual-ablation --params {PARAMS_FILE} --out {output}"


rule train_reverse:
    input:
        code_files(*MODEL_CODE, "experiments/reverse_copy"),
    output:
        loss="data/reverse_copy/runs/{variant}-s{seed}/loss.csv",
        weights="data/reverse_copy/runs/{variant}-s{seed}/model.safetensors",
        meta="data/reverse_copy/runs/{variant}-s{seed}/meta.json",
    params:
        training=training_settings(config["reverse_copy"], "variants", "seeds"),
    log:
        "data/reverse_copy/runs/{variant}-s{seed}/train.log",
    priority: resume_first("data/reverse_copy/runs/{variant}-s{seed}/checkpoint.pt")  # runs with a checkpoint first
    threads: config["threads_per_run"]
    resources:
        mem_mb=1000,
        runtime=30,
    shell:
        "blocklab exp train-reverse --params {PARAMS_FILE} --variant {wildcards.variant} --seed {wildcards.seed}"
        " --out-dir $(dirname {output.meta}) 2>&1 | tee -ia {log} >&2"


rule aggregate_reverse:
    input:
        [f"{run}/meta.json" for run in REVERSE_RUNS],
    output:
        losses="data/reverse_copy/losses.csv",
        summary="data/reverse_copy/summary.csv",
    shell:
        "blocklab exp aggregate-reverse --runs {REVERSE_RUNS} --out-losses {output.losses} --out-summary {output.summary}"
