"""SiLU-and-mul between the two GEMMs: out = silu(x[:, :N]) * x[:, N:].

The first GEMM writes gate and up side by side in one row of width 2N (w1 is
[E, 2N, K], gate rows first, as in vLLM); this op halves it for the second GEMM.
Math in float32, output in the dtype of `x` (or of `out` when given).

| array | shape   | dtype        | meaning                              |
|-------|---------|--------------|--------------------------------------|
| `x`   | [T, 2N] | fp16/bf16/fp32 | gate (first N) and up (last N) per row, any row stride |
| `out` | [T, N]  | fp16/bf16/fp32 | silu(gate) * up                     |
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Columns per program; rows wider than this take several programs.
MAX_BLOCK_N = 1024


@triton.jit
def silu_and_mul_kernel(
    x_ptr,  # [T, 2N]
    out_ptr,  # [T, N]
    N,
    stride_xt,
    stride_ot,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_row = cols < N
    gate = tl.load(x_ptr + row * stride_xt + cols, mask=in_row, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_xt + N + cols, mask=in_row, other=0.0).to(tl.float32)
    # sigmoid from exp(-|gate|), which never overflows
    decay = tl.exp(-tl.abs(gate))
    sigmoid = tl.where(gate >= 0, 1.0, decay) / (1.0 + decay)
    result = gate * sigmoid * up
    tl.store(out_ptr + row * stride_ot + cols, result.to(out_ptr.dtype.element_ty), mask=in_row)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x[:, :N]) * x[:, N:] for x [T, 2N]; writes into `out` [T, N] when given."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"x is expected to be 2-D [T, 2N] rather than {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    num_rows, width = x.shape
    n = width // 2
    if out is None:
        out = torch.empty((num_rows, n), dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (num_rows, n) or out.stride(1) != 1:
        raise ValueError(
            f"out is expected to be [{num_rows}, {n}] with unit column stride "
            f"rather than {tuple(out.shape)} strides {out.stride()}"
        )
    if num_rows == 0 or n == 0:
        return out
    block_n = min(MAX_BLOCK_N, triton.next_power_of_2(n))
    silu_and_mul_kernel[(num_rows, triton.cdiv(n, block_n))](
        x, out, n, x.stride(0), out.stride(0), BLOCK_N=block_n, num_warps=4
    )
    return out
