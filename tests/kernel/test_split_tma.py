"""SGLang's split up/down configs and TMA (moetune.kernel.tma), against the float32 reference.

CPU: the checks are pure Python; the kernels run in Triton's interpreter, which
supports host-side tensor descriptors (checked with Triton 3.9), so the TMA paths are
tested on CPU too. GPU (MOETUNE_GPU_TESTS=1): the same cases compiled, plus real
shapes, where TMA is the hardware unit rather than the interpreter's emulation.
"""

import os

import pytest
import torch

from moetune.errors import MoetuneError
from moetune.kernel.align import align_block_size
from moetune.kernel.compare import assert_close
from moetune.kernel.fused_moe import fused_experts, fused_moe
from moetune.kernel.fused_moe_kernel import invoke_fused_moe_gemm
from moetune.kernel.naive import naive_fused_experts, naive_fused_moe, naive_routing
from moetune.kernel.problem import make_problem
from moetune.kernel.tma import (
    SplitConfigError,
    check_tma_operand,
    check_tma_quant,
    split_configs,
    tma_supported,
)

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"
needs_tma = pytest.mark.skipif(
    not tma_supported(), reason="this Triton has no triton.tools.tensor_descriptor"
)

UP = dict(
    BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2
)
# A down tile unlike the up one in every key but BLOCK_SIZE_M.
DOWN = dict(
    BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=4, num_warps=8, num_stages=3
)

# (dtype, block_shape, tol): tolerances of tests/kernel/test_fused_moe.py.
ALL_DTYPES = [
    pytest.param("fp16", None, 1e-3, id="fp16"),
    pytest.param("bf16", None, 1.5e-2, id="bf16"),
    pytest.param("fp8_w8a8", None, 4e-2, id="fp8"),
    pytest.param("fp8_w8a8", (128, 128), 4e-2, id="fp8-block128"),
    pytest.param("int8_w8a16", None, 1.5e-2, id="int8w8a16"),
]
# The dtypes SGLang runs with USE_TMA (bf16: PR #34150; block fp8: its H200 files).
TMA_DTYPES = [
    pytest.param("fp16", None, 1e-3, id="fp16"),
    pytest.param("bf16", None, 1.5e-2, id="bf16"),
    pytest.param("fp8_w8a8", (128, 128), 4e-2, id="fp8-block128"),
]
# (M, E, top_k, N, K): K not a multiple of 64 exercises TMA's zero fill past the edge.
SHAPES = [(7, 5, 2, 64, 128), (33, 4, 3, 48, 96), (1, 8, 2, 32, 64)]
if GPU:
    SHAPES += [(512, 128, 8, 768, 2048), (256, 256, 8, 256, 7168)]


# ---- split_configs: pure ----


def test_no_down_config_runs_the_up_tile_without_tma():
    split = split_configs(dict(UP, USE_TMA=True), None)
    assert split.up == UP and split.down == UP
    assert split.up_tma and not split.down_tma


def test_down_config_and_its_tma_flag_are_separate_from_the_up_ones():
    up, down = dict(UP), dict(DOWN, USE_TMA=True)
    split = split_configs(up, down)
    assert split.up == UP and split.down == DOWN
    assert not split.up_tma and split.down_tma
    assert down == dict(DOWN, USE_TMA=True) and up == UP, "inputs must not be modified"


def test_different_block_size_m_is_a_one_line_value_error():
    with pytest.raises(ValueError) as info:
        split_configs(UP, dict(DOWN, BLOCK_SIZE_M=64))
    assert isinstance(info.value, MoetuneError)
    message = str(info.value)
    assert "BLOCK_SIZE_M=64" in message and "16" in message and "\n" not in message


def test_tma_flag_must_be_a_bool():
    with pytest.raises(SplitConfigError, match="USE_TMA must be true or false"):
        split_configs(UP, dict(DOWN, USE_TMA="yes"))


