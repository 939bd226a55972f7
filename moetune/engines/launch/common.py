"""What the engines' launchers share: the call they are given, and the constexprs both name alike.

`GemmCall` is one GEMM launch in `moetune.kernel.fused_moe_kernel.invoke_fused_moe_gemm`'s
terms (`EngineGemm` builds it); each release's ``launch`` turns it into its kernel's
argument list. vLLM's and SGLang's ``fused_moe_kernel`` share an ancestor, and take the
routing weight, top-k, compute type and quantization flags under the same names
(`quant_constexprs`); each release declares its compute type (``COMPUTE``, a
`moetune.kernel.launch_rules.ComputeRule`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.kernel.launch_rules import ComputeRule, dtype_name


@dataclass(frozen=True)
class GemmCall:
    """One GEMM launch: ``c[slot] = a[slot // top_k] @ w[expert(slot)].T`` (see
    `invoke_fused_moe_gemm` for the shapes, the naive path and the TMA flags)."""

    a: Any
    w: Any
    c: Any
    a_scale: Any
    w_scale: Any
    topk_weights: Any
    sorted_token_ids: Any
    expert_ids: Any
    num_tokens_post_padded: Any
    mul_routed_weight: bool
    top_k: int
    config: dict
    quant_dtype: str | None
    block_shape: Any
    per_channel: bool = False
    a_use_tma: bool = False
    w_use_tma: bool = False
    c_sorted: bool = False

    @property
    def c2(self) -> Any:
        """`c` viewed as ``[rows, N]``."""
        return self.c.view(-1, self.c.shape[-1])

    @property
    def n(self) -> int:
        return self.w.shape[1]

    @property
    def k(self) -> int:
        return self.w.shape[2]


def quant_constexprs(call: GemmCall, compute: ComputeRule) -> dict[str, Any]:
    """The constexprs vLLM's and SGLang's kernels both take, in their launchers' order;
    ``compute_type`` by the release's `compute` rule (``call.c`` is in the checkpoint's dtype)."""
    import triton.language as tl

    checkpoint = dtype_name(call.c.dtype)
    return {
        "MUL_ROUTED_WEIGHT": call.mul_routed_weight,
        "top_k": call.top_k,
        "compute_type": getattr(tl, compute.compute_dtype(call.quant_dtype, checkpoint)),
        "use_fp8_w8a8": call.quant_dtype == "fp8_w8a8",
        "use_int8_w8a8": call.quant_dtype == "int8_w8a8",
        "use_int8_w8a16": call.quant_dtype == "int8_w8a16",
        "per_channel_quant": call.per_channel,
    }
