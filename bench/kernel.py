"""Benchmark of moetune's fused-MoE kernel against the roofline floor (issue 3).

For every shape (bench/shapes.json), dtype and batch size M it measures, in one run:

- the whole `fused_moe` call (routing, alignment, GEMM1, SiLU-and-mul, GEMM2, top-k
  sum) with our `default_config`, and with vLLM's published H200 config for the
  shape when one exists (bench/vllm_configs/, nearest-M key, as the engines pick);
- the two GEMMs alone (two `invoke_fused_moe_gemm` launches on pre-aligned,
  pre-quantized inputs) with the same two configs, to set against vLLM's GEMM
  numbers measured on the same shapes;
- PyTorch's grouped GEMM (`torch._grouped_mm`) on the same routed tokens, already
  sorted by expert: gate/up then down, glue excluded. bf16 only: torch has no
  grouped GEMM for 128x128 block-scaled fp8 (`_scaled_grouped_mm` takes row-wise
  scales), so fp8 points leave it out.

Every variant is timed by the tuner's own harness (`moetune.tune.measure.timing`, "full"
fidelity): a CUDA graph of as many calls as last about 2 ms (at most 10), 3 warm-up
and 20 timed replays, p20/p50/p80 per call. The whole call is `time_fused_moe` itself,
exactly what `moetune tune` measures; the other variants are benches of that harness
whose calls rotate among up to 10 token sets. The whole call and the GEMM pairs get new
router logits before every replay, outside the timed region (the GEMM pairs' routing
weights and alignment are rewritten in place), so every replay routes differently.
With `--vllm-ref FILE` the GEMM pairs also run on vLLM's `fused_moe_kernel` (source
file, launcher and shim of bench/parity.py): same inputs and routings, same run, so a
gap between the two kernels shows here rather than across runs.
The floor is `moetune.roofline.moe_roofline` with BW (read bandwidth of the
stream-read kernel, `moetune.tune.measure.ceilings`) and PEAK (8192^3 matmul of the dtype's
compute type: bf16, fp8 `_scaled_mm`, int8 `_int_mm`) measured at the start of the run.

Without a GPU (TRITON_INTERPRET=1) it times plain calls on the host instead: use
`--quick` there; those numbers only prove the script runs.

    python bench/kernel.py                       # the full grid, on a GPU
    python bench/kernel.py --quick               # tiny shape, M = 1 and 8
    python bench/kernel.py --shapes qwen3-30b-a3b-tp1 --batch-sizes 1,64 --dtypes bf16

Full results go to `--out DIR` (default bench/results/<UTC date>-kernel-<UTC time>/): results.json
and results.md; the compact table is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

from moetune.engines.names import vllm_config_filename
from moetune.fileio import atomic_write_json, atomic_write_text
from moetune.kernel.activation import silu_and_mul, silu_and_mul_quant_fp8
from moetune.kernel.align import align_block_size
from moetune.kernel.config import CONFIG_KEYS, default_config
from moetune.kernel.fused_moe import fused_moe
from moetune.kernel.fused_moe_kernel import invoke_fused_moe_gemm
from moetune.kernel.naive import naive_fused_moe
from moetune.kernel.problem import make_problem
from moetune.kernel.quant import per_token_group_quant_fp8
from moetune.kernel.reduce import moe_sum
from moetune.kernel.routing import topk_routing
from moetune.roofline import expected_experts_hit, moe_roofline
from moetune.tune.api import FIDELITIES, time_bench, time_fused_moe

BENCH_DIR = Path(__file__).resolve().parent
SHAPES_FILE = BENCH_DIR / "shapes.json"
VLLM_CONFIG_DIR = BENCH_DIR / "vllm_configs"
BATCH_SIZES = (1, 8, 64, 256, 1024, 4096)
QUICK_BATCH_SIZES = (1, 8)
# Benchmark dtype label -> (kernel dtype string, weight block shape).
DTYPES = {"bf16": ("bf16", None), "fp8-block": ("fp8_w8a8", (128, 128))}
# The tuner's fidelity: what every variant is timed at.
FIDELITY = "full"
# Token sets the calls rotate among: as many as a graph holds on a GPU, two on the host.
GPU_TOKEN_SETS, HOST_TOKEN_SETS = FIDELITIES[FIDELITY].max_calls_per_graph, 2
GLUE_OPS = ("routing", "align", "silu", "sum", "quant_x", "quant_act", "silu_quant_fused")


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    E: int
    top_k: int
    K: int
    N: int


def load_shapes(names: list[str] | None) -> list[Shape]:
    data = {k: v for k, v in json.loads(SHAPES_FILE.read_text()).items() if not k.startswith("_")}
    if names is None:
        names = [name for name in data if name != "tiny"]
    unknown = [name for name in names if name not in data]
    if unknown:
        sys.exit(f"Error: unknown shape(s) {', '.join(unknown)}; known: {', '.join(data)}")
    return [Shape(name, **data[name]) for name in names]


def vllm_config(shape: Shape, dtype: str, block_shape, M: int, device_name: str) -> dict | None:
    """vLLM's published config for this shape on this GPU, nearest-M entry, or None."""
    engine_dtype = None if dtype in ("bf16", "fp16") else dtype
    name = vllm_config_filename(shape.E, shape.N, device_name, engine_dtype, block_shape)
    path = VLLM_CONFIG_DIR / name
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    key = min(table, key=lambda k: abs(int(k) - M))
    return {k: v for k, v in table[key].items() if k in CONFIG_KEYS}


