#!/usr/bin/env bash
# GPU check: on a CUDA machine, in at most ~9.5 minutes, write one results file with
#   1. the machine (nvidia-smi, torch, bf16 support),
#   2. the 12-run sweep of params.yaml through the package's own training command (`blocklab sweep train-group`, the
#      GPU layout that sweep.batched: auto picks on CUDA; both norm positions side by side, as `snakemake --cores 2`
#      runs them), with its wall time, fp32 then bf16 (sweep.precision), and each run's outcome,
#   3. the tests that exercise CUDA (tests/test_precision.py: bf16 vs fp32 on CUDA, batched members vs per-run jobs),
#   4. `blocklab bench` on CUDA: per-run plain and peer loops vs the batched (vmapped) model in fp32 and bf16, then
#      the batched model under torch.compile (compile time counts).
# Without CUDA it stops at once, exit status 3, saying so. Each step has its own time limit inside a total budget, so
# a slow or failing step cannot lose the others' results.
#
#   bash scripts/gpu_check.sh wheels    # here, where pip reaches a registry: the wheels the GPU machine lacks -> .whl/
#   bash scripts/gpu_check.sh           # there (with .whl/ copied along); results in $OUT/gpu_check.txt
#   make gpu-check                      # the same as the line above
#
# The GPU machine it was written for has its own python3 with a CUDA PyTorch, pandas, PyYAML, safetensors, tqdm and pytest, but no
# registry: jsonschema and its three dependencies travel as wheels in .whl/ (git-ignored), installed with --no-index.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-${PY:-python3}}
BUDGET=${GPU_CHECK_BUDGET:-570}   # seconds for the whole check (that machine allows 600 a command)
# Knobs for a plumbing test of this script on a CPU (GPU_CHECK_DEVICE=cpu GPU_CHECK_PARAMS=configs/tiny.yaml
# GPU_CHECK_RUNS=2 GPU_CHECK_STEPS=2): it then says loudly that it is not a GPU check.
DEVICE=${GPU_CHECK_DEVICE:-cuda} PARAMS=${GPU_CHECK_PARAMS:-params.yaml}
RUNS=${GPU_CHECK_RUNS:-12} STEPS=${GPU_CHECK_STEPS:-20}
export PARAMS
WHEELS="jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1"

if [ "${1:-}" = wheels ]; then
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $WHEELS
fi

