"""The seeded split search (--search fast): seeds, the TMA rules, the bound, the climb, the stop."""

import math
from dataclasses import replace

import pytest

from moetune.device import DeviceLimits
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.problem import TuneProblem
from moetune.tune.search.costmodel import predicted_gemm_seconds, predicted_seconds, rank_for_gemm
from moetune.tune.search.space import PARAM_NAMES, default_space, grid, prune
from moetune.tune.search.split_fast import (
    FastSplitOptions,
    SeededSplitSearch,
    paired_neighbours,
    step_neighbours,
    tma_rule_out,
)
from moetune.tune.store import Measurement

BF16 = TuneProblem(128, 768, 2048, 8, "bf16")
VARIANTS = [("up", False), ("down", False), ("down", True)]
SPACE = grid(
    {
        "BLOCK_SIZE_M": [16, 32],
        "BLOCK_SIZE_N": [32, 64, 128, 256],
        "BLOCK_SIZE_K": [64, 128, 256],
        "GROUP_SIZE_M": [1, 16],
        "num_warps": [4, 8],
        "num_stages": [2, 3, 4],
    }
)
SINGLE = Candidate(16, 64, 128, 1, 4, 3)


def cand(bm=16, bn=64, bk=128, group=1, warps=4, stages=3):
    return Candidate(bm, bn, bk, group, warps, stages)


class LoneGPU:
    """Lone-GEMM latencies: `base` for every config, `faster` overrides per (kind, tma, config)."""

    def __init__(self, faster=None, unsupported_tma=None):
        self.faster = faster or {}
        self.unsupported_tma = unsupported_tma
        self.asked = []

    def latency(self, probe):
        key = (probe.kind, probe.use_tma, probe.candidate)
        if key in self.faster:
            return self.faster[key]
        # Everything else: slower than the single config's own GEMMs, the further the slower.
        steps = sum(
            abs(math.log2(getattr(probe.candidate, name) / getattr(SINGLE, name)))
            for name in PARAM_NAMES
        )
        return (60.0 if probe.kind == "up" else 40.0) + 0.5 * steps + (0.2 if probe.use_tma else 0)

    def measure(self, batch_size, probes, fidelity):
        out = {}
        for probe in probes:
            self.asked.append((batch_size, probe))
            if probe.use_tma and self.unsupported_tma:
                out[probe] = Measurement.failure(
                    problem_key="p", batch_size=batch_size, candidate=probe, fidelity=fidelity,
                    status="unsupported", error=self.unsupported_tma, device_name="gpu",
                    triton_version="3.6.0", moetune_version="0",
                )  # fmt: skip
                continue
            us = self.latency(probe)
            out[probe] = Measurement(
                "p", batch_size, probe, fidelity, "ok", us, us, us, 0.1, None, "gpu", "3.6.0",
                "0", 0.0,
            )  # fmt: skip
        return out


def search(gpu, problem=BF16, options=None, notes=None):
    return SeededSplitSearch(gpu.measure, problem, DeviceLimits.h200(), VARIANTS, options, notes)


def run(gpu, batch_sizes=(64,), ranking=(), **kwargs):
    found = search(gpu, **kwargs).run(
        list(batch_sizes),
        lambda m: SPACE,
        dict.fromkeys(batch_sizes, SINGLE),
        dict.fromkeys(batch_sizes, [SINGLE, *ranking]),
    )
    return found


def test_the_single_config_best_alone_stops_after_the_seeds_by_the_bound():
    gpu = LoneGPU()
    ranking = [cand(bn=128), cand(bm=64), cand(stages=4), cand(group=16)]
    (found,) = run(gpu, ranking=ranking).values()
    ranking.remove(cand(bm=64))  # a whole-call baseline outside the pruned space: not a seed
    # Nothing beats the single config's own GEMMs: up + down gains 0 %, and even with the
    # climb's headroom (0.5 %) it cannot reach 1 %: stopped before any climb.
    assert found.stopped == "pair can gain 0.5 % at most, under 1 %"
    assert found.reference_us == pytest.approx(60.0 + 40.0)
    assert found.gain == pytest.approx(0.0)
    timed = {probe.candidate for _, probe in gpu.asked}
    model = rank_for_gemm(BF16, 64, SPACE, DeviceLimits.h200(), "up")[:2]
    model += rank_for_gemm(BF16, 64, SPACE, DeviceLimits.h200(), "down")[:2]
    assert timed == {SINGLE, *ranking, *model}  # the seeds, nothing else
    assert found.lone_timings == len(gpu.asked)