# %% Timing -------------------------------------------------------------------------------


class Calls:
    """A variant's calls as a bench of the tuner's harness (`moetune.tune.measure.timing.Bench`):
    slot i runs call i (modulo their number); `refresh`, when given, gives every call
    new routings in place before each replay."""

    def __init__(self, calls: list, refresh=None) -> None:
        self.calls, self.refresh = calls, refresh

    def allocate(self, count: int) -> None:
        pass  # the calls own their inputs

    def refill(self) -> None:
        if self.refresh is not None:
            self.refresh()

    def launch(self, slot: int):
        return self.calls[slot % len(self.calls)]()

    def release(self) -> None:
        pass


def timing_row(timing, on_gpu: bool) -> dict:
    """A `moetune.tune.measure.timing.Timing` as results.json records it."""
    return {
        "p20_us": timing.p20_us,
        "p50_us": timing.median_us,
        "p80_us": timing.p80_us,
        "calls_per_graph": timing.calls_per_replay,
        "replays": timing.replays,
        "graph": on_gpu,
    }


def measure_ceilings(device: str, quick: bool) -> dict:
    """Read bandwidth and matmul peaks: moetune's own measurement on a GPU
    (`moetune.tune.measure.ceilings`: stream-read kernel, bf16/fp8/int8 8192^3 matmuls);
    on the host a token copy and a small bf16 matmul, only so the script runs."""
    if device == "cuda" and not quick:
        from moetune.tune.api import MATMUL_SIZE, READ_BYTES
        from moetune.tune.api import measure_ceilings as measure

        c = measure()
        return {
            "bandwidth_bytes_per_s": c.read_bandwidth_bytes_per_s,
            "bandwidth_source": c.bandwidth_source,
            "peak_flops_per_s": c.peaks["bf16"],
            "peaks_flops_per_s": c.peaks,
            "peak_sources": c.peak_sources,
            "read_bytes": READ_BYTES,
            "matmul_size": MATMUL_SIZE,
        }
    copy_bytes = 64 * 2**20
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    size = 512
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    on_gpu = device == "cuda"

    def best_us(fn, reps):
        fn()
        samples = []
        for _ in range(reps):
            if on_gpu:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3)
            else:
                start = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - start) * 1e6)
        return statistics.median(samples)

    copy_us = best_us(lambda: dst.copy_(src), 3)
    matmul_us = best_us(lambda: torch.matmul(a, b), 3)
    return {
        "bandwidth_bytes_per_s": 2 * copy_bytes / (copy_us * 1e-6),
        "bandwidth_source": "quick: copy (read + write), only so the script runs",
        "peak_flops_per_s": 2 * size**3 / (matmul_us * 1e-6),
        "peaks_flops_per_s": {},
        "peak_sources": {},
        "read_bytes": copy_bytes,
        "matmul_size": size,
    }


