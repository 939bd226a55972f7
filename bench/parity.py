"""Same-run GEMM parity: moetune's fused-MoE GEMM kernel against vLLM's, same config and inputs.

Two kernels run in one process on the same inputs:

- ``vllm``: vLLM's ``fused_moe_kernel`` (vllm-project/vllm@13cb3e44, the function source
  saved to a file that `--vllm-ref` names; it is a measurement baseline, never part of
  moetune), exec'd unchanged under a two-line ``vllm.triton_utils`` shim and launched
  the way vLLM's ``invoke_fused_moe_kernel`` does (grid, the small-M ``EM`` cap,
  argument order);
- ``moetune``: `moetune.kernel.fused_moe_kernel.invoke_fused_moe_gemm` of this tree.

int4 w4a16 shapes (``*-int4``) compare the engines' int4 path instead: vLLM's
``fused_moe_kernel_gptq_awq`` (same commit, its own saved source, e.g.
.vllm_ref/fused_moe_kernel_gptq_awq.py) launched as ``invoke_fused_moe_kernel``
launches it for ``block_shape=[0, group_size]`` (N and K constexpr, ``block_k_diviable``,
its stride order), against `moetune.kernel.fused_moe_wna16_kernel.invoke_fused_moe_wna16_gemm`,
on the same packed weights, group scales, inputs and alignment.

Method (that of ../shared/notes/fidelity-h200.md): per (shape, M), 10 token sets, each
with its own x and routing (random logits, softmax, top-k, renormalized), shared by all
kernels together with the alignment; a call is GEMM1 (x @ w1) plus GEMM2 (act @ w2,
routed weight). Per (kernel, config) one CUDA graph captured by the tuner's harness
(`moetune.tune.measure.timing.capture_graph`: compile timed apart, as many calls as
last about 2 ms, at most one per token set); the inputs stay fixed, so every kernel times
the same token sets. All graphs of a point are replayed round-robin, the order reversed
every other round, for at least `--rounds` rounds; the figure is the p50 per call in us.
Before timing, every kernel's layer on the first token set (its GEMM1, SiLU-and-mul,
its GEMM2, the top-k sum) is checked against `moetune.kernel.naive.naive_fused_experts`,
the float32 reference of the tests and the tuner (relative RMS error).

    python bench/parity.py --vllm-ref .vllm_ref/fused_moe_kernel_13cb3e44.py --out DIR

    python bench/parity.py --shapes qwen3-30b-a3b-tp1-int4 --batch-sizes 16,256,1024,4096 \
        --vllm-ref .vllm_ref/fused_moe_kernel_gptq_awq.py --out DIR

Without `--vllm-ref` (or with a missing file, or one without the shape's kernel) the
vllm kernel is skipped and said so; without a GPU the script exits with a one-line
message. `--check-only` runs the correctness check alone (no timing; exit 1 if a
kernel failed to run); with
TRITON_INTERPRET=1 it runs on the CPU (bf16 activations, weights or int4 scales in
fp16 there: vLLM's kernels take no bf16 dot in the interpreter), e.g. ``--shapes tiny-int4 --batch-sizes 3``.
Results: DIR/parity.json (rewritten after every point) and DIR/parity.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback
import types
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
VLLM_CONFIG_DIR = BENCH_DIR / "vllm_configs"
TOKEN_SETS = 10

# name: (E, N, K, top_k, dtype, block_shape, vLLM config file or None)
SHAPES = {
    "qwen3-30b-a3b-tp1": (
        128,
        768,
        2048,
        8,
        "bf16",
        None,
        "E=128,N=768,device_name=NVIDIA_H200.json",
    ),
    "mixtral-8x7b-tp2": (8, 7168, 4096, 2, "bf16", None, "E=8,N=7168,device_name=NVIDIA_H200.json"),
    "kimi-k3-tp8ep": (112, 3072, 3584, 16, "bf16", None, None),
    "deepseek-v3-tp8": (256, 256, 7168, 8, "fp8_w8a8", (128, 128), None),
    "qwen3-30b-a3b-tp1-int4": (128, 768, 2048, 8, "int4_w4a16", None, None),
    "tiny-int4": (4, 64, 256, 2, "int4_w4a16", None, None),  # CPU smoke (--check-only)
}
DEFAULT_SHAPES = ("qwen3-30b-a3b-tp1", "mixtral-8x7b-tp2", "kimi-k3-tp8ep", "deepseek-v3-tp8")
# int4 w4a16 shapes: the group size along K (the engines' block_shape=[0, group_size]).
GROUP_SIZES = {"qwen3-30b-a3b-tp1-int4": 128, "tiny-int4": 32}
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def cfg(text: str) -> dict:
    return dict(zip(KEYS, (int(v) for v in text.split("/")), strict=True))


# The large 8-warp tiles of the note (where the gap showed) for bf16; the note's
# vLLM/moetune configs for DeepSeek's block fp8 (vLLM's tuner keeps fp8 at 64 x 128).
NOTE_CONFIGS = {
    "bf16": {"t256": cfg("128/256/64/16/8/4"), "t128": cfg("128/128/64/1/8/3")},
    "fp8_w8a8": {"f64g32": cfg("64/128/128/32/4/4"), "f64g16": cfg("64/128/128/16/4/3")},
}
# int4 w4a16, by batch size: the H200 tune's measured bests (BLOCK_SIZE_N 32, BLOCK_SIZE_K
# 256: M=16 and M=256, bench/results/2026-12-01-h200-session/quant/int4.measurements.jsonl.gz)
# and a wgmma tile (BLOCK_SIZE_M 64 / 128).
INT4_CONFIGS = {
    16: {
        "best16": cfg("16/32/256/16/4/4"),
        "best256": cfg("32/32/256/32/4/2"),
        "m64": cfg("64/32/128/16/4/3"),
    },
    256: {
        "best256": cfg("32/32/256/32/4/2"),
        "best16": cfg("16/32/256/16/4/4"),
        "m64": cfg("64/32/128/16/4/3"),
    },
    1024: {
        "best256": cfg("32/32/256/32/4/2"),
        "m64": cfg("64/32/128/16/4/3"),
        "m128": cfg("128/64/128/16/8/3"),
    },
    4096: {
        "best256": cfg("32/32/256/32/4/2"),
        "m64": cfg("64/32/128/16/4/3"),
        "m128": cfg("128/64/128/16/8/3"),
    },
}
TINY_INT4_CONFIGS = {"n32k64": cfg("16/32/64/1/4/2"), "n64k32": cfg("32/64/32/1/4/2")}


def configs_for(shape: str, M: int) -> dict[str, dict]:
    E, N, K, top_k, dtype, block_shape, vllm_file = SHAPES[shape]
    if shape == "tiny-int4":
        return dict(TINY_INT4_CONFIGS)
    if dtype == "int4_w4a16":
        return dict(INT4_CONFIGS[min(INT4_CONFIGS, key=lambda m: abs(m - M))])
    configs = dict(NOTE_CONFIGS[dtype])
    if vllm_file and (VLLM_CONFIG_DIR / vllm_file).exists():
        table = json.loads((VLLM_CONFIG_DIR / vllm_file).read_text())
        entry = table[min(table, key=lambda k: abs(int(k) - M))]
        published = {k: entry[k] for k in KEYS}
        if published not in configs.values():
            configs["vllm-file"] = published
    return configs


def label(config: dict) -> str:
    return "/".join(str(config[k]) for k in KEYS)


# %% Kernels -----------------------------------------------------------------------------


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_vllm_kernel(path: Path, name: str = "fused_moe_kernel"):
    """vLLM's kernel `name` from its saved source, with ``vllm.triton_utils`` shimmed."""
    import triton
    import triton.language as tl

    if "vllm" not in sys.modules:
        package = types.ModuleType("vllm")
        package.__path__ = []
        utils = types.ModuleType("vllm.triton_utils")
        utils.tl, utils.triton = tl, triton
        package.triton_utils = utils
        sys.modules["vllm"], sys.modules["vllm.triton_utils"] = package, utils
    return getattr(load_module(path, f"vllm_ref_{path.stem}"), name)


