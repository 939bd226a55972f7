#!/usr/bin/env bash
# Session call 3: finish the int8_w8a8 SGLang tune from its store; then the bf16, int4, int8 and
# per-channel fp8 tuned files (and Scout's bf16 fallback) timed in one call with `moetune benchmark`;
# the int4 GPU kernel tests (kernel rev 2); a bf16 Scout TP4 tune with what time is left.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q=bench/results/2026-12-01-h200-session/quant
W=/tmp/w; mkdir -p $W/tune/int8
START=$SECONDS
pack() { tar -czf "$OUT/r.tgz" -C $W . ; }
trap pack EXIT
date -u > $W/date.txt
[ -s $W/tune/int8/measurements.jsonl ] || cp .gpu/int8.measurements.jsonl $W/tune/int8/measurements.jsonl
OUT=$W/tune TUNES=int8 LIMIT_INT8=230 timeout 250 bash bench/results/2026-12-01-h200-session/quant/recipe.sh 235
pack
bench() { # bench NAME MODEL TP DTYPE ENGINE [FILE]
  local t0=$SECONDS cfg=()
  [ -n "${6:-}" ] && cfg=(--config "$6")
  timeout --signal=INT --kill-after=10 60 python3 -m moetune benchmark --model $2 --tp $3 --dtype $4 --engine $5 "${cfg[@]}" --json > $W/bench_$1.json 2> $W/bench_$1.log
  echo "bench $1 rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt
}
QW=Qwen/Qwen3-30B-A3B; SC=RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic
bench bf16 $QW 1 bf16 vllm "$Q/bf16-qwen3-30b-tp1/E=128,N=768,device_name=NVIDIA_H200.json"
bench int4 Qwen/Qwen3-30B-A3B-GPTQ-Int4 1 auto vllm "$Q/int4-rev2/E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
I8=$(ls $W/tune/int8/configs/*/*per_channel_quant=True.json 2>/dev/null | head -1)
[ -n "$I8" ] && bench int8 $QW 1 int8_w8a8 sglang "$I8"
bench fp8pc $SC 4 auto vllm "$Q/fp8pc-scout-tp4/E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
bench scoutbf16 $SC 4 bf16 vllm
pack
t0=$SECONDS
MOETUNE_GPU_TESTS=1 TRITON_INTERPRET=0 timeout 80 python3 -m pytest -q -s -p no:cacheprovider tests/kernel/test_quant_paths.py -k int4 > $W/int4_gpu_tests.log 2>&1
echo "int4 gpu tests rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt
tail -3 $W/int4_gpu_tests.log
pack
LEFT=$((545 - (SECONDS - START)))
if [ $LEFT -gt 120 ]; then
  t0=$SECONDS
  timeout --signal=INT --kill-after=10 $LEFT python3 -m moetune tune --model $SC --tp 4 --dtype bf16 --engine vllm --search fast --save-dir $W/scoutbf16 --json > $W/scoutbf16.json 2> $W/scoutbf16.log
  echo "scout bf16 tune rc=$? wall=$((SECONDS - t0))s limit=$LEFT" | tee -a $W/steps.txt
fi
