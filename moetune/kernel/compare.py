"""How far a kernel's output is from the reference, as numbers rather than a boolean.

``rel_rms = ||out - ref||_2 / ||ref||_2`` is the headline error (it does not blow up
on entries near zero the way an elementwise relative error does); ``max_abs``
catches a single wrong row that RMS would average away. A NaN or inf on either
side fails every check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Comparison:
    """Error of `out` against `ref`."""

    max_abs: float
    rel_rms: float
    finite: bool

    def within(self, rel_rms: float, max_abs: float | None = None) -> bool:
        return (
            self.finite and self.rel_rms <= rel_rms and (max_abs is None or self.max_abs <= max_abs)
        )

    def __str__(self) -> str:
        return f"max abs diff {self.max_abs:.3g}, rel. RMS error {self.rel_rms:.3g}, finite {self.finite}"


def compare(ref: torch.Tensor, out: torch.Tensor) -> Comparison:
    """Compare two tensors of the same shape in float64."""
    import torch

    assert ref.shape == out.shape, f"shapes differ: ref {list(ref.shape)}, out {list(out.shape)}"
    ref64, out64 = ref.double(), out.double()
    finite = bool(torch.isfinite(ref64).all() and torch.isfinite(out64).all())
    if ref64.numel() == 0:
        return Comparison(0.0, 0.0, finite)
    diff = (out64 - ref64).nan_to_num(nan=float("inf"))
    max_abs = diff.abs().max().item()
    ref_norm = ref64.norm().item()
    rel_rms = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
    return Comparison(max_abs, rel_rms, finite)


def assert_close(
    name: str, ref: torch.Tensor, out: torch.Tensor, rel_rms: float, max_abs: float | None = None
):
    """Fail with the measured errors unless `out` is within the tolerances of `ref`."""
    result = compare(ref, out)
    assert result.within(rel_rms, max_abs), (
        f"{name}: {result} (allowed rel. RMS {rel_rms}, max abs {max_abs})"
    )
    return result
