"""The K loop of the fused-MoE GEMM kernels in SASS, compiled for sm_90 without a GPU.

Compiles moetune's kernel (this tree, and a044f6c's from bench/parity_baseline/) and,
with `--vllm-ref`, vLLM's ``fused_moe_kernel`` (see bench/parity.py) ahead of time for
an H100/H200 (sm_90a) with the installed Triton, assembles the PTX with Triton's bundled
ptxas and prints, per kernel and config: registers, spill bytes and the SASS
instructions of the main K loop (the basic block from the first instruction of the
loop to its backward branch), with its most common opcodes.

This is how the large-tile gap of ../shared/notes/fidelity-h200.md was located
without a GPU: at 128 x 256 x 64 (bf16, 8 warps) the a044f6c kernel's loop was 132
instructions (48 IMAD: 64-bit pointer advances and moves) against 106 in vLLM's.
To see the H200's code generation, put its Triton first on the path, e.g.
``pip install --target /tmp/t36 triton==3.6.0`` then ``PYTHONPATH=/tmp/t36``.

With ``--int4 M`` it compiles the int4 w4a16 kernels instead (moetune's
``fused_moe_wna16_kernel``, f4d2565's copy in bench/parity_baseline/ and, with
``--vllm-ref``, vLLM's ``fused_moe_kernel_gptq_awq``) at Qwen3-30B-A3B int4's shape
(E=128, N=768, K=2048, group 128; up GEMM top_k 8, ``--down`` top_k 1 with routed
weights), every argument specialized as the launchers pass it for batch size M, with
configs BM/BN/BK/GROUP_M/warps/stages; it adds the loop's memory instructions and
whether each kernel's whole SASS equals vLLM's. Results: bench/results/sass-int4-2026-12-01/.

    python bench/sass_loop.py --int4 256 --down --vllm-ref .vllm_ref/fused_moe_kernel_gptq_awq.py \
        --configs 64/32/128/16/4/3,16/32/256/16/4/4

    python bench/sass_loop.py --vllm-ref .vllm_ref/fused_moe_kernel_13cb3e44.py \\
        --configs 128/256/64/8/4,128/128/64/8/3 --down
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


def signature(fn, config: tuple[int, ...], *, fp8: bool, down: bool, tma: bool):
    """(signature, constexprs, attrs) of one specialization, as Triton's launcher builds them."""
    import triton.language as tl

    bm, bn, bk, _, _ = config
    element = "fp8e4nv" if fp8 else "bf16"
    group = 128 if fp8 else 0
    top_k = 1 if down else 8
    values = dict(
        GROUP_N=group, GROUP_K=group, group_n=group, group_k=group,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=16, SPLIT_K=1,
        MUL_ROUTED_WEIGHT=down, TOP_K=top_k, top_k=top_k,
        COMPUTE_TYPE=tl.bfloat16, compute_type=tl.bfloat16,
        USE_FP8_W8A8=fp8, use_fp8_w8a8=fp8, use_int8_w8a8=False, USE_INT8_W8A16=False,
        use_int8_w8a16=False, per_channel_quant=False, HAS_BIAS=False, EVEN_K=True,
        INTERPRETER_BF16=False, C_SORTED=tma and not down,
    )  # fmt: skip
    operands = {"a_ptr": element, "w_ptr": element, "b_ptr": element, "c_ptr": "bf16"}
    names = fn.arg_names
    sig, constexprs = {}, {}
    for name in names:
        index = (names.index(name),)
        if name.endswith("_ptr"):
            default = "i32" if ("ids" in name or "padded" in name) else "fp32"
            sig[name] = "*" + operands.get(name, default)
        elif name in ("a_desc", "w_desc"):
            if tma and (down or name == "w_desc"):
                box = [bm, bk] if name == "a_desc" else [1, bn, bk]
                sig[name] = f"tensordesc<{element}[{','.join(map(str, box))}]>"
            else:
                sig[name], constexprs[index] = "constexpr", None
        elif name in values:
            sig[name], constexprs[index] = "constexpr", values[name]
        elif name in ("stride_ak", "stride_wk", "stride_bk", "stride_cn"):
            sig[name], constexprs[index] = "constexpr", 1
        else:
            sig[name] = "i32"
    aligned = (
        "N",
        "K",
        "stride_am",
        "stride_we",
        "stride_wn",
        "stride_be",
        "stride_bn",
        "stride_cm",
    )
    attrs = {
        (names.index(n),): [["tt.divisibility", 16]]
        for n in names
        if n.endswith("_ptr") or n in aligned
    }
    return sig, constexprs, attrs


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


