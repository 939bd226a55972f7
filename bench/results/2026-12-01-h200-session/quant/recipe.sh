#!/usr/bin/env bash
# Issue 9, tune side, on the H200 (<= 9 minutes): full `moetune tune --search fast` (the 18
# batch sizes) of the new dtypes side by side with bf16, in the same run:
#   bf16      Qwen3-30B-A3B TP1                         (the baseline: whole call vs roofline)
#   int4      Qwen/Qwen3-30B-A3B-GPTQ-Int4 TP1 (bundled config: int4_w4a16, group 128, no zero points)
#   int8      Qwen3-30B-A3B TP1 --dtype int8_w8a8        (SGLang file only)
#   fp8pc     RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic TP4 (bundled: per-channel fp8;
#             E=16, N=2048, K=5120, top-1)
# With G >= 2 visible GPUs the tunes run G at a time, one GPU each (CUDA_VISIBLE_DEVICES);
# with one GPU they run one after another under per-tune limits, and a tune cut off by its
# limit is resumed from its results store with the time left at the end.
# Each tune writes $OUT/<name>.json (`tune --json`: per batch size the winner's whole-call
# latency, the default config's, the roofline floor), <name>.log, its files under
# $OUT/<name>/, and a wall-time line in $OUT/steps.txt; $OUT/summary.txt is the table.
# Needs jsonschema importable (the tuner validates the files it writes).
# Usage: OUT=/some/dir bash bench/results/2026-12-01-h200-session/quant/recipe.sh [BUDGET_S]
# (QWEN_MODEL / INT4_MODEL / SCOUT_MODEL replace the models; TUNE_EXTRA adds tune options, e.g. for a CPU rehearsal: TRITON_INTERPRET=1
#  TUNE_EXTRA="--batch-size 1 --space tiny.json" bash bench/results/2026-12-01-h200-session/quant/recipe.sh 300)
set -u
BUDGET=${1:-530}
OUT=${OUT:-/tmp/quant-tune}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
python3 -c "import jsonschema" 2>/dev/null || echo "WARNING: jsonschema missing: tunes will fail to write their files" | tee -a "$OUT/steps.txt"
{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    nproc
} >"$OUT/machine.txt" 2>&1
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$NGPU" -ge 1 ] || NGPU=1
echo "GPUs: $NGPU" | tee -a "$OUT/steps.txt"

# SGLang's file adds the split up/down search (GEMMs timed alone): with one GPU the tunes
# write vLLM's file only (one config per batch size, the whole-call comparison wanted
# here), int8_w8a8 SGLang's (vLLM gets none); with 4+ GPUs both. TUNE_ENGINE overrides.
if [ "$NGPU" -ge 4 ]; then ENGINE=${TUNE_ENGINE:-both}; else ENGINE=${TUNE_ENGINE:-vllm}; fi
echo "engine: $ENGINE (int8_w8a8: sglang)" | tee -a "$OUT/steps.txt"
read -r -a NAMES <<<"${TUNES:-int4 fp8pc int8 bf16}" # TUNES: which tunes, in order
declare -A ARGS=(
    [bf16]="--model ${QWEN_MODEL:-Qwen/Qwen3-30B-A3B} --tp 1 --dtype bf16 --engine $ENGINE"
    [int4]="--model ${INT4_MODEL:-Qwen/Qwen3-30B-A3B-GPTQ-Int4} --tp 1 --engine $ENGINE"
    [int8]="--model ${QWEN_MODEL:-Qwen/Qwen3-30B-A3B} --tp 1 --dtype int8_w8a8 --engine sglang"
    [fp8pc]="--model ${SCOUT_MODEL:-RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic} --tp 4 --engine $ENGINE"
)
# One-GPU limits (s), in NAMES order; they add up to about 500.
declare -A LIMIT=([int4]=${LIMIT_INT4:-150} [fp8pc]=${LIMIT_FP8PC:-120} [int8]=${LIMIT_INT8:-120}
    [bf16]=${LIMIT_BF16:-110})

tune() { # tune NAME LIMIT_S [GPU]: one full fast tune, SIGINT at the limit (the store keeps it)
    local name=$1 limit=$2 gpu=${3:-}
    if [ "$limit" -lt 15 ]; then
        echo "$name skipped (no time left)" | tee -a "$OUT/steps.txt"
        return 1
    fi
    local t0=$SECONDS
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=${gpu:-${CUDA_VISIBLE_DEVICES:-0}} timeout --signal=INT --kill-after=15 "$limit" \
        python3 -m moetune tune ${ARGS[$name]} --search fast --save-dir "$OUT/$name" --json ${TUNE_EXTRA:-} \
        >"$OUT/$name.json.tmp" 2>>"$OUT/$name.log"
    local rc=$?
    [ -s "$OUT/$name.json.tmp" ] && mv "$OUT/$name.json.tmp" "$OUT/$name.json"
    echo "$name rc=$rc wall=$((SECONDS - t0))s limit=${limit}s gpu=${gpu:-0}" | tee -a "$OUT/steps.txt"
    return $rc
}

if [ "$NGPU" -ge 2 ]; then
    i=0
    waves=$(((${#NAMES[@]} + NGPU - 1) / NGPU))
    while [ $i -lt ${#NAMES[@]} ]; do
        limit=$((($(left) - 20) / waves))
        pids=()
        for ((g = 0; g < NGPU && i < ${#NAMES[@]}; g++, i++)); do
            tune "${NAMES[$i]}" "$limit" "$g" &
            pids+=($!)
        done
        wait "${pids[@]}"
        waves=$((waves - 1))
    done
else
    for name in "${NAMES[@]}"; do
        tune "$name" "${LIMIT[$name]}"
    done
    for name in "${NAMES[@]}"; do # resume what a limit cut off, from its results store
        [ -s "$OUT/$name.json" ] || tune "$name" $(($(left) - 10))
    done
fi
echo "total wall=$((SECONDS - START))s" | tee -a "$OUT/steps.txt"

python3 - "$OUT" "${NAMES[@]}" <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
runs = {}
for name in names:
    path = os.path.join(out, f"{name}.json")
    try:
        runs[name] = json.load(open(path))
    except (OSError, ValueError):
        print(f"{name}: no result")
for name, d in runs.items():
    print(f"{name}: {d['plan']['problem']}  wall {d['wall_s']:.0f} s, measured {d['measured']} "
          f"(reused {d['reused']}), ceilings {d['ceilings']}")
    print("   files: " + ", ".join(os.path.basename(f) for f in d["files"]))
    for note in d.get("notes", []):
        print(f"   note: {note}")
print()
print("whole-call latency us (tuned / engine fallback / roofline floor, fraction of roofline)")
header = "M".rjust(6) + "".join(name.rjust(30) for name in runs)
print(header)
rows = {name: {r["batch_size"]: r for r in d["results"]} for name, d in runs.items()}
sizes = sorted({m for r in rows.values() for m in r})
for m in sizes:
    line = str(m).rjust(6)
    for name in runs:
        r = rows[name].get(m)
        if r is None:
            line += "-".rjust(30)
            continue
        frac = r["roofline_fraction"]
        fallbacks = r.get("baselines", {})
        fallback = (fallbacks.get("vllm_fallback") or fallbacks.get("sglang_fallback") or {})
        cell = f"{r['latency_us']:.1f}/{fallback.get('latency_us') or float('nan'):.1f}/" \
               f"{r['floor_us'] or float('nan'):.1f} {100 * frac if frac else float('nan'):.0f}%"
        line += cell.rjust(30)
    print(line)
PY
