"""The twin of SGLang 0.5.23's ``fused_moe_kernel``: the grouped GEMM as SGLang compiles it.

Where SGLang is not installed, SGLang's tuned files are timed on a twin of its kernel.
`moetune.kernel.fused_moe_kernel` is vLLM 0.33's kernel, and SGLang's is not vLLM's:
its K loop loads unmasked when BLOCK_SIZE_K divides K, its swap_ab transposes both
operands inside the loop, it folds the block-scale product when BLOCK_SIZE_N is at
most the quantization block's N, and it waits on the previous kernel through
programmatic dependent launch (and its launcher sizes the grid from
``len(sorted_token_ids)`` alone). On an H200 the vLLM twin took 1.05-1.16x SGLang's
time for the same fp8-block config (up to 1.8x at BLOCK_SIZE_K 64), enough to change
which config wins (BENCHMARKS.md, Rank fidelity and the twins). This kernel follows SGLang 0.5.23's
``fused_moe_kernel`` (``sglang/kernels/ops/moe/fused_moe_triton_kernels.py``)
expression by expression and takes its parameters under the same names, in the same
order, with the same defaults, so that SGLang's launcher
(`moetune.engines.launch.sglang_0_5_23.launch`) launches it unchanged. Launched so,
it compiles to SGLang's SASS instruction for instruction (``bench/sass_loop.py
--sglang-ref``, sm_90a, Triton 3.6 and 3.9: BENCHMARKS.md, Rank fidelity and the twins),
and fails to compile where SGLang's does (Triton 3.9: fp8 block with swap_ab and
BLOCK_SIZE_N <= group_n, where the scalar weight scale is indexed ``[:, None]``).

Tiling (shared with vLLM's kernel, so a tuned config means the same thing): a 1-D
grid of ``cdiv(EM, BLOCK_SIZE_M) * cdiv(N, BLOCK_SIZE_N)`` programs, swizzled in
groups of ``GROUP_SIZE_M`` row blocks (Triton tutorial 03). Program ``(pid_m, pid_n)``
takes the ``BLOCK_SIZE_M`` sorted positions ``pid_m * BLOCK_SIZE_M + i``; alignment
grouped the token slots by expert and padded each expert's run to a multiple of
BLOCK_SIZE_M, so the block has one expert ``e = expert_ids[pid_m]`` and its rows are
the slots ``sorted_token_ids[...]`` (pad value ``num_valid_tokens``, masked). It
gathers rows ``slot // top_k`` of A, multiplies them by ``B[e]``'s
``BLOCK_SIZE_N`` columns in K steps of ``BLOCK_SIZE_K`` (fp32 accumulator, pipelined
over ``num_stages``), and stores ``C[slot]``. Blocks at or past
``num_tokens_post_padded`` exit; a block of expert -1 (no local expert) stores zeros.

    up GEMM:   A = x [M, K],          B = w1 [E, 2N, K], C [M * top_k, 2N]
    down GEMM: A = act [M * top_k, N], B = w2 [E, K, N],  C [M, top_k, K] (top_k 1,
               each row times its routing weight: MUL_ROUTED_WEIGHT)

Paths, each a constexpr branch (SGLang's names):

- bf16 / fp16 (``compute_type``): ``acc += dot(a, b)``;
- fp8 w8a8 per tensor (``use_fp8_w8a8``): scales ``a_scale [1]``, ``b_scale [E]``
  applied once after the loop; per channel (``per_channel_quant``, fp8 or
  ``use_int8_w8a8``): ``b_scale [E, N]`` and per-token ``a_scale [rows, 1]`` loaded
  before the loop and applied after it; int8 dots give int32, added to the fp32
  accumulator each step;
- fp8 block (``group_n``, ``group_k`` > 0): per-token-group ``a_scale [rows, K /
  group_k]`` and per-block ``b_scale [E, N / group_n, K / group_k]`` multiply each
  step's partial product; when ``BLOCK_SIZE_N <= group_n`` the tile has one weight
  scale, a scalar, and SGLang folds ``a_scale * b_scale`` before multiplying;
- int8 w8a16 (``use_int8_w8a16``): int8 weights cast to ``compute_type`` before the
  dot, ``b_scale [E, N]`` after the loop;
- ``swap_ab`` (SGLang's launcher: fp8 on sm90, BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64):
  A and B load as always, then each step computes ``B.T @ A.T`` (the slots on the
  dot's N side, so BLOCK_SIZE_M may be 8) into a ``[BLOCK_SIZE_N, BLOCK_SIZE_M]``
  accumulator, transposed once after the loop;
- ``even_Ks`` (K a multiple of BLOCK_SIZE_K): A loads masked by token only, B unmasked;
  otherwise both masked along K;
- TMA descriptors (`moetune.kernel.tma`): ``a_desc`` reads A in ``[BLOCK_SIZE_M,
  BLOCK_SIZE_K]`` boxes at the block's sorted position (A is a sorted-layout
  intermediate, its scales by sorted position too), ``b_desc`` reads ``[1, BLOCK_SIZE_N,
  BLOCK_SIZE_K]`` boxes of B; boxes past an edge are zero-filled, so no masks. SGLang
  asserts block fp8 for ``a_desc`` with a Python ``assert``, which Triton compiles
  only in debug builds; the twin, like SGLang's release build, takes any dtype there;
- ``c_sorted``: C's row is the sorted position, not the slot (the layout ``a_desc``
  reads in the next GEMM); a block of expert -1 then stores nothing (the next GEMM
  never reads it);
- programmatic dependent launch (``USE_GDC``, with ``launch_pdl`` on sm90+): wait for
  the previous kernel's writes first, and let the next kernel launch right away
  (``GDC_EARLY``, A at most 512 rows) or after the store.

Refused with ``tl.static_assert`` (accepted as parameters so SGLang's launcher passes
them unchanged; the launcher never takes them on the default serving path, and moetune
has no bias): ``bias_ptr``, ``FUSE_SWIGLU``, ``FUSE_ADD_TO_OUTPUT``, ``MASK_OUTPUT``
(LoRA, with ``add_mask_ptr`` and ``ROUTER_TOPK``), ``FUSE_SUM_ALL_REDUCE`` and
``A_OUTPUT_SLICES`` > 1.

Triton's CPU interpreter (``TRITON_INTERPRET=1``) returns garbage for bf16 dots and
int8 -> bf16 casts, truncates fp32 -> bf16, and cannot index a scalar (``s[:, None]``).
Under the interpreter only (`INTERPRETING`, a module constant read when the kernel is
decorated, False whenever it is compiled) bf16 dot operands are upcast to fp32, the
bf16 store is rounded by hand, and swap_ab's scalar block scale is multiplied without
the index; compiled kernels never take those branches.
"""

