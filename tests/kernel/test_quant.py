"""Weight quantization and the activation quantizers."""

import os

import pytest
import torch

from moetune.errors import MoetuneError
from moetune.kernel.quant import (
    FP8_MAX,
    MoEQuant,
    dequantize_weights,
    per_tensor_quant_fp8,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_reference,
    quantize_weights,
)

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"


@pytest.mark.parametrize(
    "dtype,block_shape,scale_shape,max_rel_err",
    [
        # fp8 e4m3 keeps 3 mantissa bits: at most half a step, 1/16 of the value, away.
        ("fp8_w8a8", None, (3,), 1 / 16),
        ("fp8_w8a8", (16, 32), (3, 3, 2), 1 / 16),  # 40 x 48: partial blocks on both axes
        ("int8_w8a16", None, (3, 40), None),
    ],
)
def test_weight_quantization_round_trips(dtype, block_shape, scale_shape, max_rel_err):
    w = torch.randn(3, 40, 48, device=DEVICE)
    quantized, scale = quantize_weights(w, dtype, block_shape)
    assert (
        quantized.shape == w.shape and scale.shape == scale_shape and scale.dtype == torch.float32
    )
    assert quantized.dtype == (torch.int8 if dtype == "int8_w8a16" else torch.float8_e4m3fn)
    back = dequantize_weights(quantized, scale, block_shape)
    if max_rel_err is None:  # int8: at most half a step of the row's scale
        assert ((back - w).abs() <= scale[:, :, None] / 2 + 1e-6).all()
    else:
        normal = w.abs() > 2**-6 * scale.max()  # away from fp8 subnormals
        assert ((back - w).abs()[normal] <= w.abs()[normal] * max_rel_err + 1e-6).all()
    # The largest element of every scale group lands on the format's maximum.
    assert quantized.float().abs().max() == (127 if dtype == "int8_w8a16" else FP8_MAX)


@pytest.mark.parametrize(
    "rows,cols,group", [(1, 128, 128), (7, 300, 128), (5, 64, 32), (3, 20, 16), (2, 2100, 128)]
)
def test_per_token_group_kernel_matches_the_definition(rows, cols, group):
    """The Triton kernel gives the reference's scales and (with rare one-step exceptions on
    the GPU, whose fp32 division may round differently) its fp8 values."""
    x = torch.randn(rows, cols, device=DEVICE).to(torch.bfloat16) * 3
    x[0, :group] = 0  # an all-zero group: scale clamped, values zero, no NaN
    q, scale = per_token_group_quant_fp8(x, group)
    q_ref, scale_ref = per_token_group_quant_fp8_reference(x, group)
    assert q.shape == (rows, cols) and scale.shape == (rows, -(-cols // group))
    assert torch.isfinite(scale).all() and (scale > 0).all()
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)
    differ = (q.float() != q_ref.float()).float().mean().item()
    assert differ <= (1e-3 if GPU else 0.0), f"{differ:.2%} of the fp8 values differ"
    assert (q[0, :group].float() == 0).all()


def test_per_tensor_quant_uses_the_whole_tensor_max():
    x = torch.tensor([[1.0, -8.0], [2.0, 4.0]], device=DEVICE)
    q, scale = per_tensor_quant_fp8(x)
    assert scale.shape == (1,) and scale.item() == pytest.approx(8.0 / FP8_MAX)
    assert q.float().abs().max().item() == FP8_MAX
    torch.testing.assert_close(q.float() * scale, x, rtol=1 / 16, atol=0)


def test_moe_quant_refuses_unknown_or_unsupported_combinations():
    scale = torch.ones(1)
    with pytest.raises(MoetuneError, match="unknown quantization"):
        MoEQuant("int2_w2a16", scale, scale)
    with pytest.raises(MoetuneError, match="fp8_w8a8 only"):
        MoEQuant("int8_w8a16", scale, scale, block_shape=(128, 128))
    with pytest.raises(MoetuneError, match="not implemented"):
        quantize_weights(torch.randn(1, 4, 4), "int8_w8a16", (2, 2))
    assert MoEQuant("fp8_w8a8", scale, scale, block_shape=[128, 128]).block_shape == (128, 128)
