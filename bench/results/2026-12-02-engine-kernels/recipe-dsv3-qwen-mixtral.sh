#!/usr/bin/env bash
# H200 call 2: finish DeepSeek-V3 fp8 TP8 on vLLM 0.33.0's kernel (resumed from call 1's store),
# tune Qwen3-30B-A3B TP1 on vLLM 0.33.0's kernel, and Mixtral-8x7B TP2's rank fidelity.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:$PWD/.engines/site PYTHONUNBUFFERED=1
R=bench/results/2026-12-02-engine-kernels
W=/tmp/w; rm -rf $W; mkdir -p $W/dsv3; pack() { tar -czf "$OUT/r.tgz" -C $W . ; }; trap pack EXIT
date -u > $W/date.txt
[ -s $W/dsv3/measurements.jsonl ] || gunzip -c $R/${DSV3_STORE:-call1}/dsv3.measurements.jsonl.gz > $W/dsv3/measurements.jsonl
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout --signal=INT --kill-after=10 $limit "$@" > $W/$name.log 2> $W/$name.err; echo "$name rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt; }
step tune_dsv3 ${LIMIT_DSV3:-230} python3 -m moetune tune --model deepseek-ai/DeepSeek-V3 --tp 8 --engine vllm --save-dir $W/dsv3 --json
pack
step tune_qwen3 ${LIMIT_QWEN:-200} python3 -m moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 --engine vllm --save-dir $W/qwen3 --json
pack
step fid_mixtral ${LIMIT_FID:-110} python3 bench/fidelity.py --engine vllm --shape mixtral-8x7b-tp2 --configs 8 --out $W/fid_mixtral
