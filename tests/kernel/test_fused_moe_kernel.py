"""One launch of the fused-MoE GEMM against a gathered fp32 matmul, every dtype path.

CPU: Triton's interpreter (bf16 runs there through the documented interpreter-only
upcast, see fused_moe_kernel's docstring). GPU (MOETUNE_GPU_TESTS=1): the same
cases compiled, plus bigger tiles.
"""

import inspect
import os

import pytest
import torch

from moetune.errors import MoetuneError
from moetune.kernel.align import align_block_size, max_padded_slots
from moetune.kernel.compare import assert_close
from moetune.kernel.fused_moe_kernel import check_config, invoke_fused_moe_gemm, swaps_ab
from moetune.kernel.quant import (
    dequantize_weights,
    per_tensor_quant_fp8,
    per_token_group_quant_fp8_reference,
    per_token_quant_reference,
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
    # quantization blocks as wide as the small tiles (vLLM clamps BLOCK_SIZE_K to the
    # block's smaller side, so a block narrower than 32 has no legal fp8 tile)
    pytest.param("fp8_w8a8", (32, 32), 5e-3, id="fp8-block32x32"),
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
    routed,
    *,
    naive=False,
    **launch,
):
    """One launch on aligned ids, or with `naive` on vLLM's naive assignment."""
    num_slots = ids.numel()
    c = torch.full((num_slots, w.shape[1]), float("nan"), dtype=out_dtype, device=DEVICE)
    if naive:
        sorted_ids, expert_ids = None, ids.reshape(-1)
        num_post = torch.tensor([num_slots * config["BLOCK_SIZE_M"]], dtype=torch.int32)
        num_post = num_post.to(DEVICE)
    else:
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
        **launch,
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


# vLLM 0.33's launch semantics: naive assignment, SWAP_AB, the BLOCK_SIZE_K clamp, EM.

NAIVE_SHAPE = (3, 13, 2, 80, 96)  # 6 slots, N and K not multiples of the tiles


@pytest.mark.parametrize("routed", [False, True], ids=["up", "down"])
@pytest.mark.parametrize("dtype,block_shape,tol", DTYPES)
def test_naive_assignment_matches_reference(dtype, block_shape, tol, routed):
    """No alignment: block i is slot i, of expert ids[i]; every slot is written once."""
    M, E, top_k, N, K = NAIVE_SHAPE
    rows, launch_top_k = (M * top_k, 1) if routed else (M, top_k)
    a, a_scale, a_ref, w, w_scale, w_ref, out_dtype = make_operands(
        rows, E, launch_top_k, N, K, dtype, block_shape
    )
    weights, ids = random_routing(M, E, top_k, seed=11)
    c = run_gemm(
        a,
        a_scale,
        w,
        w_scale,
        out_dtype,
        weights,
        ids,
        launch_top_k,
        CONFIGS[0],
        dtype,
        block_shape,
        routed,
        naive=True,
    )
    ref = gathered_reference(a_ref, w_ref, weights, ids, launch_top_k, routed)
    assert_close(f"naive {dtype}", ref, c, tol)


