"""The output of the row-wise ops (`activation`, `reduce`): the caller's, checked, or a new one."""

from __future__ import annotations

import torch


def row_output(out: torch.Tensor | None, rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """`out` when it is ``[rows, cols]`` with unit column stride (else ValueError); when None,
    a new ``[rows, cols]`` tensor of `like`'s dtype and device."""
    if out is None:
        return torch.empty((rows, cols), dtype=like.dtype, device=like.device)
    if tuple(out.shape) != (rows, cols) or out.stride(1) != 1:
        raise ValueError(
            f"out is expected to be [{rows}, {cols}] with unit column stride "
            f"rather than {tuple(out.shape)} strides {out.stride()}"
        )
    return out
