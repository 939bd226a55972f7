#!/usr/bin/env bash
# The GPU runs still owed on 2026-12-06: on an H200 issue 28's tunes against the H200 files vLLM
# 0.34.0 ships and issue 30's fleet; on any GPU issue 33's bound on the steps between the GEMMs
# (bench/between_gemms.py) and the twin's rank fidelity at the batch sizes the 2026-12-05 run
# did not reach.
# Carry .whl (jsonschema) and .engines/vllm-0.34.0+sglang-0.5.23 (vLLM 0.34.0's and SGLang
# 0.5.23's files, `--no-deps`). STEPS picks the steps; everything goes to $W, packed into
# $OUT/r.tgz as it goes (a cut call still brings back what it finished).
set -u
# Into the machine's Python (not a --target folder): the tests' CLI subprocesses set their own
# PYTHONPATH and must still import jsonschema; pytest-xdist and Hypothesis for `gputests`.
python3 -m pip install -q --no-index --find-links .whl jsonschema pytest-xdist hypothesis >/dev/null 2>&1 || echo "pip failed"
SITE=$PWD/.engines/vllm-0.34.0+sglang-0.5.23
export PYTHONPATH=$PWD:$SITE PYTHONUNBUFFERED=1 MOETUNE_ENGINES_SITE=$SITE
CONFIGS=$SITE/vllm/model_executor/layers/fused_moe/configs
W=/tmp/w; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz.part" --exclude='measurements.jsonl' -C $W . 2>/dev/null && mv "$OUT/r.tgz.part" "$OUT/r.tgz"; cp $W/steps.txt $OUT/ 2>/dev/null; }
(while sleep 20; do pack; done) & PACKER=$!
trap 'kill $PACKER 2>/dev/null; pack' EXIT
date -u >> $W/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> $W/machine.txt
python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" >> $W/machine.txt
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
step() { local name=$1 limit=$2; shift 2; local t0; t0=$(date +%s.%N)
  timeout --signal=INT --kill-after=10 $limit "$@" > $W/$name.out 2> $W/$name.err; local rc=$?
  echo "$name rc=$rc wall=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")s" | tee -a $W/steps.txt
  tail -c 6000 $W/$name.err > $W/$name.stderr-tail.txt; rm -f $W/$name.err; pack; }
tune() { local name=$1 limit=$2; shift 2; export TRITON_CACHE_DIR=/tmp/triton-$name; rm -rf $TRITON_CACHE_DIR $W/$name
  python3 -m moetune tune "$@" --save-dir $W/$name --dry-run --json > $W/$name.plan.json 2>/dev/null
  step $name $limit python3 -m moetune tune "$@" --save-dir $W/$name --json
  gzip -c $W/$name/measurements.jsonl > $W/$name.measurements.jsonl.gz 2>/dev/null; }
DSV3="E=256,N=256,device_name=$GPU,dtype=fp8_w8a8,block_shape=[128,128].json"
case $GPU in *H200*) DEFAULT_STEPS="dsv3 benchd qa benchq" ;; *) DEFAULT_STEPS="glue fid" ;; esac
for s in ${STEPS:-$DEFAULT_STEPS}; do case $s in
  # Qwen3-235B-A22B TP8 bf16: two fresh tunes (issue 30's agreement), then both files, this GPU's
  # shipped file (vLLM 0.34.0 ships H100 and H200 ones) and the fallback, interleaved.
  qa|qb) tune $s ${LIMIT_q:-170} --model Qwen/Qwen3-235B-A22B --tp 8 --engine vllm ;;
  benchq) f="E=128,N=192,device_name=$GPU.json"; export TRITON_CACHE_DIR=/tmp/triton-qa
    tuned=(); for t in qa qb; do [ -f "$W/$t/$f" ] && tuned+=(--config "$W/$t/$f"); done
    step benchq ${LIMIT_bench:-120} python3 -m moetune benchmark --model Qwen/Qwen3-235B-A22B --tp 8 --engine vllm "${tuned[@]}" --repeat 9 --json ;;
  # DeepSeek-V3 TP8 block fp8: tuned here on an H200 (where 0.34 ships a file); on another GPU the
  # earlier H100 file (../2026-12-05-vllm034) and the H200 file vLLM ships, both timed as the shape.
  dsv3) case $GPU in *H200*) tune dsv3 ${LIMIT_dsv3:-190} --model deepseek-ai/DeepSeek-V3 --tp 8 --engine vllm ;; esac ;;
  benchd) mkdir -p $W/notma $W/shipped; export TRITON_CACHE_DIR=/tmp/triton-dsv3
    if [ -f "$W/dsv3/$DSV3" ]; then tuned="$W/dsv3/$DSV3"; else tuned=$(ls bench/results/2026-12-05-vllm034/h100/dsv3-files/E=256*.json); fi
    python3 -c "import json,sys; t=json.load(open(sys.argv[1])); [e.__setitem__('USE_TMA', False) for k, e in t.items() if isinstance(e, dict)]; json.dump(t, open(sys.argv[2], 'w'), indent=4)" "$tuned" "$W/notma/$(basename "$tuned")"
    extra=(); case $GPU in *H200*) ;; *) cp "$CONFIGS/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json" $W/shipped/; extra=(--config "$W/shipped/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json") ;; esac
    step benchd ${LIMIT_bench:-120} python3 -m moetune benchmark --model deepseek-ai/DeepSeek-V3 --tp 8 --engine vllm --config "$tuned" --config "$W/notma/$(basename "$tuned")" "${extra[@]}" --repeat 7 --json ;;
  # Rank fidelity of the twin against 0.34's kernel on the TMA-B path (issue 28).
  fid) step fid ${LIMIT_fid:-150} python3 bench/fidelity.py --engine vllm --shape deepseek-v3-fp8-tp8 --batch-sizes ${FID_BS:-1024,4096} --configs 10 --out $W/fid ;;
  # The steps between the GEMMs that moetune's kernels stand in for (issue 33), both engines.
  glue) export TRITON_CACHE_DIR=/tmp/triton-glue
    for engine in ${GLUE_ENGINES:-sglang vllm}; do
      step glue-$engine ${LIMIT_glue:-200} python3 bench/between_gemms.py --engine $engine --kernel $engine --out $W/glue-$engine
    done ;;
  # vLLM 0.34's _down.json (DeepGEMM E8M0 path), tuned where vLLM reads it (issue 28 item 4).
  down) tune down ${LIMIT_down:-200} --model deepseek-ai/DeepSeek-V3 --tp 8 --engine vllm --vllm-deepgemm ;;
  # make test-gpu's log (issue 32).
  # make test-gpu's log, spread over 8 workers; the engines only where tests/engines_real puts
  # them (MOETUNE_ENGINES_SITE), not on the path, as `make test` has it.
  gputests) step gputests ${LIMIT_gputests:-300} env PYTHONPATH=$PWD TRITON_INTERPRET=0 MOETUNE_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider -rfE --durations=15 -n 8 --dist loadgroup ;;
  fleet) case $GPU in *H200*) ;; *) echo "fleet: H200 files, not on $GPU" >> $W/steps.txt; continue ;; esac; step fleet ${LIMIT_fleet:-300} python3 bench/fleet.py --configs $CONFIGS --out $W/fleet --budget-s ${FLEET_BUDGET:-200} --tune-args '--engine vllm' ;;
esac; done
cat $W/steps.txt