def analyse(
    fn,
    config,
    *,
    fp8: bool,
    down: bool,
    tma: bool,
    int4_m: int = 0,
    zp: bool = False,
    sass_out: str = "",
) -> dict:
    """Registers, spills and the K loop's SASS of one specialization (int4_m > 0: int4)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if int4_m:
        sig, constexprs, attrs = int4_signature(fn, config, down=down, M=int4_m, zp=zp)
    else:
        sig, constexprs, attrs = signature(fn, config, fp8=fp8, down=down, tma=tma)
    compiled = triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=config[-2], num_stages=config[-1]),
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
    mma = [i for i, line in enumerate(lines) if "GMMA" in line or "HMMA" in line]
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
        "loop_top_ops": ops.most_common(5 if not int4_m else 8),
        **({"loop_memory": dict(sorted(memory.items()))} if int4_m else {}),
        "_opcodes": [re.sub(r"^\s*/\*[0-9a-f]{4}\*/\s*", "", line).split(";")[0] for line in lines],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-ref", help="vLLM's fused_moe_kernel source (bench/parity.py)")
    parser.add_argument(
        "--configs", default="128/256/64/8/4,128/128/64/8/3", help="BM/BN/BK/warps/stages,..."
    )
    parser.add_argument("--fp8", action="store_true", help="block fp8 [128, 128] instead of bf16")
    parser.add_argument(
        "--down", action="store_true", help="the down GEMM (routed weight, top_k 1)"
    )
    parser.add_argument("--tma", action="store_true", help="moetune with SGLang's TMA operands")
    parser.add_argument(
        "--int4",
        type=int,
        default=0,
        metavar="M",
        help="the int4 w4a16 kernels (moetune's wna16, f4d2565's, vLLM's gptq_awq) at Qwen3-30B "
        "int4's shape for batch size M; --configs then BM/BN/BK/GROUP_M/warps/stages",
    )
    parser.add_argument("--zp", action="store_true", help="--int4 with zero points")
    parser.add_argument("--sass-dir", help="write each kernel's full SASS there")
    args = parser.parse_args(argv)
    import parity
    import triton

    if args.int4:
        return main_int4(args, parity, triton)

    kernels = {
        "moetune": parity.load_module(
            Path(__file__).resolve().parents[1] / "moetune" / "kernel" / "fused_moe_kernel.py",
            "moetune_kernel_here",
        ).fused_moe_kernel,
        "before": parity.load_module(parity.BASELINE, "moetune_kernel_a044f6c").fused_moe_kernel,
    }
    if args.vllm_ref and Path(args.vllm_ref).exists():
        kernels["vllm"] = parity.load_vllm_kernel(Path(args.vllm_ref))
    print(f"Triton {triton.__version__}, sm_90a, {'fp8 block' if args.fp8 else 'bf16'}, "
          f"{'down' if args.down else 'up'} GEMM{', TMA' if args.tma else ''}")  # fmt: skip
    for text in args.configs.split(","):
        config = tuple(int(v) for v in text.split("/"))
        for name, fn in kernels.items():
            tma = args.tma and name == "moetune"
            result = analyse(fn, config, fp8=args.fp8, down=args.down, tma=tma)
            result.pop("_opcodes")
            print(f"{text:>16} {name:>8}: {result}")
    return 0


def main_int4(args, parity, triton) -> int:
    here = Path(__file__).resolve().parents[1] / "moetune" / "kernel" / "fused_moe_wna16_kernel.py"
    kernels = {
        "moetune": parity.load_module(here, "moetune_wna16_here").fused_moe_wna16_kernel,
        "before": parity.load_module(
            BENCH_DIR / "parity_baseline" / "fused_moe_wna16_kernel_f4d2565.py",
            "moetune_wna16_f4d2565",
        ).fused_moe_wna16_kernel,
    }
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
            result = analyse(
                fn,
                config,
                fp8=False,
                down=args.down,
                tma=False,
                int4_m=args.int4,
                zp=args.zp,
                sass_out=sass_out,
            )
            opcodes[name] = result.pop("_opcodes")
            print(f"{text:>18} {name:>8}: {result}", flush=True)
        if "vllm" in opcodes:
            for name in ("moetune", "before"):
                same = opcodes[name] == opcodes["vllm"]
                print(f"{text:>18} {name:>8}: whole SASS identical to vllm's: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
