"""How SGLang 0.5.23 launches its Triton ``fused_moe_kernel`` (``invoke_fused_moe_kernel``).

Read from the released wheel's ``sglang/kernels/ops/moe/fused_moe_triton_kernels.py``;
the kernel is compiled from the installed file (`moetune.engines.source`), never
copied. What the launch decides, for the default serving path (no LoRA outputs, no
fused SwiGLU, no fused sum-all-reduce, no MoE padding):

- alignment always (``moe_align_block_size``): no naive path;
- EM = ``len(sorted_token_ids)``, uncapped, and ``even_Ks`` when K is a multiple of
  ``BLOCK_SIZE_K``;
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


def launch(
    kernel: Any,
    a: Any,
    w: Any,
    c: Any,
    *,
    a_scale: Any,
    w_scale: Any,
    topk_weights: Any,
    sorted_token_ids: Any,
    expert_ids: Any,
    num_tokens_post_padded: Any,
    mul_routed_weight: bool,
    top_k: int,
    config: dict,
    quant_dtype: str | None,
    block_shape: Any,
    per_channel: bool = False,
    capability: tuple[int, int] | None = None,
    a_use_tma: bool = False,
    w_use_tma: bool = False,
    c_sorted: bool = False,
) -> Any:
    """Launch SGLang 0.5.23's `kernel` as its launcher does; `moetune.kernel` argument names.

    Activations arrive already quantized (SGLang quantizes them inside its launcher,
    moetune before it; the kernel sees the same tensors).
    """
    import torch
    import triton
    import triton.language as tl

    reason = refusal(config, quant_dtype)
    if reason:
        raise ValueError(reason)
    if sorted_token_ids is None:
        raise ValueError("SGLang's fused_moe_kernel needs aligned token ids (no naive path)")
    c2 = c.view(-1, c.shape[-1])
    num_slots = a.shape[0] * top_k if (c_sorted or not a_use_tma) else c2.shape[0]
    n, k = w.shape[1], w.shape[2]
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    from moetune.kernel.tma import make_descriptor  # checks the TMA rules, sets the allocator

    a_desc = make_descriptor(a, (bm, bk), "A") if a_use_tma else None
    w_desc = make_descriptor(w, (1, bn, bk), "w") if w_use_tma else None
    pdl = (
        {"USE_GDC": True, "launch_pdl": True, "GDC_EARLY": a.shape[0] <= PDL_EARLY_ROWS}
        if capability is not None and capability[0] >= 9
        else {}
    )
    em = sorted_token_ids.shape[0]
    grid = (triton.cdiv(em, bm) * triton.cdiv(n, bn),)
    two_d_a_scale = a_scale is not None and a_scale.ndim == 2
    meta = {key: value for key, value in config.items() if key != "SPLIT_K"}
    kernel[grid](
        a,
        a_desc,
        w,
        w_desc,
        None,
        c2,
        a_scale,
        w_scale,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        None,
        n,
        k,
        em,
        num_slots,
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(2),
        w.stride(1),
        0,
        0,
        c2.stride(0),
        c2.stride(1),
        a_scale.stride(0) if two_d_a_scale else 0,
        a_scale.stride(1) if two_d_a_scale else 0,
        w_scale.stride(0) if w_scale is not None and w_scale.ndim >= 2 else 0,
        w_scale.stride(2) if w_scale is not None and w_scale.ndim == 3 else 0,
        w_scale.stride(1) if w_scale is not None and w_scale.ndim >= 2 else 0,
        0 if block_shape is None else block_shape[0],
        0 if block_shape is None else block_shape[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        compute_type=tl.bfloat16 if c.dtype == torch.bfloat16 else tl.float16,
        use_fp8_w8a8=quant_dtype == "fp8_w8a8",
        use_int8_w8a8=quant_dtype == "int8_w8a8",
        use_int8_w8a16=quant_dtype == "int8_w8a16",
        per_channel_quant=per_channel,
        even_Ks=k % bk == 0,
        c_sorted=c_sorted,
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
    return c
