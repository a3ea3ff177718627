"""Snapshot tables of finished cells of the sensitivity study, from the trained runs (run from the project root):

    python docs/sensitivity/tables.py --out docs/sensitivity/bf16 learned-b32-L24-lr0.001-fp32 learned-b32-L24-lr0.001-bf16
    python docs/sensitivity/tables.py --out docs/sensitivity/choices          # every open-choice cell
    blocklab sensitivity-status --verdicts --out DIR/claims_by_setting.csv    # claim x setting of the finished cells

The package's own aggregation (blocklab.experiments.sensitivity.aggregate) restricted to the open-choice cells named
(default: all of them); nothing here judges or computes anything the package does not. Writes DIR/summary.csv (one row
per run) and DIR/losses.csv (every step)."""
import argparse
from pathlib import Path

from blocklab.experiments import sensitivity as sens
from blocklab.params import load_params

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("cells", nargs="*", help="open-choice cells (default: every one of the plan)")
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--params", default="params.yaml")
args = parser.parse_args()

params = load_params(args.params)
planned = sens.plan(params)
planned = planned[planned["family"] == "choices"]
if args.cells:
    unknown = sorted(set(args.cells) - set(planned["setting"]))
    if unknown:
        parser.error(f"not open-choice cells of the plan: {', '.join(unknown)}; planned: {', '.join(planned['setting'].unique())}")
    planned = planned[planned["setting"].isin(args.cells)]
losses, summary = sens.aggregate(params, ".", planned=planned)
columns = ["setting", "position", "batch_size", "precision", "run", "loss_at_100", "loss_at_200", "loss_at_300",
           "final_loss", "min_loss", "steps_to_learn", "relapse_loss", "relapse_step", "outcome", "trained_steps",
           "wall_time_s", "run_dir"]
args.out.mkdir(parents=True, exist_ok=True)
summary[columns].to_csv(args.out / "summary.csv", index=False, float_format="%.6g")
losses.round({"loss": 6})[["setting", "precision", "run", "step", "loss"]].to_csv(args.out / "losses.csv", index=False)
print(summary[columns[:-1]].to_string(index=False))
