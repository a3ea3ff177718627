"""The sensitivity study's first look: the gradient-norm claims judged under each position signal, by the claims'
own checks. Run from the repository root: ``python scripts/judge_gradnorm_by_position.py`` (it reads and writes
records/sensitivity/first-look)."""
import pandas as pd
from blocklab.params_file import load_params
from blocklab.reporting import claims
D = "records/sensitivity/first-look"
params = load_params("params.yaml")
g = pd.read_csv(f"{D}/gradnorm.csv")
rows = []
for position, part in g.groupby("position"):
    p = {**params, "copy_model": {**params["copy_model"], "position": position}}
    t = claims.evaluate_data(claims.Data(".", p, tables={"gradnorm/gradnorm.csv": part}), only=("gradnorm_trend",))
    rows.append(t.assign(position=position))
out = pd.concat(rows)[["id", "claim", "position", "document_value", "measured", "verdict"]]
out.to_csv(f"{D}/gradnorm_claims_by_position.csv", index=False)
print(out[["id", "position", "measured", "verdict"]].to_string())