def peak_for(ceilings: dict, dtype: str) -> float:
    """The matmul peak bounding `dtype` (fp8 / int8 where measured, else bf16's)."""
    from moetune.roofline import peak_kind

    peaks = ceilings.get("peaks_flops_per_s") or {}
    return peaks.get(peak_kind(dtype), ceilings["peak_flops_per_s"])


# %% The measured variants --------------------------------------------------------------


def quantize_activation(a, quant):
    """The GEMM input for activations `a` and its scale: fp8 per token group for block fp8."""
    if quant is None:
        return a, None
    return per_token_group_quant_fp8(a, quant.block_shape[1])


def gemm_only_calls(problem, token_sets, config, dtype, block_shape, gemm=invoke_fused_moe_gemm):
    """Two GEMM launches per token set, on inputs routed, aligned and quantized beforehand.

    Returns (calls, refresh): `refresh` draws new router logits for every token set and
    rewrites the routing weights and the alignment in place (fixed-size buffers), so a
    CUDA graph of the calls replays with a new expert load each time. `gemm` launches one
    GEMM with `invoke_fused_moe_gemm`'s arguments (vLLM's kernel: bench/parity.py).
    """
    quant = problem.quant
    w1, w2 = problem.w1, problem.w2
    num_experts, two_n, _ = w1.shape
    hidden = w2.shape[1]
    calls, routed = [], []
    for x, logits in token_sets:
        top_k = problem.top_k
        weights, ids = topk_routing(logits, top_k)
        weights = weights.contiguous()
        sorted_ids, expert_ids, num_post = align_block_size(
            ids, config["BLOCK_SIZE_M"], num_experts
        )
        gate_up = torch.empty(x.shape[0] * top_k, two_n, dtype=x.dtype, device=x.device)
        down = torch.empty(x.shape[0], top_k, hidden, dtype=x.dtype, device=x.device)
        a1, a1_scale = quantize_activation(x, quant)
        common = dict(
            sorted_token_ids=sorted_ids,
            expert_ids=expert_ids,
            num_tokens_post_padded=num_post,
            config=config,
            quant_dtype=quant.dtype if quant else None,
            block_shape=block_shape,
        )
        routed.append((logits, weights, sorted_ids, expert_ids, num_post))
        gemm1 = functools.partial(
            gemm,
            a1,
            w1,
            gate_up,
            a_scale=a1_scale,
            w_scale=quant.w1_scale if quant else None,
            topk_weights=None,
            mul_routed_weight=False,
            top_k=top_k,
            **common,
        )
        gemm1()  # gate_up now holds what the down GEMM's input is computed from
        a2, a2_scale = quantize_activation(silu_and_mul(gate_up), quant)
        gemm2 = functools.partial(
            gemm,
            a2,
            w2,
            down,
            a_scale=a2_scale,
            w_scale=quant.w2_scale if quant else None,
            topk_weights=weights,
            mul_routed_weight=True,
            top_k=1,
            **common,
        )

        def call(gemm1=gemm1, gemm2=gemm2):
            gemm1()
            gemm2()

        calls.append(call)

    def refresh():
        for logits, weights, sorted_ids, expert_ids, num_post in routed:
            new_weights, new_ids = topk_routing(torch.randn_like(logits), problem.top_k)
            aligned = align_block_size(new_ids, config["BLOCK_SIZE_M"], num_experts)
            weights.copy_(new_weights)
            for buffer, value in zip((sorted_ids, expert_ids, num_post), aligned, strict=True):
                buffer.copy_(value)

    return calls, refresh


