#!/usr/bin/env bash
# H200 call 5: rank fidelity of the rewritten twin (SASS-identical to vLLM 0.33.0's kernel on
# every vLLM path, bench/results/2026-12-02-sass-vllm033/) against vLLM 0.33.0's own kernel.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:$PWD/.engines/site PYTHONUNBUFFERED=1
W=/tmp/w5; rm -rf $W; mkdir -p $W; pack() { tar -czf "$OUT/r.tgz" -C $W . ; }; trap pack EXIT
date -u > $W/date.txt
timeout --signal=INT --kill-after=5 ${LIMIT:-150} python3 bench/fidelity.py --engine vllm --shape deepseek-v3-fp8-tp8 --shape qwen3-30b-tp1 --configs 8 --out $W > $W/fid.log 2>&1
echo "fid rc=$?" | tee $W/steps.txt
