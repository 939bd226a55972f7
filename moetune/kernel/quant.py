"""Quantized weights and the activation quantizers the fused-MoE GEMMs consume.

Weights (`quantize_weights`, done once, plain PyTorch):

| dtype | block_shape | weight | scale (fp32) |
|---|---|---|---|
| ``fp8_w8a8`` | None | fp8 e4m3 ``[E, out, in]`` | ``[E]``: one per expert (per tensor) |
| ``fp8_w8a8`` | ``(bn, bk)`` | fp8 e4m3 ``[E, out, in]`` | ``[E, cdiv(out, bn), cdiv(in, bk)]`` |
| ``fp8_w8a8`` per channel | None | fp8 e4m3 ``[E, out, in]`` | ``[E, out]``: one per output channel |
| ``int8_w8a8`` (per channel) | None | int8 ``[E, out, in]`` | ``[E, out]``: one per output channel |
| ``int8_w8a16`` | None | int8 ``[E, out, in]`` | ``[E, out]``: one per output channel |
| ``int4_w4a16`` | group size | packed uint8 ``[E, out, in/2]`` | bf16 ``[E, out, in/group]`` (`moetune.kernel.quant_wna16`) |

Activations (w8a8 only; dynamic, computed from the data on every call, as vLLM
does when a checkpoint carries no static input scale):

- per tensor: ``scale = max|x| / 448``, ``q = fp8(x / scale)``; scale ``[1]``.
- per token group (block quantization): each row is cut into groups of ``bk``
  columns, each group gets ``scale = max|group| / 448``; scales ``[rows, cdiv(cols, bk)]``.
- per token (per-channel fp8, int8 w8a8): each row gets ``scale = max|row| / qmax``
  (448 for fp8, 127 for int8); int8 rounds half away from zero, as the engines'
  ``round`` does; scales ``[rows, 1]``.

Per-tensor quantization is plain PyTorch (a reduction and a cast). Per-token-group
has a plain-PyTorch definition (``per_token_group_quant_fp8_reference``, used by
`moetune.kernel.naive`) and a one-launch Triton kernel for the fused path. Zero rows get ``max|x|`` clamped to
``AMAX_EPS`` so no scale is ever 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from moetune.dtypes import DTYPES
from moetune.errors import MoetuneError
from moetune.kernel.fused_moe_kernel import interpreting

if TYPE_CHECKING:
    import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT8_MAX = 127.0
AMAX_EPS = 1e-10
GROUPS_PER_PROGRAM = 8  # quantization groups one program of the per-token-group kernel handles


@dataclass(frozen=True)
class MoEQuant:
    """How the expert weights are quantized: the engines' dtype string and the weight scales.

    ``w1_scale``/``w2_scale`` have the shapes in the module docstring for w1 ``[E, 2N, K]``
    and w2 ``[E, K, N]``. ``block_shape`` is ``(block_n, block_k)`` for block-quantized fp8.
    ``per_channel``: per-output-channel weight scales with dynamic per-token activation
    scales (fp8 w8a8; always so for int8 w8a8). ``group_size`` (int4 w4a16): input
    columns per weight scale, the engines' ``block_shape=[0, group_size]``;
    ``w1_zp``/``w2_zp`` its optional packed zero points.
    """

    dtype: str
    w1_scale: torch.Tensor
    w2_scale: torch.Tensor
    block_shape: tuple[int, int] | None = None
    per_channel: bool = False
    group_size: int | None = None
    w1_zp: torch.Tensor | None = None
    w2_zp: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_quant_args(self.dtype, self.block_shape, self.per_channel, self.group_size)
        if (self.w1_zp is None) != (self.w2_zp is None):
            raise MoetuneError("zero points must be given for both w1 and w2, or neither")
        if self.w1_zp is not None and not DTYPES[self.dtype].group_quant:
            raise MoetuneError(
                f"zero points apply to {', '.join(DTYPES.names('group_quant'))} only, "
                f"not {self.dtype}"
            )
        if self.block_shape is not None:
            object.__setattr__(self, "block_shape", tuple(self.block_shape))

    @property
    def has_zp(self) -> bool:
        return self.w1_zp is not None

    @property
    def pack_factor(self) -> int:
        """Weight elements per stored element along the input dimension (2 for int4)."""
        return DTYPES[self.dtype].pack_factor


def check_quant_args(
    dtype: str,
    block_shape: tuple[int, int] | None = None,
    per_channel: bool = False,
    group_size: int | None = None,
) -> None:
    """Raise `MoetuneError` unless the quantization options fit `dtype`."""
    spec = DTYPES.get(dtype)
    if spec is None or not spec.quantized:
        raise MoetuneError(
            f"unknown quantization {dtype!r}; expected one of {', '.join(DTYPES.quantized())}"
        )
    if block_shape is not None and not spec.block_quant:
        raise MoetuneError(
            "block-quantized weights are implemented for "
            f"{', '.join(DTYPES.names('block_quant'))} only, not {dtype}"
        )
    if per_channel and not spec.per_channel:
        raise MoetuneError(
            f"per-channel quantization applies to {', '.join(DTYPES.names('per_channel'))}, "
            f"not {dtype}"
        )
    if per_channel and block_shape is not None:
        raise MoetuneError("fp8 weights are either block-quantized or per-channel, not both")
    if spec.always_per_channel and not per_channel:
        raise MoetuneError(f"{dtype} is implemented per channel only (per_channel=True)")
    if (group_size is not None) != spec.group_quant:
        raise MoetuneError(
            f"a group size goes with {', '.join(DTYPES.names('group_quant'))} "
            "(and is required there); "
            f"got dtype {dtype} with group size {group_size}"
        )
    if group_size is not None and (
        isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2
    ):
        raise MoetuneError(f"group size must be an integer >= 2, got {group_size!r}")


def quantize_weights(
    w: torch.Tensor,
    dtype: str,
    block_shape: tuple[int, int] | None = None,
    *,
    per_channel: bool = False,
    group_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize expert weights ``[E, out, in]``; returns ``(quantized, scales)``.

    Scales are fp32, except int4's (bf16, as the engines store them; symmetric,
    no zero points: `moetune.kernel.quant_wna16.quantize_int4` makes those).
    """
    import torch

    spec = DTYPES.get(dtype)
    if block_shape is not None and spec is not None and spec.weight_only and not spec.group_quant:
        # Weight-only checkpoints may carry group scales; the kernel runs this one per channel.
        raise MoetuneError(f"{dtype} with block (group) scales is not implemented; use per-channel")
    check_quant_args(dtype, block_shape, per_channel, group_size)
    if spec.weight_bits == 4:
        from moetune.kernel.quant_wna16 import quantize_int4

        qweight, scale, _ = quantize_int4(w, group_size)
        return qweight, scale
    w = w.float()
    num_experts, rows, cols = w.shape
    if spec.integer:  # int8, one scale per output channel
        scale = w.abs().amax(dim=2).clamp(min=AMAX_EPS) / INT8_MAX
        quantized = torch.round(w / scale[:, :, None]).clamp(-INT8_MAX - 1, INT8_MAX).to(torch.int8)
        return quantized, scale
    if per_channel:
        scale = w.abs().amax(dim=2).clamp(min=AMAX_EPS) / FP8_MAX
        quantized = (w / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return quantized, scale
    if block_shape is None:
        scale = w.abs().amax(dim=(1, 2)).clamp(min=AMAX_EPS) / FP8_MAX
        quantized = (w / scale[:, None, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return quantized, scale
    bn, bk = block_shape
    row_blocks, col_blocks = triton.cdiv(rows, bn), triton.cdiv(cols, bk)
    padded = torch.zeros(
        num_experts, row_blocks * bn, col_blocks * bk, dtype=torch.float32, device=w.device
    )
    padded[:, :rows, :cols] = w
    blocks = padded.view(num_experts, row_blocks, bn, col_blocks, bk)
    scale = blocks.abs().amax(dim=(2, 4)).clamp(min=AMAX_EPS) / FP8_MAX
    quantized = (
        (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    )
    quantized = quantized.view(num_experts, row_blocks * bn, col_blocks * bk)[
        :, :rows, :cols
    ].contiguous()
    return quantized, scale


def dequantize_weights(
    quantized: torch.Tensor,
    scale: torch.Tensor,
    block_shape: tuple[int, int] | None = None,
    *,
    group_size: int | None = None,
    zero_points: torch.Tensor | None = None,
):
    """fp32 weights ``[E, out, in]`` from `quantize_weights`'s output (any of its layouts).

    int4 (packed uint8) needs `group_size` and, if it has them, `zero_points`.
    """
    if group_size is not None:
        from moetune.kernel.quant_wna16 import dequantize_int4

        return dequantize_int4(quantized, scale, group_size, zero_points)
    w = quantized.float()
    if block_shape is not None:
        bn, bk = block_shape
        expanded = scale.repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)
        return w * expanded[:, : w.shape[1], : w.shape[2]]
    if scale.dim() == 1:
        return w * scale[:, None, None]
    return w * scale[:, :, None]


def per_tensor_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor fp8 quantization: ``(fp8 x, fp32 scale [1])``. No host sync."""
    import torch

    scale = (x.abs().amax().float().clamp(min=AMAX_EPS) / FP8_MAX).reshape(1)
    quantized = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return quantized, scale


def per_token_group_quant_fp8_reference(
    x: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition of per-token-group fp8 quantization, in plain PyTorch (for checks)."""
    import torch

    rows, cols = x.shape
    groups = triton.cdiv(cols, group_size)
    padded = torch.zeros(rows, groups * group_size, dtype=torch.float32, device=x.device)
    padded[:, :cols] = x.float()
    padded = padded.view(rows, groups, group_size)
    scale = padded.abs().amax(dim=2).clamp(min=AMAX_EPS) / FP8_MAX
    quantized = (padded / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return quantized.view(rows, -1)[:, :cols].contiguous(), scale


@triton.jit
def _round_to_fp8_grid(v):
    """Round fp32 ``v`` (already within +-448) to the nearest e4m3 value, ties to even.

    Triton 3.9's interpreter casts fp32 to fp8 wrongly when rounding carries into
    the exponent (-125.3 becomes -64, not -128); a value already on the fp8 grid
    casts exactly. Normal range: round the fp32 mantissa to 3 bits in integer
    arithmetic. Subnormal range (below 2**-6, spacing 2**-9): the add-and-subtract
    trick rounds to an integer multiple of 2**-9 in fp32.
    """
    bits = v.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    subnormal = ((v * 512.0 + 12582912.0) - 12582912.0) / 512.0
    return tl.where(tl.abs(v) < 0.015625, subnormal, normal)


@triton.jit
def _per_token_group_quant_fp8_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    cols,
    groups,
    stride_xm,
    stride_qm,
    stride_sm,
    GROUP_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    GROUPS: tl.constexpr,
    FP8_MAX_VALUE: tl.constexpr,
    EPS: tl.constexpr,
    EMULATE_FP8_ROUNDING: tl.constexpr,
):
    # One program per row and GROUPS consecutive groups: a [GROUPS, BLOCK] tile,
    # one fp32 scale per tile row.
    row = tl.program_id(axis=0).to(tl.int64)
    group = tl.program_id(axis=1) * GROUPS + tl.arange(0, GROUPS)
    in_group = tl.arange(0, BLOCK) < GROUP_SIZE
    offs = group[:, None] * GROUP_SIZE + tl.arange(0, BLOCK)[None, :]
    mask = in_group[None, :] & (offs < cols)
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), EPS)
    scale = amax / FP8_MAX_VALUE
    q = tl.clamp(x / scale[:, None], -FP8_MAX_VALUE, FP8_MAX_VALUE)
    if EMULATE_FP8_ROUNDING:
        q = _round_to_fp8_grid(q)
    tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row * stride_sm + group, scale, mask=group < groups)


