#!/usr/bin/env bash
# Issue 44, point 5: the extra seeds the claims table says would decide a claim, where a seed is cheap
# (docs/extra-seeds/cost.md: the plan, written before these runs). Two lanes at nice 15 beside the lab's runs:
#   scripts/issue44_seeds.sh a   # reverse copy seeds 3-7 (all variants, and 0-2 again: bit-identity with the gallery),
#                                # activation norms at init seed 3, then depth x lr seed 1, stratum lr 3e-3 no warm-up
#   scripts/issue44_seeds.sh b   # depth x lr seed 1, stratum lr 3e-3 warm-up 400, then lr 1e-3 no warm-up
# Resumable: a finished run (meta.json with status finished) is skipped, a started one resumes from its checkpoint
# (the study's own `blocklab sensitivity train`). Each finished depth run is recorded in git at once (the study's own
# `blocklab sensitivity snapshot`, into $SNAPSHOT; params.yaml's sensitivity.from_snapshots names it, and
# depth_lr.seeds gets 1, once every run of seed 1 is there: params.yaml refuses a snapshot that lacks planned runs).
set -euo pipefail
cd "$(dirname "$0")/.."
SNAPSHOT=records/sensitivity/depth_lr-s1   # the one place this path is written in the script
PARAMS=data/issue44-params.yaml  # params.yaml with the depth grid's seed 1 planned and the study trained, not read
# from snapshots (params.yaml refuses a snapshot that lacks planned runs: seed 1 enters it once every run is recorded)
mkdir -p data
python - <<'PY'
import yaml
params = yaml.safe_load(open("params.yaml"))
params["sensitivity"]["from_snapshots"] = []
params["sensitivity"]["depth_lr"]["seeds"] = [0, 1]
yaml.safe_dump(params, open("data/issue44-params.yaml", "w"), sort_keys=False)
PY
NICE="nice -n 15"
LOCK=/tmp/issue44-git.lock

finished() { [ -f "$1/meta.json" ] && grep -q '"status": "finished"' "$1/meta.json"; }

record_depth() {  # snapshot every finished seed-1 depth run, commit the snapshot (serialised by a lock)
  $NICE blocklab sensitivity snapshot --params "$PARAMS" --family depth_lr --out "$SNAPSHOT" --root data >/dev/null
  flock "$LOCK" git add "$SNAPSHOT"
  flock "$LOCK" git commit -q -m "issue 44 seeds: depth x lr seed 1, $1 finished (recorded by blocklab sensitivity snapshot)" -- "$SNAPSHOT" || true
}

depth_stratum() {  # lr warm-up: the 8 runs of one stratum (2 norms x 4 depths), the deepest first
  local lr=$1 warmup=$2
  for depth in 24 12 6 2; do
    for norm in post pre; do
      local cell="learned-b32-L${depth}-lr${lr}-fp32" run="${norm}-w${warmup}-s1"
      local dir="data/sensitivity/runs/${cell}/${run}"
      finished "$dir" && continue
      mkdir -p "$dir"
      $NICE blocklab sensitivity train --params "$PARAMS" --cell "$cell" --norm "$norm" --warmup "$warmup" --seed 1 \
        --threads 1 --out-dir "$dir" >>"$dir/train.log" 2>&1
      record_depth "${cell}/${run}"
    done
  done
}

reverse_copy() {
  for seed in 0 1 2 3 4 5 6 7; do
    for variant in classic rmsnorm swiglu rope modern; do
      local dir="data/reverse_copy/runs/${variant}-s${seed}"
      finished "$dir" && continue
      mkdir -p "$dir"
      $NICE blocklab exp train-reverse --params "$PARAMS" --variant "$variant" --seed "$seed" --threads 1 \
        --out-dir "$dir" >>"$dir/train.log" 2>&1
    done
  done
}

case "${1:-}" in
  rc) reverse_copy ;;   # the reverse copy alone (seeds 6-7 were added after the 6-seed table asked 7 and 8 per arm)
  a) reverse_copy
     $NICE blocklab exp activation-norms --params "$PARAMS" --out data/activation_norms/norms.csv
     depth_stratum 0.003 0 ;;
  b) depth_stratum 0.003 400
     depth_stratum 0.001 0 ;;
  *) echo "usage: $0 a|b|rc" >&2; exit 2 ;;
esac