def per_channel_fp8_operands(M, E, N, K, seed=0):
    """(fp8 a, a_scale [M, 1], fp32 a, fp8 w, w_scale [E, N], fp32 w): per-token x per-channel."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(E, N, K, generator=gen, device=DEVICE) / K**0.5
    a_q, a_scale = per_token_quant_reference(x, "fp8_w8a8")
    w_q, w_scale = quantize_weights(w, "fp8_w8a8", per_channel=True)
    return a_q, a_scale, a_q.float() * a_scale, w_q, w_scale, dequantize_weights(w_q, w_scale)


SWAP_SHAPE = (7, 5, 2, 80, 80)  # N: a wrapped second weight tile; K: a masked tail
SWAP_QUANT = [
    pytest.param(None, id="fp8-tensor"),
    pytest.param((32, 32), id="fp8-block32x32"),  # two weight-scale blocks per 64-wide tile
    pytest.param("per_channel", id="fp8-channel"),
]


@pytest.mark.parametrize("routed", [False, True], ids=["up", "down"])
@pytest.mark.parametrize("block_m", [8, 16])
@pytest.mark.parametrize("quant", SWAP_QUANT)
def test_swap_ab_matches_reference(quant, block_m, routed):
    """SWAP_AB forced (the interpreter runs any tile): W @ A.T per tile, BLOCK_SIZE_M 8 or 16."""
    M, E, top_k, N, K = SWAP_SHAPE
    rows, launch_top_k = (M * top_k, 1) if routed else (M, top_k)
    if quant == "per_channel":
        a, a_scale, a_ref, w, w_scale, w_ref = per_channel_fp8_operands(rows, E, N, K)
        block_shape, launch = None, dict(per_channel=True)
    else:
        block_shape, launch = quant, {}
        a, a_scale, a_ref, w, w_scale, w_ref, _ = make_operands(
            rows, E, launch_top_k, N, K, "fp8_w8a8", block_shape
        )
    weights, ids = random_routing(M, E, top_k, seed=5)
    config = dict(
        BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=2, num_warps=4,
        num_stages=2,
    )  # fmt: skip
    c = run_gemm(
        a,
        a_scale,
        w,
        w_scale,
        torch.bfloat16,
        weights,
        ids,
        launch_top_k,
        config,
        "fp8_w8a8",
        block_shape,
        routed,
        swap_ab=True,
        **launch,
    )
    ref = gathered_reference(a_ref, w_ref, weights, ids, launch_top_k, routed)
    assert_close(f"swap_ab {quant}", ref, c, 5e-3)


def test_swap_ab_on_the_naive_path_with_block_m_8():
    """vLLM's decode path on sm90: naive assignment and SWAP_AB together."""
    M, E, top_k, N, K = 2, 16, 2, 64, 64
    a, a_scale, a_ref, w, w_scale, w_ref, _ = make_operands(M, E, top_k, N, K, "fp8_w8a8", None)
    weights, ids = random_routing(M, E, top_k, seed=8)
    config = dict(CONFIGS[0], BLOCK_SIZE_M=8, BLOCK_SIZE_N=64)
    c = run_gemm(
        a,
        a_scale,
        w,
        w_scale,
        torch.bfloat16,
        weights,
        ids,
        top_k,
        config,
        "fp8_w8a8",
        None,
        False,
        naive=True,
        swap_ab=True,
    )
    assert_close(
        "naive swap_ab", gathered_reference(a_ref, w_ref, weights, ids, top_k, False), c, 5e-3
    )


def test_the_launcher_swaps_as_vllm_does_on_compute_capability_9_0(monkeypatch):
    """swap_ab=None: the device decides. An sm90 device swaps fp8 8-row tiles (which are
    refused where nothing swaps); a CPU tensor has no capability, so nothing swaps."""
    import moetune.kernel.fused_moe_kernel as kernel_module

    M, E, top_k, N, K = 3, 4, 2, 64, 64
    a, a_scale, a_ref, w, w_scale, w_ref, _ = make_operands(M, E, top_k, N, K, "fp8_w8a8", None)
    weights, ids = random_routing(M, E, top_k, seed=2)
    config = dict(CONFIGS[0], BLOCK_SIZE_M=8, BLOCK_SIZE_N=64)
    args = (a, a_scale, w, w_scale, torch.bfloat16, weights, ids, top_k, config, "fp8_w8a8")
    if not GPU:
        with pytest.raises(MoetuneError, match="BLOCK_SIZE_M must be at least 16"):
            run_gemm(*args, None, False)
    monkeypatch.setattr(kernel_module, "device_capability", lambda tensor: (9, 0))
    c = run_gemm(*args, None, False)
    assert_close("sm90 swap", gathered_reference(a_ref, w_ref, weights, ids, top_k, False), c, 5e-3)


@pytest.mark.parametrize(
    "config,quant_dtype,capability,swaps",
    [
        (dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64), "fp8_w8a8", (9, 0), True),
        (dict(BLOCK_SIZE_M=8, BLOCK_SIZE_N=128), "fp8_w8a8", (9, 0), True),
        (dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=256), "fp8_w8a8", (9, 0), True),
        (dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128), "fp8_w8a8", (9, 0), False),
        (dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32), "fp8_w8a8", (9, 0), False),
        (dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64), "fp8_w8a8", (10, 0), False),
        (dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64), "fp8_w8a8", None, False),
        (dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64), None, (9, 0), False),
        (dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64), "int8_w8a8", (9, 0), False),
    ],
)
def test_swaps_ab_is_vllms_rule(config, quant_dtype, capability, swaps):
    assert swaps_ab(config, quant_dtype, capability) is swaps


def test_swap_ab_is_refused_outside_fp8():
    a, _, _, w, _, _, out_dtype = make_operands(2, 2, 1, 64, 32, "bf16", None)
    weights, ids = random_routing(2, 2, 1, seed=0)
    with pytest.raises(MoetuneError, match="SWAP_AB is the fp8_w8a8 path"):
        run_gemm(
            a, None, w, None, out_dtype, weights, ids, 1, CONFIGS[0], "bf16", None, False,
            swap_ab=True,
        )  # fmt: skip


