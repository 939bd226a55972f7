"""How much of a timed call is not the engine's own code, and how far that could move it. (GPU)

moetune times a whole fused-MoE call on the engine's GEMM kernel, but the steps around the
two GEMMs are moetune's Triton kernels wherever the engine's are compiled code that a
``--no-deps`` install does not bring:

| step | SGLang 0.5.23 runs (CUDA) | vLLM runs | moetune times |
|---|---|---|---|
| routing (top-k softmax) | sgl_kernel ``topk_softmax`` | ``_moe_C.topk_softmax`` | `topk_routing` |
| alignment | ``sglang.kernels`` JIT CUDA (a Triton path at one token) | ``_moe_C.moe_align_block_size`` | `align_block_size` |
| x quantization (fp8) | JIT CUDA ``per_token_group_quant`` | ``_C`` / Triton | `per_token_group_quant_fp8` |
| SiLU-and-mul (+fp8 quant) | JIT CUDA ``silu_and_mul`` (tvm-ffi) | ``_C.silu_and_mul`` | `silu_and_mul(_quant_fp8)` |
| top-k sum | its Triton sum at <= 32 tokens (moetune runs it), else sgl_kernel ``moe_sum_reduce``; top-2 ``torch.add`` | ``_C.moe_sum`` | SGLang's Triton sum / `moe_sum` |

So a whole-call time can differ from the engine's own by what those stand-ins cost against the
engine's kernels. This script bounds that difference without the compiled kernels: per shape
and batch size it times, interleaved over ``--rounds`` rounds, in CUDA graphs
(`moetune.tune.measure.timing`, "full" fidelity):

- the whole call on the engine's kernel with the engine's fallback config;
- each stand-in step alone, on inputs of the call's shapes;
- an empty Triton kernel (the least any kernel costs in a graph here);
- the same steps written in plain torch (another implementation, for scale).

Each step's floor is the larger of its bytes over the GPU's HBM bandwidth (`moetune.roofline`)
and the empty kernel. Reported per point: the call, the stand-ins' share of it, and the
*headroom*: the sum over the stand-ins of (their time - their floor) over the call, the most
that any implementation of those steps, the engine's included, could take off the call. A step
the engine itself runs through moetune (SGLang's Triton sum, its top-2 ``torch.add``) is timed
but not counted as a stand-in.

Rows go to ``OUT/between_gemms.jsonl`` as they are measured; ``--report`` prints the table.

    python bench/between_gemms.py --engine sglang --out DIR [--shape NAME ...] [--rounds 3]
    python bench/between_gemms.py --report DIR/between_gemms.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SHAPES = {
    # name: (E, N, K, top_k, dtype, block_shape)
    "qwen3-235b-tp8": (128, 192, 4096, 8, "bf16", None),
    "deepseek-v3-fp8-tp8": (256, 256, 7168, 8, "fp8_w8a8", (128, 128)),
    "qwen3-30b-tp1": (128, 768, 2048, 8, "bf16", None),
    "mixtral-8x7b-tp2": (8, 7168, 4096, 2, "bf16", None),
    # A check of this script on the CPU (``--device cpu`` under TRITON_INTERPRET=1).
    "tiny-fp8-block": (8, 128, 256, 2, "fp8_w8a8", (128, 128)),
    "tiny-bf16": (8, 64, 128, 4, "bf16", None),
}
BATCH_SIZES = (1, 16, 64, 256, 1024, 4096)


class Step:
    """One step as a bench of `time_bench`: ``make()`` builds a slot's inputs, ``run(inputs)``
    launches the step on them. Slots are built once; refill leaves them as they are (the
    steps' cost does not depend on the values, the routing's aside, which draws fresh logits)."""

    def __init__(self, make: Any, run: Any, refill: Any = None) -> None:
        self.make, self.run, self._refill = make, run, refill
        self.slots: list[Any] = []

    def allocate(self, count: int) -> None:
        self.slots = [self.make() for _ in range(count)]

    def refill(self) -> None:
        if self._refill is not None:
            for inputs in self.slots:
                self._refill(inputs)

    def launch(self, slot: int) -> Any:
        return self.run(self.slots[slot])

    def release(self) -> None:
        self.slots = []


def steps_for(
    data: Any, gemm: Any, config: dict, block_shape: Any
) -> dict[str, tuple[Step, bool, int]]:
    """name -> (bench, whether it stands in for compiled engine code, bytes it must move)."""
    import torch
    import torch.nn.functional as F

    from moetune.kernel.activation import silu_and_mul, silu_and_mul_quant_fp8
    from moetune.kernel.align import align_block_size
    from moetune.kernel.quant import per_token_group_quant_fp8
    from moetune.kernel.reduce import moe_sum
    from moetune.kernel.routing import topk_routing

    x, logits, top_k = data.x, data.router_logits, data.top_k
    m, hidden = x.shape
    num_experts, two_n = data.w1.shape[0], data.w1.shape[1]
    n, rows, dev, bf = two_n // 2, m * top_k, x.device, x.dtype
    _, ids = topk_routing(logits, top_k)
    release = getattr(gemm, "release", None)
    align_slots = getattr(release, "align_slots", None)
    max_padded = (
        None if align_slots is None else align_slots(rows, config["BLOCK_SIZE_M"], num_experts)
    )
    combine = getattr(release, "combine", None)

    def gate_up() -> Any:
        return torch.randn(rows, two_n, dtype=bf, device=dev)

    def down() -> Any:
        return torch.randn(m, top_k, hidden, dtype=bf, device=dev)

    def fresh_logits(inputs: Any) -> None:
        inputs.normal_()

    steps: dict[str, tuple[Step, bool, int]] = {
        "routing": (
            Step(lambda: torch.randn_like(logits), lambda t: topk_routing(t, top_k), fresh_logits),
            True,
            logits.numel() * logits.element_size() + rows * 8,
        ),
    }
    quant_dtype = None if data.quant is None else data.quant.dtype
    naive = gemm is not None and gemm.naive_assignment(rows, num_experts, quant_dtype, block_shape)
    if not naive:
        steps["alignment"] = (
            Step(
                lambda: ids.clone(),
                lambda t: align_block_size(t, config["BLOCK_SIZE_M"], num_experts, max_padded),
            ),
            True,
            rows * 4 * 3,
        )
    if block_shape is not None:
        steps["x quantization"] = (
            Step(lambda: x.clone(), lambda t: per_token_group_quant_fp8(t, block_shape[1])),
            True,
            m * hidden * 3,
        )
        steps["SiLU-and-mul + quant"] = (
            Step(gate_up, lambda t: silu_and_mul_quant_fp8(t, block_shape[1])),
            True,
            rows * (two_n * 2 + n),
        )
    else:
        steps["SiLU-and-mul"] = (Step(gate_up, silu_and_mul), True, rows * (two_n + n) * 2)
    if top_k > 1:
        # SGLang's own sum: its top-2 torch.add, or its Triton sum where it runs that.
        engine_sum = combine is not None and (top_k == 2 or release.triton_sum(m, gemm) is not None)
        steps["top-k sum"] = (
            Step(down, (lambda t: combine(t, gemm)) if combine is not None else moe_sum),
            not engine_sum,
            (rows + m) * hidden * 2,
        )
    # Plain torch, for scale (not counted in the headroom).
    steps["torch: routing"] = (
        Step(
            lambda: torch.randn_like(logits),
            lambda t: torch.topk(torch.softmax(t.float(), dim=-1), top_k, dim=-1),
            fresh_logits,
        ),
        False,
        0,
    )
    steps["torch: SiLU-and-mul"] = (
        Step(gate_up, lambda t: F.silu(t[:, :n]) * t[:, n:]),
        False,
        0,
    )
    if top_k > 1:
        steps["torch: top-k sum"] = (Step(down, lambda t: t.sum(dim=1)), False, 0)
    return steps


def empty_step() -> Any:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def nothing(ptr):
        tl.store(ptr + tl.program_id(0), 0)

    def make() -> Any:
        return torch.empty(
            1, dtype=torch.int32, device="cuda" if torch.cuda.is_available() else "cpu"
        )

    return Step(make, lambda t: nothing[(1,)](t))


def engine_config(
    engine: str, m: int, e: int, n: int, k: int, top_k: int, dtype: str, block: Any
) -> dict:
    """The engine's own fallback config at M (what it runs with no tuned file)."""
    if engine == "sglang":
        from moetune.engines.sglang import default_config
    else:
        from moetune.engines.vllm import default_config
    return default_config(m, e, n, k, top_k, dtype, block)


