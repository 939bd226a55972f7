"""How SGLang 0.5.23 launches its Triton ``fused_moe_kernel`` (``invoke_fused_moe_kernel``).

Read from the released wheel's ``sglang/kernels/ops/moe/fused_moe_triton_kernels.py``;
the kernel is compiled from the installed file (`moetune.engines.source`), never
copied. What the launch decides, for the default serving path (no LoRA outputs, no
fused SwiGLU, no fused sum-all-reduce, no MoE padding):

- alignment always (``moe_align_block_size``): no naive path; ``sorted_token_ids``
  as long as SGLang allocates it (`align_slots`: a bucket for other ranks' slots),
  and, under down TMA, the sorted intermediates as many rows as it allocates
  (`sorted_rows`), which the down GEMM's ``GDC_EARLY`` counts;
- EM = ``len(sorted_token_ids)``, uncapped, and ``even_Ks`` when K is a multiple of
  ``BLOCK_SIZE_K``; the grid ``cdiv(EM, BLOCK_SIZE_M) * cdiv(N, BLOCK_SIZE_N)``;
- the entry splatted into the launch (``**config``): a key the kernel lacks, such as
  vLLM's ``SPLIT_K``, fails as it fails in SGLang (Triton's KeyError);
- TMA for every dtype the kernel runs (`tma_refusal`), block fp8 only where the
  intermediate size is a multiple of the weight block's N (`layer_refusal`);
- ``swap_ab`` for fp8_w8a8 on sm90 with ``BLOCK_SIZE_M < 64`` and ``BLOCK_SIZE_N >= 64``;
- TMA (``USE_TMA`` in a tuned entry): the up GEMM reads w1 through a descriptor; a
  TMA down entry makes the up GEMM write sorted rows (``c_sorted``) and the down GEMM
  read them and w2 through descriptors;
- programmatic dependent launch on sm90 and newer (``USE_GDC``, ``launch_pdl``),
  with the early trigger when A has at most 512 rows.
"""

from __future__ import annotations

from typing import Any

from moetune.dtypes import DTYPES
from moetune.engines.launch.common import GemmCall, quant_constexprs
from moetune.kernel.launch_rules import a_scale_strides, group_shape, operand_strides

ENGINE = "sglang"
RELEASE = "0.5.23"
KERNEL = "fused_moe_kernel"
SOURCE = ("kernels", "ops", "moe", "fused_moe_triton_kernels.py")
PDL_EARLY_ROWS = 512


def naive_assignment(
    num_slots: int, num_experts: int, quant_dtype: str | None, block_shape: Any
) -> bool:
    """SGLang 0.5.23 always aligns (its kernel has no naive path)."""
    return False


def align_slots(num_slots: int, block_size_m: int, num_experts: int) -> int:
    """``len(sorted_token_ids)`` as SGLang's ``moe_align_block_size`` allocates it.

    It keeps a bucket for other ranks' slots (E + 1 experts), so past E + 1 slots the
    length is ``slots + (E + 1) * (BLOCK_SIZE_M - 1)``, below it ``slots * BLOCK_SIZE_M``;
    rounded up to a multiple of 4 (its kernel pads with int4 stores). The GEMM's grid
    is ``cdiv(len, BLOCK_SIZE_M)`` row blocks: the extra ones exit at once.
    """
    if num_slots < num_experts + 1:
        padded = num_slots * block_size_m
    else:
        padded = num_slots + (num_experts + 1) * (block_size_m - 1)
    return (padded + 3) // 4 * 4


def sorted_rows(num_slots: int, block_size_m: int, num_experts: int) -> int:
    """Rows of the gate/up output and the activation when the down GEMM reads them
    through TMA (``total_tokens`` of ``_fused_moe_kernel_sequence``): the slots plus
    ``BLOCK_SIZE_M - 1`` padding rows for each of at most E + 1 experts. The down GEMM's
    ``GDC_EARLY`` counts these rows."""
    return num_slots + min(num_slots, num_experts + 1) * (block_size_m - 1)


def swap_ab(config: dict, quant_dtype: str | None, capability: tuple[int, int] | None) -> bool:
    """SGLang's ``should_enable_swap_ab``: fp8 on sm90 with a thin M tile and a wide N tile."""
    return (
        quant_dtype == "fp8_w8a8"
        and capability is not None
        and capability[0] == 9
        and config["BLOCK_SIZE_M"] < 64
        and config["BLOCK_SIZE_N"] >= 64
    )


def refusal(config: dict, quant_dtype: str | None) -> str | None:
    """Why SGLang 0.5.23's kernel cannot run `config`, or None."""
    if quant_dtype in DTYPES.names("gptq_awq"):
        what = quant_dtype.replace("_", " ")
        return f"SGLang runs {what} in fused_moe_kernel_gptq_awq, not fused_moe_kernel"
    return None


