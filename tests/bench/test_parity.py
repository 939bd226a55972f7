"""bench/parity.py's CPU-checkable parts: kernel loading, the float32 reference, the CPU exit."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from moetune.kernel.activation import silu_and_mul
from moetune.kernel.align import align_block_size
from moetune.kernel.problem import make_problem

PARITY = Path(__file__).resolve().parents[2] / "bench" / "parity.py"
CONFIG = dict(
    BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2
)


@pytest.fixture(scope="module")
def parity():
    spec = importlib.util.spec_from_file_location("bench_parity", PARITY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_missing_vllm_source_is_skipped_and_said(parity, tmp_path):
    kernels, notes = parity.load_kernels(str(tmp_path / "absent.py"))
    assert sorted(kernels) == ["before", "moetune"]
    assert len(notes) == 1 and "vllm kernel skipped" in notes[0]


def test_both_moetune_kernels_match_the_reference(parity):
    """The reference and the two kernels agree: what the GPU run's error check relies on."""
    M, E, N, K, top_k = 5, 4, 32, 64, 2
    problem = make_problem(M * parity.TOKEN_SETS, E, N, K, top_k, "fp16", device="cpu", seed=2)
    kernels, _ = parity.load_kernels(None)
    _, a1, a1_scale, weights, ids = parity.token_sets(problem, M, top_k)[3]
    alignment = dict(
        zip(
            ("sorted_token_ids", "expert_ids", "num_tokens_post_padded"),
            align_block_size(ids, CONFIG["BLOCK_SIZE_M"], E),
            strict=True,
        )
    )
    common = dict(config=CONFIG, quant_dtype=None, block_shape=None, **alignment)
    for name in ("moetune", "before"):
        gate_up = torch.full((M * top_k, 2 * N), float("nan"), dtype=torch.float16)
        kernels[name](
            a1,
            problem.w1,
            gate_up,
            a_scale=None,
            w_scale=None,
            topk_weights=None,
            mul_routed_weight=False,
            top_k=top_k,
            **common,
        )
        act = silu_and_mul(gate_up)
        down = torch.full((M, top_k, K), float("nan"), dtype=torch.float16)
        kernels[name](
            act,
            problem.w2,
            down,
            a_scale=None,
            w_scale=None,
            topk_weights=weights,
            mul_routed_weight=True,
            top_k=1,
            **common,
        )
        ref1, ref2 = parity.reference(problem, a1, a1_scale, act, None, weights, ids)
        assert parity.rel_rms(ref1, gate_up) < 1e-3, name
        assert parity.rel_rms(ref2, down.view(-1, K)) < 1e-3, name


def test_configs_add_vllms_published_entry_once(parity):
    configs = parity.configs_for("qwen3-30b-a3b-tp1", 256)
    assert configs["vllm-file"] == parity.cfg("32/256/128/16/4/2")
    assert "vllm-file" not in parity.configs_for("qwen3-30b-a3b-tp1", 4096)  # same as t256


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_is_a_one_line_error(parity, capsys):
    assert parity.main(["--out", "/nonexistent/never-written"]) == 1
    assert capsys.readouterr().err.strip() == "Error: bench/parity.py needs a CUDA GPU"
