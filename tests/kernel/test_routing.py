"""topk_routing against softmax + torch.topk; invariants tested apart from numerics."""

import os

import pytest
import torch

from moetune.kernel.routing import topk_routing

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"

SHAPES = [
    # (M, E, top_k)
    (1, 8, 2),  # decode, Mixtral-like
    (7, 13, 3),  # odd M, prime E
    (5, 6, 6),  # top_k = E: every expert chosen
    (4, 5, 1),  # top_k = 1
    (33, 128, 8),  # Qwen3-like, E a power of two
    (3, 112, 16),  # Kimi-like top_k 16, E not a power of two
]
if GPU:
    SHAPES += [(4096, 256, 8), (4096, 896, 16), (1, 896, 16)]


def reference(logits, top_k, renormalize):
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("M,E,top_k", SHAPES, ids=lambda v: str(v))
def test_matches_softmax_topk(M, E, top_k, renormalize, dtype):
    torch.manual_seed(M * 1000 + E)
    # The top_k logits of a row are 4 + j/4 (exact in every dtype, distinct), at random
    # positions; the rest lie below 3.5: the top-k and its order are unambiguous.
    logits = (torch.rand(M, E, device=DEVICE) * 7 - 3.5).to(dtype)
    chosen = torch.rand(M, E, device=DEVICE).argsort(dim=-1)[:, :top_k]
    top = 4 + 0.25 * torch.arange(top_k, device=DEVICE, dtype=torch.float32).expand(M, top_k)
    logits.scatter_(1, chosen, top.to(dtype))
    weights, ids = topk_routing(logits, top_k, renormalize)
    ref_weights, ref_ids = reference(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert weights.shape == ids.shape == (M, top_k)
    assert torch.equal(ids.long(), ref_ids), "expert ids differ from torch.topk"
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("M,E,top_k", SHAPES, ids=lambda v: str(v))
def test_invariants(M, E, top_k):
    torch.manual_seed(1)
    logits = torch.randn(M, E, device=DEVICE) * 3
    weights, ids = topk_routing(logits, top_k, renormalize=True)
    assert ((ids >= 0) & (ids < E)).all(), "expert id out of range"
    assert all(len(set(row)) == top_k for row in ids.tolist()), "an expert chosen twice"
    assert (weights[:, :-1] >= weights[:, 1:]).all(), "weights not in descending order"
    torch.testing.assert_close(weights.sum(-1), torch.ones(M, device=DEVICE))


def test_non_contiguous_logits():
    torch.manual_seed(2)
    wide = torch.randn(6, 20, device=DEVICE)
    logits = wide[:, 3:15]  # row stride 20, 12 experts
    weights, ids = topk_routing(logits, 4)
    ref_weights, ref_ids = reference(logits, 4, True)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_weights)


def test_no_tokens():
    weights, ids = topk_routing(torch.empty(0, 8, device=DEVICE), 2)
    assert weights.shape == ids.shape == (0, 2)


@pytest.mark.parametrize("top_k", [0, 9])
def test_rejects_bad_top_k(top_k):
    with pytest.raises(ValueError, match="top_k is expected in"):
        topk_routing(torch.randn(2, 8, device=DEVICE), top_k)
