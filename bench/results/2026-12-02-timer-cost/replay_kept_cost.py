"""The split stage of the recorded Qwen3-235B TP8 default tune replayed with kept routings.

`bench/replay_split_wall.py`'s replay (the tuner's own split search over a simulated clock of 14
compile processes and one timer) of 2026-12-02-search-pipeline's pipelined H200 run, with the
timer's cost per lone timing scaled by the ratio of kept to fresh routings that
`bench/probe_cost.py` measured on the H200 (call 1 of this folder), interpolated on log2(M).
Run from the repository root:

    PYTHONPATH=$PWD python bench/results/2026-12-02-timer-cost/replay_kept_cost.py
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
import replay_split_wall  # noqa: E402
import replay_wall  # noqa: E402

# Kept / fresh wall per lone timing, call 1 (h200/call1/cost_bf16.txt, up and down).
KEPT_OVER_FRESH = {1: 0.14, 16: 0.24, 256: 0.54, 4096: 0.84}


def ratio(m: int) -> float:
    points = sorted(KEPT_OVER_FRESH)
    for low, high in zip(points, points[1:], strict=False):
        if m <= high:
            t = (math.log2(m) - math.log2(low)) / (math.log2(high) - math.log2(low))
            return KEPT_OVER_FRESH[low] + t * (KEPT_OVER_FRESH[high] - KEPT_OVER_FRESH[low])
    return KEPT_OVER_FRESH[points[-1]]


recorded_of = replay_wall.Recorded.of.__func__


def scaled_of(cls, key, rows, others, kinds=("whole",)):  # noqa: ANN001, ANN201
    recorded = recorded_of(cls, key, rows, others, kinds)
    if kinds != ("whole",):  # the split stage's timer
        recorded.timer_s = {k: v * ratio(k[0]) for k, v in recorded.timer_s.items()}
    return recorded


replay_wall.Recorded.of = classmethod(scaled_of)
replay_split_wall.Recorded = replay_wall.Recorded

store, summary = replay_split_wall.RECORDED[2]  # search-pipeline/h200/pipelined
stage = replay_split_wall.split_stage(store, summary)
print(store.relative_to(Path.cwd()) if store.is_relative_to(Path.cwd()) else store)
for pipelined in (False, True):
    run = replay_split_wall.replay_split(stage, pipelined, switch_s=0.005)
    name = "side by side" if pipelined else "one batch size after another"
    print(
        f"  {name}: wall {run.wall_s:.1f} s, timer busy {run.timer_busy_s:.1f} s, "
        f"compile {run.compile_cpu_s:.1f} CPU-s, {run.timings} timings"
    )
