#!/usr/bin/env bash
# H200 (or the H100 lent): vLLM 0.34.0's kernel, the confirmation round, the decode fix, the GPU tests.
# Carry .whl (jsonschema) and .engines/vllm-0.34.0+sglang-0.5.23 (vLLM 0.34.0's and SGLang 0.5.23's files, `--no-deps`).
# STEPS picks the steps; everything goes to $W, packed into $OUT/r.tgz as it goes.
set -u
python3 -m pip install -q --no-index --find-links .whl --target /tmp/site jsonschema >/dev/null 2>&1 || echo "pip failed"
export PYTHONPATH=/tmp/site:$PWD:$PWD/.engines/vllm-0.34.0+sglang-0.5.23 PYTHONUNBUFFERED=1 MOETUNE_ENGINES_SITE=$PWD/.engines/vllm-0.34.0+sglang-0.5.23
W=/tmp/w; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz.part" --exclude='measurements.jsonl' -C $W . 2>/dev/null && mv "$OUT/r.tgz.part" "$OUT/r.tgz"; cp $W/steps.txt $OUT/ 2>/dev/null; }
(while sleep 20; do pack; done) & PACKER=$!
trap 'kill $PACKER 2>/dev/null; pack' EXIT
date -u >> $W/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> $W/machine.txt
python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" >> $W/machine.txt
step() { local name=$1 limit=$2; shift 2; local t0; t0=$(date +%s.%N)
  timeout --signal=INT --kill-after=10 $limit "$@" > $W/$name.out 2> $W/$name.err; local rc=$?
  echo "$name rc=$rc wall=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")s" | tee -a $W/steps.txt
  tail -c 6000 $W/$name.err > $W/$name.stderr-tail.txt; rm -f $W/$name.err; pack; }
tune() { local name=$1 limit=$2; shift 2; export TRITON_CACHE_DIR=/tmp/triton-$name; rm -rf $TRITON_CACHE_DIR $W/$name
  python3 -m moetune tune "$@" --save-dir $W/$name --dry-run --json > $W/$name.plan.json 2>/dev/null
  step $name $limit python3 -m moetune tune "$@" --save-dir $W/$name --json
  gzip -c $W/$name/measurements.jsonl > $W/$name.measurements.jsonl.gz 2>/dev/null; }
for s in ${STEPS:-dsv3 gputests qa decode qb bench}; do case $s in
  dsv3) tune dsv3 ${LIMIT_dsv3:-170} --model deepseek-ai/DeepSeek-V3 --tp 8 --engine vllm ;;
  gputests) step gputests ${LIMIT_gputests:-100} env TRITON_INTERPRET=0 MOETUNE_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider -rxs tests/engines_real/test_vllm_releases_real.py tests/tune/test_timing.py tests/kernel/test_fused_moe.py tests/kernel/test_split_tma.py ;;
  qa|qb) tune $s ${LIMIT_q:-110} --model Qwen/Qwen3-235B-A22B --tp 8 --engine vllm ;;
  bench) f=$(cd $W/qa && ls E=128,N=192,device_name=*.json | head -1); export TRITON_CACHE_DIR=/tmp/triton-qa
    step bench ${LIMIT_bench:-90} python3 -m moetune benchmark --model Qwen/Qwen3-235B-A22B --tp 8 --engine vllm --config "$W/qa/$f" --config "$W/qb/$f" --repeat 9 --json ;;
  decode) step decode ${LIMIT_decode:-80} python3 bench/decode_stability.py --out $W/decode --processes 3 --repeats 6 --variants draws,seeded ;;
esac; done
cat $W/steps.txt
