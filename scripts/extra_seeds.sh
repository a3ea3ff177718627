#!/usr/bin/env bash
# The extra seeds the claims table says would decide a claim, where a seed is cheap
# (docs/extra-seeds/cost.md: the plan, written before these runs). Two lanes at nice 15 beside the lab's runs:
#   scripts/extra_seeds.sh a   # reverse copy seeds 3-7 (all variants, and 0-2 again: bit-identity with the gallery),
#                                # activation norms at init seed 3, then depth x lr seed 1, stratum lr 3e-3 no warm-up
#   scripts/extra_seeds.sh b   # depth x lr seed 1, stratum lr 3e-3 warm-up 400, then lr 1e-3 no warm-up
#   scripts/extra_seeds.sh gap # d000-depth-gap's minimal list alone (docs/extra-seeds/cost.md): seed 1 of the three
#                                # strata whose gap moved with depth at seed 0 (lr 3e-3 warm-up 400, lr 3e-3 and lr 1e-3
#                                # without), 24 runs; run it twice, one per core: both lanes take runs from one queue
#   scripts/extra_seeds.sh seed1 # the whole seed 1 of the depth grid (48 runs: docs/extra-seeds/cost.md, the decision
#                                # of 2026-12-05 07:20 UTC), the same queue, the three moving strata first; twice, one per core
#   scripts/extra_seeds.sh gn  # the gradient at init, seeds 0-8 (3-8 new; 0-2 must equal the gallery's), the document's
#                                # and the sensitivity study's, recorded into the gallery and re-judged (minutes)
#   scripts/extra_seeds.sh rc24 # d004-swiglu-ppl's 24 seeds per arm: reverse copy seed 0 again (rc24-check: against the
#                                # gallery's rows), then seeds 8-23 of every variant (docs/extra-seeds/cost.md)
# Resumable: a finished run (meta.json with status finished) is skipped, a started one resumes from its checkpoint
# (the study's own `blocklab sensitivity train`). Each finished depth run is recorded in git at once (the study's own
# `blocklab sensitivity snapshot`, into $SNAPSHOT; params.yaml's sensitivity.from_snapshots names it, and
# depth_lr.seeds gets 1, once every run of seed 1 is there: params.yaml refuses a snapshot that lacks planned runs).
set -euo pipefail
cd "$(dirname "$0")/.."
SNAPSHOT=records/sensitivity/depth_lr-s1   # the one place this path is written in the script
PARAMS=data/extra-seeds-params.yaml  # params.yaml with the depth grid's seed 1 planned and the study trained, not read
# from snapshots (params.yaml refuses a snapshot that lacks planned runs: seed 1 enters it once every run is recorded)
mkdir -p data
python - <<'PY'
import yaml
params = yaml.safe_load(open("params.yaml"))
params["sensitivity"]["from_snapshots"] = []
params["sensitivity"]["depth_lr"]["seeds"] = [0, 1]
yaml.safe_dump(params, open("data/extra-seeds-params.yaml", "w"), sort_keys=False)
PY
NICE="nice -n 15"
LOCK=/tmp/blocklab-extra-seeds-git.lock

finished() { [ -f "$1/meta.json" ] && grep -q '"status": "finished"' "$1/meta.json"; }
# the 24-block lr 1e-3 cell's seed 1 is the batch-32 main sweep's, in git (`blocklab sensitivity snapshot --from-sweep`,
# records/sensitivity/depth_lr-s1-main-sweep/README.md): recorded there, never trained here
SWEEP_SNAPSHOT=records/sensitivity/depth_lr-s1-main-sweep
in_sweep_snapshot() { [ -f "$SWEEP_SNAPSHOT/runs.csv" ] && grep -q "^$1,$2," "$SWEEP_SNAPSHOT/runs.csv"; }

