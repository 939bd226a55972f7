"""Same-run GEMM parity: moetune's fused-MoE GEMM kernel against vLLM's, same config and inputs.

Three kernels run in one process on the same inputs:

- ``vllm``: vLLM's ``fused_moe_kernel`` (vllm-project/vllm@13cb3e44, the function source
  saved to a file that `--vllm-ref` names; it is a measurement baseline, never part of
  moetune), exec'd unchanged under a two-line ``vllm.triton_utils`` shim and launched
  the way vLLM's ``invoke_fused_moe_kernel`` does (grid, the small-M ``EM`` cap,
  argument order);
- ``moetune``: `moetune.kernel.fused_moe_kernel.invoke_fused_moe_gemm` of this tree;
- ``before``: the same function at a044f6c (bench/parity_baseline/), the kernel
  before the parity work.

Method (that of ../shared/notes/fidelity-h200.md): per (shape, M), 10 token sets, each
with its own x and routing (random logits, softmax, top-k, renormalized), shared by all
kernels together with the alignment; a call is GEMM1 (x @ w1) plus GEMM2 (act @ w2,
routed weight). Per (kernel, config) one CUDA graph of the 10 calls; all graphs of a
point are replayed round-robin, the order reversed every other round, for at least
`--rounds` rounds; the figure is the p50 per call in us. Before timing, every kernel's
outputs on the first token set are checked against a float32 reference (relative RMS
error of GEMM1's and GEMM2's outputs).

    python bench/parity.py --vllm-ref .vllm_ref/fused_moe_kernel_13cb3e44.py --out DIR

Without `--vllm-ref` (or with a missing file) the vllm kernel is skipped and said so;
without a GPU the script exits with a one-line message. Results: DIR/parity.json
(rewritten after every point) and DIR/parity.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import sys
import time
import traceback
import types
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
BASELINE = BENCH_DIR / "parity_baseline" / "fused_moe_kernel_a044f6c.py"
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
}
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def cfg(text: str) -> dict:
    return dict(zip(KEYS, (int(v) for v in text.split("/")), strict=True))


# The large 8-warp tiles of the note (where the gap showed) for bf16; the note's
# vLLM/moetune configs for DeepSeek's block fp8 (vLLM's tuner keeps fp8 at 64 x 128).
NOTE_CONFIGS = {
    "bf16": {"t256": cfg("128/256/64/16/8/4"), "t128": cfg("128/128/64/1/8/3")},
    "fp8_w8a8": {"f64g32": cfg("64/128/128/32/4/4"), "f64g16": cfg("64/128/128/16/4/3")},
}


def configs_for(shape: str, M: int) -> dict[str, dict]:
    E, N, K, top_k, dtype, block_shape, vllm_file = SHAPES[shape]
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


def load_vllm_kernel(path: Path):
    """vLLM's ``fused_moe_kernel`` from its saved source, with ``vllm.triton_utils`` shimmed."""
    import triton
    import triton.language as tl

    if "vllm" not in sys.modules:
        package = types.ModuleType("vllm")
        package.__path__ = []
        utils = types.ModuleType("vllm.triton_utils")
        utils.tl, utils.triton = tl, triton
        package.triton_utils = utils
        sys.modules["vllm"], sys.modules["vllm.triton_utils"] = package, utils
    return load_module(path, "vllm_ref_fused_moe").fused_moe_kernel


def vllm_launcher(kernel):
    """vLLM's ``invoke_fused_moe_kernel`` (bf16 / fp8 w8a8 paths) around `kernel`."""
    import torch
    import triton
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
        c3 = c.view(-1, 1, c.shape[-1]) if c.dim() == 2 else c  # vLLM's C is [M, top_k, N]
        M = a.size(0)
        EM = sorted_token_ids.size(0)
        if M < config["BLOCK_SIZE_M"]:
            EM = min(sorted_token_ids.size(0), M * top_k * config["BLOCK_SIZE_M"])
        grid = (
            triton.cdiv(EM, config["BLOCK_SIZE_M"])
            * triton.cdiv(w.size(1), config["BLOCK_SIZE_N"]),
        )
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
            M * top_k,
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


def load_kernels(vllm_ref: str | None) -> tuple[dict, list[str]]:
    from moetune.kernel.fused_moe_kernel import invoke_fused_moe_gemm

    kernels, notes = {}, []
    if vllm_ref and Path(vllm_ref).exists():
        kernels["vllm"] = vllm_launcher(load_vllm_kernel(Path(vllm_ref)))
    else:
        notes.append(f"vllm kernel skipped: no reference source at {vllm_ref!r}")
    kernels["moetune"] = invoke_fused_moe_gemm
    kernels["before"] = load_module(BASELINE, "moetune_kernel_a044f6c").invoke_fused_moe_gemm
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
        if problem.quant is not None:
            a1, a1_scale = per_token_group_quant_fp8(x, problem.quant.block_shape[1])
        else:
            a1, a1_scale = x, None
        sets.append((x, a1, a1_scale, weights.contiguous(), ids))
    return sets


