"""Transfer search: a second kernel's search seeded from the first kernel's results.

Against the two-kernel synthetic GPU (tests/tune/synthetic.py: `OtherKernelGPU`)
and replayed on the recorded H200 tunes of one shape on vLLM 0.33.0's and on
SGLang 0.5.23's kernels (bench/results/h200-2026-12-02-engine-kernels/).
"""

import gzip
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from moetune.tune.search.space import (
    DEFAULT_BATCH_SIZES,
    Candidate,
    default_space,
    prune,
    values_by_param,
)
from moetune.tune.search.strategy import (
    THOROUGH_OPTIONS,
    TRANSFER_OPTIONS,
    fast_search,
    transfer_search,
)
from moetune.tune.store import Measurement

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import (  # noqa: E402
    DEEPSEEK_V3_TP8,
    H200,
    MIXTRAL_TP2,
    QWEN3_30B,
    OtherKernelGPU,
    SyntheticGPU,
)

RECORDED = Path(__file__).resolve().parents[2] / "bench/results/2026-12-02-engine-kernels"


def pruned_spaces(problem, batch_sizes=DEFAULT_BATCH_SIZES):
    return {m: prune(default_space(), problem, m, H200).kept for m in batch_sizes}


class Recording:
    """Passes timings through and keeps every ok full-fidelity one, per batch size."""

    def __init__(self, inner):
        self.inner = inner
        self.full = defaultdict(dict)

    def measure(self, batch_size, candidates, fidelity):
        out = self.inner.measure(batch_size, candidates, fidelity)
        if fidelity == "full":
            self.full[batch_size].update((c, m.latency_us) for c, m in out.items() if m.ok)
        return out

    def leaders(self):
        """What the runner hands on: each batch size's full-fidelity configs, fastest first."""
        return {m: sorted(rows, key=rows.get) for m, rows in self.full.items()}


def first_kernel_leaders(problem, seed, spaces):
    first = Recording(SyntheticGPU(problem, seed))
    fast_search(sorted(spaces), spaces.__getitem__, first, problem, H200)
    return first.leaders()


def test_transfer_lands_within_1_percent_of_fast_search_for_a_third_of_the_timings():
    """3 shapes x 2 landscapes x 18 batch sizes: the second kernel searched both ways.

    Quick timings carry 2 % noise and full ones 0.5 %, so two fast searches of
    one landscape with different noise already differ by over 1 % at about 2 %
    of batch sizes (up to 2 %); the transfer may do the same, no more often than
    1 in 20, and is as good on average.
    """
    ratios, fast_timings, transfer_timings = [], 0, 0
    for problem in (QWEN3_30B, MIXTRAL_TP2, DEEPSEEK_V3_TP8):
        spaces = pruned_spaces(problem)
        for seed in range(2):
            seeds = first_kernel_leaders(problem, seed, spaces)
            fast_gpu, transfer_gpu = OtherKernelGPU(problem, seed), OtherKernelGPU(problem, seed)
            fast = fast_search(DEFAULT_BATCH_SIZES, spaces.__getitem__, fast_gpu, problem, H200)
            transfer = transfer_search(
                DEFAULT_BATCH_SIZES, spaces.__getitem__, transfer_gpu, problem, H200, seeds
            )
            assert sorted(transfer) == list(DEFAULT_BATCH_SIZES)
            for m, result in transfer.items():
                assert result.best.fidelity == "full" and result.best.candidate in spaces[m]
                assert result.space_size == len(spaces[m])
                truth = transfer_gpu.true_us
                ratios.append(truth(m, result.best.candidate) / truth(m, fast[m].best.candidate))
            # Every (batch size, candidate, fidelity) was asked of the measurer once only.
            assert max(Counter(transfer_gpu.calls).values()) == 1
            assert sum(r.measurements for r in transfer.values()) == len(transfer_gpu.calls)
            fast_timings += len(fast_gpu.calls)
            transfer_timings += len(transfer_gpu.calls)
    assert len(ratios) == 108
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert geomean <= 1.002, f"geomean {geomean:.4f} of the fast search's latency"
    misses = sorted(r for r in ratios if r > 1.01)
    assert len(misses) <= 5 and max(ratios) <= 1.025, misses
    assert transfer_timings <= 0.4 * fast_timings, (transfer_timings, fast_timings)


def test_the_seeds_are_timed_first_and_decided_at_full_fidelity():
    """The seeds come first at quick fidelity, no cost-model pool, and each that ran is
    re-timed at full fidelity even when quick noise ranked it low."""
    problem, m = QWEN3_30B, 256
    spaces = pruned_spaces(problem, (m,))
    seeds = first_kernel_leaders(problem, 0, spaces)[m]
    gpu = OtherKernelGPU(problem, 0)
    [result] = transfer_search([m], spaces.__getitem__, gpu, problem, H200, {m: seeds}).values()
    quick = [c for _, c, f in gpu.calls if f == "quick"]
    expected = [hash(c) for c in seeds[: TRANSFER_OPTIONS.transfer_seeds]]
    assert quick[: len(expected)] == expected
    full = {c for _, c, f in gpu.calls if f == "full"}
    ran = [c for c in seeds[:8] if gpu.true_us(m, c) is not None]
    assert {hash(c) for c in ran} <= full
    fast = fast_search([m], spaces.__getitem__, OtherKernelGPU(problem, 0), problem, H200)
    assert result.measurements < 0.5 * fast[m].measurements


