"""A stand-in for vLLM's ``fused_moe_kernel_gptq_awq`` (never committed here) in tests.

It has the engine kernel's parameter list (names and order as vLLM declares them:
weight strides expert/k/n, scale and zero-point strides expert/k/n, N and K constexpr,
``block_k_diviable``, ``SPLIT_K``) and forwards to moetune's int4 kernel, so
bench/parity.py's vLLM launcher can be checked on the CPU: a launcher that passes
an argument in the wrong place computes wrong numbers. tests/bench/test_parity.py
makes its wrong twin from this text (`swapped_standin`): the weight's k and n strides
read the other way round, what a launcher written in moetune's order would feed
vLLM's kernel.
"""

import triton
import triton.language as tl

from moetune.kernel.fused_moe_wna16_kernel import fused_moe_wna16_kernel


@triton.jit
def fused_moe_kernel_gptq_awq(
    a_ptr,
    b_ptr,
    c_ptr,
    b_scale_ptr,
    b_zp_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    N: tl.constexpr,
    K: tl.constexpr,
    EM,
    num_valid_tokens,
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_bse,
    stride_bsk,
    stride_bsn,
    stride_bze,
    stride_bzk,
    stride_bzn,
    block_k_diviable: tl.constexpr,
    group_size: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    top_k: tl.constexpr,
    compute_type: tl.constexpr,
    has_zp: tl.constexpr,
    use_int4_w4a16: tl.constexpr,
    use_int8_w8a16: tl.constexpr,
):
    fused_moe_wna16_kernel(
        a_ptr,
        b_ptr,
        c_ptr,
        b_scale_ptr,
        b_zp_ptr,
        topk_weights_ptr,
        sorted_token_ids_ptr,
        expert_ids_ptr,
        num_tokens_post_padded_ptr,
        N,
        K,
        EM,
        num_valid_tokens,
        stride_am,
        stride_ak,
        stride_be,
        stride_bn,
        stride_bk,
        stride_cm,
        stride_cn,
        stride_bse,
        stride_bsn,
        stride_bsk,
        stride_bze,
        stride_bzn,
        stride_bzk,
        group_size,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        GROUP_SIZE_M,
        MUL_ROUTED_WEIGHT,
        top_k,
        compute_type,
        has_zp,
        block_k_diviable,
        False,
    )
