"""moe_sum against x.float().sum(1)."""

import os
import re

import pytest
import torch

from moetune.kernel.reduce import moe_sum

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"

SHAPES = [
    (1, 1, 8),  # top_k = 1: a copy
    (3, 2, 100),  # K not a power of two
    (9, 8, 2048),  # K over one program's 1024 columns
    (2, 16, 37),  # top_k 16, odd K
]
if GPU:
    SHAPES += [(4096, 8, 2048), (4096, 16, 7168)]

TOLERANCE = {  # (atol, rtol): fp32 accumulation, one rounding to the output dtype
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("M,top_k,K", SHAPES, ids=lambda v: str(v))
def test_matches_reference(M, top_k, K, dtype):
    torch.manual_seed(M + top_k + K)
    x = torch.randn(M, top_k, K, device=DEVICE).to(dtype)
    out = moe_sum(x)
    assert out.dtype == dtype and out.shape == (M, K)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out, x.float().sum(1).to(dtype), atol=atol, rtol=rtol)


def test_writes_into_out_and_reads_strided_input():
    torch.manual_seed(4)
    big = torch.randn(4, 3, 50, device=DEVICE)
    x = big[:, :, :40]  # non-contiguous along K rows
    out = torch.full((4, 40), float("nan"), device=DEVICE)
    result = moe_sum(x, out=out)
    assert result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, x.sum(1))


def test_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"\[M, top_k, K\]"):
        moe_sum(torch.randn(4, 8, device=DEVICE))


@pytest.mark.parametrize(
    "out", [torch.empty(4, 39), torch.empty(40, 4).t()], ids=["shape", "column-stride"]
)
def test_rejects_an_out_of_the_wrong_shape_or_column_stride(out):
    expected = (
        f"out is expected to be [4, 40] with unit column stride rather than {tuple(out.shape)}"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        moe_sum(torch.randn(4, 3, 40, device=DEVICE), out=out.to(DEVICE))
