#!/usr/bin/env bash
# Measured roofline ceilings on this GPU (read bandwidth three ways, bf16/fp8/int8 peaks).
# Budget: about 30 s, 90 s at most. Results: $OUT/ceilings.json and $OUT/ceilings.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$(mktemp -d)}"
export OUT
mkdir -p "$OUT"
timeout 90 python bench/gpu/ceilings.py 2>&1 | tee "$OUT/ceilings.log"
echo "results in $OUT"
