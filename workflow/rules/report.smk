# The claims table, then the analysis notebook (papermill) that redraws every figure from the cached data.
# report(): `snakemake --report report.html` lists every figure with the rule, inputs, parameters and code that made it.

from blocklab.reporting.claims import inputs as claims_inputs

report: "../report/workflow.rst"

FIGURE_DOCUMENT = {name: "004" if name in ("param_counts", "activation_norms", "residual_ablation", "reverse_copy") else "000"
                   for name in FIGURES}

ANALYSIS_DATA = sorted({path for sources in FIGURES.values() for path in sources}) + [
    "data/param_counts/models.csv", "data/param_counts/audit.csv", "data/residual_sim/table.csv",
]


rule claims:
    input:
        claims_inputs(config),  # the tables the checks of claims.yaml declare they read (those of studies in the run)
        claims="src/blocklab/reporting/claims.yaml",
        code=code_closure("reporting/claims"),
    output:
        "data/claims/claims.csv",
    shell:
        "blocklab report claims --params {PARAMS_FILE} --data data --out {output}"


# The outcome in a few numbers for `dvc metrics show` / `dvc exp show` (dvc.yaml's metrics).
rule metrics:
    input:
        "data/claims/claims.csv",
        "data/sweep/summary.csv",
        DYNAMICS_TABLES["rates"] if config["dynamics"]["in_report"] else [],
        code=code_closure("reporting/metrics"),
    output:
        "data/claims/metrics.json",
    shell:
        "blocklab report metrics --params {PARAMS_FILE} --data data --out {output}"


rule report:
    input:
        ANALYSIS_DATA,
        [STUDY_TARGETS[s]["outputs"] for s in IN_REPORT],
        "data/claims/claims.csv",
        notebook="notebooks/analysis.ipynb",
        figure_code=code_closure("reporting/report", "reporting/answers", "studies/inference/aggregate", "figures/style", "figures/doc000", "figures/doc004",
                               "figures/params", "figures/residual_trained"),
        answers="src/blocklab/reporting/answers.yaml",
    output:
        figures=[report(f"figs/{name}.png", caption="../report/figure.rst", category=f"document {FIGURE_DOCUMENT[name]}",
                        labels={"figure": name, "data": ", ".join(FIGURES[name])}) for name in FIGURES],
        notebook="reports/analysis.ipynb",
        html=report("reports/analysis.html", caption="../report/analysis.rst", category="analysis report",
                    labels={"file": "reports/analysis.html"}),
    params:
        figures=config["figures"],
    shell:
        "blocklab report notebook --params {PARAMS_FILE} --notebook {input.notebook} --out-notebook {output.notebook}"
        " --out-html {output.html} --figs figs"
