"""Print the roofline ceilings measured on this GPU, each way, side by side (about 30 s).

    python bench/ceilings.py                # writes $OUT/ceilings.json (or ./ceilings.json)

- read bandwidth: moetune's stream-read kernel (each MEASURE_CONFIGS entry, and the
  best, which is what `moetune tune` uses), torch.sum, and a device copy (both its
  read + write rate, the floor's former bandwidth, and its read-only half);
- the HBM spec moetune knows for this GPU;
- matmul peaks: bf16 torch.mm, fp8 e4m3 torch._scaled_mm, int8 torch._int_mm, 8192^3;
- what `moetune.tune.measure.ceilings.measure_ceilings` returns (the floor of `moetune tune`).

Every figure is written to the JSON as soon as it exists, so a cut run keeps data.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from moetune.kernel.stream_read import MEASURE_CONFIGS, stream_read_sum  # noqa: E402
from moetune.roofline import hbm_spec  # noqa: E402
from moetune.tune.measure import ceilings as c  # noqa: E402

OUT = Path(os.environ.get("OUT") or ".") / "ceilings.json"
OUT.parent.mkdir(parents=True, exist_ok=True)
results: dict = {}


def record(key: str, value) -> None:
    results[key] = value
    OUT.write_text(json.dumps(results, indent=2))
    if isinstance(value, float):
        unit = "TB/s" if "bandwidth" in key or key.startswith("read") else "TFLOP/s"
        print(f"{key:40s} {value / 1e12:8.2f} {unit}", flush=True)
    else:
        print(f"{key:40s} {value}", flush=True)


def attempt(key: str, fn) -> None:
    try:
        record(key, fn())
    except Exception as exc:  # noqa: BLE001 - report and go on
        record(key, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    torch.cuda.empty_cache()


def main() -> None:
    started = time.perf_counter()
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    record("device", name)
    record("torch", torch.__version__)
    import triton

    record("triton", triton.__version__)
    spec = hbm_spec(name)
    if spec:
        record("hbm_spec_bandwidth", spec)

    x = torch.ones(c.READ_BYTES // 4, dtype=torch.float32, device=device)
    for config in MEASURE_CONFIGS:
        key = f"read_stream_kernel_b{config.block}_w{config.num_warps}_p{config.programs_per_sm}"

        def run(config=config, x=x) -> float:
            total = stream_read_sum(x, config).item()
            assert abs(total - x.numel()) <= 1e-6 * x.numel(), f"wrong sum {total}"
            ms = c.median_event_ms(lambda: stream_read_sum(x, config), repeats=20)  # noqa: B023
            return c.READ_BYTES / (ms / 1e3)

        attempt(key, run)
    x = None
    torch.cuda.empty_cache()
    attempt("read_stream_kernel_best", lambda: c.stream_read_bandwidth(device))
    attempt("read_torch_sum", lambda: c.torch_sum_bandwidth(device))
    attempt("copy_bandwidth_read_plus_write", lambda: c.copy_bandwidth(device))
    if isinstance(results.get("copy_bandwidth_read_plus_write"), float):
        record("copy_read_half", results["copy_bandwidth_read_plus_write"] / 2)
    attempt("peak_bf16", lambda: c.bf16_peak(device))
    attempt("peak_fp8_e4m3_scaled_mm", lambda: c.fp8_peak(device))
    attempt("peak_int8_int_mm", lambda: c.int8_peak(device))

    def floor_ceilings() -> str:
        ceilings = c.measure_ceilings(device)
        return json.dumps(
            {dtype: ceilings.to_json(dtype) for dtype in ("bf16", "fp8_w8a8", "int8_w8a8")}
        )

    attempt("moetune_measure_ceilings", floor_ceilings)
    record("wall_s", round(time.perf_counter() - started, 1))


if __name__ == "__main__":
    main()
