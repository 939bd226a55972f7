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
- ``compute_type`` (`COMPUTE`): bf16 for a bf16 checkpoint, else fp16, whatever the
  dtype (``_fused_moe_kernel_sequence``), into buffers of the checkpoint's dtype: an fp16
  checkpoint's w8a8 GEMMs compute in fp16, unlike vLLM's;
- programmatic dependent launch on sm90 and newer (``USE_GDC``, ``launch_pdl``),
  with the early trigger when A has at most 512 rows.
"""

from __future__ import annotations

import functools
from typing import Any

from moetune.dtypes import DTYPES
from moetune.engines.launch.common import GemmCall, quant_constexprs
from moetune.kernel.launch_rules import (
    ComputeRule,
    a_scale_strides,
    group_shape,
    operand_strides,
)

ENGINE = "sglang"
RELEASE = "0.5.23"
KERNEL = "fused_moe_kernel"
SOURCE = ("kernels", "ops", "moe", "fused_moe_triton_kernels.py")
PDL_EARLY_ROWS = 512
# The kernel's compute type and the output buffers' dtype: the checkpoint's, for every dtype.
COMPUTE = ComputeRule()


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
    """Why SGLang 0.5.23 refuses to load this layer at all, or None (`fused_experts` asks
    before a layer's first launch; a lone GEMM is not a layer).

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
    reason = refusal(config, quant_dtype)
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
    if call.per_channel and w_scale is not None and w_scale.ndim == 2:
        w_scale = w_scale.unsqueeze(-1)  # SGLang keeps per-channel scales as [E, N, 1]
    # The down GEMM's C is [M, top_k, K]: SGLang passes the layer's top-k as ROUTER_TOPK.
    router_topk = call.c.shape[1] if call.mul_routed_weight and call.c.dim() == 3 else 1
    three_d_w_scale = w_scale is not None and w_scale.ndim == 3
    two_d_w_scale = w_scale is not None and w_scale.ndim >= 2
    meta = dict(config)  # SGLang splats the entry: a key its kernel lacks raises KeyError
    kernel[grid](
        a,
        a_desc,
        w,
        w_desc,
        None,
        call.c,
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
        call.c.stride(-2),
        call.c.stride(-1),
        *a_scale_strides(call.a_scale),
        w_scale.stride(0) if two_d_w_scale else 0,
        w_scale.stride(2) if three_d_w_scale else 0,
        w_scale.stride(1) if two_d_w_scale else 0,
        *group_shape(block_shape),
        **quant_constexprs(call, COMPUTE),
        even_Ks=k % bk == 0,
        c_sorted=call.c_sorted,
        swap_ab=swap_ab(config, quant_dtype, capability),
        FUSE_ADD_TO_OUTPUT=False,
        A_OUTPUT_SLICES=1,
        A_OUTPUT_SLICE_WIDTH=0,
        A_OUTPUT_SLICE_K=0,
        MASK_OUTPUT=False,
        FUSE_SUM_ALL_REDUCE=False,
        ROUTER_TOPK=router_topk,
        FUSE_SWIGLU=False,
        **pdl,
        **meta,
    )
    return call.c


# SGLang's moe_combine_topk (CUDA): its Triton sum below this many tokens where the GPU
# has programmatic dependent launch, sgl_kernel's compiled moe_sum_reduce above.
SUM_TRITON_TOKENS = 32
SUM_KERNEL = "_moe_sum_reduce_kernel"


def combine(down: Any, gemm: Any) -> Any:
    """The top-k sum after the down GEMM as SGLang 0.5.23 runs it (``moe_combine_topk``),
    on `down` [M, top_k, K]; `gemm` is the `EngineGemm` the layer runs on.

    - top-1: no sum (SGLang's down GEMM writes the output itself);
    - top-2: ``torch.add`` of the two slots;
    - at most 32 tokens on sm90+: SGLang's ``_moe_sum_reduce_kernel``, compiled from the
      installed SGLang's source (`sum_kernel`) and launched as ``moe_sum_reduce_triton``
      does (one token per program, 2048 columns, 16 warps, PDL);
    - otherwise SGLang runs ``sgl_kernel.moe_sum_reduce`` (compiled CUDA, not in the
      wheel), or before sm90 a ``torch.compile``'d sum: moetune's `moe_sum` stands in,
      as it does for the Triton sum where SGLang is not installed (the twin).
    """
    import torch

    from moetune.kernel.reduce import moe_sum

    num_tokens, top_k, hidden = down.shape
    if top_k == 1:
        return down.view(num_tokens, hidden)
    if top_k == 2:
        return torch.add(down[:, 0], down[:, 1])
    kernel = triton_sum(num_tokens, gemm)
    if kernel is None:
        return moe_sum(down)
    import triton

    down = down.contiguous()
    out = torch.empty(num_tokens, hidden, dtype=down.dtype, device=down.device)
    kernel[(num_tokens, triton.cdiv(hidden, 2048))](
        down,
        *down.stride(),
        out,
        *out.stride(),
        token_num=num_tokens,
        topk_num=top_k,
        hidden_dim=hidden,
        routed_scaling_factor=1.0,
        BLOCK_M=1,
        BLOCK_DIM=2048,
        NUM_STAGE=1,
        num_warps=16,
        USE_GDC=True,
        launch_pdl=True,
    )
    return out


def triton_sum(num_tokens: int, gemm: Any) -> Any:
    """SGLang's Triton top-k sum where SGLang runs it for `num_tokens` on `gemm`'s GPU (at
    most `SUM_TRITON_TOKENS` tokens, programmatic dependent launch), or None: sgl_kernel's
    compiled sum there, or the twin, for which moetune's `moe_sum` stands in."""
    pdl = gemm.capability is not None and gemm.capability[0] >= 9
    return sum_kernel(gemm.ref) if num_tokens <= SUM_TRITON_TOKENS and pdl else None


@functools.lru_cache(maxsize=4)
def sum_kernel(ref: Any) -> Any:
    """SGLang's Triton top-k sum compiled from the installed source `ref` names, or None
    for the twin (SGLang not installed) or a source without it."""
    if ref is None or ref.twin:
        return None
    from pathlib import Path

    from moetune.engines.source import EngineSourceError, load_jit_functions

    try:
        return load_jit_functions(Path(ref.source), (SUM_KERNEL,))[SUM_KERNEL]
    except EngineSourceError:
        return None
