"""Fast search against exhaustive search, on the same shape and batch sizes, in one GPU session.

For each batch size, both searches run over the same pruned space, each from
a cold start (its own empty results store and its own empty Triton cache, so
both pay for compiling what they time), through the same worker pool the
tuner uses. Then both winners are re-timed side by side in one process,
alternating, at full fidelity, so the latency gap is not run-to-run noise.

    python bench/search.py --model Qwen/Qwen3-30B-A3B --tp 1 --batch-size 1 --batch-size 64 \
        --out bench/results/search --budget-s 240

Batch sizes run in the order given; one is skipped when the time left is
less than its expected exhaustive time (from the fast run's per-candidate
cost). Results go to OUT/search.json (rewritten after each batch size) and a
Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from moetune.fileio import atomic_write_json
from moetune.tune.api import (
    STORE_FILENAME,
    ResultStore,
    RunContext,
    StoreMeasurer,
    WorkerPool,
    WorkUnit,
    default_space,
    exhaustive_search,
    fast_search,
    prune,
)

SIDE_BY_SIDE_ROUNDS = 3


def search_once(kind, problem, batch_size, space, resolved, workdir, compile_workers):  # noqa: ANN001, ANN201
    """One cold search at one batch size: (SearchResult, wall seconds, measurer)."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(workdir / "triton-cache")  # inherited by the workers
    context = RunContext(problem, resolved.device_name, resolved.triton_version)
    started = time.perf_counter()
    with WorkerPool(list(resolved.devices), compile_workers=compile_workers) as pool:
        measurer = StoreMeasurer(context, pool, ResultStore(workdir / STORE_FILENAME))
        if kind == "exhaustive":
            found = exhaustive_search([batch_size], lambda _: space, measurer)
        else:
            found = fast_search([batch_size], lambda _: space, measurer, problem, resolved.limits)
    return found[batch_size], time.perf_counter() - started, measurer


def side_by_side(problem, batch_size, candidates, resolved):  # noqa: ANN001, ANN201
    """Median full-fidelity latency of each candidate, timed alternately in one process."""
    samples: dict = {c: [] for c in candidates}
    units = [
        WorkUnit(problem, batch_size, tuple(candidates), "full") for _ in range(SIDE_BY_SIDE_ROUNDS)
    ]
    with WorkerPool(list(resolved.devices)[:1]) as pool:
        for _, outcome in pool.run(units):
            if outcome.status == "ok":
                samples[outcome.candidate].append(outcome.latency_us)
    return {c: statistics.median(v) if v else None for c, v in samples.items()}


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    from moetune.commands.options import problem_from_options

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", action="store_true")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-size", type=int, action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=float("inf"))
    parser.add_argument("--compile-workers", type=int, default=None)
    args = parser.parse_args(argv)

    deadline = time.monotonic() + args.budget_s
    options = {"model": args.model, "tp": args.tp, "ep": args.ep, "ep_size": None}
    resolved = problem_from_options({**options, "dtype": args.dtype, "device_name": None})
    problem = resolved.problem
    on_gpu = any(d is not None for d in resolved.devices)
    workers = args.compile_workers
    if workers is None:
        workers = max(0, min(16, (os.cpu_count() or 2) - 2)) if on_gpu else 0
    report = {
        "problem": problem.key(),
        "model": args.model,
        "tp": args.tp,
        "device_name": resolved.device_name,
        "triton_version": resolved.triton_version,
        "compile_workers": workers,
        "rows": [],
        "skipped": [],
    }
    print(
        "| M | pruned space | fast timed | fast wall s | exhaustive wall s | wall ratio "
        "| fast us | exhaustive us | gap |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in args.batch_size:
        space = prune(default_space(), problem, m, resolved.limits).kept
        fast, fast_wall, _ = search_once(
            "fast", problem, m, space, resolved, args.out / f"M{m}-fast", workers
        )
        per_candidate = fast_wall / max(1, fast.timed)
        left = deadline - time.monotonic()
        if per_candidate * len(space) > left:
            report["skipped"].append(
                {
                    "batch_size": m,
                    "space": len(space),
                    "expected_s": per_candidate * len(space),
                    "left_s": left,
                }
            )
            print(
                f"skipped M={m}: exhaustive would take ~{per_candidate * len(space):.0f} s, "
                f"{left:.0f} s left",
                file=sys.stderr,
            )
            continue
        exhaustive, exhaustive_wall, _ = search_once(
            "exhaustive", problem, m, space, resolved, args.out / f"M{m}-exhaustive", workers
        )
        pair = [fast.best.candidate, exhaustive.best.candidate]
        latency = side_by_side(problem, m, list(dict.fromkeys(pair)), resolved)
        fast_us, exhaustive_us = latency[pair[0]], latency[pair[1]]
        row = {
            "batch_size": m,
            "space": len(space),
            "fast_timed": fast.timed,
            "fast_measurements": fast.measurements,
            "fast_wall_s": fast_wall,
            "exhaustive_timed": exhaustive.timed,
            "exhaustive_wall_s": exhaustive_wall,
            "wall_ratio": exhaustive_wall / fast_wall,
            "fast_config": pair[0].as_config(),
            "exhaustive_config": pair[1].as_config(),
            "fast_us": fast_us,
            "exhaustive_us": exhaustive_us,
            "gap": None if not (fast_us and exhaustive_us) else fast_us / exhaustive_us - 1,
            "fast_search_us": fast.best.latency_us,
            "exhaustive_search_us": exhaustive.best.latency_us,
        }
        report["rows"].append(row)
        atomic_write_json(args.out / "search.json", report)
        gap = "-" if row["gap"] is None else f"{100 * row['gap']:+.1f} %"
        print(
            f"| {m} | {len(space)} | {fast.timed} | {fast_wall:.1f} | {exhaustive_wall:.1f} "
            f"| {row['wall_ratio']:.1f}x | {_us(fast_us)} | {_us(exhaustive_us)} | {gap} |",
            flush=True,
        )
    atomic_write_json(args.out / "search.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