record_depth() {  # snapshot every finished seed-1 depth run, commit the snapshot (serialised by a lock)
  $NICE blocklab sensitivity snapshot --params "$PARAMS" --family depth_lr --out "$SNAPSHOT" --root . >/dev/null
  flock "$LOCK" git add "$SNAPSHOT"
  flock "$LOCK" git commit -q -m "extra seeds: depth x lr seed 1, $1 finished (recorded by blocklab sensitivity snapshot)" -- "$SNAPSHOT" || true
}

depth_stratum() {  # lr warm-up: the 8 runs of one stratum (2 norms x 4 depths), the deepest first
  local lr=$1 warmup=$2
  for depth in 24 12 6 2; do
    for norm in post pre; do
      local cell="learned-b32-L${depth}-lr${lr}-fp32" run="${norm}-w${warmup}-s1"
      local dir="data/sensitivity/runs/${cell}/${run}"
      { finished "$dir" || in_sweep_snapshot "$cell" "$run"; } && continue
      mkdir -p "$dir"
      $NICE blocklab sensitivity train --params "$PARAMS" --cell "$cell" --norm "$norm" --warmup "$warmup" --seed 1 \
        --threads 1 --out-dir "$dir" >>"$dir/train.log" 2>&1
      record_depth "${cell}/${run}"
    done
  done
}

