"""Render the results of recipe.sh (beside this script) as Markdown.

    python bench/results/2026-12-01-h200-session/split-pair/report.py WORK_DIR > report.md

Per shape and batch size: the whole call of the best single config and of the
split pair SGLang gets, both timed in the same harness (the tuner's "pair"
timings, full fidelity), the speedup, the pair's configs, and the roofline
floor. Taken from `moetune tune --json` summaries; for a group cut by its time
limit, from the pair rows of its results store (marked "store").

The floor is recomputed here with this tree's roofline (`moetune.roofline`): read
bandwidth at the GPU's HBM spec, the bf16/fp8 matmul peak the run measured, and
under ``--routing`` the experts the replayed dump's timed windows hit
(`moetune.tune.measure.routing_load`). The H200 runs of 2026-12-01 were made before
those two changes, so their own `floor_us` (stream-read bandwidth, uniform
routing) came out above the measured time at some points.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from moetune.roofline import hbm_spec, moe_roofline
from moetune.tune.problem import TuneProblem

SHAPES = (
    ("qwen", "Qwen3-30B-A3B TP1 bf16 (E=128, N=768)", ("qwen-big", "qwen-small")),
    ("dsv3", "DeepSeek-V3 TP8 fp8 block (E=256, N=256)", ("dsv3-big", "dsv3-small")),
    ("e256", "DeepSeek-V3 TP4 bf16 (E=256, N=512, K=7168)", ("e256-big", "e256-small")),
    ("q35", "Qwen3.5-35B-A3B TP1 bf16 (E=256, N=512, K=2048)", ("q35-big", "q35-small")),
    ("qwen-routing", "Qwen3-30B-A3B TP1 bf16, --routing skewed dump", ("qwen-routing",)),
)
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _short(entry: dict | None) -> str:
    if not entry:
        return "-"
    text = "M{} N{} K{} G{} w{} s{}".format(*(entry[k] for k in KEYS))
    return text + (" TMA" if entry.get("USE_TMA") else "")


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def floor_us(summary: dict, batch_size: int, work: Path) -> float | None:
    """The roofline floor of one batch size of a tune summary (see the module docstring)."""
    problem = TuneProblem.from_key(summary["plan"]["problem"])
    e, top_k = problem.num_experts, problem.top_k
    bandwidth = hbm_spec(summary["plan"]["device_name"])
    peak = summary["ceilings"]["peak_flops_per_s"]
    if bandwidth is None:
        return None
    hit = None
    if problem.routing_digest is not None:
        from moetune.tune.measure.routing_dump import load_routing
        from moetune.tune.measure.routing_load import floor_experts_hit

        dump = load_routing(work / "skewed-qwen.npy", e, top_k)
        hit = floor_experts_hit(dump, batch_size, e)
    roof = moe_roofline(
        batch_size,
        e,
        problem.intermediate_size,
        problem.hidden_size,
        top_k,
        problem.dtype,
        problem.engine_block_shape,
        experts_hit=hit,
    )
    return 1e6 * roof.floor_seconds(bandwidth, peak)


def _from_summary(summary: dict, work: Path) -> dict[int, dict]:
    floors = {r["batch_size"]: floor_us(summary, r["batch_size"], work) for r in summary["results"]}
    rows = {}
    for row in summary.get("split", []):
        m = row["batch_size"]
        rows[m] = {**row, "floor_us": floors.get(m), "source": "summary"}
    return rows


def _from_store(store: Path, problem_key: str | None) -> dict[int, dict]:
    """Best split pair and the single config per batch size, from the store's pair rows."""
    rows: dict[int, dict] = {}
    try:
        lines = store.read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("kind") != "pair" or m.get("fidelity") != "full" or m.get("status") != "ok":
            continue
        if problem_key and m["problem_key"] != problem_key:
            continue
        row = rows.setdefault(m["batch_size"], {"batch_size": m["batch_size"], "source": "store"})
        single = m["down_candidate"] == m["candidate"] and not m["use_tma"] and not m["down_tma"]
        if single:
            row["single_us"] = m["latency_us"]
        elif m["latency_us"] < row.get("pair_us", float("inf")):
            row["pair_us"] = m["latency_us"]
            row["up"] = {**m["candidate"], "USE_TMA": m["use_tma"]}
            row["down"] = {**m["down_candidate"], "USE_TMA": m["down_tma"]}
    return rows


def shape_rows(work: Path, name: str, steps: tuple[str, ...]) -> tuple[dict[int, dict], list[str]]:
    rows: dict[int, dict] = {}
    notes = []
    for step in steps:
        summary = _load(work / f"{step}.json")
        if summary and summary.get("split") is not None and "plan" in summary:
            rows.update(_from_summary(summary, work))
            notes.append(
                f"{step}: wall {summary['wall_s']:.0f} s, {summary['measured']} timed, "
                f"{summary['reused']} from the store"
            )
        else:
            notes.append(f"{step}: no summary (cut by its time limit, or not run)")
    if not rows:
        rows = _from_store(work / name / "measurements.jsonl", None)
    return rows, notes


def render(work: Path) -> str:
    out = ["# Issue 8: SGLang split up/down pair vs the best single config (H200)", ""]
    machine = work / "machine.txt"
    if machine.exists():
        out += ["```", machine.read_text().strip(), "```", ""]
    steps = work / "steps.txt"
    if steps.exists():
        out += ["Steps:", "```", steps.read_text().strip(), "```", ""]
    for name, title, step_names in SHAPES:
        rows, notes = shape_rows(work, name, step_names)
        out += [f"## {title}", ""]
        out += [f"- {note}" for note in notes]
        out += [
            "",
            "Whole call, same harness (us; rotating routings in a CUDA graph). `written`: what "
            "the SGLang tables hold (the pair only when strictly faster). Floor: bytes at the "
            "HBM spec (4.8 TB/s on an H200) or flops at the measured matmul peak.",
            "",
            "| M | single us | split pair us | single/pair | up | down | written | floor us | "
            "pair % roofline |",
            "|---:|---:|---:|---:|---|---|---|---:|---:|",
        ]
        for m in sorted(rows):
            row = rows[m]
            single, pair = row.get("single_us"), row.get("pair_us")
            ratio = f"{single / pair:.3f}" if single and pair else "-"
            floor = row.get("floor_us")
            best = min(v for v in (single, pair) if v) if (single or pair) else None
            roof = f"{100 * floor / best:.0f}" if floor and best else "-"
            written = row.get("written", "-")
            out.append(
                f"| {m} | {_us(single)} | {_us(pair)} | {ratio} | {_short(row.get('up'))} | "
                f"{_short(row.get('down'))} | {written} | {_us(floor)} | {roof} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(Path(sys.argv[1])))
