"""Does moetune's twin rank configs as the engine's own kernel does? (GPU)

For each shape and batch size, a seeded sample of configs from the pruned default
space is timed as whole MoE calls (CUDA graph, `moetune.tune.measure.timing`, "full"
fidelity) on moetune's twin of the engine's kernel (vLLM's: `moetune.kernel.fused_moe_kernel`;
SGLang's: `moetune.kernel.fused_moe_kernel_sglang`) and on the installed engine's kernel
(`moetune.engines.launch`), interleaved, same inputs. With ``--split`` (SGLang's up/down
split search) the same configs are timed as lone up and down GEMMs instead, with and
without TMA (`moetune.tune.measure.probe_timing`; a TMA probe the shape rules out is
left out), each kind of probe one point. Reported per point:

- Spearman's rank correlation of the two kernels' times;
- the cost of the twin's pick on the engine's kernel: engine time of the config the
  twin ranks first over the engine's best in the sample, minus one;
- the median same-config time ratio twin / engine (1.0: no drift);
- every output of both kernels checked against the float32 reference (`moetune.tune.measure.verify`).

Rows are appended to ``OUT/fidelity.jsonl`` as they are measured; ``--report`` turns
such a file into the Markdown table of BENCHMARKS.md.

    python bench/fidelity.py --engine vllm --shape qwen3-30b-tp1 --out DIR
    python bench/fidelity.py --engine sglang --split --shape deepseek-v3-fp8-tp8 --out DIR
    python bench/fidelity.py --report DIR/fidelity.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

SHAPES = {
    # name: (E, N, K, top_k, dtype, block_shape)
    "qwen3-30b-tp1": (128, 768, 2048, 8, "bf16", None),
    "mixtral-8x7b-tp2": (8, 7168, 4096, 2, "bf16", None),
    "deepseek-v3-fp8-tp8": (256, 256, 7168, 8, "fp8_w8a8", (128, 128)),
    "glm-4.5-air-tp4": (128, 352, 4096, 8, "bf16", None),
    # A check of this script on the CPU (``--device cpu`` under TRITON_INTERPRET=1).
    "tiny-fp8-block": (8, 128, 256, 2, "fp8_w8a8", (128, 128)),
}
BATCH_SIZES = (1, 16, 64, 256, 1024, 4096)


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, index in enumerate(order):
            out[index] = float(rank)
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 1.0


def point_summary(rows: list[dict]) -> dict:
    """Spearman, the twin pick's cost on the engine, and the same-config ratio of one point."""
    ok = [r for r in rows if r.get("twin_us") and r.get("engine_us")]
    twin = [r["twin_us"] for r in ok]
    engine = [r["engine_us"] for r in ok]
    pick = min(ok, key=lambda r: r["twin_us"])
    return {
        "configs": len(ok),
        "spearman": spearman(twin, engine),
        "twin_pick_cost": pick["engine_us"] / min(engine) - 1.0,
        "ratio_median": statistics.median(t / e for t, e in zip(twin, engine, strict=True)),
        "max_rel_rms": max(
            (r[f"{k}_rel_rms"] for r in ok for k in ("engine", "twin") if f"{k}_rel_rms" in r),
            default=None,
        ),
    }


def sample_configs(problem, batch_size: int, count: int, seed: int) -> list:
    import torch

    from moetune.device import DeviceLimits
    from moetune.tune.api import default_space, prune

    limits = DeviceLimits.from_torch() if torch.cuda.is_available() else DeviceLimits.h200()
    kept = prune(default_space(), problem, batch_size, limits).kept
    return random.Random(seed * 1000 + batch_size).sample(kept, min(count, len(kept)))


def _time(name: str, row: dict, timed, inputs) -> None:  # noqa: ANN001
    """``row[name]`` = `timed(inputs)`'s median us, or None and the error's first line."""
    try:
        outcome = timed(inputs)
    except Exception as exc:  # noqa: BLE001 - a failed config is a row
        row[name], row[name + "_error"] = None, str(exc).splitlines()[0]
        return
    median = getattr(outcome, "median_us", None)
    if median is None and getattr(outcome, "status", "ok") != "ok":
        row[name], row[name + "_error"] = None, f"{outcome.status}: {outcome.error}"
        return
    row[name] = median if median is not None else outcome.latency_us


