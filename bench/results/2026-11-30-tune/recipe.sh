#!/usr/bin/env bash
# The H200 tuning session of issue 4 in one command, inside a time budget:
#   1. `moetune tune` (fast search, 18 batch sizes) for Qwen3-30B-A3B TP1 and Mixtral-8x7B TP2;
#      a tune cut off by its time limit is resumed from its results store with the time left;
#   2. `moetune benchmark`: default config vs our file vs vLLM's published H200 file, same harness;
#   3. bench/search.py: fast vs exhaustive search, cold, Mixtral TP2 at M=1 and 64 (the smallest
#      pruned spaces), with the time left.
# Everything lands in $WORK and is packed into $OUT/h200.tar.gz after every step (the device
# tool returns only a few plainly named files).
#
# Usage: OUT=/some/dir bash bench/results/2026-11-30-tune/recipe.sh [BUDGET_S]
# (QWEN_MODEL, MIXTRAL_MODEL, TUNE_EXTRA, BENCH_EXTRA and SEARCH_SIZES override the defaults, for a CPU rehearsal.)
set -u
BUDGET=${1:-530}
OUT=${OUT:-/tmp/tune-run}
WORK=${WORK:-/tmp/moetune-h200}
mkdir -p "$OUT" "$WORK"
START=$SECONDS
export PYTHONUNBUFFERED=1

QWEN=(--model "${QWEN_MODEL:-Qwen/Qwen3-30B-A3B}" --tp 1)
MIXTRAL=(--model "${MIXTRAL_MODEL:-mistralai/Mixtral-8x7B-v0.1}" --tp 2)
QWEN_FILE=${QWEN_FILE:-"E=128,N=768,device_name=NVIDIA_H200.json"}
MIXTRAL_FILE=${MIXTRAL_FILE:-"E=8,N=7168,device_name=NVIDIA_H200.json"}
read -r -a EXTRA <<<"${TUNE_EXTRA:-}"
read -r -a BENCH_EXTRA <<<"${BENCH_EXTRA:-}"
read -r -a SIZES <<<"${SEARCH_SIZES:---batch-size 1 --batch-size 64}"

left() { echo $((BUDGET - (SECONDS - START))); }
pack() {
    tar czf "$OUT/h200.tar.gz" --exclude=triton-cache --exclude="*.lock" -C "$WORK" . 2>/dev/null
    cp "$WORK/steps.txt" "$OUT/steps.txt"
}
step() { # step NAME LIMIT_S COMMAND...: run with a time limit (SIGINT first: the tuner exits cleanly)
    local name=$1 limit=$2
    shift 2
    if [ "$limit" -lt 15 ]; then
        echo "$name skipped (no time left)" | tee -a "$WORK/steps.txt"
        return 1
    fi
    local t0=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" >"$WORK/$name.json" 2>"$WORK/$name.log"
    local rc=$?
    echo "$name rc=$rc wall=$((SECONDS - t0))s limit=${limit}s" | tee -a "$WORK/steps.txt"
    pack
    return $rc
}

{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    nproc
} >"$WORK/machine.txt" 2>&1
: >"$WORK/steps.txt"

step qwen-tune 200 python3 -m moetune tune "${QWEN[@]}" --save-dir "$WORK/qwen3-30b-tp1" --json "${EXTRA[@]}"
qwen_rc=$?
step mixtral-tune 170 python3 -m moetune tune "${MIXTRAL[@]}" --save-dir "$WORK/mixtral-8x7b-tp2" --json "${EXTRA[@]}"
mixtral_rc=$?
if [ $qwen_rc -ne 0 ]; then
    step qwen-tune-resumed $(($(left) - 120)) python3 -m moetune tune "${QWEN[@]}" \
        --save-dir "$WORK/qwen3-30b-tp1" --json "${EXTRA[@]}"
fi
if [ $mixtral_rc -ne 0 ]; then
    step mixtral-tune-resumed $(($(left) - 90)) python3 -m moetune tune "${MIXTRAL[@]}" \
        --save-dir "$WORK/mixtral-8x7b-tp2" --json "${EXTRA[@]}"
fi

step qwen-bench 35 python3 -m moetune benchmark "${QWEN[@]}" \
    --config "$WORK/qwen3-30b-tp1/$QWEN_FILE" --config "bench/vllm_configs/$QWEN_FILE" --json "${BENCH_EXTRA[@]}"
step mixtral-bench 35 python3 -m moetune benchmark "${MIXTRAL[@]}" \
    --config "$WORK/mixtral-8x7b-tp2/$MIXTRAL_FILE" --config "bench/vllm_configs/$MIXTRAL_FILE" --json "${BENCH_EXTRA[@]}"

step search $(($(left) - 5)) python3 bench/search.py "${MIXTRAL[@]}" "${SIZES[@]}" \
    --out "$WORK/search" --budget-s $(($(left) - 25))
echo "total wall=$((SECONDS - START))s" | tee -a "$WORK/steps.txt"
pack
