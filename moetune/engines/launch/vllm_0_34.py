"""How vLLM 0.34 launches its Triton ``fused_moe_kernel`` (``invoke_fused_moe_triton_kernel``).

Read from the released wheel's ``vllm/model_executor/layers/fused_moe/fused_moe.py``;
the kernel is compiled from the installed file (`moetune.engines.source`), never
copied. Everything 0.33 decides stays (`moetune.engines.launch.vllm_0_33`: the naive
assignment, EM, SWAP_AB, the BLOCK_SIZE_K clamp). What 0.34 adds:

- two positional parameters: ``b_desc`` after ``b_ptr`` and ``a_desc`` after
  ``num_tokens_post_padded_ptr``, and the constexprs ``USE_TMA_B``, ``USE_TMA_A``
  and ``C_IS_SORTED``;
- TMA-B: the weights are read through a host ``TensorDescriptor`` with box
  ``[1, BLOCK_SIZE_N, BLOCK_SIZE_K]`` when the entry's ``USE_TMA`` (popped, default
  True) holds and the call is fp8_w8a8 with a block shape (both sides non-zero) on a
  CUDA device of capability family 9.x or 10.x, with B contiguous,
  ``N % BLOCK_SIZE_N == 0`` and ``K % BLOCK_SIZE_K == 0`` (after the clamp) — `use_tma_b`;
- TMA-A and a sorted C (``A_is_sorted``/``C_is_sorted``) belong to the ``_down.json``
  path of ``TritonExperts`` (DeepGEMM E8M0, fused SiLU-mul-quant), which moetune does
  not launch: both stay off;
- ``topk_weights`` must be contiguous (a ValueError in 0.34, an assert in 0.33).

``compute_type`` is 0.33's (`COMPUTE`): bf16 for w8a8, into buffers of the checkpoint's dtype.

A tuned entry's ``USE_TMA`` applies to both GEMMs of a call (each launch pops it from
its own copy), so `split_configs` hands the entry to both launches unchanged.
"""

from __future__ import annotations

from typing import Any

from moetune.dtypes import DTYPES
from moetune.engines.launch.common import GemmCall, quant_constexprs
from moetune.engines.launch.interface import KernelInterface
from moetune.engines.launch.vllm_0_33 import (
    COMPUTE,
    KERNEL,
    LAUNCHER,
    NAIVE_SPARSITY,
    SOURCE,
    naive_assignment,
    prepare,
    swap_ab,
)
from moetune.kernel.launch_rules import (
    a_scale_strides,
    group_shape,
    operand_strides,
    w_scale_strides,
)
from moetune.kernel.tma import TMA_KEY, SplitConfigError, SplitConfigs

ENGINE = "vllm"
RELEASE = "0.34.0"
__all__ = [
    "COMPUTE",
    "KERNEL",
    "LAUNCHER",
    "NAIVE_SPARSITY",
    "SOURCE",
    "naive_assignment",
    "swap_ab",
    "refusal",
    "launch",
    "use_tma_b",
    "split_configs",
]
# Where 0.34's kernel differs from the twin, which follows 0.33 (`moetune.engines.launch.TWINS`).
TWIN_DIFFERS = "on block fp8 only: TMA-B on sm90/sm100, one weight scale per tile"
# Capability families whose launches take TMA-B (``is_device_capability_family(90/100)``).
TMA_B_FAMILIES = (9, 10)

