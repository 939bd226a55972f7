"""The engines' own Triton kernels, loaded from the released files, against the PyTorch reference.

`moetune.engines.source` compiles each release's ``fused_moe_kernel`` from
`InstalledEngine.kernel_source` (fixtures `vllm_installed`, `sglang_installed` in
conftest.py) without importing the engine, and `moetune.engines.launch` launches it as
that release does. Here the whole MoE call on those kernels runs in Triton's
interpreter on small shapes and must match `moetune.kernel.naive` (fp16 and fp8: the
interpreter's bf16 dot is wrong, see moetune/kernel/fused_moe_kernel.py), on vLLM's
aligned and naive (decode) paths and, forced, with SWAP_AB and 8-row tiles.
"""

import os
import shutil
from dataclasses import replace

import pytest
from triton.runtime.errors import InterpreterError

from moetune.engines.launch import (
    EngineGemm,
    KernelChoiceError,
    resolve_kernel,
    resolve_kernels,
)
from moetune.kernel.fused_moe import fused_moe
from moetune.kernel.naive import naive_fused_moe
from moetune.kernel.problem import make_problem
from moetune.tune.measure.verify import compare

# Interpreter tests build their tensors on the CPU; `make test-gpu` runs them on the GPU.
DEVICE = "cuda" if os.environ.get("MOETUNE_GPU_TESTS") == "1" else "cpu"

pytestmark = pytest.mark.engines


def config(bm=16, bn=32, bk=32, group=1):  # noqa: ANN001, ANN201
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": group,
        "num_warps": 4,
        "num_stages": 2,
    }


def engine_gemm(engine: str, capability=None) -> EngineGemm:  # noqa: ANN001
    ref = resolve_kernel(engine, engine).kernel
    gemm = EngineGemm(ref)
    gemm.capability = capability  # the swap rule reads it; None: no CUDA device
    return gemm


def check(gemm, M, E, dtype, cfg, block_shape=None, N=48, K=64, top_k=2):  # noqa: ANN001
    p = make_problem(M, E, N, K, top_k, dtype, block_shape=block_shape, device=DEVICE, seed=3)
    out = fused_moe(p.x, p.w1, p.w2, p.router_logits, top_k, config=cfg, quant=p.quant, gemm=gemm)
    ref = naive_fused_moe(p.x, p.w1, p.w2, p.router_logits, top_k, quant=p.quant)
    result = compare(out, ref, dtype)
    assert result.ok, result
    quant_dtype = p.quant.dtype if p.quant is not None else None
    return gemm.naive_assignment(M * top_k, E, quant_dtype, block_shape)


def test_auto_picks_each_installed_engines_kernel(
    vllm_installed, sglang_installed, site_releases
) -> None:  # noqa: ANN001
    kernels, notes = resolve_kernels("auto", ("vllm", "sglang"))
    assert notes == []
    assert kernels["vllm"].source == str(vllm_installed.kernel_source)
    assert kernels["sglang"].source == str(sglang_installed.kernel_source)
    assert kernels["vllm"].tag().startswith(f"vllm-{site_releases['vllm']}@")
    assert kernels["sglang"].tag().startswith(f"sglang-{site_releases['sglang']}@")


@pytest.mark.parametrize(
    ("M", "E", "naive"),
    [(5, 4, False), (1, 16, True)],  # aligned; naive: M * top_k * 4 <= E
    ids=["aligned", "naive"],
)
def test_vllm_kernel_matches_the_reference(vllm_installed, M, E, naive) -> None:  # noqa: ANN001
    assert check(engine_gemm("vllm"), M, E, "fp16", config()) is naive