if [ "${1:-}" = _sweep ]; then  # internal: one precision's sweep (a separate process, so that `timeout` can stop it)
    precision=$2 params="$WORK/params-$2.yaml" runs="$WORK/sweep-$2"
    trap 'kill $(jobs -p) 2> /dev/null' EXIT
    sed -E "s/^(  precision: )fp32/\1$precision/" "$PARAMS" > "$params"
    grep -q "^  precision: $precision" "$params" || { echo "could not set sweep.precision=$precision"; exit 2; }
    began=$(date +%s.%N)
    for norm in post pre; do
        "$PY" -m blocklab.cli sweep train-group --params "$params" --norm "$norm" --threads 1 --out-root "$runs" \
            > "$WORK/train-$precision-$norm.log" 2>&1 &
    done
    rc=0; wait -n || rc=$?; wait -n || rc=$?
    ended=$(date +%s.%N)
    tail -n 7 "$WORK"/train-"$precision"-*.log
    [ "$rc" = 0 ] || { echo "a train-copy-group job failed (exit $rc)"; exit "$rc"; }
    "$PY" -m blocklab.cli sweep aggregate --runs "$runs"/* --out-losses "$WORK/losses-$precision.csv" \
        --out-summary "$WORK/summary-$precision.csv" || exit $?
    exec "$PY" - "$WORK/summary-$precision.csv" "$began" "$ended" "$precision" <<'EOF2'
import sys, pandas as pd
summary, began, ended, precision = pd.read_csv(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(summary[["run", "outcome", "final_loss", "min_loss", "diverged_step", "wall_time_s"]].to_string(index=False))
print(f"SWEEP {precision}: {len(summary)} runs in {ended - began:.1f} s wall (2 train-copy-group jobs side by side,"
      f" process start and imports included); target on an H200: <= 30 s")
EOF2
fi

RESULTS_DIR=${OUT:-performance/results/gpu-check}
mkdir -p "$RESULTS_DIR"
RESULT="$RESULTS_DIR/gpu_check.txt"
: > "$RESULT"
export WORK PY; WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
say() { echo "$*" | tee -a "$RESULT"; }
left() { echo $(( BUDGET - SECONDS )); }
cap() { local want=$1 rest; rest=$(( $(left) - 5 )); [ "$rest" -lt "$want" ] && want=$rest; [ "$want" -lt 1 ] && want=1; echo "$want"; }
step() {  # step NAME SECONDS COMMAND...: run with a time limit, everything into the results file
    local name=$1 limit; limit=$(cap "$2"); shift 2
    say ""
    say "=== $name (limit ${limit} s, $(left) s of the budget left) ==="
    local began=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$RESULT"
    local rc=${PIPESTATUS[0]}
    echo >> "$RESULT"
    say "=== $name: exit $rc$([ "$rc" = 124 ] && echo ' (time limit)') after $(( SECONDS - began )) s ==="
    return "$rc"
}

say "gpu-check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src modified)')"
# 1. CUDA or stop here.
[ "$DEVICE" != cuda ] && say "gpu-check: PLUMBING TEST on $DEVICE with $PARAMS: not a GPU check, its numbers mean nothing"
if [ "$DEVICE" = cuda ] && ! "$PY" - <<'EOF' 2>&1 | tee -a "$RESULT"; then
import sys
try:
    import torch
except ImportError as err:
    sys.exit(f"gpu-check: FAILED: no CUDA: PyTorch is not importable here ({err})")
if not torch.cuda.is_available():
    sys.exit(f"gpu-check: FAILED: no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__},"
             f" built for CUDA {torch.version.cuda}); this check needs a CUDA GPU")
EOF
    say "gpu-check: stopped: no CUDA (see the line above); results in $RESULT"
    rm -rf "$WORK"
    exit 3
fi
if ! "$PY" -c "import jsonschema" 2> /dev/null && ls .whl/*.whl > /dev/null 2>&1; then  # the wheels travel in .whl/
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
        2>&1 | tail -3 | tee -a "$RESULT"
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
BL=("$PY" -m blocklab.cli)
if ! "$PY" - <<'EOF' 2>&1 | tee -a "$RESULT"; then
import torch
import jsonschema, yaml  # the package's own needs: a missing one is named here, not deep inside a step
from blocklab.training.precision import bf16_support
if not torch.cuda.is_available():
    raise SystemExit(0)  # plumbing test
p = torch.cuda.get_device_properties(0)
print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs; torch {torch.__version__}"
      f" (CUDA {torch.version.cuda}); bf16: {bf16_support('cuda')[1]}; TF32 matmul allowed:"
      f" {torch.backends.cuda.matmul.allow_tf32} (fp32 lanes are strict fp32)")
EOF
    say "gpu-check: stopped: a package the check needs is missing (see above; bash scripts/gpu_check.sh wheels, carry .whl)"
    rm -rf "$WORK"
    exit 4
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv 2>&1 | tee -a "$RESULT"

# 2. The 12-run sweep (params.yaml: sweep.steps per run) through the package's training command, both norm positions
#    at once; the wall time is the check's headline (target on an H200: <= 30 s).
step "sweep fp32 (12 runs, blocklab sweep train-group)" 170 bash "$0" _sweep fp32

# 3. The tests that exercise CUDA (plus the precision tests that need no GPU).
step "tests (tests/test_precision.py)" 120 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_precision.py

# 4. Bench lanes on CUDA, fp32 and bf16.
step "bench: plain and peer per run vs batched fp32 / bf16" 130 \
    "${BL[@]}" bench --params "$PARAMS" --device "$DEVICE" --runs "$RUNS" --warmup-steps 3 --steps "$STEPS" --peak-seconds 2

step "sweep bf16 (12 runs, sweep.precision: bf16)" 120 bash "$0" _sweep bf16

step "bench: batched under torch.compile" 110 \
    "${BL[@]}" bench --params "$PARAMS" --device "$DEVICE" --runs "$RUNS" --warmup-steps 3 --steps "$STEPS" --peak-seconds 1 \
    --compile --no-peer --no-bf16

say ""
headline=$(grep -h "^SWEEP \|vs the fastest baseline\|^bf16 vs fast" "$RESULT" | sed 's/^/summary: /')
say "$headline"
say "gpu-check: done in ${SECONDS} s; results in $RESULT"
rm -rf "$WORK"
