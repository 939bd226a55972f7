"""One launch of the fused-MoE GEMM against a gathered fp32 matmul, every dtype path.

CPU: Triton's interpreter (bf16 runs there through the documented interpreter-only
upcast, see fused_moe_kernel's docstring). GPU (MOETUNE_GPU_TESTS=1): the same
cases compiled, plus bigger tiles.
"""

import os

import pytest
import torch

from moetune.errors import MoetuneError
from moetune.kernel.align import align_block_size
from moetune.kernel.compare import assert_close
from moetune.kernel.fused_moe_kernel import check_config, invoke_fused_moe_gemm
from moetune.kernel.quant import (
    dequantize_weights,
    per_tensor_quant_fp8,
    per_token_group_quant_fp8_reference,
    quantize_weights,
)

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"

# (M, E, top_k, N out-features, K)
SHAPES = [
    (1, 4, 1, 48, 64),  # one token, top-1
    (7, 13, 2, 80, 96),  # odd M, prime E, N not a multiple of BLOCK_SIZE_N
    (5, 6, 6, 32, 72),  # top_k = E; K not a multiple of BLOCK_SIZE_K (masked K tail)
    (3, 16, 2, 64, 64),  # M < E: most experts get no token
    (40, 3, 2, 48, 128),  # several row-blocks per expert, GROUP_SIZE_M swizzle in play
]
CONFIGS = [
    dict(
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2
    ),
    dict(
        BLOCK_SIZE_M=32, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=4, num_warps=4, num_stages=3
    ),
]
if GPU:
    SHAPES += [(333, 64, 8, 768, 2048), (1, 64, 8, 256, 7168)]
    CONFIGS += [
        dict(
            BLOCK_SIZE_M=64,
            BLOCK_SIZE_N=128,
            BLOCK_SIZE_K=64,
            GROUP_SIZE_M=8,
            num_warps=4,
            num_stages=4,
        )
    ]

# (dtype, block_shape, allowed rel. RMS error). Inputs are identical on both sides
# (weights dequantized, activations quantized once), so the error is the fp32
# accumulation order plus one rounding of the output to bf16/fp16.
DTYPES = [
    pytest.param("fp16", None, 1e-3, id="fp16"),
    pytest.param("bf16", None, 5e-3, id="bf16"),
    pytest.param("fp8_w8a8", None, 5e-3, id="fp8"),
    # quantization blocks smaller than the tiles: several scales per tile
    pytest.param("fp8_w8a8", (16, 32), 5e-3, id="fp8-block16x32"),
    pytest.param("int8_w8a16", None, 5e-3, id="int8w8a16"),
]


def config_id(config):
    return "BM{BLOCK_SIZE_M}-BN{BLOCK_SIZE_N}-BK{BLOCK_SIZE_K}-G{GROUP_SIZE_M}".format(**config)


def shape_id(shape):
    return "M{}-E{}-top{}-N{}-K{}".format(*shape)