def grouped_mm_calls(problem, token_sets):
    """torch._grouped_mm gate/up then down on tokens pre-sorted by expert (glue excluded)."""
    w1_t = problem.w1.transpose(1, 2)  # [E, K, 2N], column-major per expert: what it wants
    w2_t = problem.w2.transpose(1, 2)  # [E, N, K]
    num_experts, n = problem.w2.shape[0], problem.w2.shape[2]
    calls = []
    for x, logits in token_sets:
        _, ids = topk_routing(logits, problem.top_k)
        flat = ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        x_sorted = x[order // problem.top_k].contiguous()
        offsets = torch.bincount(flat, minlength=num_experts).cumsum(0).to(torch.int32)
        act = torch.randn(x_sorted.shape[0], n, device=x.device, dtype=x.dtype)

        def call(x_sorted=x_sorted, act=act, offsets=offsets):
            torch._grouped_mm(x_sorted, w1_t, offs=offsets)
            torch._grouped_mm(act, w2_t, offs=offsets)

        calls.append(call)
    return calls


def glue_variants(problem, token_sets, config, block_shape):
    """Each glue op of the call alone, on inputs of the call's shapes: (name, make_calls)."""
    num_experts, two_n, hidden = problem.w1.shape
    top_k = problem.top_k
    M = token_sets[0][0].shape[0]
    x0 = token_sets[0][0]
    gate_up = torch.randn(M * top_k, two_n, device=x0.device).to(x0.dtype)
    down = torch.randn(M, top_k, hidden, device=x0.device).to(x0.dtype)
    routed = [topk_routing(logits, top_k)[1] for _, logits in token_sets]
    variants = [
        ("glue_routing", lambda: [lambda lg=lg: topk_routing(lg, top_k) for _, lg in token_sets]),
        (
            "glue_align",
            lambda: [
                lambda ids=ids: align_block_size(ids, config["BLOCK_SIZE_M"], num_experts)
                for ids in routed
            ],
        ),
        ("glue_silu", lambda: [lambda: silu_and_mul(gate_up)]),
        ("glue_sum", lambda: [lambda: moe_sum(down)]),
    ]
    if block_shape is not None:
        group = block_shape[1]
        act = silu_and_mul(gate_up)
        variants += [
            (
                "glue_quant_x",
                lambda: [lambda x=x: per_token_group_quant_fp8(x, group) for x, _ in token_sets],
            ),
            ("glue_quant_act", lambda: [lambda: per_token_group_quant_fp8(act, group)]),
            ("glue_silu_quant_fused", lambda: [lambda: silu_and_mul_quant_fp8(gate_up, group)]),
        ]
    return variants


def token_sets_for(problem, M: int, pool: int, count: int):
    """`count` disjoint (where the pool allows) slices of M tokens: x [M, K], logits [M, E]."""
    sets = []
    for i in range(max(1, min(count, pool // M))):
        start = i * M
        sets.append((problem.x[start : start + M], problem.router_logits[start : start + M]))
    return sets


def measure_point(problem, shape, label, M, pool, ceilings, device_name, on_gpu, vllm_gemm=None):
    """Every variant at one (shape, dtype, M); a variant that fails is recorded, not fatal."""
    dtype, block_shape = DTYPES[label]
    roof = moe_roofline(M, shape.E, shape.N, shape.K, shape.top_k, dtype, block_shape)
    bw, peak = ceilings["bandwidth_bytes_per_s"], peak_for(ceilings, dtype)
    floor_us = roof.floor_seconds(bw, peak) * 1e6
    sets = token_sets_for(problem, M, pool, GPU_TOKEN_SETS if on_gpu else HOST_TOKEN_SETS)
    _, first_ids = topk_routing(sets[0][1], shape.top_k)
    row = {
        "shape": shape.name,
        "E": shape.E,
        "top_k": shape.top_k,
        "K": shape.K,
        "N": shape.N,
        "dtype": label,
        "M": M,
        "experts_hit_expected": expected_experts_hit(M, shape.E, shape.top_k),
        "experts_hit_first_set": int(torch.unique(first_ids).numel()),
        "token_sets": len(sets),
        "floor_us": floor_us,
        "bound": roof.bound(bw, peak),
        "bytes": roof.bytes,
        "flops": roof.flops,
        "configs": {},
        "timings": {},
        "errors": {},
    }
    configs = {
        "default": default_config(M, shape.E, shape.N, shape.K, shape.top_k, dtype, block_shape)
    }
    published = vllm_config(shape, dtype, block_shape, M, device_name)
    if published is not None:
        configs["vllm"] = published
    row["configs"] = configs

    # Check what is timed: each config's output on the first token set against the reference.
    x0, logits0 = sets[0]
    reference = naive_fused_moe(
        x0, problem.w1, problem.w2, logits0, shape.top_k, quant=problem.quant
    ).float()
    row["rel_rms_error"] = {}
    for name, config in configs.items():
        try:
            out = fused_moe(
                x0, problem.w1, problem.w2, logits0, shape.top_k, config=config, quant=problem.quant
            )
            error = (out.float() - reference).norm() / reference.norm().clamp_min(1e-30)
            row["rel_rms_error"][name] = float(error)
        except Exception as exc:  # noqa: BLE001 - recorded; the timing below records it too
            row["rel_rms_error"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    del reference

    whole_problem = dataclasses.replace(problem, x=x0, router_logits=logits0)
    variants = []
    for name, config in configs.items():
        variants.append(
            (
                f"whole_{name}",
                lambda config=config: time_fused_moe(whole_problem, config, FIDELITY),
            )
        )
        variants.append(
            (
                f"gemms_{name}",
                lambda config=config: gemm_only_calls(problem, sets, config, dtype, block_shape),
            )
        )
        if vllm_gemm is not None:
            variants.append(
                (
                    f"gemms_{name}_vllmkernel",
                    lambda config=config: gemm_only_calls(
                        problem, sets, config, dtype, block_shape, gemm=vllm_gemm
                    ),
                )
            )
    variants += glue_variants(problem, sets, configs["default"], block_shape)
    if problem.quant is None:
        variants.append(("grouped_mm", lambda: grouped_mm_calls(problem, sets)))
    else:
        row["errors"]["grouped_mm"] = "not run: torch has no 128x128 block-scaled fp8 grouped GEMM"

    for variant, make in variants:
        try:
            made = make()
            if variant.startswith("whole_"):
                timing = made  # time_fused_moe's own result
            else:
                calls, refresh = made if isinstance(made, tuple) else (made, None)
                timing = time_bench(Calls(calls, refresh), FIDELITY, on_gpu)
            row["timings"][variant] = timing_row(timing, on_gpu)
        except Exception as exc:  # noqa: BLE001 - one failed variant must not end the run
            row["errors"][variant] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(
                f"  {shape.name} {label} M={M} {variant} failed: {row['errors'][variant]}",
                flush=True,
            )
            if on_gpu:
                torch.cuda.synchronize()
    whole = [
        row["timings"][v]["p50_us"] for v in ("whole_default", "whole_vllm") if v in row["timings"]
    ]
    row["whole_best_x_floor"] = min(whole) / floor_us if whole else None
    return row


# %% Reporting ------------------------------------------------------------------------------


def _us(row, variant):
    timing = row["timings"].get(variant)
    if timing is None:
        return "-"
    value = timing["p50_us"]
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _error(row):
    """The worst relative RMS error of the checked configs, or "fail"."""
    errors = list(row.get("rel_rms_error", {}).values())
    if not errors:
        return "-"
    if any(isinstance(e, str) for e in errors):
        return "fail"
    return f"{max(errors):.0e}"


def table_lines(rows: list[dict], markdown: bool) -> list[str]:
    headers = [
        "shape",
        "dtype",
        "M",
        "E_hit",
        "floor",
        "whole def",
        "whole vllm",
        "x floor",
        "gemms def",
        "gemms vllm",
        "gemms def vK",
        "gemms vllm vK",
        "grouped_mm",
        "err",
    ]
    body = []
    for row in rows:
        xf = row["whole_best_x_floor"]
        body.append(
            [
                row["shape"],
                row["dtype"],
                str(row["M"]),
                f"{row['experts_hit_expected']:.1f}",
                f"{row['floor_us']:.1f}",
                _us(row, "whole_default"),
                _us(row, "whole_vllm"),
                "-" if xf is None else f"{xf:.2f}",
                _us(row, "gemms_default"),
                _us(row, "gemms_vllm"),
                _us(row, "gemms_default_vllmkernel"),
                _us(row, "gemms_vllm_vllmkernel"),
                _us(row, "grouped_mm"),
                _error(row),
            ]
        )
    return _layout(headers, body, markdown)


def glue_table_lines(rows: list[dict], markdown: bool) -> list[str]:
    """Each glue op alone (p50 us), their sum as fused_moe runs them, and whole minus GEMMs."""
    headers = ["shape", "dtype", "M", *GLUE_OPS, "glue sum", "whole-gemms"]
    body = []
    for row in rows:
        t = {op: row["timings"].get(f"glue_{op}", {}).get("p50_us") for op in GLUE_OPS}
        # What fused_moe launches: block fp8 quantizes x and fuses SiLU-and-mul with the
        # activation quantization (silu_and_mul_quant_fp8); bf16 runs the plain SiLU-and-mul.
        if row["dtype"] == "bf16":
            parts = [t["routing"], t["align"], t["silu"], t["sum"]]
        else:
            parts = [t["routing"], t["align"], t["quant_x"], t["silu_quant_fused"], t["sum"]]
        glue = sum(parts) if all(p is not None for p in parts) else None
        whole, gemms = (
            row["timings"].get(v, {}).get("p50_us") for v in ("whole_default", "gemms_default")
        )
        cells = [row["shape"], row["dtype"], str(row["M"])]
        cells += ["-" if t[op] is None else f"{t[op]:.1f}" for op in GLUE_OPS]
        cells.append("-" if glue is None else f"{glue:.1f}")
        cells.append("-" if whole is None or gemms is None else f"{whole - gemms:.1f}")
        body.append(cells)
    return _layout(headers, body, markdown)


def _layout(headers: list[str], body: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        lines = [
            "| " + " | ".join(headers) + " |",
            "|" + "|".join("---:" if i > 1 else "---" for i in range(len(headers))) + "|",
        ]
        return lines + ["| " + " | ".join(cells) + " |" for cells in body]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]

    def line(cells):
        return " ".join(
            c.rjust(w) if i > 1 else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(headers)] + [line(cells) for cells in body]


def machine_info(device: str) -> dict:
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "device": device,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=torch.cuda.get_device_name(0),
            cuda=torch.version.cuda,
            sms=props.multi_processor_count,
        )
    else:
        info.update(gpu=None, cpu=platform.processor() or platform.machine())
    return info


def markdown_report(machine: dict, ceilings: dict, rows: list[dict]) -> str:
    lines = [
        "# Fused-MoE kernel benchmark",
        "",
        f"Machine: {machine.get('gpu') or machine.get('cpu')}, torch {machine['torch']}, "
        f"Triton {machine['triton']}, CUDA {machine.get('cuda')}; {machine['date_utc']}.",
        f"Measured ceilings: read bandwidth {ceilings['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s "
        f"({ceilings.get('bandwidth_source', 'copy')}), "
        f"bf16 matmul {ceilings['peak_flops_per_s'] / 1e12:.0f} TFLOP/s ({ceilings['matmul_size']}^3)"
        + "".join(
            f", {kind} {value / 1e12:.0f} TFLOP/s"
            for kind, value in (ceilings.get("peaks_flops_per_s") or {}).items()
            if kind != "bf16"
        )
        + ".",
        "",
        "Times are p50 us per call (CUDA graph replays, new routings before every replay, as the",
        "tuner times); `x floor` = best whole call / roofline floor; `vK` = the same GEMMs on",
        "vLLM's kernel (`--vllm-ref`), same inputs, same run;",
        "`err` = worst relative RMS error of the timed configs' output against `naive_fused_moe`.",
        "",
        *table_lines(rows, markdown=True),
        "",
        "## Glue ops alone",
        "",
        "Each op of the call on its own (p50 us, CUDA graph), on inputs of the call's shapes;",
        "`glue sum` adds the ops `fused_moe` launches: routing, align, silu, sum for bf16;",
        "routing, align, quant_x, silu_quant_fused (`silu_and_mul_quant_fp8`), sum for block fp8.",
        "silu and quant_act show what the unfused pair would cost. `whole-gemms` = whole call",
        "minus the GEMMs alone (default config).",
        "",
        *glue_table_lines(rows, markdown=True),
        "",
    ]
    errors = [(r, v, e) for r in rows for v, e in r["errors"].items()]
    if errors:
        lines += ["Not measured:", ""]
        lines += [f"- {r['shape']} {r['dtype']} M={r['M']} {v}: {e}" for r, v, e in errors]
        lines.append("")
    return "\n".join(lines)


# %% Main -----------------------------------------------------------------------------------


def save(
    out_dir: Path, machine: dict, ceilings: dict, rows: list[dict], wall_seconds: float
) -> None:
    """Write results.json and results.md (after every point, so a cut-off run keeps its rows)."""
    result = {"machine": machine, "ceilings": ceilings, "rows": rows, "wall_seconds": wall_seconds}
    atomic_write_json(out_dir / "results.json", result)
    atomic_write_text(out_dir / "results.md", markdown_report(machine, ceilings, rows))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shapes", help="comma-separated names from bench/shapes.json (default: all but tiny)"
    )
    parser.add_argument("--batch-sizes", help=f"comma-separated M values (default: {BATCH_SIZES})")
    parser.add_argument(
        "--dtypes", help=f"comma-separated, from {', '.join(DTYPES)} (default: all)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="the tiny shape at M = 1 and 8 (CPU-friendly)"
    )
    parser.add_argument(
        "--out", help="results folder (default: bench/results/<UTC date>-kernel-<UTC time>)"
    )
    parser.add_argument(
        "--vllm-ref",
        help="file with vLLM's fused_moe_kernel source (see bench/parity.py): also time the "
        "GEMMs on vLLM's kernel, same inputs, same run",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit(
            "bench/kernel.py: no CUDA GPU visible (torch.cuda.is_available() is False); "
            "TRITON_INTERPRET=1 python bench/kernel.py --quick runs the tiny shape on the CPU"
        )
    device = "cuda" if on_gpu else "cpu"
    shapes = load_shapes(
        args.shapes.split(",") if args.shapes else (["tiny"] if args.quick else None)
    )
    default_sizes = QUICK_BATCH_SIZES if args.quick else BATCH_SIZES
    batch_sizes = (
        [int(m) for m in args.batch_sizes.split(",")] if args.batch_sizes else list(default_sizes)
    )
    labels = args.dtypes.split(",") if args.dtypes else list(DTYPES)
    unknown = [label for label in labels if label not in DTYPES]
    if unknown:
        sys.exit(f"Error: unknown dtype(s) {', '.join(unknown)}; known: {', '.join(DTYPES)}")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-kernel-%H%M%SZ")
    out_dir = Path(args.out) if args.out else BENCH_DIR / "results" / stamp

    vllm_gemm = None
    if args.vllm_ref:
        import parity  # bench/parity.py, next to this script

        if Path(args.vllm_ref).exists():
            vllm_gemm = parity.vllm_launcher(parity.load_vllm_kernel(Path(args.vllm_ref)))
        else:
            print(f"no {args.vllm_ref}: vLLM's kernel is left out", flush=True)
    machine = machine_info(device)
    device_name = machine.get("gpu") or "NVIDIA H200"
    started = time.perf_counter()
    ceilings = measure_ceilings(device, quick=args.quick or not on_gpu)
    print(
        f"{machine.get('gpu') or machine.get('cpu')}: BW {ceilings['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"PEAK {ceilings['peak_flops_per_s'] / 1e12:.1f} TFLOP/s",
        flush=True,
    )
    rows = []
    pool = max(max(batch_sizes), GPU_TOKEN_SETS * min(batch_sizes))
    for shape in shapes:
        for label in labels:
            dtype, block_shape = DTYPES[label]
            problem = make_problem(
                pool,
                shape.E,
                shape.N,
                shape.K,
                shape.top_k,
                dtype,
                block_shape,
                device=device,
                seed=0,
            )
            for M in batch_sizes:
                try:
                    row = measure_point(
                        problem, shape, label, M, pool, ceilings, device_name, on_gpu, vllm_gemm
                    )
                except Exception:  # noqa: BLE001 - report and go on with the next point
                    traceback.print_exc()
                    continue
                rows.append(row)
                save(out_dir, machine, ceilings, rows, time.perf_counter() - started)
                print(
                    f"[{time.perf_counter() - started:6.0f}s] "
                    + table_lines([row], markdown=False)[1],
                    flush=True,
                )
            del problem
            if on_gpu:
                torch.cuda.empty_cache()

    wall = time.perf_counter() - started
    save(out_dir, machine, ceilings, rows, wall)
    print(f"\nwrote {out_dir}/results.json and results.md ({wall:.0f} s)")
    print(
        f"BW {ceilings['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, PEAK {ceilings['peak_flops_per_s'] / 1e12:.0f} TFLOP/s; "
        "p50 us per call; x floor = best whole call / floor"
    )
    print("glue ops alone, p50 us (glue sum: what fused_moe launches):")
    print("\n".join(glue_table_lines(rows, markdown=False)))
    print("\n".join(table_lines(rows, markdown=False)))
    return rows


if __name__ == "__main__":
    main()