def test_a_seed_that_gains_climbs_to_the_better_neighbour_and_is_confirmed():
    seed = cand(bn=128)  # a top whole-call config; its down GEMM is 5 % faster alone
    better = replace(seed, BLOCK_SIZE_K=256)  # one step away: 8 % faster still
    gpu = LoneGPU(faster={("down", False, seed): 38.0, ("down", False, better): 35.0})
    (found,) = run(gpu, ranking=[seed]).values()
    assert found.stopped is None
    assert found.choice.down == Probe("down", better)
    assert found.choice.up == Probe("up", SINGLE)
    assert found.seeded_us == pytest.approx(60.0 + 38.0)
    assert found.choice.estimate_us == pytest.approx(60.0 + 35.0)
    # The climb stepped from each variant's best config at the chosen BLOCK_SIZE_M (16).
    seeds = {SINGLE, seed, *rank_for_gemm(BF16, 64, SPACE, DeviceLimits.h200(), "up")[:2]}
    seeds |= set(rank_for_gemm(BF16, 64, SPACE, DeviceLimits.h200(), "down")[:2])
    climbed = {p.candidate for _, p in gpu.asked} - seeds
    assert better in climbed and {c.BLOCK_SIZE_M for c in climbed} == {16}


def test_a_winner_two_steps_away_is_reached_by_the_paired_round_alone():
    # A deeper K tile pays only with fewer stages: each move alone is slower than the seed.
    seed = cand(bn=128)
    winner = replace(seed, BLOCK_SIZE_K=256, num_stages=2)
    faster = {("up", False, seed): 55.0, ("up", False, winner): 50.0}
    seeds = {SINGLE, seed, *rank_for_gemm(BF16, 64, SPACE, DeviceLimits.h200(), "up")[:2]}
    assert winner not in seeds
    one_step = LoneGPU(faster=faster)
    (found,) = run(one_step, ranking=[seed], options=FastSplitOptions(paired_steps=False)).values()
    assert found.choice.up == Probe("up", seed)
    assert (64, Probe("up", winner)) not in one_step.asked
    paired = LoneGPU(faster=faster)
    (found,) = run(paired, ranking=[seed]).values()
    assert found.choice.up == Probe("up", winner)
    assert found.choice.estimate_us == pytest.approx(50.0 + 40.0)
    # The paired round moved the chosen pair's GEMMs only: the down GEMM with TMA was not chosen.
    extra = {p for _, p in paired.asked} - {p for _, p in one_step.asked}
    assert winner in {p.candidate for p in extra if p.kind == "up"}
    assert not [p for p in extra if p.use_tma]


def test_a_small_gain_is_not_confirmed_after_the_climb():
    seed = cand(bn=128)
    gpu = LoneGPU(faster={("down", False, seed): 39.3})  # 0.7 % of up + down: under 1 %
    (found,) = run(gpu, ranking=[seed]).values()
    assert found.stopped == "pair gains 0.7 % alone, under 1 %"
    assert found.choice.down == Probe("down", seed)


def test_the_previous_batch_size_pair_seeds_the_next_one():
    seed = cand(bn=256, stages=2)
    gpu = LoneGPU(faster={("up", False, seed): 50.0})
    found = run(gpu, batch_sizes=(64, 128), ranking=[seed])
    assert found[64].choice.up.candidate == seed
    # 128 ranks other configs first, yet still times 64's pair.
    gpu.asked.clear()
    search_ = search(gpu)
    search_.run([64, 128], lambda m: SPACE, {64: SINGLE, 128: SINGLE}, {64: [seed], 128: []})
    assert (128, Probe("up", seed)) in gpu.asked


def test_tma_the_shape_rules_out_is_never_timed_and_an_unsupported_device_stops_it():
    notes = []
    int8 = TuneProblem(128, 768, 2048, 8, "int8_w8a8", per_channel=True)
    gpu = LoneGPU()
    run(gpu, problem=int8, notes=notes)
    assert not [p for _, p in gpu.asked if p.use_tma]
    assert notes == [
        "down GEMM with TMA not searched: USE_TMA is supported for bf16, fp16 and "
        "block-quantized fp8_w8a8, not int8_w8a8"
    ]
    notes = []
    gpu = LoneGPU(unsupported_tma="TMA needs compute capability 9.0+, this GPU has 8.0")
    run(gpu, batch_sizes=(64, 128), notes=notes)
    assert len([p for _, p in gpu.asked if p.use_tma]) == 1  # once, then the variant is gone
    assert notes == [
        "down GEMM with TMA not searched: TMA needs compute capability 9.0+, this GPU has 8.0"
    ]


