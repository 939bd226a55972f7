"""The side-by-side timings (side_by_side.sh) as a table: per batch size, each file's call time
and the pipelined search's file against the sequential search's (same run, same process).

    python sbs_report.py h200/side_by_side_tp4.json [...]
"""

import json
import math
import sys


def column(configs, tag):
    found = [c for c in configs if f"/{tag}/" in c]
    return found[0] if found else None


for path in sys.argv[1:]:
    data = json.load(open(path))
    old, new = column(data["configs"], "old"), column(data["configs"], "new")
    recorded = column(data["configs"], "recorded")
    print(f"{path}: {data['problem']}")
    head = "  M      | sequential (main) | pipelined | pipelined/sequential"
    print(head + (" | sequential, 2026-12-02 run | its /sequential (main)" if recorded else ""))
    ratios, again = [], []
    for row in data["results"]:
        o, n = row[old]["latency_us"], row[new]["latency_us"]
        ratios.append(n / o)
        same = " (same config)" if row[old]["config"] == row[new]["config"] else ""
        line = f"  {row['batch_size']:6} | {o:8.2f} | {n:8.2f} | {n / o - 1:+6.2%}{same}"
        if recorded:
            r = row[recorded]["latency_us"]
            again.append(r / o)
            line += f" | {r:8.2f} | {r / o - 1:+6.2%}"
        print(line)

    def summary(values):
        g = math.exp(sum(map(math.log, values)) / len(values))
        over = sum(v > 1.01 for v in values)
        return f"geomean {g - 1:+.2%}, worst {max(values) - 1:+.2%}, over +1 % at {over} of {len(values)}"

    print(f"  pipelined/sequential: {summary(ratios)}")
    if recorded:
        print(f"  sequential 2026-12-02/sequential today: {summary(again)}")