def dequant_act(a, scale, block_shape):
    if scale is None:
        return a.float()
    return a.float() * scale.repeat_interleave(block_shape[1], dim=1)[:, : a.shape[1]]


def reference(problem, a1, a1_scale, a2, a2_scale, weights, ids):
    """float32 GEMM1 [M*top_k, 2N] and GEMM2 [M*top_k, K] (routed weight applied), per expert."""
    import torch

    from moetune.kernel.quant import dequantize_weights

    quant = problem.quant
    block_shape = quant.block_shape if quant else None
    E, two_n, K = problem.w1.shape
    top_k = ids.shape[1]
    flat = ids.reshape(-1).long()
    x32 = dequant_act(a1, a1_scale, block_shape)
    act32 = dequant_act(a2, a2_scale, block_shape)
    g1 = torch.zeros(flat.numel(), two_n, device=a1.device)
    g2 = torch.zeros(flat.numel(), K, device=a1.device)
    for e in range(E):
        slots = (flat == e).nonzero().squeeze(1)
        if slots.numel() == 0:
            continue
        if quant is None:
            w1e, w2e = problem.w1[e].float(), problem.w2[e].float()
        else:
            w1e = dequantize_weights(problem.w1[e : e + 1], quant.w1_scale[e : e + 1], block_shape)[
                0
            ]
            w2e = dequantize_weights(problem.w2[e : e + 1], quant.w2_scale[e : e + 1], block_shape)[
                0
            ]
        g1[slots] = x32[slots // top_k] @ w1e.T
        g2[slots] = (act32[slots] @ w2e.T) * weights.reshape(-1)[slots, None]
    return g1, g2


def rel_rms(ref, out) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


# %% One point -----------------------------------------------------------------------------


def measure_point(shape: str, M: int, problem, kernels: dict, rounds: int, budget_s: float) -> dict:
    import torch

    from moetune.kernel.activation import silu_and_mul, silu_and_mul_quant_fp8
    from moetune.kernel.align import align_block_size

    E, N, K, top_k, dtype, block_shape, _ = SHAPES[shape]
    quant = problem.quant
    quant_dtype = quant.dtype if quant else None
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
            sorted_ids, expert_ids, num_post = align_block_size(sets[i][4], bm, E)
            alignments[bm, i] = dict(
                sorted_token_ids=sorted_ids, expert_ids=expert_ids, num_tokens_post_padded=num_post
            )
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
            a_scale=a1_scale,
            w_scale=quant.w1_scale if quant else None,
            topk_weights=None,
            mul_routed_weight=False,
            top_k=top_k,
            config=first,
            quant_dtype=quant_dtype,
            block_shape=block_shape,
            **alignment(first["BLOCK_SIZE_M"], i),
        )
        if block_shape is not None:
            acts.append(silu_and_mul_quant_fp8(gate_up, block_shape[1]))
        else:
            acts.append((silu_and_mul(gate_up), None))

    def call(kernel, config, i):
        x, a1, a1_scale, weights, ids = sets[i]
        gate_up, down = buffers[i]
        a2, a2_scale = acts[i]
        align = alignment(config["BLOCK_SIZE_M"], i)
        common = dict(config=config, quant_dtype=quant_dtype, block_shape=block_shape, **align)
        kernel(
            a1,
            problem.w1,
            gate_up,
            a_scale=a1_scale,
            w_scale=quant.w1_scale if quant else None,
            topk_weights=None,
            mul_routed_weight=False,
            top_k=top_k,
            **common,
        )
        kernel(
            a2,
            problem.w2,
            down,
            a_scale=a2_scale,
            w_scale=quant.w2_scale if quant else None,
            topk_weights=weights,
            mul_routed_weight=True,
            top_k=1,
            **common,
        )

    x, a1, a1_scale, weights, ids = sets[0]
    ref1, ref2 = reference(problem, a1, a1_scale, *acts[0], weights, ids)
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
    for cname, config in configs.items():
        row["configs"][cname] = label(config)
        for kname, kernel in kernels.items():
            key = f"{kname}|{cname}"
            try:
                gate_up, down = buffers[0]
                gate_up.fill_(float("nan"))
                down.fill_(float("nan"))
                call(kernel, config, 0)  # compiles; checked below
                torch.cuda.synchronize()
                row["errors"][key] = [rel_rms(ref1, gate_up), rel_rms(ref2, down.view(-1, K))]
                for i in range(TOKEN_SETS):
                    call(kernel, config, i)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for i in range(TOKEN_SETS):
                        call(kernel, config, i)
                graphs[key] = graph
            except Exception as exc:  # noqa: BLE001 - recorded, the point goes on
                row["errors"][key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                print(f"  {shape} M={M} {key}: {row['errors'][key]}", flush=True)
                torch.cuda.synchronize()
    del ref1, ref2
    order = list(graphs)
    samples = {key: [] for key in order}
    for graph in graphs.values():  # warm-up
        graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    while done < rounds or (done < 3 * rounds and time.perf_counter() - start < budget_s / 4):
        keys = order if done % 2 == 0 else order[::-1]
        events = []
        for key in keys:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graphs[key].replay()
            end.record()
            events.append((key, begin, end))
        torch.cuda.synchronize()
        for key, begin, end in events:
            samples[key].append(begin.elapsed_time(end) * 1e3 / TOKEN_SETS)
        done += 1
        if time.perf_counter() - start > budget_s:
            break
    row["rounds"] = done
    row["us"] = {key: statistics.median(v) for key, v in samples.items() if v}
    row["samples"] = samples
    for graph in graphs.values():
        graph.reset()
    return row


# %% Report --------------------------------------------------------------------------------


def markdown(rows: list[dict], machine: dict, notes: list[str]) -> str:
    lines = [
        "# GEMM parity: moetune's kernel vs vLLM's fused_moe_kernel (same run)",
        "",
        f"{machine}",
        "",
        "p50 us per call (GEMM1 + GEMM2), CUDA graph of 10 token sets, round-robin replays.",
        "`ratio` = kernel / vLLM's kernel with the same config (> 1: slower). `err` = worst",
        "relative RMS error of the point's outputs against the float32 reference.",
        "",
        *[f"- {n}" for n in notes],
        "",
        "| shape | M | config | BM/BN/BK/G/w/s | vllm us | moetune us | before us | moetune/vllm | before/vllm | rounds | err |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for cname, text in row["configs"].items():
            us = {k: row["us"].get(f"{k}|{cname}") for k in ("vllm", "moetune", "before")}
            errs = [row["errors"].get(f"{k}|{cname}") for k in ("vllm", "moetune", "before")]
            worst = max((max(e) for e in errs if isinstance(e, list)), default=None)
            failed = any(isinstance(e, str) for e in errs)

            def fmt(v):
                return "-" if v is None else f"{v:.1f}"

            def ratio(a, b):
                return "-" if a is None or b is None else f"{a / b:.3f}"

            lines.append(
                f"| {row['shape']} | {row['M']} | {cname} | {text} | {fmt(us['vllm'])} | "
                f"{fmt(us['moetune'])} | {fmt(us['before'])} | {ratio(us['moetune'], us['vllm'])} | "
                f"{ratio(us['before'], us['vllm'])} | {row['rounds']} | "
                f"{'fail' if failed else ('-' if worst is None else f'{worst:.1e}')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--vllm-ref", help="file with vLLM's fused_moe_kernel source (.vllm_ref/...)"
    )
    parser.add_argument("--out", default="bench/results/parity", help="results folder")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--batch-sizes", default="1024,4096,256", help="comma-separated M")
    parser.add_argument("--rounds", type=int, default=20, help="replay rounds per point, at least")
    parser.add_argument(
        "--budget-s", type=float, default=270.0, help="stop starting points after this"
    )
    args = parser.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("Error: bench/parity.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from moetune.fileio import atomic_write_json, atomic_write_text
    from moetune.kernel.problem import make_problem

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels, notes = load_kernels(args.vllm_ref)
    machine = (
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, Triton {triton.__version__}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(machine, *notes, sep="\n", flush=True)
    shapes = args.shapes.split(",")
    sizes = [int(m) for m in args.batch_sizes.split(",")]
    started = time.perf_counter()
    rows = []
    for shape in shapes:
        E, N, K, top_k, dtype, block_shape, _ = SHAPES[shape]
        problem = make_problem(
            TOKEN_SETS * max(sizes), E, N, K, top_k, dtype, block_shape, device="cuda"
        )
        for M in sizes:
            elapsed = time.perf_counter() - started
            if elapsed > args.budget_s:
                notes.append(f"{shape} M={M} not run: budget of {args.budget_s:.0f} s spent")
                continue
            per_point = max(
                10.0, (args.budget_s - elapsed) / (len(shapes) * len(sizes) - len(rows))
            )
            try:
                row = measure_point(shape, M, problem, kernels, args.rounds, per_point)
            except Exception:  # noqa: BLE001 - report and go on
                traceback.print_exc()
                torch.cuda.synchronize()
                continue
            rows.append(row)
            atomic_write_json(
                out / "parity.json", {"machine": machine, "notes": notes, "rows": rows}
            )
            atomic_write_text(out / "parity.md", markdown(rows, machine, notes))
            print(
                f"[{time.perf_counter() - started:5.0f}s] {shape} M={M}: "
                + ", ".join(f"{k} {v:.1f}" for k, v in row["us"].items()),
                flush=True,
            )
        del problem
        torch.cuda.empty_cache()
    atomic_write_json(out / "parity.json", {"machine": machine, "notes": notes, "rows": rows})
    atomic_write_text(out / "parity.md", markdown(rows, machine, notes))
    print(markdown(rows, machine, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
