"""The roofline floor of one fused-MoE call: the least time any kernel could take.

One formula, used by the kernel benchmark, the tuner's summary and the search
strategy's candidate ordering, so that every "fraction of roofline" in moetune
means the same thing:

    E_hit  = E * (1 - (1 - top_k / E) ** M)        expected distinct experts hit
                                                   under uniform routing
    bytes  = E_hit * (2N*K + K*N) * weight_bytes   every hit expert's w1 and w2, once
           + weight scales (fp8 / int8)
           + M*K*act_bytes + M*K*out_bytes         x read once, output written once
    flops  = 2 * M * top_k * (2N*K + K*N)          the two GEMMs
    floor  = max(bytes / bandwidth, flops / peak)

Intermediates (the gate/up output, the per-slot down output) are left out: a
perfect kernel would keep them on chip. `bandwidth` and `peak` are measured on
the machine in the same run (a device copy, a large bf16 matmul), not typed in.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes per weight element for each kernel dtype string (the engines' names).
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp8_w8a8": 1, "int8_w8a16": 1, "int8_w8a8": 1}
# Bytes per activation element entering the first GEMM.
ACT_BYTES = {"bf16": 2, "fp16": 2, "fp8_w8a8": 1, "int8_w8a16": 2, "int8_w8a8": 1}


def expected_experts_hit(num_tokens: int, num_experts: int, top_k: int) -> float:
    """Expected number of distinct experts that `num_tokens` tokens route to (uniform routing)."""
    if num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


@dataclass(frozen=True)
class Roofline:
    """Bytes and flops of one call, and the floor they give on a machine."""

    bytes: float
    flops: float

    def floor_seconds(self, bandwidth_bytes_per_s: float, peak_flops_per_s: float) -> float:
        return max(self.bytes / bandwidth_bytes_per_s, self.flops / peak_flops_per_s)

    def bound(self, bandwidth_bytes_per_s: float, peak_flops_per_s: float) -> str:
        """ "memory" or "compute": which term sets the floor."""
        memory = self.bytes / bandwidth_bytes_per_s
        return "memory" if memory >= self.flops / peak_flops_per_s else "compute"


def moe_roofline(
    num_tokens: int,
    num_experts: int,
    intermediate_size: int,
    hidden_size: int,
    top_k: int,
    dtype: str = "bf16",
    block_shape: tuple[int, int] | None = None,
) -> Roofline:
    """Roofline of a fused-MoE call: M tokens, w1 [E, 2N, K], w2 [E, K, N].

    `intermediate_size` is N (per rank, after SiLU-and-mul) and `hidden_size` K.
    """
    m, e, n, k = num_tokens, num_experts, intermediate_size, hidden_size
    if dtype not in WEIGHT_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(WEIGHT_BYTES)}")
    hit = expected_experts_hit(m, e, top_k)
    weight_elems = 2 * n * k + k * n
    weight_bytes = hit * weight_elems * WEIGHT_BYTES[dtype]
    if dtype in ("fp8_w8a8", "int8_w8a8", "int8_w8a16"):
        if block_shape is not None:
            bn, bk = block_shape
            scales = -(-2 * n // bn) * -(-k // bk) + -(-k // bn) * -(-n // bk)
        elif dtype == "int8_w8a16":
            scales = 2 * n + k  # per output channel
        else:
            scales = 2  # per tensor
        weight_bytes += hit * scales * 4
    act_bytes = m * k * ACT_BYTES[dtype] + m * k * 2
    flops = 2.0 * m * top_k * weight_elems
    return Roofline(bytes=weight_bytes + act_bytes, flops=flops)