def _timer(problem, m: int, config: dict, item):  # noqa: ANN001, ANN202
    """The timing of `item` (a `Probe`; None: the whole call with `config`) on given inputs."""
    from moetune.tune.api import measure_probe, time_fused_moe

    if item is None:
        return lambda inputs: time_fused_moe(inputs, config, "full")
    return lambda inputs: measure_probe(problem, m, "full", item, inputs)


def _probes(candidate) -> list:  # noqa: ANN001
    from moetune.kernel.probe import Probe

    return [Probe(kind, candidate, use_tma=tma) for kind in ("up", "down") for tma in (False, True)]


def measure(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import torch

    from moetune.engines.launch import engine_gemm, resolve_kernel, twin_ref
    from moetune.kernel.problem import make_problem
    from moetune.tune.api import TuneProblem, check_output

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "fidelity.jsonl"
    ref = resolve_kernel(args.engine, args.engine).kernel
    gemm = engine_gemm(ref)
    twin = twin_ref(args.engine)  # None: vLLM's twin, moetune's default kernel
    twin_gemm = None if twin is None else engine_gemm(twin)
    for shape in args.shape:
        e, n, k, top_k, dtype, block = SHAPES[shape]
        problem = TuneProblem(e, n, k, top_k, dtype, block)
        for m in args.batch_sizes:
            data = make_problem(m, e, n, k, top_k, dtype, block_shape=block, device=args.device)
            on_twin = replace(data, gemm=twin_gemm)
            on_engine = replace(data, gemm=gemm)
            for index, candidate in enumerate(sample_configs(problem, m, args.configs, args.seed)):
                config = candidate.as_config()
                items = _probes(candidate) if args.split else [None]
                for item in items:
                    row = {"shape": shape, "M": m, "config": config, "kernel": ref.tag()}
                    if item is not None:
                        row["probe"] = f"{item.kind}{'+tma' if item.use_tma else ''}"
                    order = ((on_twin, "twin_us"), (on_engine, "engine_us"))
                    timed = _timer(problem, m, config, item)
                    for inputs, name in order if index % 2 == 0 else order[::-1]:
                        _time(name, row, timed, inputs)
                    if item is None:  # both kernels' outputs against the float32 reference
                        for inputs, name in ((on_engine, "engine"), (on_twin, "twin")):
                            check = check_output(inputs, config, dtype)
                            row[f"{name}_rel_rms"], row[f"{name}_ok"] = check.rel_rms, check.ok
                    with rows_path.open("a") as f:
                        f.write(json.dumps(row) + "\n")
            del data, on_twin, on_engine
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            print(f"{shape} M={m} done at {time.strftime('%H:%M:%S')}", flush=True)
    return 0


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    points: dict[tuple[str, str, int], list[dict]] = {}
    for row in rows:
        points.setdefault((row["shape"], row.get("probe", "whole"), row["M"]), []).append(row)
    lines = [
        "| shape | timed | M | configs | Spearman | twin's pick on the engine's kernel | "
        "twin / engine, same config (median) | max rel. RMS (both kernels) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (shape, probe, m), point in points.items():
        if not any(r.get("twin_us") and r.get("engine_us") for r in point):
            lines.append(f"| {shape} | {probe} | {m} | 0 | | | | |")
            continue
        s = point_summary(point)
        rms = "" if s["max_rel_rms"] is None else f"{s['max_rel_rms']:.1e}"
        lines.append(
            f"| {shape} | {probe} | {m} | {s['configs']} | {s['spearman']:.3f} | "
            f"+{100 * s['twin_pick_cost']:.1f} % | {s['ratio_median']:.3f} | {rms} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(v) for v in s.split(",")], default=BATCH_SIZES
    )
    parser.add_argument("--configs", type=int, default=8, help="configs sampled per point")
    parser.add_argument(
        "--split", action="store_true", help="time lone up/down GEMMs (with and without TMA)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cpu: check the script (interpreter)")
    parser.add_argument("--out", default="bench/results/fidelity")
    parser.add_argument("--report", type=Path, help="print the table of a fidelity.jsonl")
    args = parser.parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    args.shape = args.shape or list(SHAPES)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
