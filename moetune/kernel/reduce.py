"""The sum over top-k after the second GEMM: out[m] = sum_k x[m, k].

The second GEMM has already applied each slot's routing weight, so this is a
plain sum, in float32, with the output in the dtype of `x` (or of `out`).

| array | shape          | dtype          | meaning                                  |
|-------|----------------|----------------|------------------------------------------|
| `x`   | [M, top_k, K]  | fp16/bf16/fp32 | weighted expert output of each slot      |
| `out` | [M, K]         | fp16/bf16/fp32 | the MoE layer's output per token         |
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moetune.kernel.out_buffer import row_output

# Columns per program; wider rows take several programs.
MAX_BLOCK_K = 1024


@triton.jit
def moe_sum_kernel(
    x_ptr,  # [M, TOP_K, K]
    out_ptr,  # [M, K]
    K,
    stride_xm,
    stride_xk,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    in_row = cols < K
    total = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        total += tl.load(x_ptr + row * stride_xm + k * stride_xk + cols, mask=in_row, other=0.0).to(
            tl.float32
        )
    tl.store(out_ptr + row * stride_om + cols, total.to(out_ptr.dtype.element_ty), mask=in_row)


def moe_sum(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Sum x [M, top_k, K] over top_k into `out` [M, K] (allocated when not given)."""
    if x.dim() != 3:
        raise ValueError(f"x is expected to be 3-D [M, top_k, K] rather than {tuple(x.shape)}")
    if x.stride(2) != 1:
        x = x.contiguous()
    num_tokens, top_k, k = x.shape
    out = row_output(out, num_tokens, k, x)
    if num_tokens == 0 or k == 0:
        return out
    block_k = min(MAX_BLOCK_K, triton.next_power_of_2(k))
    moe_sum_kernel[(num_tokens, triton.cdiv(k, block_k))](
        x,
        out,
        k,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        TOP_K=top_k,
        BLOCK_K=block_k,
        num_warps=4,
    )
    return out
