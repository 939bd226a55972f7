"""Streaming read: sum a large buffer, so every byte is read once and almost nothing written.

This is how moetune measures the memory bandwidth the roofline floor uses. The
fused-MoE weights are only ever read, so the ceiling that matters is the read
bandwidth, not a copy's (which also writes, and is slower per byte read).

Each program walks the buffer with a grid stride, loading `BLOCK` contiguous
elements at a time (wide vector loads, marked evict-first so they do not
displace L2; ``.cg`` is not used: ptxas on sm_90 refuses ``.cg`` together with
``.evict_first``), accumulates them in float32, and writes one partial sum; the
partials (a few thousand floats) are summed on the host side of the op.

| array      | shape         | dtype            | meaning                              |
|------------|---------------|------------------|--------------------------------------|
| `x`        | any, contiguous | fp32/bf16/fp16 | the buffer to stream                 |
| `partials` | [programs]    | fp32             | one partial sum per program          |
| result     | []            | fp32             | sum of every element of `x`          |
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class StreamConfig:
    """Elements per load, warps per program, and programs per streaming multiprocessor."""

    block: int = 8192
    num_warps: int = 8
    programs_per_sm: int = 4


# The configurations the bandwidth measurement tries; the best one is the ceiling.
MEASURE_CONFIGS = (
    StreamConfig(4096, 4, 8),
    StreamConfig(8192, 8, 4),
    StreamConfig(16384, 16, 2),
)


@triton.jit
def stream_read_kernel(
    x_ptr,
    partials_ptr,
    numel,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offsets = tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(pid * BLOCK, numel, programs * BLOCK):
        idx = start + offsets
        values = tl.load(
            x_ptr + idx,
            mask=idx < numel,
            other=0.0,
            eviction_policy="evict_first",
        )
        total += values.to(tl.float32)
    tl.store(partials_ptr + pid, tl.sum(total, axis=0))


def stream_read_sum(
    x: torch.Tensor, config: StreamConfig | None = None, programs: int | None = None
) -> torch.Tensor:
    """The float32 sum of every element of `x`, read by one streaming pass.

    `programs` defaults to `config.programs_per_sm` per SM on a GPU, 4 on the CPU.
    """
    config = config or StreamConfig()
    if not x.is_contiguous():
        raise ValueError("x is expected to be contiguous (a strided view would not stream)")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x is expected to be fp32, bf16 or fp16, not {x.dtype}")
    if config.block & (config.block - 1):
        raise ValueError(f"block must be a power of two, not {config.block}")
    numel = x.numel()
    if programs is None:
        if x.is_cuda:
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            programs = sms * config.programs_per_sm
        else:
            programs = 4
    programs = max(1, min(programs, triton.cdiv(max(numel, 1), config.block)))
    partials = torch.empty(programs, dtype=torch.float32, device=x.device)
    stream_read_kernel[(programs,)](
        x, partials, numel, BLOCK=config.block, num_warps=config.num_warps
    )
    return partials.sum()
