#!/usr/bin/env bash
# Issue 8 on one H200, inside a time budget (default 500 s of the 9 minutes):
#   whole call of SGLang's split up/down pair vs the best single config (what vLLM gets),
#   same harness (`moetune tune --engine sglang`, the "pair" timings of its store), for
#     qwen   Qwen3-30B-A3B TP1 bf16        (E=128, N=768,  K=2048, top-8)
#     dsv3   DeepSeek-V3 TP8 fp8 block     (E=256, N=256,  K=7168, top-8, [128, 128])
#     e256   DeepSeek-V3 TP4 --dtype bf16  (E=256, N=512,  K=7168, top-8)
#     q35    Qwen3.5-35B-A3B TP1 bf16      (E=256, N=512,  K=2048, top-8: the E/N of SGLang PR #34150,
#            whose 394 us at M=512 fits K=2048, not K=7168's 1.2 ms floor)
#   and one `moetune tune --engine sglang` of Qwen3-30B TP1 with --routing from a skewed
#   synthetic dump (generated here), with its wall time.
#
# What is cut to fit: the search space, narrowed to 20 (bf16) and 18 (fp8 block) configs taken
# from vLLM's and SGLang's published H200 files, spread over BLOCK_SIZE_M 16..128
# (space_{bf16,fp8}.json beside this script; under 40 candidates fast search times them all at
# full fidelity, each as the whole call, the up GEMM, the down GEMM and the down GEMM with TMA),
# instead of 1,920; and the batch sizes run in two groups
# per shape: M >= 512 first (where the down GEMM dominates and the issue's target lies), then
# M < 512 with the time left. A group cut by its limit keeps its measurements in the store
# (rerun the same command to resume) but writes no files and no pair rows for that group.
#
# Usage: OUT=/some/dir bash bench/results/2026-12-01-h200-session/split-pair/recipe.sh [BUDGET_S]
# Results: $OUT/report.md (the report, rewritten after every step), $OUT/split-pair.tar.gz
# (stores, summaries, logs, written config files), $OUT/steps.txt.
set -u
BUDGET=${1:-500}
OUT=${OUT:-/tmp/split-pair-run}
WORK=${WORK:-/tmp/moetune-split-pair}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" "$WORK"
START=$SECONDS
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
read -r -a EXTRA <<<"${TUNE_EXTRA:-}"

BIG=(--batch-size 512 --batch-size 1024 --batch-size 1536 --batch-size 2048 --batch-size 3072 --batch-size 4096)
SMALL=()
for m in 1 2 4 8 16 24 32 48 64 96 128 256; do SMALL+=(--batch-size "$m"); done
QWEN=(--model "${QWEN_MODEL:-Qwen/Qwen3-30B-A3B}" --tp 1 --space "$HERE/space_bf16.json")
DSV3=(--model "${DSV3_MODEL:-deepseek-ai/DeepSeek-V3}" --tp 8 --space "$HERE/space_fp8.json")
E256=(--model "${DSV3_MODEL:-deepseek-ai/DeepSeek-V3}" --tp 4 --dtype bf16 --space "$HERE/space_bf16.json")
Q35=(--model "${Q35_MODEL:-Qwen/Qwen3.5-35B-A3B}" --tp 1 --space "$HERE/space_bf16.json")

left() { echo $((BUDGET - (SECONDS - START))); }
report() {
    $PY "$HERE/report.py" "$WORK" >"$OUT/report.md" 2>"$WORK/report.log"
    tar czf "$OUT/split-pair.tar.gz" --exclude="*.lock" -C "$WORK" . 2>/dev/null
    cp "$WORK/steps.txt" "$OUT/steps.txt"
}
step() { # step NAME LIMIT_S ARGS...: `moetune tune ARGS --json` with a time limit (SIGINT first)
    local name=$1 limit=$2
    shift 2
    local have
    have=$(left)
    [ "$limit" -gt "$have" ] && limit=$have
    if [ "$limit" -lt 20 ]; then
        echo "$name skipped (no time left)" | tee -a "$WORK/steps.txt"
        return 1
    fi
    local t0=$SECONDS
    timeout --signal=INT --kill-after=10 "$limit" $PY -m moetune tune --engine sglang --json "$@" \
        "${EXTRA[@]}" >"$WORK/$name.json" 2>"$WORK/$name.log"
    local rc=$?
    echo "$name rc=$rc wall=$((SECONDS - t0))s limit=${limit}s" | tee -a "$WORK/steps.txt"
    report
    return $rc
}

{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
    $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    nproc
} >"$WORK/machine.txt" 2>&1
touch "$WORK/steps.txt"
if ! $PY -c "import click, yaml, jsonschema, rich, filelock, numpy" 2>>"$WORK/machine.txt"; then
    echo "missing Python packages (moetune needs click, pyyaml, jsonschema, rich, filelock; the dump numpy)" |
        tee -a "$WORK/steps.txt"
    report
    exit 1
fi

# The skewed dump: 65,536 tokens of Qwen3-30B's routing shape (E=128, top-8), expert popularity
# Zipf-like (expert e drawn with weight 1/(1+e)^1.2; top-8 distinct per token).
$PY - "$WORK/skewed-qwen.npy" <<'PYEOF'
import sys
import numpy as np
import torch
g = torch.Generator().manual_seed(0)
weights = 1.0 / torch.arange(1, 129, dtype=torch.float64) ** 1.2
ids = torch.multinomial(weights.expand(65536, 128), 8, replacement=False, generator=g)
np.save(sys.argv[1], ids.to(torch.int32).numpy())
counts = np.bincount(ids.flatten().numpy(), minlength=128)
print(f"skewed dump: hottest expert {counts.max() / counts.sum():.1%} of slots (uniform 0.8%)")
PYEOF

# STEPS picks and orders the steps (a rerun over the same WORK resumes each from its store).
declare -A STEP_ARGS=(
    [qwen-big]="100 QWEN BIG qwen"
    [dsv3-big]="110 DSV3 BIG dsv3"
    [e256-big]="110 E256 BIG e256"
    [q35-big]="110 Q35 BIG q35"
    [qwen-routing]="120 QWEN ALL qwen-routing --routing $WORK/skewed-qwen.npy"
    [qwen-small]="60 QWEN SMALL qwen"
    [dsv3-small]="60 DSV3 SMALL dsv3"
    [e256-small]="60 E256 SMALL e256"
    [q35-small]="110 Q35 SMALL q35"
)
for name in ${STEPS:-qwen-big dsv3-big e256-big q35-big qwen-routing qwen-small dsv3-small e256-small q35-small}; do
    read -r limit shape sizes dir extra <<<"${STEP_ARGS[$name]}"
    case $shape in
    QWEN) shape_args=("${QWEN[@]}") ;;
    DSV3) shape_args=("${DSV3[@]}") ;;
    E256) shape_args=("${E256[@]}") ;;
    Q35) shape_args=("${Q35[@]}") ;;
    esac
    case $sizes in
    BIG) size_args=("${BIG[@]}") ;;
    SMALL) size_args=("${SMALL[@]}") ;;
    *) size_args=() ;; # ALL: the engines' 18
    esac
    # shellcheck disable=SC2086
    step "$name" "$limit" "${shape_args[@]}" "${size_args[@]}" --save-dir "$WORK/$dir" $extra
done
echo "total wall=$((SECONDS - START))s" | tee -a "$WORK/steps.txt"
report
cat "$OUT/report.md"
