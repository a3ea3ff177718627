# The claims table, then the analysis notebook (papermill) that redraws every figure from the cached data.

ANALYSIS_DATA = sorted({path for sources in FIGURES.values() for path in sources}) + [
    "data/param_counts/models.csv", "data/param_counts/audit.csv", "data/residual_sim/table.csv",
]


rule claims:
    input:
        ANALYSIS_DATA,
        claims="src/blocklab/claims.yaml",
        code=code_files("claims"),
    output:
        "data/claims/claims.csv",
    shell:
        "blocklab claims --params {PARAMS_FILE} --data data --out {output}"


rule report:
    input:
        ANALYSIS_DATA,
        "data/claims/claims.csv",
        notebook="notebooks/analysis.ipynb",
        figure_code=code_files("report", "figures/style", "figures/doc000", "figures/doc004", "figures/params", "figures/probe"),
    output:
        figures=expand("figs/{figure}.png", figure=FIGURES),
        notebook="reports/analysis.ipynb",
        html="reports/analysis.html",
    params:
        figures=config["figures"],
    shell:
        "blocklab report --params {PARAMS_FILE} --notebook {input.notebook} --out-notebook {output.notebook}"
        " --out-html {output.html} --figs figs"
