#!/usr/bin/env bash
# A short GPU check of the tuner before the long session (bench/results/2026-11-30-tune/recipe.sh): the CUDA-graph
# harness test, then a fast tune of Qwen3-30B-A3B TP1 at two batch sizes, whose JSON gives
# the per-candidate costs the long session's time limits are planned from.
set -u
OUT=${OUT:-/tmp/probe}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
TRITON_INTERPRET=0 MOETUNE_GPU_TESTS=1 timeout 90 python3 -m pytest -q -x -p no:cacheprovider \
    tests/tune/test_timing.py 2>&1 | tail -15
SECONDS=0
timeout --signal=INT 150 python3 -m moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 \
    --batch-size 1 --batch-size 64 --save-dir "$OUT/probe" --json >"$OUT/probe.json" 2>"$OUT/probe.log"
echo "probe tune rc=$? wall=${SECONDS}s"
tail -c 3000 "$OUT/probe.log"
python3 - "$OUT/probe.json" "$OUT/probe/measurements.jsonl" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[2])]
print(collections.Counter((r["fidelity"], r["status"]) for r in rows))
compiles = [r["compile_s"] for r in rows if r["compile_s"]]
if compiles:
    print("compile_s median", statistics.median(compiles), "max", max(compiles), "n", len(compiles))
for r in rows:
    if r["status"] != "ok":
        print("failed:", r["candidate"], r["status"], r["error"])
        break
d = json.load(open(sys.argv[1]))
print({k: d[k] for k in ("wall_s", "measured", "reused", "parallel_compile", "ceilings")})
for r in d["results"]:
    base = (r.get("baselines") or {}).get("vllm_fallback") or {}
    print(r["batch_size"], r["config"], r["latency_us"], base.get("latency_us"), r["floor_us"])
PY
