"""SiLU-and-mul between the two GEMMs: out = silu(x[:, :N]) * x[:, N:].

The first GEMM writes gate and up side by side in one row of width 2N (w1 is
[E, 2N, K], gate rows first, as in vLLM); this op halves it for the second GEMM.
Math in float32, output in the dtype of `x` (or of `out` when given).

| array | shape   | dtype        | meaning                              |
|-------|---------|--------------|--------------------------------------|
| `x`   | [T, 2N] | fp16/bf16/fp32 | gate (first N) and up (last N) per row, any row stride |
| `out` | [T, N]  | fp16/bf16/fp32 | silu(gate) * up                     |

`silu_and_mul_quant_fp8` fuses the block-fp8 path's next step: the result, rounded
to x's dtype exactly where the unfused path stores it, is quantized per token
group (`moetune.kernel.quant.per_token_group_quant_fp8`'s definition) in the same
pass, so the [T, N] intermediate is never written or read back:

| array   | shape                   | dtype   | meaning                                  |
|---------|-------------------------|---------|------------------------------------------|
| `q`     | [T, N]                  | fp8 e4m3 | silu(gate) * up / its group's scale     |
| `scale` | [T, cdiv(N, group_size)] | float32 | max abs of the group / 448 (>= eps / 448) |
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moetune.kernel.fused_moe_kernel import interpreting
from moetune.kernel.out_buffer import row_output
from moetune.kernel.quant import AMAX_EPS, FP8_MAX, _round_to_fp8_grid

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
    out = row_output(out, num_rows, n, x)
    if num_rows == 0 or n == 0:
        return out
    block_n = min(MAX_BLOCK_N, triton.next_power_of_2(n))
    silu_and_mul_kernel[(num_rows, triton.cdiv(n, block_n))](
        x, out, n, x.stride(0), out.stride(0), BLOCK_N=block_n, num_warps=4
    )
    return out


# Quantization groups per program of the fused kernel.
MAX_GROUPS_PER_PROGRAM = 8


@triton.jit
def silu_and_mul_quant_fp8_kernel(
    x_ptr,  # [T, 2N]
    q_ptr,  # [T, N] fp8 out
    scale_ptr,  # [T, cdiv(N, GROUP_SIZE)] float32 out
    N,
    num_groups,
    stride_xt,
    stride_qt,
    stride_st,
    GROUP_SIZE: tl.constexpr,
    GROUPS: tl.constexpr,
    FP8_MAX_VALUE: tl.constexpr,
    EPS: tl.constexpr,
    EMULATE_FP8_ROUNDING: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = groups[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]
    in_row = cols < N
    gate = tl.load(x_ptr + row * stride_xt + cols, mask=in_row, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_xt + N + cols, mask=in_row, other=0.0).to(tl.float32)
    decay = tl.exp(-tl.abs(gate))
    sigmoid = tl.where(gate >= 0, 1.0, decay) / (1.0 + decay)
    # Round to x's dtype, where the unfused path stores the intermediate.
    act = (gate * sigmoid * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(act), axis=1), EPS)
    scale = amax / FP8_MAX_VALUE
    q = tl.clamp(act / scale[:, None], -FP8_MAX_VALUE, FP8_MAX_VALUE)
    if EMULATE_FP8_ROUNDING:
        q = _round_to_fp8_grid(q)
    tl.store(q_ptr + row * stride_qt + cols, q.to(q_ptr.dtype.element_ty), mask=in_row)
    tl.store(scale_ptr + row * stride_st + groups, scale, mask=groups < num_groups)


def silu_and_mul_quant_fp8(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(x[:, :N]) * x[:, N:], quantized to fp8 per token group of `group_size` columns.

    Equal to ``per_token_group_quant_fp8(silu_and_mul(x), group_size)`` in one pass.
    Returns (fp8 [T, N], float32 scales [T, cdiv(N, group_size)]).
    """
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"x is expected to be 2-D [T, 2N] rather than {tuple(x.shape)}")
    if group_size < 1 or group_size & (group_size - 1):
        raise ValueError(f"group_size is expected to be a power of two rather than {group_size}")
    if x.stride(1) != 1:
        x = x.contiguous()
    num_rows, width = x.shape
    n = width // 2
    num_groups = triton.cdiv(n, group_size)
    q = torch.empty((num_rows, n), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((num_rows, num_groups), dtype=torch.float32, device=x.device)
    if num_rows == 0 or n == 0:
        return q, scale
    groups_per_program = min(MAX_GROUPS_PER_PROGRAM, triton.next_power_of_2(num_groups))
    silu_and_mul_quant_fp8_kernel[(num_rows, triton.cdiv(num_groups, groups_per_program))](
        x,
        q,
        scale,
        n,
        num_groups,
        x.stride(0),
        q.stride(0),
        scale.stride(0),
        GROUP_SIZE=group_size,
        GROUPS=groups_per_program,
        FP8_MAX_VALUE=FP8_MAX,
        EPS=AMAX_EPS,
        EMULATE_FP8_ROUNDING=interpreting(),
        num_warps=4,
    )
    return q, scale
