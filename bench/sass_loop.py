"""The fused-MoE GEMM kernels in SASS, compiled for sm_90a without a GPU.

Compiles kernels ahead of time for an H100/H200 (sm_90a) with the installed Triton,
assembles the PTX with Triton's bundled ptxas and prints, per kernel and config:
registers, spill bytes and the SASS instructions of the main K loop (the basic block
from the first instruction of the loop to its backward branch), with its most common
opcodes, and whether each kernel's whole SASS equals vLLM's. To see the H200's code
generation, put its Triton first on the path, e.g. ``pip install --target /tmp/t36
triton==3.6.0`` then ``PYTHONPATH=/tmp/t36:$PWD``.

Default mode: moetune's twin (``moetune.kernel.fused_moe_kernel``) against vLLM 0.33's
``fused_moe_kernel``, compiled from vLLM's own ``fused_moe.py`` (`--vllm-ref`, read by
`moetune.engines.source`: only its ``@triton.jit`` functions run). Each kernel is
specialized from the arguments its own launcher passes: vLLM's through
`moetune.engines.launch.vllm_0_33.launch` (vLLM 0.33's ``invoke_fused_moe_triton_kernel``,
on compute capability 9.0), the twin's through `invoke_fused_moe_gemm` on a device of
capability 9.0, both on the same (meta) tensors of a real shape at batch size M:
alignment as moetune builds it, or vLLM's naive assignment where vLLM takes it
(``M * top_k * 4 <= E``). Every argument is specialized as Triton's launcher does (an
int equal to 1 and None become constexprs, multiples of 16 get divisibility 16); the
runtime arguments of the two launches must specialize alike. `--path` picks the
quantization (bf16, fp16, fp8-tensor, fp8-channel, fp8-block, int8-channel, int8-w8a16,
or all), `--down` the down GEMM (routed weights, top_k 1); configs are
BM/BN/BK/GROUP_M/warps/stages. Results: bench/results/2026-12-02-sass-vllm033/.
``--vllm-release 0.34.0`` compares vLLM 0.34's kernel (its ``fused_moe.py`` as `--vllm-ref`),
launched by `moetune.engines.launch.vllm_0_34`; ``--checkpoint fp16`` stores into fp16, as
an fp16 checkpoint's GEMMs do (w8a8 still computes in bf16 on vLLM).

    PYTHONPATH=/tmp/t36:$PWD python bench/sass_loop.py --path fp8-block --M 256 \
        --vllm-ref /work/engines/src/vllm/model_executor/layers/fused_moe/fused_moe.py \
        --configs 16/128/128/16/4/3,64/128/128/16/4/3

With ``--sglang-ref PATH`` (SGLang 0.5.23's ``fused_moe_triton_kernels.py``) it compares
moetune's twin of SGLang's kernel (``moetune.kernel.fused_moe_kernel_sglang``) with SGLang's
own ``fused_moe_kernel`` compiled from that file: both launched by
`moetune.engines.launch.sglang_0_5_23.launch` (capability 9.0: swap_ab for fp8 with
BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64, PDL) on the same meta tensors, always aligned.
``--tma`` adds SGLang's TMA flags (``w``: B through a descriptor; ``c``: the up GEMM's C
sorted; ``aw``: the down GEMM's A, sorted, and B through descriptors), ``--shape`` another
model (``qwen3-235b-tp8``'s down GEMM has K=192 and ``gpt-oss-120b``'s K=2880, so
BLOCK_SIZE_K 128 leaves a K tail: even_Ks False). ``--suite`` runs the recorded coverage
(`SGLANG_SUITE`), ``--control`` the negative controls (`SGLANG_CONTROLS`), which must
differ; ``--json`` writes one record per comparison. Results:
bench/results/2026-12-02-sass-sglang0523/.

    PYTHONPATH=/tmp/t36:$PWD python bench/sass_loop.py --suite \
        --sglang-ref .engines/site/sglang/kernels/ops/moe/fused_moe_triton_kernels.py

With ``--int4 M`` it compiles the int4 w4a16 kernels instead (moetune's
``fused_moe_wna16_kernel`` and, with ``--vllm-ref``, vLLM's ``fused_moe_kernel_gptq_awq``
saved to a file, see bench/parity.py)
at Qwen3-30B-A3B int4's shape (E=128, N=768, K=2048, group 128; up GEMM top_k 8,
``--down`` top_k 1 with routed weights), every argument specialized as the launchers
pass it for batch size M; it adds the loop's memory instructions. Results:
bench/results/2026-12-01-sass-int4/.

    python bench/sass_loop.py --int4 256 --down --vllm-ref .vllm_ref/fused_moe_kernel_gptq_awq.py \
        --configs 64/32/128/16/4/3,16/32/256/16/4/4
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from moetune.kernel.config import CONFIG_KEYS  # noqa: E402

# Real shapes: (E, N intermediate per expert, K hidden, top_k).
SHAPES = {
    "qwen3-30b-a3b": (128, 768, 2048, 8),
    "deepseek-v3-tp8": (256, 256, 7168, 8),
    "qwen3-235b-tp8": (128, 192, 4096, 8),  # down GEMM K=192
    "gpt-oss-120b": (128, 2880, 2880, 4),  # up GEMM K=2880
}
# path: (shape, activation/weight dtype, quant_dtype, per_channel, block_shape)
PATHS = {
    "bf16": ("qwen3-30b-a3b", "bf16", None, False, None),
    "fp16": ("qwen3-30b-a3b", "fp16", None, False, None),
    "fp8-tensor": ("qwen3-30b-a3b", "fp8", "fp8_w8a8", False, None),
    "fp8-channel": ("qwen3-30b-a3b", "fp8", "fp8_w8a8", True, None),
    "fp8-block": ("deepseek-v3-tp8", "fp8", "fp8_w8a8", False, (128, 128)),
    "int8-channel": ("qwen3-30b-a3b", "int8", "int8_w8a8", True, None),
    "int8-w8a16": ("qwen3-30b-a3b", "w8a16", "int8_w8a16", False, None),
}
# The configs each path is checked at by default (BM/BN/BK/GROUP_M/warps/stages):
# small and large tiles, and the 8-row tiles fp8 swaps A and B for on sm90.
DEFAULT_CONFIGS = {
    "bf16": "16/64/128/1/4/3,64/128/64/16/4/3,128/256/64/16/8/4",
    "fp16": "16/64/128/1/4/3,64/128/64/16/4/3,128/256/64/16/8/4",
    "fp8-tensor": "8/64/128/16/4/5,16/64/128/1/4/4,64/128/128/16/4/3,128/256/128/16/8/3",
    "fp8-channel": "8/64/128/16/4/5,16/64/128/1/4/4,64/128/128/16/4/3",
    "fp8-block": "8/64/128/16/4/5,16/128/128/16/4/3,64/128/128/16/4/3,128/128/128/16/8/3",
    "int8-channel": "16/64/128/1/4/4,64/128/128/16/4/3,128/256/128/16/8/3",
    "int8-w8a16": "16/64/128/1/4/4,64/128/64/16/4/3,128/256/64/16/8/4",
}
SM90 = (9, 0)


def gemm_launch(
    path: str,
    config: dict,
    *,
    down: bool,
    M: int,
    shape: str | None = None,
    aligned: bool = False,
    tma: str = "",
    checkpoint: str = "bf16",
) -> dict:
    """The keyword arguments of one GEMM launch (`invoke_fused_moe_gemm`'s), on meta tensors.

    Shapes are the real model's (`shape`, default the path's) at batch size M; alignment
    as moetune builds it (`moetune.kernel.align.max_padded_slots`), or vLLM 0.33's naive
    assignment unless `aligned` (SGLang always aligns). `tma`: SGLang's TMA flags, ``w``
    (B through a descriptor), ``c`` (up GEMM: C at the sorted positions), ``a`` (down
    GEMM: A, and its scales, at the sorted positions, read through a descriptor).
    `checkpoint` "fp16": C (and w8a16's A) in fp16, an fp16 checkpoint's buffers.
    """
    import torch

    from moetune.engines.launch import vllm_0_33
    from moetune.kernel.align import max_padded_slots

    default_shape, kind, quant_dtype, per_channel, block_shape = PATHS[path]
    experts, n, k, top_k = SHAPES[shape or default_shape]
    slots = M * top_k
    bm = config["BLOCK_SIZE_M"]
    padded = max_padded_slots(slots, bm, experts)
    rows, inner, outer = (slots, n, k) if down else (M, k, 2 * n)
    if "a" in tma:
        rows = padded
    meta = dict(device="meta")
    compute = torch.float16 if "fp16" in (kind, checkpoint) else torch.bfloat16
    element = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}.get(kind, compute)
    a = torch.empty(rows, inner, dtype=element, **meta)
    w = torch.empty(experts, outer, inner, dtype=torch.int8 if kind == "w8a16" else element, **meta)
    c_shape = (M, top_k, outer) if down else ((padded if "c" in tma else slots), outer)
    c = torch.empty(*c_shape, dtype=compute, **meta)
    a_scale = w_scale = None
    f32 = dict(dtype=torch.float32, **meta)
    if block_shape is not None:
        bn, bk = block_shape
        a_scale = torch.empty(rows, -(-inner // bk), **f32)
        w_scale = torch.empty(experts, -(-outer // bn), -(-inner // bk), **f32)
    elif per_channel:
        a_scale, w_scale = torch.empty(rows, 1, **f32), torch.empty(experts, outer, **f32)
    elif quant_dtype == "fp8_w8a8":
        a_scale, w_scale = torch.empty(1, **f32), torch.empty(experts, **f32)
    elif quant_dtype == "int8_w8a16":
        w_scale = torch.empty(experts, outer, **f32)
    ids = dict(dtype=torch.int32, **meta)
    if not aligned and vllm_0_33.naive_assignment(slots, experts, quant_dtype, block_shape):
        sorted_ids, expert_ids = None, torch.empty(slots, **ids)
    else:
        sorted_ids, expert_ids = torch.empty(padded, **ids), torch.empty(padded // bm, **ids)
    return dict(
        a=a,
        w=w,
        c=c,
        a_scale=a_scale,
        w_scale=w_scale,
        topk_weights=torch.empty(M, top_k, **f32) if down else None,
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=torch.empty(1, **ids),
        mul_routed_weight=down,
        top_k=1 if down else top_k,
        config=config,
        quant_dtype=quant_dtype,
        block_shape=block_shape,
        per_channel=per_channel,
        **(dict(a_use_tma="a" in tma, w_use_tma="w" in tma, c_sorted="c" in tma) if tma else {}),
    )


class _Capture:
    """Stands in for a JIT kernel: records ``kernel[grid](*args, **kwargs)``."""

    def __init__(self) -> None:
        self.calls: list = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def captured_launches(
    path: str,
    config: dict,
    *,
    down: bool,
    M: int,
    checkpoint: str = "bf16",
    release: str = "0.33.0",
) -> dict:
    """{"vllm": (grid, args, kwargs), "moetune": ...}: what each launcher passes its kernel
    (vLLM's: `release`'s launch module)."""
    import moetune.kernel.fused_moe_kernel as twin
    from moetune.engines.launch import release_module
    from moetune.engines.launch.common import GemmCall

    launch = gemm_launch(path, config, down=down, M=M, checkpoint=checkpoint)
    vllm = _Capture()
    release_module("vllm", release).launch(vllm, GemmCall(**launch), capability=SM90)
    kernel, capability = twin.fused_moe_kernel, twin.device_capability
    twin.fused_moe_kernel, twin.device_capability = _Capture(), lambda tensor: SM90
    # From 0.34 the twin takes TMA-B where 0.34 does, as `fused_experts` launches it.
    tma_b = {} if release == "0.33.0" else {"w_use_tma": None}
    try:
        twin.invoke_fused_moe_gemm(**launch, **tma_b)
        moetune = twin.fused_moe_kernel
    finally:
        twin.fused_moe_kernel, twin.device_capability = kernel, capability
    return {"vllm": vllm.calls[0], "moetune": moetune.calls[0]}


def launch_signature(fn, args: tuple, kwargs: dict):
    """(signature, constexprs, attrs, options, runtime specs) of `fn` launched with these
    arguments, specialized as Triton's launcher specializes them."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    kwargs = dict(kwargs)
    options = {
        key: kwargs.pop(key) for key in ("num_warps", "num_stages", "launch_pdl") if key in kwargs
    }
    values = dict(zip([p.name for p in fn.params], args, strict=False))
    values.update(kwargs)
    sig, constexprs, attrs, runtime = {}, {}, {}, []
    for i, param in enumerate(fn.params):
        value = values[param.name] if param.name in values else param.default
        if param.is_constexpr:
            sig[param.name], constexprs[(i,)] = "constexpr", value
            continue
        kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
        sig[param.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = value
            continue
        if spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
        runtime.append((param.name, kind, spec))
    return sig, constexprs, attrs, options, runtime


def load_vllm033_kernel(path: Path):
    """vLLM 0.33's ``fused_moe_kernel`` from its ``fused_moe.py``, or a one-line SystemExit."""
    from moetune.engines.source import load_jit_functions

    kernel = load_jit_functions(path, ("fused_moe_kernel",))["fused_moe_kernel"]
    if "naive_block_assignment" not in kernel.arg_names:
        raise SystemExit(f"{path}: not vLLM 0.33's fused_moe_kernel (no naive_block_assignment)")
    return kernel


# Qwen3-30B-A3B int4 (E=128, N=768, K=2048, group 128): (N, K, top_k) of each GEMM.
INT4_SHAPE = dict(experts=128, group=128, up=(2 * 768, 2048, 8), down=(2048, 768, 1))


def int4_signature(fn, config: tuple[int, ...], *, down: bool, M: int, zp: bool = False):
    """(signature, constexprs, attrs) of the int4 kernels at the real shape's argument values.

    Every argument gets the value its launcher passes (bench/parity.py's launchers, moetune's
    `invoke_fused_moe_wna16_gemm`), specialized as Triton's launcher does: an int equal to 1
    becomes a constexpr, a multiple of 16 gets divisibility 16, None is a constexpr.
    """
    import triton.language as tl
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    bm, bn, bk, gm, _, _ = config
    n, k, top_k = INT4_SHAPE["down" if down else "up"]
    g, experts = INT4_SHAPE["group"], INT4_SHAPE["experts"]
    slots = M * 8
    sorted_len = slots + experts * (bm - 1)
    rows = slots // top_k  # rows of A
    zp_strides = (n // 2 * (k // g), k // g, 1) if zp else (0, 0, 0)
    em_vllm = min(sorted_len, rows * top_k * bm) if rows < bm else sorted_len
    values = dict(
        a_ptr="*bf16", b_ptr="*u8", w_ptr="*u8", c_ptr="*bf16", b_scale_ptr="*bf16",
        w_scale_ptr="*bf16", b_zp_ptr="*u8" if zp else None, w_zp_ptr="*u8" if zp else None,
        topk_weights_ptr="*fp32",
        sorted_token_ids_ptr="*i32", expert_ids_ptr="*i32", num_tokens_post_padded_ptr="*i32",
        N=n, K=k, EM=min(sorted_len, slots * bm), num_slots=slots, num_valid_tokens=slots,
        stride_am=k, stride_ak=1, stride_we=n * k // 2, stride_be=n * k // 2,
        stride_wn=k // 2, stride_bn=k // 2, stride_wk=1, stride_bk=1, stride_cm=n, stride_cn=1,
        stride_wse=n * (k // g), stride_bse=n * (k // g), stride_wsn=k // g, stride_bsn=k // g,
        stride_wsk=1, stride_bsk=1, stride_wze=zp_strides[0], stride_wzn=zp_strides[1],
        stride_wzk=zp_strides[2], stride_bze=zp_strides[0], stride_bzn=zp_strides[1],
        stride_bzk=zp_strides[2],
        GROUP_SIZE=g, group_size=g, block_k_diviable=k % bk == 0, EVEN_K=k % bk == 0,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=gm, SPLIT_K=1,
        MUL_ROUTED_WEIGHT=down, TOP_K=top_k, top_k=top_k, COMPUTE_TYPE=tl.bfloat16,
        compute_type=tl.bfloat16, HAS_ZP=zp, has_zp=zp, use_int4_w4a16=True,
        use_int8_w8a16=False, INTERPRETER_BF16=False,
    )  # fmt: skip
    if fn.__name__.endswith("gptq_awq"):
        values["EM"] = em_vllm
    sig, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        value = values[param.name]
        if param.is_constexpr or value is None:
            sig[param.name], constexprs[(i,)] = "constexpr", value
        elif isinstance(value, str):
            sig[param.name] = value
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
            sig[param.name] = kind
            if kind == "constexpr":
                constexprs[(i,)] = value
            elif spec == "D":
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def ptxas_path(ptx: str) -> str:
    import triton

    folder = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    version = re.search(r"\.version (\d+)\.(\d+)", ptx)
    # A Triton newer than its bundled sm_90 ptxas emits PTX only ptxas-blackwell reads.
    for name in ("ptxas", "ptxas-blackwell"):
        path = folder / name
        if path.exists():
            probe = subprocess.run([str(path), "--version"], capture_output=True, text=True)
            found = re.search(r"release (\d+)\.(\d+)", probe.stdout)
            if (
                found
                and version
                and tuple(map(int, found.groups())) >= tuple(map(int, version.groups()))
            ):
                return str(path)
    return str(folder / "ptxas-blackwell")


def analyse(fn, signature, options: dict, *, int4: bool = False, sass_out: str = "") -> dict:
    """Registers, spills and the K loop's SASS of one specialization (sig, constexprs, attrs)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, constexprs, attrs = signature
    compiled = triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options=options,
    )
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        Path(src).write_text(ptx)
        ptxas = ptxas_path(ptx)
        run = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", src, "-o", cubin], capture_output=True, text=True
        )
        if run.returncode and "Unsupported .version" in run.stderr:
            # PTX ISA 9.x (CUDA 13) from Triton 3.9: the sm_90 ptxas is CUDA 12.
            ptxas = str(Path(ptxas).parent / "ptxas-blackwell")
            run = subprocess.run(
                [ptxas, "-arch=sm_90a", "-v", src, "-o", cubin], capture_output=True, text=True
            )
        report = run.stdout + run.stderr
        cuobjdump = str(Path(ptxas).parent / "cuobjdump")
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
    if sass_out:
        Path(sass_out).write_text(sass)
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    lines = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]
    address = [int(re.match(r"\s*/\*([0-9a-f]{4})\*/", line).group(1), 16) for line in lines]
    mma = [i for i, line in enumerate(lines) if re.search(r"\b[A-Z]*MMA\b", line)]
    loop = []
    for i in range(mma[-1] if mma else 0, len(lines)):
        target = re.search(r"BRA\s+0x([0-9a-f]+)", lines[i])
        if mma and target and int(target.group(1), 16) <= address[mma[0]]:
            loop = lines[address.index(int(target.group(1), 16)) : i + 1]
            break
    ops = collections.Counter(
        re.sub(r"^\s*/\*[0-9a-f]{4}\*/\s*(@!?U?P\w+\s+)?", "", line).split()[0].split(".")[0]
        for line in loop
    )
    memory = collections.Counter(
        re.search(r"\b(LDGSTS|LDGDEPBAR|LDSM|LDG|LDS|STS|STG)(\.[\w.]+)?", line).group(0)
        for line in loop
        if re.search(r"\b(LDGSTS|LDGDEPBAR|LDSM|LDG|LDS|STS|STG)\b", line)
    )
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spill_bytes": sum(map(int, spills.groups())) if spills else None,
        "loop_instructions": len(loop),
        "loop_top_ops": ops.most_common(8 if int4 else 5),
        **({"loop_memory": dict(sorted(memory.items()))} if int4 else {}),
        "_opcodes": [re.sub(r"^\s*/\*[0-9a-f]{4}\*/\s*", "", line).split(";")[0] for line in lines],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--vllm-ref",
        help="vLLM 0.33's fused_moe.py (default mode), or with --int4 vLLM's saved "
        "fused_moe_kernel_gptq_awq source (bench/parity.py)",
    )
    parser.add_argument(
        "--path", default="all", choices=[*PATHS, "all"], help="quantization path (default all)"
    )
    parser.add_argument(
        "--configs",
        help="BM/BN/BK/GROUP_M/warps/stages,... (default: each path's DEFAULT_CONFIGS)",
    )
    parser.add_argument("--M", default="256", help="batch sizes, comma-separated (default 256)")
    parser.add_argument(
        "--down", action="store_true", help="the down GEMM (routed weight, top_k 1)"
    )
    parser.add_argument(
        "--int4",
        type=int,
        default=0,
        metavar="M",
        help="the int4 w4a16 kernels (moetune's wna16, f4d2565's, vLLM's gptq_awq) at Qwen3-30B "
        "int4's shape for batch size M",
    )
    parser.add_argument("--zp", action="store_true", help="--int4 with zero points")
    parser.add_argument("--sass-dir", help="write each kernel's full SASS there")
    parser.add_argument(
        "--sglang-ref",
        help="SGLang 0.5.23's fused_moe_triton_kernels.py: compare moetune's twin of SGLang's "
        "kernel with it (SGLang mode)",
    )
    parser.add_argument("--shape", choices=list(SHAPES), help="SGLang mode: another model")
    parser.add_argument(
        "--tma",
        default="",
        choices=["", *SGLANG_TMA],
        help="SGLang mode: TMA flags (w: B by descriptor; c: up GEMM's C sorted; aw: down "
        "GEMM's A sorted, A and B by descriptor)",
    )
    parser.add_argument(
        "--suite", action="store_true", help="SGLang mode: the recorded coverage (SGLANG_SUITE)"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="SGLang mode: the negative controls (SGLANG_CONTROLS), which must differ",
    )
    parser.add_argument("--json", help="SGLang mode: write one JSON record per comparison")
    parser.add_argument(
        "--checkpoint",
        default="bf16",
        choices=["bf16", "fp16"],
        help="the checkpoint's dtype: fp16 stores fp16 (vLLM computes w8a8 in bf16 still)",
    )
    parser.add_argument(
        "--vllm-release",
        default="0.33.0",
        choices=["0.33.0", "0.34.0"],
        help="default mode: --vllm-ref is this release's fused_moe.py, launched as it launches",
    )
    args = parser.parse_args(argv)
    import parity
    import triton

    if args.int4:
        return main_int4(args, parity, triton)
    if args.sglang_ref:
        return main_sglang(args, triton)
    if not args.vllm_ref:
        raise SystemExit("--vllm-ref: vLLM 0.33's fused_moe.py is needed")
    import moetune.kernel.fused_moe_kernel as twin

    kernels = {"moetune": twin.fused_moe_kernel, "vllm": load_vllm033_kernel(Path(args.vllm_ref))}
    gemm = "down" if args.down else "up"
    paths = list(PATHS) if args.path == "all" else [args.path]
    all_same = True
    for path in paths:
        for M in (int(m) for m in args.M.split(",")):
            print(
                f"Triton {triton.__version__}, sm_90a, {path}, {gemm} GEMM, M={M}, vLLM "
                f"{args.vllm_release}, {args.checkpoint} checkpoint",
                flush=True,
            )
            for text in (args.configs or DEFAULT_CONFIGS[path]).split(","):
                config = dict(zip(CONFIG_KEYS, (int(v) for v in text.split("/")), strict=True))
                same = compare_launches(kernels, path, config, text, M=M, args=args)
                all_same = all_same and same
    print(f"all whole-SASS identical: {all_same}")
    return 0 if all_same else 1


# vLLM's runtime arguments the twin lacks: the bias strides (no bias on these paths).
VLLM_ONLY_ARGS = ("stride_bbe", "stride_bbn")


def alike(moetune: tuple, vllm: tuple) -> bool:
    """Same grid, and the same runtime arguments in the same order, specialized alike
    (names aside); vLLM's trailing bias strides are unused."""
    (grid, ours), (vllm_grid, theirs) = moetune, vllm
    extra = [name for name, _, _ in theirs[len(ours) :]]
    return (
        grid == vllm_grid
        and [spec[1:] for spec in ours] == [spec[1:] for spec in theirs[: len(ours)]]
        and all(name in VLLM_ONLY_ARGS for name in extra)
    )


def compare_launches(kernels: dict, path: str, config: dict, text: str, *, M: int, args) -> bool:
    """Compile both kernels as their launchers launch them; print and return SASS equality."""
    gemm = "down" if args.down else "up"
    launches = captured_launches(
        path, config, down=args.down, M=M, checkpoint=args.checkpoint, release=args.vllm_release
    )
    opcodes, specs, notes = {}, {}, {}
    for name, fn in kernels.items():
        grid, call_args, call_kwargs = launches[name]
        sig, constexprs, attrs, options, runtime = launch_signature(fn, call_args, call_kwargs)
        specs[name] = (grid, runtime)
        notes[name] = {
            key: call_kwargs[key]
            for key in (
                "naive_block_assignment",
                "NAIVE_BLOCK_ASSIGNMENT",
                "SWAP_AB",
                "BLOCK_SIZE_K",
            )
            if key in call_kwargs
        }
        # TMA-B: vLLM 0.34's b_desc, the twin's w_desc (third/fourth positional argument)
        notes[name]["TMA-B"] = any(
            type(arg).__name__ == "TensorDescriptor" for arg in call_args[:4]
        )
        sass_out = ""
        if args.sass_dir:
            Path(args.sass_dir).mkdir(parents=True, exist_ok=True)
            sass_out = f"{args.sass_dir}/{path}_{gemm}_M{M}_{text.replace('/', '-')}_{name}.sass"
        result = analyse(fn, (sig, constexprs, attrs), options, sass_out=sass_out)
        opcodes[name] = result.pop("_opcodes")
        print(f"{text:>18} {name:>8}: {notes[name]} {result}", flush=True)
    same_launch = alike(specs["moetune"], specs["vllm"])
    same = opcodes["moetune"] == opcodes["vllm"]
    detail = ""
    if not same:
        first = next(
            (i for i, (x, y) in enumerate(zip(*opcodes.values(), strict=False)) if x != y),
            min(map(len, opcodes.values())),
        )
        detail = f" (first difference at instruction {first} of {len(opcodes['moetune'])}/" + (
            f"{len(opcodes['vllm'])})"
        )
    print(
        f"{text:>18}  grid and runtime arguments specialized alike: {same_launch}; "
        f"whole SASS identical: {same}{detail}",
        flush=True,
    )
    return same and same_launch


# ---- SGLang mode: the twin of SGLang 0.5.23's kernel against SGLang's own ----

# SGLang's TMA flags: w (B by descriptor), c (the up GEMM's C at the sorted positions),
# aw (the down GEMM's sorted A, and B, by descriptor), as `moetune.kernel.fused_moe`
# launches them (a TMA down entry makes the up GEMM sort C).
SGLANG_TMA = {"w": "up", "c": "up", "wc": "up", "aw": "down"}
# Per path: the configs compared (BM/BN/BK/GROUP_M/warps/stages). fp8 adds swap_ab's
# tiles (BLOCK_SIZE_M 8, 16, 32 with BLOCK_SIZE_N >= 64); fp8 block BLOCK_SIZE_K 64 and
# 128, BLOCK_SIZE_N at group_n (one weight scale per tile) and above it (a vector).
SGLANG_CONFIGS = {
    "bf16": "16/64/128/1/4/3,64/128/64/16/4/3,128/256/64/16/8/4",
    "fp16": "16/64/128/1/4/3,64/128/64/16/4/3,128/256/64/16/8/4",
    "fp8-tensor": "8/64/128/16/4/5,16/128/128/1/4/4,32/64/128/16/4/3,64/128/128/16/4/3,"
    "128/256/128/16/8/3",
    "fp8-channel": "8/64/128/16/4/5,16/64/128/1/4/4,32/128/128/16/4/3,64/128/128/16/4/3",
    "fp8-block": "8/64/128/16/4/5,16/128/128/16/4/3,32/128/64/16/4/3,16/256/128/1/4/3,"
    "64/128/64/16/4/3,64/128/128/16/4/3,128/128/128/16/8/3",
    "int8-channel": "16/64/128/1/4/4,64/128/128/16/4/3,128/256/128/16/8/3",
    "int8-w8a16": "16/64/128/1/4/4,64/128/64/16/4/3,128/256/64/16/8/4",
}
# (path, shape or None for the path's, gemm, tma, batch sizes, configs or None for the
# path's SGLANG_CONFIGS). M=1 and 256 launch with GDC_EARLY (A at most 512 rows), 4096
# without; qwen3-235b-tp8's down GEMM (K=192) and gpt-oss-120b's up GEMM (K=2880) with
# BLOCK_SIZE_K 128 have a K tail (even_Ks False).
SGLANG_SUITE = [
    *[(path, None, gemm, "", "1,256,4096", None) for path in PATHS for gemm in ("up", "down")],
    *[
        (path, None, gemm, "", "16,64,1024", configs)
        for path, configs in (
            ("bf16", "16/64/128/1/4/3,64/128/64/16/4/3"),
            ("fp8-block", "16/128/128/16/4/3,64/128/64/16/4/3"),
        )
        for gemm in ("up", "down")
    ],
    ("bf16", "qwen3-235b-tp8", "down", "", "16,256", "16/64/128/1/4/3,64/128/128/16/4/3"),
    ("fp16", "qwen3-235b-tp8", "down", "", "256", "64/128/128/16/4/3"),
    ("fp8-tensor", "qwen3-235b-tp8", "down", "", "256", "16/128/128/1/4/4,64/128/128/16/4/3"),
    ("fp8-channel", "qwen3-235b-tp8", "down", "", "256", "8/64/128/16/4/5,64/128/128/16/4/3"),
    ("fp8-block", "qwen3-235b-tp8", "down", "", "16,256", "16/128/128/16/4/3,64/128/128/16/4/3"),
    ("int8-channel", "qwen3-235b-tp8", "down", "", "256", "64/128/128/16/4/3"),
    ("int8-w8a16", "qwen3-235b-tp8", "down", "", "256", "64/128/128/16/4/3"),
    ("bf16", "gpt-oss-120b", "up", "", "256", "16/64/128/1/4/3,64/128/128/16/4/3"),
    *[
        (path, None, SGLANG_TMA[tma], tma, "256,4096", configs)
        for path, configs in (
            ("bf16", "64/128/64/16/4/3"),
            ("fp8-block", "16/128/128/16/4/3,64/128/128/16/4/3"),
        )
        for tma in SGLANG_TMA
    ],
]
# The negative controls, which must come out different: (label, path, gemm, M, configs).
# "vllm-twin": moetune's twin of vLLM 0.33's kernel, launched as moetune launches it,
# against SGLang's kernel. "mutant": the SGLang twin with one expression changed
# (`SGLANG_MUTATION`: B's load on even_Ks masked along K, as vLLM's kernel loads it).
# Configs SGLang's kernel compiles on Triton 3.6 and 3.9 alike (fp8 block swap_ab with
# BLOCK_SIZE_N above group_n).
SGLANG_CONTROLS = [
    ("vllm-twin", "fp8-block", "up", 256, "16/256/128/1/4/3,64/128/64/16/4/3,64/128/128/16/4/3"),
    ("vllm-twin", "bf16", "up", 256, "64/128/64/16/4/3"),
    ("mutant", "bf16", "up", 256, "64/128/64/16/4/3"),
    ("mutant", "fp8-block", "down", 256, "16/256/128/1/4/3,64/128/128/16/4/3"),
]
SGLANG_MUTATION = (
    "            b = tl.load(b_ptrs)\n",
    "            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k_start, other=0.0)\n",
)


def load_sglang0523_kernel(path: Path):
    """SGLang 0.5.23's ``fused_moe_kernel`` from its kernels file, or a one-line SystemExit."""
    from moetune.engines.source import load_jit_functions

    kernel = load_jit_functions(path, ("fused_moe_kernel",))["fused_moe_kernel"]
    if not {"c_sorted", "FUSE_SWIGLU", "GDC_EARLY"} <= set(kernel.arg_names):
        raise SystemExit(f"{path}: not SGLang 0.5.23's fused_moe_kernel")
    return kernel


def load_sglang_mutant():
    """The twin of SGLang's kernel with `SGLANG_MUTATION` applied, from a temporary file
    (Triton reads a kernel's source back from its file)."""
    import parity

    here = Path(__file__).resolve().parents[1] / "moetune" / "kernel"
    source = (here / "fused_moe_kernel_sglang.py").read_text()
    old, new = SGLANG_MUTATION
    assert source.count(old) == 1, "the mutation's expression is not in the twin"
    folder = Path(tempfile.mkdtemp(prefix="sglang_mutant_"))
    path = folder / "fused_moe_kernel_sglang_mutant.py"
    path.write_text(source.replace(old, new))
    return parity.load_module(path, "fused_moe_kernel_sglang_mutant").fused_moe_kernel


def sglang_launch(path: str, config: dict, *, down: bool, M: int, shape=None, tma=""):
    """(grid, args, kwargs) SGLang 0.5.23's launcher passes its kernel, on sm90."""
    from moetune.engines.launch import sglang_0_5_23
    from moetune.engines.launch.common import GemmCall

    launch = gemm_launch(path, config, down=down, M=M, shape=shape, aligned=True, tma=tma)
    capture = _Capture()
    sglang_0_5_23.launch(capture, GemmCall(**launch), capability=SM90)
    return capture.calls[0]


def compile_launch(fn, launch, sass_out: str = "") -> dict:
    """`analyse` of `fn` specialized from a captured launch; {"error": ...} when it does
    not compile. Also the launch's grid and runtime argument specializations."""
    grid, call_args, call_kwargs = launch
    sig, constexprs, attrs, options, runtime = launch_signature(fn, call_args, call_kwargs)
    try:
        result = analyse(fn, (sig, constexprs, attrs), options, sass_out=sass_out)
    except Exception as exc:  # noqa: BLE001 - a kernel that does not compile is a result
        message = str(exc).strip().splitlines()
        result = {"error": f"{type(exc).__name__}: {message[-1] if message else ''}"[:300]}
    return {**result, "_spec": (grid, runtime)}


def sglang_record(kernels: dict, launches: dict, case: dict, args) -> dict:
    """Compile each kernel from its launch; print and return the comparison."""
    text = case["config"]
    opcodes, errors, specs = {}, {}, {}
    kwargs = launches["sglang"][2]  # the notes are of SGLang's launch
    notes = {key: kwargs.get(key) for key in ("swap_ab", "even_Ks", "c_sorted", "GDC_EARLY")}
    record = dict(case, **notes, triton=None)
    for name, fn in kernels.items():
        sass_out = ""
        if args.sass_dir:
            Path(args.sass_dir).mkdir(parents=True, exist_ok=True)
            tag = "_".join(str(case[key]) for key in ("path", "gemm", "tma", "M") if case[key])
            sass_out = f"{args.sass_dir}/{tag}_{text.replace('/', '-')}_{name}.sass"
        result = compile_launch(fn, launches[name], sass_out)
        specs[name] = result.pop("_spec")
        if "error" in result:
            errors[name] = result["error"]
        else:
            opcodes[name] = result.pop("_opcodes")
            record.setdefault("kernels", {})[name] = result
        print(f"{text:>18} {name:>9}: {result}", flush=True)
    first, second = kernels
    record["errors"] = errors
    record["launch_alike"] = specs[first] == specs[second]
    if errors:
        record["identical"] = None
        verdict = "both fail to compile" if len(errors) == 2 else f"only {', '.join(errors)} fails"
    else:
        same = opcodes[first] == opcodes[second]
        record["identical"] = same and record["launch_alike"]
        record["instructions"] = [len(opcodes[first]), len(opcodes[second])]
        verdict = f"whole SASS identical: {same}"
        if not same:
            index = next(
                (i for i, (x, y) in enumerate(zip(*opcodes.values(), strict=False)) if x != y),
                min(map(len, opcodes.values())),
            )
            verdict += f" (first difference at instruction {index} of {record['instructions']})"
    print(f"{text:>18}  {notes}; launches alike: {record['launch_alike']}; {verdict}", flush=True)
    return record


def sglang_cases(args) -> list[tuple]:
    """(path, shape, gemm, tma, Ms, configs) to compare: the suite, or the command line's."""
    if args.suite:
        return SGLANG_SUITE
    if args.tma and SGLANG_TMA[args.tma] != ("down" if args.down else "up"):
        raise SystemExit(f"--tma {args.tma} is the {SGLANG_TMA[args.tma]} GEMM's")
    paths = list(PATHS) if args.path == "all" else [args.path]
    gemm = "down" if args.down else "up"
    return [(path, args.shape, gemm, args.tma, args.M, args.configs) for path in paths]


def main_sglang(args, triton) -> int:
    import json

    import moetune.kernel.fused_moe_kernel_sglang as sglang_twin

    reference = load_sglang0523_kernel(Path(args.sglang_ref))
    records = []
    if args.control:
        records = sglang_controls(reference, args, triton)
    else:
        kernels = {"twin": sglang_twin.fused_moe_kernel, "sglang": reference}
        for path, shape, gemm, tma, batch_sizes, configs in sglang_cases(args):
            for M in (int(m) for m in str(batch_sizes).split(",")):
                label = f"{shape or PATHS[path][0]}, {gemm} GEMM, tma {tma or '-'}, M={M}"
                print(f"Triton {triton.__version__}, sm_90a, {path}, {label}", flush=True)
                for text in (configs or SGLANG_CONFIGS[path]).split(","):
                    config = dict(zip(CONFIG_KEYS, map(int, text.split("/")), strict=True))
                    launch = sglang_launch(
                        path, config, down=gemm == "down", M=M, shape=shape, tma=tma
                    )
                    case = dict(
                        path=path, shape=shape or PATHS[path][0], gemm=gemm, tma=tma, M=M,
                        config=text,
                    )  # fmt: skip
                    launches = {"twin": launch, "sglang": launch}
                    records.append(sglang_record(kernels, launches, case, args))
    for record in records:
        record["triton"] = triton.__version__
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in records))
    return sglang_summary(records, control=args.control)


def sglang_controls(reference, args, triton) -> list[dict]:
    """`SGLANG_CONTROLS`: kernels that are not SGLang's, against SGLang's."""
    import moetune.kernel.fused_moe_kernel as vllm_twin

    records = []
    mutant = load_sglang_mutant()
    for control, path, gemm, M, configs in SGLANG_CONTROLS:
        down = gemm == "down"
        print(f"Triton {triton.__version__}, sm_90a, control {control}, {path}, {gemm}, M={M}")
        for text in configs.split(","):
            config = dict(zip(CONFIG_KEYS, map(int, text.split("/")), strict=True))
            launch = sglang_launch(path, config, down=down, M=M)
            if control == "vllm-twin":
                twin_launch = captured_launches(path, config, down=down, M=M)["moetune"]
                kernels = {"vllm-twin": vllm_twin.fused_moe_kernel, "sglang": reference}
                launches = {"vllm-twin": twin_launch, "sglang": launch}
            else:
                kernels = {"mutant": mutant, "sglang": reference}
                launches = {"mutant": launch, "sglang": launch}
            case = dict(
                control=control, path=path, shape=PATHS[path][0], gemm=gemm, tma="", M=M,
                config=text,
            )  # fmt: skip
            records.append(sglang_record(kernels, launches, case, args))
    return records


def sglang_summary(records: list[dict], *, control: bool) -> int:
    """Print the counts; exit status 0 when every comparison came out as it must."""
    identical = sum(r["identical"] is True for r in records)
    different = sum(r["identical"] is False for r in records)
    both = [r for r in records if len(r["errors"]) == 2]
    one = [r for r in records if len(r["errors"]) == 1]
    print(
        f"{len(records)} comparisons: {identical} identical, {different} different, "
        f"{len(both)} where neither kernel compiles, {len(one)} where one kernel alone fails"
    )
    for r in both:
        print(
            f"  neither compiles: {r['path']} {r['gemm']} M={r['M']} {r['config']}: {r['errors']}"
        )
    if control:
        print(f"negative controls all different: {different == len(records)}")
        return 0 if different == len(records) else 1
    print(f"all whole-SASS identical: {identical == len(records)}")
    return 0 if identical == len(records) else 1


def main_int4(args, parity, triton) -> int:
    here = Path(__file__).resolve().parents[1] / "moetune" / "kernel" / "fused_moe_wna16_kernel.py"
    kernels = {"moetune": parity.load_module(here, "moetune_wna16_here").fused_moe_wna16_kernel}
    if args.vllm_ref and Path(args.vllm_ref).exists():
        kernels["vllm"] = parity.load_vllm_kernel(Path(args.vllm_ref), "fused_moe_kernel_gptq_awq")
    gemm = "down" if args.down else "up"
    zp = ", zero points" if args.zp else ""
    print(
        f"Triton {triton.__version__}, sm_90a, int4 w4a16 group 128{zp}, {gemm} GEMM, M={args.int4}"
    )
    for text in args.configs.split(","):
        config = tuple(int(v) for v in text.split("/"))
        opcodes = {}
        for name, fn in kernels.items():
            sass_out = ""
            if args.sass_dir:
                Path(args.sass_dir).mkdir(parents=True, exist_ok=True)
                sass_out = f"{args.sass_dir}/{gemm}_{text.replace('/', '-')}_{name}.sass"
            signature = int4_signature(fn, config, down=args.down, M=args.int4, zp=args.zp)
            options = dict(num_warps=config[-2], num_stages=config[-1])
            result = analyse(fn, signature, options, int4=True, sass_out=sass_out)
            opcodes[name] = result.pop("_opcodes")
            print(f"{text:>18} {name:>8}: {result}", flush=True)
        if "vllm" in opcodes:
            same = opcodes["moetune"] == opcodes["vllm"]
            print(f"{text:>18}  moetune: whole SASS identical to vllm's: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
