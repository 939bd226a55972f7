#!/usr/bin/env bash
# H200 call 1: rank fidelity of the twin against vLLM 0.33.0's and SGLang 0.5.23's own kernels,
# then DeepSeek-V3 fp8 TP8 tuned on vLLM 0.33.0's kernel (compared with the file the wheel ships).
# Needs .whl (jsonschema and its needs) and .engines/site (the wheels' fused-MoE files) carried.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:$PWD/.engines/site PYTHONUNBUFFERED=1
W=/tmp/w; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz" -C $W . ; }; trap pack EXIT
date -u > $W/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/machine.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $W/machine.txt
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout --signal=INT --kill-after=10 $limit "$@" > $W/$name.log 2>&1; echo "$name rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt; }
step fid_vllm 300 python3 bench/fidelity.py --engine vllm --shape qwen3-30b-tp1 --shape deepseek-v3-fp8-tp8 --shape mixtral-8x7b-tp2 --configs 8 --out $W/fid_vllm
step fid_sglang 80 python3 bench/fidelity.py --engine sglang --shape qwen3-30b-tp1 --configs 8 --out $W/fid_sglang
step tune_dsv3 ${TUNE_LIMIT:-190} python3 -m moetune tune --model deepseek-ai/DeepSeek-V3 --tp 8 --engine vllm --save-dir $W/dsv3 --json
