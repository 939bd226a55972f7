"""Alignment: group the token slots by expert, each expert's run padded to BLOCK_SIZE_M.

The fused GEMM walks `sorted_token_ids` one BLOCK_SIZE_M block at a time, and
every block belongs to one expert (`expert_ids[block]`). Semantics are vLLM's
`moe_align_block_size`, so a kernel config means the same thing in both:

| array                    | shape                   | dtype | meaning                                          |
|--------------------------|-------------------------|-------|--------------------------------------------------|
| `topk_ids`               | [M, top_k]              | int32 | expert of each slot; -1 or >= E: another rank's  |
| `sorted_token_ids`       | [max_padded]            | int32 | slot ids (token * top_k + k) grouped by expert;  |
|                          |                         |       | every other entry is the pad value M * top_k     |
| `expert_ids`             | [max_padded // BLOCK_M] | int32 | expert of each block; -1 past the last block     |
| `num_tokens_post_padded` | [1]                     | int32 | used length of `sorted_token_ids`                |

`max_padded` is a static upper bound so that nothing waits on the device:
`M*top_k + min(E, M*top_k) * (BLOCK_M - 1)` rounded up to a multiple of BLOCK_M
(only experts that received a slot are padded, and at most M*top_k of them can).
An engine that allocates more (SGLang keeps a bucket for other ranks' slots) passes
its own length; the GEMM's grid follows ``len(sorted_token_ids)``, so the engine's
length gives the engine's grid. `expert_ids` then has ``cdiv(max_padded, BLOCK_M)``
entries.
Experts appear in increasing id order; the order of slots inside one expert's
run is not fixed (atomics hand out positions, as in vLLM), which changes no
result: the GEMM computes every row on its own.

Two paths, both without host sync and CUDA-graph capturable:
- small (M*top_k <= SINGLE_PROGRAM_SLOTS): one program does it all (one launch);
- large: count per chunk (which also fills the pads), scan, scatter: 3 launches.
Counting is a `tl.histogram` per chunk; only the scatter uses atomics (relaxed, on
one cursor per expert). On an H200 it takes 2-6 us up to M = 64, 2-10 us at
M = 256 and 8-31 us at M = 4096 (BENCHMARKS.md, The kernel against the floor).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Up to this many slots one program aligns everything (M = 256 at top-k 8).
SINGLE_PROGRAM_SLOTS = 2048
# The single program's slot block is at least this wide, so few M values share one compile.
MIN_SINGLE_CHUNK = 256
# Slots per program in the large path's count and scatter launches.
CHUNK_SLOTS = 1024
# Chunk rows summed at once by the scan.
SCAN_ROWS = 8


def max_padded_slots(num_slots: int, block_size_m: int, num_experts: int) -> int:
    """Static length of `sorted_token_ids` for `num_slots` = M * top_k slots."""
    bound = num_slots + min(num_experts, num_slots) * (block_size_m - 1)
    return triton.cdiv(bound, block_size_m) * block_size_m


@triton.jit
def _fill_pads(
    sorted_ptr, expert_ids_ptr, pad_value, max_padded, start, step, BLOCK_SIZE_M: tl.constexpr
):
    """Pad value into every position, -1 into every block id; programs take turns by 1024."""
    offs = tl.arange(0, 1024)
    for base in range(start * 1024, max_padded, step * 1024):
        pos = base + offs
        tl.store(sorted_ptr + pos, pad_value, mask=pos < max_padded)
        block = pos // BLOCK_SIZE_M
        tl.store(expert_ids_ptr + block, -1, mask=(pos < max_padded) & (pos % BLOCK_SIZE_M == 0))


@triton.jit
def _count_experts(
    ids_ptr, first_slot, num_slots, num_experts, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr
):
    """Slots per expert among slots [first_slot, first_slot + CHUNK): a [BLOCK_E] histogram.

    Skipped slots (-1, >= E, past the end) land in the spare last bin (BLOCK_E > E),
    which is zeroed.
    """
    slots = first_slot + tl.arange(0, CHUNK)
    experts = tl.load(ids_ptr + slots, mask=slots < num_slots, other=-1)
    valid = (experts >= 0) & (experts < num_experts)
    counts = tl.histogram(tl.where(valid, experts, BLOCK_E - 1), BLOCK_E)
    return tl.where(tl.arange(0, BLOCK_E) < num_experts, counts, 0)


@triton.jit
def _expert_starts(counts, num_experts, BLOCK_SIZE_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """(first position of each expert's run, total padded length)."""
    offs_e = tl.arange(0, BLOCK_E)
    padded = tl.where(offs_e < num_experts, tl.cdiv(counts, BLOCK_SIZE_M) * BLOCK_SIZE_M, 0)
    ends = tl.cumsum(padded, axis=0)
    return ends - padded, tl.sum(padded, axis=0)


@triton.jit
def _scatter_slots(
    ids_ptr,
    first_slot,
    num_slots,
    num_experts,
    cursor_ptr,
    sorted_ptr,
    expert_ids_ptr,
    CHUNK: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
):
    """Give each valid slot the next free position of its expert's run.

    Runs start on block boundaries, and every block of a run holds a slot at its
    first position, so that slot writes the block's expert id.
    """
    slots = first_slot + tl.arange(0, CHUNK)
    experts = tl.load(ids_ptr + slots, mask=slots < num_slots, other=-1)
    valid = (experts >= 0) & (experts < num_experts)
    position = tl.atomic_add(cursor_ptr + experts, 1, mask=valid, sem="relaxed")
    tl.store(sorted_ptr + position, slots, mask=valid)
    first_of_block = valid & (position % BLOCK_SIZE_M == 0)
    tl.store(expert_ids_ptr + position // BLOCK_SIZE_M, experts, mask=first_of_block)


@triton.jit
def align_single_kernel(
    ids_ptr,  # [num_slots] int32 expert per slot
    sorted_ptr,  # [max_padded] int32 out
    expert_ids_ptr,  # [max_padded // BLOCK_SIZE_M] int32 out
    num_post_padded_ptr,  # [1] int32 out
    scratch_ptr,  # [BLOCK_E] int32 workspace: the experts' cursors
    num_slots,
    num_experts,
    max_padded,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK: tl.constexpr,
):
    _fill_pads(sorted_ptr, expert_ids_ptr, num_slots, max_padded, 0, 1, BLOCK_SIZE_M)
    counts = _count_experts(ids_ptr, 0, num_slots, num_experts, CHUNK, BLOCK_E)
    starts, total = _expert_starts(counts, num_experts, BLOCK_SIZE_M, BLOCK_E)
    tl.store(num_post_padded_ptr, total)
    tl.store(scratch_ptr + tl.arange(0, BLOCK_E), starts)
    # The cursors and the pad values are in place before any slot is scattered.
    tl.debug_barrier()
    _scatter_slots(
        ids_ptr,
        0,
        num_slots,
        num_experts,
        scratch_ptr,
        sorted_ptr,
        expert_ids_ptr,
        CHUNK,
        BLOCK_SIZE_M,
    )


@triton.jit
def align_count_kernel(
    ids_ptr,  # [num_slots] int32
    counts_ptr,  # [num_chunks, BLOCK_E] int32 out: slots per expert in each chunk
    sorted_ptr,  # [max_padded] int32 out: pad values
    expert_ids_ptr,  # [max_padded // BLOCK_SIZE_M] int32 out: -1
    num_slots,
    num_experts,
    max_padded,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK: tl.constexpr,
):
    chunk = tl.program_id(0)
    _fill_pads(
        sorted_ptr, expert_ids_ptr, num_slots, max_padded, chunk, tl.num_programs(0), BLOCK_SIZE_M
    )
    counts = _count_experts(ids_ptr, chunk * CHUNK, num_slots, num_experts, CHUNK, BLOCK_E)
    tl.store(counts_ptr + chunk.to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E), counts)


@triton.jit
def align_scan_kernel(
    counts_ptr,  # [num_chunks, BLOCK_E] int32
    cursor_ptr,  # [BLOCK_E] int32 out: first position of each expert's run
    num_post_padded_ptr,  # [1] int32 out
    num_chunks,
    num_experts,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    SCAN_ROWS: tl.constexpr,
):
    offs_e = tl.arange(0, BLOCK_E)
    offs_r = tl.arange(0, SCAN_ROWS)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for first_row in range(0, num_chunks, SCAN_ROWS):
        rows = first_row + offs_r
        tile = tl.load(
            counts_ptr + rows[:, None] * BLOCK_E + offs_e[None, :],
            mask=rows[:, None] < num_chunks,
            other=0,
        )
        counts += tl.sum(tile, axis=0)
    starts, total = _expert_starts(counts, num_experts, BLOCK_SIZE_M, BLOCK_E)
    tl.store(cursor_ptr + offs_e, starts)
    tl.store(num_post_padded_ptr, total)


@triton.jit
def align_scatter_kernel(
    ids_ptr,  # [num_slots] int32
    cursor_ptr,  # [BLOCK_E] int32: next free position per expert (advanced atomically)
    sorted_ptr,  # [max_padded] int32 out
    expert_ids_ptr,  # [max_padded // BLOCK_SIZE_M] int32 out
    num_slots,
    num_experts,
    BLOCK_SIZE_M: tl.constexpr,
    CHUNK: tl.constexpr,
):
    chunk = tl.program_id(0)
    _scatter_slots(
        ids_ptr,
        chunk * CHUNK,
        num_slots,
        num_experts,
        cursor_ptr,
        sorted_ptr,
        expert_ids_ptr,
        CHUNK,
        BLOCK_SIZE_M,
    )


def align_block_size(
    topk_ids: torch.Tensor, block_size_m: int, num_experts: int, max_padded: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the slots of `topk_ids` by expert and pad each expert's run to `block_size_m`.

    Args:
        topk_ids: [M, top_k] int32 expert ids; -1 or >= num_experts are skipped.
        block_size_m: the GEMM's BLOCK_SIZE_M (a power of two).
        num_experts: experts on this rank (E of w1 / w2).
        max_padded: the length of `sorted_token_ids` as an engine allocates it (at
            least the unrounded bound of the module docstring); None: `max_padded_slots`.

    Returns:
        (sorted_token_ids [max_padded], expert_ids [cdiv(max_padded, block_size_m)],
        num_tokens_post_padded [1]), all int32; see the module docstring.
    """
    if topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids is expected to be int32 rather than {topk_ids.dtype}")
    if block_size_m < 1 or block_size_m & (block_size_m - 1):
        raise ValueError(
            f"block_size_m is expected to be a power of two rather than {block_size_m}"
        )
    if num_experts < 1:
        raise ValueError(f"num_experts is expected to be >= 1 rather than {num_experts}")
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    num_slots = ids.numel()
    device = ids.device
    if max_padded is None:
        max_padded = max_padded_slots(num_slots, block_size_m, num_experts)
    elif max_padded < num_slots + min(num_experts, num_slots) * (block_size_m - 1):
        raise ValueError(
            f"max_padded {max_padded} is below the {num_slots} slots' padded bound at "
            f"block_size_m {block_size_m} and {num_experts} experts"
        )
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(
        triton.cdiv(max_padded, block_size_m), dtype=torch.int32, device=device
    )
    num_post_padded = torch.empty(1, dtype=torch.int32, device=device)
    if num_slots == 0:
        num_post_padded.zero_()
        return sorted_ids, expert_ids, num_post_padded

    block_e = triton.next_power_of_2(num_experts + 1)  # a spare bin for skipped slots
    if num_slots <= SINGLE_PROGRAM_SLOTS:
        scratch = torch.empty(block_e, dtype=torch.int32, device=device)
        align_single_kernel[(1,)](
            ids,
            sorted_ids,
            expert_ids,
            num_post_padded,
            scratch,
            num_slots,
            num_experts,
            max_padded,
            BLOCK_SIZE_M=block_size_m,
            BLOCK_E=block_e,
            CHUNK=max(MIN_SINGLE_CHUNK, triton.next_power_of_2(num_slots)),
            num_warps=8,
        )
        return sorted_ids, expert_ids, num_post_padded

    num_chunks = triton.cdiv(num_slots, CHUNK_SLOTS)
    counts = torch.empty((num_chunks, block_e), dtype=torch.int32, device=device)
    cursor = torch.empty(block_e, dtype=torch.int32, device=device)
    align_count_kernel[(num_chunks,)](
        ids,
        counts,
        sorted_ids,
        expert_ids,
        num_slots,
        num_experts,
        max_padded,
        BLOCK_SIZE_M=block_size_m,
        BLOCK_E=block_e,
        CHUNK=CHUNK_SLOTS,
        num_warps=4,
    )
    align_scan_kernel[(1,)](
        counts,
        cursor,
        num_post_padded,
        num_chunks,
        num_experts,
        BLOCK_SIZE_M=block_size_m,
        BLOCK_E=block_e,
        SCAN_ROWS=SCAN_ROWS,
        num_warps=8,
    )
    align_scatter_kernel[(num_chunks,)](
        ids,
        cursor,
        sorted_ids,
        expert_ids,
        num_slots,
        num_experts,
        BLOCK_SIZE_M=block_size_m,
        CHUNK=CHUNK_SLOTS,
        num_warps=4,
    )
    return sorted_ids, expert_ids, num_post_padded