def test_fused_experts_refuses_a_mismatched_pair_before_any_launch():
    problem = make_problem(4, 4, 32, 64, 2, "fp16", device=DEVICE, seed=1)
    weights, ids = naive_routing(problem.router_logits, 2)
    with pytest.raises(SplitConfigError, match="one alignment serves both GEMMs"):
        fused_experts(
            problem.x,
            problem.w1,
            problem.w2,
            weights,
            ids,
            config=UP,
            down_config=dict(DOWN, BLOCK_SIZE_M=32),
        )


# ---- TMA argument checks: pure ----


@pytest.mark.parametrize("dtype,block_shape", [(None, None), ("fp8_w8a8", (128, 128))])
def test_tma_quantizations_sglang_runs_are_accepted(dtype, block_shape):
    check_tma_quant(dtype, block_shape)


@pytest.mark.parametrize(
    "dtype,what", [("fp8_w8a8", "fp8_w8a8 per-tensor"), ("int8_w8a16", "int8_w8a16")]
)
def test_other_tma_quantizations_are_refused(dtype, what):
    with pytest.raises(SplitConfigError, match=f"not {what}$"):
        check_tma_quant(dtype, None)


GOOD = dict(
    name="A", shape=(64, 128), strides=(128, 1), element_bytes=2, data_ptr=4096, block=(16, 32)
)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(strides=(1, 64)), "contiguous in its last dimension"),
        (dict(data_ptr=4098), "16-byte aligned address"),
        (dict(shape=(64, 20), strides=(20, 1)), "stride 20 of dimension 0 is 40 bytes"),
        (dict(block=(16, 512)), "power of two <= 256"),
        (dict(block=(24, 32)), "power of two <= 256"),
        (dict(element_bytes=1, block=(16, 8)), "spans 8 bytes, TMA needs at least 16"),
    ],
)
def test_tma_operand_rules(change, message):
    check_tma_operand(**GOOD)
    with pytest.raises(SplitConfigError, match=message):
        check_tma_operand(**dict(GOOD, **change))


def test_tma_without_descriptor_support_is_a_clear_error(monkeypatch):
    import moetune.kernel.tma as tma

    monkeypatch.setattr(tma, "tma_supported", lambda: False)
    problem = make_problem(4, 4, 32, 64, 2, "fp16", device=DEVICE, seed=1)
    weights, ids = naive_routing(problem.router_logits, 2)
    with pytest.raises(SplitConfigError, match="needs triton.tools.tensor_descriptor"):
        fused_experts(
            problem.x,
            problem.w1,
            problem.w2,
            weights,
            ids,
            config=UP,
            down_config=dict(DOWN, USE_TMA=True),
        )


def test_tma_with_a_refused_quantization_fails_in_one_line():
    problem = make_problem(4, 4, 32, 64, 2, "int8_w8a16", device=DEVICE, seed=1)
    weights, ids = naive_routing(problem.router_logits, 2)
    with pytest.raises(SplitConfigError, match="not int8_w8a16"):
        fused_experts(
            problem.x,
            problem.w1,
            problem.w2,
            weights,
            ids,
            config=UP,
            down_config=dict(DOWN, USE_TMA=True),
            quant=problem.quant,
        )


# ---- correctness against the reference ----


@pytest.mark.parametrize("dtype,block_shape,tol", ALL_DTYPES)
@pytest.mark.parametrize("M,E,top_k,N,K", SHAPES[:2])
def test_split_without_tma_matches_reference(
    M, E, top_k, N, K, dtype, block_shape, tol, poison_empty
):
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=M + E)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(*args, config=UP, down_config=DOWN, quant=problem.quant)
    assert_close(f"split {dtype}", naive_fused_moe(*args, quant=problem.quant), out, tol)


@needs_tma
@pytest.mark.parametrize("dtype,block_shape", [("fp16", None), ("fp8_w8a8", (128, 128))])
def test_tma_slots_of_other_ranks_add_nothing(dtype, block_shape, poison_empty):
    """Expert parallelism with the sorted layout: other ranks' slots contribute zero."""
    M, E, top_k, N, K = 8, 6, 3, 32, 128
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=3)
    weights, ids = naive_routing(problem.router_logits, top_k)
    ids[0] = -1
    ids[2, 1] = E
    ids[5, 0] = E + 7
    out = fused_experts(
        problem.x,
        problem.w1,
        problem.w2,
        weights,
        ids,
        config=UP,
        down_config=dict(DOWN, USE_TMA=True),
        quant=problem.quant,
        ids_may_be_nonlocal=True,
    )
    ref = naive_fused_experts(problem.x, problem.w1, problem.w2, weights, ids, quant=problem.quant)
    assert (out[0] == 0).all(), "a token routed only to other ranks must give zeros"
    assert_close(f"tma expert parallel {dtype}", ref, out, 1e-3 if dtype == "fp16" else 4e-2)