def test_the_climb_finds_faster_configs_one_move_from_the_seeds():
    """Where the second kernel is fastest with a parameter value no seed has (one move from
    each), the climb finds it: the seeds alone would not."""
    problem, m = QWEN3_30B, 256
    spaces = pruned_spaces(problem, (m,))
    seeds = first_kernel_leaders(problem, 0, spaces)[m][: TRANSFER_OPTIONS.transfer_seeds]
    name, value = next(
        (name, value)
        for name, values in values_by_param(spaces[m]).items()
        for value in values
        if all(getattr(seed, name) != value for seed in seeds)
    )

    class FasterThere(OtherKernelGPU):
        def true_us(self, batch_size, c):
            us = super().true_us(batch_size, c)
            return us * 0.85 if us is not None and getattr(c, name) == value else us

    gpu = FasterThere(problem, 0)
    best = min(spaces[m], key=lambda c: gpu.true_us(m, c) or math.inf)
    assert getattr(best, name) == value
    [result] = transfer_search([m], spaces.__getitem__, gpu, problem, H200, {m: seeds}).values()
    assert getattr(result.best.candidate, name) == value
    assert gpu.true_us(m, result.best.candidate) <= gpu.true_us(m, best) * 1.02


def test_a_batch_size_without_seeds_or_whose_seeds_fail_starts_as_fast_search():
    problem = QWEN3_30B
    spaces = pruned_spaces(problem, (16, 64))
    failing = Candidate(16, 64, 64, 1, 4, 3)

    class SeedFails(OtherKernelGPU):
        def failure(self, c, m=1):
            return "compile_error" if c == failing else super().failure(c, m)

    gpu = SeedFails(problem, 1)
    results = transfer_search([16, 64], spaces.__getitem__, gpu, problem, H200, {64: [failing]})
    best = {m: min(t for t in (gpu.true_us(m, c) for c in spaces[m]) if t) for m in (16, 64)}
    for m, result in results.items():
        assert gpu.true_us(m, result.best.candidate) <= best[m] * 1.03
        # Both fell back to the cost model's pool: far more than one seed was timed.
        assert result.timed > 20


def test_seeds_outside_the_space_are_mapped_to_its_nearest_member_and_small_spaces_timed_whole():
    problem = MIXTRAL_TP2
    small = default_space()[:30]
    gpu = OtherKernelGPU(problem, 0)
    outside = Candidate(128, 256, 256, 64, 8, 5)
    results = transfer_search(
        [1, 64],
        lambda m: small if m == 1 else pruned_spaces(problem, (64,))[64],
        gpu,
        problem,
        H200,
        {1: [outside], 64: [outside]},
    )
    assert results[1].timed == results[1].measurements == 30
    assert {f for m, _, f in gpu.calls if m == 1} == {"full"}
    assert results[64].best.candidate in pruned_spaces(problem, (64,))[64]


# The recorded H200 tunes of Qwen3-30B TP1 bf16: vLLM 0.33.0's kernel (call 2) and SGLang
# 0.5.23's (call 4), each a fast search of its own, 18 batch sizes.
VLLM_STORE = RECORDED / "call2/qwen3-tp1-vllm/measurements.jsonl.gz"
SGLANG_STORE = RECORDED / "call4/qwen3-tp1-sglang/measurements.jsonl.gz"


def recorded(path):
    rows = defaultdict(dict)
    with gzip.open(path, "rt") as handle:
        for line in handle:
            m = Measurement.from_json(json.loads(line))
            if m.kind == "whole":
                rows[(m.batch_size, m.fidelity)][m.candidate] = m
    return rows


class Replay:
    """Answers from one store: a fidelity it lacks for a candidate from the other one."""

    def __init__(self, rows):
        self.rows = rows
        self.timings = 0

    def measure(self, batch_size, candidates, fidelity):
        self.timings += len(candidates)
        other = "quick" if fidelity == "full" else "full"
        return {
            c: self.rows[(batch_size, fidelity)].get(c) or self.rows[(batch_size, other)][c]
            for c in candidates
        }

    def latency(self, batch_size, candidate):
        return self.measure(batch_size, [candidate], "full")[candidate].latency_us


@pytest.mark.skipif(not SGLANG_STORE.exists(), reason="the recorded H200 stores are not here")
def test_transfer_replayed_on_the_recorded_vllm_and_sglang_tunes():
    """Seeded from vLLM's recorded full timings, on SGLang's recorded timings.

    The replay's space at each batch size is what SGLang's recorded tune timed
    there (so every timing can be answered), which is where its own fast search
    went: fast search replayed on it as it ran then (three climb starts, today's
    ``--search thorough``) finds the recorded winner, and the transfer must land
    within 1 % of it at every batch size with a third of the timings.
    """
    vllm, sglang = recorded(VLLM_STORE), recorded(SGLANG_STORE)
    batch_sizes = sorted({m for m, _ in sglang})
    assert batch_sizes == list(DEFAULT_BATCH_SIZES)
    spaces = {m: sorted(set(sglang[(m, "quick")]) | set(sglang[(m, "full")])) for m in batch_sizes}
    seeds = {
        m: [c for c, row in sorted(vllm[(m, "full")].items(), key=lambda x: x[1].latency_us or 1e9)]
        for m in batch_sizes
    }
    fast, transfer = Replay(sglang), Replay(sglang)
    found_fast = fast_search(
        batch_sizes, spaces.__getitem__, fast, QWEN3_30B, H200, THOROUGH_OPTIONS
    )
    found = transfer_search(batch_sizes, spaces.__getitem__, transfer, QWEN3_30B, H200, seeds)
    for m in batch_sizes:
        ours = transfer.latency(m, found[m].best.candidate)
        theirs = fast.latency(m, found_fast[m].best.candidate)
        assert ours <= theirs * 1.01, (m, ours, theirs)
    assert transfer.timings <= 0.4 * fast.timings, (transfer.timings, fast.timings)
    assert transfer.timings <= 45 * len(batch_sizes)  # the estimate's 40 per batch size
