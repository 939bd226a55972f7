#!/usr/bin/env bash
# H200: the vLLM files written by the sequential search (main, fae72a1) and by the pipelined one,
# timed side by side in one `moetune benchmark` per shape on vLLM 0.33.0's kernel; with RECORDED=1
# also the sequential search's file of 2026-12-02-default-tune-times (the same search, another
# run). Carry .whl and .engines/site; SRC: the checkout to run.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
SRC=${SRC:-$PWD}
export PYTHONPATH=/tmp/site:$SRC:$PWD/.engines/site PYTHONUNBUFFERED=1
F=$SRC/bench/results/2026-12-02-search-pipeline/files
for tp in 4 8; do n=$([ $tp = 4 ] && echo 384 || echo 192)
  timeout 200 python3 -m moetune benchmark --model Qwen/Qwen3-235B-A22B --tp $tp --engine vllm --kernel vllm \
    --config "$F/old/tp$tp/old-E=128,N=$n,device_name=NVIDIA_H200.json" --config "$F/new/tp$tp/new-E=128,N=$n,device_name=NVIDIA_H200.json" \
    ${RECORDED:+--config "$F/recorded/tp$tp/recorded-E=128,N=$n,device_name=NVIDIA_H200.json"} --json > $OUT/side_by_side_tp$tp.json 2> $OUT/side_by_side_tp$tp.err; echo "tp$tp rc=$?"; tail -c 300 $OUT/side_by_side_tp$tp.err
done
