"""stream_read_sum against torch.sum: every element read exactly once."""

import os

import pytest
import torch

from moetune.kernel.stream_read import StreamConfig, stream_read_sum

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("numel", [1, 1000, 4096, 3 * 4096 + 17])
def test_sum_matches_torch(numel, dtype):
    torch.manual_seed(numel)
    x = torch.rand(numel, device=DEVICE).to(dtype)
    got = stream_read_sum(x, StreamConfig(block=1024, num_warps=4), programs=3)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, x.float().sum(), rtol=1e-5, atol=1e-3)


def test_each_element_counted_once_with_more_programs_than_tiles():
    # Ones make a missed or doubled tile show up as an exact miscount.
    x = torch.ones(5 * 256 + 3, device=DEVICE)
    assert stream_read_sum(x, StreamConfig(block=256), programs=64).item() == x.numel()
    assert stream_read_sum(x, StreamConfig(block=256), programs=2).item() == x.numel()


def test_multi_dimensional_input_is_read_whole():
    x = torch.ones(3, 5, 7, device=DEVICE)
    assert stream_read_sum(x, StreamConfig(block=64), programs=2).item() == 105


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="contiguous"):
        stream_read_sum(torch.ones(8, 8, device=DEVICE).t())
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        stream_read_sum(torch.ones(8, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="power of two"):
        stream_read_sum(torch.ones(8, device=DEVICE), StreamConfig(block=100))
