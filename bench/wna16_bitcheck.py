"""moetune's int4 kernel against f4d2565's copy (bench/parity_baseline/), bit for bit, on the
CPU interpreter: bf16 and fp16, with and without zero points, even and ragged K, group sizes
below and equal to BLOCK_SIZE_K, GEMM1 and GEMM2 forms, a slot of another rank. Prints each
differing case; exits 1 if any (about 45 s on one core).

    python bench/wna16_bitcheck.py
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))


def main() -> int:
    import parity
    import torch

    from moetune.kernel.align import align_block_size
    from moetune.kernel.fused_moe_wna16_kernel import invoke_fused_moe_wna16_gemm as new
    from moetune.kernel.quant_wna16 import quantize_int4

    old = parity.load_module(
        BENCH_DIR / "parity_baseline" / "fused_moe_wna16_kernel_f4d2565.py", "wna16_f4d2565"
    ).invoke_fused_moe_wna16_gemm
    M, E, top_k, N = 9, 5, 2, 40
    cases = itertools.product(
        (torch.bfloat16, torch.float16),
        (False, True),  # zero points
        (64, 72),  # K: even, ragged
        (32, 16),  # group size
        (False, True),  # GEMM2 form (routed weights, top_k 1)
        ((16, 32, 32, 1), (32, 16, 64, 2)),  # BM, BN, BK, GROUP_SIZE_M
    )
    differing = 0
    for n, (dtype, zp, K, group, gemm2, tile) in enumerate(cases):
        gen = torch.Generator().manual_seed(n)
        a = torch.randn(M * top_k if gemm2 else M, K, generator=gen).to(dtype)
        w = torch.randn(E, N, K, generator=gen) / K**0.5
        qweight, scale, qzeros = quantize_int4(w, group, zero_point=zp)
        ids = torch.rand(M, E, generator=gen).argsort(dim=-1)[:, :top_k].int()
        ids[2, 1] = -1  # a slot of another rank
        weights = torch.rand(M, top_k, generator=gen)
        config = dict(
            zip(
                ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M"), tile, strict=True
            ),
            num_warps=4,
            num_stages=2,
        )
        sorted_ids, expert_ids, num_post = align_block_size(ids, config["BLOCK_SIZE_M"], E)
        outs = []
        for launch in (old, new):
            c = torch.full((M * top_k, N), float("nan"), dtype=dtype)
            launch(
                a,
                qweight,
                c,
                w_scale=scale.to(dtype),
                w_zp=qzeros,
                group_size=group,
                topk_weights=weights,
                sorted_token_ids=sorted_ids,
                expert_ids=expert_ids,
                num_tokens_post_padded=num_post,
                mul_routed_weight=gemm2,
                top_k=1 if gemm2 else top_k,
                config=config,
            )
            outs.append(c.view(torch.int16))
        if not torch.equal(*outs):
            differing += 1
            print(f"differs: {dtype} zp={zp} K={K} group={group} gemm2={gemm2} tile={tile}")
    print(f"{n + 1} cases, {differing} differing")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
