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


def analyse(fn, config, *, fp8: bool, down: bool, tma: bool) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, constexprs, attrs = signature(fn, config, fp8=fp8, down=down, tma=tma)
    compiled = triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=config[3], num_stages=config[4]),
    )
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        Path(src).write_text(ptx)
        ptxas = ptxas_path(ptx)
        run = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", src, "-o", cubin], capture_output=True, text=True
        )
        report = run.stdout + run.stderr
        cuobjdump = str(Path(ptxas).parent / "cuobjdump")
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
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
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spill_bytes": sum(map(int, spills.groups())) if spills else None,
        "loop_instructions": len(loop),
        "loop_top_ops": ops.most_common(5),
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
    args = parser.parse_args(argv)
    import parity
    import triton

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
            print(f"{text:>16} {name:>8}: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