def bandwidth() -> tuple[float, str]:
    """The floors' bandwidth (bytes/s) and where it comes from: the GPU's HBM spec where
    `moetune.roofline` knows it, else the measured stream read (`measure_ceilings`)."""
    import torch

    from moetune.tune.api import measure_ceilings

    if not torch.cuda.is_available():
        return 1e12, "no GPU: 1 TB/s assumed"
    ceilings = measure_ceilings()
    return ceilings.read_bandwidth_bytes_per_s, ceilings.bandwidth_source


def measure(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import torch

    from moetune.engines.launch import engine_gemm, resolve_kernel
    from moetune.kernel.problem import make_problem
    from moetune.tune.api import time_bench, time_fused_moe

    on_gpu = torch.cuda.is_available() and args.device == "cuda"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "between_gemms.jsonl"
    resolution = resolve_kernel(args.kernel, args.engine)
    if resolution.note:
        print(resolution.note, flush=True)
    ref = resolution.kernel
    gemm = None if ref is None else engine_gemm(ref)  # None: vLLM's twin, moetune's kernel
    bw, bw_source = bandwidth()
    gpu = torch.cuda.get_device_name() if on_gpu else "cpu"
    for shape in args.shape:
        e, n, k, top_k, dtype, block = SHAPES[shape]
        for m in args.batch_sizes:
            data = replace(
                make_problem(m, e, n, k, top_k, dtype, block_shape=block, device=args.device),
                gemm=gemm,
            )
            config = engine_config(args.engine, m, e, n, k, top_k, dtype, block)
            steps = steps_for(data, gemm, config, block)
            samples: dict[str, list[float]] = {"call": [], "empty kernel": []}
            samples.update({name: [] for name in steps})
            for _ in range(args.rounds):
                samples["call"].append(time_fused_moe(data, config, "full").median_us)
                samples["empty kernel"].append(time_bench(empty_step(), "full", on_gpu).median_us)
                for name, (step, _, _) in steps.items():
                    samples[name].append(time_bench(step, "full", on_gpu).median_us)
            medians = {name: statistics.median(values) for name, values in samples.items()}
            empty = medians["empty kernel"]
            row = {
                "shape": shape,
                "M": m,
                "engine": args.engine,
                "kernel": "moetune" if ref is None else ref.tag(),
                "config": config,
                "gpu": gpu,
                "bandwidth": bw,
                "bandwidth_source": bw_source,
                "rounds": args.rounds,
                "samples_us": samples,
                "median_us": medians,
                "steps": {
                    name: {
                        "stand_in": stand_in,
                        "bytes": nbytes,
                        "floor_us": max(nbytes / bw * 1e6, empty) if stand_in else None,
                    }
                    for name, (_, stand_in, nbytes) in steps.items()
                },
            }
            row.update(point_summary(row))
            with rows_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"{shape} M={m}: call {medians['call']:.1f} us, stand-ins "
                f"{100 * row['stand_in_share']:.1f} %, headroom {100 * row['headroom']:.1f} % "
                f"({time.strftime('%H:%M:%S')})",
                flush=True,
            )
            del data
            if on_gpu:
                torch.cuda.empty_cache()
    return 0


