"""bench/parity.py's CPU-checkable parts: kernel loading, the float32 reference, the CPU exit."""

import importlib.util
import json
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


STANDIN = Path(__file__).resolve().parent / "data" / "gptq_awq_standin.py"


def test_int4_kernels_load_with_vllms_or_say_why_not(parity, tmp_path):
    kernels, notes = parity.load_kernels(str(tmp_path / "absent.py"), "int4_w4a16")
    assert sorted(kernels) == ["moetune"] and "int4 vllm kernel skipped" in notes[0]
    bf16_only = tmp_path / "bf16_only.py"
    bf16_only.write_text("fused_moe_kernel = None\n")
    kernels, notes = parity.load_kernels(str(bf16_only), "int4_w4a16")
    assert sorted(kernels) == ["moetune"] and "no fused_moe_kernel_gptq_awq" in notes[0]
    kernels, notes = parity.load_kernels(str(STANDIN), "int4_w4a16")
    assert sorted(kernels) == ["moetune", "vllm"] and notes == []


def int4_gemm1_error(parity, launcher, M=3):
    """GEMM1 of the tiny int4 shape through `launcher`, relative RMS error vs float32."""
    E, N, K, top_k, *_ = parity.SHAPES["tiny-int4"]
    group = parity.GROUP_SIZES["tiny-int4"]
    problem = parity.half_precision(
        make_problem(
            M * parity.TOKEN_SETS, E, N, K, top_k, "int4_w4a16", device="cpu", group_size=group
        )
    )
    _, a1, _, weights, ids = parity.token_sets(problem, M, top_k)[1]
    config = parity.TINY_INT4_CONFIGS["n32k64"]
    sorted_ids, expert_ids, num_post = align_block_size(ids, config["BLOCK_SIZE_M"], E)
    gate_up = torch.full((M * top_k, 2 * N), float("nan"), dtype=torch.float16)
    launcher(
        a1,
        problem.w1,
        gate_up,
        w_scale=problem.quant.w1_scale,
        w_zp=None,
        group_size=group,
        topk_weights=None,
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=num_post,
        mul_routed_weight=False,
        top_k=top_k,
        config=config,
    )
    ref1, _ = parity.reference(problem, a1, None, silu_and_mul(gate_up), None, weights, ids)
    return parity.rel_rms(ref1, gate_up)


def test_int4_vllm_launcher_passes_vllms_argument_order(parity):
    """The launcher feeds vLLM's parameter list right; the wrong stride order is caught."""
    right = parity.load_vllm_kernel(STANDIN, "fused_moe_kernel_gptq_awq")
    wrong = parity.load_vllm_kernel(STANDIN, "swapped_strides")
    assert int4_gemm1_error(parity, parity.vllm_wna16_launcher(right)) < 1e-3
    assert int4_gemm1_error(parity, parity.vllm_wna16_launcher(wrong)) > 0.1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (interpreter) path of --check-only")
def test_int4_check_only_runs_on_the_cpu(parity, tmp_path):
    """bench/parity.py's int4 mode end to end on a tiny shape: both GEMMs, both kernels."""
    out = tmp_path / "out"
    args = ["--shapes", "tiny-int4", "--batch-sizes", "3,20", "--check-only", "--out", str(out)]
    assert parity.main([*args, "--vllm-ref", str(STANDIN)]) == 0
    rows = json.loads((out / "parity.json").read_text())["rows"]
    assert [row["M"] for row in rows] == [3, 20]
    for row in rows:
        assert sorted(row["errors"]) == sorted(
            f"{k}|{c}" for k in ("vllm", "moetune") for c in parity.TINY_INT4_CONFIGS
        )
        for errors in row["errors"].values():
            assert isinstance(errors, list) and max(errors) < 1e-3, row["errors"]
    assert "| tiny-int4 | 20 | n64k32 |" in (out / "parity.md").read_text()


def test_unknown_shape_is_a_one_line_error(parity, capsys):
    assert parity.main(["--shapes", "nope", "--out", "/nonexistent/never-written"]) == 1
    assert capsys.readouterr().err.strip().startswith("Error: unknown shape(s) nope; known:")
