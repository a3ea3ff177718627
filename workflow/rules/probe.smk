# Residual-stream growth in trained models: a real pretrained LM and our own copy-task models (problem 10, part c).

PROBED_RUNS = expand(
    "data/sweep/runs/{norm}-w{warmup}-s{seed}",
    norm=config["sweep"]["norms"], warmup=config["sweep"]["warmups"], seed=config["sweep"]["seeds"][0],
)


rule probe_lm:
    input:
        code_files("experiments/residual_trained"),
    output:
        "data/probe/lm.csv",
    params:
        probe=config["probe"],
    threads: config["threads_per_run"]
    resources:
        mem_mb=4000,
    # Loading the pretrained LM takes a fixed ~10-15 s on 2 busy cores whatever the configuration (load_gguf_once
    # parses the GGUF once): start it first so that it is not the last job before the report (it was, in the tiny
    # pipeline).
    priority: 10
    shell:
        "blocklab exp probe-residual --params {PARAMS_FILE} --out {output}"


rule probe_copy:
    input:
        code_files("experiments/residual_trained"),
        [f"{run}/model.safetensors" for run in PROBED_RUNS],
        [f"{run}/meta.json" for run in PROBED_RUNS],
    output:
        "data/probe/copy.csv",
    params:
        task=config["copy_task"],
    threads: config["threads_per_run"]
    shell:
        "blocklab exp probe-copy --params {PARAMS_FILE} --runs {PROBED_RUNS} --out {output}"