def random_routing(M, E, top_k, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(M, E, generator=gen).argsort(dim=-1)[:, :top_k].to(torch.int32)
    weights = torch.rand(M, top_k, generator=gen)
    return weights.to(DEVICE), ids.to(DEVICE)


def make_operands(M, E, top_k, N, K, dtype, block_shape, seed=0):
    """(a as the kernel takes it, a_scale, fp32 a, w, w_scale, fp32 w, output dtype)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    out_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    a = torch.randn(M, K, generator=gen, device=DEVICE).to(out_dtype)
    w = torch.randn(E, N, K, generator=gen, device=DEVICE) / K**0.5
    if dtype in ("fp16", "bf16"):
        w = w.to(out_dtype)
        return a, None, a.float(), w, None, w.float(), out_dtype
    w_q, w_scale = quantize_weights(w, dtype, block_shape)
    w_ref = dequantize_weights(w_q, w_scale, block_shape)
    if dtype == "int8_w8a16":
        return a, None, a.float(), w_q, w_scale, w_ref, out_dtype
    if block_shape is None:
        a_q, a_scale = per_tensor_quant_fp8(a)
        a_ref = a_q.float() * a_scale
    else:
        a_q, a_scale = per_token_group_quant_fp8_reference(a, block_shape[1])
        a_ref = a_q.float() * a_scale.repeat_interleave(block_shape[1], dim=1)[:, :K]
    return a_q, a_scale, a_ref, w_q, w_scale, w_ref, out_dtype


def run_gemm(
    a, a_scale, w, w_scale, out_dtype, weights, ids, top_k, config, dtype, block_shape, routed
):
    num_slots = ids.numel()
    c = torch.full((num_slots, w.shape[1]), float("nan"), dtype=out_dtype, device=DEVICE)
    sorted_ids, expert_ids, num_post = align_block_size(ids, config["BLOCK_SIZE_M"], w.shape[0])
    quant_dtype = None if dtype in ("fp16", "bf16") else dtype
    return invoke_fused_moe_gemm(
        a,
        w,
        c,
        a_scale=a_scale,
        w_scale=w_scale,
        topk_weights=weights if routed else None,
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=num_post,
        mul_routed_weight=routed,
        top_k=top_k,
        config=config,
        quant_dtype=quant_dtype,
        block_shape=block_shape,
    )


def gathered_reference(a_ref, w_ref, weights, ids, top_k, routed):
    """c[slot] = a[slot // top_k] @ w[ids[slot]].T (times the slot's weight), fp32."""
    slots = torch.arange(ids.numel(), device=ids.device)
    flat_ids = ids.reshape(-1).long()
    out = torch.einsum("sk,snk->sn", a_ref[slots // top_k], w_ref[flat_ids])
    return out * weights.reshape(-1, 1) if routed else out


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("dtype,block_shape,tol", DTYPES)
@pytest.mark.parametrize(
    "M,E,top_k,N,K", [pytest.param(*shape, id=shape_id(shape)) for shape in SHAPES]
)
def test_gate_up_gemm(M, E, top_k, N, K, dtype, block_shape, tol, config):
    """GEMM1 form: rows of a gathered as slot // top_k, no routing weight."""
    if block_shape is not None and block_shape[1] % config["BLOCK_SIZE_K"]:
        pytest.skip("BLOCK_SIZE_K must divide the quantization block")
    if dtype == "fp8_w8a8" and config["BLOCK_SIZE_K"] < 32:
        pytest.skip("fp8 needs BLOCK_SIZE_K >= 32 (Hopper's fp8 dot)")
    a, a_scale, a_ref, w, w_scale, w_ref, out_dtype = make_operands(
        M, E, top_k, N, K, dtype, block_shape
    )
    weights, ids = random_routing(M, E, top_k, seed=M + E)
    c = run_gemm(
        a,
        a_scale,
        w,
        w_scale,
        out_dtype,
        weights,
        ids,
        top_k,
        config,
        dtype,
        block_shape,
        routed=False,
    )
    assert_close(
        f"gate/up {dtype}", gathered_reference(a_ref, w_ref, weights, ids, top_k, False), c, tol
    )


@pytest.mark.parametrize("dtype,block_shape,tol", DTYPES)
@pytest.mark.parametrize(
    "M,E,top_k,N,K", [pytest.param(*shape, id=shape_id(shape)) for shape in SHAPES[:3]]
)
def test_down_gemm_applies_routing_weights(M, E, top_k, N, K, dtype, block_shape, tol):
    """GEMM2 form: one a row per slot (top_k=1 to the kernel), output scaled by the slot's weight."""
    config = CONFIGS[0]
    a, a_scale, a_ref, w, w_scale, w_ref, out_dtype = make_operands(
        M * top_k, E, 1, N, K, dtype, block_shape
    )
    weights, ids = random_routing(M, E, top_k, seed=3)
    c = run_gemm(
        a, a_scale, w, w_scale, out_dtype, weights, ids, 1, config, dtype, block_shape, routed=True
    )
    assert_close(f"down {dtype}", gathered_reference(a_ref, w_ref, weights, ids, 1, True), c, tol)


def test_skipped_slots_are_never_written():
    """Slots routed to experts of another rank (-1, >= E) are left alone: alignment skips them."""
    M, E, top_k, N, K = 6, 4, 2, 32, 32
    a, _, a_ref, w, _, w_ref, out_dtype = make_operands(M, E, top_k, N, K, "fp16", None)
    weights, ids = random_routing(M, E, top_k, seed=1)
    ids[0, 0], ids[3, 1] = -1, E + 2
    c = run_gemm(
        a, None, w, None, out_dtype, weights, ids, top_k, CONFIGS[0], "fp16", None, routed=False
    )
    skipped = torch.zeros(M * top_k, dtype=torch.bool, device=DEVICE)
    skipped[[0, 7]] = True
    assert torch.isnan(c[skipped]).all(), "a skipped slot was written"
    assert torch.isfinite(c[~skipped]).all(), "a routed slot was not written"
    local_ids = ids.clamp(0, E - 1)
    ref = gathered_reference(a_ref, w_ref, weights, local_ids, top_k, False)
    assert_close("routed slots", ref[~skipped], c[~skipped], 1e-3)


def test_expert_minus_one_block_writes_zeros_and_blocks_past_the_end_exit():
    """vLLM-style alignment may give a block expert id -1: its slots get zeros. Blocks at or
    past num_tokens_post_padded are not touched."""
    K, N, block_m = 32, 32, 16
    a = torch.randn(4, K, dtype=torch.float16, device=DEVICE)
    w = torch.randn(2, N, K, dtype=torch.float16, device=DEVICE)
    c = torch.full((4, N), float("nan"), dtype=torch.float16, device=DEVICE)
    pad = 4
    sorted_ids = torch.full((3 * block_m,), pad, dtype=torch.int32, device=DEVICE)
    sorted_ids[:2] = torch.tensor([0, 1])  # block 0: expert 1
    sorted_ids[block_m : block_m + 1] = 2  # block 1: expert -1
    sorted_ids[2 * block_m] = 3  # block 2: past the end
    expert_ids = torch.tensor([1, -1, 0], dtype=torch.int32, device=DEVICE)
    num_post = torch.tensor([2 * block_m], dtype=torch.int32, device=DEVICE)
    config = dict(CONFIGS[0], BLOCK_SIZE_M=block_m)
    invoke_fused_moe_gemm(
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
        top_k=1,
        config=config,
        quant_dtype=None,
        block_shape=None,
    )
    assert_close("expert 1 rows", a[:2].float() @ w[1].float().T, c[:2], 1e-3)
    assert (c[2] == 0).all(), "a block of expert -1 must write zeros"
    assert torch.isnan(c[3]).all(), "a block past num_tokens_post_padded must not run"


@pytest.mark.parametrize(
    "config,block_shape,message",
    [
        ({"BLOCK_SIZE_M": 16}, None, "lacks BLOCK_SIZE_N"),
        (dict(CONFIGS[0], BLOCK_SIZE_N=48), None, "power of two"),
        (dict(CONFIGS[0], num_stages=0), None, "positive integer"),
        (dict(CONFIGS[0], BLOCK_SIZE_K=8), None, "at least 16"),
        (dict(CONFIGS[0], BLOCK_SIZE_K=256), (128, 128), "must divide the quantization block"),
        (dict(CONFIGS[0], BLOCK_SIZE_K=16), None, "BLOCK_SIZE_K >= 32"),
    ],
)
def test_bad_configs_are_refused_in_one_line(config, block_shape, message):
    with pytest.raises(MoetuneError, match=message):
        check_config(config, block_shape, "fp8_w8a8")


def test_block_quantized_int8_is_refused():
    a, _, _, w, w_scale, _, _ = make_operands(2, 2, 1, 32, 32, "int8_w8a16", None)
    weights, ids = random_routing(2, 2, 1, seed=0)
    with pytest.raises(MoetuneError, match="fp8_w8a8 only"):
        run_gemm(
            a,
            None,
            w,
            w_scale,
            torch.bfloat16,
            weights,
            ids,
            1,
            CONFIGS[0],
            "int8_w8a16",
            (32, 32),
            False,
        )
