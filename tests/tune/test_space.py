import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.problem import TuneProblem
from moetune.tune.search.space import (
    DEFAULT_BATCH_SIZES,
    PRUNE_RULES,
    default_space,
    load_space,
    max_row_blocks,
    prune,
    shared_memory_lower_bound,
    swap_ab_candidates,
)

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import SyntheticGPU  # noqa: E402

H200 = DeviceLimits.h200()
QWEN3_30B = TuneProblem(128, 768, 2048, 8, "bf16")
MIXTRAL_TP2 = TuneProblem(8, 7168, 4096, 2, "bf16")
DEEPSEEK_V3_TP8 = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128))
# Tiles far larger than this problem: 2N = 64, K = 64.
TINY = TuneProblem(4, 32, 64, 2, "bf16")


def test_default_space_is_the_engines_grid():
    space = default_space()
    assert len(space) == 1920 == len(set(space))
    assert {c.BLOCK_SIZE_M for c in space} == {16, 32, 64, 128, 256}
    assert {c.num_stages for c in space} == {2, 3, 4, 5}
    assert space == sorted(space)


def test_candidate_config_round_trip():
    config = {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 16,
        "num_warps": 4,
        "num_stages": 3,
    }
    candidate = Candidate.from_config(config)
    assert candidate.as_config() == config
    assert list(candidate.as_config()) == list(config)
    assert candidate.short() == "M64 N128 K64 G16 w4 s3"


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"BLOCK_SIZE_M": 64},
            "is missing BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages",
        ),
        ({**Candidate(16, 32, 64, 1, 4, 2).as_config(), "kpack": 2}, "unknown key(s) kpack"),
        (
            {**Candidate(16, 32, 64, 1, 4, 2).as_config(), "BLOCK_SIZE_N": 48},
            "BLOCK_SIZE_N must be a power of two >= 16, got 48",
        ),
        (
            {**Candidate(16, 32, 64, 1, 4, 2).as_config(), "BLOCK_SIZE_K": 8},
            "BLOCK_SIZE_K must be a power of two >= 16, got 8",
        ),
        (
            {**Candidate(16, 32, 64, 1, 4, 2).as_config(), "num_warps": 3},
            "num_warps must be 1, 2, 4, 8, 16 or 32",
        ),
        (
            {**Candidate(16, 32, 64, 1, 4, 2).as_config(), "num_stages": "2"},
            "num_stages must be a positive integer, got '2'",
        ),
        ([16, 32], "a config must be a mapping"),
    ],
)
def test_bad_configs_are_one_line_errors(config, message):
    with pytest.raises(TuneError) as info:
        Candidate.from_config(config)
    assert message in str(info.value)


