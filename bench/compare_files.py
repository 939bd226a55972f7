"""Two tuned files timed side by side: A over B per batch size, over repeated benchmarks.

Reads ``moetune benchmark --json`` outputs that each timed both files (``--config A --config
B``, in either order). Per batch size it prints A's and B's latency in each run, A / B in each,
and their geometric mean; then how many batch sizes are within `--within` (A / B at most
1 + within) by that mean and in each run alone. A file is named by a part of its path
(``--a /qwen235/ --b /qwen235-thorough/``), so the runs may list them in any order.

    python bench/compare_files.py BENCH.json [BENCH.json ...] --a PART --b PART [--within 0.01]

One benchmark timing per file and batch size: a repeat with the files swapped measures how
far that moves, which at the smallest batch sizes is more than 1 %.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _column(run: dict[str, Any], part: str) -> str:
    found = [name for name in run["configs"] if part in name]
    if len(found) != 1:
        raise SystemExit(f"error: {len(found)} configs of the run match {part!r}, not one")
    return found[0]


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def compare(runs: Sequence[dict[str, Any]], a: str, b: str, within: float = 0.01) -> dict:
    """Per batch size: A's and B's latency per run, A / B per run and its geomean over runs."""
    rows: dict[int, dict[str, Any]] = {}
    for run in runs:
        col_a, col_b = _column(run, a), _column(run, b)
        for result in run["results"]:
            cell_a, cell_b = result[col_a], result[col_b]
            row = rows.setdefault(
                result["batch_size"],
                {
                    "batch_size": result["batch_size"],
                    "same": (cell_a["config"], cell_a.get("down_config"))
                    == (cell_b["config"], cell_b.get("down_config")),
                    "a_us": [],
                    "b_us": [],
                },
            )
            row["a_us"].append(cell_a["latency_us"])
            row["b_us"].append(cell_b["latency_us"])
    for row in rows.values():
        row["ratios"] = [x / y for x, y in zip(row["a_us"], row["b_us"], strict=True)]
        row["ratio"] = _geomean(row["ratios"])
    table = [rows[m] for m in sorted(rows)]
    return {
        "rows": table,
        "geomean": _geomean([row["ratio"] for row in table]),
        "within": within,
        "within_by_mean": sum(row["ratio"] <= 1 + within for row in table),
        "within_by_run": [
            sum(row["ratios"][i] <= 1 + within for row in table) for i in range(len(runs))
        ],
        "same": sum(row["same"] for row in table),
    }


def print_report(report: dict, a: str, b: str) -> None:
    runs = len(report["within_by_run"])
    print(f"A = {a}, B = {b}")
    print()
    print("| M | A us, per run | B us, per run | A / B, per run | A / B, geomean | same config |")
    print("|---:|---|---|---|---:|---|")
    for row in report["rows"]:
        print(
            f"| {row['batch_size']} | {' / '.join(f'{x:.1f}' for x in row['a_us'])} "
            f"| {' / '.join(f'{x:.1f}' for x in row['b_us'])} "
            f"| {' / '.join(f'{x:.3f}' for x in row['ratios'])} | {row['ratio']:.3f} "
            f"| {'yes' if row['same'] else ''} |"
        )
    print()
    share = f"{report['within']:.0%}"
    print(
        f"{len(report['rows'])} batch sizes: A / B geomean {report['geomean']:.4f}; within "
        f"{share} by the geomean of {runs} run(s) at {report['within_by_mean']}, in each run "
        f"alone at {', '.join(map(str, report['within_by_run']))}; the same config at "
        f"{report['same']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="moetune benchmark --json outputs")
    parser.add_argument("--a", required=True, help="a part of file A's path")
    parser.add_argument("--b", required=True, help="a part of file B's path")
    parser.add_argument("--within", type=float, default=0.01)
    args = parser.parse_args(argv)
    runs = [json.loads(Path(path).read_text()) for path in args.runs]
    print_report(compare(runs, args.a, args.b, args.within), args.a, args.b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