from __future__ import annotations

import triton
import triton.language as tl

from moetune.kernel.fused_moe_kernel import _round_to_bf16_grid, _store_zeros, interpreting

# True when this module was imported under Triton's interpreter (triton.jit then makes
# interpreted functions); compiled kernels see False and drop every branch on it.
INTERPRETING = tl.constexpr(interpreting())


@triton.jit
def fused_moe_kernel(
    # Pointers; a_desc / b_desc: TMA descriptors of A / B, or None. bias_ptr and
    # add_mask_ptr belong to refused paths (see the module docstring).
    a_ptr,
    a_desc,
    b_ptr,
    b_desc,
    bias_ptr,
    c_ptr,
    a_scale_ptr,
    b_scale_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    add_mask_ptr,
    # N out-features, K reduction, EM = len(sorted_token_ids), num_valid_tokens the
    # slots (M * top_k), also the pad value of sorted_token_ids
    N,
    K,
    EM,
    num_valid_tokens,
    # Strides: how far a pointer moves for one step along a dimension
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_bias_e,
    stride_bias_n,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsk,
    stride_bsn,
    # The weight block of block quantization (0: not block-quantized)
    group_n: tl.constexpr,
    group_k: tl.constexpr,
    # Meta-parameters
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    top_k: tl.constexpr,
    compute_type: tl.constexpr,
    use_fp8_w8a8: tl.constexpr,
    use_int8_w8a8: tl.constexpr,
    use_int8_w8a16: tl.constexpr,
    per_channel_quant: tl.constexpr,
    even_Ks: tl.constexpr,
    c_sorted: tl.constexpr,
    swap_ab: tl.constexpr,
    FUSE_ADD_TO_OUTPUT: tl.constexpr,
    MASK_OUTPUT: tl.constexpr,
    FUSE_SUM_ALL_REDUCE: tl.constexpr,
    ROUTER_TOPK: tl.constexpr,
    FUSE_SWIGLU: tl.constexpr = False,
    USE_GDC: tl.constexpr = False,
    GDC_EARLY: tl.constexpr = False,
    A_OUTPUT_SLICES: tl.constexpr = 1,
    A_OUTPUT_SLICE_WIDTH: tl.constexpr = 0,
    A_OUTPUT_SLICE_K: tl.constexpr = 0,
):
    tl.static_assert(bias_ptr is None, "the twin of SGLang's kernel has no bias path")
    tl.static_assert(
        not (FUSE_SWIGLU or FUSE_ADD_TO_OUTPUT or MASK_OUTPUT or FUSE_SUM_ALL_REDUCE),
        "the twin of SGLang's kernel has no fused SwiGLU, LoRA output or all-reduce epilogue",
    )
    tl.static_assert(A_OUTPUT_SLICES == 1, "the twin of SGLang's kernel has one output slice")
    if USE_GDC:
        # The previous kernel's writes (A, the alignment) are visible after the wait.
        tl.extra.cuda.gdc_wait()
        if GDC_EARLY:
            tl.extra.cuda.gdc_launch_dependents()

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
    # The block's sorted positions and their slots (64-bit), pad slots masked.
    sorted_pos = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    slots = tl.load(sorted_token_ids_ptr + sorted_pos).to(tl.int64)
    slot_mask = slots < num_valid_tokens

    expert_i32 = tl.load(expert_ids_ptr + pid_m)
    expert = expert_i32.to(tl.int64)
    if expert == -1:
        # Slots routed to no local expert contribute zeros; a sorted C is left as is.
        if not c_sorted:
            _store_zeros(
                c_ptr,
                stride_cm,
                stride_cn,
                pid_n,
                N,
                slots,
                slot_mask,
                BLOCK_SIZE_M,
                BLOCK_SIZE_N,
                compute_type,
            )
        return

    # Columns past N wrap around rather than being masked: never stored, and the
    # weight loads stay unpredicated.
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    if a_desc is not None:
        a_box_m = pid_m * BLOCK_SIZE_M
    else:
        a_ptrs = a_ptr + (slots[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
    if b_desc is not None:
        b_box_n = pid_n * BLOCK_SIZE_N
    else:
        b_ptrs = (
            b_ptr
            + expert * stride_be
            + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        )

    if use_int8_w8a16:
        b_scale = tl.load(b_scale_ptr + expert * stride_bse + offs_bn[None, :] * stride_bsn)
    if use_fp8_w8a8 or use_int8_w8a8:
        if group_k > 0 and group_n > 0:
            # A TMA-read A holds its rows, and their scales, at the sorted positions.
            if a_desc is not None:
                a_scale_ptrs = a_scale_ptr + sorted_pos * stride_asm
            else:
                a_scale_ptrs = a_scale_ptr + (slots // top_k) * stride_asm
            if BLOCK_SIZE_N > group_n:
                b_scale_cols = offs_bn // group_n
            else:
                b_scale_cols = pid_n * BLOCK_SIZE_N // group_n  # one scale for the tile
            b_scale_ptrs = b_scale_ptr + expert * stride_bse + b_scale_cols * stride_bsn
        elif per_channel_quant:
            b_scale = tl.load(b_scale_ptr + expert * stride_bse + offs_bn[None, :] * stride_bsn)
            a_scale_ptrs = a_scale_ptr + (slots // top_k) * stride_asm
            a_scale = tl.load(a_scale_ptrs, mask=slot_mask, other=0.0)[:, None]
        else:
            a_scale = tl.load(a_scale_ptr)
            b_scale = tl.load(b_scale_ptr + expert)

    if swap_ab:
        accumulator = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    else:
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_SIZE_K):
        # a: [BLOCK_SIZE_M, BLOCK_SIZE_K], b: [BLOCK_SIZE_K, BLOCK_SIZE_N]
        if a_desc is not None:
            a = a_desc.load([a_box_m, k_start])
        elif even_Ks:
            a = tl.load(a_ptrs, mask=slot_mask[:, None], other=0.0)
        else:
            a = tl.load(
                a_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < K - k_start), other=0.0
            )
        if b_desc is not None:
            b = b_desc.load([expert_i32, b_box_n, k_start]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K).T
        elif even_Ks:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k_start, other=0.0)

        if use_int8_w8a16:
            if INTERPRETING and compute_type == tl.bfloat16:
                accumulator = tl.dot(a.to(tl.float32), b.to(tl.float32), acc=accumulator)
            else:
                accumulator = tl.dot(a, b.to(compute_type), acc=accumulator)
        elif use_fp8_w8a8 or use_int8_w8a8:
            if group_k > 0 and group_n > 0:
                k_group = k_start // group_k
                a_scale = tl.load(a_scale_ptrs + k_group * stride_ask, mask=slot_mask, other=0.0)
                b_scale = tl.load(b_scale_ptrs + k_group * stride_bsk)
                if swap_ab:
                    # [BLOCK_SIZE_N, BLOCK_SIZE_M]: rows are columns of C.
                    partial = tl.dot(tl.trans(b, (1, 0)), tl.trans(a, (1, 0)))
                    if BLOCK_SIZE_N > group_n:
                        accumulator += partial * b_scale[:, None] * a_scale[None, :]
                    elif INTERPRETING:
                        accumulator += partial * (b_scale * a_scale)
                    else:
                        accumulator += partial * (b_scale[:, None] * a_scale)
                elif BLOCK_SIZE_N > group_n:
                    accumulator += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
                else:
                    accumulator += tl.dot(a, b) * (a_scale[:, None] * b_scale)
            elif use_fp8_w8a8:
                if swap_ab:
                    accumulator = tl.dot(tl.trans(b, (1, 0)), tl.trans(a, (1, 0)), acc=accumulator)
                else:
                    accumulator = tl.dot(a, b, acc=accumulator)
            else:
                # int8 x int8 -> int32, added to the fp32 accumulator
                accumulator += tl.dot(a, b)
        elif INTERPRETING and compute_type == tl.bfloat16:
            accumulator += tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            accumulator += tl.dot(a, b)
        if a_desc is None:
            a_ptrs += BLOCK_SIZE_K * stride_ak
        if b_desc is None:
            b_ptrs += BLOCK_SIZE_K * stride_bk

    if swap_ab:
        accumulator = tl.trans(accumulator, (1, 0))
    if use_int8_w8a16:
        accumulator *= b_scale
    elif use_fp8_w8a8 or use_int8_w8a8:
        if group_k == 0 or group_n == 0:
            accumulator *= a_scale * b_scale
    if MUL_ROUTED_WEIGHT:
        routed_weight = tl.load(topk_weights_ptr + slots, mask=slot_mask, other=0)
        accumulator *= routed_weight[:, None]
    if INTERPRETING and compute_type == tl.bfloat16:
        accumulator = _round_to_bf16_grid(accumulator)
    accumulator = accumulator.to(compute_type)

    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    if c_sorted:
        c_ptrs = c_ptr + stride_cm * sorted_pos[:, None] + stride_cn * offs_cn[None, :]
    else:
        c_ptrs = c_ptr + stride_cm * slots[:, None] + stride_cn * offs_cn[None, :]
    c_mask = slot_mask[:, None] & (offs_cn[None, :] < N)
    tl.store(c_ptrs, accumulator, mask=c_mask)

    if USE_GDC and not GDC_EARLY:
        tl.extra.cuda.gdc_launch_dependents()
