"""The quantized paths of issue 9 against the plain-PyTorch definitions:
int4 w4a16 (packed weights, group scales, optional zero points; its own kernel),
int8 w8a8 (per-channel weights, per-token activations) and per-channel fp8.

CPU: Triton's interpreter, small and odd shapes. GPU (MOETUNE_GPU_TESTS=1): the same
cases compiled, plus real model shapes at M = 1 and 4096 (errors printed; run with -s).
Every test id names its path ("int4", "int8_w8a8", "per_channel"), so
``-k "int4 or int8_w8a8 or per_channel"`` selects exactly these.
"""

import os

import pytest
import torch

from moetune.errors import MoetuneError
from moetune.kernel.align import align_block_size
from moetune.kernel.compare import assert_close, compare
from moetune.kernel.config import default_config
from moetune.kernel.fused_moe import fused_experts, fused_moe
from moetune.kernel.fused_moe_wna16_kernel import invoke_fused_moe_wna16_gemm
from moetune.kernel.naive import naive_fused_experts, naive_fused_moe, naive_routing
from moetune.kernel.problem import make_problem
from moetune.kernel.quant import (
    MoEQuant,
    dequantize_weights,
    per_token_quant,
    per_token_quant_reference,
    quantize_weights,
)
from moetune.kernel.quant_wna16 import dequantize_int4, pack_int4, quantize_int4, unpack_int4

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"

# (M, E, top_k, N, K): the whole-layer shapes of test_fused_moe.py (all even, as int4 needs)
SHAPES = [
    (1, 8, 2, 32, 64),  # decode: one token, M < BLOCK_SIZE_M
    (7, 13, 3, 48, 80),  # odd M, prime E; N, K not multiples of the tiles or of group 32
    (5, 4, 4, 32, 64),  # top_k = E
    (3, 32, 2, 16, 32),  # M < E: most experts get no token
    (33, 5, 1, 40, 96),  # top-1, several row-blocks per expert
]

# (dtype, make_problem options, allowed rel. RMS error of the whole layer).
# The reference quantizes the activations exactly as the kernel path does and
# dequantizes the weights exactly, so what is left is the bf16 rounding of the
# GEMM outputs (the glue kernels' casts truncate under the interpreter), plus:
# - int4: the kernel rounds each dequantized weight to bf16 before its dot (2**-9
#   relative), the reference keeps fp32. Measured (interpreter) <= 9.1e-3;
# - w8a8 per token: a bf16 rounding difference in the intermediate can move one
#   activation to the neighbouring int8 / fp8 value of its row. Measured
#   (interpreter): int8 <= 1.0e-2, fp8 <= 1.8e-2 (fp8 steps are 1/16 of the value).
# Tolerances about 2x measured; a wrong tile or expert gives O(1).
PATHS = [
    pytest.param("int4_w4a16", dict(group_size=32), 2e-2, id="int4-g32"),
    pytest.param("int4_w4a16", dict(group_size=64, zero_point=True), 2e-2, id="int4-g64-zp"),
    pytest.param("int4_w4a16", dict(group_size=128), 2e-2, id="int4-g128"),
    pytest.param("int8_w8a8", {}, 2.5e-2, id="int8_w8a8"),
    pytest.param("fp8_w8a8", dict(per_channel=True), 4e-2, id="fp8-per_channel"),
]


def shape_id(shape):
    return "M{}-E{}-top{}-N{}-K{}".format(*shape)


@pytest.mark.parametrize("dtype,options,tol", PATHS)
@pytest.mark.parametrize("M,E,top_k,N,K", [pytest.param(*s, id=shape_id(s)) for s in SHAPES])
def test_fused_moe_matches_reference(M, E, top_k, N, K, dtype, options, tol, poison_empty):
    problem = make_problem(M, E, N, K, top_k, dtype, device=DEVICE, seed=M * E, **options)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(*args, quant=problem.quant)
    assert out.shape == (M, K) and out.dtype == problem.x.dtype
    assert_close(f"fused_moe {dtype}", naive_fused_moe(*args, quant=problem.quant), out, tol)


