#!/usr/bin/env bash
# H200 call 4: Qwen3-30B-A3B TP1 tuned for SGLang on SGLang 0.5.23's own kernel (fresh folder, the
# default fast search with its split stage), against the triton_3_6_0 H200 file the wheel ships.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:$PWD/.engines/site PYTHONUNBUFFERED=1
W=/tmp/w4; rm -rf $W; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz" -C $W . ; }; trap pack EXIT
date -u > $W/date.txt
t0=$SECONDS
timeout --signal=INT --kill-after=10 ${LIMIT:-430} python3 -m moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 --engine sglang --save-dir $W/qwen3-sglang --json > $W/tune.json 2> $W/tune.err
echo "tune_qwen3_sglang rc=$? wall=$((SECONDS - t0))s" | tee $W/steps.txt
