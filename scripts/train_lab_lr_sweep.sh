#!/usr/bin/env bash
# The recorded learning-rate sensitivity study (docs/lab.md, "Learning-rate sensitivity"): the seven built-in blocks at
# the lab's lr-sweep profile, each at the five learning rates of blocklab.lab.lrsweep.LRS, seeds 0-2, in the plan's
# order (seed by seed, so a stopped study holds whole seeds), two at a time on 2 cores. Resumable: a finished run is
# skipped, a killed one resumes from its checkpoint (in LR_RUNS, default data/lab-lr/runs). Record what finished with
#   blocklab lab-job lr-record --runs data/lab-lr/runs     (then blocklab docs)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${LR_RUNS:-data/lab-lr/runs}
mkdir -p "$RUNS"
python -c 'from blocklab.lab.lrsweep import plan, run_name
for b, lr, s in plan(): print(b, repr(lr), s, run_name(b, lr, s))' |
  xargs -P "${JOBS:-2}" -L 1 bash -c '
    [ -f "'"$RUNS"'/$3/meta.json" ] || blocklab lab-job lr-run --norm "$0" --lr "$1" --seed "$2" \
        --out-dir "'"$RUNS"'/$3" >> "'"$RUNS"'/$3.log" 2>&1 || echo "$3 failed: see '"$RUNS"'/$3.log"'
