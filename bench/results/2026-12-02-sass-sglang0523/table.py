"""This folder's README tables from the sass_loop.py --json records (no GPU, no Triton).

python bench/results/2026-12-02-sass-sglang0523/table.py
"""

import collections
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSIONS = ("3.6.0", "3.9.0")


def records(name: str) -> list[dict]:
    path = HERE / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def cell(group: list[dict]) -> str:
    """'n/n =' when all identical, else the counts of each outcome."""
    same = sum(r["identical"] is True for r in group)
    differ = sum(r["identical"] is False for r in group)
    neither = sum(len(r["errors"]) == 2 for r in group)
    one = sum(len(r["errors"]) == 1 for r in group)
    parts = [f"{same}/{len(group)} ="]
    parts += [f"{differ} differ"] if differ else []
    parts += [f"{neither} neither compiles"] if neither else []
    parts += [f"{one} one fails"] if one else []
    return ", ".join(parts)


def main() -> None:
    runs = {version: records(f"triton-{version}.jsonl") for version in VERSIONS}
    groups: dict = collections.defaultdict(lambda: {v: [] for v in VERSIONS})
    for version, run in runs.items():
        for r in run:
            swap = "swap" if r["swap_ab"] else "-"
            even = "even" if r["even_Ks"] else "tail"
            key = (r["path"], r["shape"], r["gemm"], r["tma"] or "-", swap, even)
            groups[key][version].append(r)
    print("| path | shape | GEMM | TMA | swap_ab | K | M | Triton 3.6.0 | Triton 3.9.0 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, by_version in groups.items():
        ms = sorted({r["M"] for group in by_version.values() for r in group})
        cells = [cell(by_version[v]) if by_version[v] else "not run" for v in VERSIONS]
        print(f"| {' | '.join(key)} | {','.join(map(str, ms))} | {' | '.join(cells)} |")
    for version, run in runs.items():
        print(f"\nTriton {version}: {cell(run)} ({len(run)} comparisons)")
    print("\n| control | path | GEMM | config | Triton 3.6.0 | Triton 3.9.0 |")
    print("|---|---|---|---|---|---|")
    controls = {v: records(f"control-triton-{v}.jsonl") for v in VERSIONS}
    for i, r in enumerate(controls[VERSIONS[0]]):
        outcomes = []
        for v in VERSIONS:
            c = controls[v][i] if i < len(controls[v]) else None
            if c is None:
                outcomes.append("not run")
            elif c["identical"] is False:
                first, second = c["instructions"]
                outcomes.append(f"different ({first} vs {second} instructions)")
            else:
                outcomes.append("IDENTICAL" if c["identical"] else f"errors {c['errors']}")
        print(
            f"| {r['control']} | {r['path']} | {r['gemm']} | {r['config']} | {' | '.join(outcomes)} |"
        )


if __name__ == "__main__":
    main()