def vllm_launch_shape(a, w, c, sorted_token_ids, top_k, config):
    """vLLM's C view ([M, top_k, N]), padded rows EM (capped at small M) and grid."""
    import triton

    c3 = c.view(-1, 1, c.shape[-1]) if c.dim() == 2 else c
    EM = sorted_token_ids.size(0)
    if a.size(0) < config["BLOCK_SIZE_M"]:
        EM = min(sorted_token_ids.size(0), a.size(0) * top_k * config["BLOCK_SIZE_M"])
    grid = (
        triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(w.size(1), config["BLOCK_SIZE_N"]),
    )
    return c3, EM, grid


def vllm_launcher(kernel):
    """vLLM's ``invoke_fused_moe_kernel`` (bf16 / fp8 w8a8 paths) around `kernel`."""
    import torch
    import triton.language as tl

    def launch(
        a,
        w,
        c,
        *,
        a_scale,
        w_scale,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        mul_routed_weight,
        top_k,
        config,
        quant_dtype,
        block_shape,
    ):
        c3, EM, grid = vllm_launch_shape(a, w, c, sorted_token_ids, top_k, config)
        meta = dict(config)
        meta["SPLIT_K"] = 1
        block_k = meta.pop("BLOCK_SIZE_K")
        if block_shape is not None:
            block_k = min(block_k, min(block_shape))
        use_fp8 = quant_dtype == "fp8_w8a8"
        kernel[grid](
            a,
            w,
            c3,
            None,
            a_scale,
            w_scale,
            topk_weights,
            sorted_token_ids,
            expert_ids,
            num_tokens_post_padded,
            w.size(1),
            w.size(2),
            EM,
            a.size(0) * top_k,
            a.stride(0),
            a.stride(1),
            w.stride(0),
            w.stride(2),
            w.stride(1),
            c3.stride(1),
            c3.stride(2),
            a_scale.stride(0) if a_scale is not None and a_scale.ndim == 2 else 0,
            a_scale.stride(1) if a_scale is not None and a_scale.ndim == 2 else 0,
            w_scale.stride(0) if w_scale is not None and w_scale.ndim >= 2 else 0,
            w_scale.stride(2) if w_scale is not None and w_scale.ndim == 3 else 0,
            w_scale.stride(1) if w_scale is not None and w_scale.ndim >= 2 else 0,
            0,
            0,
            0 if block_shape is None else block_shape[0],
            0 if block_shape is None else block_shape[1],
            MUL_ROUTED_WEIGHT=mul_routed_weight,
            top_k=top_k,
            compute_type=tl.bfloat16 if c.dtype == torch.bfloat16 else tl.float16,
            use_fp8_w8a8=use_fp8,
            use_int8_w8a8=False,
            use_int8_w8a16=False,
            per_channel_quant=False,
            HAS_BIAS=False,
            BLOCK_SIZE_K=block_k,
            **meta,
        )
        return c

    return launch


