#!/usr/bin/env bash
# H200: the pipelined searches' wall time on the default tunes of 2026-12-02-default-tune-times
# (same commands, fresh folders), and the input switch cost. Carry .whl (jsonschema and its needs)
# and .engines/site (vLLM 0.33.0's and SGLang 0.5.23's fused-MoE files). SRC: the checkout to run
# (default: this tree). STEPS picks the steps (default: switch vllm_bf16 qwen235).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
SRC=${SRC:-$PWD}
export PYTHONPATH=/tmp/site:$SRC:$PWD/.engines/site PYTHONUNBUFFERED=1
W=/tmp/wt; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz" -C $W . ; }; trap pack EXIT
date -u >> $W/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/machine.txt
python3 -c "import torch, triton, moetune; print('torch', torch.__version__, 'triton', triton.__version__, moetune.__file__)" >> $W/machine.txt
(cd $SRC && git log -1 --format=%H 2>/dev/null) >> $W/machine.txt
tune() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  python3 -m moetune tune "$@" --save-dir $W/$name --dry-run --json > $W/$name.plan.json 2>/dev/null
  timeout --signal=INT --kill-after=10 $limit python3 -m moetune tune "$@" --save-dir $W/$name --json > $W/$name.json 2> $W/$name.err
  echo "$name rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt; tail -c 600 $W/$name.err; pack; }
for step in ${STEPS:-switch vllm_bf16 qwen235}; do case $step in
  switch) python3 $SRC/bench/results/2026-12-02-search-pipeline/switch_cost.py 2>&1 | tee $W/switch_cost.txt ;;
  vllm_bf16) tune vllm_bf16 ${LIMIT_vllm_bf16:-200} --model Qwen/Qwen3-235B-A22B --tp 4 --engine vllm ;;
  qwen235) tune qwen235 ${LIMIT_qwen235:-280} --model Qwen/Qwen3-235B-A22B --tp 8 ;;
  glm) tune glm ${LIMIT_glm:-280} --model zai-org/GLM-4.5-Air --tp 4 ;;
esac; done