def test_tma_rules_on_the_shape_and_the_boxes():
    assert tma_rule_out(BF16, "down") is None and tma_rule_out(BF16, "up") is None
    assert tma_rule_out(BF16, "down", cand()) is None
    # fp8 rows of N=200 bytes: a stride that is not a multiple of 16 bytes.
    fp8 = TuneProblem(64, 200, 1024, 4, "fp8_w8a8", (128, 128))
    assert "stride 200 of dimension 0 is 200 bytes" in tma_rule_out(fp8, "down")
    assert tma_rule_out(fp8, "up") is None  # w1 rows are K = 1024 bytes
    assert "not fp8_w8a8 per-tensor" in tma_rule_out(
        TuneProblem(64, 256, 1024, 4, "fp8_w8a8"), "up"
    )
    int4 = TuneProblem(64, 256, 1024, 4, "int4_w4a16", group_size=128)
    assert tma_rule_out(int4, "down").endswith("not int4_w4a16")
    # A 512-wide box: over TMA's 256.
    wide = Candidate(16, 512, 64, 1, 4, 3)
    assert "power of two <= 256" in tma_rule_out(BF16, "down", wide)


def test_step_neighbours_keep_block_m_and_move_one_parameter_one_step():
    values = {
        "BLOCK_SIZE_M": [16, 32],
        "BLOCK_SIZE_N": [32, 64, 128],
        "BLOCK_SIZE_K": [64, 128],
        "GROUP_SIZE_M": [1, 16],
        "num_warps": [4, 8],
        "num_stages": [2, 3, 4],
    }
    here = cand(bn=64, bk=64, stages=3)
    space = set(grid(values))
    found = step_neighbours(here, values, space)
    assert set(found) == {
        replace(here, BLOCK_SIZE_N=32),
        replace(here, BLOCK_SIZE_N=128),
        replace(here, BLOCK_SIZE_K=128),
        replace(here, GROUP_SIZE_M=16),
        replace(here, num_warps=8),
        replace(here, num_stages=2),
        replace(here, num_stages=4),
    }
    assert step_neighbours(here, values, space - {replace(here, num_stages=4)}) == [
        c for c in found if c != replace(here, num_stages=4)
    ]


def test_paired_neighbours_trade_a_deeper_k_tile_for_a_narrower_n_tile_or_fewer_stages():
    values = {
        "BLOCK_SIZE_M": [16, 32],
        "BLOCK_SIZE_N": [32, 64, 128],
        "BLOCK_SIZE_K": [64, 128, 256],
        "GROUP_SIZE_M": [1, 16],
        "num_warps": [4, 8],
        "num_stages": [2, 3, 4],
    }
    here = cand(bn=64, bk=128, stages=3)
    space = set(grid(values))
    assert set(paired_neighbours(here, values, space)) == {
        replace(here, BLOCK_SIZE_K=256, BLOCK_SIZE_N=32),
        replace(here, BLOCK_SIZE_K=256, num_stages=2),
        replace(here, BLOCK_SIZE_K=64, BLOCK_SIZE_N=128),
        replace(here, BLOCK_SIZE_K=64, num_stages=4),
    }
    # Only members of the space; at the edges of the values only the moves that exist.
    pruned = space - {replace(here, BLOCK_SIZE_K=256, num_stages=2)}
    assert len(paired_neighbours(here, values, pruned)) == 3
    edge = cand(bn=32, bk=256, stages=4)
    assert paired_neighbours(edge, values, space) == [
        replace(edge, BLOCK_SIZE_K=128, BLOCK_SIZE_N=64)
    ]
    assert paired_neighbours(cand(bk=512), values, space) == []


def test_the_cost_model_splits_into_its_two_gemms():
    space = prune(default_space(), BF16, 64, DeviceLimits.h200()).kept[:50]
    limits = DeviceLimits.h200()
    for c in space:
        both = predicted_gemm_seconds(BF16, 64, c, limits, "up")
        both += predicted_gemm_seconds(BF16, 64, c, limits, "down")
        assert predicted_seconds(BF16, 64, c, limits) == pytest.approx(both)
    # The down GEMM (K outputs over N) ranks configs differently from the up one (2N over K).
    assert rank_for_gemm(BF16, 64, space, limits, "up") != rank_for_gemm(
        BF16, 64, space, limits, "down"
    )
    with pytest.raises(ValueError, match="gemm must be one of up, down"):
        predicted_gemm_seconds(BF16, 64, space[0], limits, "gate")


@pytest.mark.parametrize(
    "field, value", [("whole_seeds", 0), ("model_seeds", -1), ("min_gain", 1.0), ("headroom", -0.1)]
)
def test_options_are_checked(field, value):
    with pytest.raises(TuneError, match=field):
        FastSplitOptions(**{field: value})
