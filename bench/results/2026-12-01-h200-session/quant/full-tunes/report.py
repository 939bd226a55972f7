"""Render the issue 9 same-call comparison (quantized dtypes beside bf16) as Markdown.

    python bench/results/2026-12-01-h200-session/quant/full-tunes/report.py bench/results/2026-12-01-h200-session/quant/full-tunes > report.md

Reads DIR/one-call/bench_*.json: one `moetune benchmark --json` per tuned file, all run
in one device call (DIR/recipe-benchmark-every-file.sh), and DIR/*/<name>.json, the `moetune tune --json`
summaries (tune wall time, timings, the matmul peaks measured).

Per batch size, the whole call of each tuned file and of the engine fallback it
replaces, and each tuned time as a fraction of the roofline floor. The floor is
`moetune.roofline.moe_roofline` under uniform routing: the weight bytes of the experts
hit at the H200's HBM spec (4.8 TB/s; weights are only read), or the flops at the
matmul peak of the dtype's tensor-core operands (`Ceilings.floor_seconds`: bf16 for bf16
and int4_w4a16, fp8, int8), as the int8 tune of the same session measured them (8192^3
matmuls).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from moetune.roofline import Ceilings, hbm_spec, moe_roofline
from moetune.tune.problem import TuneProblem

QWEN = ("bf16", "int4", "int8")
SCOUT = ("scoutbf16", "fp8pc")
TUNES = (  # (label, summary json relative to DIR)
    ("int4_w4a16 Qwen3-30B-A3B-GPTQ-Int4 TP1, vLLM file", "int4-rev2/int4.json"),
    ("int8_w8a8 Qwen3-30B-A3B TP1, SGLang files (split search included)", "int8-sglang/int8.json"),
    ("fp8 per-channel Llama-4-Scout TP4, vLLM file", "fp8pc-scout-tp4/fp8pc.json"),
    ("bf16 Llama-4-Scout TP4, vLLM file", "scout-bf16-tp4/scoutbf16.json"),
)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def dtype_of(report: dict) -> str:
    return TuneProblem.from_key(report["problem"]).dtype


def floor_us(key: str, m: int, ceilings: Ceilings) -> float:
    """The uniform-routing roofline floor of problem `key` at batch size `m`."""
    p = TuneProblem.from_key(key)
    roof = moe_roofline(
        m,
        p.num_experts,
        p.intermediate_size,
        p.hidden_size,
        p.top_k,
        p.dtype,
        p.engine_block_shape,
        per_channel=p.per_channel,
    )
    return 1e6 * ceilings.floor_seconds(roof, p.dtype)


def tuned_name(report: dict) -> str:
    return report["configs"][-1]


def rows_by_m(report: dict) -> dict[int, dict]:
    return {row["batch_size"]: row for row in report["results"]}


def cell(us: float | None, floor: float | None = None) -> str:
    if us is None:
        return "-"
    return f"{us:.1f}" if floor is None else f"{us:.1f} ({100 * floor / us:.0f} %)"


def main(work: Path) -> None:
    one = work / "one-call"
    reports = {p.stem.removeprefix("bench_"): load(p) for p in sorted(one.glob("bench_*.json"))}
    rows = {name: rows_by_m(report) for name, report in reports.items()}
    peaks = load(work / "int8-sglang" / "int8.json")["ceilings"]["peaks_tflops"]
    device = next(iter(reports.values()))["device_name"]
    ceilings = Ceilings(
        hbm_spec(device),
        "HBM spec",
        {kind: 1e12 * tflops for kind, tflops in peaks.items()},
        {kind: "measured" for kind in peaks},
    )
    print(
        f"All timings: {device}, Triton {next(iter(reports.values()))['triton_version']}, "
        f"one device call ({(one / 'date.txt').read_text().strip()}), `moetune benchmark` "
        "(whole call, CUDA graphs, fresh uniform routings per replay, p50)."
    )
    print(
        f"Floor: HBM spec {hbm_spec(device) / 1e12:.1f} TB/s, matmul peaks (TFLOP/s) "
        + ", ".join(f"{k} {v}" for k, v in peaks.items())
        + ".\n"
    )

    def table(names: tuple[str, ...], title: str, base: str) -> None:
        present = [n for n in names if n in reports]
        print(f"**{title}**\n")
        head = ["M"]
        for n in present:
            dtype = dtype_of(reports[n])
            head += [f"{dtype} tuned us (of roofline)", f"{dtype} vLLM fallback us"]
            if "sglang_fallback" in rows[n][1]:
                head.append(f"{dtype} SGLang fallback us")
        head += [
            f"{dtype_of(reports[n])} / {dtype_of(reports[base])}" for n in present if n != base
        ]
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))
        for m in sorted(rows[base]):
            line = [str(m)]
            tuned = {n: rows[n][m][tuned_name(reports[n])]["latency_us"] for n in present}
            for n in present:
                row = rows[n][m]
                line.append(cell(tuned[n], floor_us(reports[n]["problem"], m, ceilings)))
                line.append(cell(row["vllm_fallback"]["latency_us"]))
                if "sglang_fallback" in row:
                    line.append(cell(row["sglang_fallback"]["latency_us"]))
            line += [f"{tuned[n] / tuned[base]:.2f}x" for n in present if n != base]
            print("| " + " | ".join(line) + " |")
        print()
        for n in present:
            speedups = reports[n]["geomean_speedup"][tuned_name(reports[n])]
            parts = ", ".join(f"{v:.2f}x over {k.replace('_', ' ')}" for k, v in speedups.items())
            print(f"- {dtype_of(reports[n])}: geomean {parts}")
        print()

    table(
        QWEN, "Qwen3-30B-A3B TP1 (E=128, N=768, K=2048, top-8), one config per batch size", "bf16"
    )
    if "int8split" in reports:
        split = reports["int8split"]
        print(
            "**int8_w8a8, SGLang's split files as SGLang runs them** (up table + `_down` table; "
            "every column timed in the split harness, routing outside the graph)\n"
        )
        print("| M | split files us (of roofline) | vLLM fallback us | SGLang fallback us |")
        print("|---:|---:|---:|---:|")
        for m, row in sorted(rows["int8split"].items()):
            us = row[tuned_name(split)]["latency_us"]
            print(
                f"| {m} | {cell(us, floor_us(split['problem'], m, ceilings))} | "
                f"{cell(row['vllm_fallback']['latency_us'])} | "
                f"{cell(row['sglang_fallback']['latency_us'])} |"
            )
        speedups = split["geomean_speedup"][tuned_name(split)]
        print(
            "\n- geomean "
            + ", ".join(f"{v:.2f}x over {k.replace('_', ' ')}" for k, v in speedups.items())
            + "\n"
        )
    table(SCOUT, "Llama-4-Scout-17B-16E TP4 (E=16, N=2048, K=5120, top-1)", "scoutbf16")

    print("**Tune wall time** (`moetune tune --search fast`, 18 batch sizes)\n")
    print("| tune | wall s (this run) | timings measured / reused from the store |")
    print("|---|---:|---:|")
    for label, rel in TUNES:
        path = work / rel
        if path.exists():
            s = load(path)
            print(f"| {label} | {s['wall_s']:.0f} | {s['measured']} / {s['reused']} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(
            "usage: python report.py RESULTS_DIR (bench/results/2026-12-01-h200-session/quant/full-tunes)"
        )
    main(Path(sys.argv[1]))
