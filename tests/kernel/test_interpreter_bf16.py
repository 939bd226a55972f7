"""The interpreter's bf16 corrections: rounding as torch rounds, and a bf16 kernel that the
unpatched interpreter gets wrong computed right."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from moetune.kernel.fused_moe_kernel import interpreting
from moetune.kernel.interpreter_bf16 import patch_interpreter_bf16, round_to_bf16_bits

pytestmark = pytest.mark.skipif(not interpreting(), reason="Triton's CPU interpreter only")


def test_rounding_matches_torch_round_to_nearest_even():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(4096, generator=generator) * torch.logspace(-30, 30, 4096)
    # Ties: the 16 bits dropped are exactly 0x8000 (even and odd kept mantissas both).
    ties = torch.tensor([0x3F808000, 0x3F818000, 0xBF808000], dtype=torch.int64).to(torch.int32)
    values = torch.cat([values, ties.view(torch.float32), torch.tensor([float("nan"), 0.0])])
    ours = round_to_bf16_bits(values.numpy())
    theirs = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(values.numpy())
    assert np.array_equal(ours[finite], theirs[finite])
    assert np.isnan(
        torch.from_numpy(ours.view(np.int16)).view(torch.bfloat16)[~finite].float()
    ).all()


@triton.jit
def _bf16_dot_kernel(a_ptr, b_ptr, q_ptr, c_ptr, d_ptr, N: tl.constexpr):
    rows = tl.arange(0, N)
    a = tl.load(a_ptr + rows[:, None] * N + rows[None, :])
    b = tl.load(b_ptr + rows[:, None] * N + rows[None, :])
    tl.store(c_ptr + rows[:, None] * N + rows[None, :], tl.dot(a, b).to(tl.bfloat16))
    q = tl.load(q_ptr + rows[:, None] * N + rows[None, :])
    tl.store(d_ptr + rows[:, None] * N + rows[None, :], q.to(tl.bfloat16))


def test_a_bf16_dot_and_an_int8_cast_are_computed_right():
    """The bf16 dot, the fp32 -> bf16 store and the int8 -> bf16 cast, as the GPU computes
    them (the accumulation in fp32, the result rounded once)."""
    patch_interpreter_bf16()
    n = 16
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(n, n, generator=generator).to(torch.bfloat16)
    b = torch.randn(n, n, generator=generator).to(torch.bfloat16)
    q = torch.randint(-128, 128, (n, n), generator=generator, dtype=torch.int8)
    c = torch.empty(n, n, dtype=torch.bfloat16)
    d = torch.empty(n, n, dtype=torch.bfloat16)
    _bf16_dot_kernel[(1,)](a, b, q, c, d, N=n)
    torch.testing.assert_close(c, (a.float() @ b.float()).to(torch.bfloat16), rtol=1e-2, atol=1e-2)
    assert torch.equal(d, q.to(torch.bfloat16))


def test_the_patch_is_applied_once():
    patch_interpreter_bf16()
    assert patch_interpreter_bf16() is False
