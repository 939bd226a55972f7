#!/usr/bin/env bash
# H200: wall time of the default command (`moetune tune --model X --tp N`, both engines, each on its
# own kernel: vLLM 0.33.0 and SGLang 0.5.23 from .engines/site) in fresh folders, against the plan's
# estimate. STEPS picks the steps (default: glm qwen235); LIMIT_<step> caps each (seconds).
# Carry .whl (jsonschema and its needs) and .engines (the wheels' fused-MoE files).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:$PWD/.engines/site PYTHONUNBUFFERED=1
W=/tmp/wt; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz" -C $W . ; }; trap pack EXIT
date -u >> $W/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/machine.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $W/machine.txt
tune() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  python3 -m moetune tune "$@" --save-dir $W/$name --dry-run --json > $W/$name.plan.json 2>/dev/null
  timeout --signal=INT --kill-after=10 $limit python3 -m moetune tune "$@" --save-dir $W/$name --json > $W/$name.json 2> $W/$name.err
  echo "$name rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt; pack; }
for step in ${STEPS:-glm qwen235}; do case $step in
  glm) tune glm ${LIMIT_glm:-220} --model zai-org/GLM-4.5-Air --tp 4 ;;
  qwen235) tune qwen235 ${LIMIT_qwen235:-220} --model Qwen/Qwen3-235B-A22B --tp 8 ;;
  dsv3) tune dsv3 ${LIMIT_dsv3:-280} --model deepseek-ai/DeepSeek-V3 --tp 8 ;;
  vllm_bf16) tune vllm_bf16 ${LIMIT_vllm_bf16:-150} --model Qwen/Qwen3-235B-A22B --tp 4 --engine vllm ;;
esac; done
