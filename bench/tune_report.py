"""Render the results of bench/results/2026-11-30-tune/recipe.sh as Markdown.

    python bench/tune_report.py WORK_DIR > bench/results/tune-h200.md

WORK_DIR holds what the script packed: machine.txt, steps.txt, <model>-tune.json
(`moetune tune --json`), <model>-bench.json (`moetune benchmark --json`, with
the engine fallbacks, our file and vLLM's published file) and search/search.json
(or search.json, as kept in bench/results/2026-11-30-tune/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODELS = (
    ("qwen", "Qwen3-30B-A3B TP1"),
    ("mixtral", "Mixtral-8x7B TP2"),
)


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(num: float | None, den: float | None) -> str:
    return "-" if not num or not den else f"{num / den:.2f}x"


def _short(config: dict) -> str:
    return (
        f"{config['BLOCK_SIZE_M']}/{config['BLOCK_SIZE_N']}/{config['BLOCK_SIZE_K']}/"
        f"{config['GROUP_SIZE_M']}/{config['num_warps']}/{config['num_stages']}"
    )


def _fallback_us(row: dict) -> float | None:
    """vLLM's fallback config time (older results: moetune's default config)."""
    if "baselines" in row:
        return (row["baselines"].get("vllm_fallback") or {}).get("latency_us")
    return row.get("default_latency_us")


def model_section(work: Path, stem: str, title: str) -> list[str]:
    tune = _load(work / f"{stem}-tune.json")
    bench = _load(work / f"{stem}-bench.json")
    lines = [f"## {title}", ""]
    if tune is None:
        lines += [f"The tune did not finish (see {stem}-tune.log).", ""]
        return lines
    plan = tune["plan"]
    ceilings = tune.get("ceilings") or {}
    compile_ = tune.get("parallel_compile") or {}
    lines.append(
        f"`{plan['problem']}`, {plan['search']} search, {len(plan['batch_sizes'])} batch sizes: "
        f"**{tune['wall_s']:.0f} s wall** (inside the command: worker start-up, search, default "
        f"configs, verification, ceilings, files); {tune['measured']} measurements taken, "
        f"{tune['reused']} reused from the store."
    )
    if compile_.get("workers"):
        speedup = compile_["compile_s"] / compile_["wall_s"] if compile_.get("wall_s") else 0
        lines.append(
            f"Parallel compile pass: {compile_['warmed']} candidates on {compile_['workers']} "
            f"processes, {compile_['compile_s']:.0f} s of compile in {compile_['wall_s']:.0f} s "
            f"wall ({speedup:.1f}x)."
        )
    if ceilings:
        lines.append(
            f"Ceilings measured in the run: {ceilings['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s "
            f"({ceilings.get('bandwidth_source', 'device copy, read + write')}), "
            f"{ceilings['peak_flops_per_s'] / 1e12:.0f} TFLOP/s "
            f"({ceilings.get('peak_source', 'bf16 matmul')})."
        )
    lines.append("")
    by_m = {row["batch_size"]: row for row in tune["results"]}
    bench_rows = {}
    names = []
    if bench is not None:
        names = bench["configs"]
        bench_rows = {row["batch_size"]: row for row in bench["results"]}
    lines += [
        "Whole fused call, us (CUDA graph, median of replays). Tune columns: the tuner's own "
        "measurements; side-by-side columns: `moetune benchmark`, the three configs timed in "
        "one process, same harness.",
        "",
        "| M | chosen config (BM/BN/BK/G/warps/stages) | tuned us | fallback us | speedup "
        "| side by side: fallback / ours / vLLM's | ours vs vLLM's | floor us | of roofline |",
        "|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for m, row in sorted(by_m.items()):
        side, versus = "-", "-"
        if m in bench_rows and len(names) >= 3:
            # first column: vLLM's fallback (older results: the default config); last two:
            # our file and vLLM's published file, the --config order of the recipe
            picked = [names[0], names[-2], names[-1]]
            values = [bench_rows[m][name]["latency_us"] for name in picked]
            side = " / ".join(_us(v) for v in values)
            versus = _ratio(values[2], values[1])
        fraction = row.get("roofline_fraction")
        lines.append(
            f"| {m} | {_short(row['config'])} | {_us(row['latency_us'])} "
            f"| {_us(_fallback_us(row))} | {_ratio(_fallback_us(row), row['latency_us'])} "
            f"| {side} | {versus} | {_us(row.get('floor_us'))} "
            f"| {'-' if fraction is None else f'{100 * fraction:.0f} %'} |"
        )
    lines.append("")
    lines.append('"ours vs vLLM\'s" > 1 means our tuned config is faster on our kernel.')
    for note in tune.get("notes", []):
        lines.append(f"- {note}")
    lines.append("")
    return lines


def search_section(work: Path) -> list[str]:
    report = _load(work / "search" / "search.json") or _load(work / "search.json")
    if report is not None and "rows" not in report:
        report = None
    lines = ["## Fast vs exhaustive search", ""]
    if report is None:
        return lines + ["Not run (see search.log).", ""]
    lines += [
        f"`{report['problem']}` ({report['model']} TP{report['tp']}). Each search ran cold "
        "(empty results store, empty Triton cache, fresh worker processes, "
        f"{report['compile_workers']} compile workers) over the same pruned space at one batch "
        "size; fast search therefore had no neighbouring batch size to seed it. The two winners "
        "were then re-timed side by side (full fidelity, alternating, median of 3).",
        "",
        "| M | pruned space | fast: timed | fast wall s | exhaustive wall s | wall ratio "
        "| fast winner us | exhaustive winner us | gap |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        gap = "-" if row["gap"] is None else f"{100 * row['gap']:+.1f} %"
        lines.append(
            f"| {row['batch_size']} | {row['space']} | {row['fast_timed']} "
            f"| {row['fast_wall_s']:.1f} | {row['exhaustive_wall_s']:.1f} "
            f"| {row['wall_ratio']:.1f}x | {_us(row['fast_us'])} | {_us(row['exhaustive_us'])} "
            f"| {gap} |"
        )
    for skipped in report.get("skipped", []):
        lines.append(
            f"\nM={skipped['batch_size']}: exhaustive skipped, it would have taken "
            f"~{skipped['expected_s']:.0f} s with {skipped['left_s']:.0f} s left."
        )
    lines.append("")
    return lines


def main(argv: list[str]) -> int:
    work = Path(argv[1])
    lines = ["# `moetune tune` on an NVIDIA H200", ""]
    machine = work / "machine.txt"
    if machine.exists():
        lines += ["```", machine.read_text().strip(), "```", ""]
    for stem, title in MODELS:
        lines += model_section(work, stem, title)
    lines += search_section(work)
    steps = work / "steps.txt"
    if steps.exists():
        lines += ["## Steps (recipe.sh)", "", "```", steps.read_text().strip(), "```", ""]
    sys.stdout.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
