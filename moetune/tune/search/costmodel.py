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

int4 w4a16 (`moetune.kernel.fused_moe_wna16_kernel`, the engines'
``fused_moe_kernel_gptq_awq`` as it is) adds its dequantization, which bounds it:

    registers  += BLOCK_SIZE_K * BLOCK_SIZE_N * 2.5 / threads
                  (each element's code and scale are loaded into registers of their
                  own, then dequantized to bf16), so wide and deep tiles spill
    L1 time    = per SM, 2 sectors per dequantized element (its code byte and its
                 scale: the warp's 32 lanes read 32 different N rows, K // 2 bytes
                 apart, one byte each) at 4 sectors (128 B) per cycle
                 plus one exposed round trip (150 cycles) per K step
               = ceil(programs / SMs) * K steps * (BLOCK_SIZE_K * BLOCK_SIZE_N / 2 + 150) cycles
    time       = max(bytes / bandwidth, flops / MMA rate, L1 time) x spill + fill
                 (the ceil stands in for wave quantization)

Every program dequantizes its whole [depth, BLOCK_SIZE_N] weight slice, so the L1
work is (row blocks x out_features x depth): it grows with row blocks and is
independent of BLOCK_SIZE_N, which then matters only through registers and how
evenly the programs spread over the SMs. For int4 the row blocks are their
expectation under uniform routing (each expert's tokens binomial), not E_hit times
the mean tokens per expert rounded up, since its cost is proportional to them. Calibrated against the H200
measurements of Qwen3-30B-A3B int4 (BENCHMARKS.md, Quantized dtypes), where
the kernel runs at about 2 dequantized elements per SM cycle at every batch size.
int8 w8a16 runs `fused_moe_kernel` (int8 weights converted in registers, scaled per
channel after the K loop, loaded like bf16), so it has no such term.
The constants are an H100/H200-class GPU's; only ratios matter for ordering.
"""

from __future__ import annotations

import functools
import math

from moetune.device import DeviceLimits
from moetune.dtypes import DTYPES
from moetune.kernel.config import Candidate
from moetune.roofline import expected_experts_hit
from moetune.tune.problem import TuneProblem

HBM_BYTES_PER_S = 4.0e12
# By the dtype's `peak_kind`: int8 w8a8 runs int8 tensor-core dots (Hopper: the fp8 rate);
# weight-only dtypes (int8 w8a16, int4 w4a16) dequantize to bf16.
DENSE_FLOPS_PER_S = {"bf16": 750e12, "fp8": 1500e12, "int8": 1500e12}
MEMORY_LATENCY_S = 1.0e-6
MAX_WARPS_PER_SM = 64
REGISTERS_PER_SM = 65_536
MAX_REGISTERS_PER_THREAD = 255
# Registers per thread besides the accumulator (addresses, masks, loop state).
BASE_REGISTERS = 48
SM_CLOCK_HZ = 1.98e9
# int4 w4a16 dequantization (see the module docstring).
L1_SECTORS_PER_CYCLE = 4  # 128 bytes per SM cycle
DEQUANT_SECTORS_PER_ELEMENT = 2  # the code byte's sector and the scale's, per element
DEQUANT_REGISTERS_PER_ELEMENT = 2.5  # code (32-bit), scale (32-bit), bf16 result (half)
# Per K step a program waits for its gathered codes and scales before the dequantized
# tile can feed the dot: a round trip the SM does not hide (fitted: BLOCK_SIZE_K 256
# runs up to 10 % faster than 128 at small BLOCK_SIZE_M on the H200).
DEQUANT_STEP_CYCLES = 150


@functools.lru_cache(maxsize=4096)
def expected_row_blocks(batch_size: int, num_experts: int, top_k: int, block_m: int) -> float:
    """E[sum over experts of ceil(tokens_e / block_m)], tokens_e ~ Binomial(M, top_k / E)."""
    p = top_k / num_experts
    if p >= 1.0:
        return num_experts * math.ceil(batch_size / block_m)
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for x in range(1, batch_size + 1):
        log_pmf = (
            math.lgamma(batch_size + 1)
            - math.lgamma(x + 1)
            - math.lgamma(batch_size - x + 1)
            + x * log_p
            + (batch_size - x) * log_q
        )
        if log_pmf > -40.0:
            total += math.exp(log_pmf) * math.ceil(x / block_m)
    return num_experts * total


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
    dequant: bool = False,
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
    if dequant:
        registers += bk * bn * DEQUANT_REGISTERS_PER_ELEMENT / threads
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
    l1_seconds = 0.0
    if dequant:
        # Programs share their SM's L1; an SM runs ceil(programs / SMs) of them.
        sector_cycles = k_iters * bk * bn * DEQUANT_SECTORS_PER_ELEMENT / L1_SECTORS_PER_CYCLE
        sector_cycles += k_iters * DEQUANT_STEP_CYCLES
        l1_seconds = math.ceil(programs / limits.num_sms) * sector_cycles / SM_CLOCK_HZ
    steady = max(bytes_total / bandwidth, flops_total / mma_rate, l1_seconds) * spill
    steady *= quantization if l1_seconds == 0.0 else 1.0
    fill = waves * (
        MEMORY_LATENCY_S + k_iters * 2.0 * bm * bn * bk / (flops_per_s / limits.num_sms)
    )
    return steady + fill / per_sm


GEMMS = ("up", "down")


def predicted_seconds(
    problem: TuneProblem, batch_size: int, candidate: Candidate, limits: DeviceLimits
) -> float:
    """Modelled time of both GEMMs of one fused call (seconds)."""
    return sum(predicted_gemm_seconds(problem, batch_size, candidate, limits, g) for g in GEMMS)


def predicted_gemm_seconds(
    problem: TuneProblem,
    batch_size: int,
    candidate: Candidate,
    limits: DeviceLimits,
    gemm: str,
) -> float:
    """Modelled time of one GEMM of the call (seconds): ``"up"`` (gate/up) or ``"down"``."""
    if gemm not in GEMMS:
        raise ValueError(f"gemm must be one of {', '.join(GEMMS)}, got {gemm!r}")
    hit = max(expected_experts_hit(batch_size, problem.num_experts, problem.top_k), 1.0)
    tokens = batch_size * problem.top_k / hit
    spec = DTYPES[problem.dtype]
    dequant = spec.gptq_awq  # the dequantization term of the GPTQ/AWQ kernel (int4 w4a16)
    if dequant:
        row_blocks = expected_row_blocks(
            batch_size, problem.num_experts, problem.top_k, candidate.BLOCK_SIZE_M
        )
        tokens_per_block = batch_size * problem.top_k / row_blocks
    else:
        row_blocks = hit * math.ceil(tokens / candidate.BLOCK_SIZE_M)
        tokens_per_block = tokens / math.ceil(tokens / candidate.BLOCK_SIZE_M)
    flops = DENSE_FLOPS_PER_S[spec.peak_kind]
    a_bytes, w_bytes = spec.activation_bytes, spec.weight_bytes
    common = dict(
        row_blocks=row_blocks,
        tokens_per_block=tokens_per_block,
        c=candidate,
        flops_per_s=flops,
        limits=limits,
        a_bytes=a_bytes,
        w_bytes=w_bytes,
        dequant=dequant,
    )
    if gemm == "up":
        return _gemm_seconds(out_features=problem.w1_width, depth=problem.hidden_size, **common)
    return _gemm_seconds(
        out_features=problem.hidden_size, depth=problem.intermediate_size, **common
    )


def rank_candidates(
    problem: TuneProblem, batch_size: int, candidates: list[Candidate], limits: DeviceLimits
) -> list[Candidate]:
    """`candidates` from the model's fastest to slowest (ties keep grid order)."""
    return sorted(candidates, key=lambda c: predicted_seconds(problem, batch_size, c, limits))


def rank_for_gemm(
    problem: TuneProblem,
    batch_size: int,
    candidates: list[Candidate],
    limits: DeviceLimits,
    gemm: str,
) -> list[Candidate]:
    """`candidates` from the model's fastest to slowest for one GEMM timed alone."""
    return sorted(
        candidates, key=lambda c: predicted_gemm_seconds(problem, batch_size, c, limits, gemm)
    )
