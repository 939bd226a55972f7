"""Checking a winning config against the PyTorch reference before it is written.

The tuner only ever writes configs that computed the right numbers: each
chosen config runs once more, on fresh random inputs, against
`naive_fused_moe` (float32), and is compared by relative RMS error (and NaN
never passes). A config that fails is dropped and the next best is checked.
The check itself runs inside a worker process (mode "verify"), so a config
that crashes here cannot take the tuner down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Relative RMS error allowed against the float32 reference. bf16 operands and a
# bf16 intermediate between the two GEMMs land near 3e-3 to 6e-3; fp16 lower;
# quantized paths carry the quantization of the activations (the reference
# emulates it, but rounding at the boundaries differs). Errors of a wrong
# config (a skipped tile, a wrong expert) are O(1), far above all of these.
# int4 w4a16: the reference dequantizes exactly as the kernel does, leaving bf16 noise
# (interpreter: <= 9e-3 on the test shapes), so the int8 w8a16 bound applies.
TOLERANCE = {
    "bf16": 2e-2,
    "fp16": 1e-2,
    "fp8_w8a8": 6e-2,
    "int8_w8a16": 3e-2,
    "int8_w8a8": 6e-2,
    "int4_w4a16": 3e-2,
}


@dataclass(frozen=True)
class Check:
    """The comparison of one output with the reference."""

    ok: bool
    rel_rms: float
    max_abs: float
    tolerance: float

    def describe(self) -> str:
        return (
            f"output differs from the PyTorch reference: relative RMS error {self.rel_rms:.3g} "
            f"(allowed {self.tolerance:g}), max abs diff {self.max_abs:.3g}"
        )


def compare(out: Any, ref: Any, dtype: str) -> Check:
    """Relative RMS error and max abs difference of `out` against `ref`; NaN fails."""
    out, ref = out.float(), ref.float()
    diff = out - ref
    ref_norm = ref.pow(2).mean().sqrt().item()
    rel_rms = diff.pow(2).mean().sqrt().item() / max(ref_norm, 1e-12)
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    tolerance = TOLERANCE[dtype]
    ok = math.isfinite(rel_rms) and math.isfinite(max_abs) and rel_rms <= tolerance
    return Check(ok, rel_rms, max_abs, tolerance)


def check_output(problem: Any, config: dict, dtype: str, *, corrupt: bool = False) -> Check:
    """Run `fused_moe(config=config)` and the reference on `problem` and compare them.

    `corrupt` adds an error to the output (the test-only ``wrong`` fault).
    """
    from moetune.kernel.fused_moe import fused_moe, gemm_compute_dtype
    from moetune.kernel.naive import naive_fused_moe

    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(*args, config=config, quant=problem.quant, gemm=problem.gemm)
    compute = gemm_compute_dtype(problem.x, problem.quant, problem.gemm)
    ref = naive_fused_moe(*args, quant=problem.quant, compute_dtype=compute)
    if corrupt:
        out = out + 1.0
    return compare(out, ref, dtype)
