#!/usr/bin/env bash
# H200: the default commands of issue 17, each in a fresh save folder with a cold Triton cache
# (its own TRITON_CACHE_DIR), timed from the shell: `moetune tune --model X --tp N`.
# Carry .whl (jsonschema and its needs) and .engines/site (vLLM 0.33.0's and SGLang 0.5.23's
# files, so each engine's file is timed on that engine's own kernel). STEPS picks the steps;
# LIMIT_<step> caps a step's seconds (SIGINT, as Ctrl-C: the store keeps what was measured).
# The recipe of bench/results/2026-12-04-default-tunes, plus: a cut thorough run resumes in
# its own folder (thorough_resume), and the benchmark runs again with the files swapped (bench2).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:$PWD/.engines/site PYTHONUNBUFFERED=1
# $OUT brings back 8 files at most: everything goes to $W, packed into $OUT/r.tgz as it goes.
# Folders are packed without their stores (the stores are copied gzipped beside them), so a
# store being written is never read half-way.
W=/tmp/w; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz.part" --exclude='measurements.jsonl*' -C $W . 2>/dev/null && mv "$OUT/r.tgz.part" "$OUT/r.tgz"; cp $W/steps.txt $OUT/ 2>/dev/null; }
(while sleep 20; do pack; done) & PACKER=$!
trap 'kill $PACKER 2>/dev/null; pack' EXIT  # the loop must not outlive the recipe (nor hold its pipe)
date -u >> $W/date.txt; nproc >> $W/machine.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> $W/machine.txt
python3 -c "import torch, triton, moetune; print('torch', torch.__version__, 'triton', triton.__version__, moetune.__file__)" >> $W/machine.txt
tune() { local name=$1 limit=$2; shift 2; local dir=$W/${DIR:-$name}
  export TRITON_CACHE_DIR=${CACHE:-/tmp/triton-$name}
  [ -n "${CACHE:-}" ] || rm -rf "$TRITON_CACHE_DIR"  # a cold cache, unless CACHE names one
  if [ -z "${DIR:-}" ]; then  # DIR: resume that folder as it is
    rm -rf "$dir"; mkdir -p "$dir"  # a fresh folder ...
    [ -z "${STORE:-}" ] || cp "$STORE" "$dir/measurements.jsonl"  # ... that resumes from STORE
  fi
  python3 -m moetune tune "$@" --save-dir $dir --dry-run --json > $W/$name.plan.json 2>/dev/null
  local t0; t0=$(date +%s.%N)
  timeout --signal=INT --kill-after=10 $limit python3 -m moetune tune "$@" --save-dir $dir --json > $W/$name.json 2> $W/$name.err
  local rc=$? t1; t1=$(date +%s.%N)
  echo "$name rc=$rc start=$t0 end=$t1 wall=$(python3 -c "print(round($t1 - $t0, 1))")s args=$*" | tee -a $W/steps.txt
  gzip -c $dir/measurements.jsonl > $W/$name.measurements.jsonl.gz 2>/dev/null
  tail -c 4000 $W/$name.err > $W/$name.stderr-tail.txt; rm -f $W/$name.err; pack; }
for step in ${STEPS:-qwen235 glm dsv3}; do case $step in
  qwen235) tune qwen235 ${LIMIT_qwen235:-175} --model Qwen/Qwen3-235B-A22B --tp 8 ;;
  glm) tune glm ${LIMIT_glm:-175} --model zai-org/GLM-4.5-Air --tp 4 ;;
  dsv3) tune dsv3 ${LIMIT_dsv3:-235} --model deepseek-ai/DeepSeek-V3 --tp 8 ;;
  vllm_bf16) tune vllm_bf16 ${LIMIT_vllm_bf16:-120} --model Qwen/Qwen3-235B-A22B --tp 4 --engine vllm ;;
  # --search thorough from the fast run's store and Triton cache (what it timed is reused): the
  # loss of the fast search, file against file, in the benchmarks below.
  thorough) STORE=$W/qwen235/measurements.jsonl CACHE=/tmp/triton-qwen235 tune qwen235-thorough ${LIMIT_thorough:-270} --model Qwen/Qwen3-235B-A22B --tp 8 --search thorough ;;
  thorough_resume) DIR=qwen235-thorough CACHE=/tmp/triton-qwen235 tune thorough-resume ${LIMIT_thorough_resume:-270} --model Qwen/Qwen3-235B-A22B --tp 8 --search thorough ;;
  bench|bench2) [ $step = bench ] && REPS=1 || REPS=2; export TRITON_CACHE_DIR=/tmp/triton-qwen235; f=E=128,N=192,device_name=NVIDIA_H200.json
    for rep in ${REPS:-1 2}; do for engine in sglang vllm; do
      case $engine in sglang) a=$W/qwen235/configs/triton_3_6_0/$f b=$W/qwen235-thorough/configs/triton_3_6_0/$f ;; vllm) a=$W/qwen235/$f b=$W/qwen235-thorough/$f ;; esac
      [ $rep = 1 ] && files="--config $a --config $b" || files="--config $b --config $a"  # both orders
      local_t0=$(date +%s)
      timeout 90 python3 -m moetune benchmark --model Qwen/Qwen3-235B-A22B --tp 8 --engine $engine $files --json > $W/bench-$engine-$rep.json 2> $W/bench-$engine-$rep.err
      echo "bench $engine $rep rc=$? wall=$(( $(date +%s) - local_t0 ))s" | tee -a $W/steps.txt; tail -c 1500 $W/bench-$engine-$rep.err > $W/bench-$engine-$rep.stderr-tail.txt; rm -f $W/bench-$engine-$rep.err; pack
    done; done ;;
esac; done
