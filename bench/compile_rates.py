"""CPU seconds of compiling per whole-call timing, per kernel dtype, from recorded stores.

Every whole-call row carries `compile_s`: the seconds its candidate's first call took at
that batch size (its compile, or a load from Triton's cache). Summed once per (problem,
batch size, candidate) and divided by the problem's whole-call timings (both
fidelities), that is what a search spends compiling per timing; the median over the
stores of one dtype family is the rate `moetune.tune.estimate` prices compiling at
(`compile_s_per_timing` in moetune/data/estimate_rates.yaml). The timer's seconds per timing
(`timer_s_per_timing` there) are the median gap between consecutive rows of one problem.

    python bench/compile_rates.py [STORE.jsonl[.gz] ...]

With no store it reads every recorded store under bench/results and examples/ that
holds whole-call searches on an H200 machine (`RECORDED`): the estimate is priced for the
H200 machine's CPU, so a run kept under a folder named for another machine (``h100/``,
``h100-callA/``) is left out. Prints one line per problem, then one per family.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from moetune.dtypes import compile_family

ROOT = Path(__file__).resolve().parents[1]
OTHER_MACHINES = ("h100",)  # results folders from machines the estimate is not priced for
RECORDED = tuple(
    sorted(
        path
        for pattern in ("bench/results/**/*measurements.jsonl.gz", "examples/*/measurements.jsonl")
        for path in ROOT.glob(pattern)
        if not any(part.split("-")[0] in OTHER_MACHINES for part in path.relative_to(ROOT).parts)
    )
)
# A problem needs this many whole-call timings to be a search (not a probe run).
MIN_TIMINGS = 500


def family(problem_key: str) -> str:
    """The dtype family a store key's kernel compiles as (`compile_s_per_timing`'s keys):
    its quant_rules.yaml ``kernels:`` row's (`moetune.dtypes.compile_family`)."""
    fields = dict(part.split("=", 1) for part in problem_key.split(",") if "=" in part)
    return compile_family(
        fields["dtype"],
        block_shape=(1, 1) if "block_shape" in fields else None,
        per_channel="per_channel" in problem_key.split(","),
    )


def _rows(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def rates(path: Path) -> list[dict]:
    """Per problem with a search's worth of whole-call rows: its compile and timer rates."""
    rows = sorted(_rows(path), key=lambda row: row["timestamp"])
    found = []
    for key in dict.fromkeys(row["problem_key"] for row in rows):
        whole = [r for r in rows if r["problem_key"] == key and r.get("kind", "whole") == "whole"]
        if len(whole) < MIN_TIMINGS:
            continue
        first: dict[tuple, float] = {}
        for row in whole:
            pair = (row["batch_size"], json.dumps(row["candidate"], sort_keys=True))
            if pair not in first and row["compile_s"] is not None:
                first[pair] = row["compile_s"]
        gaps = [b["timestamp"] - a["timestamp"] for a, b in zip(whole, whole[1:], strict=False)]
        found.append(
            {
                "store": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
                "problem": key,
                "family": family(key),
                "timings": len(whole),
                "compile_s": sum(first.values()),
                "compile_s_per_timing": sum(first.values()) / len(whole),
                "gap_s": statistics.median(gaps),
            }
        )
    return found


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or list(RECORDED)
    by_family = defaultdict(list)
    for path in paths:
        for found in rates(path):
            by_family[found["family"]].append(found["compile_s_per_timing"])
            print(
                f"{found['family']:12} {found['timings']:5} timings {found['compile_s']:7.1f} "
                f"compile CPU-s {found['compile_s_per_timing']:.3f}/timing, timer gap "
                f"{found['gap_s']:.3f} s  {found['store']}  {found['problem']}"
            )
    print()
    for name, values in sorted(by_family.items()):
        print(
            f"{name:12} median {statistics.median(values):.3f} CPU-s per timing ({len(values)} searches)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
