"""The routing stream: every lone-GEMM bench reads the routings it would have drawn itself."""

import numpy as np
import pytest
import torch

from moetune.kernel.align import align_block_size
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.kernel.problem import make_problem
from moetune.tune.measure import probe_timing
from moetune.tune.measure.probe_timing import RoutingFeed, _Bench, routing_stream
from moetune.tune.problem import TuneProblem

E, N, K, TOP_K, M = 8, 32, 64, 2, 5
PROBLEM = TuneProblem(E, N, K, TOP_K, "bf16")


@pytest.fixture(autouse=True)
def no_streams_between_tests(monkeypatch):
    monkeypatch.setattr(probe_timing, "_STREAMS", {})


TRITON_POINTER_ALIGN = 16  # Triton specializes a pointer argument on this divisibility


_FRESH = {}  # (problem, batch size) -> (its feed, what it drew so far)


def fresh_draws(count, problem=PROBLEM, batch_size=M):
    """What a bench drew for itself before the stream: one feed, drawn in order.

    Each (problem, batch size) has one feed, drawn further as needed: the tests of one
    shape compare with the same draws, drawn once (at E=128, top-k 8 the interpreter takes
    most of a second a draw)."""
    feed, drawn = _FRESH.setdefault(
        (problem, batch_size), (RoutingFeed(problem, batch_size, torch.device("cpu"), 0), [])
    )
    while len(drawn) < count:
        drawn.append(feed.next())
    return drawn[:count]


def run_schedule(bench, calls, replays):
    """The harness's order: one slot (compile, sizing), then `calls` slots refilled per replay."""
    bench.allocate(1)
    read = [{k: v.clone() for k, v in bench.slots[0].items()}]
    bench.allocate(calls)
    for replay in range(replays + 1):
        if replay:
            bench.refill()
        read += [{k: v.clone() for k, v in slot.items()} for slot in bench.slots]
    return read


@pytest.mark.parametrize("block_m", [16, 64])
def test_each_slot_reads_the_draw_a_fresh_feed_gives_it_and_its_alignment(block_m):
    data = make_problem(M, E, N, K, TOP_K, "bf16", device="cpu")
    probe = Probe("up", Candidate(block_m, 32, 32, 1, 4, 2))
    read = run_schedule(_Bench(probe, PROBLEM, M, data), calls=3, replays=4)
    expected = fresh_draws(len(read))
    assert len(read) == 1 + 3 * 5
    for slot, (weights, ids) in zip(read, expected, strict=True):
        assert torch.equal(slot["ids"], ids) and torch.equal(slot["weights"], weights)
        sorted_ids, expert_ids, used = align_block_size(ids, block_m, E)
        assert torch.equal(slot["num_tokens_post_padded"], used)
        assert torch.equal(slot["expert_ids"], expert_ids)
        # Inside one expert's run the slot order is free (atomics): compare as sets per block.
        for block in range(int(used[0]) // block_m):
            rows = slice(block * block_m, (block + 1) * block_m)
            assert sorted(slot["sorted_token_ids"][rows].tolist()) == sorted(
                sorted_ids[rows].tolist()
            )


def test_benches_at_one_batch_size_share_the_stream_and_read_the_same_routings():
    data = make_problem(M, E, N, K, TOP_K, "bf16", device="cpu")
    first = run_schedule(
        _Bench(Probe("down", Candidate(16, 32, 32, 1, 4, 2)), PROBLEM, M, data), 2, 3
    )
    stream = routing_stream(PROBLEM, M, torch.device("cpu"))
    drawn = stream.stacked[None][0].shape[0]
    # Another probe, another graph size and tile: the same draws, none drawn again.
    second = run_schedule(
        _Bench(Probe("up", Candidate(32, 32, 32, 1, 4, 2)), PROBLEM, M, data), 4, 1
    )
    assert stream.stacked[None][0].shape[0] == drawn >= len(second)
    for a, b in zip(first, second, strict=False):
        assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["weights"], b["weights"])
    whole = run_schedule(_Bench(Candidate(16, 32, 32, 1, 4, 2), PROBLEM, M, data), 2, 1)
    assert set(whole[0]) == {"weights", "ids"}  # a whole call aligns inside the graph
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(first, whole, strict=False))
    assert set(stream.stacked) == {None, 16, 32}


def test_a_refill_does_not_touch_the_stream_the_next_bench_reads():
    data = make_problem(M, E, N, K, TOP_K, "bf16", device="cpu")
    bench = _Bench(Probe("up", Candidate(16, 32, 32, 1, 4, 2)), PROBLEM, M, data)
    bench.allocate(2)
    bench.slots[0]["ids"].fill_(-1)  # a launch may write its slots; the stream keeps its draws
    bench.refill()
    assert torch.equal(
        routing_stream(PROBLEM, M, torch.device("cpu")).stacked[None][1][0], fresh_draws(1)[0][1]
    )


