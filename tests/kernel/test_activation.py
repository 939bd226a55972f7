"""silu_and_mul against torch.nn.functional.silu(gate) * up."""

import os

import pytest
import torch

from moetune.kernel.activation import silu_and_mul, silu_and_mul_quant_fp8
from moetune.kernel.quant import per_token_group_quant_fp8_reference

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"

SHAPES = [
    (1, 8),  # one row
    (7, 100),  # odd rows, N not a power of two
    (16, 1536),  # N over one program's 1024 columns
]
if GPU:
    SHAPES += [(4096 * 8, 768), (4096 * 16, 3072)]

TOLERANCE = {  # (atol, rtol): fp32 math, one rounding to the output dtype
    torch.float32: (1e-6, 1e-5),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}


def reference(x):
    n = x.shape[1] // 2
    x32 = x.float()
    return (torch.nn.functional.silu(x32[:, :n]) * x32[:, n:]).to(x.dtype)


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("T,N", SHAPES, ids=lambda v: str(v))
def test_matches_reference(T, N, dtype):
    torch.manual_seed(T + N)
    x = (torch.randn(T, 2 * N, device=DEVICE) * 3).to(dtype)
    out = silu_and_mul(x)
    assert out.dtype == dtype and out.shape == (T, N)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out, reference(x), atol=atol, rtol=rtol)


def test_writes_into_out_and_reads_strided_rows():
    torch.manual_seed(3)
    wide = torch.randn(5, 300, device=DEVICE)
    x = wide[:, :200]  # row stride 300
    out = torch.full((5, 100), float("nan"), device=DEVICE)
    result = silu_and_mul(x, out=out)
    assert result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, reference(x))


def test_extreme_values_stay_finite():
    x = torch.tensor([[-1e4, 1e4, 0.0, 2.0, 3.0, 5.0]], device=DEVICE)
    out = silu_and_mul(x)
    torch.testing.assert_close(out, torch.tensor([[-0.0, 3e4, 0.0]], device=DEVICE))


def test_rejects_odd_width():
    with pytest.raises(ValueError, match=r"\[T, 2N\]"):
        silu_and_mul(torch.randn(2, 5, device=DEVICE))


def test_rejects_wrong_out_shape():
    with pytest.raises(ValueError, match="out is expected"):
        silu_and_mul(torch.randn(2, 8, device=DEVICE), out=torch.empty(2, 3, device=DEVICE))


QUANT_SHAPES = [
    (1, 128, 128),  # one group
    (5, 768, 128),  # 6 groups: one program per row, lanes masked
    (3, 200, 64),  # N not a multiple of the group: a partial last group
    (2, 3072, 128),  # 24 groups: several programs per row
]
if GPU:
    QUANT_SHAPES += [(4096 * 8, 768, 128), (4096 * 16, 3072, 128)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,N,group", QUANT_SHAPES, ids=lambda v: str(v))
def test_fused_quant_equals_silu_then_group_quant(T, N, group, dtype):
    torch.manual_seed(T + N)
    x = (torch.randn(T, 2 * N, device=DEVICE) * 3).to(dtype)
    x[0, :N] = 0.0  # a zero first row: the scale floor, no division by zero
    q, scale = silu_and_mul_quant_fp8(x, group)
    # The unfused path: this module's silu_and_mul, then the group quantization's definition.
    ref_q, ref_scale = per_token_group_quant_fp8_reference(silu_and_mul(x), group)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (T, N)
    assert scale.shape == (T, (N + group - 1) // group)
    torch.testing.assert_close(scale, ref_scale, atol=0, rtol=1e-6)
    # fp8 codes agree except where an fp32 rounding difference flips one step (rare).
    mismatch = (q.float() != ref_q.float()).float().mean().item()
    assert mismatch < 1e-3, f"{mismatch:.2%} of fp8 codes differ"
    # Against plain PyTorch: half an e4m3 step (2**-4 relative) plus the bf16/fp16 rounding
    # of the intermediate (<= 2**-8 relative), or the subnormal spacing (2**-9 of the scale).
    expanded = scale.repeat_interleave(group, dim=1)[:, :N]
    error = (q.float() * expanded - reference(x).float()).abs()
    bound = reference(x).float().abs() * (2**-4 + 2**-8) + expanded * 2**-9
    assert (error <= bound).all(), f"max error over bound {(error / bound).max():.3f}"


def test_fused_quant_rejects_bad_group():
    with pytest.raises(ValueError, match="power of two"):
        silu_and_mul_quant_fp8(torch.randn(2, 8, device=DEVICE), 96)
