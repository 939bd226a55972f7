"""A rough analytic model of the fused-MoE kernel's time, used only to order candidates.

Fast search times the candidates this model likes first; it never trusts the
model for the final choice (every winner is measured). The model is a
roofline per program with occupancy and wave quantization, for each of the
two GEMMs the config runs (gate/up: 2N outputs over K; down: K outputs over N):

    programs   = row blocks (E_hit * ceil(tokens per expert / BLOCK_SIZE_M)) x column blocks
    occupancy  = programs per SM allowed by shared memory, warps and registers
    bandwidth  = min(HBM, bytes in flight / memory latency)   (Little's law, per wave)
    time       = max(bytes / bandwidth, padded flops / MMA rate) x wave quantization
                 + one pipeline fill per program wave

It knows Hopper's two MMA paths (wgmma for BLOCK_SIZE_M >= 64, mma.sync below at
about half the rate) and that a tile too large for the register file spills.
The constants are an H100/H200-class GPU's; only ratios matter for ordering.
"""

from __future__ import annotations

import math

from moetune.roofline import ACT_BYTES, WEIGHT_BYTES, expected_experts_hit
from moetune.tune.problem import TuneProblem
from moetune.tune.space import Candidate, DeviceLimits

HBM_BYTES_PER_S = 4.0e12
# int8 w8a8 runs int8 tensor-core dots (Hopper: the fp8 rate); int4 w4a16 dequantizes to bf16.
DENSE_FLOPS_PER_S = {
    "bf16": 750e12,
    "fp16": 750e12,
    "fp8_w8a8": 1500e12,
    "int8_w8a16": 750e12,
    "int8_w8a8": 1500e12,
    "int4_w4a16": 750e12,
}
MEMORY_LATENCY_S = 1.0e-6
MAX_WARPS_PER_SM = 64
REGISTERS_PER_SM = 65_536
MAX_REGISTERS_PER_THREAD = 255
# Registers per thread besides the accumulator (addresses, masks, loop state).
BASE_REGISTERS = 48


def _gemm_seconds(
    *,
    row_blocks: float,
    tokens_per_block: float,
    out_features: int,
    depth: int,
    a_bytes: int,
    w_bytes: int,
    c: Candidate,
    flops_per_s: float,
    limits: DeviceLimits,
) -> float:
    bm, bn, bk = c.BLOCK_SIZE_M, c.BLOCK_SIZE_N, c.BLOCK_SIZE_K
    col_blocks = math.ceil(out_features / bn)
    programs = max(row_blocks * col_blocks, 1.0)
    k_iters = math.ceil(depth / bk)

    buffers = c.num_stages if bm >= 64 else max(c.num_stages - 1, 1)
    stage_bytes = bm * bk * a_bytes + bk * bn * w_bytes
    smem = buffers * stage_bytes
    threads = 32 * c.num_warps
    registers = BASE_REGISTERS + bm * bn / threads + stage_bytes / 4 / threads
    spill = max(1.0, registers / MAX_REGISTERS_PER_THREAD) ** 2
    per_sm = min(
        (limits.shared_memory_per_block + 1024) // max(smem, 1),
        MAX_WARPS_PER_SM // c.num_warps,
        REGISTERS_PER_SM // (threads * min(registers, MAX_REGISTERS_PER_THREAD)),
    )
    per_sm = max(int(per_sm), 1)
    slots = limits.num_sms * per_sm
    waves = math.ceil(programs / slots)
    resident = min(programs, slots)

    useful_rows = min(tokens_per_block, bm)
    bytes_total = programs * (useful_rows * depth * a_bytes + depth * bn * w_bytes)
    in_flight = resident * max(c.num_stages - 1, 1) * stage_bytes
    bandwidth = min(HBM_BYTES_PER_S, in_flight / MEMORY_LATENCY_S)
    mma_rate = flops_per_s * (1.0 if bm >= 64 else 0.5) * min(1.0, resident / limits.num_sms)
    flops_total = programs * 2.0 * bm * bn * depth
    quantization = waves * slots / programs if programs > slots else 1.0
    steady = max(bytes_total / bandwidth, flops_total / mma_rate) * quantization * spill
    fill = waves * (
        MEMORY_LATENCY_S + k_iters * 2.0 * bm * bn * bk / (flops_per_s / limits.num_sms)
    )
    return steady + fill / per_sm


def predicted_seconds(
    problem: TuneProblem, batch_size: int, candidate: Candidate, limits: DeviceLimits
) -> float:
    """Modelled time of both GEMMs of one fused call (seconds)."""
    hit = max(expected_experts_hit(batch_size, problem.num_experts, problem.top_k), 1.0)
    tokens = batch_size * problem.top_k / hit
    row_blocks = hit * math.ceil(tokens / candidate.BLOCK_SIZE_M)
    tokens_per_block = tokens / math.ceil(tokens / candidate.BLOCK_SIZE_M)
    flops = DENSE_FLOPS_PER_S[problem.dtype]
    a_bytes, w_bytes = ACT_BYTES[problem.dtype], WEIGHT_BYTES[problem.dtype]
    common = dict(
        row_blocks=row_blocks,
        tokens_per_block=tokens_per_block,
        c=candidate,
        flops_per_s=flops,
        limits=limits,
        a_bytes=a_bytes,
        w_bytes=w_bytes,
    )
    gate_up = _gemm_seconds(out_features=problem.w1_width, depth=problem.hidden_size, **common)
    down = _gemm_seconds(
        out_features=problem.hidden_size, depth=problem.intermediate_size, **common
    )
    return gate_up + down


def rank_candidates(
    problem: TuneProblem, batch_size: int, candidates: list[Candidate], limits: DeviceLimits
) -> list[Candidate]:
    """`candidates` from the model's fastest to slowest (ties keep grid order)."""
    return sorted(candidates, key=lambda c: predicted_seconds(problem, batch_size, c, limits))
