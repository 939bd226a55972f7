#!/usr/bin/env bash
# Issue 7's recorded H200 run: one layout sweep of Qwen3-30B-A3B, TP 1/2/4 x bf16/fp8_w8a8
# (6 distinct per-rank shapes), then the same command again with --json (it resumes everything
# from the store: the resume path on a GPU, and the machine-readable summary).
#
# Usage: OUT=/some/dir bash bench/results/2026-12-01-h200-session/sweep.sh [BUDGET_S]
#   BUDGET_S     whole script (default 570, under one 600 s device call)
#   SWEEP_LIMIT  wall limit of the sweep itself (default 440); at the limit it gets SIGINT, which
#                exercises the interrupt path on the GPU: one line, exit 130, and the --json rerun
#                resumes from the store. The rerun gets the time left (it needs ~15 s per shape).
#   ENGINE       vllm (default: the issue compares against vLLM's fallback and published file;
#                both would add the SGLang split tune, 3 more GEMM searches per shape, untimed)
#   BATCH_SIZES  comma list (default 1,4,16,64,256,1024,4096: ~6 min estimated on one H200;
#                all 18 would be ~15 min, over one device call)
#   MODEL, TUNE_EXTRA  for a CPU rehearsal (TRITON_INTERPRET=1, the tiny model and space).
# Needs jsonschema importable (carry it as for bench/results/2026-11-30-tune/recipe.sh).
set -u
BUDGET=${1:-570}
LIMIT=${SWEEP_LIMIT:-440}
START=$SECONDS
OUT=${OUT:-/tmp/sweep-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SIZES=${BATCH_SIZES:-1,4,16,64,256,1024,4096}
read -r -a EXTRA <<<"${TUNE_EXTRA:-}"
SWEEP=(--model "${MODEL:-Qwen/Qwen3-30B-A3B}" --tp 1,2,4 --dtype bf16,fp8_w8a8
    --batch-size "$SIZES" --engine "${ENGINE:-vllm}" --save-dir "$OUT/results" "${EXTRA[@]}")

{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    nproc
} >"$OUT/machine.txt" 2>&1

python3 -m moetune tune "${SWEEP[@]}" --dry-run >"$OUT/plan.txt" 2>&1
echo "plan rc=$?" | tee "$OUT/steps.txt"
grep -E "^(Layouts|Estimate|Results)" "$OUT/plan.txt"

t0=$SECONDS
timeout --signal=INT --kill-after=15 "$LIMIT" python3 -m moetune tune "${SWEEP[@]}" \
    >"$OUT/sweep.txt" 2>"$OUT/sweep.log"
rc=$?
echo "sweep rc=$rc wall=$((SECONDS - t0))s limit=${LIMIT}s" | tee -a "$OUT/steps.txt"
tail -n 3 "$OUT/sweep.log"

t0=$SECONDS
left=$((BUDGET - (SECONDS - START) - 10))
[ "$left" -lt 20 ] && left=20
timeout --signal=INT --kill-after=5 "$left" python3 -m moetune tune "${SWEEP[@]}" --json \
    >"$OUT/sweep.json" 2>"$OUT/sweep-resumed.log"
echo "resumed rc=$? wall=$((SECONDS - t0))s" | tee -a "$OUT/steps.txt"

python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
try:
    data = json.loads((out / "sweep.json").read_text())
except (OSError, ValueError) as exc:
    sys.exit(f"no sweep.json summary ({exc})")
print(f"measured {data['measured']}, reused {data['reused']}, wall (resumed run) {data['wall_s']} s")
for shape in data["shapes"]:
    rows = shape["results"]
    speed = [r["speedup_over_default"] for r in rows if r.get("speedup_over_default")]
    geo = 1.0
    for s in speed:
        geo *= s
    geo = geo ** (1 / len(speed)) if speed else float("nan")
    print(f"{shape['plan']['problem']:<46} {', '.join(shape['layouts']):<16} "
          f"tune wall {shape['wall_s']:6.1f} s  geomean vs default {geo:.3f}x")
PY
ls -la "$OUT/results" | head -20