def _gemm(a, w, c, sorted_ids, expert_ids, num_post, top_k, **flags):
    return invoke_fused_moe_gemm(
        a,
        w,
        c,
        a_scale=None,
        w_scale=None,
        topk_weights=None,
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=num_post,
        mul_routed_weight=False,
        top_k=top_k,
        config=UP,
        quant_dtype=None,
        block_shape=None,
        **flags,
    )


@needs_tma
def test_c_sorted_writes_sorted_positions_and_tma_a_reads_them():
    """The layout itself: row p of a c_sorted output is the slot sorted_ids[p]; a TMA-read A
    in that layout gives the same down GEMM as the gathered one."""
    M, E, top_k, N, K = 9, 3, 2, 32, 64
    torch.manual_seed(0)
    x = torch.randn(M, K, dtype=torch.float16, device=DEVICE)
    w1 = torch.randn(E, N, K, dtype=torch.float16, device=DEVICE) / 8
    w2 = torch.randn(E, K, N, dtype=torch.float16, device=DEVICE) / 8
    ids = torch.randint(0, E, (M, top_k), dtype=torch.int32, device=DEVICE)
    sorted_ids, expert_ids, num_post = align_block_size(ids, UP["BLOCK_SIZE_M"], E)
    plain = torch.empty(M * top_k, N, dtype=torch.float16, device=DEVICE)
    _gemm(x, w1, plain, sorted_ids, expert_ids, num_post, top_k)
    rows = sorted_ids.shape[0]
    sorted_c = torch.full((rows, N), float("nan"), dtype=torch.float16, device=DEVICE)
    _gemm(x, w1, sorted_c, sorted_ids, expert_ids, num_post, top_k, w_use_tma=True, c_sorted=True)
    valid = sorted_ids < M * top_k
    assert torch.equal(sorted_c[valid], plain[sorted_ids[valid].long()])
    assert torch.isnan(sorted_c[~valid]).all(), "padding positions must not be written"

    down_plain = torch.empty(M * top_k, K, dtype=torch.float16, device=DEVICE)
    _gemm(plain, w2, down_plain, sorted_ids, expert_ids, num_post, 1)
    down_tma = torch.full((M * top_k, K), float("nan"), dtype=torch.float16, device=DEVICE)
    _gemm(
        sorted_c, w2, down_tma, sorted_ids, expert_ids, num_post, 1, a_use_tma=True, w_use_tma=True
    )
    assert_close("down through TMA", down_plain, down_tma, 1e-3)


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype,block_shape", [("bf16", None), ("fp8_w8a8", (128, 128))])
def test_tma_call_captures_in_a_cuda_graph(dtype, block_shape):
    M, E, top_k, N, K = 64, 16, 4, 256, 512
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=6)
    up = dict(UP, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, USE_TMA=True)
    down = dict(DOWN, USE_TMA=True)

    def call():
        return fused_moe(
            problem.x,
            problem.w1,
            problem.w2,
            problem.router_logits,
            top_k,
            config=up,
            down_config=down,
            quant=problem.quant,
        )

    eager = call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, out), "graph replay differs from the eager call"


