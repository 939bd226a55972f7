"""Shared memory moetune's GEMM kernel needs on Hopper, per config, compiled offline (no GPU).

Triton compiles for an sm_90 target on any machine (its wheel ships ptxas), and
the compiled kernel's metadata says how many bytes of shared memory it needs.
This sweeps the default grid (GROUP_SIZE_M does not change the allocation) for
one dtype and writes ``{"BMxBNxBKxWARPSxSTAGES": bytes or null}`` (null: the
compiler failed), which `tests/tune/test_space.py` checks the pruning rule
against. Run it under each Triton version of interest:

    python bench/smem_probe.py --dtype bf16 --out tests/tune/data/sm90_shared_memory.json

Results are merged into OUT under the key ``"triton <version> <dtype>"``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

PROBLEM = {"N": 1536, "K": 2048, "top_k": 8}  # Qwen3-30B's gate/up GEMM; sizes do not change smem


def compile_shared_bytes(config: dict[str, int], dtype: str) -> int | None:
    """Bytes of shared memory of fused_moe_kernel compiled for sm_90 with `config`, or None."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from moetune.kernel.fused_moe_kernel import fused_moe_kernel

    quant = dtype.startswith("fp8")
    block = dtype == "fp8-block"
    constexprs = {
        "GROUP_N": 128 if block else 0,
        "GROUP_K": 128 if block else 0,
        "TOP_K": PROBLEM["top_k"],
        "COMPUTE_TYPE": tl.bfloat16,
        "USE_FP8_W8A8": quant,
        "EVEN_K": True,
        **config,
    }
    signature, values, aligned = {}, {}, []
    for index, param in enumerate(fused_moe_kernel.params):
        name = param.name
        if param.is_constexpr:
            signature[name], values[name] = "constexpr", constexprs.get(name, False)
        elif name in ("stride_ak", "stride_wk", "stride_cn"):  # contiguous: Triton specializes 1
            signature[name], values[name] = "constexpr", 1
        elif name.endswith("_ptr"):
            operand = "*fp8e4nv" if quant else "*bf16"
            signature[name] = {"a_ptr": operand, "w_ptr": operand, "c_ptr": "*bf16"}.get(
                name, "*i32" if "ids" in name or "num_tokens" in name else "*fp32"
            )
            aligned.append(index)
        else:
            signature[name] = "i32"
            if not name.startswith("stride_a") or name == "stride_am":
                aligned.append(index)
    source = triton.compiler.ASTSource(
        fn=fused_moe_kernel,
        signature=signature,
        constexprs=values,
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    try:
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    except Exception:  # noqa: BLE001 - a config the compiler rejects is data here
        return None
    return kernel.metadata.shared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("bf16", "fp8", "fp8-block"), default="bf16")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    from moetune.tune.api import DEFAULT_VALUES

    results = {}
    for bm, bn, bk, warps, stages in itertools.product(
        *(DEFAULT_VALUES[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")),
        DEFAULT_VALUES["num_warps"],
        DEFAULT_VALUES["num_stages"],
    ):
        if args.dtype == "fp8-block" and 128 % bk:
            continue
        config = dict(
            BLOCK_SIZE_M=bm,
            BLOCK_SIZE_N=bn,
            BLOCK_SIZE_K=bk,
            GROUP_SIZE_M=1,
            num_warps=warps,
            num_stages=stages,
        )
        results[f"{bm}x{bn}x{bk}x{warps}x{stages}"] = compile_shared_bytes(config, args.dtype)
        print(bm, bn, bk, warps, stages, results[f"{bm}x{bn}x{bk}x{warps}x{stages}"], flush=True)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data[f"triton {triton.__version__} {args.dtype}"] = results
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
