"""The fused-MoE grouped GEMM: one Triton kernel, launched twice per MoE call.

Each program computes one ``BLOCK_SIZE_M x BLOCK_SIZE_N`` tile of ``C = A @ W[e].T``
for the rows of one block of ``sorted_token_ids``. Alignment (``align.py``) grouped
the token slots by expert and padded each expert's run to a multiple of
``BLOCK_SIZE_M``, so every block of rows belongs to a single expert ``e``: the
kernel gathers those rows of A, multiplies them by that expert's weight tile, and
scatters the result to the slots' rows of C.

    GEMM1 (gate/up):  A = x [M, K],              W = w1 [E, 2N, K], C = [M*top_k, 2N]
    GEMM2 (down):     A = act [M*top_k, N],      W = w2 [E, K, N],  C = [M*top_k, K]
                      (rows scaled by their top-k routing weight)

The tiling is vLLM's and SGLang's, so a tuned config means the same thing here and
there: a 1-D grid of ``cdiv(EM, BLOCK_SIZE_M) * cdiv(N, BLOCK_SIZE_N)`` programs,
swizzled in groups of ``GROUP_SIZE_M`` row-blocks for L2 reuse (Triton tutorial 03),
one K loop of ``BLOCK_SIZE_K`` steps pipelined over ``num_stages``, ``num_warps``
warps per program. ``BLOCK_SIZE_M`` is also the alignment padding. As in vLLM, EM is
capped at ``num_slots * BLOCK_SIZE_M`` (every used row-block holds a slot), which
keeps the grid small at small M whatever the alignment's static bound.

Arrays of one launch (``slot = token * top_k + k``; ``num_slots = M * top_k``):

| array | shape | dtype | meaning |
|---|---|---|---|
| ``a`` | ``[num_slots // top_k, K]`` | bf16/fp16; fp8 / int8 for w8a8 | rows gathered as ``slot // top_k`` (top_k=1 for GEMM2) |
| ``w`` | ``[E, N, K]`` | bf16/fp16; fp8 / int8 (w8a8); int8 (w8a16) | one weight matrix per expert, out-features first |
| ``c`` | ``[num_slots, N]`` | bf16/fp16 (compute dtype) | output row per slot |
| ``a_scale`` | ``[1]`` per-tensor, ``[rows, 1]`` per-token, ``[rows, cdiv(K, block_k)]`` block | fp32 | activation dequant scale (w8a8) |
| ``w_scale`` | ``[E]`` per-tensor, ``[E, N]`` per-channel, ``[E, cdiv(N, block_n), cdiv(K, block_k)]`` block | fp32 | weight dequant scale |
| ``topk_weights`` | ``[M, top_k]`` | fp32 | routing weight of each slot (GEMM2 only) |
| ``sorted_token_ids`` | ``[EM]`` | int32 | slots grouped by expert; pad value ``num_slots`` |
| ``expert_ids`` | ``[EM // BLOCK_SIZE_M]`` | int32 | expert of each row-block; -1: write zeros |
| ``num_tokens_post_padded`` | ``[1]`` | int32 | used length of ``sorted_token_ids``; blocks past it exit |

SGLang's TMA layout (`moetune.kernel.tma`, launch flags of `invoke_fused_moe_gemm`):
``C_SORTED`` stores row ``p`` of C at sorted position ``p`` instead of slot
``sorted_token_ids[p]`` (an expert-contiguous, BLOCK_SIZE_M-padded layout with
``len(sorted_token_ids)`` rows); ``a_desc`` reads such an A through a TMA descriptor,
one [BLOCK_SIZE_M, BLOCK_SIZE_K] box per step at the block's sorted position; ``w_desc``
reads the weight tile [1, BLOCK_SIZE_N, BLOCK_SIZE_K] through a descriptor. TMA
zero-fills boxes past a tensor's edge, so those loads take no masks.

Quantization paths (``quant_dtype``): None (bf16/fp16 tensor cores); ``"fp8_w8a8"``
per-tensor (fp8 x fp8 tensor-core dot, both scales applied once at the end);
``"fp8_w8a8"`` with ``block_shape=(block_n, block_k)`` (per-token-group activation
scales and per-block weight scales applied to every K step's partial product, which
needs ``block_k % BLOCK_SIZE_K == 0``); ``"int8_w8a16"`` per output channel (int8
weights converted to the compute dtype in registers, scale applied at the end);
``"fp8_w8a8"`` / ``"int8_w8a8"`` with ``per_channel`` (per-output-channel weight
scales ``[E, N]`` and dynamic per-token activation scales ``[rows, 1]``, applied once
at the end; int8 x int8 dots give int32, added to the fp32 accumulator each K step
as vLLM and SGLang do). int8 w8a16 with block (group) scales is not implemented and
is refused; int4 w4a16 has its own kernel (``fused_moe_wna16_kernel.py``). fp8 and
int8 dots need ``BLOCK_SIZE_K >= 32``: Triton refuses a narrower fp8 dot on Hopper
(seen on the H200 with Triton 3.6; int8 MMA reduces over 32 too), so `check_config`
refuses it on every machine.

Triton's CPU interpreter (``TRITON_INTERPRET=1``, checked on Triton 3.9) mishandles
bf16: ``tl.dot`` on two bf16 operands returns garbage (fp16 and fp8 are exact),
int8 -> bf16 casts return garbage, and fp32 -> bf16 casts truncate instead of
rounding to nearest even. In interpreter mode only (``INTERPRETER_BF16``), bf16 dot
operands are upcast to fp32 and the fp32 -> bf16 store is rounded by hand.
Compiled kernels never take those branches.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from moetune.errors import MoetuneError
from moetune.kernel.config import CONFIG_KEYS

if TYPE_CHECKING:
    import torch

QUANT_DTYPES = ("fp8_w8a8", "int8_w8a8", "int8_w8a16")  # int4_w4a16: fused_moe_wna16_kernel
EIGHT_BIT_DOT_DTYPES = ("fp8_w8a8", "int8_w8a8")  # 8-bit tensor-core dots: BLOCK_SIZE_K >= 32


@triton.jit
def _round_to_bf16_grid(x):
    """fp32 ``x`` rounded to the nearest bf16 value (ties to even), still fp32."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _store_tile(
    c_ptr, tile, rows, row_mask, pid_n, N, stride_cm, stride_cn, BLOCK_SIZE_N: tl.constexpr
):
    # Built only after the K loop, from int32 row ids: the column offsets and the
    # 64-bit output offsets are never live across the loop, where an 8-warp
    # 128 x 256 tile already holds 128 fp32 accumulator registers per thread.
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + (rows.to(tl.int64)[:, None] * stride_cm + offs_cn[None, :] * stride_cn)
    tl.store(c_ptrs, tile, mask=row_mask[:, None] & (offs_cn[None, :] < N))