def per_token_group_quant_fp8(
    x: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group fp8 quantization of ``x [rows, cols]`` (last dim contiguous).

    Returns ``(fp8 [rows, cols], fp32 scales [rows, cdiv(cols, group_size)])``; one
    Triton launch, no host sync.
    """
    import torch

    assert x.dim() == 2 and x.stride(1) == 1, "x must be 2-D with contiguous rows"
    rows, cols = x.shape
    groups = triton.cdiv(cols, group_size)
    quantized = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, groups, dtype=torch.float32, device=x.device)
    if rows == 0:
        return quantized, scale
    groups_per_program = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(groups))
    grid = (rows, triton.cdiv(groups, groups_per_program))
    _per_token_group_quant_fp8_kernel[grid](
        x,
        quantized,
        scale,
        cols,
        groups,
        x.stride(0),
        quantized.stride(0),
        scale.stride(0),
        GROUP_SIZE=group_size,
        BLOCK=triton.next_power_of_2(group_size),
        GROUPS=groups_per_program,
        FP8_MAX_VALUE=FP8_MAX,
        EPS=AMAX_EPS,
        EMULATE_FP8_ROUNDING=interpreting(),
    )
    return quantized, scale


def per_token_quant_reference(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition of dynamic per-token quantization (``"fp8_w8a8"`` or ``"int8_w8a8"``).

    Returns ``(quantized [rows, cols], fp32 scales [rows, 1])``, plain PyTorch (for checks).
    """
    import torch

    to_int = DTYPES[dtype].integer
    qmax = INT8_MAX if to_int else FP8_MAX
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=AMAX_EPS) / qmax
    q = xf / scale
    if to_int:
        q = (torch.sign(q) * torch.floor(q.abs() + 0.5)).clamp(-qmax - 1, qmax)
        return q.to(torch.int8), scale
    return q.clamp(-qmax, qmax).to(torch.float8_e4m3fn), scale