def test_load_space_grid_fills_missing_parameters_with_defaults(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("BLOCK_SIZE_M: [16, 32]\nnum_warps: 4\n")
    space = load_space(path)
    assert len(space) == 2 * 4 * 3 * 4 * 1 * 4
    assert {c.num_warps for c in space} == {4}
    assert {c.BLOCK_SIZE_K for c in space} == {64, 128, 256}


def test_load_space_accepts_a_json_list_of_configs(tmp_path):
    configs = [
        Candidate(16, 64, 64, 1, 4, 3).as_config(),
        Candidate(64, 128, 64, 16, 8, 4).as_config(),
    ]
    path = tmp_path / "space.json"
    path.write_text(json.dumps(configs + configs[:1]))
    assert load_space(path) == [Candidate(16, 64, 64, 1, 4, 3), Candidate(64, 128, 64, 16, 8, 4)]


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("s.yaml", "BLOCK_SIZE_Q: [16]\n", "unknown parameter(s) BLOCK_SIZE_Q"),
        ("s.yaml", "BLOCK_SIZE_M: []\n", "BLOCK_SIZE_M: an empty list"),
        ("s.yaml", "BLOCK_SIZE_M: [24]\n", "BLOCK_SIZE_M, item 1: 24 is not a power of two"),
        ("s.yaml", "BLOCK_SIZE_N: [8]\n", "BLOCK_SIZE_N, item 1: 8 is not a power of two from 16"),
        ("s.yaml", "- 16\n", "config 1: 16 is not a config: a mapping of exactly the six keys"),
        ("s.yaml", "[]\n", "an empty list"),
        (
            "s.yaml",
            "42\n",
            "expected a mapping of parameter -> values or a list of configs, got int",
        ),
        ("s.json", "{oops", "s.json:1:2: malformed JSON (Expecting property name"),
        ("s.yaml", "a: [1\n", "s.yaml:2:1: malformed YAML (while parsing a flow sequence"),
    ],
)
def test_load_space_errors_name_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TuneError) as info:
        load_space(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_load_space_missing_file(tmp_path):
    with pytest.raises(TuneError, match="cannot read search space"):
        load_space(tmp_path / "nope.yaml")


def test_h200_limits():
    assert H200.shared_memory_per_block == 227 * 1024
    assert H200.num_sms == 132


def test_from_torch_without_a_gpu_is_a_one_line_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(TuneError, match="no CUDA GPU is visible"):
        DeviceLimits.from_torch()


def test_report_counts_every_rule_in_order():
    report = prune(default_space(), QWEN3_30B, 64, H200)
    assert list(report.removed) == [name for name, _ in PRUNE_RULES]
    assert len(report.kept) + report.total_removed == 1920


# bench/smem_probe.py: moetune's GEMM kernel compiled offline for sm_90 over the default grid,
# {"triton <version> <dtype>": {"BMxBNxBKxWARPSxSTAGES": shared bytes or null}}.
SM90_SHARED = json.loads((Path(__file__).parent / "data" / "sm90_shared_memory.json").read_text())
PROBE_PROBLEMS = {
    "bf16": QWEN3_30B,
    "fp8": TuneProblem(128, 768, 2048, 8, "fp8_w8a8"),
    "fp8-block": TuneProblem(128, 768, 2048, 8, "fp8_w8a8", (128, 128)),
}


@pytest.mark.parametrize("label", sorted(SM90_SHARED))
def test_shared_memory_rule_matches_what_triton_allocates_on_hopper(label):
    problem = PROBE_PROBLEMS[label.split()[-1]]
    limit = H200.shared_memory_per_block
    compiled = {k: v for k, v in SM90_SHARED[label].items() if v is not None}
    assert len(compiled) >= 200
    for key, shared in compiled.items():
        bm, bn, bk, warps, stages = map(int, key.split("x"))
        candidate = Candidate(bm, bn, bk, 1, warps, stages)
        hopper_bound = shared_memory_lower_bound(candidate, problem, H200)
        assert shared_memory_lower_bound(candidate, problem) <= hopper_bound <= shared, key
        # The rule removes exactly the configs Triton cannot launch on an H200.
        assert (hopper_bound > limit) == (shared > limit), key


def test_shared_memory_rule_removes_exactly_the_oversized():
    report = prune(default_space(), QWEN3_30B, 4096, H200)
    removed = set(default_space()) - set(report.kept)
    assert report.removed["shared_memory"] == len(removed) == 616
    assert all(
        shared_memory_lower_bound(c, QWEN3_30B, H200) > H200.shared_memory_per_block
        for c in removed
    )
    # 128x256x64 at 4 stages: vLLM's published H200 pick for large M; it fits.
    assert Candidate(128, 256, 64, 16, 8, 4) in report.kept
    # 256x256x256: even one stage is 256 KiB.
    assert Candidate(256, 256, 256, 1, 8, 2) not in report.kept


def test_shared_memory_depends_on_dtype_bytes():
    fp8 = TuneProblem(128, 768, 2048, 8, "fp8_w8a8")
    big = Candidate(256, 256, 128, 1, 8, 3)  # wgmma, 3 buffers: bf16 3 x 128 KiB, fp8 3 x 64 KiB
    assert big not in prune([big], QWEN3_30B, 4096, H200).kept
    assert big in prune([big], fp8, 4096, H200).kept


def test_block_quant_rule_needs_block_k_to_divide_the_weight_block():
    report = prune(default_space(), DEEPSEEK_V3_TP8, 4096, H200)
    assert report.removed["block_quant"] == 640  # every BLOCK_SIZE_K = 256
    assert {c.BLOCK_SIZE_K for c in report.kept} == {64, 128}
    assert {c.BLOCK_SIZE_N for c in report.kept} == {32, 64, 128, 256}
    assert prune(default_space(), QWEN3_30B, 4096, H200).removed["block_quant"] == 0


def test_block_m_rule_keeps_the_smallest_tile_covering_the_batch_per_mma_path():
    report = prune(default_space(), QWEN3_30B, 24, H200)
    # 16 < 24 is kept; 32 covers 24 on the mma.sync path, 64 on the wgmma path;
    # 128 and 256 are dominated by 64.
    assert {c.BLOCK_SIZE_M for c in report.kept} == {16, 32, 64}
    limit = H200.shared_memory_per_block
    fits = {c for c in default_space() if shared_memory_lower_bound(c, QWEN3_30B, H200) <= limit}
    removed = fits - set(report.kept)
    assert {c.BLOCK_SIZE_M for c in removed} == {128, 256}
    assert all(replace(c, BLOCK_SIZE_M=64) in report.kept for c in removed)
    at_one = {c.BLOCK_SIZE_M for c in prune(default_space(), QWEN3_30B, 1, H200).kept}
    assert at_one == {16, 64}
    assert prune(default_space(), QWEN3_30B, 4096, H200).removed["block_m_covers_experts"] == 0


def test_block_m_rule_never_removes_the_only_covering_tile():
    only_large = [Candidate(128, 64, 64, 1, 4, 2), Candidate(256, 64, 64, 1, 4, 2)]
    assert prune(only_large, QWEN3_30B, 1, H200).kept == [Candidate(128, 64, 64, 1, 4, 2)]
    small = [Candidate(32, 64, 64, 1, 4, 2), Candidate(64, 64, 64, 1, 4, 2)]
    assert prune(small, QWEN3_30B, 1, H200).kept == small  # one per MMA path


def test_block_n_and_k_rules_apply_to_tiles_wider_and_deeper_than_both_gemms():
    # TINY: 2N = 64 and K = 64 outputs, K = 64 and N = 32 deep.
    report = prune(default_space(), TINY, 4096, H200)
    assert {c.BLOCK_SIZE_N for c in report.kept} == {32, 64}
    assert {c.BLOCK_SIZE_K for c in report.kept} == {64}
    assert report.removed["block_n_covers_width"] > 0
    assert report.removed["block_k_covers_depth"] > 0
    # Qwen3-30B's down GEMM is 2048 wide: no BLOCK_SIZE_N covers it.
    assert prune(default_space(), QWEN3_30B, 1, H200).removed["block_n_covers_width"] == 0


def test_group_size_rule_only_merges_identical_program_orders():
    # Mixtral TP2 at M=1: at most ceil(2/BM) + 8 = 9 row blocks, so GROUP_SIZE_M 16, 32 and 64
    # all give one group; 1 gives a different order and stays.
    assert max_row_blocks(MIXTRAL_TP2, 1, 16) == 9
    report = prune(default_space(), MIXTRAL_TP2, 1, H200)
    assert {c.GROUP_SIZE_M for c in report.kept} == {1, 16}
    # Qwen3-30B has 128 experts: up to 129 row blocks, every GROUP_SIZE_M matters.
    assert prune(default_space(), QWEN3_30B, 1, H200).removed["group_size_m_degenerate"] == 0
    assert prune(default_space(), MIXTRAL_TP2, 4096, H200).removed["group_size_m_degenerate"] == 0


@pytest.mark.parametrize(
    "problem", [QWEN3_30B, MIXTRAL_TP2, DEEPSEEK_V3_TP8, TINY], ids=lambda p: p.key()
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruning_never_removes_the_true_best(problem, seed):
    """Under the synthetic cost model, the best of the kept candidates is the best of all that run."""
    gpu = SyntheticGPU(problem, seed)
    space = default_space()
    for m in (1, 8, 64, 4096):
        kept = prune(space, problem, m, H200).kept
        runs = [(gpu.true_us(m, c), c) for c in space if gpu.true_us(m, c) is not None]
        valid = [
            r
            for r in runs
            if problem.block_shape is None or problem.block_shape[1] % r[1].BLOCK_SIZE_K == 0
        ]
        best_all = min(valid)[0]
        best_kept = min(t for t in (gpu.true_us(m, c) for c in kept) if t is not None)
        assert best_kept == best_all, (m, best_kept, best_all)
        # Nothing that fits is lost to the shared-memory rule.
        fits = {c for _, c in valid}
        assert not {
            c
            for c in fits
            if shared_memory_lower_bound(c, problem, H200) > H200.shared_memory_per_block
        }


def test_every_default_batch_size_keeps_candidates():
    for problem in (QWEN3_30B, MIXTRAL_TP2, DEEPSEEK_V3_TP8, TINY):
        for m in DEFAULT_BATCH_SIZES:
            assert prune(default_space(), problem, m, H200).kept


def test_prune_rejects_a_bad_batch_size():
    with pytest.raises(TuneError, match="batch size must be a positive integer"):
        prune(default_space(), QWEN3_30B, 0, H200)


# Compiled in a fresh process: compiling a kernel for a GPU target in this one (where
# TRITON_INTERPRET=1) leaves Triton's interpreter unable to run it afterwards.
HOPPER_COMPILE = """
import json, sys
sys.path.insert(0, "bench")
from smem_probe import compile_shared_bytes
print(json.dumps([compile_shared_bytes(c, d) for c, d in json.loads(sys.argv[1])]))
"""
LIVE_CASES = [
    ("bf16", QWEN3_30B, Candidate(16, 64, 128, 1, 4, 4)),  # mma.sync: num_stages - 1 buffers
    ("bf16", QWEN3_30B, Candidate(128, 256, 64, 16, 8, 4)),  # wgmma: num_stages buffers
    ("fp8-block", DEEPSEEK_V3_TP8, Candidate(64, 128, 128, 1, 4, 3)),  # block scales too
]


def test_shared_memory_bound_holds_for_moetunes_kernel_compiled_for_hopper_now():
    """The recorded data above, re-checked live on the kernel as it is (no GPU needed)."""
    pytest.importorskip("triton.backends.nvidia")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cases = json.dumps([[c.as_config(), dtype] for dtype, _, c in LIVE_CASES])
    done = subprocess.run(
        [sys.executable, "-c", HOPPER_COMPILE, cases],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shared = json.loads(done.stdout.splitlines()[-1])
    if None in shared:
        pytest.skip("this Triton cannot compile for sm_90 here")
    for (_, problem, candidate), compiled in zip(LIVE_CASES, shared, strict=True):
        bound = shared_memory_lower_bound(candidate, problem, H200)
        assert shared_memory_lower_bound(candidate, problem) <= bound <= compiled
        assert compiled <= bound + 8192  # fp8 block scales add a little


H200_RUN = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-11-30-tune"


@pytest.mark.parametrize(
    "store, problem",
    [("qwen3-30b-tp1", QWEN3_30B), ("mixtral-8x7b-tp2", MIXTRAL_TP2)],
)
def test_pruning_against_the_h200_run(store, problem):
    """Real results (bench/results/2026-11-30-tune, Triton 3.6): the shared-memory rule keeps every
    candidate that ran and removes every one that hit OutOfResources."""
    import gzip

    from moetune.tune.store import Measurement

    with gzip.open(H200_RUN / f"{store}.measurements.jsonl.gz", "rt") as handle:
        rows = [Measurement.from_json(json.loads(line)) for line in handle if line.strip()]
    ran = [r for r in rows if r.ok]
    out_of_resources = [r for r in rows if r.status == "out_of_resources"]
    assert len(ran) > 1000 and len(out_of_resources) > 50
    limit = H200.shared_memory_per_block
    assert all(shared_memory_lower_bound(r.candidate, problem, H200) <= limit for r in ran)
    assert all(
        shared_memory_lower_bound(r.candidate, problem, H200) > limit for r in out_of_resources
    )


SWAP_SPACE = [
    Candidate(16, 64, 128, 1, 4, 3),
    Candidate(16, 128, 128, 16, 4, 4),
    Candidate(16, 32, 128, 1, 4, 3),  # BLOCK_SIZE_N < 64: no swap
    Candidate(32, 128, 128, 16, 4, 3),  # swaps, but its 8-row twin is the 16-row one's
    Candidate(64, 128, 128, 16, 4, 3),
]
TWIN_FP8 = DEEPSEEK_V3_TP8  # kernel None: moetune's twin


def test_swap_ab_candidates_add_8_row_tiles_where_the_twin_swaps():
    """The twin swaps fp8 tiles on compute capability 9.0 (vLLM 0.33's rule): BLOCK_SIZE_M=8
    twins of the 16-row tiles at least 64 wide."""
    added = swap_ab_candidates(SWAP_SPACE, TWIN_FP8, H200)
    assert added == [Candidate(8, 64, 128, 1, 4, 3), Candidate(8, 128, 128, 16, 4, 4)]


@pytest.mark.parametrize(
    "problem,limits",
    [
        (QWEN3_30B, H200),  # bf16: no swap
        (TuneProblem(128, 768, 2048, 8, "int8_w8a8", per_channel=True), H200),
        (TWIN_FP8, replace(H200, compute_capability=(10, 0))),
        (TWIN_FP8, replace(H200, compute_capability=None)),
    ],
    ids=["bf16", "int8_w8a8", "sm100", "unknown-device"],
)
def test_swap_ab_candidates_only_where_a_and_b_swap(problem, limits):
    assert swap_ab_candidates(SWAP_SPACE, problem, limits) == []
