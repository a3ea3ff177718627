# The stability lab: document 000's copy-task stress test for any block. Its own small DAG, run by
# `blocklab lab` in the lab's output folder (snakemake --directory OUT --config spec=spec.json): one job a run
# (warm-up x seed), the gradient per block at init, then the tables, figure and page. Rules call `blocklab lab-job`;
# each job appends what it prints to its log (a run's to runs/<run>/train.log, as the pipeline's training rules do).
import json

LAB = json.loads(open(config.get("spec", "spec.json"), encoding="utf-8").read())
LAB_RUNS = [f"w{w}-s{s}" for w in LAB["setup"]["warmups"] for s in LAB["setup"]["seeds"]]


rule lab_all:
    default_target: True
    input:
        "lab.csv", "rates.csv", "lab.png", "README.md",


# One run: its meta.json is written last and marks it finished; a killed run resumes from runs/<run>/checkpoint.pt.
# Its train.log is not a Snakemake `log:` (Snakemake deletes a job's logs before it runs): a resumed run appends to
# it, after the lines of the runs it resumes (their steps and their interrupted lines).
rule lab_run:
    input:
        "spec.json",
    output:
        "runs/w{warmup}-s{seed}/meta.json",
    wildcard_constraints:
        warmup=r"\d+", seed=r"\d+",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=480,
    shell:
        "blocklab lab-job run --spec spec.json --warmup {wildcards.warmup} --seed {wildcards.seed}"
        " --out-dir runs/w{wildcards.warmup}-s{wildcards.seed} --threads {threads} 2>&1"
        " | tee -ia runs/w{wildcards.warmup}-s{wildcards.seed}/train.log >&2"


rule lab_gradnorm:
    input:
        "spec.json",
    output:
        "gradnorm.csv",
    log:
        "logs/gradnorm.log",
    shell:
        "blocklab lab-job gradnorm --spec spec.json --out {output} 2>&1 | tee -ia {log} >&2"


rule lab_report:
    input:
        "spec.json", "gradnorm.csv", expand("runs/{run}/meta.json", run=LAB_RUNS),
    output:
        "lab.csv", "rates.csv", "lab.png", "README.md",
    log:
        "logs/report.log",
    shell:
        "blocklab lab-job report --spec spec.json --out . 2>&1 | tee -ia {log} >&2"
