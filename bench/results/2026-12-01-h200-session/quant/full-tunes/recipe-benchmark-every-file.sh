#!/usr/bin/env bash
# Session call 4: every tuned file of the session timed in one call with `moetune benchmark`:
# Qwen3-30B-A3B TP1 bf16 / int4 / int8 (single winners, whole call) and int8 SGLang split files
# (pair harness); Llama-4-Scout TP4 bf16 tuned / fp8 per-channel tuned.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q=bench/results/2026-12-01-h200-session/quant; F=$Q/full-tunes
W=/tmp/w4; mkdir -p $W
pack() { tar -czf "$OUT/r.tgz" -C $W . ; }
trap pack EXIT
date -u > $W/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/machine.txt 2>&1
bench() { # bench NAME MODEL TP DTYPE ENGINE FILE
  local t0=$SECONDS
  timeout --signal=INT --kill-after=10 70 python3 -m moetune benchmark --model $2 --tp $3 --dtype $4 --engine $5 --config "$6" --json > $W/bench_$1.json 2> $W/bench_$1.log
  echo "bench $1 rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt
}
QW=Qwen/Qwen3-30B-A3B; SC=RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic
bench bf16 $QW 1 bf16 vllm "$Q/bf16-qwen3-30b-tp1/E=128,N=768,device_name=NVIDIA_H200.json"
bench int4 Qwen/Qwen3-30B-A3B-GPTQ-Int4 1 auto vllm "$F/int4-rev2/E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
bench int8 $QW 1 int8_w8a8 sglang "$F/int8-sglang/single-winners.json"
bench int8split $QW 1 int8_w8a8 sglang "$F/int8-sglang/E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json"
bench scoutbf16 $SC 4 bf16 vllm "$F/scout-bf16-tp4/E=16,N=2048,device_name=NVIDIA_H200.json"
bench fp8pc $SC 4 auto vllm "$F/fp8pc-scout-tp4/E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
