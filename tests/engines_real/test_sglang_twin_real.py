"""moetune's twin of SGLang 0.5.23's kernel against SGLang's own, compiled from the released file.

The twin (`moetune.kernel.fused_moe_kernel_sglang`) must take SGLang's parameters, so that
`moetune.engines.launch.sglang_0_5_23.launch` launches either kernel alike, and it must
compute what SGLang's computes: in Triton's interpreter, on the same launch, the two give
the same output bit for bit (fp16 output: the interpreter-only bf16 workaround of the twin
is not in play), on every quantization, up and down GEMM, with and without a K tail, with
SGLang's TMA operands and sorted C, and with swap_ab (programmatic dependent launch left
out: the interpreter has no gdc_wait). SASS identity is bench/sass_loop.py --sglang-ref's.
"""

import inspect
import os

import pytest
import torch

from moetune.engines.launch import sglang_0_5_23
from moetune.engines.launch.common import GemmCall
from moetune.engines.source import load_jit_functions
from moetune.kernel.align import align_block_size
from moetune.kernel.fused_moe import fused_moe, quantize_activation
from moetune.kernel.fused_moe_kernel_sglang import fused_moe_kernel as twin
from moetune.kernel.naive import naive_routing
from moetune.kernel.problem import make_problem

# Interpreter tests build their tensors on the CPU; `make test-gpu` runs them on the GPU.
DEVICE = "cuda" if os.environ.get("MOETUNE_GPU_TESTS") == "1" else "cpu"

pytestmark = [pytest.mark.engines, pytest.mark.reads_only("sglang")]
PDL_KEYS = ("USE_GDC", "GDC_EARLY", "launch_pdl")


@pytest.fixture
def sglang_kernel(sglang_installed):  # noqa: ANN001, ANN201
    path = sglang_installed.kernel_source
    return load_jit_functions(path, (sglang_0_5_23.KERNEL,))[sglang_0_5_23.KERNEL]


def test_twin_takes_sglangs_parameters(sglang_kernel) -> None:  # noqa: ANN001
    def described(kernel):  # noqa: ANN001, ANN202
        # (name, constexpr, default) of each parameter; a JIT or an interpreted function
        parameters = inspect.signature(kernel.fn).parameters.values()
        return [(p.name, "constexpr" in str(p.annotation), p.default) for p in parameters]

    assert described(twin) == described(sglang_kernel)
    assert described(twin)[-6:] == [
        ("FUSE_SWIGLU", True, False),
        ("USE_GDC", True, False),
        ("GDC_EARLY", True, False),
        ("A_OUTPUT_SLICES", True, 1),
        ("A_OUTPUT_SLICE_WIDTH", True, 0),
        ("A_OUTPUT_SLICE_K", True, 0),
    ]
    assert described(twin)[0] == ("a_ptr", False, inspect.Parameter.empty)


class _WithoutPdl:
    """A kernel launched with SGLang's keywords less programmatic dependent launch."""

    def __init__(self, kernel) -> None:  # noqa: ANN001
        self.kernel = kernel

    def __getitem__(self, grid):
        run = self.kernel[grid]
        return lambda *args, **kwargs: run(
            *args, **{key: value for key, value in kwargs.items() if key not in PDL_KEYS}
        )


def gemm_call(dtype, block_shape=None, *, down, tma="", bm=16, bn=32, bk=32, K=80, **extra):  # noqa: ANN001, ANN201
    """One GEMM launch with fp16 output (E=4, M=7 tokens, top-2, N=48): the up GEMM on the
    layer's x and w1, or the down GEMM on a random activation and w2 with routing weights.
    `tma`: "w" (B by descriptor), "c" (the up GEMM's C sorted), "aw" (the down GEMM's A,
    sorted, and B by descriptor)."""
    M, E, N, top_k = 7, 4, 48, 2
    p = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=bm + bn, **extra)
    weights, ids = naive_routing(p.router_logits, top_k)
    sorted_ids, expert_ids, num_post = align_block_size(ids, bm, E)
    slots, padded = M * top_k, sorted_ids.shape[0]
    if down:
        rows = padded if "a" in tma else slots
        generator = torch.Generator().manual_seed(1)
        a = torch.randn(rows, N, generator=generator).half()
        w, w_scale = p.w2, p.quant.w2_scale if p.quant else None
        c = torch.zeros(M, top_k, K, dtype=torch.float16)
    else:
        a, w, w_scale = p.x.half(), p.w1, p.quant.w1_scale if p.quant else None
        c = torch.zeros(padded if "c" in tma else slots, 2 * N, dtype=torch.float16)
    a, a_scale = quantize_activation(a, p.quant)
    return GemmCall(
        a,
        w,
        c,
        a_scale,
        w_scale,
        weights if down else None,
        sorted_ids,
        expert_ids,
        num_post,
        mul_routed_weight=down,
        top_k=1 if down else top_k,
        config=dict(
            BLOCK_SIZE_M=bm,
            BLOCK_SIZE_N=bn,
            BLOCK_SIZE_K=bk,
            GROUP_SIZE_M=1,
            num_warps=4,
            num_stages=2,
        ),
        quant_dtype=p.quant.dtype if p.quant else None,
        block_shape=block_shape,
        per_channel=p.quant.per_channel if p.quant else False,
        a_use_tma="a" in tma,
        w_use_tma="w" in tma,
        c_sorted="c" in tma,
    )


