"""Side by side: the replays pruned with the safe rules only and with the fast search's rules.

Reads `replay_wall_safe.json` and `replay_wall_fast.json` (bench/replay_wall.py --pruning
safe|fast --json ...) next to this file; prints per search and schedule the replayed wall,
compile CPU-s and timings, and the picks' recorded full-fidelity latencies compared.

    python bench/results/2026-12-02-spill-prune/compare.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    safe, fast = (
        json.loads((HERE / f"replay_wall_{name}.json").read_text()) for name in ("safe", "fast")
    )
    for old, new in zip(safe, fast, strict=True):
        assert old["problem"] == new["problem"] and old["store"] == new["store"]
        store = Path(old["store"]).parent.name
        print(
            f"{store}: {old['problem']} ({old['search']} search, {len(old['batch_sizes'])} batch sizes)"
        )
        for schedule, before in old["runs"].items():
            after = new["runs"][schedule]
            print(
                f"  {schedule:36s} wall {before['wall_s']:6.1f} -> {after['wall_s']:6.1f} s, "
                f"compile {before['compile_cpu_s']:7.1f} -> {after['compile_cpu_s']:7.1f} CPU-s, "
                f"timings {before['timings']} -> {after['timings']}"
            )
        for schedule in old["runs"]:
            changed = []
            for p_old, p_new in zip(old["picks"], new["picks"], strict=True):
                us = [
                    p["old_us"] if schedule == "sequential" else p[schedule]["us"]
                    for p in (p_old, p_new)
                ]
                if us[0] != us[1]:
                    changed.append(f"M={p_old['batch_size']} {us[0]} -> {us[1]} us")
            same = len(old["picks"]) - len(changed)
            print(
                f"  picks, {schedule}: {same} of {len(old['picks'])} the same"
                + "".join(f"; {c}" for c in changed)
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