def test_block_m_8_is_legal_only_where_a_and_b_swap():
    config = dict(CONFIGS[0], BLOCK_SIZE_M=8, BLOCK_SIZE_N=64)
    with pytest.raises(MoetuneError, match="BLOCK_SIZE_M must be at least 16"):
        check_config(config, None, "fp8_w8a8")
    check_config(config, None, "fp8_w8a8", swap_ab=True)
    with pytest.raises(MoetuneError, match="at least 8"):
        check_config(dict(config, BLOCK_SIZE_M=4), None, "fp8_w8a8", swap_ab=True)


def test_block_k_is_clamped_to_the_fp8_weight_block():
    """vLLM runs BLOCK_SIZE_K=64 on [32, 32] blocks as BLOCK_SIZE_K=32 (min of the block's sides)."""
    M, E, top_k, N, K = 5, 4, 2, 64, 96
    a, a_scale, a_ref, w, w_scale, w_ref, out_dtype = make_operands(
        M, E, top_k, N, K, "fp8_w8a8", (32, 32)
    )
    weights, ids = random_routing(M, E, top_k, seed=4)
    config = dict(CONFIGS[0], BLOCK_SIZE_K=64)
    c = run_gemm(
        a, a_scale, w, w_scale, out_dtype, weights, ids, top_k, config, "fp8_w8a8", (32, 32),
        False,
    )  # fmt: skip
    ref = gathered_reference(a_ref, w_ref, weights, ids, top_k, False)
    assert_close("clamped block_k", ref, c, 5e-3)


# vLLM 0.33's kernel parameters in order (positional in its launcher), and the twin's
# name for each; the twin has no bias (vLLM's b_bias_ptr is None, its strides unused).
VLLM_POSITIONAL = {
    "a_ptr": "a_ptr", "b_ptr": "w_ptr", "c_ptr": "c_ptr", "b_bias_ptr": None,
    "a_scale_ptr": "a_scale_ptr", "b_scale_ptr": "w_scale_ptr",
    "topk_weights_ptr": "topk_weights_ptr", "sorted_token_ids_ptr": "sorted_token_ids_ptr",
    "expert_ids_ptr": "expert_ids_ptr", "num_tokens_post_padded_ptr": "num_tokens_post_padded_ptr",
    "N": "N", "K": "K", "EM": "EM", "num_valid_tokens": "num_slots",
    "stride_am": "stride_am", "stride_ak": "stride_ak", "stride_be": "stride_we",
    "stride_bk": "stride_wk", "stride_bn": "stride_wn", "stride_cm": "stride_cm",
    "stride_cn": "stride_cn", "stride_asm": "stride_asm", "stride_ask": "stride_ask",
    "stride_bse": "stride_wse", "stride_bsk": "stride_wsk", "stride_bsn": "stride_wsn",
    "stride_bbe": None, "stride_bbn": None, "group_n": "GROUP_N", "group_k": "GROUP_K",
}  # fmt: skip
VLLM_KEYWORDS = {
    "MUL_ROUTED_WEIGHT": "MUL_ROUTED_WEIGHT", "top_k": "TOP_K", "compute_type": "COMPUTE_TYPE",
    "use_fp8_w8a8": "USE_FP8_W8A8", "use_int8_w8a8": "USE_INT8_W8A8",
    "use_int8_w8a16": "USE_INT8_W8A16", "per_channel_quant": "PER_CHANNEL",
    "naive_block_assignment": "NAIVE_BLOCK_ASSIGNMENT", "BLOCK_SIZE_M": "BLOCK_SIZE_M",
    "BLOCK_SIZE_N": "BLOCK_SIZE_N", "BLOCK_SIZE_K": "BLOCK_SIZE_K",
    "GROUP_SIZE_M": "GROUP_SIZE_M", "SWAP_AB": "SWAP_AB", "num_warps": "num_warps",
    "num_stages": "num_stages",
}  # fmt: skip


