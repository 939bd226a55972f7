"""Seconds per timing of each kind, from the timestamps of recorded results stores.

Every row of a store carries the time it was written. Sorted by time, the gap
before a row is what that row cost (compiling overlapped by the parallel
compile pass included); a gap over `SEGMENT_GAP_S` is a new run (a resume,
a restart) and is left out. Summed per kind (whole call, lone GEMM, pair) and
divided by the rows, that is the rate `moetune.tune.estimate` prices each kind at
(`seconds_per_lone` and `seconds_per_pair` in moetune/data/estimate_rates.yaml).

    python bench/split_rates.py STORE.jsonl[.gz] [...]

With no argument it reads the recorded H200 stores that hold split rows
(`RECORDED`). Prints one line per kind: rows, seconds, seconds per row.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SEGMENT_GAP_S = 30.0
# The recorded H200 default tunes of 2026-12-04 (both engines, the split search side by side,
# every variant of a round in one ask): the rates `moetune.tune.estimate` prices the split at.
# The 2026-12-01 stores (`OLDER`: the split-pair runs and the int8_w8a8 SGLang tune, one
# batch size after another, fresh routings per lone timing) give 0.065 s a lone timing.
RECORDED = tuple(
    sorted((ROOT / "results" / "2026-12-04-default-tunes" / "h200" / "call3").glob("*.jsonl.gz"))
)
RESULTS = ROOT / "results" / "2026-12-01-h200-session"
OLDER = (
    *sorted((RESULTS / "split-pair").glob("*.measurements.jsonl.gz")),
    RESULTS / "quant" / "full-tunes" / "int8-sglang" / "measurements.jsonl.gz",
)
GROUPS = {"whole": "whole", "up": "lone", "down": "lone", "pair": "pair"}


def _rows(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def rates(paths: list[Path]) -> dict[str, tuple[int, float]]:
    """Kind group ("whole", "lone", "pair") -> (rows, seconds) over every store in `paths`."""
    count: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for path in paths:
        rows = sorted(_rows(Path(path)), key=lambda row: row["timestamp"])
        for before, row in zip(rows, rows[1:], strict=False):
            gap = row["timestamp"] - before["timestamp"]
            if gap > SEGMENT_GAP_S:
                continue
            group = GROUPS[row.get("kind", "whole")]
            count[group] += 1
            seconds[group] += gap
    return {group: (count[group], seconds[group]) for group in count}


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or list(RECORDED)
    for group, (rows, seconds) in sorted(rates(paths).items()):
        print(f"{group:6} {rows:6} rows {seconds:8.1f} s  {seconds / rows:.3f} s each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
