#!/usr/bin/env bash
# H200: rank fidelity of moetune's SGLang twin (moetune/kernel/fused_moe_kernel_sglang.py, whole SASS
# identical to SGLang 0.5.23's kernel) against SGLang 0.5.23's own kernel: whole calls on DeepSeek-V3
# fp8 block TP8 and Qwen3-30B-A3B TP1, and lone up/down GEMMs (SGLang's split search, with and without
# TMA) on DeepSeek-V3. Run from the repository root (or CODE=<a copy of it>); carry .whl (jsonschema
# and its needs) and .engines (the wheels' fused-MoE files). LIMIT_<step> caps each step (seconds).
set -u
ROOT=$PWD; CODE=${CODE:-$ROOT}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$CODE:$ROOT/.engines/site PYTHONUNBUFFERED=1
W=/tmp/wf; rm -rf $W; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz" -C $W . ; }; trap pack EXIT
date -u > $W/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/machine.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $W/machine.txt
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout --signal=INT --kill-after=5 $limit "$@" > $W/$name.log 2>&1; echo "$name rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt; pack; }
F="python3 $CODE/bench/fidelity.py --engine sglang"
step dsv3 ${LIMIT_dsv3:-220} $F --shape deepseek-v3-fp8-tp8 --configs 8 --out $W/dsv3
step qwen ${LIMIT_qwen:-110} $F --shape qwen3-30b-tp1 --configs 8 --out $W/qwen
step split ${LIMIT_split:-200} $F --split --shape deepseek-v3-fp8-tp8 --configs 4 --batch-sizes 16,256,4096 --out $W/split
for d in dsv3 qwen split; do [ -f $W/$d/fidelity.jsonl ] && python3 $CODE/bench/fidelity.py --report $W/$d/fidelity.jsonl > $W/$d/table.md; done
