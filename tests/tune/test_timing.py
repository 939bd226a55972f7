"""The timing harness: percentiles, the CPU fallback, and (on a GPU) CUDA-graph timing."""

import os

import pytest

from moetune.tune.measure.timing import FIDELITIES, fidelity_of, summarize, time_fused_moe

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 32,
    "BLOCK_SIZE_K": 32,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 2,
}


def test_summarize_gives_median_and_20th_80th_percentiles():
    samples = [float(v) for v in range(1, 12)]  # 1 .. 11
    median, p20, p80 = summarize(samples)
    assert median == 6.0
    assert p20 == pytest.approx(3.0)
    assert p80 == pytest.approx(9.0)
    assert summarize([4.0]) == (4.0, 4.0, 4.0)


def test_unknown_fidelity_is_refused():
    with pytest.raises(ValueError, match="unknown fidelity 'slow'"):
        fidelity_of("slow")
    assert FIDELITIES["full"].replays > FIDELITIES["quick"].replays


@pytest.mark.skipif(GPU, reason="the CPU path runs under the Triton interpreter only")
def test_cpu_fallback_times_eager_calls_and_keeps_compile_apart():
    from moetune.kernel.problem import make_problem

    problem = make_problem(3, 4, 32, 64, 2, "bf16", device="cpu")
    timing = time_fused_moe(problem, CONFIG, "quick")
    assert timing.replays == 1 and timing.calls_per_replay == 1
    assert timing.median_us > 0 and timing.compile_s > 0
    assert timing.p20_us <= timing.median_us <= timing.p80_us


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (MOETUNE_GPU_TESTS=1)")
def test_cuda_graph_timing_is_stable_and_excludes_compile():
    from moetune.kernel.problem import make_problem

    problem = make_problem(64, 8, 256, 512, 2, "bf16", device="cuda")
    first = time_fused_moe(problem, CONFIG, "full")
    second = time_fused_moe(problem, CONFIG, "full")
    assert first.replays == FIDELITIES["full"].replays
    assert first.calls_per_replay >= 1
    # The second run finds the kernels compiled: its latency stays, its compile time drops.
    assert second.compile_s < first.compile_s
    assert second.median_us == pytest.approx(first.median_us, rel=0.25)
    assert first.median_us * 1e-6 < first.compile_s
