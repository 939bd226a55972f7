"""How vLLM 0.33 launches its Triton ``fused_moe_kernel`` (``invoke_fused_moe_triton_kernel``).

Read from the released wheel's ``vllm/model_executor/layers/fused_moe/fused_moe.py``
and ``utils.py``; the kernel itself is compiled from the installed file
(`moetune.engines.source`), never copied. What the launch decides:

- expert assignment: the naive path (no ``moe_align_block_size``; one block per
  token slot, ``sorted_token_ids`` None, ``expert_ids = topk_ids``) when there is no
  expert map and ``M * top_k * 4 <= E``, except for int8/int4 w*a16 with a group;
- EM: ``len(sorted_token_ids)``, capped at ``rows(A) * top_k * BLOCK_SIZE_M`` when A
  has fewer rows than ``BLOCK_SIZE_M``; on the naive path ``M * top_k * BLOCK_SIZE_M``;
- ``SWAP_AB`` for fp8_w8a8 on compute capability 9.0 with ``BLOCK_SIZE_M < 64`` and
  ``BLOCK_SIZE_N >= 64``: the token dimension becomes the dot's N, which is what makes
  ``BLOCK_SIZE_M = 8`` tiles legal there;
- ``BLOCK_SIZE_K`` clamped to the smaller side of the fp8 weight block;
- ``SPLIT_K = 1``, no bias, ``USE_TD`` off (a Blackwell-only gather).
"""

from __future__ import annotations

from typing import Any

from moetune.dtypes import DTYPES
from moetune.kernel.launch_rules import NAIVE_SPARSITY, naive_assignment, swap_ab

ENGINE = "vllm"
RELEASE = "0.33.0"
KERNEL = "fused_moe_kernel"
SOURCE = ("model_executor", "layers", "fused_moe", "fused_moe.py")
__all__ = ["NAIVE_SPARSITY", "naive_assignment", "swap_ab", "refusal", "launch"]


def refusal(config: dict, quant_dtype: str | None) -> str | None:
    """Why vLLM 0.33's kernel cannot run `config`, or None."""
    if config.get("USE_TMA"):
        return "vLLM's fused_moe_kernel has no TMA path (USE_TMA is SGLang's)"
    if quant_dtype in DTYPES.names("gptq_awq"):
        what = quant_dtype.replace("_", " ")
        return f"vLLM runs {what} in fused_moe_kernel_gptq_awq, not fused_moe_kernel"
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
    """Launch vLLM 0.33's `kernel` as its launcher does; `moetune.kernel` argument names.

    ``sorted_token_ids`` None selects the naive path (``num_tokens_post_padded`` then
    holds ``M * top_k * BLOCK_SIZE_M`` and ``expert_ids`` the flat ``topk_ids``).
    `capability` is the device's compute capability (None: not a CUDA device).
    """
    import torch
    import triton
    import triton.language as tl

    reason = refusal(config, quant_dtype) or (
        "vLLM's fused_moe_kernel has no TMA path" if a_use_tma or w_use_tma or c_sorted else None
    )
    if reason:
        raise ValueError(reason)
    c2 = c.view(-1, c.shape[-1])
    rows = a.shape[0]
    num_slots = rows * top_k
    bm = config["BLOCK_SIZE_M"]
    if sorted_token_ids is not None:
        em = sorted_token_ids.shape[0]
        if rows < bm:
            em = min(em, rows * top_k * bm)
    else:
        em = num_slots * bm
    n, k = w.shape[1], w.shape[2]
    block_k = config["BLOCK_SIZE_K"]
    if block_shape is not None and quant_dtype in DTYPES.names("quantizes_activations"):
        block_k = min(block_k, min(block_shape))
    if a_scale is not None and a_scale.ndim == 0:
        a_scale = a_scale.reshape(1)
    meta = {key: value for key, value in config.items() if key not in ("BLOCK_SIZE_K", "SPLIT_K")}
    grid = (triton.cdiv(em, bm) * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    two_d_a_scale = a_scale is not None and a_scale.ndim == 2
    kernel[grid](
        a,
        w,
        c2,
        None,
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
        w.stride(2),
        w.stride(1),
        c2.stride(0),
        c2.stride(1),
        a_scale.stride(0) if two_d_a_scale else 0,
        a_scale.stride(1) if two_d_a_scale else 0,
        w_scale.stride(0) if w_scale is not None else 0,
        w_scale.stride(2) if w_scale is not None and w_scale.ndim == 3 else 0,
        w_scale.stride(1)
        if w_scale is not None and w_scale.ndim >= 2 and w_scale.shape[1] > 1
        else 0,
        0,
        0,
        0 if block_shape is None else block_shape[0],
        0 if block_shape is None else block_shape[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        compute_type=tl.bfloat16 if c.dtype == torch.bfloat16 else tl.float16,
        use_fp8_w8a8=quant_dtype == "fp8_w8a8",
        use_int8_w8a8=quant_dtype == "int8_w8a8",
        use_int8_w8a16=quant_dtype == "int8_w8a16",
        per_channel_quant=per_channel,
        naive_block_assignment=sorted_token_ids is None,
        HAS_BIAS=False,
        BLOCK_SIZE_K=block_k,
        SWAP_AB=swap_ab(config, quant_dtype, capability),
        USE_TD=False,
        SPLIT_K=1,
        **meta,
    )
    return c
