#!/usr/bin/env bash
# Two training lanes of the default cell (learned positions, batch 64, diagnostics every step), run from a clone
# pinned at one commit (/work/run33); each run resumes from its checkpoint, a finished run (meta.json) is skipped.
# Usage: scripts/train_default_lanes.sh A|B [PID to wait for first]. Order: the post-norm + warm-up pair (s0, s1) first, then the held-out
# pre-norm runs (seeds 3-5, 300 steps, both lanes), then the rest of the sweep.
cd /work/run33
export PYTHONPATH=/work/run33/src PATH=/work/main/.venv/bin:$PATH MPLBACKEND=Agg
CELL=learned-b64-L24-lr0.001-fp32
run() {  # kind norm warmup seed
  local kind=$1 norm=$2 warmup=$3 seed=$4 dir
  if [ "$kind" = sweep ]; then dir=data/sweep/runs/$norm-w$warmup-s$seed; else dir=data/inference/runs/$CELL/$norm-w$warmup-s$seed; fi
  [ -f "$dir/meta.json" ] && return 0
  mkdir -p "$dir"; echo "$(date +%T) start $kind $dir" >> logs/lanes.log
  if [ "$kind" = sweep ]; then
    blocklab sweep train --params params-lanes.yaml --norm $norm --warmup $warmup --seed $seed --threads 1 --out-dir $dir 2>> $dir/train.log
  else
    blocklab inference train --params params-holdout.yaml --cell $CELL --norm $norm --warmup $warmup --seed $seed --threads 1 --out-dir $dir 2>> $dir/train.log
  fi
  echo "$(date +%T) end($?) $kind $dir" >> logs/lanes.log
}
[ -n "$2" ] && while kill -0 "$2" 2>/dev/null; do sleep 10; done
if [ "$1" = A ]; then
  run sweep post 400 0; run holdout pre 0 3; run holdout pre 0 5; run sweep post 400 2; run sweep pre 0 1; run sweep post 0 0; run sweep pre 400 0; run sweep post 0 2; run sweep pre 400 2
else
  run sweep post 400 1; run holdout pre 0 4; run sweep pre 0 0; run sweep pre 0 2; run sweep post 0 1; run sweep pre 400 1
fi
