"""How close tiles whose accumulator spills came to the best, in every recorded H200 store (no GPU).

A tile spills on Hopper when its accumulator needs `ACCUMULATOR_SPILL_REGISTERS` (256) or
more registers per thread (`moetune.tune.search.space.accumulator_registers`). For every
store of whole-call timings under bench/results and examples/ (`bench/compile_rates.py`'s
`RECORDED`), per (problem, batch size, fidelity): each spilling tile's ok latency over
the best ok latency there. Printed: per store, the spilling timings, their closest and
median ratio, and the compile CPU-s they took; then the totals. With ``--excerpt OUT`` it
also writes, per (store, problem, batch size, fidelity) that timed a spilling tile, the
best timing and the spilling ones (the excerpt `tests/tune/test_spill_rule.py` reads).

    PYTHONPATH=. python bench/results/2026-12-02-spill-prune/spill_evidence.py [--excerpt OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import astuple
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

from compile_rates import RECORDED, _rows  # noqa: E402

from moetune.kernel.config import Candidate  # noqa: E402
from moetune.tune.search.space import (  # noqa: E402
    ACCUMULATOR_SPILL_REGISTERS,
    accumulator_registers,
)


def spills(candidate: Candidate) -> bool:
    return accumulator_registers(candidate) >= ACCUMULATOR_SPILL_REGISTERS


def store_groups(path: Path) -> list[dict]:
    """Per (problem, batch size, fidelity) with a spilling tile timed: the best and the spills."""
    rows = [
        r
        for r in _rows(path)
        if r.get("kind", "whole") == "whole" and r.get("device_name", "").endswith("H200")
    ]
    latest: dict[tuple, dict] = {}
    for row in sorted(rows, key=lambda r: r["timestamp"]):
        candidate = Candidate.from_config(row["candidate"])
        latest[(row["problem_key"], row["batch_size"], row["fidelity"], candidate)] = row
    by_group: dict[tuple, list[tuple[Candidate, dict]]] = defaultdict(list)
    for (key, m, fidelity, candidate), row in latest.items():
        by_group[(key, m, fidelity)].append((candidate, row))
    groups = []
    for (key, m, fidelity), members in sorted(by_group.items(), key=lambda item: str(item[0])):
        ok = [(c, r) for c, r in members if r["status"] == "ok" and r["latency_us"] is not None]
        spilling = [(c, r) for c, r in ok if spills(c)]
        if not spilling:
            continue
        best_c, best_r = min(ok, key=lambda item: item[1]["latency_us"])
        groups.append(
            {
                "store": str(path.relative_to(ROOT)),
                "problem": key,
                "batch_size": m,
                "fidelity": fidelity,
                "best": [*astuple(best_c), best_r["latency_us"]],
                "spilling": [[*astuple(c), r["latency_us"]] for c, r in spilling],
                "spilling_compile_s": sum(r["compile_s"] or 0.0 for c, r in spilling),
            }
        )
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--excerpt", type=Path)
    args = parser.parse_args(argv)
    every: list[dict] = []
    stores = 0
    for path in RECORDED:
        groups = store_groups(path)
        if not groups:
            continue
        stores += 1
        every += groups
        ratios = [s[6] / g["best"][6] for g in groups for s in g["spilling"]]
        compile_s = sum(g["spilling_compile_s"] for g in groups)
        print(
            f"{len(ratios):4d} spilling timings, closest {min(ratios):5.2f}x, median "
            f"{statistics.median(ratios):5.2f}x, {compile_s:6.1f} compile CPU-s  "
            f"{path.relative_to(ROOT)}"
        )
    ratios = sorted(s[6] / g["best"][6] for g in every for s in g["spilling"])
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"\n{stores} stores, {len(ratios)} spilling timings in {len(every)} (problem, M, "
        f"fidelity) groups: closest {ratios[0]:.2f}x the best, quartiles "
        f"{quartiles[0]:.2f} / {quartiles[1]:.2f} / {quartiles[2]:.2f}x, farthest "
        f"{ratios[-1]:.1f}x; a spilling tile was the best in "
        f"{sum(1 for g in every if spills(Candidate(*g['best'][:6])))} groups"
    )
    if args.excerpt:
        for group in every:
            group.pop("spilling_compile_s")
        text = json.dumps(every, separators=(",", ":")) + "\n"
        with gzip.open(args.excerpt, "wt") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
