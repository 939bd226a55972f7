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
from moetune.engines.launch.common import GemmCall, quant_constexprs
from moetune.kernel.launch_rules import (
    NAIVE_SPARSITY,
    a_scale_strides,
    grid_rows,
    group_shape,
    naive_assignment,
    operand_strides,
    swap_ab,
    w_scale_strides,
)

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


def launch(kernel: Any, call: GemmCall, capability: tuple[int, int] | None = None) -> Any:
    """Launch vLLM 0.33's `kernel` on `call` as its launcher does.

    ``call.sorted_token_ids`` None selects the naive path (``num_tokens_post_padded``
    then holds ``M * top_k * BLOCK_SIZE_M`` and ``expert_ids`` the flat ``topk_ids``).
    `capability` is the device's compute capability (None: not a CUDA device).
    """
    import triton

    config, quant_dtype, block_shape = call.config, call.quant_dtype, call.block_shape
    reason = refusal(config, quant_dtype) or (
        "vLLM's fused_moe_kernel has no TMA path"
        if call.a_use_tma or call.w_use_tma or call.c_sorted
        else None
    )
    if reason:
        raise ValueError(reason)
    a, w, c2, n, k = call.a, call.w, call.c2, call.n, call.k
    num_slots = a.shape[0] * call.top_k
    bm = config["BLOCK_SIZE_M"]
    em = grid_rows(call.sorted_token_ids, num_slots, a.shape[0], call.top_k, bm)
    block_k = config["BLOCK_SIZE_K"]
    if block_shape is not None and quant_dtype in DTYPES.names("quantizes_activations"):
        block_k = min(block_k, min(block_shape))
    a_scale = call.a_scale
    if a_scale is not None and a_scale.ndim == 0:
        a_scale = a_scale.reshape(1)
    meta = {key: value for key, value in config.items() if key not in ("BLOCK_SIZE_K", "SPLIT_K")}
    grid = (triton.cdiv(em, bm) * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    kernel[grid](
        a,
        w,
        c2,
        None,
        a_scale,
        call.w_scale,
        call.topk_weights,
        call.sorted_token_ids,
        call.expert_ids,
        call.num_tokens_post_padded,
        n,
        k,
        em,
        num_slots,
        *operand_strides(a, w),
        c2.stride(0),
        c2.stride(1),
        *a_scale_strides(a_scale),
        *w_scale_strides(call.w_scale),
        0,
        0,
        *group_shape(block_shape),
        **quant_constexprs(call),
        naive_block_assignment=call.sorted_token_ids is None,
        HAS_BIAS=False,
        BLOCK_SIZE_K=block_k,
        SWAP_AB=swap_ab(config, quant_dtype, capability),
        USE_TD=False,
        SPLIT_K=1,
        **meta,
    )
    return call.c
