#!/usr/bin/env bash
# Issue 8, kernel side, on one H200 (about 6.5 minutes, everything under $OUT as it goes):
#   1. the split-config / TMA tests compiled on the GPU (real TMA hardware, CUDA-graph capture,
#      real shapes), then the existing kernel tests' GPU cases (real shapes, graphs);
#   2. bench/parity.py: same-run GEMM timings of vLLM's fused_moe_kernel (source in
#      .vllm_ref/, carried by the lead; skipped cleanly when absent), this tree's kernel and
#      the kernel before the parity work (a044f6c; bench/parity.py no longer runs it), at
#      M = 1024, 4096 and 256.
# Usage: OUT=/some/dir bash bench/results/2026-12-01-parity/recipe.sh
# Assumes the lead's wheels (jsonschema, ...) on PYTHONPATH (e.g. /tmp/site).
set -u
OUT=${OUT:-/tmp/parity-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 MOETUNE_GPU_TESTS=1
# bench/parity.py imports moetune from this checkout (a script's own folder comes first on sys.path).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$SECONDS
log() { echo "[$((SECONDS - START))s] $*" | tee -a "$OUT/steps.txt"; }

log "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/steps.txt"

log "1a. split/TMA tests on the GPU"
timeout 110 python -m pytest -q -p no:cacheprovider -rs tests/kernel/test_split_tma.py \
    > "$OUT/tests-split-tma.log" 2>&1
log "1a rc=$? $(tail -1 "$OUT/tests-split-tma.log")"

log "1b. existing kernel tests, GPU cases (real shapes, CUDA graphs, compiled tiles)"
timeout 80 python -m pytest -q -p no:cacheprovider tests/kernel/test_fused_moe.py \
    tests/kernel/test_fused_moe_kernel.py -k "real_shapes or cuda_graph or gate_up or down_gemm or expert_minus_one" \
    > "$OUT/tests-kernel.log" 2>&1
log "1b rc=$? $(tail -1 "$OUT/tests-kernel.log")"

REF=.vllm_ref/fused_moe_kernel_13cb3e44.py
[ -f "$REF" ] || log "no $REF: the vllm kernel is left out of the parity run"
log "2. bench/parity.py"
timeout 230 python bench/parity.py --vllm-ref "$REF" --out "$OUT/parity" --budget-s 170 \
    > "$OUT/parity.log" 2>&1
log "2 rc=$?"
tail -40 "$OUT/parity.log"
log "done"
