"""The fused-MoE grouped GEMM for int4 w4a16 weights (the engines' ``moe_wna16`` Triton path).

Same tiling, grid, alignment and program order as `fused_moe_kernel` (so a tuned
config means the same thing), but the weights are packed int4 with group-wise
scales, laid out as vLLM's and SGLang's ``fused_moe_kernel_gptq_awq`` reads them
(`moetune.kernel.quant_wna16` documents the layout):

    w        uint8 [E, N, K // 2]          two 4-bit codes per byte along K, low nibble first
    w_scale  bf16/fp16 [E, N, cdiv(K, G)]  one scale per group of G = group_size columns of K
    w_zp     uint8 [E, N // 2, cdiv(K, G)] optional zero points, two per byte along N

Each K step loads a ``BLOCK_SIZE_K // 2 x BLOCK_SIZE_N`` tile of bytes, splits
every byte into its two codes (row ``k`` of the tile takes byte ``k // 2`` shifted
by ``4 * (k % 2)``), gathers the ``BLOCK_SIZE_K x BLOCK_SIZE_N`` scales of those
columns (``(k0 + k) // G``, so any BLOCK_SIZE_K works with any group size, as in
the engines), dequantizes ``(code - zero) * scale`` in fp32 with zero = 8 when the
checkpoint has no zero points, rounds to the compute dtype and runs a
bf16/fp16 tensor-core dot with an fp32 accumulator. Rows are scaled by their
routing weight at the end (GEMM2).

Code generation: N and K are constexpr and the body follows the engines' kernel
expression by expression (int32 slot ids and row offsets, int64 weight columns
wrapped with ``% N``, the scale pointers rebuilt every K step, A's K mask kept on
even K), so that Triton and ptxas emit the engine's SASS: the same instructions
and registers for the configs and shape checked (``bench/sass_loop.py --int4``,
sm_90a, Triton 3.6 and 3.9: the int4 SASS listings BENCHMARKS.md's results folders list).
A tuner's kernel should time what the engine runs. The cost is a compile per (N, K), which a tune of one shape pays once. Only ragged K
differs: the weight load is masked past K (the engine's reads past the tensor).

Interpreter (``INTERPRETER_BF16``, Triton 3.9's CPU interpreter, bf16 only): the
dequantized tile and A are upcast to fp32 for the dot, and the stored tile is
rounded to bf16 by hand, as in `fused_moe_kernel`; compiled kernels never take
that branch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from moetune.errors import MoetuneError
from moetune.kernel.fused_moe_kernel import _round_to_bf16_grid, check_config, interpreting

if TYPE_CHECKING:
    import torch

SYMMETRIC_ZERO_POINT = 8  # the code of 0.0 when a checkpoint has no zero points


@triton.jit
def _store_zeros(c_ptr, stride_cm, stride_cn, pid_n, N, offs_token, token_mask, BM, BN, dtype):
    # Slots of another rank's expert (int32 offsets, as in the engine kernel).
    zeros = tl.zeros((BM, BN), dtype=dtype)
    offs_cn = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, zeros, mask=token_mask[:, None] & (offs_cn[None, :] < N))


@triton.jit
def fused_moe_wna16_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    w_scale_ptr,
    w_zp_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    # constexpr as in the engines' fused_moe_kernel_gptq_awq: one compile per shape
    N: tl.constexpr,
    K: tl.constexpr,
    EM,
    num_slots,
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    stride_wse,
    stride_wsn,
    stride_wsk,
    stride_wze,
    stride_wzn,
    stride_wzk,
    GROUP_SIZE: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    TOP_K: tl.constexpr,
    COMPUTE_TYPE: tl.constexpr,
    HAS_ZP: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETER_BF16: tl.constexpr,
):
    # The body follows the engines' kernel expression by expression (integer widths,
    # operand order, the scale pointers rebuilt every step, A's K mask kept when
    # EVEN_K), so that ptxas emits the engine's code (`bench/sass_loop.py --int4`).
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
    if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
        return

    offs_token_id = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    offs_token = tl.load(sorted_token_ids_ptr + offs_token_id)  # int32 slot ids
    token_mask = offs_token < num_slots

    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert == -1:
        _store_zeros(
            c_ptr,
            stride_cm,
            stride_cn,
            pid_n,
            N,
            offs_token,
            token_mask,
            BLOCK_SIZE_M,
            BLOCK_SIZE_N,
            COMPUTE_TYPE,
        )
        return

    # Out-of-range columns wrap around (never stored), as in fused_moe_kernel.
    offs_wn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_token[:, None] // TOP_K * stride_am + offs_k[None, :] * stride_ak)
    w_ptrs = (
        w_ptr
        + expert * stride_we
        + (offs_k[:, None] // 2) * stride_wk
        + offs_wn[None, :] * stride_wn
    )
    shift = (offs_k[:, None] % 2) * 4
    if HAS_ZP:
        zp_shift = (offs_wn[None, :] % 2) * 4

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            k_mask = None
            k_other = None
        else:
            # Past K the scale is 0, so the (finite) padded codes contribute 0.
            k_mask = offs_k[:, None] < K - k * BLOCK_SIZE_K
            k_other = 0.0
        a = tl.load(
            a_ptrs,
            mask=token_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_SIZE_K),
            other=0.0,
        )
        if EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=k_mask, other=0)
        w = (w >> shift) & 0xF
        scale_ptrs = (
            w_scale_ptr
            + expert * stride_wse
            + offs_wn[None, :] * stride_wsn
            + ((offs_k[:, None] + BLOCK_SIZE_K * k) // GROUP_SIZE) * stride_wsk
        )
        scale = tl.load(scale_ptrs, mask=k_mask, other=k_other).to(tl.float32)
        if HAS_ZP:
            # The group index again, written where the engine writes it (same SASS).
            k_group = (offs_k[:, None] + BLOCK_SIZE_K * k) // GROUP_SIZE
            zp_ptrs = (
                w_zp_ptr
                + expert * stride_wze
                + (offs_wn[None, :] // 2) * stride_wzn
                + k_group * stride_wzk
            )
            zp = tl.load(zp_ptrs, mask=k_mask, other=k_other)
            zero = ((zp >> zp_shift) & 0xF).to(tl.float32)
        else:
            zero = 8.0  # SYMMETRIC_ZERO_POINT (a plain global is not allowed in a jit function)
        w_deq = (w.to(tl.float32) - zero) * scale
        if INTERPRETER_BF16:
            accumulator = tl.dot(a.to(tl.float32), _round_to_bf16_grid(w_deq), acc=accumulator)
        else:
            accumulator = tl.dot(a, w_deq.to(COMPUTE_TYPE), acc=accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        w_ptrs += (BLOCK_SIZE_K // 2) * stride_wk

    if MUL_ROUTED_WEIGHT:
        routed_weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)
        accumulator = accumulator * routed_weight[:, None]
    if INTERPRETER_BF16:
        accumulator = _round_to_bf16_grid(accumulator)
    accumulator = accumulator.to(COMPUTE_TYPE)
    # int32 offsets, built after the K loop, as in the engine kernel (the launcher checks
    # they fit).
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, accumulator, mask=token_mask[:, None] & (offs_cn[None, :] < N))


def invoke_fused_moe_wna16_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    c: torch.Tensor,
    *,
    w_scale: torch.Tensor,
    w_zp: torch.Tensor | None,
    group_size: int,
    topk_weights: torch.Tensor | None,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: dict,
) -> torch.Tensor:
    """Launch `fused_moe_wna16_kernel` once: ``c[slot] = a[slot // top_k] @ dequant(w[expert(slot)]).T``.

    a ``[rows, K]`` bf16/fp16, w uint8 ``[E, N, K // 2]``, c ``[num_slots, N]`` (or
    ``[M, top_k, N]``) in a's dtype. No host synchronisation. Returns ``c``.
    """
    import torch

    check_config(config)
    assert w.dim() == 3 and w.dtype == torch.uint8, "w must be packed int4: uint8 [E, N, K // 2]"
    num_experts, n, k_half = w.shape
    k = a.shape[1]
    assert a.dim() == 2 and k == 2 * k_half, f"a must be [rows, {2 * k_half}], got {list(a.shape)}"
    groups = triton.cdiv(k, group_size)
    assert w_scale.shape == (num_experts, n, groups), f"w_scale must be [E, {n}, {groups}]"
    if w_zp is not None:
        assert w_zp.dtype == torch.uint8 and w_zp.shape == (num_experts, n // 2, groups), (
            f"w_zp must be uint8 [E, {n // 2}, {groups}]"
        )
    c2 = c.view(-1, c.shape[-1])
    assert c2.shape[1] == n, f"c must have {n} columns, got {c2.shape[1]}"
    num_slots = c2.shape[0]
    assert a.shape[0] * top_k == num_slots, "a must have num_slots // top_k rows"
    assert c.dtype in (torch.bfloat16, torch.float16) and a.dtype == c.dtype, (
        "a and c must share a bf16/fp16 dtype"
    )
    assert sorted_token_ids.dtype == torch.int32 and expert_ids.dtype == torch.int32, (
        "alignment ids must be int32"
    )
    if mul_routed_weight:
        assert topk_weights is not None and topk_weights.numel() == num_slots, (
            "need one routing weight per slot"
        )
        assert topk_weights.is_contiguous(), "topk_weights must be contiguous"

    # The kernel's row offsets into A and C are int32, as in the engines' kernel.
    rows_end = (a.shape[0] - 1) * a.stride(0) + (k - 1) * a.stride(1)
    if max(rows_end, (num_slots - 1) * c2.stride(0) + (n - 1) * c2.stride(1)) >= 2**31:
        raise MoetuneError(
            f"{num_slots} slots of [{k}] -> [{n}] are too many for the int4 kernel's int32 offsets"
        )
    zp_strides = (w_zp.stride(0), w_zp.stride(1), w_zp.stride(2)) if w_zp is not None else (0, 0, 0)
    compute_type = tl.bfloat16 if c.dtype == torch.bfloat16 else tl.float16
    em = min(sorted_token_ids.shape[0], num_slots * config["BLOCK_SIZE_M"])
    grid = (triton.cdiv(em, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    fused_moe_wna16_kernel[grid](
        a,
        w,
        c2,
        w_scale,
        w_zp,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        n,
        k,
        em,
        num_slots,
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        c2.stride(0),
        c2.stride(1),
        w_scale.stride(0),
        w_scale.stride(1),
        w_scale.stride(2),
        *zp_strides,
        GROUP_SIZE=group_size,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        TOP_K=top_k,
        COMPUTE_TYPE=compute_type,
        HAS_ZP=w_zp is not None,
        EVEN_K=k % config["BLOCK_SIZE_K"] == 0,
        INTERPRETER_BF16=interpreting() and c.dtype == torch.bfloat16,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return c