def test_vllm_kernel_fp8_block_clamps_block_k(vllm_installed) -> None:  # noqa: ANN001
    # BLOCK_SIZE_K 64 over a 32-wide quantization block: vLLM's launcher clamps it to 32.
    # BLOCK_SIZE_N 64 spans two blocks: 0.34's one-scale-per-tile path (BLOCK_SIZE_N dividing
    # the block) does not compile on Triton 3.9 (test_vllm_releases_real.py says so).
    check(engine_gemm("vllm"), 5, 8, "fp8_w8a8", config(bn=64, bk=64), block_shape=(32, 32), N=64)


@pytest.mark.parametrize(("M", "E"), [(2, 32), (9, 8)], ids=["naive", "aligned"])
def test_vllm_kernel_swap_ab_with_eight_row_tiles(vllm_installed, M, E) -> None:  # noqa: ANN001
    # The capability vLLM swaps on (sm90), forced: the interpreter runs any tile.
    gemm = engine_gemm("vllm", capability=(9, 0))
    check(gemm, M, E, "fp8_w8a8", config(bm=8, bn=64), block_shape=(32, 32), N=64)
    check(gemm, M, E, "fp8_w8a8", config(bm=16, bn=64), N=64)  # per-tensor fp8


@pytest.mark.reads_only("sglang")
@pytest.mark.parametrize("M", [1, 5])
def test_sglang_kernel_matches_the_reference(sglang_installed, M) -> None:  # noqa: ANN001
    gemm = engine_gemm("sglang")
    assert check(gemm, M, 8, "fp16", config()) is False  # SGLang always aligns
    check(gemm, M, 8, "fp8_w8a8", config(), block_shape=(32, 32), N=64)  # N % 32: SGLang loads it


@pytest.mark.reads_only("sglang")
@pytest.mark.xfail(
    raises=InterpreterError,
    strict=True,
    reason="launched as on sm90, SGLang's kernel waits on programmatic dependent launch "
    "(tl.extra.cuda.gdc_wait), which Triton's interpreter (3.9) cannot run; swap_ab without "
    "PDL runs in tests/engines_real/test_sglang_twin_real.py, and on a GPU",
)
def test_sglang_kernel_swap_ab(sglang_installed) -> None:  # noqa: ANN001
    gemm = engine_gemm("sglang", capability=(9, 0))
    check(gemm, 3, 8, "fp8_w8a8", config(bm=8, bn=64), block_shape=(64, 32), N=64)


@pytest.mark.release(vllm="0.33.0")
def test_unknown_release_and_broken_source(tmp_path, monkeypatch, vllm_installed) -> None:  # noqa: ANN001
    # A copy of 0.33.0 with another version (0.33.7), then a source without the kernel.
    site = tmp_path / "site"
    shutil.copytree(vllm_installed.root, site / "vllm")
    dist = site / "vllm-0.33.7.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.7\n")
    (site / "vllm" / "_version.py").unlink(missing_ok=True)
    monkeypatch.syspath_prepend(str(site))
    auto = resolve_kernel("auto", "vllm")
    assert auto.kernel.version == "0.33.7" and auto.kernel.release == "0.33.0"
    assert auto.note == "vLLM 0.33.7: its kernel is launched as vLLM 0.33.0 launches it"
    with pytest.raises(KernelChoiceError, match="supported: 0.33.0"):
        resolve_kernel("vllm", "vllm")
    kernel_file = site / "vllm" / "model_executor" / "layers" / "fused_moe" / "fused_moe.py"
    kernel_file.write_text("def fused_moe_kernel():\n    pass\n")
    broken = resolve_kernel("auto", "vllm")
    assert broken.kernel is None and "has no @triton.jit fused_moe_kernel" in broken.note
    assert "\n" not in broken.note


def test_the_store_key_names_the_release_timed(vllm_installed) -> None:  # noqa: ANN001
    from moetune.tune.problem import TuneProblem

    ref = resolve_kernel("auto", "vllm").kernel
    problem = replace(TuneProblem(8, 48, 64, 2, "fp16"), kernel=ref)
    assert problem.key().endswith(f",kernel={ref.tag()}")