def vllm_wna16_launcher(kernel):
    """vLLM's ``invoke_fused_moe_kernel``, int4 w4a16 branch (Triton path), around `kernel`.

    Same keywords as `invoke_fused_moe_wna16_gemm`. vLLM's argument order differs from
    moetune's: weight strides (expert, k, n), scale and zero-point strides (expert, k, n);
    N and K are constexpr; ``block_k_diviable`` is ``K % BLOCK_SIZE_K == 0``.
    """
    import torch
    import triton.language as tl

    def launch(
        a,
        w,
        c,
        *,
        w_scale,
        w_zp,
        group_size,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        mul_routed_weight,
        top_k,
        config,
    ):
        c3, EM, grid = vllm_launch_shape(a, w, c, sorted_token_ids, top_k, config)
        kernel[grid](
            a,
            w,
            c3,
            w_scale,
            w_zp,
            topk_weights,
            sorted_token_ids,
            expert_ids,
            num_tokens_post_padded,
            w.size(1),
            a.size(1),
            EM,
            a.size(0) * top_k,
            a.stride(0),
            a.stride(1),
            w.stride(0),
            w.stride(2),
            w.stride(1),
            c3.stride(1),
            c3.stride(2),
            w_scale.stride(0),
            w_scale.stride(2),
            w_scale.stride(1),
            w_zp.stride(0) if w_zp is not None else 0,
            w_zp.stride(2) if w_zp is not None else 0,
            w_zp.stride(1) if w_zp is not None else 0,
            block_k_diviable=a.size(1) % config["BLOCK_SIZE_K"] == 0,
            group_size=group_size,
            MUL_ROUTED_WEIGHT=mul_routed_weight,
            top_k=top_k,
            compute_type=tl.bfloat16 if c.dtype == torch.bfloat16 else tl.float16,
            has_zp=w_zp is not None,
            use_int4_w4a16=True,
            use_int8_w8a16=False,
            SPLIT_K=1,
            **config,
        )
        return c

    return launch