@triton.jit
def fused_moe_kernel(
    # Pointers to matrices; a_desc / w_desc: TMA descriptors of a / w, or None
    a_ptr,
    a_desc,
    w_ptr,
    w_desc,
    c_ptr,
    a_scale_ptr,
    w_scale_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    # Matrix dimensions: N out-features, K reduction, EM the length of
    # sorted_token_ids, num_slots = M * top_k (also the padding value)
    N,
    K,
    EM,
    num_slots,
    # Strides: how far a pointer moves for one step along a dimension
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_wse,
    stride_wsn,
    stride_wsk,
    # Quantization: the weight block shape (0 when not block-quantized)
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    # Meta-parameters
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    TOP_K: tl.constexpr,
    COMPUTE_TYPE: tl.constexpr,
    USE_FP8_W8A8: tl.constexpr,
    USE_INT8_W8A16: tl.constexpr,
    USE_INT8_W8A8: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    EVEN_K: tl.constexpr,
    C_SORTED: tl.constexpr,
    INTERPRETER_BF16: tl.constexpr,
):
    # Swizzled program order (tutorial 03, "L2 Cache Optimizations").
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
    # Slot ids stay int32 (they are < M * top_k): they are live across the K loop.
    offs_token = tl.load(sorted_token_ids_ptr + offs_token_id)
    token_mask = offs_token < num_slots
    # C_SORTED: the output row is the sorted position (expert-contiguous, padded
    # layout that a TMA read of the next GEMM's A needs), not the slot.
    if C_SORTED:
        c_rows = offs_token_id
    else:
        c_rows = offs_token

    expert = tl.load(expert_ids_ptr + pid_m)
    if expert == -1:
        # A block of slots routed to no local expert: they contribute nothing.
        zeros = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=COMPUTE_TYPE)
        _store_tile(c_ptr, zeros, c_rows, token_mask, pid_n, N, stride_cm, stride_cn, BLOCK_SIZE_N)
        return

    # Out-of-range weight columns wrap around instead of being masked: their
    # results are never stored, and the weight loads stay unpredicated. Offsets
    # inside one expert's matrix are int32 (the launcher checks they fit); only the
    # expert's base offset is 64-bit.
    offs_wn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    # Integer offsets are summed first and added to the base pointer once, and the
    # weight offsets are int32. Adding a [BLOCK_SIZE_M, 1] and then a [1, BLOCK_SIZE_K]
    # offset to the pointer, or 64-bit weight column offsets, make ptxas advance the
    # 64-bit pointers with IMAD.WIDE and register moves inside the K loop (Triton 3.6,
    # sm_90, 128 x 256 x 64 bf16: 132 SASS instructions per iteration instead of 99;
    # vLLM's kernel: 107).
    if a_desc is None:
        a_rows = (offs_token // TOP_K).to(tl.int64)
        a_ptrs = a_ptr + (a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak)
    else:
        # TMA reads A's rows at their sorted positions (the up GEMM wrote them there).
        a_rows = offs_token_id
    if w_desc is None:
        w_ptrs = (
            w_ptr
            + expert.to(tl.int64) * stride_we
            + (offs_k[:, None] * stride_wk + offs_wn[None, :] * stride_wn)
        )

    if USE_INT8_W8A16:
        w_scale = tl.load(w_scale_ptr + expert * stride_wse + offs_wn * stride_wsn)
    if USE_FP8_W8A8 or USE_INT8_W8A8:
        if GROUP_K > 0:
            a_scale_ptrs = a_scale_ptr + a_rows * stride_asm
            w_scale_ptrs = w_scale_ptr + expert * stride_wse + (offs_wn // GROUP_N) * stride_wsn
        elif PER_CHANNEL:
            w_scale = tl.load(w_scale_ptr + expert * stride_wse + offs_wn * stride_wsn)
            a_scale = tl.load(a_scale_ptr + a_rows * stride_asm, mask=token_mask, other=0.0)
        else:
            a_scale = tl.load(a_scale_ptr)
            w_scale = tl.load(w_scale_ptr + expert * stride_wse)

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        # TMA tiles are zero-filled past the tensor's edges: no masks.
        if a_desc is not None:
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=token_mask[:, None], other=0.0)
        else:
            a = tl.load(
                a_ptrs,
                mask=token_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_SIZE_K),
                other=0.0,
            )
        if w_desc is not None:
            w = w_desc.load([expert, pid_n * BLOCK_SIZE_N, k * BLOCK_SIZE_K])
            w = w.reshape(BLOCK_SIZE_N, BLOCK_SIZE_K).T
        elif EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        if INTERPRETER_BF16:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        elif USE_INT8_W8A16:
            w = w.to(COMPUTE_TYPE)
        if USE_FP8_W8A8 and GROUP_K > 0:
            k_group = (k * BLOCK_SIZE_K) // GROUP_K
            a_scale = tl.load(a_scale_ptrs + k_group * stride_ask, mask=token_mask, other=0.0)
            w_scale = tl.load(w_scale_ptrs + k_group * stride_wsk)
            accumulator += tl.dot(a, w) * a_scale[:, None] * w_scale[None, :]
        elif USE_INT8_W8A8:
            # int8 x int8 -> int32 on the GPU (fp32 operands in the interpreter)
            accumulator += tl.dot(a, w).to(tl.float32)
        else:
            accumulator = tl.dot(a, w, acc=accumulator)
        if a_desc is None:
            a_ptrs += BLOCK_SIZE_K * stride_ak
        if w_desc is None:
            w_ptrs += BLOCK_SIZE_K * stride_wk

    if MUL_ROUTED_WEIGHT:
        routed_weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0.0)
        accumulator = accumulator * routed_weight[:, None]
    if USE_INT8_W8A16:
        accumulator = accumulator * w_scale[None, :]
    if (USE_FP8_W8A8 or USE_INT8_W8A8) and PER_CHANNEL:
        accumulator = accumulator * a_scale[:, None] * w_scale[None, :]
    elif USE_FP8_W8A8 and GROUP_K == 0:
        accumulator = accumulator * (a_scale * w_scale)
    if INTERPRETER_BF16:
        accumulator = _round_to_bf16_grid(accumulator)
    _store_tile(
        c_ptr,
        accumulator.to(COMPUTE_TYPE),
        c_rows,
        token_mask,
        pid_n,
        N,
        stride_cm,
        stride_cn,
        BLOCK_SIZE_N,
    )