def outputs(kernel, call, capability=None):  # noqa: ANN001, ANN201
    """C after launching `kernel` on a fresh copy of `call`'s C."""
    fresh = GemmCall(**dict(vars(call), c=call.c.clone()))
    return sglang_0_5_23.launch(kernel, fresh, capability)


PATHS = [
    pytest.param("fp16", None, {}, id="fp16"),
    pytest.param("fp8_w8a8", None, {}, id="fp8-tensor"),
    pytest.param("fp8_w8a8", None, {"per_channel": True}, id="fp8-channel"),
    pytest.param("fp8_w8a8", (32, 32), {}, id="fp8-block-n-below-tile"),
    pytest.param("fp8_w8a8", (64, 32), {}, id="fp8-block-n-above-tile"),
    pytest.param("int8_w8a8", None, {}, id="int8-w8a8"),
    pytest.param("int8_w8a16", None, {}, id="int8-w8a16"),
]


@pytest.mark.parametrize(("dtype", "block_shape", "extra"), PATHS)
@pytest.mark.parametrize("down", [False, True], ids=["up", "down"])
@pytest.mark.parametrize("K", [64, 80], ids=["even-K", "K-tail"])
def test_twin_computes_what_sglang_computes(sglang_kernel, dtype, block_shape, extra, down, K):  # noqa: ANN001
    call = gemm_call(dtype, block_shape, down=down, K=K, **extra)
    mine, theirs = outputs(twin, call), outputs(sglang_kernel, call)
    assert mine.abs().sum() > 0
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize(
    ("dtype", "block_shape", "tma"),
    [
        pytest.param("fp16", None, "w", id="fp16-w"),
        pytest.param("fp16", None, "wc", id="fp16-w-c_sorted"),
        pytest.param("fp8_w8a8", (32, 32), "wc", id="fp8-block-w-c_sorted"),
        # SGLang's A descriptor is block fp8's: its kernel asserts so, which the
        # interpreter runs (compiled, a debug build's check only).
        pytest.param("fp8_w8a8", (32, 32), "aw", id="fp8-block-a-w"),
    ],
)
def test_twin_computes_what_sglang_computes_with_tma(sglang_kernel, dtype, block_shape, tma):  # noqa: ANN001
    call = gemm_call(dtype, block_shape, down="a" in tma, tma=tma)
    mine, theirs = outputs(twin, call), outputs(sglang_kernel, call)
    assert mine.abs().sum() > 0
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize(
    ("block_shape", "bm"),
    [
        pytest.param(None, 8, id="fp8-tensor-bm8"),
        pytest.param((32, 32), 8, id="fp8-block-bm8"),
        pytest.param((32, 32), 16, id="fp8-block-bm16"),
    ],
)
@pytest.mark.parametrize("down", [False, True], ids=["up", "down"])
def test_twin_computes_what_sglang_computes_with_swap_ab(sglang_kernel, block_shape, bm, down):  # noqa: ANN001
    # sm90's swap (BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64); BLOCK_SIZE_N above the
    # quantization block's N: with one weight scale per tile SGLang's kernel indexes a
    # scalar, which the interpreter (and compiled Triton 3.9) refuses.
    call = gemm_call("fp8_w8a8", block_shape, down=down, bm=bm, bn=64)
    assert sglang_0_5_23.swap_ab(call.config, call.quant_dtype, (9, 0))
    mine = outputs(_WithoutPdl(twin), call, (9, 0))
    theirs = outputs(_WithoutPdl(sglang_kernel), call, (9, 0))
    assert mine.abs().sum() > 0
    assert torch.equal(mine, theirs)


def test_whole_layer_on_the_twin_is_the_layer_on_sglangs_kernel(sglang_kernel) -> None:  # noqa: ANN001
    p = make_problem(9, 8, 48, 80, 2, "fp16", device=DEVICE, seed=2)

    class Launcher:
        def __init__(self, kernel) -> None:  # noqa: ANN001
            self.kernel = kernel

        def naive_assignment(self, *args) -> bool:  # noqa: ANN002
            return sglang_0_5_23.naive_assignment(*args)

        def split_configs(self, config, down_config):  # noqa: ANN001, ANN201
            from moetune.kernel.tma import split_configs

            return split_configs(config, down_config)  # SGLang reads an entry as moetune does

        def __call__(self, a, w, c, **launch):  # noqa: ANN001, ANN003, ANN204
            return sglang_0_5_23.launch(self.kernel, GemmCall(a, w, c, **launch))

    args = (p.x, p.w1, p.w2, p.router_logits, 2)
    cfg = dict(
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=2, num_warps=4, num_stages=2
    )
    down = dict(cfg, BLOCK_SIZE_N=64, BLOCK_SIZE_K=16, USE_TMA=False)
    mine = fused_moe(*args, config=cfg, down_config=down, gemm=Launcher(twin))
    theirs = fused_moe(*args, config=cfg, down_config=down, gemm=Launcher(sglang_kernel))
    assert torch.equal(mine, theirs)