def load_kernels(vllm_ref: str | None, dtype: str = "bf16") -> tuple[dict, list[str]]:
    """The kernels compared on `dtype`'s shapes, and notes on any left out."""
    if dtype == "int4_w4a16":
        return load_int4_kernels(vllm_ref)
    from moetune.kernel.fused_moe_kernel import invoke_fused_moe_gemm

    kernels, notes = {}, []
    if vllm_ref and Path(vllm_ref).exists():
        kernels["vllm"] = vllm_launcher(load_vllm_kernel(Path(vllm_ref)))
    else:
        notes.append(f"vllm kernel skipped: no reference source at {vllm_ref!r}")
    kernels["moetune"] = invoke_fused_moe_gemm
    return kernels, notes


def load_int4_kernels(vllm_ref: str | None) -> tuple[dict, list[str]]:
    from moetune.kernel.fused_moe_wna16_kernel import invoke_fused_moe_wna16_gemm

    kernels, notes = {}, []
    name = "fused_moe_kernel_gptq_awq"
    if vllm_ref and Path(vllm_ref).exists():
        try:
            kernels["vllm"] = vllm_wna16_launcher(load_vllm_kernel(Path(vllm_ref), name))
        except AttributeError:
            notes.append(f"int4 vllm kernel skipped: no {name} in {vllm_ref!r}")
    else:
        notes.append(f"int4 vllm kernel skipped: no reference source at {vllm_ref!r}")
    kernels["moetune"] = invoke_fused_moe_wna16_gemm
    return kernels, notes


# %% Inputs and reference ----------------------------------------------------------------


def token_sets(problem, M: int, top_k: int):
    """TOKEN_SETS slices of M tokens: (x, a1, a1_scale, topk_weights, topk_ids)."""
    from moetune.kernel.quant import per_token_group_quant_fp8
    from moetune.kernel.routing import topk_routing

    sets = []
    for i in range(TOKEN_SETS):
        x = problem.x[i * M : (i + 1) * M]
        weights, ids = topk_routing(problem.router_logits[i * M : (i + 1) * M], top_k)
        if problem.quant is not None and problem.quant.dtype != "int4_w4a16":
            a1, a1_scale = per_token_group_quant_fp8(x, problem.quant.block_shape[1])
        else:
            a1, a1_scale = x, None
        sets.append((x, a1, a1_scale, weights.contiguous(), ids))
    return sets


def weight_args(problem, which: int, a_scale) -> dict:
    """Keywords of GEMM `which` (1: w1, 2: w2) besides routing, alignment and config."""
    quant = problem.quant
    if quant is not None and quant.dtype == "int4_w4a16":
        return dict(
            w_scale=getattr(quant, f"w{which}_scale"),
            w_zp=getattr(quant, f"w{which}_zp"),
            group_size=quant.group_size,
        )
    return dict(
        a_scale=a_scale,
        w_scale=getattr(quant, f"w{which}_scale") if quant else None,
        quant_dtype=quant.dtype if quant else None,
        block_shape=quant.block_shape if quant else None,
    )


def activation(gate_up, block_shape):
    """GEMM2's input from GEMM1's output, as `fused_moe` makes it: (act, act_scale)."""
    from moetune.kernel.activation import silu_and_mul, silu_and_mul_quant_fp8

    if block_shape is not None:
        return silu_and_mul_quant_fp8(gate_up, block_shape[1])
    return silu_and_mul(gate_up), None


def alignment_of(ids, block_size_m: int, num_experts: int) -> dict:
    from moetune.kernel.align import align_block_size

    sorted_ids, expert_ids, num_post = align_block_size(ids, block_size_m, num_experts)
    return dict(sorted_token_ids=sorted_ids, expert_ids=expert_ids, num_tokens_post_padded=num_post)


