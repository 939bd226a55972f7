"""M=1 picks drift between runs: is it noise inside a timing, or drift between timings?

The eight fastest M=1 configs of the recorded Qwen3-235B TP4 tune (pipelined run), timed
with the tuner's whole-call harness (`time_fused_moe`, full fidelity) on moetune's twin of
vLLM 0.33.0's kernel (same SASS as vLLM's), in `ROUNDS` interleaved rounds (A..H, A..H, ...),
then in blocks (A x ROUNDS, B x ROUNDS, ...). Prints per config: the median and the spread
over rounds, and each round's ranking. Writes $OUT/m1_drift.jsonl.
"""

import json
import os
import statistics
import sys
import time

from moetune.kernel.problem import make_problem
from moetune.tune.measure.timing import time_fused_moe

CONFIGS = [  # (BLOCK_SIZE_M, N, K, GROUP_SIZE_M, num_warps, num_stages)
    (16, 32, 128, 64, 4, 5),
    (16, 32, 128, 1, 4, 5),
    (16, 64, 128, 1, 8, 5),
    (16, 32, 128, 32, 4, 4),
    (16, 32, 128, 16, 4, 5),
    (16, 32, 128, 32, 4, 5),
    (16, 64, 128, 64, 8, 5),
    (16, 32, 128, 16, 4, 4),
]
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
ROUNDS = int(os.environ.get("ROUNDS", "6"))


def main() -> int:
    out = os.environ.get("OUT", ".")
    data = make_problem(1, 128, 384, 4096, 8, "bf16", device="cuda")
    configs = [dict(zip(KEYS, c, strict=True)) for c in CONFIGS]
    for c in configs:
        time_fused_moe(data, c, "quick")  # compile first
    rows = []
    order = [("interleaved", r, i) for r in range(ROUNDS) for i in range(len(configs))]
    order += [("blocked", r, i) for i in range(len(configs)) for r in range(ROUNDS)]
    with open(os.path.join(out, "m1_drift.jsonl"), "w") as log:
        for schedule, r, i in order:
            t = time_fused_moe(data, configs[i], "full")
            row = {
                "schedule": schedule,
                "round": r,
                "config": CONFIGS[i],
                "median_us": t.median_us,
                "p20_us": t.p20_us,
                "p80_us": t.p80_us,
                "at": time.time(),
            }
            rows.append(row)
            log.write(json.dumps(row) + "\n")
    for schedule in ("interleaved", "blocked"):
        print(schedule)
        for c in CONFIGS:
            v = [r["median_us"] for r in rows if r["schedule"] == schedule and r["config"] == c]
            print(
                f"  {c}: median {statistics.median(v):.2f} min {min(v):.2f} max {max(v):.2f} "
                f"spread {100 * (max(v) / min(v) - 1):.1f} %"
            )
        for r in range(ROUNDS):
            got = sorted(
                (row["median_us"], i)
                for i, c in enumerate(CONFIGS)
                for row in rows
                if row["schedule"] == schedule and row["round"] == r and row["config"] == c
            )
            print(f"  round {r}: ranking {[i for _, i in got]}  best {got[0][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