@triton.jit
def _per_token_quant_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    cols,
    stride_xm,
    stride_qm,
    QMAX: tl.constexpr,
    TO_INT: tl.constexpr,
    BLOCK: tl.constexpr,
    EPS: tl.constexpr,
    EMULATE_FP8_ROUNDING: tl.constexpr,
):
    # One program per row: a pass for max|x|, a pass to quantize.
    row = tl.program_id(axis=0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0), EPS) / QMAX
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < cols, other=0.0).to(tl.float32)
        q = x / scale
        if TO_INT:
            # Round half away from zero (the engines' libdevice round); the cast truncates.
            q = tl.where(q >= 0, tl.floor(q + 0.5), tl.ceil(q - 0.5))
            q = tl.clamp(q, -QMAX - 1.0, QMAX)
        else:
            q = tl.clamp(q, -QMAX, QMAX)
            if EMULATE_FP8_ROUNDING:
                q = _round_to_fp8_grid(q)
        tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=offs < cols)
    tl.store(scale_ptr + row, scale)


def per_token_quant(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization of ``x [rows, cols]`` for ``"fp8_w8a8"`` or ``"int8_w8a8"``.

    Returns ``(fp8/int8 [rows, cols], fp32 scales [rows, 1])``; one Triton launch, no host sync.
    """
    import torch

    assert x.dim() == 2 and x.stride(1) == 1, "x must be 2-D with contiguous rows"
    per_token = DTYPES.names("per_channel")
    assert dtype in per_token, f"per-token quantization is for {per_token}"
    rows, cols = x.shape
    to_int = DTYPES[dtype].integer
    quantized = torch.empty(
        rows, cols, dtype=torch.int8 if to_int else torch.float8_e4m3fn, device=x.device
    )
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    if rows == 0:
        return quantized, scale
    _per_token_quant_kernel[(rows,)](
        x,
        quantized,
        scale,
        cols,
        x.stride(0),
        quantized.stride(0),
        QMAX=INT8_MAX if to_int else FP8_MAX,
        TO_INT=to_int,
        BLOCK=min(triton.next_power_of_2(cols), 1024),
        EPS=AMAX_EPS,
        EMULATE_FP8_ROUNDING=interpreting() and not to_int,
    )
    return quantized, scale