@needs_tma
@pytest.mark.parametrize("up_tma,down_tma", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("dtype,block_shape,tol", TMA_DTYPES)
@pytest.mark.parametrize("M,E,top_k,N,K", SHAPES)
def test_tma_matches_reference(
    M, E, top_k, N, K, dtype, block_shape, tol, up_tma, down_tma, poison_empty
):
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=M * E)
    up = dict(UP, BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64) if GPU else dict(UP)
    down = dict(DOWN, BLOCK_SIZE_M=up["BLOCK_SIZE_M"])
    if M >= 256:
        up["BLOCK_SIZE_M"] = down["BLOCK_SIZE_M"] = 64
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(
        *args,
        config=dict(up, USE_TMA=up_tma),
        down_config=dict(down, USE_TMA=down_tma),
        quant=problem.quant,
    )
    ref = naive_fused_moe(*args, quant=problem.quant)
    tol = 2e-2 if GPU and dtype == "bf16" else tol
    assert_close(f"tma up={up_tma} down={down_tma} {dtype}", ref, out, tol)


def _fp8_gemm(a, a_scale, w, w_scale, c, alignment, top_k, config, **flags):
    return invoke_fused_moe_gemm(
        a,
        w,
        c,
        a_scale=a_scale,
        w_scale=w_scale,
        topk_weights=None,
        mul_routed_weight=False,
        top_k=top_k,
        config=config,
        quant_dtype="fp8_w8a8",
        block_shape=(128, 128),
        **alignment,
        **flags,
    )


@needs_tma
@pytest.mark.parametrize("block_m", [8, 16])
def test_tma_operands_with_swap_ab_match_reference(block_m):
    """SGLang swaps block-fp8 tiles on sm90 with TMA operands too. Forced here: the sorted
    up GEMM (w1 through TMA) and the down GEMM reading A and w2 through TMA."""
    from moetune.kernel.quant import (
        dequantize_weights,
        per_token_group_quant_fp8_reference,
        quantize_weights,
    )

    M, E, top_k, N, K = 9, 3, 2, 64, 256
    block = (128, 128)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(M, K, generator=gen, device=DEVICE).to(torch.bfloat16)
    w1, w1_scale = quantize_weights(
        torch.randn(E, N, K, generator=gen, device=DEVICE) / 16, "fp8_w8a8", block
    )
    w2, w2_scale = quantize_weights(
        torch.randn(E, K, N, generator=gen, device=DEVICE) / 8, "fp8_w8a8", block
    )
    ids = torch.randint(0, E, (M, top_k), generator=gen, dtype=torch.int32, device=DEVICE)
    config = dict(
        BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4,
        num_stages=2,
    )  # fmt: skip
    sorted_ids, expert_ids, num_post = align_block_size(ids, block_m, E)
    alignment = dict(
        sorted_token_ids=sorted_ids, expert_ids=expert_ids, num_tokens_post_padded=num_post
    )
    valid = sorted_ids < M * top_k
    slots = sorted_ids[valid].long()  # the slot at each used sorted position
    experts = ids.reshape(-1).long()[slots]

    def dequantized(a, scale):
        return a.float() * scale.repeat_interleave(128, dim=1)[:, : a.shape[1]]

    a1, a1_scale = per_token_group_quant_fp8_reference(x, 128)
    sorted_c = torch.full(
        (sorted_ids.shape[0], N), float("nan"), dtype=torch.bfloat16, device=DEVICE
    )
    _fp8_gemm(
        a1, a1_scale, w1, w1_scale, sorted_c, alignment, top_k, config,
        w_use_tma=True, c_sorted=True, swap_ab=True,
    )  # fmt: skip
    w1_ref = dequantize_weights(w1, w1_scale, block)
    up_ref = torch.einsum("sk,snk->sn", dequantized(a1, a1_scale)[slots // top_k], w1_ref[experts])
    assert_close("sorted up GEMM, swapped", up_ref, sorted_c[valid], 5e-3)

    act = torch.where(valid[:, None], sorted_c, 0.0)
    a2, a2_scale = per_token_group_quant_fp8_reference(act, 128)
    down = torch.full((M * top_k, K), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    _fp8_gemm(
        a2, a2_scale, w2, w2_scale, down, alignment, 1, config,
        a_use_tma=True, w_use_tma=True, swap_ab=True,
    )  # fmt: skip
    w2_ref = dequantize_weights(w2, w2_scale, block)
    down_ref = torch.einsum("sn,skn->sk", dequantized(a2, a2_scale)[valid], w2_ref[experts])
    assert_close("TMA down GEMM, swapped", down_ref, down[slots], 5e-3)
