"""The roofline floor of one fused-MoE call: the least time any kernel could take.

One formula, used by the kernel benchmark, the tuner's summary and the search
strategy's candidate ordering, so that every "fraction of roofline" in moetune
means the same thing:

    E_hit  = E * (1 - (1 - top_k / E) ** M)        expected distinct experts hit
                                                   under uniform routing; with a
                                                   replayed routing dump, the experts
                                                   its timed windows hit
                                                   (`moetune.tune.measure.routing_load`)
    bytes  = E_hit * (2N*K + K*N) * weight_bytes   every hit expert's w1 and w2, once
           + weight scales (fp8 / int8)
           + M*K*act_bytes + M*K*out_bytes         x read once, output written once
    flops  = 2 * M * top_k * (2N*K + K*N)          the two GEMMs
    floor  = max(bytes / bandwidth, flops / peak)

Intermediates (the gate/up output, the per-slot down output) are left out: a
perfect kernel would keep them on chip. `bandwidth` and `peak` are measured on
the machine in the same run where they can be (`Ceilings`, from
`moetune.tune.measure.ceilings`):

- bandwidth: READ bandwidth, the GPU's HBM spec (`HBM_SPEC_BYTES_PER_S`): the weights
  are only read, and no kernel reads faster than the spec. A streaming-read kernel
  (`moetune/kernel/stream_read.py`, 2 GiB) is measured beside it; it read 3.96-4.23
  TB/s on an H200 while whole MoE calls streamed their weights at up to 4.19 TB/s, so
  a floor on it could exceed the measured time. Only for a GPU missing from the
  table does the measurement set the floor; `bandwidth_source` says which.
- peak: the dense matmul rate of the dtype the kernel computes in (`DtypeSpec.peak_kind`):
  bf16 for bf16, fp16, int8_w8a16 and int4_w4a16 (weights are dequantized to 16 bits);
  an fp8 e4m3 `torch._scaled_mm` for fp8_w8a8; `torch._int_mm` for int8_w8a8 (8192^3).

Bytes per weight, activation and scale are each dtype's (`moetune.dtypes.DTYPES`).
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.dtypes import DTYPES

# HBM bandwidth of the datasheets, bytes/s, by a substring of torch's device name; the
# fallback when the read bandwidth cannot be measured, and its cap when it can.
HBM_SPEC_BYTES_PER_S = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "H20": 4.0e12,
    "B200": 8.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
}


def peak_kind(dtype: str) -> str:
    """Which matmul rate bounds `dtype`'s compute ("bf16", "fp8", "int8"); bf16 if unknown."""
    spec = DTYPES.get(dtype)
    return spec.peak_kind if spec is not None else "bf16"


def hbm_spec(device_name: str) -> float | None:
    """The datasheet memory bandwidth of a GPU (bytes/s), or None when not in the table."""
    for key, value in HBM_SPEC_BYTES_PER_S.items():
        if key in device_name:
            return value
    return None


@dataclass(frozen=True)
class Ceilings:
    """The rates a roofline needs on one machine, and where each figure comes from.

    `peaks` maps a `DtypeSpec.peak_kind` ("bf16", "fp8", "int8") to dense matmul FLOP/s; a kind
    that could not be measured is absent, and `peak_for` then says what it assumed.
    """

    read_bandwidth_bytes_per_s: float
    bandwidth_source: str
    peaks: dict[str, float]
    peak_sources: dict[str, str]

    def peak_for(self, dtype: str) -> tuple[float, str]:
        """(FLOP/s, where it comes from) of the matmul that bounds `dtype`'s compute."""
        kind = peak_kind(dtype)
        if kind in self.peaks:
            return self.peaks[kind], self.peak_sources.get(kind, "measured")
        bf16 = self.peaks["bf16"]
        if kind == "bf16":
            return bf16, self.peak_sources.get("bf16", "measured")
        # 8-bit tensor cores run twice the 16-bit rate on every GPU that has them.
        return 2 * bf16, f"{kind} not measured: assumed 2x the bf16 peak"

    def floor_seconds(self, roof: Roofline, dtype: str) -> float:
        return roof.floor_seconds(self.read_bandwidth_bytes_per_s, self.peak_for(dtype)[0])

    def to_json(self, dtype: str) -> dict:
        """The keys a report prints: what the floor of `dtype` is made of."""
        peak, source = self.peak_for(dtype)
        return {
            "read_bandwidth_tb_s": round(self.read_bandwidth_bytes_per_s / 1e12, 3),
            "bandwidth_source": self.bandwidth_source,
            "peak_tflops": round(peak / 1e12, 1),
            "peak_source": source,
            "peaks_tflops": {kind: round(v / 1e12, 1) for kind, v in self.peaks.items()},
            # Raw rates, under the names earlier reports used.
            "bandwidth_bytes_per_s": self.read_bandwidth_bytes_per_s,
            "peak_flops_per_s": peak,
        }

    def describe(self, dtype: str) -> str:
        """One line for a summary: the floor's two ceilings and their sources."""
        peak, source = self.peak_for(dtype)
        return (
            f"floor = max(bytes / {self.read_bandwidth_bytes_per_s / 1e12:.2f} TB/s read "
            f"({self.bandwidth_source}), flops / {peak / 1e12:.0f} TFLOP/s ({source}))"
        )


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
    experts_hit: float | None = None,
    per_channel: bool = False,
) -> Roofline:
    """Roofline of a fused-MoE call: M tokens, w1 [E, 2N, K], w2 [E, K, N].

    `intermediate_size` is N (per rank, after SiLU-and-mul) and `hidden_size` K.
    `per_channel`: one fp32 weight scale per output channel (fp8/int8 w8a8), not
    one per tensor. `experts_hit` is the number of distinct experts whose weights the call reads;
    None: the expectation under uniform routing (`expected_experts_hit`). A skewed
    routing hits fewer experts at small M, so it reads fewer bytes.
    """
    m, e, n, k = num_tokens, num_experts, intermediate_size, hidden_size
    spec = DTYPES.get(dtype)
    if spec is None:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES.names())}")
    hit = expected_experts_hit(m, e, top_k) if experts_hit is None else experts_hit
    weight_elems = 2 * n * k + k * n
    weight_bytes = hit * weight_elems * spec.weight_bytes
    if spec.group_quant:
        # One scale per group along K: block_shape[1] when given, else the dtype's default.
        group = block_shape[1] if block_shape else spec.default_group_size
        scales = 2 * n * -(-k // group) + k * -(-n // group)
        weight_bytes += hit * scales * spec.scale_bytes
    elif spec.quantized:
        if block_shape is not None:
            bn, bk = block_shape
            scales = -(-2 * n // bn) * -(-k // bk) + -(-k // bn) * -(-n // bk)
        elif spec.weight_only or per_channel:
            scales = 2 * n + k  # per output channel (weight-only int8: always)
        else:
            scales = 2  # per tensor
        weight_bytes += hit * scales * spec.scale_bytes
    act_bytes = m * k * spec.activation_bytes + m * k * 2
    flops = 2.0 * m * top_k * weight_elems
    return Roofline(bytes=weight_bytes + act_bytes, flops=flops)
