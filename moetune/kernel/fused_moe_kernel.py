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
warps per program. ``BLOCK_SIZE_M`` is also the alignment padding.

The twin of vLLM 0.34's ``fused_moe_kernel``: a tuner's kernel should time what the
engine runs, so the body follows vLLM's expression by expression (64-bit slot and
weight-column offsets, the K mask on every load, dequantization before the routing
weight) and is launched as vLLM launches it (`invoke_fused_moe_gemm`). Against vLLM 0.34.0's
kernel launched as 0.34 launches it (`moetune.engines.launch.vllm_0_34`) it compiles to the
same SASS on bf16, fp16, fp8 per tensor, per channel and block [128, 128] (TMA-B and the one
weight scale per tile included, Triton 3.6; Triton 3.9 does not compile 0.34's per-tile
scale), int8 w8a8 and w8a16, up and down GEMM, naive and aligned
(``bench/sass_loop.py --vllm-release 0.34.0``; BENCHMARKS.md). Against vLLM 0.33.0's, which it followed before,
it differs on fp8 only: 0.33 has no TMA-B and loads a weight scale per column (block fp8), and
its swapped (SWAP_AB) path makes B's mask before it loads A (`vllm_0_33.TWIN_DIFFERS`). An fp16
checkpoint's w8a8 GEMMs (bf16 compute, fp16 C) compile to 0.34.0's SASS too
(`bench/sass_loop.py --checkpoint fp16`). vLLM's launch semantics:

- naive assignment (``sorted_token_ids`` None, ``NAIVE_BLOCK_ASSIGNMENT``): no
  alignment; block ``i`` is slot ``i`` (row 0 of the block, the other rows padding),
  of expert ``expert_ids[i]`` (the flat ``topk_ids``), EM = ``num_slots * BLOCK_SIZE_M``;
- TMA-B (0.34): block fp8's weights through a TMA descriptor, box [1, BLOCK_SIZE_N,
  BLOCK_SIZE_K], on sm90/sm100 where the tile divides N and K, unless the entry says
  ``"USE_TMA": false`` (`moetune.kernel.launch_rules.use_tma_b`; ``w_use_tma=None``);
- one weight scale per tile and K step where BLOCK_SIZE_N divides the weight block (0.34);
- ``SWAP_AB`` (fp8_w8a8 on compute capability 9.0, BLOCK_SIZE_M < 64 and
  BLOCK_SIZE_N >= 64): each tile is computed as ``W @ A.T`` and transposed after the
  K loop, so the slots are the dot's N side and BLOCK_SIZE_M = 8 is legal there;
- EM is ``len(sorted_token_ids)``, capped at ``rows(A) * top_k * BLOCK_SIZE_M`` when
  A has fewer rows than BLOCK_SIZE_M (every used row-block holds a slot);
- BLOCK_SIZE_K is clamped to the smaller side of the fp8 weight block;
- ``COMPUTE_TYPE``, the dtype the result is rounded to before the store, is c's dtype,
  except w8a8 (fp8/int8 activations), which computes in bf16 into a c of either dtype:
  an fp16 checkpoint's w8a8 GEMMs round to bf16, then store fp16
  (`moetune.kernel.launch_rules.VLLM_COMPUTE`).

Arrays of one launch (``slot = token * top_k + k``; ``num_slots = M * top_k``):

