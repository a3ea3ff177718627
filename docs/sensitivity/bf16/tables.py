"""Rebuild this folder's tables from the trained runs (run from the project root, after the bf16 cell has trained):

    python docs/sensitivity/bf16/tables.py
    blocklab sensitivity-status --verdicts --out docs/sensitivity/bf16/claims_by_setting_so_far.csv

The package's own aggregation (blocklab.experiments.sensitivity.aggregate) restricted to the default cell and its bf16
twin; nothing here judges or computes anything the package does not."""
from pathlib import Path

from blocklab.experiments import sensitivity as sens
from blocklab.params import load_params

HERE = Path(__file__).parent
params = load_params("params.yaml")
base = sens.default_cell(params)
cells = [base.name, base.name.replace(f"-{base.precision}", "-bf16")]
planned = sens.plan(params)
planned = planned[(planned["family"] == "choices") & planned["setting"].isin(cells)]
losses, summary = sens.aggregate(params, ".", planned=planned)
columns = ["setting", "precision", "run", "loss_at_100", "loss_at_200", "loss_at_300", "final_loss", "min_loss",
           "relapse_loss", "relapse_step", "outcome", "trained_steps", "wall_time_s", "run_dir"]
summary[columns].to_csv(HERE / "summary.csv", index=False, float_format="%.6g")
losses.round({"loss": 6})[["setting", "precision", "run", "step", "loss"]].to_csv(HERE / "losses.csv", index=False)
print(summary[columns[:-1]].to_string(index=False))