def check_config(
    config: dict, block_shape: tuple[int, int] | None = None, quant_dtype: str | None = None
) -> None:
    """Raise `MoetuneError` unless `config` is a usable kernel config for the quantization."""
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise MoetuneError(f"kernel config {config} lacks {', '.join(missing)}")
    for key in CONFIG_KEYS:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MoetuneError(f"kernel config {key} must be a positive integer, got {value!r}")
    for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps"):
        if config[key] & (config[key] - 1):
            raise MoetuneError(f"kernel config {key} must be a power of two, got {config[key]}")
    if config["BLOCK_SIZE_M"] < 16 or config["BLOCK_SIZE_N"] < 16 or config["BLOCK_SIZE_K"] < 16:
        raise MoetuneError(
            "kernel config BLOCK_SIZE_M, BLOCK_SIZE_N and BLOCK_SIZE_K must be at least 16 (tl.dot)"
        )
    if quant_dtype in EIGHT_BIT_DOT_DTYPES and config["BLOCK_SIZE_K"] < 32:
        raise MoetuneError(
            f"{quant_dtype} needs BLOCK_SIZE_K >= 32: Hopper's 8-bit tensor-core dot reduces over 32"
        )
    if block_shape is not None and block_shape[1] % config["BLOCK_SIZE_K"]:
        raise MoetuneError(
            f"BLOCK_SIZE_K={config['BLOCK_SIZE_K']} must divide the quantization block's "
            f"K size {block_shape[1]}: one weight scale per K step"
        )


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def invoke_fused_moe_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    c: torch.Tensor,
    *,
    a_scale: torch.Tensor | None,
    w_scale: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: dict,
    quant_dtype: str | None,
    block_shape: tuple[int, int] | None,
    a_use_tma: bool = False,
    w_use_tma: bool = False,
    c_sorted: bool = False,
    per_channel: bool = False,
) -> torch.Tensor:
    """Launch `fused_moe_kernel` once: ``c[slot] = a[slot // top_k] @ w[expert(slot)].T``.

    Shapes and dtypes are in the module docstring; ``c`` may be ``[M, top_k, N]``
    (it is viewed as ``[num_slots, N]``). No host synchronisation: safe inside a
    CUDA graph capture. Returns ``c``.

    SGLang's TMA layout (see `moetune.kernel.tma`):
    - ``c_sorted``: row ``p`` of ``c`` is sorted position ``p`` (``c`` has
      ``len(sorted_token_ids)`` rows; ``num_slots = a.shape[0] * top_k``);
    - ``a_use_tma``: ``a`` is such a sorted-layout tensor, read through a TMA
      descriptor at the sorted positions (``top_k`` must be 1);
    - ``w_use_tma``: ``w`` is read through a TMA descriptor.
    """
    import torch

    from moetune.kernel.tma import SplitConfigError, check_tma_quant, make_descriptor

    check_config(config, block_shape, quant_dtype)
    if quant_dtype is not None and quant_dtype not in QUANT_DTYPES:
        raise MoetuneError(
            f"unknown quantization {quant_dtype!r}; expected one of {', '.join(QUANT_DTYPES)}"
        )
    if block_shape is not None and quant_dtype != "fp8_w8a8":
        raise MoetuneError(
            f"block-quantized weights are implemented for fp8_w8a8 only, not {quant_dtype}"
        )
    assert w.dim() == 3, "w must be [E, N, K]"
    num_experts, n, k = w.shape
    assert a.dim() == 2 and a.shape[1] == k, f"a must be [rows, {k}], got {list(a.shape)}"
    c2 = c.view(-1, c.shape[-1])
    assert c2.shape[1] == n, f"c must have {n} columns, got {c2.shape[1]}"
    if a_use_tma or w_use_tma:
        check_tma_quant(quant_dtype, block_shape)
    if a_use_tma and (top_k != 1 or c_sorted):
        raise SplitConfigError("a TMA-read A is the down GEMM's: top_k must be 1, c unsorted")
    if c_sorted:
        num_slots = a.shape[0] * top_k
        assert c2.shape[0] >= sorted_token_ids.shape[0], (
            "a sorted c needs one row per sorted position"
        )
    else:
        num_slots = c2.shape[0]
        if a_use_tma:
            assert a.shape[0] >= sorted_token_ids.shape[0], (
                "a TMA-read A needs one row per sorted position"
            )
        else:
            assert a.shape[0] * top_k == num_slots, "a must have num_slots // top_k rows"
    assert c.dtype in (torch.bfloat16, torch.float16), "c must be bf16 or fp16"
    assert sorted_token_ids.dtype == torch.int32 and expert_ids.dtype == torch.int32, (
        "alignment ids must be int32"
    )
    if mul_routed_weight:
        assert topk_weights is not None and topk_weights.numel() == num_slots, (
            "need one routing weight per slot"
        )
        assert topk_weights.is_contiguous(), "topk_weights must be contiguous"

    use_fp8 = quant_dtype == "fp8_w8a8"
    use_int8_w8a16 = quant_dtype == "int8_w8a16"
    use_int8_w8a8 = quant_dtype == "int8_w8a8"
    assert not per_channel or quant_dtype in EIGHT_BIT_DOT_DTYPES, (
        "per_channel is for fp8_w8a8 and int8_w8a8"
    )
    assert not use_int8_w8a8 or per_channel, "int8_w8a8 is implemented per channel only"
    if use_int8_w8a8:
        assert a.dtype == torch.int8 and w.dtype == torch.int8, "int8_w8a8 needs int8 a and w"
        assert a_scale is not None and w_scale is not None, "int8_w8a8 needs a_scale and w_scale"
    if use_fp8:
        assert a.dtype == torch.float8_e4m3fn and w.dtype == torch.float8_e4m3fn, (
            "fp8_w8a8 needs fp8 a and w"
        )
        assert a_scale is not None and w_scale is not None, "fp8_w8a8 needs a_scale and w_scale"
    elif use_int8_w8a16:
        assert w.dtype == torch.int8 and a.dtype == c.dtype, (
            "int8_w8a16 needs int8 w and a in the compute dtype"
        )
        assert w_scale is not None and w_scale.shape == (num_experts, n), (
            "int8_w8a16 needs w_scale [E, N]"
        )
    elif not use_int8_w8a8:
        assert a.dtype == c.dtype and w.dtype == c.dtype, "a, w and c must share a dtype"

    if (n - 1) * w.stride(1) + (k - 1) * w.stride(2) >= 2**31:
        raise MoetuneError(
            f"one expert's weight matrix [{n}, {k}] is too large for the kernel's int32 offsets"
        )
    group_n, group_k = block_shape if block_shape is not None else (0, 0)
    a_scale_strides = (0, 0)
    w_scale_strides = (0, 0, 0)
    if use_fp8 and block_shape is not None:
        groups_k = triton.cdiv(k, group_k)
        assert a_scale.shape == (a.shape[0], groups_k), (
            f"a_scale must be [{a.shape[0]}, {groups_k}]"
        )
        assert w_scale.shape == (num_experts, triton.cdiv(n, group_n), groups_k), (
            "w_scale must be [E, N/bn, K/bk]"
        )
        a_scale_strides = (a_scale.stride(0), a_scale.stride(1))
        w_scale_strides = (w_scale.stride(0), w_scale.stride(1), w_scale.stride(2))
    elif per_channel:
        assert a_scale.shape[0] == a.shape[0] and a_scale.numel() == a.shape[0], (
            f"per-token a_scale must be [{a.shape[0]}, 1]"
        )
        assert w_scale.shape == (num_experts, n), f"per-channel w_scale must be [E, {n}]"
        a_scale_strides = (a_scale.stride(0), 0)
        w_scale_strides = (w_scale.stride(0), w_scale.stride(1), 0)
    elif use_fp8:
        assert a_scale.numel() == 1 and w_scale.numel() == num_experts, (
            "per-tensor fp8 scales: a [1], w [E]"
        )
        w_scale_strides = (w_scale.stride(0), 0, 0)
    elif use_int8_w8a16:
        w_scale_strides = (w_scale.stride(0), w_scale.stride(1), 0)

    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    a_desc = make_descriptor(a, (bm, bk), "A") if a_use_tma else None
    w_desc = make_descriptor(w, (1, bn, bk), "w") if w_use_tma else None
    compute_type = tl.bfloat16 if c.dtype == torch.bfloat16 else tl.float16
    # Every used row-block holds at least one slot, so at most num_slots blocks are
    # used whatever the static bound of the alignment: a smaller grid at small M.
    em = min(sorted_token_ids.shape[0], num_slots * config["BLOCK_SIZE_M"])
    grid = (triton.cdiv(em, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    fused_moe_kernel[grid](
        a,
        a_desc,
        w,
        w_desc,
        c2,
        a_scale,
        w_scale,
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
        *a_scale_strides,
        *w_scale_strides,
        GROUP_N=group_n,
        GROUP_K=group_k,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        TOP_K=top_k,
        COMPUTE_TYPE=compute_type,
        USE_FP8_W8A8=use_fp8,
        USE_INT8_W8A16=use_int8_w8a16,
        USE_INT8_W8A8=use_int8_w8a8,
        PER_CHANNEL=per_channel,
        EVEN_K=k % config["BLOCK_SIZE_K"] == 0,
        C_SORTED=c_sorted,
        INTERPRETER_BF16=interpreting() and c.dtype == torch.bfloat16,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return c