def test_streams_past_the_byte_budget_drop_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(probe_timing, "STREAM_CACHE_BYTES", 1)
    cpu = torch.device("cpu")
    a = routing_stream(PROBLEM, 3, cpu)
    a.take(0, 4, 16)
    b = routing_stream(PROBLEM, 4, cpu)
    b.take(0, 4, 16)
    streams = probe_timing._STREAMS
    assert list(streams.values()) == [b]  # a went when b came (one stream is always kept)
    assert routing_stream(PROBLEM, 4, cpu) is b
    fresh = routing_stream(PROBLEM, 3, cpu)
    assert fresh is not a and np.array_equal(
        fresh.take(0, 4, None)["ids"], a.take(0, 4, None)["ids"]
    )


@pytest.mark.xdist_group("routing_draws")  # one worker: each shape's draws are drawn once
@pytest.mark.parametrize("kind", ["up", "down", "whole"])
@pytest.mark.parametrize(
    "batch_size, experts, top_k", [(1, 8, 2), (3, 8, 3), (24, 128, 8), (5, 60, 6)]
)
def test_every_slot_starts_where_a_tensor_of_its_own_would(kind, batch_size, experts, top_k):
    """Triton specializes pointer arguments on 16-byte alignment. A slot that is a view into
    a stacked buffer at an unaligned offset (num_tokens_post_padded: 4 bytes a slot) makes
    the timer compile a second variant of the kernel the warmers compiled (on the H200,
    0.36-0.39 s a new probe config). Each slot must start as a tensor of its own would."""
    problem = TuneProblem(experts, N, K, top_k, "bf16")
    data = make_problem(batch_size, experts, N, K, top_k, "bf16", device="cpu")
    tile = Candidate(16, 32, 32, 1, 4, 2)
    item = tile if kind == "whole" else Probe(kind, tile)
    bench = _Bench(item, problem, batch_size, data)
    for count in (1, 7):
        bench.allocate(count)
        bench.refill()
        for slot in bench.slots:
            for name, tensor in slot.items():
                assert tensor.data_ptr() % TRITON_POINTER_ALIGN == 0, (name, count)
                assert tensor.is_contiguous(), name
        for name in bench.slots[0]:  # one allocation's alignment apart (CPU: 64 bytes at start)
            starts = [slot[name].data_ptr() for slot in bench.slots]
            assert all(
                (b - a) % probe_timing.SLOT_ALIGN_BYTES == 0
                for a, b in zip(starts, starts[1:], strict=False)
            )
        expected = fresh_draws(bench.position, problem, batch_size)[-count:]
        for slot, (weights, ids) in zip(bench.slots, expected, strict=True):
            assert torch.equal(slot["ids"], ids) and torch.equal(slot["weights"], weights)


def test_a_stream_that_grows_past_the_budget_drops_the_older_ones(monkeypatch):
    cpu = torch.device("cpu")
    a = routing_stream(PROBLEM, 3, cpu)
    a.take(0, 4, 16)
    b = routing_stream(PROBLEM, 4, cpu)
    monkeypatch.setattr(probe_timing, "STREAM_CACHE_BYTES", a.nbytes + 1)
    assert list(probe_timing._STREAMS.values()) == [a, b]  # b holds nothing yet
    b.take(0, 4, 16)  # now both are past the budget: a, the older, goes
    assert list(probe_timing._STREAMS.values()) == [b]


def test_on_sglangs_kernel_the_alignment_and_the_sorted_rows_are_as_long_as_sglangs():
    from dataclasses import replace

    from moetune.engines.launch import sglang_0_5_23, twin_ref
    from moetune.kernel.align import max_padded_slots

    data = make_problem(M, E, N, K, TOP_K, "bf16", device="cpu")
    sglang = replace(PROBLEM, kernel=twin_ref("sglang"))
    probe = Probe("down", Candidate(16, 32, 32, 1, 4, 2), use_tma=True)
    ours, theirs = _Bench(probe, PROBLEM, M, data), _Bench(probe, sglang, M, data)
    ours.allocate(1)
    theirs.allocate(1)
    slots = M * TOP_K  # 10 slots, 8 experts: SGLang pads 9 buckets, rounded up to 4
    assert ours.slots[0]["sorted_token_ids"].numel() == max_padded_slots(slots, 16, E) == 144
    assert theirs.slots[0]["sorted_token_ids"].numel() == sglang_0_5_23.align_slots(slots, 16, E)
    assert sglang_0_5_23.align_slots(slots, 16, E) == 148
    assert ours.a.shape[0] == 144 and theirs.a.shape[0] == slots + 9 * 15
    assert routing_stream(PROBLEM, M, torch.device("cpu")) is not routing_stream(
        sglang, M, torch.device("cpu")
    )
