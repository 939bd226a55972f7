"""Seconds per timing of the confirmation round, from recorded tune summaries.

A tune's summary (``moetune tune --json``) records each stage's seconds and, per batch
size, every confirmation timing (`results[].confirmation.timings_us`: one list of rounds
per config). The confirm stage's seconds over those timings is what one interleaved
timing costs, the runners-up's check against the reference (run inside the stage)
included: the rate `moetune.tune.estimate` prices the confirmation at
(`confirm_s_per_timing` in moetune/data/estimate_rates.yaml).

    python bench/confirm_rates.py [SUMMARY.json ...]

With no argument it reads the recorded summaries of tunes that ran the confirmation
(`RECORDED`). Prints one line per summary, then the rate over all of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# Every recorded tune with a confirmation stage: DeepSeek-V3 TP8 on vLLM 0.34.0's kernel, on
# an H100 (the only recorded run with one so far).
RECORDED = (ROOT / "results" / "2026-12-05-vllm034" / "h100" / "dsv3.json",)


def confirm_rate(path: Path) -> tuple[int, float]:
    """(confirmation timings, confirm stage seconds) of one summary, over its shapes."""
    data = json.loads(Path(path).read_text())
    timings = 0
    seconds = 0.0
    for shape in data.get("shapes", [data]):
        stages = [stage["seconds"] for stage in shape["stages"] if stage["stage"] == "confirm"]
        seconds += sum(stages)
        for row in shape["results"]:
            confirmation = row.get("confirmation") or {}
            timings += sum(len(rounds) for rounds in confirmation.get("timings_us", {}).values())
    return timings, seconds


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or list(RECORDED)
    total_timings, total_seconds = 0, 0.0
    for path in paths:
        timings, seconds = confirm_rate(path)
        total_timings += timings
        total_seconds += seconds
        each = seconds / timings if timings else float("nan")
        print(f"{timings:5} timings {seconds:7.1f} s  {each:.4f} s each  {path}")
    if total_timings:
        print(f"all    {total_seconds / total_timings:.4f} s per confirmation timing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
