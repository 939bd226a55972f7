#!/usr/bin/env bash
# Session call 1: int4 parity (kernel rev 2 vs vLLM's gptq_awq), then a fresh int4 18-M tune.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/w; mkdir -p $W
pack() { tar -czf "$OUT/r.tgz" -C $W . ; }
trap pack EXIT
date -u > $W/date.txt
OUT_SAVE=$OUT
OUT=$W/parity timeout 100 bash bench/results/2026-12-01-h200-session/quant/int4-parity/recipe.sh --vllm-ref .vllm_ref/fused_moe_kernel_gptq_awq.py
OUT=$OUT_SAVE; pack
OUT=$W/tune TUNES=int4 LIMIT_INT4=${LIMIT_INT4:-420} timeout 460 bash bench/results/2026-12-01-h200-session/quant/recipe.sh ${BUDGET:-430}
OUT=$OUT_SAVE
