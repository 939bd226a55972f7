"""moetune's twin of SGLang 0.5.23's kernel, launched as SGLang launches it, against the reference.

The twin (`moetune.kernel.fused_moe_kernel_sglang`) takes SGLang's parameters, so
`moetune.engines.launch.sglang_0_5_23.launch` launches it as SGLang's own kernel; here
it runs the whole MoE layer (`fused_moe` with the twin as its GEMM: up GEMM, SiLU-and-mul,
down GEMM with the routing weights) and must match `moetune.kernel.naive`, on every
quantization it serves, with K a multiple of BLOCK_SIZE_K (even_Ks) and not, with SGLang's
TMA operands and sorted intermediate, and with swap_ab.

CPU: Triton's interpreter (its bf16 quirks are worked around inside the kernel under the
interpreter only, see the kernel's docstring). On sm90 SGLang's launcher turns on
programmatic dependent launch with swap_ab, and the interpreter has no ``gdc_wait``:
launched exactly so the swap fails there (strict xfail, as SGLang's own kernel does in
tests/engines_real), so the swap is checked with PDL left out of the launch (it changes
no number). GPU (MOETUNE_GPU_TESTS=1): the same cases compiled, on the device's capability.
"""

import os

import pytest
import torch
from triton.runtime.errors import InterpreterError

from moetune.engines.launch import sglang_0_5_23
from moetune.engines.launch.common import GemmCall
from moetune.kernel.align import align_block_size
from moetune.kernel.compare import assert_close
from moetune.kernel.fused_moe import fused_moe
from moetune.kernel.fused_moe_kernel_sglang import fused_moe_kernel
from moetune.kernel.naive import naive_fused_moe
from moetune.kernel.problem import make_problem
from moetune.kernel.tma import split_configs

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"
SM90 = (9, 0)
PDL_KEYS = ("USE_GDC", "GDC_EARLY", "launch_pdl")


def config(bm=16, bn=32, bk=32, group=1, **extra):  # noqa: ANN001, ANN201
    return dict(
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        BLOCK_SIZE_K=bk,
        GROUP_SIZE_M=group,
        num_warps=4,
        num_stages=2,
        **extra,
    )


class _Launches:
    """The twin as SGLang's launcher sees it, recording each launch's (args, kwargs).

    `pdl` False drops programmatic dependent launch from the keywords; `override`
    replaces some of them.
    """

    def __init__(self, pdl: bool = True, override: dict | None = None) -> None:
        self.pdl, self.override, self.seen = pdl, override or {}, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if not self.pdl:
                kwargs = {key: value for key, value in kwargs.items() if key not in PDL_KEYS}
            kwargs.update(self.override)
            self.seen.append((args, kwargs))
            return fused_moe_kernel[grid](*args, **kwargs)

        return launch


class SGLangTwin:
    """`fused_moe`'s GEMM (as `moetune.engines.launch.EngineGemm`): the twin launched by
    SGLang 0.5.23's launcher at `capability` (None: no CUDA device, as in the interpreter)."""

    def __init__(self, capability=None, *, pdl: bool = True) -> None:  # noqa: ANN001
        if capability is None and GPU:
            capability = torch.cuda.get_device_capability()
        self.capability = capability
        self.kernel = _Launches(pdl)

    def naive_assignment(self, *args) -> bool:  # noqa: ANN002
        return sglang_0_5_23.naive_assignment(*args)

    def split_configs(self, config, down_config):  # noqa: ANN001, ANN201
        return split_configs(config, down_config)  # SGLang reads an entry as moetune does

    def __call__(self, a, w, c, **launch):  # noqa: ANN001, ANN003, ANN204
        return sglang_0_5_23.launch(self.kernel, GemmCall(a, w, c, **launch), self.capability)

    def flags(self, key: str) -> list:
        """The keyword `key` of each launch so far."""
        return [kwargs[key] for _, kwargs in self.kernel.seen]

    def descriptors(self) -> list[tuple[bool, bool]]:
        """(A by TMA, B by TMA) of each launch so far (arguments 1 and 3: a_desc, b_desc)."""
        return [(args[1] is not None, args[3] is not None) for args, _ in self.kernel.seen]


def run_layer(gemm, M, E, N, K, top_k, dtype, cfg, block_shape=None, down_config=None, seed=0):  # noqa: ANN001
    """The layer on the twin, and the reference: (out, ref)."""
    p = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=seed)
    args = (p.x, p.w1, p.w2, p.router_logits, top_k)
    out = fused_moe(*args, config=cfg, down_config=down_config, quant=p.quant, gemm=gemm)
    assert out.shape == (M, K) and out.dtype == p.x.dtype
    return out, naive_fused_moe(*args, quant=p.quant)


