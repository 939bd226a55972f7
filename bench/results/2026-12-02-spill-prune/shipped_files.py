"""Spilling tiles in the fused-MoE config files vLLM and SGLang ship, by device family.

A tile spills on NVIDIA before compute capability 10 when BLOCK_SIZE_M * BLOCK_SIZE_N /
(32 * num_warps) >= 256 (`moetune.tune.search.space.rule_accumulator_spills`). Counted
over every ``*device_name=*.json`` under a ``moe`` folder of each engine's package.

    cd <folder holding vllm/ and sglang/> && python shipped_files.py vllm sglang
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

SPILL_REGISTERS = 256
FAMILIES = (
    ("Blackwell", re.compile(r"B200|B300|GB\d")),
    ("AMD", re.compile(r"AMD|MI3")),
    ("Hopper (H100/H200/H20/H800)", re.compile(r"H100|H200|H20|H800")),
)


def family(device: str) -> str:
    return next((name for name, pattern in FAMILIES if pattern.search(device)), "other NVIDIA")


def main(engines: list[str]) -> int:
    for engine in engines:
        entries: Counter[str] = Counter()
        spilling: Counter[str] = Counter()
        for path in sorted(Path(engine).rglob("*.json")):
            found = re.search(r"device_name=([^,]+?)(?:,|\.json)", path.name)
            if "moe" not in str(path) or not found:
                continue
            try:
                table = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            name = family(found.group(1))
            for config in table.values():
                if isinstance(config, dict) and "BLOCK_SIZE_M" in config:
                    entries[name] += 1
                    share = config["BLOCK_SIZE_M"] * config["BLOCK_SIZE_N"]
                    if share / (32 * config.get("num_warps", 4)) >= SPILL_REGISTERS:
                        spilling[name] += 1
        for name in sorted(entries):
            print(
                f"{engine:7s} {name:28s} {entries[name]:5d} entries, {spilling[name]:3d} spilling"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
