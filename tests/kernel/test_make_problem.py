"""make_problem: shapes, dtypes, determinism and O(1) scales."""

import pytest
import torch

from moetune.errors import MoetuneError
from moetune.kernel.naive import naive_fused_moe
from moetune.kernel.problem import make_problem, with_tokens


@pytest.mark.parametrize(
    "dtype,block_shape,w_dtype,scale_shape",
    [
        ("bf16", None, torch.bfloat16, None),
        ("fp16", None, torch.float16, None),
        ("fp8_w8a8", None, torch.float8_e4m3fn, (4,)),
        ("fp8_w8a8", (128, 128), torch.float8_e4m3fn, (4, 2, 3)),
        ("int8_w8a16", None, torch.int8, (4, 160)),
    ],
)
def test_shapes_and_dtypes(dtype, block_shape, w_dtype, scale_shape):
    M, E, N, K, top_k = 3, 4, 80, 300, 2
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device="cpu")
    x_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    assert problem.x.shape == (M, K) and problem.x.dtype == x_dtype
    assert problem.router_logits.shape == (M, E)
    assert problem.w1.shape == (E, 2 * N, K) and problem.w2.shape == (E, K, N)
    assert problem.w1.dtype == problem.w2.dtype == w_dtype
    assert problem.top_k == top_k
    if scale_shape is None:
        assert problem.quant is None
    else:
        assert problem.quant.dtype == dtype and problem.quant.block_shape == block_shape
        assert problem.quant.w1_scale.shape == scale_shape


def test_same_seed_same_problem_other_seed_other_problem():
    a, b, c = (make_problem(2, 4, 16, 32, 2, "bf16", device="cpu", seed=s) for s in (0, 0, 1))
    assert torch.equal(a.w1, b.w1) and torch.equal(a.x, b.x)
    assert not torch.equal(a.w1, c.w1)


def test_with_tokens_keeps_the_weights_and_draws_tokens_per_count_and_seed():
    base = make_problem(1, 4, 16, 32, 2, "fp8_w8a8", (16, 16), device="cpu")
    five = with_tokens(base, 5)
    assert five.x.shape == (5, 32) and five.router_logits.shape == (5, 4)
    assert five.x.dtype == base.x.dtype and five.router_logits.dtype == base.router_logits.dtype
    assert five.w1 is base.w1 and five.w2 is base.w2 and five.quant is base.quant
    assert torch.equal(with_tokens(base, 5).x, five.x)  # the same count and seed: the same
    assert not torch.equal(with_tokens(base, 5, seed=1).x, five.x)
    assert not torch.equal(with_tokens(base, 6).x[:5], five.x)


@pytest.mark.parametrize("K,N", [(64, 32), (2048, 768)])
def test_outputs_are_order_one_at_any_size(K, N):
    """Weights scaled by 1/sqrt(fan-in) keep the layer output O(1), so rel. errors compare across shapes."""
    problem = make_problem(16, 8, N, K, 2, "bf16", device="cpu")
    out = naive_fused_moe(problem.x, problem.w1, problem.w2, problem.router_logits, 2)
    assert 0.05 < out.std().item() < 5


@pytest.mark.parametrize(
    "args,message",
    [
        ((1, 4, 8, 8, 2, "fp4"), "unknown dtype"),
        ((1, 4, 8, 8, 5, "bf16"), "top_k must be between 1 and E=4"),
        ((1, 4, 8, 8, 2, "bf16", (128, 128)), "block_shape applies to fp8_w8a8 only"),
    ],
)
def test_bad_arguments(args, message):
    with pytest.raises(MoetuneError, match=message):
        make_problem(*args, device="cpu")