def point_summary(row: dict) -> dict:
    """The stand-ins' share of the call and the headroom (see the module docstring)."""
    call = row["median_us"]["call"]
    stand_ins = {name: s for name, s in row["steps"].items() if s["stand_in"]}
    spent = sum(row["median_us"][name] for name in stand_ins)
    headroom = sum(
        max(0.0, row["median_us"][name] - s["floor_us"]) for name, s in stand_ins.items()
    )
    return {"stand_in_us": spent, "stand_in_share": spent / call, "headroom": headroom / call}


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = [
        "| shape | M | call us | stand-in steps us (each) | share | headroom | torch steps us |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for row in rows:
        med = row["median_us"]
        each = ", ".join(
            f"{name} {med[name]:.1f}" for name, s in row["steps"].items() if s["stand_in"]
        )
        torch_steps = ", ".join(
            f"{name[7:]} {med[name]:.1f}" for name in row["steps"] if name.startswith("torch: ")
        )
        lines.append(
            f"| {row['shape']} | {row['M']} | {med['call']:.1f} | {each} | "
            f"{100 * row['stand_in_share']:.1f} % | {100 * row['headroom']:.1f} % | {torch_steps} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="sglang")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(v) for v in s.split(",")], default=BATCH_SIZES
    )
    parser.add_argument(
        "--kernel",
        choices=("auto", "vllm", "sglang", "moetune"),
        default="auto",
        help="the GEMM kernel (`moetune tune --kernel`); auto: the engine's own where installed",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="results folder")
    parser.add_argument("--report", type=Path, help="print the table of a between_gemms.jsonl")
    args = parser.parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    if not args.out:
        parser.error("--out is required to measure")
    args.shape = args.shape or ["qwen3-235b-tp8", "deepseek-v3-fp8-tp8", "mixtral-8x7b-tp2"]
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
