#!/usr/bin/env bash
# Session call 2: resume the fp8 per-channel and int8_w8a8 tunes from their stores; between them,
# the bf16 and int4 tuned files timed side by side with `moetune benchmark` (same run, 18 M).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q=bench/results/2026-12-01-h200-session/quant
W=/tmp/w; mkdir -p $W/tune/int8 $W/tune/fp8pc
pack() { tar -czf "$OUT/r.tgz" -C $W . ; }
trap pack EXIT
date -u > $W/date.txt
[ -s $W/tune/int8/measurements.jsonl ] || gunzip -c $Q/int8.measurements.jsonl.gz > $W/tune/int8/measurements.jsonl
[ -s $W/tune/fp8pc/measurements.jsonl ] || gunzip -c $Q/fp8pc.measurements.jsonl.gz > $W/tune/fp8pc/measurements.jsonl
OUT=$W/tune TUNES=fp8pc LIMIT_FP8PC=110 timeout 130 bash bench/results/2026-12-01-h200-session/quant/recipe.sh 115
pack
bench() { # bench NAME MODEL DTYPE FILE
  local t0=$SECONDS
  timeout --signal=INT --kill-after=10 ${BENCH_LIMIT:-130} python3 -m moetune benchmark --model $2 --tp 1 --dtype $3 --engine vllm --config "$4" --json > $W/bench_$1.json 2> $W/bench_$1.log
  echo "bench $1 rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt
}
bench bf16 Qwen/Qwen3-30B-A3B bf16 "$Q/bf16-qwen3-30b-tp1/E=128,N=768,device_name=NVIDIA_H200.json"
bench int4 Qwen/Qwen3-30B-A3B-GPTQ-Int4 auto "$Q/int4-rev2/E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
pack
OUT=$W/tune TUNES=int8 LIMIT_INT8=${LIMIT_INT8:-200} timeout 230 bash bench/results/2026-12-01-h200-session/quant/recipe.sh 210