def tma_refusal(quant_dtype: str | None, block_shape: Any) -> str | None:
    """Why SGLang 0.5.23 would not read this dtype's operands through TMA, or None.

    Its launcher builds the descriptors for every dtype ``fused_moe_kernel`` runs (bf16,
    fp16, fp8 and int8 w8a8 per tensor, per channel or per block, int8 w8a16); the
    kernel's block-fp8 ``assert`` on ``a_desc`` is compiled only in debug builds. Where
    the activation scale is per token, the down GEMM then reads it by slot while A is in
    sorted order: the numbers are wrong, and moetune's check against the reference
    rejects such a config (SGLang would serve it).
    """
    return refusal({}, quant_dtype)


def layer_refusal(intermediate: int, quant_dtype: str | None, block_shape: Any) -> str | None:
    """Why SGLang 0.5.23 refuses to load this layer at all, or None.

    Its fp8 MoE method (``Fp8MoEMethod.create_weights``) requires the per-rank
    intermediate size to be a multiple of the weight block's N (at TP > 1 also of its K,
    which a single layer cannot tell).
    """
    if quant_dtype == "fp8_w8a8" and block_shape is not None and block_shape[0]:
        if intermediate % block_shape[0]:
            return (
                f"SGLang refuses block-quantized fp8 with an intermediate size of "
                f"{intermediate} per rank: not a multiple of the weight block's N "
                f"{block_shape[0]} (Fp8MoEMethod.create_weights)"
            )
    return None


def launch(kernel: Any, call: GemmCall, capability: tuple[int, int] | None = None) -> Any:
    """Launch SGLang 0.5.23's `kernel` on `call` as its launcher does.

    Activations arrive already quantized (SGLang quantizes them inside its launcher,
    moetune before it; the kernel sees the same tensors).
    """
    import triton

    config, quant_dtype, block_shape = call.config, call.quant_dtype, call.block_shape
    # SGLang's up GEMM never multiplies by the routing weight, its down GEMM always does.
    intermediate = call.k if call.mul_routed_weight else call.n // 2
    reason = refusal(config, quant_dtype) or layer_refusal(intermediate, quant_dtype, block_shape)
    if reason:
        raise ValueError(reason)
    if call.sorted_token_ids is None:
        raise ValueError("SGLang's fused_moe_kernel needs aligned token ids (no naive path)")
    a, w, c2, n, k = call.a, call.w, call.c2, call.n, call.k
    num_slots = a.shape[0] * call.top_k if (call.c_sorted or not call.a_use_tma) else c2.shape[0]
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    from moetune.kernel.tma import make_descriptor  # checks the TMA rules, sets the allocator

    a_desc = make_descriptor(a, (bm, bk), "A") if call.a_use_tma else None
    w_desc = make_descriptor(w, (1, bn, bk), "w") if call.w_use_tma else None
    pdl = (
        {"USE_GDC": True, "launch_pdl": True, "GDC_EARLY": a.shape[0] <= PDL_EARLY_ROWS}
        if capability is not None and capability[0] >= 9
        else {}
    )
    em = call.sorted_token_ids.shape[0]
    grid = (triton.cdiv(em, bm) * triton.cdiv(n, bn),)
    w_scale = call.w_scale
    three_d_w_scale = w_scale is not None and w_scale.ndim == 3
    two_d_w_scale = w_scale is not None and w_scale.ndim >= 2
    meta = dict(config)  # SGLang splats the entry: a key its kernel lacks raises KeyError
    kernel[grid](
        a,
        a_desc,
        w,
        w_desc,
        None,
        c2,
        call.a_scale,
        w_scale,
        call.topk_weights,
        call.sorted_token_ids,
        call.expert_ids,
        call.num_tokens_post_padded,
        None,
        n,
        k,
        em,
        num_slots,
        *operand_strides(a, w),
        0,
        0,
        c2.stride(0),
        c2.stride(1),
        *a_scale_strides(call.a_scale),
        w_scale.stride(0) if two_d_w_scale else 0,
        w_scale.stride(2) if three_d_w_scale else 0,
        w_scale.stride(1) if two_d_w_scale else 0,
        *group_shape(block_shape),
        **quant_constexprs(call),
        even_Ks=k % bk == 0,
        c_sorted=call.c_sorted,
        swap_ab=swap_ab(config, quant_dtype, capability),
        FUSE_ADD_TO_OUTPUT=False,
        A_OUTPUT_SLICES=1,
        A_OUTPUT_SLICE_WIDTH=0,
        A_OUTPUT_SLICE_K=0,
        MASK_OUTPUT=False,
        FUSE_SUM_ALL_REDUCE=False,
        ROUTER_TOPK=1,
        FUSE_SWIGLU=False,
        **pdl,
        **meta,
    )
    return call.c