KERNEL_PARAMETERS = (
    "a_ptr", "b_ptr", "b_desc", "c_ptr", "b_bias_ptr", "a_scale_ptr", "b_scale_ptr",
    "topk_weights_ptr", "sorted_token_ids_ptr", "expert_ids_ptr",
    "num_tokens_post_padded_ptr", "a_desc", "N", "K", "EM", "num_valid_tokens",
    "stride_am", "stride_ak", "stride_be", "stride_bk", "stride_bn", "stride_cm",
    "stride_cn", "stride_asm", "stride_ask", "stride_bse", "stride_bsk", "stride_bsn",
    "stride_bbe", "stride_bbn", "group_n: constexpr", "group_k: constexpr",
    "naive_block_assignment: constexpr", "BLOCK_SIZE_M: constexpr",
    "BLOCK_SIZE_N: constexpr", "BLOCK_SIZE_K: constexpr", "GROUP_SIZE_M: constexpr",
    "SPLIT_K: constexpr", "MUL_ROUTED_WEIGHT: constexpr", "top_k: constexpr",
    "compute_type: constexpr", "use_fp8_w8a8: constexpr", "use_int8_w8a8: constexpr",
    "use_int8_w8a16: constexpr", "per_channel_quant: constexpr", "HAS_BIAS: constexpr",
    "SWAP_AB: constexpr", "USE_TD: constexpr = False", "USE_TMA_B: constexpr = False",
    "USE_TMA_A: constexpr = False", "C_IS_SORTED: constexpr = False",
)  # fmt: skip
INTERFACE = KernelInterface(
    kernel=KERNEL,
    parameters=KERNEL_PARAMETERS,
    launcher=LAUNCHER,
    config_keys=frozenset({"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "SPLIT_K", TMA_KEY}),
)
# The keys of a tuned entry 0.34 accepts (it pops USE_TMA, passes the others to the kernel).
FILE_KEYS = frozenset(
    {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "SPLIT_K"}
    | {"num_warps", "num_stages", TMA_KEY}
)
# When 0.34 runs the down GEMM on ``<name>_down.json`` (``TritonExperts``, read from
# ``experts/triton_moe.py``); the up file serves both GEMMs otherwise.
DOWN_FILE_BLOCK = (128, 128)
DOWN_FILE_MIN_HIDDEN = 4096
DOWN_FILE_CONDITIONS = (
    "TritonExperts, fp8_w8a8 block [128,128], compute capability 9.0, DeepGEMM's E8M0 "
    "scales in use (VLLM_USE_DEEP_GEMM_E8M0=1, the default, with DeepGEMM installed), SiLU, "
    "no expert map or LoRA, hidden size >= 4096 and divisible by the entry's BLOCK_SIZE_N, "
    "the up BLOCK_SIZE_M a multiple of 16, and an entry with USE_TMA true"
)


def refusal(config: dict, quant_dtype: str | None) -> str | None:
    """Why vLLM 0.34's kernel cannot run `config`, or None."""
    tma = config.get(TMA_KEY, True)
    if not isinstance(tma, bool):
        return f"{TMA_KEY} must be true or false, got {tma!r}"
    if quant_dtype in DTYPES.names("gptq_awq"):
        what = quant_dtype.replace("_", " ")
        return f"vLLM runs {what} in fused_moe_kernel_gptq_awq, not fused_moe_kernel"
    return None


def split_configs(config: dict, down_config: dict | None) -> SplitConfigs:
    """What each GEMM of a call runs: `config` for both, ``USE_TMA`` left in for the launch.

    vLLM 0.34 reads a ``_down.json`` only on its sorted-A path (not launched here), so a
    `down_config` is refused (`SplitConfigError`).
    """
    if down_config is not None:
        raise SplitConfigError(
            "vLLM 0.34's down config runs on its sorted-A TMA path (DeepGEMM E8M0, fused "
            "SiLU-mul-quant), which moetune does not launch"
        )
    return SplitConfigs(up=dict(config), down=dict(config), up_tma=False, down_tma=False)


def use_tma_b(
    config: dict,
    quant_dtype: str | None,
    block_shape: Any,
    capability: tuple[int, int] | None,
    n: int,
    k: int,
    block_k: int,
    contiguous: bool = True,
) -> bool:
    """vLLM 0.34's ``use_tma_b``: the weights through a TMA descriptor.

    `capability` None is not a CUDA device (0.34 then never takes TMA-B); `block_k` is
    BLOCK_SIZE_K after the clamp to the block; `contiguous` whether B is.
    """
    return (
        bool(config.get(TMA_KEY, True))
        and quant_dtype == "fp8_w8a8"
        and block_shape is not None
        and all(block_shape)
        and capability is not None
        and capability[0] in TMA_B_FAMILIES
        and contiguous
        and n % config["BLOCK_SIZE_N"] == 0
        and k % block_k == 0
    )


def launch(kernel: Any, call: GemmCall, capability: tuple[int, int] | None = None) -> Any:
    """Launch vLLM 0.34's `kernel` on `call` as its launcher does (see the module docstring).

    `capability` is the device's compute capability (None: not a CUDA device, so no TMA).
    """
    if call.topk_weights is not None and not call.topk_weights.is_contiguous():
        raise ValueError("topk_weights must be contiguous")
    prepared = prepare(call, capability, refusal, ("BLOCK_SIZE_K", "SPLIT_K", TMA_KEY))
    w = call.w
    tma_b = use_tma_b(
        call.config,
        call.quant_dtype,
        call.block_shape,
        capability,
        call.n,
        call.k,
        prepared.block_k,
        contiguous=w.is_contiguous() and w.device.type == "cuda",
    )
    b_desc = None
    if tma_b:
        from moetune.kernel.tma import make_descriptor

        b_desc = make_descriptor(w, (1, call.config["BLOCK_SIZE_N"], prepared.block_k), "B")
    try:
        _launch(kernel, call, prepared, b_desc, tma_b)
    except Exception as exc:
        if SCALAR_INDEX_ERROR in str(exc) and _scale_shortcut(call):
            import triton

            raise ValueError(
                f"vLLM 0.34.0's fused_moe_kernel does not compile on Triton {triton.__version__} "
                f"with BLOCK_SIZE_N={call.config['BLOCK_SIZE_N']} dividing the weight block "
                f"{list(call.block_shape)}: it broadcasts its one weight scale per tile with "
                "b_scale[None, :], which this Triton refuses on a scalar (vLLM 0.34 pins "
                "Triton 3.8)"
            ) from exc
        raise
    return call.c


# What Triton 3.9 says about 0.34's per-tile weight scale (`_scale_shortcut`).
SCALAR_INDEX_ERROR = "too many indices for tensor of rank 0"


def _scale_shortcut(call: GemmCall) -> bool:
    """0.34 loads one weight scale per tile: block quantization with ``group_n`` a multiple
    of BLOCK_SIZE_N (the kernel's ``group_n >= BLOCK_SIZE_N and group_n % BLOCK_SIZE_N == 0``)."""
    if call.block_shape is None or not all(call.block_shape):
        return False
    group_n, block_n = call.block_shape[0], call.config["BLOCK_SIZE_N"]
    return group_n >= block_n and group_n % block_n == 0


def _launch(kernel: Any, call: GemmCall, prepared: Any, b_desc: Any, tma_b: bool) -> None:
    a, w, c2 = call.a, call.w, call.c2
    kernel[prepared.grid](
        a,
        w,
        b_desc,
        c2,
        None,
        prepared.a_scale,
        call.w_scale,
        call.topk_weights,
        call.sorted_token_ids,
        call.expert_ids,
        call.num_tokens_post_padded,
        None,
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
        USE_TMA_B=tma_b,
        USE_TMA_A=False,
        C_IS_SORTED=False,
        SPLIT_K=1,
        **prepared.meta,
    )
