"""The measured pruning rule `accumulator_spills`: which tiles, where, for which search."""

import gzip
import json
import types
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.kernel.config import SWAP_AB_BLOCK_M, Candidate
from moetune.tune.estimate import estimate
from moetune.tune.problem import TuneProblem
from moetune.tune.runner import TuneRequest, make_plan, plan_lines
from moetune.tune.search.space import (
    MEASURED_RULES,
    PRUNE_RULES,
    PruneContext,
    default_space,
    prune,
    prune_rules,
    rule_accumulator_spills,
    swap_ab_candidates,
)

H200 = DeviceLimits.h200()
A100 = replace(H200, name="NVIDIA A100", compute_capability=(8, 0))
B200 = DeviceLimits(232_448, 148, "NVIDIA B200", (10, 0))
UNKNOWN = replace(H200, name="unknown", compute_capability=None)
DEEPSEEK_V3_TP8 = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128))
QWEN3_30B = TuneProblem(128, 768, 2048, 8, "bf16")
# The default grid's tiles whose accumulator takes >= 256 registers a thread, worked out by hand:
# (BLOCK_SIZE_M, BLOCK_SIZE_N, num_warps) with M * N / (32 * warps) >= 256.
SPILLING_TILES = {(128, 256, 4), (256, 128, 4), (256, 256, 4), (256, 256, 8)}
# Per (store, problem, batch size, fidelity) that timed a spilling tile on an H200: the best
# timing and the spilling ones (bench/results/2026-12-02-spill-prune/spill_evidence.py).
EXCERPT = Path(__file__).parent / "data" / "h200_spilling_tiles.json.gz"


def tile(c: Candidate) -> tuple[int, int, int]:
    return c.BLOCK_SIZE_M, c.BLOCK_SIZE_N, c.num_warps


def removed_by_rule(space: list[Candidate], limits: DeviceLimits) -> set[Candidate]:
    ctx = PruneContext(QWEN3_30B, 4096, limits)
    return set(space) - set(rule_accumulator_spills(space, ctx))


def test_the_rule_removes_exactly_the_spilling_tiles_of_the_grid():
    space = default_space()
    removed = removed_by_rule(space, H200)
    assert {tile(c) for c in removed} == SPILLING_TILES
    assert removed == {c for c in space if tile(c) in SPILLING_TILES}
    assert len(removed) == 4 * 3 * 4 * 4  # every K, GROUP_SIZE_M and stage of the four tiles


def test_swapped_eight_row_tiles_are_never_removed():
    swapped = swap_ab_candidates(default_space(), DEEPSEEK_V3_TP8, H200)
    assert swapped and all(c.BLOCK_SIZE_M == SWAP_AB_BLOCK_M for c in swapped)
    assert not removed_by_rule(swapped, H200)  # 8 x 256 over 128 threads: 16 registers


@pytest.mark.parametrize(
    ("limits", "prunes"), [(H200, True), (A100, True), (B200, False), (UNKNOWN, False)]
)
def test_only_where_the_accumulator_lives_in_registers(limits, prunes):
    assert bool(removed_by_rule(default_space(), limits)) is prunes


def test_a_space_of_spilling_tiles_only_is_kept_whole():
    only = [c for c in default_space() if tile(c) in SPILLING_TILES]
    assert removed_by_rule(only, H200) == set()


def test_only_the_fast_search_prunes_with_measured_rules():
    assert prune_rules("fast") == PRUNE_RULES + MEASURED_RULES
    assert prune_rules("thorough") == prune_rules("exhaustive") == PRUNE_RULES
    assert prune(default_space(), QWEN3_30B, 4096, H200).removed.keys() == dict(PRUNE_RULES).keys()


def request(search: str) -> TuneRequest:
    return TuneRequest(
        problem=DEEPSEEK_V3_TP8,
        batch_sizes=(1, 128, 4096),
        space=tuple(default_space()),
        save_dir=Path("out"),
        search=search,
    )


def test_the_fast_plan_counts_the_rule_and_the_others_do_not():
    fast = make_plan(request("fast"), H200)
    assert [fast.pruning[m].removed["accumulator_spills"] for m in (1, 128, 4096)] == [0, 28, 104]
    assert "  M=4096   1336 kept  (block_quant 736, shared_memory 32, accumulator_spills 104)" in (
        plan_lines(fast)
    )
    for search in ("thorough", "exhaustive"):
        plan = make_plan(request(search), H200)
        assert all("accumulator_spills" not in r.removed for r in plan.pruning.values())
        assert len(plan.pruning[4096].kept) == 1336 + 104
    on_blackwell = make_plan(request("fast"), B200)
    assert on_blackwell.pruning[4096].removed["accumulator_spills"] == 0


def test_the_estimate_counts_the_pruned_space():
    fast = make_plan(request("fast"), H200)
    unpruned = replace(
        fast,
        pruning={
            m: prune(
                [*default_space(), *swap_ab_candidates(default_space(), DEEPSEEK_V3_TP8, H200)],
                DEEPSEEK_V3_TP8,
                m,
                H200,
            )
            for m in (1, 128, 4096)
        },
    )
    assert estimate(unpruned).pairs - estimate(fast).pairs == 28 + 104
    assert estimate(fast).seconds < estimate(unpruned).seconds


def test_no_recorded_spilling_tile_came_near_the_best():
    """Every whole-call timing of a spilling tile in the recorded H200 stores was at least
    1.5x the best timing of its batch size and fidelity (the closest: 1.88x)."""
    groups = json.loads(gzip.decompress(EXCERPT.read_bytes()))
    spilling = [(g, Candidate(*row[:6]), row[6]) for g in groups for row in g["spilling"]]
    assert len({g["store"] for g in groups}) >= 20 and len(spilling) >= 900
    assert {"bf16", "fp8_w8a8", "int8_w8a8", "int4_w4a16"} <= {
        field.split("=")[1] for g in groups for field in g["problem"].split(",") if "dtype" in field
    }
    for group, candidate, latency_us in spilling:
        assert tile(candidate) in SPILLING_TILES
        assert removed_by_rule([candidate], H200) == set()  # alone it is kept (never empties)
        assert removed_by_rule([candidate, Candidate(*group["best"][:6])], H200) == {candidate}
        assert latency_us >= 1.5 * group["best"][6], group


def test_from_torch_leaves_a_rocm_gpu_without_compute_capability(monkeypatch):
    torch = pytest.importorskip("torch")
    props = types.SimpleNamespace(
        shared_memory_per_block_optin=65536,
        multi_processor_count=304,
        name="AMD MI300X",
        major=9,
        minor=4,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert DeviceLimits.from_torch().compute_capability is None
    monkeypatch.setattr(torch.version, "hip", None)
    assert DeviceLimits.from_torch().compute_capability == (9, 4)
