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
- ``SPLIT_K = 1``, no bias, ``USE_TD`` off (a Blackwell-only gather);
- ``compute_type`` (`COMPUTE`, read from ``experts/triton_moe.py`` and ``modular_kernel.py``):
  bf16 for w8a8 (the activations arrive as fp8/int8), else the checkpoint's dtype; the
  output buffers are the checkpoint's dtype, so an fp16 checkpoint's w8a8 GEMMs compute
  in bf16 and store into fp16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moetune.dtypes import DTYPES
from moetune.engines.launch.common import GemmCall, quant_constexprs
from moetune.engines.launch.interface import KernelInterface
from moetune.kernel.launch_rules import (
    NAIVE_SPARSITY,
    VLLM_COMPUTE,
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
LAUNCHER = "invoke_fused_moe_triton_kernel"
SOURCE = ("model_executor", "layers", "fused_moe", "fused_moe.py")
__all__ = ["NAIVE_SPARSITY", "naive_assignment", "swap_ab", "refusal", "launch"]
# Where 0.33's kernel differs from the twin, which follows 0.34 (`moetune.engines.launch.TWINS`).
TWIN_DIFFERS = (
    "on fp8 only: no TMA-B and a weight scale per column (block fp8), and the swapped "
    "(SWAP_AB) path loads A and B in another order"
)

# What `launch` was written for: 0.33.0's kernel parameters, in order, and the config
# keys its launcher reads (`moetune.engines.launch.interface`).
KERNEL_PARAMETERS = (
    "a_ptr", "b_ptr", "c_ptr", "b_bias_ptr", "a_scale_ptr", "b_scale_ptr",
    "topk_weights_ptr", "sorted_token_ids_ptr", "expert_ids_ptr",
    "num_tokens_post_padded_ptr", "N", "K", "EM", "num_valid_tokens",
    "stride_am", "stride_ak", "stride_be", "stride_bk", "stride_bn", "stride_cm",
    "stride_cn", "stride_asm", "stride_ask", "stride_bse", "stride_bsk", "stride_bsn",
    "stride_bbe", "stride_bbn", "group_n: constexpr", "group_k: constexpr",
    "naive_block_assignment: constexpr", "BLOCK_SIZE_M: constexpr",
    "BLOCK_SIZE_N: constexpr", "BLOCK_SIZE_K: constexpr", "GROUP_SIZE_M: constexpr",
    "SPLIT_K: constexpr", "MUL_ROUTED_WEIGHT: constexpr", "top_k: constexpr",
    "compute_type: constexpr", "use_fp8_w8a8: constexpr", "use_int8_w8a8: constexpr",
    "use_int8_w8a16: constexpr", "per_channel_quant: constexpr", "HAS_BIAS: constexpr",
    "SWAP_AB: constexpr", "USE_TD: constexpr = False",
)  # fmt: skip
INTERFACE = KernelInterface(
    kernel=KERNEL,
    parameters=KERNEL_PARAMETERS,
    launcher=LAUNCHER,
    config_keys=frozenset({"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "SPLIT_K"}),
)
# The keys of a tuned entry this release accepts: it passes every other key to the
# kernel as a keyword, which Triton refuses at start-up.
FILE_KEYS = frozenset(
    {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "SPLIT_K"}
    | {"num_warps", "num_stages"}
)
# The kernel's compute type and the output buffers' dtype (``TritonExperts``).
COMPUTE = VLLM_COMPUTE
# 0.33 reads no ``<name>_down.json``.
DOWN_FILE_CONDITIONS = None
DOWN_FILE_BLOCK = None
DOWN_FILE_MIN_HIDDEN = None


def refusal(config: dict, quant_dtype: str | None) -> str | None:
    """Why vLLM 0.33's kernel cannot run `config`, or None."""
    if config.get("USE_TMA"):
        return "vLLM's fused_moe_kernel has no TMA path (USE_TMA is SGLang's)"
    if quant_dtype in DTYPES.names("gptq_awq"):
        what = quant_dtype.replace("_", " ")
        return f"vLLM runs {what} in fused_moe_kernel_gptq_awq, not fused_moe_kernel"
    return None


@dataclass(frozen=True)
class Prepared:
    """What vLLM's launcher computes before the launch: the grid and the values it passes."""

    grid: tuple[int]
    em: int
    num_slots: int
    block_k: int
    a_scale: Any
    swap_ab: bool
    meta: dict  # the entry's other keys, passed to the kernel as keywords


def prepare(
    call: GemmCall,
    capability: tuple[int, int] | None,
    refuse: Callable[[dict, str | None], str | None] | None = None,
    launch_keys: tuple[str, ...] = ("BLOCK_SIZE_K", "SPLIT_K"),
) -> Prepared:
    """The grid, EM, clamped BLOCK_SIZE_K, A's scale and SWAP_AB as vLLM 0.33's launcher
    computes them (0.34's alike). `refuse` is the release's `refusal`; `launch_keys` the
    entry's keys the launcher consumes itself (the others go to the kernel as keywords).
    Raises ValueError where the release cannot run `call`, SGLang's TMA layout included."""
    import triton

    config, quant_dtype, block_shape = call.config, call.quant_dtype, call.block_shape
    reason = (refuse or refusal)(config, quant_dtype)
    if reason is None and (call.a_use_tma or call.w_use_tma or call.c_sorted):
        reason = "vLLM's launcher takes no SGLang TMA layout (TMA operands, a sorted C)"
    if reason:
        raise ValueError(reason)
    a = call.a
    num_slots = a.shape[0] * call.top_k
    bm = config["BLOCK_SIZE_M"]
    em = grid_rows(call.sorted_token_ids, num_slots, a.shape[0], call.top_k, bm)
    block_k = config["BLOCK_SIZE_K"]
    if block_shape is not None and quant_dtype in DTYPES.names("quantizes_activations"):
        block_k = min(block_k, min(block_shape))
    a_scale = call.a_scale
    if a_scale is not None and a_scale.ndim == 0:
        a_scale = a_scale.reshape(1)
    return Prepared(
        grid=(triton.cdiv(em, bm) * triton.cdiv(call.n, config["BLOCK_SIZE_N"]),),
        em=em,
        num_slots=num_slots,
        block_k=block_k,
        a_scale=a_scale,
        swap_ab=swap_ab(config, quant_dtype, capability),
        meta={key: value for key, value in config.items() if key not in launch_keys},
    )


def launch(kernel: Any, call: GemmCall, capability: tuple[int, int] | None = None) -> Any:
    """Launch vLLM 0.33's `kernel` on `call` as its launcher does.

    ``call.sorted_token_ids`` None selects the naive path (``num_tokens_post_padded``
    then holds ``M * top_k * BLOCK_SIZE_M`` and ``expert_ids`` the flat ``topk_ids``).
    `capability` is the device's compute capability (None: not a CUDA device).
    """
    prepared = prepare(call, capability)
    a, w, c2 = call.a, call.w, call.c2
    kernel[prepared.grid](
        a,
        w,
        c2,
        None,
        prepared.a_scale,
        call.w_scale,
        call.topk_weights,
        call.sorted_token_ids,
        call.expert_ids,
        call.num_tokens_post_padded,
        call.n,
        call.k,
        prepared.em,
        prepared.num_slots,
        *operand_strides(a, w),
        c2.stride(0),
        c2.stride(1),
        *a_scale_strides(prepared.a_scale),
        *w_scale_strides(call.w_scale),
        0,
        0,
        *group_shape(call.block_shape),
        **quant_constexprs(call, COMPUTE),
        naive_block_assignment=call.sorted_token_ids is None,
        HAS_BIAS=False,
        BLOCK_SIZE_K=prepared.block_k,
        SWAP_AB=prepared.swap_ab,
        USE_TD=False,
        SPLIT_K=1,
        **prepared.meta,
    )
    return call.c
