"""int4 w4a16 weights in the layout the engines' Triton MoE path reads (``moe_wna16``).

vLLM's ``MoeWNA16Method`` and SGLang's equivalent keep, per expert, for a weight
``[out, in]`` (w1: out = 2N, in = K; w2: out = K, in = N):

| tensor | shape | dtype | layout |
|---|---|---|---|
| ``qweight`` | ``[E, out, in // 2]`` | uint8 | two 4-bit values per byte along ``in``: element ``2j`` in the low nibble, ``2j + 1`` in the high one |
| ``scales`` | ``[E, out, in // group_size]`` | the activation dtype (bf16/fp16) | one scale per group of ``group_size`` input columns |
| ``qzeros`` (optional) | ``[E, out // 2, in // group_size]`` | uint8 | 4-bit zero points packed two per byte along ``out`` |

A weight is ``(q - z) * scale`` with ``z`` the group's zero point, or 8 when the
checkpoint has none (symmetric GPTQ). The engines pass ``block_shape=[0, group_size]``.
Here ``in`` must be even and ``out`` even when there are zero points; a ragged
last group (``in`` not a multiple of ``group_size``) is allowed (``cdiv`` groups),
the engines' checkpoints never have one.

Quantization (for tests and timing; real checkpoints come quantized):

- symmetric (GPTQ ``sym=True``): ``scale = 2 * max|w| / 15``, ``q = clamp(round(w / scale) + 8, 0, 15)``;
- with zero points (AWQ, GPTQ ``sym=False``): ``scale = (max - min) / 15``,
  ``z = clamp(round(-min / scale), 0, 15)``, ``q = clamp(round(w / scale) + z, 0, 15)``.

Scales are rounded to the activation dtype first, and ``q`` computed from the
rounded scale, so `dequantize_int4` of the stored tensors is the exact definition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton

from moetune.errors import MoetuneError

if TYPE_CHECKING:
    import torch

INT4_MAX_CODE = 15
INT4_SYMMETRIC_ZERO = 8
_EPS = 1e-10


def pack_int4(codes: torch.Tensor, dim: int) -> torch.Tensor:
    """uint8 codes in [0, 15] packed two per byte along `dim` (even index in the low nibble)."""
    import torch

    codes = codes.to(torch.uint8).movedim(dim, -1)
    if codes.shape[-1] % 2:
        raise MoetuneError(
            f"int4 packing needs an even size along dim {dim}, got {codes.shape[-1]}"
        )
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.movedim(-1, dim).contiguous()


def unpack_int4(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of `pack_int4`: uint8 codes, twice as long along `dim`."""
    import torch

    packed = packed.movedim(dim, -1)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
    return codes.movedim(-1, dim).contiguous()


def quantize_int4(
    w: torch.Tensor, group_size: int, *, zero_point: bool = False, scale_dtype=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Quantize ``[E, out, in]`` weights group-wise along ``in``.

    Returns ``(qweight uint8 [E, out, in // 2], scales [E, out, cdiv(in, group_size)],
    qzeros uint8 [E, out // 2, groups] or None)``; scales in `scale_dtype` (default bf16).
    """
    import torch

    if group_size < 2 or group_size % 2:
        raise MoetuneError(f"int4 group size must be an even number >= 2, got {group_size}")
    scale_dtype = scale_dtype or torch.bfloat16
    num_experts, rows, cols = w.shape
    if cols % 2:
        raise MoetuneError(f"int4_w4a16 needs an even input width, got {cols}")
    if zero_point and rows % 2:
        raise MoetuneError(f"int4 zero points pack two rows per byte: need an even {rows}")
    groups = triton.cdiv(cols, group_size)
    w = w.float()
    padded = torch.zeros(num_experts, rows, groups * group_size, device=w.device)
    padded[:, :, :cols] = w
    blocks = padded.view(num_experts, rows, groups, group_size)
    if zero_point:
        # The padding zeros of a ragged last group only widen its range to include 0.
        low = blocks.amin(dim=3).clamp(max=0.0)
        high = blocks.amax(dim=3).clamp(min=0.0)
        scale = ((high - low).clamp(min=_EPS) / INT4_MAX_CODE).to(scale_dtype)
        zero = torch.round(-low / scale.float()).clamp(0, INT4_MAX_CODE)
    else:
        scale = (2 * blocks.abs().amax(dim=3).clamp(min=_EPS) / INT4_MAX_CODE).to(scale_dtype)
        zero = torch.full_like(scale, INT4_SYMMETRIC_ZERO, dtype=torch.float32)
    codes = torch.round(blocks / scale.float()[..., None]) + zero[..., None]
    codes = codes.clamp(0, INT4_MAX_CODE).view(num_experts, rows, -1)[:, :, :cols]
    qweight = pack_int4(codes, dim=2)
    qzeros = pack_int4(zero, dim=1) if zero_point else None
    return qweight, scale, qzeros


def dequantize_int4(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    qzeros: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 ``[E, out, in]`` weights from `quantize_int4`'s layout."""
    codes = unpack_int4(qweight, dim=2).float()
    cols = codes.shape[2]
    scale = scales.float().repeat_interleave(group_size, dim=2)[:, :, :cols]
    if qzeros is None:
        return (codes - INT4_SYMMETRIC_ZERO) * scale
    zero = unpack_int4(qzeros, dim=1).float().repeat_interleave(group_size, dim=2)[:, :, :cols]
    return (codes - zero) * scale
