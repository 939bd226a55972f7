"""Measure the roofline's ceilings on this GPU: read bandwidth and matmul peaks.

- Read bandwidth: the best of a few configurations of the streaming-read kernel
  (`moetune/kernel/stream_read.py`) over a 2 GiB buffer; weights are only read,
  so this, not a copy, is what bounds a memory-bound MoE call. The floor uses the
  GPU's HBM spec (`moetune.roofline.HBM_SPEC_BYTES_PER_S`) when it is known, with
  the measured figure beside it, and the measured figure only for GPUs without a
  spec (`choose_bandwidth` says why). `bandwidth_source` says which.
- Peaks: an 8192^3 bf16 `torch.mm`; fp8 e4m3 `torch._scaled_mm` with per-tensor
  scales (GPUs with fp8 tensor cores); int8 `torch._int_mm`. Median of timed repeats
  after warm-up. A peak that cannot be measured is left out and
  `Ceilings.peak_for` says what it assumes instead.

torch and triton are imported inside the functions: only GPU workers call them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from moetune.roofline import Ceilings, hbm_spec

READ_BYTES = 2 << 30  # 2 GiB: far past any L2
MATMUL_SIZE = 8192


def median_event_ms(fn: Callable[[], Any], repeats: int = 10, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def stream_read_bandwidth(device: Any, nbytes: int = READ_BYTES) -> float:
    """Bytes/s read by the best of `MEASURE_CONFIGS` of the streaming-read kernel."""
    import torch

    from moetune.kernel.stream_read import MEASURE_CONFIGS, stream_read_sum

    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    best = 0.0
    for config in MEASURE_CONFIGS:
        total = stream_read_sum(x, config)
        if abs(total.item() - x.numel()) > 1e-6 * x.numel():  # a wrong sum: a wrong read
            raise RuntimeError(
                f"stream-read kernel {config} summed {total.item()}, not {x.numel()}"
            )
        ms = median_event_ms(lambda config=config: stream_read_sum(x, config))
        best = max(best, nbytes / (ms / 1e3))
    return best


def torch_sum_bandwidth(device: Any, nbytes: int = READ_BYTES) -> float:
    import torch

    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    return nbytes / (median_event_ms(lambda: x.sum()) / 1e3)


def copy_bandwidth(device: Any, nbytes: int = READ_BYTES) -> float:
    """Bytes/s read + written by a device-to-device copy (the floor's former bandwidth)."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / (median_event_ms(lambda: dst.copy_(src)) / 1e3)


def bf16_peak(device: Any, n: int = MATMUL_SIZE) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    return 2 * n**3 / (median_event_ms(lambda: torch.mm(a, b)) / 1e3)


def fp8_peak(device: Any, n: int = MATMUL_SIZE) -> float:
    import torch

    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as required
    scale = torch.ones((), dtype=torch.float32, device=device)

    def run() -> Any:
        return torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

    return 2 * n**3 / (median_event_ms(run) / 1e3)


def int8_peak(device: Any, n: int = MATMUL_SIZE) -> float:
    import torch

    a = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=device)
    b = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=device).t().contiguous().t()
    return 2 * n**3 / (median_event_ms(lambda: torch._int_mm(a, b)) / 1e3)


PEAKS = {"bf16": bf16_peak, "fp8": fp8_peak, "int8": int8_peak}


def choose_bandwidth(
    measured: float | None, spec: float | None, error: str = ""
) -> tuple[float, str]:
    """The read bandwidth the floor uses, and a phrase saying where it comes from.

    The GPU's HBM spec when it is known: it is the one number no kernel can beat.
    The stream-read kernel is then only reported beside it: on the H200 it reads
    3.96-4.23 TB/s, while whole fused-MoE calls were measured streaming their
    weights at up to 4.19 TB/s, so a floor on the measured figure came out above
    the measured time (a floor must never do that). Without a spec the measured
    figure stands in, and says so.
    """
    if spec is not None:
        if measured is not None:
            detail = f"stream-read kernel measured {measured / 1e12:.2f} TB/s"
        else:
            detail = f"stream-read kernel failed: {error}"
        return spec, f"HBM spec ({detail})"
    if measured is not None:
        return measured, "measured: stream-read kernel, 2 GiB (no HBM spec known for this GPU)"
    raise RuntimeError(
        f"read bandwidth: the stream-read kernel failed ({error}) and no spec is known"
    )


def measure_ceilings(device: Any = None) -> Ceilings:
    """Read bandwidth and the bf16 / fp8 / int8 matmul peaks of the current GPU."""
    import torch

    device = device or torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    measured, error = None, ""
    try:
        measured = stream_read_bandwidth(device)
    except Exception as exc:  # noqa: BLE001 - the spec stands in, and says so
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    torch.cuda.empty_cache()
    bandwidth, bandwidth_source = choose_bandwidth(measured, hbm_spec(name), error)
    peaks, sources = {}, {}
    for kind, measure in PEAKS.items():
        try:
            peaks[kind] = measure(device)
            sources[kind] = f"measured: {kind} matmul {MATMUL_SIZE}^3"
        except Exception:  # noqa: BLE001 - e.g. no fp8 tensor cores: peak_for assumes instead
            if kind == "bf16":
                raise
        torch.cuda.empty_cache()
    return Ceilings(bandwidth, bandwidth_source, peaks, sources)
