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
- the sorted path of ``TritonExperts`` (its ``_down.json``; DeepGEMM E8M0, fused
  SiLU-mul-quant): a ``_down`` entry with ``USE_TMA`` true makes the up GEMM write its
  rows at the sorted position (``C_is_sorted``) and the down GEMM read them through a
  TMA descriptor (``A_is_sorted``: TMA-A, which needs TMA-B), on the down entry's tile
  with the up entry's BLOCK_SIZE_M (`split_configs`, `launch`). moetune's call maps
  SGLang's names for the same layout onto these flags (``c_sorted``; ``a_use_tma``);
- ``topk_weights`` must be contiguous (a ValueError in 0.34, an assert in 0.33).

``compute_type`` is 0.33's (`COMPUTE`): bf16 for w8a8, into buffers of the checkpoint's dtype.

A tuned entry's ``USE_TMA`` applies to both GEMMs of a call (each launch pops it from
its own copy), so `split_configs` hands the entry to both launches unchanged; a ``_down``
entry's ``USE_TMA`` (popped, default False) chooses the sorted path instead.
"""

from __future__ import annotations

from dataclasses import replace
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
    TMA_B_FAMILIES,
    a_scale_strides,
    group_shape,
    operand_strides,
    use_tma_b,
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
    "TMA_B_FAMILIES",
]

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
    """What each GEMM of a call runs, as ``TritonExperts`` reads its two files.

    `config` (the main file's entry, its ``USE_TMA`` left in for each launch's TMA-B) runs
    the up GEMM, and the down GEMM too unless `down_config` (a ``_down.json`` entry) has
    ``USE_TMA`` true: then the down GEMM runs the sorted path on `down_config`'s tile with
    `config`'s BLOCK_SIZE_M (``{**tma_down_config, "BLOCK_SIZE_M": config[...]}``), and
    TMA-B at its default (on). A ``_down`` entry without ``USE_TMA`` true (a guard entry)
    runs the call on `config` alone. Which calls take the path at all is the server's
    (`DOWN_FILE_CONDITIONS`); `launch` refuses a sorted call vLLM would not run.
    """
    if down_config is None:
        return SplitConfigs(up=dict(config), down=dict(config), up_tma=False, down_tma=False)
    sorted_path = down_config.get(TMA_KEY, False)
    if not isinstance(sorted_path, bool):
        raise SplitConfigError(f"down config {TMA_KEY} must be true or false, got {sorted_path!r}")
    if not sorted_path:
        return SplitConfigs(up=dict(config), down=dict(config), up_tma=False, down_tma=False)
    down = {key: value for key, value in down_config.items() if key != TMA_KEY}
    down["BLOCK_SIZE_M"] = config["BLOCK_SIZE_M"]
    return SplitConfigs(up=dict(config), down=down, up_tma=False, down_tma=True)


# ``TritonExperts``' conditions on a sorted call that a launch can see (the others, the
# server's: `DOWN_FILE_CONDITIONS`): vLLM runs the call on the main entry when one fails.
SORTED_BLOCK_M_MULTIPLE = 16
SORTED_GROUP_K = 128  # the fused SiLU-mul-quant's group: the intermediate a multiple of it


def sorted_refusal(call: GemmCall) -> str | None:
    """Why ``TritonExperts`` would not take its sorted path for this GEMM of a call
    (the up GEMM writing sorted rows, or the down GEMM reading them), or None."""
    if call.sorted_token_ids is None:
        return "vLLM skips the alignment at this batch size (naive assignment): no sorted path"
    if call.quant_dtype != "fp8_w8a8" or call.block_shape is None:
        return "vLLM's sorted path is for fp8_w8a8 block [128,128] only"
    if tuple(call.block_shape) != DOWN_FILE_BLOCK:
        return "vLLM's sorted path is for fp8_w8a8 block [128,128] only"
    if call.config["BLOCK_SIZE_M"] % SORTED_BLOCK_M_MULTIPLE:
        return (
            f"vLLM's sorted path needs the up BLOCK_SIZE_M a multiple of "
            f"{SORTED_BLOCK_M_MULTIPLE}, got {call.config['BLOCK_SIZE_M']}"
        )
    if call.a_use_tma:  # the down GEMM: w2 [E, hidden, intermediate]
        if call.n % call.config["BLOCK_SIZE_N"]:
            return (
                f"vLLM's sorted path needs the hidden size {call.n} divisible by the down "
                f"BLOCK_SIZE_N {call.config['BLOCK_SIZE_N']}"
            )
        if call.k % SORTED_GROUP_K:
            return f"vLLM's sorted path needs the intermediate size a multiple of {SORTED_GROUP_K}"
    return None


def launch(kernel: Any, call: GemmCall, capability: tuple[int, int] | None = None) -> Any:
    """Launch vLLM 0.34's `kernel` on `call` as its launcher does (see the module docstring).

    `capability` is the device's compute capability (None: not a CUDA device, so no TMA).
    ``call.c_sorted`` is vLLM's ``C_is_sorted`` (the up GEMM of a sorted call) and
    ``call.a_use_tma`` its ``A_is_sorted`` (the down GEMM: TMA-A, with TMA-B); Triton's
    interpreter emulates the descriptors, so the sorted path also runs there (as on sm90).
    """
    if call.topk_weights is not None and not call.topk_weights.is_contiguous():
        raise ValueError("topk_weights must be contiguous")
    a_sorted, c_sorted = call.a_use_tma, call.c_sorted
    if a_sorted or c_sorted:
        reason = sorted_refusal(call)
        if reason is None and capability is not None and tuple(capability) != SORTED_CAPABILITY:
            reason = (
                f"vLLM's sorted path runs on compute capability 9.0 only, this GPU has "
                f"{capability[0]}.{capability[1]}"
            )
        if reason:
            raise ValueError(reason)
        call = replace(call, a_use_tma=False, w_use_tma=False, c_sorted=False)
    # The interpreter runs the sorted path as sm90 does, descriptors on CPU tensors included.
    interpreted = (a_sorted or c_sorted) and _interpreting()
    if interpreted and capability is None:
        capability = SORTED_CAPABILITY
    prepared = prepare(call, capability, refusal, ("BLOCK_SIZE_K", "SPLIT_K", TMA_KEY))
    if a_sorted:
        # vLLM: EM is the sorted ids' length (no small-batch cap), the valid slots C's rows.
        import triton

        em = call.sorted_token_ids.shape[0]
        prepared = replace(
            prepared,
            em=em,
            num_slots=call.c.shape[0] * call.c.shape[1],
            grid=(
                triton.cdiv(em, call.config["BLOCK_SIZE_M"])
                * triton.cdiv(call.n, call.config["BLOCK_SIZE_N"]),
            ),
        )
    w = call.w
    tma_b = use_tma_b(
        call.config,
        call.quant_dtype,
        call.block_shape,
        capability,
        call.n,
        call.k,
        prepared.block_k,
        # (meta tensors: bench/sass_loop.py compiles the launch as it would run on a GPU)
        contiguous=w.is_contiguous() and (w.device.type in ("cuda", "meta") or interpreted),
    )
    b_desc = a_desc = None
    if tma_b:
        from moetune.kernel.tma import make_descriptor

        b_desc = make_descriptor(w, (1, call.config["BLOCK_SIZE_N"], prepared.block_k), "B")
    if a_sorted:
        a, a_scale = call.a, prepared.a_scale
        if not (
            tma_b
            and a.is_contiguous()
            and a.shape[0] == prepared.em
            and a.shape[1] % prepared.block_k == 0
            and a_scale is not None
            and a_scale.ndim == 2
            and a_scale.shape[0] == prepared.em
        ):
            raise ValueError("Sorted MoE activation requires a valid A TMA descriptor")
        from moetune.kernel.tma import make_descriptor

        a_desc = make_descriptor(a, (call.config["BLOCK_SIZE_M"], prepared.block_k), "A")
    try:
        _launch(kernel, call, prepared, b_desc, tma_b, a_desc, c_sorted)
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


# ``current_platform.is_device_capability(90)``: the sorted path's one capability.
SORTED_CAPABILITY = (9, 0)


def _interpreting() -> bool:
    from moetune.kernel.fused_moe_kernel import interpreting

    return interpreting()


# What Triton 3.9 says about 0.34's per-tile weight scale (`_scale_shortcut`).
SCALAR_INDEX_ERROR = "too many indices for tensor of rank 0"


def _scale_shortcut(call: GemmCall) -> bool:
    """0.34 loads one weight scale per tile: block quantization with ``group_n`` a multiple
    of BLOCK_SIZE_N (the kernel's ``group_n >= BLOCK_SIZE_N and group_n % BLOCK_SIZE_N == 0``)."""
    if call.block_shape is None or not all(call.block_shape):
        return False
    group_n, block_n = call.block_shape[0], call.config["BLOCK_SIZE_N"]
    return group_n >= block_n and group_n % block_n == 0


def _launch(
    kernel: Any,
    call: GemmCall,
    prepared: Any,
    b_desc: Any,
    tma_b: bool,
    a_desc: Any = None,
    c_sorted: bool = False,
) -> None:
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
        a_desc,
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
        USE_TMA_A=a_desc is not None,
        C_IS_SORTED=c_sorted,
        SPLIT_K=1,
        **prepared.meta,
    )
