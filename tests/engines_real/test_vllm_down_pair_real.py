"""vLLM 0.34's down pair (``<name>_down.json``) on its own kernel, in Triton's interpreter.

A ``_down`` entry with ``USE_TMA`` true runs ``TritonExperts``' sorted path: the up GEMM
writes sorted rows (``C_IS_SORTED``) and the down GEMM reads them through TMA-A and
TMA-B (the interpreter emulates the descriptors, as on sm90). The whole call must match
the PyTorch reference; a guard entry runs the main entry alone; a call vLLM would not take
the path on is refused. Block fp8 [128, 128] with BLOCK_SIZE_N 256 (0.34's per-tile scale
does not compile on Triton 3.9 with a BLOCK_SIZE_N dividing the block).
"""

import os
from dataclasses import replace

import pytest

from moetune.engines.launch import EngineGemm, resolve_kernel
from moetune.kernel.config import Candidate
from moetune.kernel.fused_moe import fused_moe
from moetune.kernel.naive import naive_fused_moe
from moetune.kernel.probe import Probe
from moetune.kernel.problem import make_problem
from moetune.tune.measure.verify import compare

# Interpreter tests build their tensors on the CPU; `make test-gpu` runs them on the GPU.
DEVICE = "cuda" if os.environ.get("MOETUNE_GPU_TESTS") == "1" else "cpu"

pytestmark = [pytest.mark.engines, pytest.mark.release(vllm="0.34.0")]

UP = Candidate(16, 256, 128, 1, 4, 2)
DOWN = Candidate(64, 256, 128, 1, 4, 2)  # its BLOCK_SIZE_M is vLLM's to replace (the up's)
M, E, N, K, TOP_K = 6, 4, 128, 256, 2


def _gemm_and_calls(monkeypatch):
    import moetune.engines.launch.vllm_0_34 as release

    ref = resolve_kernel("vllm", "vllm").kernel
    assert ref.release == "0.34.0"
    calls = []
    launch = release._launch

    def spy(kernel, call, prepared, b_desc, tma_b, a_desc=None, c_sorted=False):
        calls.append((b_desc is not None, a_desc is not None, c_sorted, prepared.em))
        return launch(kernel, call, prepared, b_desc, tma_b, a_desc, c_sorted)

    monkeypatch.setattr(release, "_launch", spy)
    return EngineGemm(ref), calls


def _run(gemm, down_config, m=M, experts=E):
    p = make_problem(
        m, experts, N, K, TOP_K, "fp8_w8a8", block_shape=(128, 128), device=DEVICE, seed=3
    )
    out = fused_moe(
        p.x, p.w1, p.w2, p.router_logits, TOP_K,
        config=UP.as_config(), down_config=down_config, quant=p.quant, gemm=gemm,
    )  # fmt: skip
    ref = naive_fused_moe(p.x, p.w1, p.w2, p.router_logits, TOP_K, quant=p.quant)
    return compare(out, ref, "fp8_w8a8")


def test_the_sorted_pair_matches_the_reference_on_vllm_0_34s_kernel(monkeypatch):
    gemm, calls = _gemm_and_calls(monkeypatch)
    pair = Probe("pair", UP, False, replace(DOWN, BLOCK_SIZE_M=16), True)
    result = _run(gemm, pair.down_config())
    assert result.ok, result
    (up, down) = calls
    assert up[2] and not up[1]  # the up GEMM writes sorted rows
    assert down[0] and down[1] and not down[2]  # the down GEMM reads them through TMA-A, TMA-B
    assert down[3] >= up[3]  # EM: the sorted ids' whole length, no small-batch cap


def test_a_guard_entry_and_an_entry_without_use_tma_run_the_main_entry(monkeypatch):
    gemm, calls = _gemm_and_calls(monkeypatch)
    for down_config in ({"USE_TMA": False}, DOWN.as_config()):
        calls.clear()
        assert _run(gemm, down_config).ok
        assert not any(a_desc or c_sorted for _, a_desc, c_sorted, _ in calls)


def test_a_sorted_call_vllm_would_not_take_is_refused(monkeypatch):
    gemm, _ = _gemm_and_calls(monkeypatch)
    sorted_down = {**DOWN.as_config(), "USE_TMA": True}
    # M * top_k * 4 <= E: vLLM skips the alignment, and with it the sorted path.
    with pytest.raises(ValueError, match="the engine skips at this batch size"):
        _run(gemm, sorted_down, m=1, experts=8)
    # The down tile must divide the hidden size.
    with pytest.raises(ValueError, match="hidden size 256 divisible by the down BLOCK_SIZE_N"):
        _run(gemm, {**sorted_down, "BLOCK_SIZE_N": 512})


def test_the_split_searchs_probes_run_on_vllm_0_34s_kernel():
    """What the tune times (`moetune.tune.search.split_vllm`): the down GEMM alone on the
    sorted path, and the pair checked against the reference, through the worker's inputs."""
    from moetune.tune.measure.probe_timing import measure_probe
    from moetune.tune.measure.worker import _Inputs
    from moetune.tune.problem import TuneProblem

    ref = resolve_kernel("vllm", "vllm").kernel
    problem = TuneProblem(E, N, K, TOP_K, "fp8_w8a8", (128, 128), kernel=ref)
    inputs = _Inputs()
    down = measure_probe(problem, 8, "quick", Probe("down", UP, True), inputs.get(problem, 8, 0))
    assert down.status == "ok" and down.latency_us > 0, down
    pair = Probe("pair", UP, False, UP, True)
    checked = measure_probe(problem, 8, "verify", pair, inputs.get(problem, 8, 1234))
    assert checked.status == "ok" and checked.rel_rms < 0.06, checked
