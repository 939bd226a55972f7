"""The pipelined fast search against the sequential one on the synthetic GPU (no GPU).

3 shapes x SEEDS landscapes x 18 batch sizes; each pick's noise-free latency over the
space's noise-free best (the gap), and over the sequential search's pick. The control is
the sequential search again with other timing noise: how far two runs of the same search
land apart.

    PYTHONPATH=. python bench/results/2026-12-02-search-pipeline/synthetic_quality.py [SEEDS]
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "tune"))

from synthetic import SyntheticGPU  # noqa: E402

from moetune.device import DeviceLimits  # noqa: E402
from moetune.tune.problem import TuneProblem  # noqa: E402
from moetune.tune.search.space import DEFAULT_BATCH_SIZES, default_space, prune  # noqa: E402
from moetune.tune.search.strategy import FastSearchOptions, fast_search  # noqa: E402

H200 = DeviceLimits.h200()
SHAPES = {
    "Qwen3-30B": TuneProblem(128, 768, 2048, 8, "bf16"),
    "Mixtral TP2": TuneProblem(8, 7168, 4096, 2, "bf16"),
    "DeepSeek-V3 TP8": TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128)),
}
RUNS = {
    "sequential": (FastSearchOptions(pipelined=False), None),
    "sequential, other noise": (FastSearchOptions(pipelined=False), 999),
    "pipelined": (FastSearchOptions(), None),
}


def main(seeds: int) -> None:
    gaps = {name: [] for name in RUNS}
    calls = dict.fromkeys(RUNS, 0)
    for problem in SHAPES.values():
        spaces = {m: prune(default_space(), problem, m, H200).kept for m in DEFAULT_BATCH_SIZES}
        for seed in range(seeds):
            for name, (options, noise) in RUNS.items():
                gpu = SyntheticGPU(problem, seed)
                if noise is not None:
                    gpu.rng.seed(noise + seed)
                found = fast_search(
                    DEFAULT_BATCH_SIZES, spaces.__getitem__, gpu, problem, H200, options
                )
                calls[name] += len(gpu.calls)
                for m in DEFAULT_BATCH_SIZES:
                    best = min(t for t in (gpu.true_us(m, c) for c in spaces[m]) if t)
                    gaps[name].append(gpu.true_us(m, found[m].best.candidate) / best)
    base = gaps["sequential"]
    for name, values in gaps.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        print(
            f"{name:24} gap mean {sum(values) / len(values) - 1:.4%} max {max(values) - 1:.2%}, "
            f">1 % at {sum(v > 1.01 for v in values)}, >2 % at {sum(v > 1.02 for v in values)} "
            f"of {len(values)}; against the sequential pick: worse by >1 % at "
            f"{sum(r > 1.01 for r in ratios)}, better by >1 % at {sum(r < 0.99 for r in ratios)}; "
            f"{calls[name]} timings"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 14)
