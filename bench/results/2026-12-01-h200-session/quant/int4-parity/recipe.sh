#!/usr/bin/env bash
# Issue 9, int4 w4a16 kernel parity on one H200 (<= 90 s of GPU time, everything under $OUT as it goes):
# bench/parity.py's int4 mode on Qwen3-30B-A3B-GPTQ-Int4 TP1 (E=128, N=768, K=2048, top-8,
# group 128): vLLM's fused_moe_kernel_gptq_awq (source carried in .vllm_ref/, never committed;
# skipped cleanly when absent) against moetune's fused_moe_wna16_kernel, same packed weights,
# scales, inputs and alignment, GEMM1 + GEMM2, CUDA graphs of 10 token sets replayed
# round-robin, outputs checked against a float32 reference. M = 16, 256, 1024, 4096; configs:
# the H200 tune's measured bests (16/32/256/16/4/4 at M=16, 32/32/256/32/4/2 at M=256) and
# BLOCK_SIZE_M 64 / 128 tiles (bench/parity.py INT4_CONFIGS).
# Usage: OUT=/some/dir bash bench/results/2026-12-01-h200-session/quant/int4-parity/recipe.sh [--vllm-ref .vllm_ref/fused_moe_kernel_gptq_awq.py]
# Results: $OUT/parity/parity.json (per point: us, errors, samples), $OUT/parity/parity.md,
# $OUT/parity.log, $OUT/summary.txt (per point: vLLM us, moetune us, ratio, error).
set -u
OUT=${OUT:-/tmp/int4-parity}
REF=.vllm_ref/fused_moe_kernel_gptq_awq.py
while [ $# -gt 0 ]; do
    case "$1" in
        --vllm-ref) REF=$2; shift 2 ;;
        --vllm-ref=*) REF=${1#*=}; shift ;;
        *) echo "Error: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
# bench/parity.py imports moetune from this checkout.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$SECONDS
log() { echo "[$((SECONDS - START))s] $*" | tee -a "$OUT/steps.txt"; }

log "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
[ -f "$REF" ] || log "no $REF: the vllm kernel is left out (moetune's kernel and the error check still run)"
log "bench/parity.py int4"
timeout --kill-after=2 86 python bench/parity.py --shapes qwen3-30b-a3b-tp1-int4 \
    --batch-sizes 16,256,1024,4096 --vllm-ref "$REF" --out "$OUT/parity" \
    --budget-s 62 --rounds 15 > "$OUT/parity.log" 2>&1
log "parity rc=$?"
tail -n 5 "$OUT/parity.log"
python - "$OUT/parity/parity.json" <<'EOF' | tee "$OUT/summary.txt"
import json, sys

try:
    data = json.load(open(sys.argv[1]))
except OSError as exc:
    sys.exit(f"no results: {exc}")
print(data["machine"], *data["notes"], sep="\n")
print(f"{'M':>5} {'config':8} {'BM/BN/BK/G/w/s':18} {'vllm us':>9} {'moetune us':>10} {'ratio':>6} {'err':>8}")
for row in data["rows"]:
    for name, label in row["configs"].items():
        v, m = row["us"].get(f"vllm|{name}"), row["us"].get(f"moetune|{name}")
        errs = [e for k, e in row["errors"].items() if k.endswith(f"|{name}")]
        bad = [e for e in errs if not isinstance(e, list)]
        err = "fail" if bad else f"{max(max(e) for e in errs):.1e}" if errs else "-"
        ratio = f"{m / v:.3f}" if v and m else "-"
        print(f"{row['M']:>5} {name:8} {label:18} {v or 0:9.1f} {m or 0:10.1f} {ratio:>6} {err:>8}")
        for b in bad:
            print(f"      {b}")
EOF
log "done"
