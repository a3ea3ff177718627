#!/usr/bin/env bash
# The runs that decide the chapter's inconclusive claims (docs/decide/plan.md: the plan, its order and its cost,
# written before these runs), from one queue, one lane a core:
#   scripts/decide_lanes.sh A &  scripts/decide_lanes.sh B &
# Each lane takes the next queued run that no lane holds (a run's lock is held while it trains and freed if its lane
# dies), trains it from a clone pinned at one commit (CLONE, default /work/decide-clone: edits in the working tree
# cannot change a run half-way; every run's meta.json names that commit), and records it in git as soon as it
# finishes (`blocklab lab-job record`, then a commit of that run's folder alone). Resumable: a finished run is
# skipped, a started one resumes from its checkpoint (the training's own resume).
# Queue lines: "lab NORM WARMUP SEED" (a built-in norm position at document 000's setup, `blocklab lab-job run-builtin`:
# the fixes, and pre and post, whose run is the sweep's run of that seed).
set -uo pipefail
LANE=${1:?lane name}
REPO=$(cd "$(dirname "$0")/.." && pwd)
CLONE=${CLONE:-/work/decide-clone}
RUNS=${RUNS:-$REPO/data/decide/runs}
QUEUE=${QUEUE:-$REPO/configs/decide_queue.txt}
LOCKS=$REPO/data/decide/locks
GITLOCK=/tmp/blocklab-decide-git.lock
mkdir -p "$RUNS" "$LOCKS"
[ -d "$CLONE/.git" ] || git clone -q "$REPO" "$CLONE"
export PYTHONPATH=$CLONE/src PATH=$REPO/.venv/bin:$PATH MPLBACKEND=Agg
log() { echo "$(date -u +%FT%TZ) lane $LANE: $*" >> "$REPO/data/decide/lanes.log"; }

grep -v '^#' "$QUEUE" | while read -r kind norm warmup seed; do
  [ -n "$kind" ] || continue
  run="$norm-w$warmup-s$seed"
  [ -f "$REPO/records/lab/runs/$run/meta.json" ] && continue   # recorded in git already
  exec 9>"$LOCKS/$run.lock"
  flock -n 9 || continue                                         # another lane holds it
  if [ ! -f "$RUNS/$run/meta.json" ]; then
    log "start $run"
    (cd "$CLONE" && blocklab lab-job run-builtin --norm "$norm" --warmup "$warmup" --seed "$seed" \
        --out-dir "$RUNS/$run" >> "$RUNS/$run.log" 2>&1) || { log "failed $run (see $RUNS/$run.log)"; exec 9>&-; continue; }
  fi
  log "finished $run"
  (cd "$REPO" && flock "$GITLOCK" sh -c "blocklab lab-job record --runs '$RUNS' >/dev/null 2>>'$REPO/data/decide/lanes.log' &&
      git add 'records/lab/runs/$run' docs/lab/STATUS.md && git commit -q -m 'decide: lab run $run recorded (blocklab lab-job record)' -- 'records/lab/runs/$run' docs/lab/STATUS.md") \
    && log "recorded $run" || log "record failed $run"
  exec 9>&-
done
log "queue empty"