CONFIGS = [
    # BLOCK_SIZE_K < every group: several K steps share a scale
    dict(
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=1, num_warps=4, num_stages=2
    ),
    # BLOCK_SIZE_K > group 32: several scales in one K step; the K tail is masked
    dict(
        BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=4, num_warps=4, num_stages=3
    ),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"BK{c['BLOCK_SIZE_K']}")
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zp"])
def test_int4_gemm_launch_against_dequantized_matmul(config, zero_point):
    """One int4 launch (GEMM2 form, routing weights) equals a gathered fp32 matmul on the
    dequantized weights; 72 = 2 groups of 32 + a ragged 8, not a multiple of BLOCK_SIZE_K."""
    M, E, top_k, N, K, group = 9, 5, 2, 40, 72, 32
    gen = torch.Generator(device=DEVICE).manual_seed(11)
    a = torch.randn(M * top_k, K, generator=gen, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(E, N, K, generator=gen, device=DEVICE) / K**0.5
    qweight, scale, qzeros = quantize_int4(w, group, zero_point=zero_point)
    w_ref = dequantize_int4(qweight, scale, group, qzeros)
    ids = torch.rand(M, E, generator=gen, device=DEVICE).argsort(dim=-1)[:, :top_k].int()
    ids[2, 1] = -1  # a slot of another rank: never written
    weights = torch.rand(M, top_k, generator=gen, device=DEVICE)
    sorted_ids, expert_ids, num_post = align_block_size(ids, config["BLOCK_SIZE_M"], E)
    c = torch.full((M * top_k, N), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    invoke_fused_moe_wna16_gemm(
        a,
        qweight,
        c,
        w_scale=scale,
        w_zp=qzeros,
        group_size=group,
        topk_weights=weights,
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=num_post,
        mul_routed_weight=True,
        top_k=1,
        config=config,
    )
    flat = ids.reshape(-1).long()
    local = flat >= 0
    ref = torch.einsum("sk,snk->sn", a.float()[local], w_ref[flat[local]])
    ref = ref * weights.reshape(-1, 1)[local]
    assert_close("int4 launch", ref, c[local], 5e-3)  # bf16 weights and output: ~2**-9
    assert torch.isnan(c[~local]).all(), "a slot of another rank must not be written"


@pytest.mark.parametrize("rows,n,k", [(2**21 + 1, 1024, 64), (2**15 + 1, 64, 2**16)])
def test_int4_launch_refuses_int32_overflowing_offsets(rows, n, k):
    """The int4 kernel's A and C row offsets are int32 (the engine kernel's widths): an output
    (first case) or input (second) past 2**31 elements is refused before any launch."""
    meta = dict(device="meta")
    a = torch.empty(rows, k, dtype=torch.bfloat16, **meta)
    c = torch.empty(rows, n, dtype=torch.bfloat16, **meta)
    w = torch.empty(2, n, k // 2, dtype=torch.uint8, **meta)
    scale = torch.empty(2, n, k // 32, dtype=torch.bfloat16, **meta)
    ids = torch.empty(rows + 64, dtype=torch.int32, **meta)
    with pytest.raises(MoetuneError, match="int32 offsets"):
        invoke_fused_moe_wna16_gemm(
            a,
            w,
            c,
            w_scale=scale,
            w_zp=None,
            group_size=32,
            topk_weights=None,
            sorted_token_ids=ids,
            expert_ids=ids[:2],
            num_tokens_post_padded=ids[:1],
            mul_routed_weight=False,
            top_k=1,
            config=dict(
                BLOCK_SIZE_M=16,
                BLOCK_SIZE_N=32,
                BLOCK_SIZE_K=32,
                GROUP_SIZE_M=1,
                num_warps=4,
                num_stages=2,
            ),
        )


@pytest.mark.parametrize(
    "dtype,options",
    [("int4_w4a16", dict(group_size=32)), ("int8_w8a8", {})],
    ids=["int4", "int8_w8a8"],
)
def test_per_channel_and_int4_slots_of_other_ranks_add_nothing(dtype, options, poison_empty):
    M, E, top_k, N, K = 8, 6, 3, 32, 64
    problem = make_problem(M, E, N, K, top_k, dtype, device=DEVICE, seed=3, **options)
    weights, ids = naive_routing(problem.router_logits, top_k)
    ids[0] = -1
    ids[2, 1] = E
    ids[5, 0] = E + 7
    args = (problem.x, problem.w1, problem.w2, weights, ids)
    out = fused_experts(*args, quant=problem.quant, ids_may_be_nonlocal=True)
    assert (out[0] == 0).all(), "a token routed only to other ranks must give zeros"
    assert_close(dtype, naive_fused_experts(*args, quant=problem.quant), out, 2.5e-2)


def test_fp8_per_channel_explicit_configs_agree():
    """Two tilings of a per-channel fp8 problem (both BLOCK_SIZE_K >= 32) give the reference."""
    problem = make_problem(9, 6, 48, 64, 2, "fp8_w8a8", device=DEVICE, seed=2, per_channel=True)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    ref = naive_fused_moe(*args, quant=problem.quant)
    for bm, bn, bk in ((16, 16, 32), (64, 64, 64)):
        config = dict(
            BLOCK_SIZE_M=bm,
            BLOCK_SIZE_N=bn,
            BLOCK_SIZE_K=bk,
            GROUP_SIZE_M=1,
            num_warps=4,
            num_stages=2,
        )
        out = fused_moe(*args, config=config, quant=problem.quant)
        assert_close(f"per_channel {bm}x{bn}x{bk}", ref, out, 4e-2)


def test_int8_w8a8_refuses_block_k_16():
    problem = make_problem(2, 4, 16, 32, 2, "int8_w8a8", device=DEVICE)
    config = dict(default_config(2, 4, 16, 32, 2, "int8_w8a8"), BLOCK_SIZE_K=16)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    with pytest.raises(MoetuneError, match="BLOCK_SIZE_K >= 32"):
        fused_moe(*args, config=config, quant=problem.quant)


# ---------------------------------------------------------------- quantizers


@pytest.mark.parametrize("dtype", ["int8_w8a8", "fp8_w8a8"], ids=["int8_w8a8", "fp8-per_channel"])
def test_per_token_quant_kernel_is_the_definition(dtype, poison_empty):
    """The Triton per-token quantizer equals the plain-PyTorch definition bit for bit,
    on a zero row, a row with one huge value, and a row wider than the kernel's block."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = (torch.randn(6, 1500, generator=gen, device=DEVICE) * 3).to(torch.bfloat16)
    x[1] = 0
    x[2, 7] = 1e4
    q, scale = per_token_quant(x, dtype)
    q_ref, scale_ref = per_token_quant_reference(x, dtype)
    # Compiled, Triton's fp32 division is not IEEE-exact (div.full.f32, 2 ulp): a scale may
    # differ in its last bit and a value sitting on a rounding boundary go the other way.
    assert scale.shape == (6, 1)
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6 if GPU else 0, atol=0)
    assert q.dtype == q_ref.dtype
    differ = (q.float() != q_ref.float()).float().mean().item()
    assert differ <= (1e-3 if GPU else 0.0), f"{differ:.2%} of the quantized values differ"
    assert (q[1].float() == 0).all()
    back = q.float() * scale
    # int8: half a step of the row's scale; fp8: half a mantissa step (1/16) of the value
    bound = scale / 2 if dtype == "int8_w8a8" else x.float().abs() / 16 + scale
    assert ((back - x.float()).abs() <= bound + 1e-6).all()


def test_int8_per_token_rounds_half_away_from_zero():
    x = torch.tensor([[127.0, 0.5, -0.5, 1.5, -2.5]], device=DEVICE)  # scale = 1
    q, _ = per_token_quant(x, "int8_w8a8")
    assert q.tolist() == [[127, 1, -1, 2, -3]]


def test_int4_packing_round_trips_and_matches_the_engines_nibble_order():
    codes = torch.tensor([[[1, 2, 15, 0]]], dtype=torch.uint8)
    packed = pack_int4(codes, dim=2)
    assert packed.tolist() == [[[0x21, 0x0F]]], "element 2j in the low nibble, 2j+1 in the high"
    assert torch.equal(unpack_int4(packed, dim=2), codes)
    many = torch.randint(0, 16, (3, 6, 10), dtype=torch.uint8)
    for dim in (1, 2):
        assert torch.equal(unpack_int4(pack_int4(many, dim), dim), many)


@pytest.mark.parametrize("group", [32, 64, 128], ids=lambda g: f"int4-g{g}")
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zp"])
def test_int4_quantization_layout_and_error(group, zero_point):
    w = torch.randn(3, 40, 200, device=DEVICE)  # 200: a ragged last group for every size
    qweight, scale, qzeros = quantize_int4(w, group, zero_point=zero_point)
    groups = -(-200 // group)
    assert qweight.shape == (3, 40, 100) and qweight.dtype == torch.uint8
    assert scale.shape == (3, 40, groups) and scale.dtype == torch.bfloat16
    if zero_point:
        assert qzeros.shape == (3, 20, groups) and qzeros.dtype == torch.uint8
    else:
        assert qzeros is None
    back = dequantize_int4(qweight, scale, group, qzeros)
    # half a step (a scale) away, except where the top code clamps at 15: a whole step
    step = scale.float().repeat_interleave(group, dim=2)[:, :, :200]
    assert ((back - w).abs() <= step + 1e-6).all()
    assert (back - w).abs().mean() <= step.mean() / 3  # most are within half a step
    assert torch.equal(
        back, dequantize_weights(qweight, scale, group_size=group, zero_points=qzeros)
    )


def test_quantize_weights_per_channel_layouts():
    w = torch.randn(2, 24, 40, device=DEVICE)
    q, scale = quantize_weights(w, "fp8_w8a8", per_channel=True)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (2, 24)
    # e4m3 keeps 3 mantissa bits (a relative error of 1/16 at most) down to 2**-6 of the
    # scale; below that its subnormals are 2**-9 of the scale apart (half of that at most).
    bound = w.abs() / 16 + scale[:, :, None] * 2**-10 + 1e-6
    assert ((dequantize_weights(q, scale) - w).abs() <= bound).all()
    q, scale = quantize_weights(w, "int8_w8a8", per_channel=True)
    assert q.dtype == torch.int8 and scale.shape == (2, 24)
    assert ((dequantize_weights(q, scale) - w).abs() <= scale[:, :, None] / 2 + 1e-6).all()
    q, scale = quantize_weights(w, "int4_w4a16", group_size=8)
    assert q.shape == (2, 24, 20) and scale.shape == (2, 24, 5)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda w: quantize_weights(w, "int8_w8a8"), "per channel only"),
        (lambda w: quantize_weights(w, "int4_w4a16"), "group size"),
        (lambda w: quantize_weights(w, "fp8_w8a8", group_size=32), "group size"),
        (lambda w: quantize_weights(w, "int8_w8a16", per_channel=True), "per-channel"),
        (lambda w: quantize_int4(w[:, :, :5], 32), "even input width"),
        (lambda w: quantize_int4(w[:, :3], 32, zero_point=True), "even"),
        (
            lambda w: quantize_weights(w, "fp8_w8a8", (16, 16), per_channel=True),
            "either block-quantized or per-channel",
        ),
    ],
    ids=[
        "int8_w8a8-needs-per_channel",
        "int4-needs-group",
        "fp8-no-group",
        "int8w8a16-no-per_channel",
        "int4-odd-K",
        "int4-zp-odd-rows",
        "per_channel-and-block",
    ],
)
def test_bad_quantization_options_are_one_line_errors(call, message):
    with pytest.raises(MoetuneError, match=message):
        call(torch.randn(2, 8, 32))


def test_moe_quant_needs_both_zero_points():
    scale = torch.ones(1, 2, 1)
    with pytest.raises(MoetuneError, match="both w1 and w2"):
        MoEQuant("int4_w4a16", scale, scale, group_size=32, w1_zp=torch.zeros(1, 1, 1))


def test_make_problem_int4_and_per_channel_shapes():
    M, E, N, K, top_k = 3, 4, 64, 96, 2
    p = make_problem(M, E, N, K, top_k, "int4_w4a16", device="cpu", zero_point=True)
    assert p.w1.shape == (E, 2 * N, K // 2) and p.w2.shape == (E, K, N // 2)
    assert p.quant.group_size == 128 and p.quant.has_zp  # the default group size
    assert p.quant.w1_scale.shape == (E, 2 * N, 1) and p.quant.w2_zp.shape == (E, K // 2, 1)
    p = make_problem(M, E, N, K, top_k, "int8_w8a8", device="cpu")
    assert p.quant.per_channel and p.w1.dtype == torch.int8 and p.quant.w1_scale.shape == (E, 2 * N)
    with pytest.raises(MoetuneError, match="zero points"):
        make_problem(M, E, N, K, top_k, "fp8_w8a8", device="cpu", zero_point=True)


# ---------------------------------------------------------------- GPU: real shapes

# (name, E, top_k, K, N, dtype, make_problem options, tol)
REAL = [
    ("qwen3-30b-a3b-tp1", 128, 8, 2048, 768, "int4_w4a16", dict(group_size=128), 2e-2),
    (
        "qwen3-30b-a3b-tp1",
        128,
        8,
        2048,
        768,
        "int4_w4a16",
        dict(group_size=128, zero_point=True),
        2e-2,
    ),
    ("qwen3-30b-a3b-tp1", 128, 8, 2048, 768, "int8_w8a8", {}, 4e-2),
    ("llama-4-scout-tp4", 16, 1, 5120, 2048, "fp8_w8a8", dict(per_channel=True), 5e-2),
]


def real_id(case):
    name, _, _, _, _, dtype, options, _ = case
    suffix = "".join(
        f"-{k}{'' if v is True else v}" for k, v in sorted(options.items()) if v is not False
    )
    return f"{name}-{dtype}{suffix}".replace("fp8_w8a8-per_channel", "fp8-per_channel")


@pytest.mark.skipif(not GPU, reason="real shapes run on the GPU only")
@pytest.mark.parametrize("M", [1, 4096])
@pytest.mark.parametrize("name,E,top_k,K,N,dtype,options,tol", REAL, ids=[real_id(c) for c in REAL])
def test_real_shapes(name, E, top_k, K, N, dtype, options, tol, M):
    problem = make_problem(M, E, N, K, top_k, dtype, device=DEVICE, seed=5, **options)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(*args, quant=problem.quant)
    ref = naive_fused_moe(*args, quant=problem.quant)
    result = compare(ref, out)
    print(f"REAL {name} {dtype} {options} M={M}: {result}")
    assert_close(f"{name} {dtype} M={M}", ref, out, tol)


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize(
    "dtype,options", [(p.values[0], p.values[1]) for p in PATHS], ids=[p.id for p in PATHS]
)
def test_cuda_graph_capture_replays_the_eager_result(dtype, options):
    M, E, top_k, N, K = 64, 16, 4, 256, 512
    problem = make_problem(M, E, N, K, top_k, dtype, device=DEVICE, seed=6, **options)
    x, logits = problem.x.clone(), problem.router_logits.clone()

    def call():
        return fused_moe(x, problem.w1, problem.w2, logits, top_k, quant=problem.quant)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    other = make_problem(M, E, N, K, top_k, dtype, device=DEVICE, seed=7, **options)
    x.copy_(other.x)
    logits.copy_(other.router_logits)
    graph.replay()
    torch.cuda.synchronize()
    assert compare(call(), out).max_abs == 0.0, "graph replay differs from the eager call"