# (dtype, block_shape, allowed rel. RMS error): tests/kernel/test_fused_moe.py's, and for
# w8a8 the tuner's own bar (moetune.tune.measure.verify): one token quantized to 8 bits
# is 5.6 % off at M=1 on fp8 per tensor, bit for bit as on the vLLM twin.
DTYPES = [
    pytest.param("fp16", None, 1e-3, id="fp16"),
    pytest.param("bf16", None, 1.5e-2, id="bf16"),
    pytest.param("fp8_w8a8", None, 6e-2, id="fp8-tensor"),
    pytest.param("fp8_w8a8-channel", None, 6e-2, id="fp8-channel"),
    pytest.param("fp8_w8a8", (32, 32), 6e-2, id="fp8-block32"),
    pytest.param("fp8_w8a8", (128, 128), 6e-2, id="fp8-block128"),
    pytest.param("int8_w8a8", None, 6e-2, id="int8-w8a8"),
    pytest.param("int8_w8a16", None, 1.5e-2, id="int8-w8a16"),
]
# (M, E, top_k, N, K): K=64 is a multiple of BLOCK_SIZE_K 32 (even_Ks), K=80 is not;
# N=48 leaves BLOCK_SIZE_N 32 a ragged last tile; M=1 is one token.
SHAPES = [(1, 8, 2, 48, 64), (7, 8, 2, 48, 80)]
if GPU:
    SHAPES += [(333, 64, 8, 768, 2048), (64, 256, 8, 256, 7168)]


def _problem_dtype(dtype: str) -> tuple[str, dict]:
    if dtype.endswith("-channel"):
        return dtype.removesuffix("-channel"), {"per_channel": True}
    return dtype, {}


@pytest.mark.parametrize(("dtype", "block_shape", "tol"), DTYPES)
@pytest.mark.parametrize(("M", "E", "top_k", "N", "K"), SHAPES, ids=lambda v: str(v))
def test_twin_matches_the_reference(M, E, top_k, N, K, dtype, block_shape, tol, poison_empty):  # noqa: ANN001
    dtype, extra = _problem_dtype(dtype)
    p = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=M * E, **extra)
    gemm = SGLangTwin()
    args = (p.x, p.w1, p.w2, p.router_logits, top_k)
    out = fused_moe(*args, config=config(), quant=p.quant, gemm=gemm)
    assert_close(f"twin {dtype}", naive_fused_moe(*args, quant=p.quant), out, tol)
    assert gemm.flags("even_Ks") == [K % 32 == 0, N % 32 == 0]  # up GEMM's K, then down's
    assert gemm.flags("MUL_ROUTED_WEIGHT") == [False, True]
    assert set(gemm.flags("swap_ab")) == {False}  # no device: SGLang does not swap


@pytest.mark.parametrize(
    ("dtype", "block_shape", "bn"),
    [
        pytest.param("fp8_w8a8", None, 64, id="fp8-tensor"),
        pytest.param("fp8_w8a8-channel", None, 64, id="fp8-channel"),
        pytest.param("fp8_w8a8", (32, 32), 64, id="block-n-below-tile"),  # a scale per column
        pytest.param("fp8_w8a8", (64, 32), 64, id="block-n-is-tile"),  # one scale per tile
    ],
)
@pytest.mark.parametrize("bm", [8, 16])
def test_swap_ab_matches_the_reference(dtype, block_shape, bn, bm, poison_empty):  # noqa: ANN001
    # sm90's launch (SGLang swaps fp8 there for BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64),
    # without PDL: the interpreter has no gdc_wait. The interpreter runs any tile.
    dtype, extra = _problem_dtype(dtype)
    gemm = SGLangTwin(SM90, pdl=GPU)
    p = make_problem(9, 8, 64, 96, 2, dtype, block_shape, device=DEVICE, seed=bm, **extra)
    args = (p.x, p.w1, p.w2, p.router_logits, 2)
    out = fused_moe(*args, config=config(bm=bm, bn=bn), quant=p.quant, gemm=gemm)
    assert_close(f"swap_ab {dtype}", naive_fused_moe(*args, quant=p.quant), out, 4e-2)
    assert gemm.flags("swap_ab") == [True, True]


@pytest.mark.skipif(GPU, reason="the interpreter's limit")
@pytest.mark.xfail(
    raises=InterpreterError,
    strict=True,
    reason="SGLang's launch turns on PDL with swap_ab on sm90, and Triton's interpreter (3.9) "
    "cannot run tl.extra.cuda.gdc_wait; it runs on a GPU",
)
def test_swap_ab_launched_as_on_sm90():
    run_layer(SGLangTwin(SM90), 3, 8, 64, 64, 2, "fp8_w8a8", config(bm=8, bn=64), (64, 32))