def layer_error(kernel, problem, config: dict, token_set, block_shape, reference) -> float:
    """Relative RMS error of the layer `kernel` computes on `token_set` (its GEMM1,
    SiLU-and-mul, its GEMM2 with the routed weights, the top-k sum) against `reference`,
    `naive_fused_experts` of the same x and routing."""
    import torch

    x, a1, a1_scale, weights, ids = token_set
    M, top_k = ids.shape
    two_n, hidden = problem.w1.shape[1], problem.w2.shape[1]
    align = alignment_of(ids, config["BLOCK_SIZE_M"], problem.w1.shape[0])
    gate_up = torch.full((M * top_k, two_n), float("nan"), dtype=x.dtype, device=x.device)
    kernel(
        a1,
        problem.w1,
        gate_up,
        topk_weights=None,
        mul_routed_weight=False,
        top_k=top_k,
        config=config,
        **weight_args(problem, 1, a1_scale),
        **align,
    )
    a2, a2_scale = activation(gate_up, block_shape)
    down = torch.full((M, top_k, hidden), float("nan"), dtype=x.dtype, device=x.device)
    kernel(
        a2,
        problem.w2,
        down,
        topk_weights=weights,
        mul_routed_weight=True,
        top_k=1,
        config=config,
        **weight_args(problem, 2, a2_scale),
        **align,
    )
    return rel_rms(reference, down.float().sum(dim=1))


def reference(problem, token_set):
    """float32 layer output [M, K] of `token_set`: `moetune.kernel.naive.naive_fused_experts`."""
    from moetune.kernel.naive import naive_fused_experts

    x, _, _, weights, ids = token_set
    return naive_fused_experts(x, problem.w1, problem.w2, weights, ids, quant=problem.quant)


def rel_rms(ref, out) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def half_precision(problem):
    """`problem` with fp16 activations and scales (the CPU interpreter has no bf16 dot)."""
    import dataclasses

    import torch

    if problem.x.dtype != torch.bfloat16:
        return problem
    quant = problem.quant
    if quant is None:
        return dataclasses.replace(
            problem, x=problem.x.half(), w1=problem.w1.half(), w2=problem.w2.half()
        )
    if quant.dtype == "int4_w4a16":
        quant = dataclasses.replace(
            quant, w1_scale=quant.w1_scale.half(), w2_scale=quant.w2_scale.half()
        )
        return dataclasses.replace(problem, x=problem.x.half(), quant=quant)
    return problem


# %% One point -----------------------------------------------------------------------------