class CaptureLaunch:
    """Stands in for a Triton kernel: records ``kernel[grid](*args, **kwargs)``."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def comparable(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.stride())
    return value


def meta_launch(path, rows, top_k, config, naive, routed):
    """`invoke_fused_moe_gemm`'s keywords on meta tensors (E=16, N=96, K=160)."""
    E, N, K = 16, 96, 160
    meta = dict(device="meta")
    quant_dtype, per_channel, block_shape = {
        "bf16": (None, False, None),
        "fp8-tensor": ("fp8_w8a8", False, None),
        "fp8-channel": ("fp8_w8a8", True, None),
        "fp8-block": ("fp8_w8a8", False, (32, 64)),
        "int8-channel": ("int8_w8a8", True, None),
        "int8-w8a16": ("int8_w8a16", False, None),
    }[path]
    element = {"fp8_w8a8": torch.float8_e4m3fn, "int8_w8a8": torch.int8}.get(
        quant_dtype, torch.bfloat16
    )
    w_element = torch.int8 if quant_dtype == "int8_w8a16" else element
    f32 = dict(dtype=torch.float32, **meta)
    a_scale = w_scale = None
    if block_shape is not None:
        a_scale = torch.empty(rows, 3, **f32)
        w_scale = torch.empty(E, 3, 3, **f32)
    elif per_channel:
        a_scale, w_scale = torch.empty(rows, 1, **f32), torch.empty(E, N, **f32)
    elif quant_dtype == "fp8_w8a8":
        a_scale, w_scale = torch.empty(1, **f32), torch.empty(E, **f32)
    elif quant_dtype == "int8_w8a16":
        w_scale = torch.empty(E, N, **f32)
    slots = rows * top_k
    ids = dict(dtype=torch.int32, **meta)
    bm = config["BLOCK_SIZE_M"]
    padded = max_padded_slots(slots, bm, E)
    return dict(
        a=torch.empty(rows, K, dtype=element, **meta),
        w=torch.empty(E, N, K, dtype=w_element, **meta),
        c=torch.empty(slots, N, dtype=torch.bfloat16, **meta),
        a_scale=a_scale,
        w_scale=w_scale,
        topk_weights=torch.empty(slots, **f32) if routed else None,
        sorted_token_ids=None if naive else torch.empty(padded, **ids),
        expert_ids=torch.empty(slots if naive else padded // bm, **ids),
        num_tokens_post_padded=torch.empty(1, **ids),
        mul_routed_weight=routed,
        top_k=top_k,
        config=config,
        quant_dtype=quant_dtype,
        block_shape=block_shape,
        per_channel=per_channel,
    )


@pytest.mark.parametrize("naive", [False, True], ids=["aligned", "naive"])
@pytest.mark.parametrize("rows,top_k,routed", [(3, 8, False), (200, 8, False), (24, 1, True)])
@pytest.mark.parametrize(
    "path", ["bf16", "fp8-tensor", "fp8-channel", "fp8-block", "int8-channel", "int8-w8a16"]
)
@pytest.mark.parametrize("block_m,block_n,block_k", [(16, 64, 128), (64, 128, 64), (8, 64, 128)])
def test_launch_passes_what_vllms_launcher_passes(
    monkeypatch, path, rows, top_k, routed, naive, block_m, block_n, block_k
):
    """On an sm90 device the twin's launcher gives its kernel the grid, arguments and
    constexprs vLLM 0.33's launcher gives vLLM's (what makes the same specialization,
    hence the same SASS: bench/sass_loop.py)."""
    import moetune.kernel.fused_moe_kernel as kernel_module
    from moetune.engines.launch import vllm_0_33
    from moetune.engines.launch.common import GemmCall

    config = dict(
        BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k, GROUP_SIZE_M=16,
        num_warps=4, num_stages=3,
    )  # fmt: skip
    sm90 = (9, 0)
    names = list(inspect.signature(kernel_module.fused_moe_kernel.fn).parameters)
    if block_m == 8 and not swaps_ab(config, "fp8_w8a8" if "fp8" in path else None, sm90):
        pytest.skip("BLOCK_SIZE_M 8 is for swapped fp8 only")
    launch = meta_launch(path, rows, top_k, config, naive, routed)
    vllm = CaptureLaunch()
    vllm_0_33.launch(vllm, GemmCall(**launch), capability=sm90)
    twin = CaptureLaunch()
    monkeypatch.setattr(kernel_module, "fused_moe_kernel", twin)
    monkeypatch.setattr(kernel_module, "device_capability", lambda tensor: sm90)
    kernel_module.invoke_fused_moe_gemm(**launch)

    (vllm_grid, vllm_args, vllm_kwargs), (grid, args, kwargs) = vllm.calls[0], twin.calls[0]
    assert grid == vllm_grid
    ours = dict(zip(names, args, strict=False)) | kwargs
    assert ours["a_desc"] is None and ours["w_desc"] is None and ours["C_SORTED"] is False
    theirs = dict(zip(VLLM_POSITIONAL, vllm_args, strict=True)) | vllm_kwargs
    assert theirs["b_bias_ptr"] is None and theirs["HAS_BIAS"] is False
    assert theirs["USE_TD"] is False and theirs["SPLIT_K"] == 1
    for vllm_name, name in (VLLM_POSITIONAL | VLLM_KEYWORDS).items():
        if name is not None:
            assert comparable(ours[name]) == comparable(theirs[vllm_name]), (vllm_name, name)
