#!/usr/bin/env bash
# The stability lab's recorded runs at document 000's setup (docs/lab.md, docs/lab/cost.md): every built-in fix for
# post-norm without warm-up, seeds 0-3 (8 decide each literature claim at its off world, one run in five failing:
# docs/doc000.md#claims), seed 0 of each first (WARMUPS=400 SEEDS=0: the warm-up arm's first seed); two at a time on
# 2 cores. Resumable: a finished run is
# skipped, a killed one resumes from its checkpoint (in LAB_RUNS, default data/lab-record/runs). Then records them
# (where lab.records.RUNS reads them) and regenerates what is made from them (`blocklab docs`: the tables, the
# literature's claims in the gallery's claims table, the gallery's lab figure):
#   bash scripts/train_lab_runs.sh && git add docs records README.md && git commit -m "lab: runs recorded"
# NORMS="b2t" WARMUPS="0 400" SEEDS="0 1 2 3": one fix alone (B2T at its authors' initialization: seeds 0-3 without
# warm-up decide its claim, 0-2 with warm-up 400 are its paper's own setting).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${LAB_RUNS:-data/lab-record/runs}
mkdir -p "$RUNS"
for warmup in ${WARMUPS:-0}; do for seed in ${SEEDS:-0 1 2 3}; do for norm in ${NORMS:-deepnorm admin b2t rezero sandwich}; do
  echo "$norm $warmup $seed"; done; done; done |
  xargs -P "${JOBS:-2}" -L 1 bash -c '
    run="$0-w$1-s$2"
    [ -f "'"$RUNS"'/$run/meta.json" ] || blocklab lab-job run-builtin --norm "$0" --warmup "$1" --seed "$2" \
        --out-dir "'"$RUNS"'/$run" >> "'"$RUNS"'/$run.log" 2>&1 || echo "$run failed: see '"$RUNS"'/$run.log"'
blocklab lab-job record --runs "$RUNS"
blocklab docs