def measure_point(
    shape: str,
    M: int,
    problem,
    kernels: dict,
    rounds: int,
    budget_s: float,
    check_only: bool = False,
) -> dict:
    import torch

    from moetune.tune.api import FIDELITIES, capture_graph

    E, N, K, top_k, dtype, block_shape, _ = SHAPES[shape]
    on_gpu = problem.x.is_cuda

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    configs = configs_for(shape, M)
    sets = token_sets(problem, M, top_k)
    act_dtype = problem.x.dtype
    buffers = []
    for x, *_ in sets:
        gate_up = torch.empty(M * top_k, 2 * N, dtype=act_dtype, device=x.device)
        down = torch.empty(M, top_k, K, dtype=act_dtype, device=x.device)
        buffers.append((gate_up, down))
    alignments = {}

    def alignment(bm, i):
        if (bm, i) not in alignments:
            alignments[bm, i] = alignment_of(sets[i][4], bm, E)
        return alignments[bm, i]

    # GEMM2's input: the activation of a GEMM1 output (our kernel, first config), per set.
    first = next(iter(configs.values()))
    acts = []
    for i, (_, a1, a1_scale, *_) in enumerate(sets):
        gate_up, _ = buffers[i]
        kernels["moetune"](
            a1,
            problem.w1,
            gate_up,
            topk_weights=None,
            mul_routed_weight=False,
            top_k=top_k,
            config=first,
            **weight_args(problem, 1, a1_scale),
            **alignment(first["BLOCK_SIZE_M"], i),
        )
        acts.append(activation(gate_up, block_shape))

    def call(kernel, config, i):
        x, a1, a1_scale, weights, ids = sets[i]
        gate_up, down = buffers[i]
        a2, a2_scale = acts[i]
        align = alignment(config["BLOCK_SIZE_M"], i)
        kernel(
            a1,
            problem.w1,
            gate_up,
            topk_weights=None,
            mul_routed_weight=False,
            top_k=top_k,
            config=config,
            **weight_args(problem, 1, a1_scale),
            **align,
        )
        kernel(
            a2,
            problem.w2,
            down,
            topk_weights=weights,
            mul_routed_weight=True,
            top_k=1,
            config=config,
            **weight_args(problem, 2, a2_scale),
            **align,
        )

    expected = reference(problem, sets[0])
    row = {
        "shape": shape,
        "M": M,
        "dtype": dtype,
        "configs": {},
        "errors": {},
        "us": {},
        "samples": {},
    }
    graphs = {}
    try:
        for cname, config in configs.items():
            row["configs"][cname] = label(config)
            for kname, kernel in kernels.items():
                key = f"{kname}|{cname}"
                try:
                    error = layer_error(kernel, problem, config, sets[0], block_shape, expected)
                    sync()
                    row["errors"][key] = [error]
                    if check_only:
                        continue
                    pair = GemmPair(lambda i, kernel=kernel, config=config: call(kernel, config, i))
                    graphs[key] = capture_graph(pair, FIDELITIES["full"])
                except Exception as exc:  # noqa: BLE001 - recorded, the point goes on
                    row["errors"][key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    print(f"  {shape} M={M} {key}: {row['errors'][key]}", flush=True)
                    sync()
        del expected
        if check_only:
            row["rounds"] = 0
            return row
        row["rounds"], samples = replay_round_robin(graphs, rounds, budget_s)
    finally:
        for graph in graphs.values():
            graph.close()
    row["us"] = {key: statistics.median(v) for key, v in samples.items() if v}
    row["samples"] = samples
    return row


class GemmPair:
    """One (kernel, config) as a bench of the tuner's harness: slot i runs the GEMM pair on
    token set i. The inputs stay fixed (`refill` does nothing), so every kernel and config
    of a point times the same token sets."""

    def __init__(self, call) -> None:
        self.call = call

    def allocate(self, count: int) -> None:
        if count > TOKEN_SETS:
            raise ValueError(f"a graph of {count} calls needs {count} token sets")

    def refill(self) -> None:
        pass

    def launch(self, slot: int) -> None:
        self.call(slot)

    def release(self) -> None:
        pass


def replay_round_robin(graphs: dict, rounds: int, budget_s: float) -> tuple[int, dict]:
    """Replay every captured graph once per round, the order reversed every other round,
    at least `rounds` rounds (up to 3x while a quarter of `budget_s` lasts, never past it).
    Returns (rounds done, per-call us samples per key)."""
    import torch

    order = list(graphs)
    samples = {key: [] for key in order}
    for graph in graphs.values():  # warm-up
        graph.replay(timed=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    while done < rounds or (done < 3 * rounds and time.perf_counter() - start < budget_s / 4):
        keys = order if done % 2 == 0 else order[::-1]
        events = [(key, graphs[key].replay()) for key in keys]
        torch.cuda.synchronize()
        for key, timed in events:
            samples[key].append(graphs[key].per_call_us(timed))
        done += 1
        if time.perf_counter() - start > budget_s:
            break
    return done, samples


# %% Report --------------------------------------------------------------------------------


def markdown(rows: list[dict], machine: dict, notes: list[str]) -> str:
    lines = [
        "# GEMM parity: moetune's kernel vs vLLM's (same run)",
        "",
        "vLLM's `fused_moe_kernel`; for int4_w4a16 shapes its `fused_moe_kernel_gptq_awq`.",
        "",
        f"{machine}",
        "",
        "p50 us per call (GEMM1 + GEMM2), CUDA graphs of the tuner's harness over up to 10",
        "token sets, round-robin replays. `ratio` = kernel / vLLM's kernel with the same config",
        "(> 1: slower). `err` = worst relative RMS error of the point's layer outputs against",
        "the float32 reference (`naive_fused_experts`).",
        "",
        *[f"- {n}" for n in notes],
        "",
        "| shape | M | config | BM/BN/BK/G/w/s | vllm us | moetune us | moetune/vllm | rounds | err |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for cname, text in row["configs"].items():
            us = {k: row["us"].get(f"{k}|{cname}") for k in ("vllm", "moetune")}
            errs = [row["errors"].get(f"{k}|{cname}") for k in ("vllm", "moetune")]
            worst = max((max(e) for e in errs if isinstance(e, list)), default=None)
            failed = any(isinstance(e, str) for e in errs)

            def fmt(v):
                return "-" if v is None else f"{v:.1f}"

            def ratio(a, b):
                return "-" if a is None or b is None else f"{a / b:.3f}"

            lines.append(
                f"| {row['shape']} | {row['M']} | {cname} | {text} | {fmt(us['vllm'])} | "
                f"{fmt(us['moetune'])} | {ratio(us['moetune'], us['vllm'])} | {row['rounds']} | "
                f"{'fail' if failed else ('-' if worst is None else f'{worst:.1e}')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--vllm-ref",
        help="file with vLLM's kernel source (.vllm_ref/...): fused_moe_kernel, or "
        "fused_moe_kernel_gptq_awq for the int4 shapes",
    )
    parser.add_argument("--out", default="bench/results/parity", help="results folder")
    parser.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"comma-separated, of {', '.join(SHAPES)}",
    )
    parser.add_argument("--batch-sizes", default="1024,4096,256", help="comma-separated M")
    parser.add_argument("--rounds", type=int, default=20, help="replay rounds per point, at least")
    parser.add_argument(
        "--budget-s", type=float, default=270.0, help="stop starting points after this"
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="check every kernel against the float32 reference, time nothing "
        "(on the CPU under TRITON_INTERPRET=1)",
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        print(
            f"Error: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}",
            file=sys.stderr,
        )
        return 1
    import torch
    import triton

    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.cuda.is_available():
        device = "cuda"
    elif args.check_only and interpret:
        device = "cpu"
    else:
        print("Error: bench/parity.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from moetune.fileio import atomic_write_json, atomic_write_text
    from moetune.kernel.problem import make_problem

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = args.shapes.split(",")
    kernel_sets, notes = {}, []
    for dtype in dict.fromkeys(SHAPES[shape][4] for shape in shapes):
        kernel_sets[dtype], dtype_notes = load_kernels(args.vllm_ref, dtype)
        notes += dtype_notes
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (Triton interpreter)"
    machine = (
        f"{name}, torch {torch.__version__}, Triton {triton.__version__}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(machine, *notes, sep="\n", flush=True)
    sizes = [int(m) for m in args.batch_sizes.split(",")]
    started = time.perf_counter()
    rows = []
    failed = False
    for shape in shapes:
        E, N, K, top_k, dtype, block_shape, _ = SHAPES[shape]
        kernels = kernel_sets[dtype]
        problem = make_problem(
            TOKEN_SETS * max(sizes),
            E,
            N,
            K,
            top_k,
            dtype,
            block_shape,
            device=device,
            group_size=GROUP_SIZES.get(shape),
        )
        if device == "cpu":
            problem = half_precision(problem)
        for M in sizes:
            elapsed = time.perf_counter() - started
            if elapsed > args.budget_s:
                notes.append(f"{shape} M={M} not run: budget of {args.budget_s:.0f} s spent")
                continue
            per_point = max(
                10.0, (args.budget_s - elapsed) / (len(shapes) * len(sizes) - len(rows))
            )
            try:
                row = measure_point(
                    shape, M, problem, kernels, args.rounds, per_point, args.check_only
                )
            except Exception:  # noqa: BLE001 - report and go on
                traceback.print_exc()
                failed = True
                if device == "cuda":
                    torch.cuda.synchronize()
                continue
            rows.append(row)
            failed |= any(not isinstance(e, list) for e in row["errors"].values())
            atomic_write_json(
                out / "parity.json", {"machine": machine, "notes": notes, "rows": rows}
            )
            atomic_write_text(out / "parity.md", markdown(rows, machine, notes))
            print(
                f"[{time.perf_counter() - started:5.0f}s] {shape} M={M}: "
                + ", ".join(f"{k} {v:.1f}" for k, v in row["us"].items())
                + ("" if row["us"] else f"errors {row['errors']}"),
                flush=True,
            )
        del problem
        if device == "cuda":
            torch.cuda.empty_cache()
    atomic_write_json(out / "parity.json", {"machine": machine, "notes": notes, "rows": rows})
    atomic_write_text(out / "parity.md", markdown(rows, machine, notes))
    print(markdown(rows, machine, notes))
    return 1 if args.check_only and failed else 0


if __name__ == "__main__":
    sys.exit(main())
