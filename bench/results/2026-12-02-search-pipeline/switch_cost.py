"""Seconds a worker takes to set up another batch size's inputs on the GPU: a whole
`make_problem` (the workers before the pipeline) against `with_tokens` on kept weights (now).

    python switch_cost.py
"""

import statistics
import time

import torch

from moetune.kernel.problem import make_problem, with_tokens

SHAPES = {
    "Qwen3-235B TP4 bf16": (128, 384, 4096, 8, "bf16", None),
    "GLM-4.5-Air TP4 bf16": (128, 352, 4096, 8, "bf16", None),
    "DeepSeek-V3 TP8 fp8 block": (256, 256, 7168, 8, "fp8_w8a8", (128, 128)),
}
BATCH_SIZES = (1, 64, 512, 4096)


def seconds(step, repeats=5):
    found = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        found.append(time.perf_counter() - start)
    return statistics.median(found)


def fresh(m, shape):
    torch.cuda.empty_cache()
    return make_problem(m, *shape)


for name, shape in SHAPES.items():
    base = make_problem(1, *shape)
    whole = [seconds(lambda m=m: fresh(m, shape)) for m in BATCH_SIZES]  # noqa: B023
    tokens = [seconds(lambda m=m: with_tokens(base, m)) for m in BATCH_SIZES]  # noqa: B023
    print(
        f"{name}: make_problem {statistics.median(whole) * 1e3:.1f} ms "
        f"(M={BATCH_SIZES}: {', '.join(f'{s * 1e3:.1f}' for s in whole)}), "
        f"with_tokens {statistics.median(tokens) * 1e3:.2f} ms"
    )