| array | shape | dtype | meaning |
|---|---|---|---|
| ``a`` | ``[num_slots // top_k, K]`` | bf16/fp16; fp8 / int8 for w8a8 | rows gathered as ``slot // top_k`` (top_k=1 for GEMM2) |
| ``w`` | ``[E, N, K]`` | bf16/fp16; fp8 / int8 (w8a8); int8 (w8a16) | one weight matrix per expert, out-features first |
| ``c`` | ``[num_slots, N]`` | bf16/fp16 (the checkpoint's) | output row per slot |
| ``a_scale`` | ``[1]`` per-tensor, ``[rows, 1]`` per-token, ``[rows, cdiv(K, block_k)]`` block | fp32 | activation dequant scale (w8a8) |
| ``w_scale`` | ``[E]`` per-tensor, ``[E, N]`` per-channel, ``[E, cdiv(N, block_n), cdiv(K, block_k)]`` block | fp32 | weight dequant scale |
| ``topk_weights`` | ``[M, top_k]`` | fp32 | routing weight of each slot (GEMM2 only) |
| ``sorted_token_ids`` | ``[EM]`` | int32 | slots grouped by expert; pad value ``num_slots``; None: naive |
| ``expert_ids`` | ``[EM // BLOCK_SIZE_M]`` | int32 | expert of each row-block; -1: write zeros |
| ``num_tokens_post_padded`` | ``[1]`` | int32 | used length of ``sorted_token_ids``; blocks past it exit |

SGLang's TMA layout (`moetune.kernel.tma`, launch flags of `invoke_fused_moe_gemm`):
``C_SORTED`` stores row ``p`` of C at sorted position ``p`` instead of slot
``sorted_token_ids[p]`` (an expert-contiguous, BLOCK_SIZE_M-padded layout with
``len(sorted_token_ids)`` rows); ``a_desc`` reads such an A through a TMA descriptor,
one [BLOCK_SIZE_M, BLOCK_SIZE_K] box per step at the block's sorted position; ``w_desc``
reads the weight tile [1, BLOCK_SIZE_N, BLOCK_SIZE_K] through a descriptor. TMA
zero-fills boxes past a tensor's edge, so those loads take no masks. These are
constexpr branches of their own (``a_desc`` / ``w_desc`` not None, ``C_SORTED``): dead,
and absent from the SASS, on vLLM's paths. SGLang 0.5.23's kernel differs from vLLM's
(unmasked loads when K divides, its own transposes for swap_ab), so on SGLang's
paths this is a correct kernel, not SGLang's SASS: SGLang's files are timed on its
own twin, `moetune.kernel.fused_moe_kernel_sglang`.

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

import functools
import os
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from moetune.dtypes import DTYPES, FUSED_MOE_KERNEL
from moetune.errors import MoetuneError
from moetune.kernel.config import CONFIG_KEYS
from moetune.kernel.launch_rules import (
    VLLM_COMPUTE,
    a_scale_strides,
    dtype_name,
    grid_rows,
    group_shape,
    operand_strides,
    use_tma_b,
    w_scale_strides,
)

if TYPE_CHECKING:
    import torch

SWAP_AB_MIN_BLOCK_M = 8  # the token tile is the dot's N side when A and B are swapped


@triton.jit
def _round_to_bf16_grid(x):
    """fp32 ``x`` rounded to the nearest bf16 value (ties to even), still fp32."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _store_zeros(c_ptr, stride_cm, stride_cn, pid_n, N, rows, row_mask, BM, BN, dtype):
    # The rows of a block routed to no local expert get zeros.
    zeros = tl.zeros((BM, BN), dtype=dtype)
    offs_cn = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + stride_cm * rows[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, zeros, mask=row_mask[:, None] & (offs_cn[None, :] < N))


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
    # Matrix dimensions: N out-features, K reduction, EM the rows of the grid,
    # num_slots = M * top_k (also the padding value)
    N,
    K,
    EM,
    num_slots,
    # Strides: how far a pointer moves for one step along a dimension
    stride_am,
    stride_ak,
    stride_we,
    stride_wk,
    stride_wn,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_wse,
    stride_wsk,
    stride_wsn,
    # Quantization: the weight block shape (0 when not block-quantized)
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    # No alignment: block i is slot i (sorted_token_ids_ptr is None)
    NAIVE_BLOCK_ASSIGNMENT: tl.constexpr,
    # Meta-parameters
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    TOP_K: tl.constexpr,
    COMPUTE_TYPE: tl.constexpr,
    USE_FP8_W8A8: tl.constexpr,
    USE_INT8_W8A8: tl.constexpr,
    USE_INT8_W8A16: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    SWAP_AB: tl.constexpr,
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

    offs = tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
    if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
        return
    if not NAIVE_BLOCK_ASSIGNMENT:
        offs_token_id = pid_m * BLOCK_SIZE_M + offs
        offs_token = tl.load(sorted_token_ids_ptr + offs_token_id)
    else:
        # One slot per block: row 0 is slot pid_m, the other rows are padding.
        offs_token = tl.where(offs == 0, pid_m, num_slots)
    offs_token = offs_token.to(tl.int64)
    token_mask = offs_token < num_slots
    # C_SORTED: the output row is the sorted position (expert-contiguous, padded
    # layout that a TMA read of the next GEMM's A needs), not the slot.
    if C_SORTED:
        c_rows = offs_token_id
    else:
        c_rows = offs_token

    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert == -1:
        # A block of slots routed to no local expert: they contribute nothing.
        _store_zeros(
            c_ptr,
            stride_cm,
            stride_cn,
            pid_n,
            N,
            c_rows,
            token_mask,
            BLOCK_SIZE_M,
            BLOCK_SIZE_N,
            COMPUTE_TYPE,
        )
        return

    # Out-of-range weight columns wrap around instead of being masked: their
    # results are never stored, and the weight loads stay unpredicated.
    offs_wn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    # SWAP_AB: the dot is W @ A.T, the slots its N side; A is gathered [K, M] and
    # the weight tile [N, K].
    # The weight pointers are made (and advanced) with a descriptor too, unused, as vLLM
    # 0.34 does: the same IR, so the same instruction schedule.
    if SWAP_AB:
        if a_desc is None:
            a_ptrs = a_ptr + (
                offs_k[:, None] * stride_ak + offs_token[None, :] // TOP_K * stride_am
            )
        w_ptrs = (
            w_ptr
            + expert * stride_we
            + (offs_wn[:, None] * stride_wn + offs_k[None, :] * stride_wk)
        )
    else:
        if a_desc is None:
            a_ptrs = a_ptr + (
                offs_token[:, None] // TOP_K * stride_am + offs_k[None, :] * stride_ak
            )
        w_ptrs = (
            w_ptr
            + expert * stride_we
            + (offs_k[:, None] * stride_wk + offs_wn[None, :] * stride_wn)
        )
    if USE_INT8_W8A16:
        w_scale = tl.load(w_scale_ptr + expert * stride_wse + offs_wn[None, :] * stride_wsn)
    if USE_FP8_W8A8 or USE_INT8_W8A8:
        if GROUP_K > 0 and GROUP_N > 0:
            if a_desc is None:
                a_scale_ptrs = a_scale_ptr + (offs_token // TOP_K) * stride_asm
            else:
                # A's rows (and their scales) are at the sorted positions.
                a_scale_ptrs = a_scale_ptr + offs_token_id * stride_asm
            if GROUP_N >= BLOCK_SIZE_N and GROUP_N % BLOCK_SIZE_N == 0:
                # The tile lies in one weight block: one scale per K step (vLLM 0.34).
                offs_wsn = pid_n * BLOCK_SIZE_N // GROUP_N
            else:
                offs_wsn = offs_wn // GROUP_N
            w_scale_ptrs = w_scale_ptr + expert * stride_wse + offs_wsn * stride_wsn
        elif PER_CHANNEL:
            w_scale = tl.load(w_scale_ptr + expert * stride_wse + offs_wn[None, :] * stride_wsn)
            a_scale_ptrs = a_scale_ptr + (offs_token // TOP_K) * stride_asm
            a_scale = tl.load(a_scale_ptrs, mask=token_mask, other=0.0)[:, None]
        else:
            a_scale = tl.load(a_scale_ptr)
            w_scale = tl.load(w_scale_ptr + expert)

    if SWAP_AB:
        accumulator = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    else:
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        # vLLM 0.34's order: A, then B by pointer, or B by descriptor (TMA zero-fills boxes
        # past a tensor's edge, so those loads take no masks).
        if a_desc is not None:  # A at the sorted positions (SGLang's down GEMM)
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])
            if SWAP_AB:
                a = a.T
            if w_desc is None:
                if SWAP_AB:
                    w = tl.load(w_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
                else:
                    w = tl.load(w_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        elif SWAP_AB:
            a_mask = (offs_k[:, None] < K - k * BLOCK_SIZE_K) & token_mask[None, :]
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            if w_desc is None:
                w_mask = offs_k[None, :] < K - k * BLOCK_SIZE_K
                w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        else:
            a = tl.load(
                a_ptrs,
                mask=token_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_SIZE_K),
                other=0.0,
            )
            if w_desc is None:
                w = tl.load(w_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        if w_desc is not None:
            w = w_desc.load([expert.to(tl.int32), pid_n * BLOCK_SIZE_N, k * BLOCK_SIZE_K])
            w = w.reshape(BLOCK_SIZE_N, BLOCK_SIZE_K)
            if not SWAP_AB:
                w = w.T
        if INTERPRETER_BF16:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        if USE_INT8_W8A16:
            # a.dtype is the compute dtype (fp32 under INTERPRETER_BF16)
            accumulator = tl.dot(a, w.to(a.dtype), acc=accumulator)
        elif USE_FP8_W8A8 or USE_INT8_W8A8:
            if GROUP_K > 0 and GROUP_N > 0:
                k_group = (k * BLOCK_SIZE_K) // GROUP_K
                a_scale = tl.load(a_scale_ptrs + k_group * stride_ask, mask=token_mask, other=0.0)
                w_scale = tl.load(w_scale_ptrs + k_group * stride_wsk)
                if GROUP_N >= BLOCK_SIZE_N and GROUP_N % BLOCK_SIZE_N == 0:
                    # one scale, a [1] block as vLLM 0.34's b_scale[None, :] is on Triton 3.6
                    # (Triton 3.9 refuses that on a scalar)
                    if SWAP_AB:
                        accumulator += tl.dot(w, a) * w_scale[None] * a_scale[None, :]
                    else:
                        accumulator += tl.dot(a, w) * a_scale[:, None] * w_scale[None]
                elif SWAP_AB:
                    accumulator += tl.dot(w, a) * w_scale[:, None] * a_scale[None, :]
                else:
                    accumulator += tl.dot(a, w) * a_scale[:, None] * w_scale[None, :]
            elif USE_FP8_W8A8:
                if SWAP_AB:
                    accumulator = tl.dot(w, a, acc=accumulator)
                else:
                    accumulator = tl.dot(a, w, acc=accumulator)
            else:
                # int8 x int8 -> int32, added to the fp32 accumulator
                accumulator += tl.dot(a, w)
        else:
            accumulator += tl.dot(a, w)
        if a_desc is None:
            a_ptrs += BLOCK_SIZE_K * stride_ak
        w_ptrs += BLOCK_SIZE_K * stride_wk

    if SWAP_AB:
        accumulator = tl.trans(accumulator, (1, 0))
    if USE_INT8_W8A16:
        accumulator = accumulator * w_scale
    elif (USE_FP8_W8A8 or USE_INT8_W8A8) and not (GROUP_K > 0 and GROUP_N > 0):
        accumulator = accumulator * a_scale * w_scale
    if MUL_ROUTED_WEIGHT:
        routed_weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)
        accumulator *= routed_weight[:, None]
    if INTERPRETER_BF16:
        accumulator = _round_to_bf16_grid(accumulator)
    accumulator = accumulator.to(COMPUTE_TYPE)

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * c_rows[:, None] + stride_cn * offs_cn[None, :]
    c_mask = token_mask[:, None] & (offs_cn[None, :] < N)
    tl.store(c_ptrs, accumulator, mask=c_mask)


def check_config_values(config: dict) -> None:
    """Raise `MoetuneError` unless `config` has the six keys, each a positive integer."""
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise MoetuneError(f"kernel config {config} lacks {', '.join(missing)}")
    for key in CONFIG_KEYS:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MoetuneError(f"kernel config {key} must be a positive integer, got {value!r}")


def check_config(
    config: dict,
    block_shape: tuple[int, int] | None = None,
    quant_dtype: str | None = None,
    *,
    swap_ab: bool = False,
) -> None:
    """Raise `MoetuneError` unless `config` is a usable kernel config for the quantization.

    `swap_ab`: the launch swaps A and B (`swaps_ab`), which makes the token tile the
    dot's N side, so BLOCK_SIZE_M may be 8.
    """
    check_config_values(config)
    for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps"):
        if config[key] & (config[key] - 1):
            raise MoetuneError(f"kernel config {key} must be a power of two, got {config[key]}")
    least_m = SWAP_AB_MIN_BLOCK_M if swap_ab else 16
    if config["BLOCK_SIZE_M"] < least_m:
        raise MoetuneError(
            f"kernel config BLOCK_SIZE_M must be at least {least_m} (tl.dot), "
            f"got {config['BLOCK_SIZE_M']}"
            + ("" if swap_ab else f"; {SWAP_AB_MIN_BLOCK_M} only where the launch swaps A and B")
        )
    if config["BLOCK_SIZE_N"] < 16 or config["BLOCK_SIZE_K"] < 16:
        raise MoetuneError(
            "kernel config BLOCK_SIZE_N and BLOCK_SIZE_K must be at least 16 (tl.dot)"
        )
    if _eight_bit_dots(quant_dtype) and config["BLOCK_SIZE_K"] < 32:
        raise MoetuneError(
            f"{quant_dtype} needs BLOCK_SIZE_K >= 32: Hopper's 8-bit tensor-core dot reduces over 32"
        )
    if block_shape is not None and block_shape[1] % config["BLOCK_SIZE_K"]:
        raise MoetuneError(
            f"BLOCK_SIZE_K={config['BLOCK_SIZE_K']} must divide the quantization block's "
            f"K size {block_shape[1]}: one weight scale per K step"
        )


def _eight_bit_dots(quant_dtype: str | None) -> bool:
    """Both operands of the dots are 8-bit (w8a8): Hopper's dot reduces over K 32 at a time."""
    spec = DTYPES.get(quant_dtype)
    return spec is not None and spec.quantizes_activations


def _quantizations() -> tuple[str, ...]:
    """The quantized dtypes this kernel runs (int4 w4a16 runs in `fused_moe_wna16_kernel`)."""
    return DTYPES.names(lambda spec: spec.quantized and spec.engine_kernel == FUSED_MOE_KERNEL)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(index))


def device_capability(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The compute capability of the CUDA device holding `tensor`; None off CUDA or interpreting."""
    if interpreting() or tensor.device.type != "cuda":
        return None
    return _cuda_capability(tensor.device.index if tensor.device.index is not None else 0)


def swaps_ab(config: dict, quant_dtype: str | None, capability: tuple[int, int] | None) -> bool:
    """Whether a launch swaps A and B: vLLM 0.33's rule (fp8_w8a8, compute capability 9.0,
    BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64; SGLang 0.5.23 swaps on every 9.x alike)."""
    from moetune.kernel.launch_rules import swap_ab

    return swap_ab(config, quant_dtype, capability)


def effective_block_k(config: dict, block_shape: tuple[int, int] | None) -> int:
    """BLOCK_SIZE_K as launched: clamped to the smaller side of the weight block (vLLM)."""
    if block_shape is None:
        return config["BLOCK_SIZE_K"]
    return min(config["BLOCK_SIZE_K"], min(block_shape))


def invoke_fused_moe_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    c: torch.Tensor,
    *,
    a_scale: torch.Tensor | None,
    w_scale: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    sorted_token_ids: torch.Tensor | None,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: dict,
    quant_dtype: str | None,
    block_shape: tuple[int, int] | None,
    a_use_tma: bool = False,
    w_use_tma: bool | None = False,
    c_sorted: bool = False,
    per_channel: bool = False,
    swap_ab: bool | None = None,
) -> torch.Tensor:
    """Launch `fused_moe_kernel` once: ``c[slot] = a[slot // top_k] @ w[expert(slot)].T``.

    Shapes and dtypes are in the module docstring; ``c`` may be ``[M, top_k, N]``
    (it is viewed as ``[num_slots, N]``). No host synchronisation: safe inside a
    CUDA graph capture. Returns ``c``. Launched as vLLM 0.34 launches its kernel:

    - ``sorted_token_ids`` None: the naive assignment (no alignment; block ``i`` is
      slot ``i``, ``expert_ids`` the flat ``topk_ids``, ``num_tokens_post_padded``
      holds ``num_slots * BLOCK_SIZE_M``);
    - ``swap_ab``: compute ``W @ A.T`` per tile (BLOCK_SIZE_M may then be 8); None
      decides as vLLM does (`swaps_ab` on the device holding ``a``);
    - BLOCK_SIZE_K clamped to the smaller side of the fp8 weight block; the grid's
      EM is ``len(sorted_token_ids)``, capped at ``rows(a) * top_k * BLOCK_SIZE_M``
      when ``a`` has fewer rows than BLOCK_SIZE_M.

    SGLang's TMA layout (see `moetune.kernel.tma`; needs ``sorted_token_ids``):
    - ``c_sorted``: row ``p`` of ``c`` is sorted position ``p`` (``c`` has
      ``len(sorted_token_ids)`` rows; ``num_slots = a.shape[0] * top_k``);
    - ``a_use_tma``: ``a`` is such a sorted-layout tensor, read through a TMA
      descriptor at the sorted positions (``top_k`` must be 1);
    - ``w_use_tma``: ``w`` is read through a TMA descriptor.

    ``w_use_tma=None`` decides as vLLM 0.34 does (`moetune.kernel.launch_rules.use_tma_b`:
    TMA-B for block fp8 on sm90/sm100 where the tile divides N and K, unless the entry
    says ``"USE_TMA": false``), on its naive path too.
    """
    import torch

    from moetune.kernel.tma import SplitConfigError, check_tma_quant, make_descriptor

    if quant_dtype is not None and quant_dtype not in _quantizations():
        raise MoetuneError(
            f"unknown quantization {quant_dtype!r}; expected one of {', '.join(_quantizations())}"
        )
    if block_shape is not None and quant_dtype not in DTYPES.names("block_quant"):
        raise MoetuneError(
            "block-quantized weights are implemented for "
            f"{', '.join(DTYPES.names('block_quant'))} only, not {quant_dtype}"
        )
    check_config_values(config)
    if swap_ab is None:
        swap_ab = swaps_ab(config, quant_dtype, device_capability(a))
    elif swap_ab and quant_dtype != "fp8_w8a8":
        raise MoetuneError(f"SWAP_AB is the fp8_w8a8 path of vLLM's kernel, not {quant_dtype}'s")
    block_k = effective_block_k(config, block_shape)
    check_config(dict(config, BLOCK_SIZE_K=block_k), block_shape, quant_dtype, swap_ab=swap_ab)
    assert w.dim() == 3, "w must be [E, N, K]"
    num_experts, n, k = w.shape
    assert a.dim() == 2 and a.shape[1] == k, f"a must be [rows, {k}], got {list(a.shape)}"
    c2 = c.view(-1, c.shape[-1])
    assert c2.shape[1] == n, f"c must have {n} columns, got {c2.shape[1]}"
    naive = sorted_token_ids is None
    if w_use_tma is None:  # vLLM 0.34's choice, on its naive path too
        w_use_tma = use_tma_b(
            config,
            quant_dtype,
            block_shape,
            device_capability(a),
            n,
            k,
            block_k,
            contiguous=w.is_contiguous(),
        )
    elif naive and w_use_tma:
        raise SplitConfigError("SGLang's TMA operands need aligned token ids")
    if a_use_tma or w_use_tma:
        check_tma_quant(quant_dtype, block_shape)
    if naive and (a_use_tma or c_sorted):
        raise SplitConfigError("TMA operands and a sorted c need aligned token ids")
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
    assert expert_ids.dtype == torch.int32, "expert ids must be int32"
    assert naive or sorted_token_ids.dtype == torch.int32, "sorted token ids must be int32"
    assert not naive or expert_ids.numel() == num_slots, "naive: one expert id per slot"
    if mul_routed_weight:
        assert topk_weights is not None and topk_weights.numel() == num_slots, (
            "need one routing weight per slot"
        )
        assert topk_weights.is_contiguous(), "topk_weights must be contiguous"

    use_fp8 = quant_dtype == "fp8_w8a8"
    use_int8_w8a16 = quant_dtype == "int8_w8a16"
    use_int8_w8a8 = quant_dtype == "int8_w8a8"
    assert not per_channel or quant_dtype in DTYPES.names("per_channel"), (
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

    group_n, group_k = group_shape(block_shape)
    if use_fp8 and block_shape is not None:
        groups_k = triton.cdiv(k, group_k)
        assert a_scale.shape == (a.shape[0], groups_k), (
            f"a_scale must be [{a.shape[0]}, {groups_k}]"
        )
        assert w_scale.shape == (num_experts, triton.cdiv(n, group_n), groups_k), (
            "w_scale must be [E, N/bn, K/bk]"
        )
    elif per_channel:
        assert a_scale.shape[0] == a.shape[0] and a_scale.numel() == a.shape[0], (
            f"per-token a_scale must be [{a.shape[0]}, 1]"
        )
        assert w_scale.shape == (num_experts, n), f"per-channel w_scale must be [E, {n}]"
    elif use_fp8:
        assert a_scale.numel() == 1 and w_scale.numel() == num_experts, (
            "per-tensor fp8 scales: a [1], w [E]"
        )
        assert w_scale.is_contiguous(), "per-tensor w_scale must be contiguous"
    if a_scale is not None and a_scale.dim() == 0:
        a_scale = a_scale.reshape(1)

    bm, bn = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    a_desc = make_descriptor(a, (bm, block_k), "A") if a_use_tma else None
    w_desc = make_descriptor(w, (1, bn, block_k), "w") if w_use_tma else None
    # vLLM's compute type: bf16 for w8a8 whatever c's dtype (an fp16 checkpoint's), else c's.
    compute = VLLM_COMPUTE.compute_dtype(quant_dtype, dtype_name(c.dtype))
    em = grid_rows(sorted_token_ids, num_slots, a.shape[0], top_k, bm)
    grid = (triton.cdiv(em, bm) * triton.cdiv(n, bn),)
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
        *operand_strides(a, w),
        c2.stride(0),
        c2.stride(1),
        *a_scale_strides(a_scale),  # scale strides as vLLM passes them
        *w_scale_strides(w_scale),
        GROUP_N=group_n,
        GROUP_K=group_k,
        NAIVE_BLOCK_ASSIGNMENT=naive,
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        BLOCK_SIZE_K=block_k,
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        TOP_K=top_k,
        COMPUTE_TYPE=getattr(tl, compute),
        USE_FP8_W8A8=use_fp8,
        USE_INT8_W8A8=use_int8_w8a8,
        USE_INT8_W8A16=use_int8_w8a16,
        PER_CHANNEL=per_channel,
        SWAP_AB=swap_ab,
        C_SORTED=c_sorted,
        INTERPRETER_BF16=interpreting() and compute == "bfloat16",
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )
    return c