gap_queue() {  # a list of strata ("lr warm-up" each; default: the depth claim's three moving strata) as one queue:
  # each lane takes the next run no lane holds (a run's lock is held while it trains and freed if its lane dies; a
  # finished run is skipped, a started one resumes from its checkpoint); strata in the order given (a stratum counts
  # once its 8 runs are done), the deepest depth first within each
  local lr warmup depth norm cell run dir stratum
  local strata=("$@")
  [ ${#strata[@]} -gt 0 ] || strata=("0.003 400" "0.003 0" "0.001 0")
  for stratum in "${strata[@]}"; do
    read -r lr warmup <<<"$stratum"
    for depth in 24 12 6 2; do
      for norm in post pre; do
        cell="learned-b32-L${depth}-lr${lr}-fp32" run="${norm}-w${warmup}-s1"
        dir="data/sensitivity/runs/${cell}/${run}"
        { finished "$dir" || in_sweep_snapshot "$cell" "$run"; } && continue
        mkdir -p "$dir"
        mkdir -p data/extra-seeds-locks
        exec 9>"data/extra-seeds-locks/${cell}-${run}.lock"
        if flock -n 9; then
          finished "$dir" || {
            $NICE blocklab sensitivity train --params "$PARAMS" --cell "$cell" --norm "$norm" --warmup "$warmup" \
              --seed 1 --threads 1 --out-dir "$dir" >>"$dir/train.log" 2>&1
            record_depth "${cell}/${run}"
          }
        fi
        exec 9>&-
      done
    done
  done
}

reverse_copy() {  # RC_SEEDS (default 0-7) of every variant into RC_RUNS (default data/reverse_copy/runs)
  for seed in ${RC_SEEDS:-0 1 2 3 4 5 6 7}; do
    for variant in classic rmsnorm swiglu rope modern; do
      local dir="${RC_RUNS:-data/reverse_copy/runs}/${variant}-s${seed}"
      finished "$dir" && continue
      mkdir -p "$dir"
      $NICE blocklab exp train-reverse --params "$PARAMS" --variant "$variant" --seed "$seed" --threads 1 \
        --out-dir "$dir" >>"$dir/train.log" 2>&1
    done
  done
}

gradnorm_seeds() {  # GN_SEEDS seeds (default 9: the count the claims table named for both d000-gradnorm-* claims,
  # fixed beforehand; 16: the count it named for d000-gradnorm-pre-flat once a value's off world was bounded by half
  # the value, docs/decide/plan.md)
  local gp=data/extra-seeds-gradnorm-params.yaml study=data/extra-seeds-study n=${GN_SEEDS:-9}
  GN_SEEDS=$n python - <<'PY'
import os
import yaml
from blocklab.records import GALLERY
params = yaml.safe_load(open(f"{GALLERY}/params.yaml"))  # the gallery's setup
params["gradnorm"]["seeds"] = list(range(int(os.environ["GN_SEEDS"])))
yaml.safe_dump(params, open("data/extra-seeds-gradnorm-params.yaml", "w"), sort_keys=False)
PY
  $NICE blocklab exp gradnorm --params "$gp" --out data/gradnorm/gradnorm.csv
  $NICE blocklab sensitivity gradnorm --params "$gp" --out data/sensitivity/gradnorm.csv
  python - <<'PY'  # seeds 0-2 computed again must be the gallery's rows, byte for byte
import pandas as pd
from blocklab.records import GALLERY
for table in ("gradnorm/gradnorm.csv", "sensitivity/gradnorm.csv"):
    old, new = pd.read_csv(f"{GALLERY}/{table}"), pd.read_csv(f"data/{table}")
    again = new[new["seed"].isin(old["seed"].unique())].reset_index(drop=True)
    pd.testing.assert_frame_equal(old, again, check_exact=True)
    print(f"{table}: seeds {sorted(old['seed'].unique())} identical; seeds now {sorted(new['seed'].unique())}")
PY
  mkdir -p "$study/data/sensitivity"
  cp data/sensitivity/gradnorm.csv "$study/data/sensitivity/gradnorm.csv"
  # the study's tables again from its snapshots in git, with the 9-seed gradient table (the gallery README's recipe)
  $NICE blocklab sensitivity aggregate --params "$gp" --root "$study" \
    --from $(python -c "import yaml; print(' '.join(yaml.safe_load(open('$gp'))['sensitivity']['from_snapshots']))")
  cmp "$study/data/sensitivity/summary.csv" records/gallery/sensitivity/summary.csv  # no run changed
  $NICE python scripts/record_into_gallery.py data/gradnorm/gradnorm.csv:gradnorm/gradnorm.csv \
    data/sensitivity/gradnorm.csv:sensitivity/gradnorm.csv \
    "$study/data/sensitivity/claims_by_setting.csv:sensitivity/claims_by_setting.csv" \
    --gradnorm-seeds "$(seq -s, 0 $((n - 1)))" \
    --note "seeds up to $((n - 1)) added by GN_SEEDS=$n scripts/extra_seeds.sh gn; the earlier seeds recomputed bit-identical"
  $NICE blocklab report claims --params records/gallery/params.yaml --data records/gallery --out data/extra-seeds-claims.csv
  $NICE python scripts/record_into_gallery.py data/extra-seeds-claims.csv:claims/claims.csv
}

finish() {  # once every seed-1 run is in git (the snapshot above and the sweep's): params.yaml and the gallery's plan
  # seed 1 and read both snapshots (refused, naming the missing runs, while any is missing); the gallery's study tables
  # re-aggregated from every snapshot in git (the gallery README's recipe), its claims re-judged, the pages rewritten.
  # Then by hand: params.yaml's comment on how many runs are in git, the sensitivity figures of docs/gallery, commit.
  local study=data/extra-seeds-finish
  $NICE python scripts/record_into_gallery.py --depth-seed1 --note "the depth grid's seed 1 (scripts/extra_seeds.sh)"
  $NICE blocklab sensitivity plan --params records/gallery/params.yaml --out "$study-plan.csv"
  rm -rf "$study" && mkdir -p "$study/data/sensitivity"
  cp records/gallery/sensitivity/gradnorm.csv "$study/data/sensitivity/gradnorm.csv"
  $NICE blocklab sensitivity aggregate --params records/gallery/params.yaml --root "$study" \
    --from $(python -c "import yaml; print(' '.join(yaml.safe_load(open('records/gallery/params.yaml'))['sensitivity']['from_snapshots']))")
  $NICE python scripts/record_into_gallery.py "$study-plan.csv:sensitivity/plan.csv" \
    "$study/data/sensitivity/summary.csv:sensitivity/summary.csv" \
    "$study/data/sensitivity/claims_by_setting.csv:sensitivity/claims_by_setting.csv"
  $NICE blocklab report claims --params records/gallery/params.yaml --data records/gallery --out data/extra-seeds-claims.csv
  $NICE python scripts/record_into_gallery.py data/extra-seeds-claims.csv:claims/claims.csv
  $NICE blocklab docs
  $NICE blocklab docs --check
}

case "${1:-}" in
  rc24) # d004-swiglu-ppl's 24 seeds per arm (docs/extra-seeds/cost.md, written before): seed 0 again (the check
        # against the gallery's rows on another processor), then seeds 8-23; one process at nice 5 beside the decide lanes
        NICE="nice -n 5" RC_RUNS=data/extra-seeds/reverse_copy RC_SEEDS="0 $(seq -s ' ' 8 23)" reverse_copy ;;
  rc24-check) # seed 0 trained here against the gallery's rows, with the bounds docs/extra-seeds/cost.md fixed before
        # the runs: first-step loss within 1e-4 relative (float32 rounding of one forward pass, about 1e-6), final loss
        # within 5 % relative (100 Adam steps carry rounding forward; a wrong setup moves it by tens of percent)
        R=data/extra-seeds/reverse_copy
        blocklab exp aggregate-reverse --runs $(for v in classic rmsnorm swiglu rope modern; do echo "$R/$v-s0"; done) \
          --out-losses data/extra-seeds/rc_s0_losses.csv --out-summary data/extra-seeds/rc_s0_summary.csv >/dev/null
        python - <<'PY'
