#!/usr/bin/env bash
# Issue 9, kernel side, on one H200 (<= 4 minutes): the new quantized paths compiled.
#   1. tests/kernel -k "int4 or int8_w8a8 or per_channel": real shapes first, then (-x) the CPU cases
#      compiled, CUDA-graph capture of each path, real shapes at M=1 and 4096:
#      Qwen3-30B-A3B TP1 int4 g128 with and without zero points, Qwen3-30B-A3B int8_w8a8,
#      Llama-4-Scout TP4 per-channel fp8 (E=16, N=2048, K=5120, top-1)) with relative RMS
#      errors printed ("REAL ..." lines);
#   2. the existing fp8 / int8_w8a16 GPU kernel tests, with the time left (the shared kernel
#      file changed: per-channel flags in the scale section).
# Results: $OUT/real_shapes.log, $OUT/real_errors.txt, $OUT/kernel_tests.log,
# $OUT/regression.log, $OUT/summary.txt.
# Usage: OUT=/some/dir bash bench/results/2026-12-01-h200-session/quant/kernel-checks.sh
set -u
OUT=${OUT:-/tmp/quant-kernel-checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MOETUNE_GPU_TESTS=1 TRITON_INTERPRET=0
START=$SECONDS
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# Real shapes first (the numbers wanted most), then every other new-path test (-x).
timeout --kill-after=10 110 python3 -m pytest -q -s -p no:cacheprovider \
    tests/kernel/test_quant_paths.py -k "test_real_shapes" >"$OUT/real_shapes.log" 2>&1
echo "real-shape tests rc=$? wall=$((SECONDS - START))s" | tee "$OUT/summary.txt"
grep "^REAL " "$OUT/real_shapes.log" | tee "$OUT/real_errors.txt"
grep -E "passed|failed|error" "$OUT/real_shapes.log" | tail -n 3 | tee -a "$OUT/summary.txt"

t0=$SECONDS
timeout --kill-after=10 $((200 - (SECONDS - START))) python3 -m pytest -q -x -p no:cacheprovider \
    tests/kernel -k "(int4 or int8_w8a8 or per_channel) and not test_real_shapes" \
    >"$OUT/kernel_tests.log" 2>&1
echo "new-path tests rc=$? wall=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
tail -n 25 "$OUT/kernel_tests.log" | tee -a "$OUT/summary.txt"

LEFT=$((225 - (SECONDS - START)))
if [ "$LEFT" -gt 20 ]; then
    t0=$SECONDS
    timeout --kill-after=10 "$LEFT" python3 -m pytest -q -p no:cacheprovider \
        tests/kernel/test_fused_moe_kernel.py tests/kernel/test_quant.py \
        -k "fp8 or int8w8a16" >"$OUT/regression.log" 2>&1
    echo "regression (fp8, int8_w8a16 kernel tests) rc=$? wall=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
    tail -n 8 "$OUT/regression.log" | tee -a "$OUT/summary.txt"
fi
echo "total wall=$((SECONDS - START))s" | tee -a "$OUT/summary.txt"
