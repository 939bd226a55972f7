"""align_block_size: vLLM's moe_align_block_size semantics, invariants first."""

import os

import pytest
import torch

from moetune.kernel.align import SINGLE_PROGRAM_SLOTS, align_block_size, max_padded_slots

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"
POISON = -7777


@pytest.fixture(autouse=True)
def poison_int_empty(monkeypatch):
    """Fill every int32 `torch.empty` with POISON: an entry the kernels forget shows up."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        tensor = real_empty(*args, **kwargs)
        if tensor.dtype == torch.int32:
            tensor.fill_(POISON)
        return tensor

    monkeypatch.setattr(torch, "empty", empty)


CASES = [
    # (M, top_k, E, block_size_m)
    (1, 1, 4, 16),  # one slot
    (1, 8, 256, 16),  # decode: fewer slots than experts
    (7, 2, 13, 4),  # odd M, prime E
    (5, 6, 6, 2),  # top_k = E
    (3, 4, 64, 64),  # M*top_k < BLOCK_SIZE_M
    (200, 8, 37, 32),  # many slots, single-program path
    (600, 4, 9, 16),  # over SINGLE_PROGRAM_SLOTS: count/scan/scatter path
    (1300, 2, 128, 128),  # large path, several chunks, big blocks
]
if GPU:
    CASES += [(4096, 8, 256, 64), (4096, 16, 896, 128), (64, 16, 112, 16)]


def random_ids(M, top_k, E, seed, foreign=0.0):
    """Distinct experts per token; a `foreign` share replaced by -1 or >= E (other EP ranks)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(M, E, generator=gen).argsort(dim=-1)[:, :top_k].to(torch.int32)
    if foreign:
        hit = torch.rand(M, top_k, generator=gen) < foreign
        other = torch.where(torch.rand(M, top_k, generator=gen) < 0.5, -1, E + 3)
        ids = torch.where(hit, other.to(torch.int32), ids)
    return ids.to(DEVICE)


def check_alignment(ids, block_size_m, num_experts):
    """Assert every invariant of the alignment; returns the three outputs on the CPU."""
    M, top_k = ids.shape
    num_slots = M * top_k
    sorted_ids, expert_ids, num_post = (
        t.cpu() for t in align_block_size(ids, block_size_m, num_experts)
    )
    flat = ids.cpu().reshape(-1).long()
    valid = (flat >= 0) & (flat < num_experts)
    counts = torch.bincount(flat[valid], minlength=num_experts)
    padded = (counts + block_size_m - 1) // block_size_m * block_size_m

    max_padded = max_padded_slots(num_slots, block_size_m, num_experts)
    assert sorted_ids.dtype == expert_ids.dtype == num_post.dtype == torch.int32
    assert sorted_ids.shape == (max_padded,) and max_padded % block_size_m == 0
    assert expert_ids.shape == (max_padded // block_size_m,) and num_post.shape == (1,)
    total = int(num_post)
    assert total == int(padded.sum()), "num_tokens_post_padded is not the padded total"
    assert total <= max_padded

    real = sorted_ids[sorted_ids != num_slots]
    assert sorted(real.tolist()) == valid.nonzero().flatten().tolist(), (
        "valid slots must appear exactly once, foreign ones never"
    )
    assert (sorted_ids[total:] == num_slots).all(), "tail must hold the pad value"
    assert (expert_ids[total // block_size_m :] == -1).all(), "blocks past the end must be -1"

    # Experts in increasing id order, each run starting on a block boundary.
    start = 0
    for expert in range(num_experts):
        run = sorted_ids[start : start + padded[expert]]
        blocks = expert_ids[start // block_size_m : (start + padded[expert]) // block_size_m]
        assert (blocks == expert).all(), f"expert {expert}: wrong block ids {blocks.tolist()}"
        slots = run[: counts[expert]]
        assert (flat[slots.long()] == expert).all(), f"expert {expert}: foreign slot in run"
        assert (run[counts[expert] :] == num_slots).all(), f"expert {expert}: bad padding"
        start += int(padded[expert])
    return sorted_ids, expert_ids, num_post


@pytest.mark.parametrize("M,top_k,E,block_size_m", CASES, ids=lambda v: str(v))
def test_invariants(M, top_k, E, block_size_m):
    check_alignment(random_ids(M, top_k, E, seed=M + E), block_size_m, E)


@pytest.mark.parametrize("M,top_k,E,block_size_m", CASES, ids=lambda v: str(v))
def test_skips_experts_of_other_ranks(M, top_k, E, block_size_m):
    ids = random_ids(M, top_k, E, seed=M * E, foreign=0.4)
    check_alignment(ids, block_size_m, E)


@pytest.mark.parametrize("M", [3, SINGLE_PROGRAM_SLOTS // 2 + 5], ids=["single", "chunked"])
def test_all_slots_to_one_expert(M):
    # Skewed routing: one expert gets everything, the others nothing.
    ids = torch.full((M, 2), 5, dtype=torch.int32, device=DEVICE)
    ids[:, 1] = 2
    check_alignment(ids, 16, 8)


@pytest.mark.parametrize("M", [4, SINGLE_PROGRAM_SLOTS + 1], ids=["single", "chunked"])
def test_no_local_expert(M):
    ids = torch.full((M, 2), -1, dtype=torch.int32, device=DEVICE)
    sorted_ids, expert_ids, num_post = check_alignment(ids, 16, 8)
    assert int(num_post) == 0 and (sorted_ids == 2 * M).all()


def test_exact_output_small_case():
    # Slots 0..5 of M=3, top_k=2; expert 1 gets slots 1, 2; expert 3 slots 0, 3, 5; slot 4 foreign.
    ids = torch.tensor([[3, 1], [1, 3], [-1, 3]], dtype=torch.int32, device=DEVICE)
    sorted_ids, expert_ids, num_post = (t.cpu() for t in align_block_size(ids, 2, 4))
    assert int(num_post) == 6
    assert sorted(sorted_ids[0:2].tolist()) == [1, 2]
    assert sorted(sorted_ids[2:5].tolist()) == [0, 3, 5] and sorted_ids[5] == 6
    assert expert_ids[:3].tolist() == [1, 3, 3] and (expert_ids[3:] == -1).all()
    assert (sorted_ids[6:] == 6).all()


def test_empty_input():
    sorted_ids, expert_ids, num_post = align_block_size(
        torch.empty(0, 2, dtype=torch.int32, device=DEVICE), 16, 8
    )
    assert sorted_ids.numel() == 0 and expert_ids.numel() == 0 and int(num_post) == 0


def test_rejects_int64_ids():
    with pytest.raises(ValueError, match="int32"):
        align_block_size(torch.zeros(2, 2, dtype=torch.int64, device=DEVICE), 16, 4)


def test_rejects_block_size_not_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        align_block_size(torch.zeros(2, 2, dtype=torch.int32, device=DEVICE), 24, 4)
