#!/usr/bin/env bash
# H200: what a probe timing costs with the routing stream kept and without (bench/probe_cost.py),
# the M=1 drift between whole-call timings (m1_drift.py), then the default Qwen3-235B TP8 tune.
# Carry .whl (jsonschema and its needs), .engines/site (vLLM 0.33.0's and SGLang 0.5.23's files)
# and the code to run as CODE (default: this tree; moetune is run from it). STEPS picks the steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
CODE=${CODE:-$PWD}
export PYTHONPATH=/tmp/site:$CODE:$PWD/.engines/site PYTHONUNBUFFERED=1
HERE=$CODE/bench/results/2026-12-02-timer-cost
# $OUT brings back 8 files at most: everything goes to $W, packed into $OUT/r.tgz after each step.
W=/tmp/w; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz" -C $W . ; cp $W/steps.txt $OUT/ 2>/dev/null; }; trap pack EXIT
(while sleep 30; do pack; done) & # a run cut at the device's limit still brings back its store
date -u >> $W/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/machine.txt
(cd $CODE && python3 -c "import torch, triton, moetune; print('torch', torch.__version__, 'triton', triton.__version__, moetune.__file__)") >> $W/machine.txt
tune() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  (cd $CODE && python3 -m moetune tune "$@" --save-dir $W/$name --dry-run --json) > $W/$name.plan.json 2>/dev/null
  (cd $CODE && exec timeout --signal=INT --kill-after=10 $limit python3 -m moetune tune "$@" --save-dir $W/$name --json) > $W/$name.json 2> $W/$name.err
  echo "$name rc=$? wall=$((SECONDS - t0))s" | tee -a $W/steps.txt; tail -c 400 $W/$name.err
  gzip -f $W/$name/measurements.jsonl 2>/dev/null; tail -c 3000 $W/$name.err > $W/$name.stderr-tail.txt; rm -f $W/$name.err; }
for step in ${STEPS:-cost drift qwen235}; do t0=$SECONDS; case $step in
  cost) timeout 150 python3 $CODE/bench/probe_cost.py --out $W/cost_bf16 --repeats 4 2>&1 | tee $W/cost_bf16.txt
        timeout 120 python3 $CODE/bench/probe_cost.py --out $W/cost_fp8 --shape 256,256,7168,8 --dtype fp8_w8a8 --block-shape 128,128 --batch-sizes 16,256 --repeats 3 2>&1 | tee $W/cost_fp8.txt ;;
  drift) OUT=$W timeout 120 python3 $HERE/m1_drift.py 2>&1 | tee $W/m1_drift.txt ;;
  qwen235) tune qwen235 ${LIMIT_qwen235:-280} --model Qwen/Qwen3-235B-A22B --tp 8 ;;
  glm) tune glm ${LIMIT_glm:-280} --model zai-org/GLM-4.5-Air --tp 4 ;;
  dsv3) tune dsv3 ${LIMIT_dsv3:-330} --model deepseek-ai/DeepSeek-V3 --tp 8 ;;
  vllm_bf16) tune vllm_bf16 ${LIMIT_vllm_bf16:-200} --model Qwen/Qwen3-235B-A22B --tp 4 --engine vllm ;;
esac; echo "step $step $((SECONDS - t0))s" >> $W/steps.txt; pack; done