import pandas as pd
from blocklab.records import GALLERY
old_s, new_s = pd.read_csv(f"{GALLERY}/reverse_copy/summary.csv"), pd.read_csv("data/extra-seeds/rc_s0_summary.csv")
old_l, new_l = pd.read_csv(f"{GALLERY}/reverse_copy/losses.csv"), pd.read_csv("data/extra-seeds/rc_s0_losses.csv")
s = old_s[old_s["seed"] == 0].merge(new_s, on=["run", "variant", "seed"], suffixes=("_gallery", "_here"))
first = old_l[(old_l["seed"] == 0) & (old_l["step"] == 1)].merge(new_l[new_l["step"] == 1], on="run",
                                                                   suffixes=("_gallery", "_here"))
assert len(s) == 5 and len(first) == 5, "seed 0 of all five variants is needed"
first_rel = (first["loss_here"] / first["loss_gallery"] - 1).abs()
final_rel = (s["final_loss_here"] / s["final_loss_gallery"] - 1).abs()
for run, a, b in zip(s["run"], first_rel, final_rel):
    print(f"{run}: first-step loss relative difference {a:.2e}, final loss {b:.2e}")
same = (s["n_params_here"] == s["n_params_gallery"]).all() and (s["outcome_here"] == s["outcome_gallery"]).all()
ok = first_rel.max() <= 1e-4 and final_rel.max() <= 0.05 and same
print("accepted" if ok else "REFUSED: no seed is recorded")
raise SystemExit(0 if ok else 1)
PY
        ;;
  rc) reverse_copy ;;   # the reverse copy alone (seeds 6-7 were added after the 6-seed table asked 7 and 8 per arm)
  a) reverse_copy
     $NICE blocklab exp activation-norms --params "$PARAMS" --out data/activation_norms/norms.csv
     depth_stratum 0.003 0 ;;
  b) depth_stratum 0.003 400
     depth_stratum 0.001 0 ;;
  gn) gradnorm_seeds ;;
  gap) gap_queue ;;
  finish) finish ;;
  seed1) gap_queue "0.003 400" "0.003 0" "0.001 0" "0.0003 0" "0.0003 400" "0.001 400" ;;  # the whole seed 1: 48 runs
  *) echo "usage: $0 a|b|rc|rc24|rc24-check|gn|gap|seed1|finish" >&2; exit 2 ;;
esac