# The dtypes SGLang runs with USE_TMA (bf16, and block fp8 in its H200 files); fp16 too.
TMA_DTYPES = [
    pytest.param("fp16", None, 1e-3, id="fp16"),
    pytest.param("bf16", None, 1.5e-2, id="bf16"),
    pytest.param("fp8_w8a8", (32, 32), 4e-2, id="fp8-block32"),
]


@pytest.mark.parametrize(("dtype", "block_shape", "tol"), TMA_DTYPES)
@pytest.mark.parametrize(
    ("up_tma", "down_tma"), [(True, False), (False, True), (True, True)], ids=str
)
def test_tma_and_sorted_intermediate_match_the_reference(
    dtype, block_shape, tol, up_tma, down_tma, poison_empty
):  # noqa: ANN001
    # A TMA down entry: the up GEMM writes C sorted, the down GEMM reads it and w2 by TMA.
    gemm = SGLangTwin()
    out, ref = run_layer(
        gemm,
        7,
        4,
        48,
        80,
        2,
        dtype,
        config(USE_TMA=up_tma),
        block_shape,
        down_config=config(bn=64, bk=16 if dtype != "fp8_w8a8" else 32, USE_TMA=down_tma),
        seed=5,
    )
    assert_close(f"tma {dtype}", ref, out, tol)
    assert gemm.flags("c_sorted") == [down_tma, False]
    assert gemm.descriptors() == [(False, up_tma), (down_tma, down_tma)]
    assert gemm.flags("even_Ks") == [False, dtype != "fp8_w8a8"]  # K=80 by 32; N=48 by 16, 32


def _gemm_inputs(E=3, M=9, top_k=2, N=32, K=64, bm=16):  # noqa: ANN001, ANN202
    """fp16 up-GEMM inputs: x, w, the flat expert ids of the slots and their alignment."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, K, generator=generator).half().to(DEVICE)
    w = (torch.randn(E, N, K, generator=generator) / 8).half().to(DEVICE)
    ids = torch.randint(0, E, (M, top_k), generator=generator, dtype=torch.int32).to(DEVICE)
    return x, w, ids.reshape(-1), *align_block_size(ids, bm, E)


@pytest.mark.parametrize("c_sorted", [False, True])
def test_a_block_of_no_local_expert(c_sorted):  # noqa: ANN001
    """Expert -1: the block's slots get zeros; in a sorted C its rows are left as they were
    (the next GEMM never reads them)."""
    x, w, slot_experts, sorted_ids, expert_ids, num_post = _gemm_inputs()
    expert_ids[0] = -1
    slots, bm = slot_experts.numel(), 16
    rows = sorted_ids.shape[0] if c_sorted else slots
    c = torch.full((rows, w.shape[1]), float("nan"), dtype=torch.float16, device=DEVICE)
    call = GemmCall(
        x, w, c, None, None, None, sorted_ids, expert_ids, num_post, False, 2, config(bm=bm),
        None, None, c_sorted=c_sorted,
    )  # fmt: skip
    sglang_0_5_23.launch(SGLangTwin().kernel, call)
    # Row p of C holds slot sorted_ids[p] (c_sorted) or row s holds slot s.
    positions = torch.arange(sorted_ids.shape[0], device=DEVICE)
    valid = sorted_ids < slots
    skipped, computed = valid & (positions < bm), valid & (positions >= bm)
    assert skipped.any() and computed.any()
    slot_of = sorted_ids.long()
    row = positions if c_sorted else slot_of
    if c_sorted:
        assert torch.isnan(c[row[skipped]]).all(), "a sorted C keeps an expert -1 block's rows"
    else:
        assert (c[row[skipped]] == 0).all(), "an expert -1 block stores zeros"
    done = slot_of[computed]
    expected = torch.einsum("sk,snk->sn", x[done // 2].float(), w[slot_experts[done]].float())
    assert_close("computed rows", expected, c[row[computed]], 2e-3)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ({"FUSE_SWIGLU": True}, "fused SwiGLU"),
        ({"FUSE_ADD_TO_OUTPUT": True}, "LoRA output"),
        ({"MASK_OUTPUT": True}, "LoRA output"),
        ({"FUSE_SUM_ALL_REDUCE": True}, "all-reduce"),
        ({"A_OUTPUT_SLICES": 2}, "one output slice"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_paths_sglang_does_not_take_by_default_are_refused(flag, message):  # noqa: ANN001
    x, w, _, sorted_ids, expert_ids, num_post = _gemm_inputs()
    c = torch.zeros(x.shape[0] * 2, w.shape[1], dtype=torch.float16, device=DEVICE)
    call = GemmCall(
        x, w, c, None, None, None, sorted_ids, expert_ids, num_post, False, 2, config(), None, None
    )  # fmt: skip
    sglang_0_5_23.launch(_Launches(), call)  # as launched: runs
    with pytest.raises(Exception, match=message):  # noqa: PT011 - interpreter or compiler error
        sglang_0_5_23.launch(_Launches(override=flag), call)
