"""The fused-MoE layer: routing, alignment, two grouped GEMMs, SiLU-and-mul and the top-k sum.

    router_logits ──topk_routing──► topk_weights, topk_ids [M, top_k]
    topk_ids ──align_block_size──► sorted_token_ids, expert_ids, num_tokens_post_padded
             (or, at few slots per expert, vLLM's naive assignment: one block per slot)
    x [M, K] ──GEMM1 (w1)──► gate_up [M*top_k, 2N] ──silu_and_mul──► act [M*top_k, N]
    act ──GEMM2 (w2, × topk weight)──► down [M, top_k, K] ──moe_sum──► out [M, K]

fp8 w8a8 quantizes x before GEMM1 and act before GEMM2 (dynamically, per tensor or
per token group; for block fp8 the SiLU-and-mul kernel quantizes its own output,
so act never exists in bf16); per-channel fp8 and int8 w8a8 quantize x and act per
token. int4 w4a16 runs its own GEMM kernel (``fused_moe_wna16_kernel``) on
unquantized activations. `config` drives the up GEMM and, as in vLLM, also the down
GEMM unless `down_config` (SGLang's ``_down.json`` entry) is given; either may carry
SGLang's ``"USE_TMA"`` (`moetune.kernel.tma`). With TMA on the down GEMM, gate_up and
act are in sorted, expert-contiguous order, ``len(sorted_token_ids)`` rows. On an
engine's kernel (`gemm`) the engine release decides what it owns: the length of
``sorted_token_ids`` and of the sorted intermediates, a layer it refuses, the TMA rule,
and the top-k sum (SGLang 0.5.23: `moetune.engines.launch.sglang_0_5_23`). Every step
is a GPU kernel with static shapes and no host sync, so a call can be captured in
a CUDA graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moetune.dtypes import DTYPES
from moetune.errors import MoetuneError
from moetune.kernel import launch_rules
from moetune.kernel.activation import silu_and_mul, silu_and_mul_quant_fp8
from moetune.kernel.align import align_block_size
from moetune.kernel.config import TMA_B_KEY, default_config
from moetune.kernel.fused_moe_kernel import invoke_fused_moe_gemm
from moetune.kernel.fused_moe_wna16_kernel import invoke_fused_moe_wna16_gemm
from moetune.kernel.quant import (
    MoEQuant,
    per_tensor_quant_fp8,
    per_token_group_quant_fp8,
    per_token_quant,
)
from moetune.kernel.reduce import moe_sum
from moetune.kernel.routing import topk_routing
from moetune.kernel.tma import SplitConfigError, SplitConfigs, check_tma_request, split_configs

if TYPE_CHECKING:
    import torch


def kernel_dtype(x: torch.Tensor, quant: MoEQuant | None) -> str:
    """The engines' dtype string for a call: the quantization's, else "bf16" or "fp16"."""
    import torch

    if quant is not None:
        return quant.dtype
    return "fp16" if x.dtype == torch.float16 else "bf16"


def gemm_compute_dtype(x: torch.Tensor, quant: MoEQuant | None, gemm=None):  # noqa: ANN001
    """The torch dtype a call's GEMMs round their results to before storing them in x's
    dtype: by the release's ``COMPUTE`` rule on an engine's kernel (`gemm`, an
    `EngineGemm`), by vLLM's on moetune's twin (`launch_rules.VLLM_COMPUTE`). bf16 for an
    fp16 checkpoint's w8a8 on vLLM's kernels, x's dtype everywhere else."""
    import torch

    rule = getattr(getattr(gemm, "release", None), "COMPUTE", launch_rules.VLLM_COMPUTE)
    quant_dtype = quant.dtype if quant is not None else None
    return getattr(torch, rule.compute_dtype(quant_dtype, launch_rules.dtype_name(x.dtype)))


def quantize_activation(a: torch.Tensor, quant: MoEQuant | None):
    """``(a as GEMM input, its scale or None)``: fp8/int8 for w8a8, unchanged otherwise."""
    if quant is None or not DTYPES[quant.dtype].quantizes_activations:
        return a, None
    if quant.per_channel:
        return per_token_quant(a, quant.dtype)
    if quant.block_shape is None:
        return per_tensor_quant_fp8(a)
    return per_token_group_quant_fp8(a, quant.block_shape[1])


def gemm_launcher(quant: MoEQuant | None):
    """The GEMM launcher for `quant`'s weight layout: `invoke_fused_moe_gemm`, or for int4
    w4a16 an adapter to its own kernel taking the same arguments (see `weight_launch_args`)."""
    if quant is None or not DTYPES[quant.dtype].gptq_awq:
        return invoke_fused_moe_gemm
    return _invoke_wna16


def _invoke_wna16(
    a, w, c, *, a_scale, w_scale, quant_dtype, block_shape, w_zp, group_size, **launch
):  # noqa: ANN001, ANN202
    """`invoke_fused_moe_gemm`'s arguments, on the int4 w4a16 kernel (no TMA there)."""
    assert a_scale is None and block_shape is None, "int4_w4a16 takes unquantized activations"
    tma = [name for name in ("a_use_tma", "w_use_tma", "c_sorted") if launch.pop(name, False)]
    if tma:
        raise MoetuneError(f"int4_w4a16 has no TMA path ({', '.join(tma)})")
    return invoke_fused_moe_wna16_gemm(
        a, w, c, w_scale=w_scale, w_zp=w_zp, group_size=group_size, **launch
    )


def weight_launch_args(quant: MoEQuant | None, zero_points) -> dict:  # noqa: ANN001
    """The launcher keywords besides the common ones: per_channel, or int4's zero points and group."""
    if quant is None:
        return {}
    if DTYPES[quant.dtype].gptq_awq:
        return dict(w_zp=zero_points, group_size=quant.group_size)
    return dict(per_channel=quant.per_channel)


def naive_assignment(
    engine_gemm,  # noqa: ANN001 - an `EngineGemm` or None
    num_slots: int,
    num_experts: int,
    quant: MoEQuant | None,
    split: SplitConfigs,
) -> bool:
    """Whether the call skips alignment (one block per token slot; expert ids all local).

    An engine's kernel: that release's rule. moetune's twin: vLLM 0.33's rule
    (``M * top_k * 4 <= E``, not for group-quantized weight-only int4/int8), except
    with SGLang's TMA operands, which need the aligned, sorted layout.
    """
    quant_dtype = quant.dtype if quant is not None else None
    # The engines' block_shape: [0, group_size] for group-quantized weight-only dtypes.
    if quant is not None and quant.group_size is not None:
        block_shape = (0, quant.group_size)
    else:
        block_shape = quant.block_shape if quant is not None else None
    if engine_gemm is not None:
        return engine_gemm.naive_assignment(num_slots, num_experts, quant_dtype, block_shape)
    if split.up_tma or split.down_tma:
        return False
    return launch_rules.naive_assignment(num_slots, num_experts, quant_dtype, block_shape)


def _sized(engine_gemm, rule: str, *args: int) -> int | None:  # noqa: ANN001
    """An engine release's own buffer size (`rule` of its launch module, e.g. SGLang's
    ``align_slots``), or None where the release or moetune's kernel has none."""
    sizing = getattr(getattr(engine_gemm, "release", None), rule, None)
    return None if sizing is None else sizing(*args)


def fused_experts(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    config: dict | None = None,
    down_config: dict | None = None,
    quant: MoEQuant | None = None,
    ids_may_be_nonlocal: bool = False,
    gemm=None,  # noqa: ANN001 - an `EngineGemm`
) -> torch.Tensor:
    """The MoE layer for routing the caller already did.

    Args:
        x: [M, K] bf16 or fp16 activations.
        w1: [E, 2N, K] gate and up projections (bf16/fp16, or quantized per `quant`).
        w2: [E, K, N] down projections.
        topk_weights: [M, top_k] fp32 routing weights.
        topk_ids: [M, top_k] int32 expert ids.
        config: one tuned-file entry (the six kernel keys, optionally ``"USE_TMA"``: w1
            through a TMA descriptor) for the up GEMM; None: `default_config`.
        down_config: the down GEMM's entry (SGLang's ``_down.json``), same BLOCK_SIZE_M
            as `config` (else `SplitConfigError`, a ValueError); ``"USE_TMA": true`` makes
            the up GEMM write sorted rows and the down GEMM read act and w2 through TMA.
            None: the down GEMM runs on `config`'s tile without TMA (SGLang's
            ``down_config or config``).
        quant: the weights' quantization; None for bf16/fp16 weights.
        ids_may_be_nonlocal: True when `topk_ids` may hold -1 or ids >= E (experts on
            another expert-parallel rank). Alignment skips those slots, so the
            buffers they would have filled are zeroed first (one memset each).
        gemm: the GEMM launcher (`moetune.engines.launch.EngineGemm`, an engine's own
            kernel launched as that release launches it; it also decides whether the
            call takes the engine's naive one-block-per-slot path instead of alignment).
            None: moetune's kernel, which takes the naive path under vLLM 0.33's rule
            (`naive_assignment`).

    Returns:
        [M, K] in x's dtype.
    """
    import torch

    assert x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16), (
        "x must be [M, K] bf16 or fp16"
    )
    num_tokens, hidden = x.shape
    num_experts, two_n, w1_k = w1.shape
    n = two_n // 2
    pack = quant.pack_factor if quant is not None else 1  # int4: two weights per stored byte
    assert w1_k * pack == hidden and two_n == 2 * n, (
        f"w1 must be [E, 2N, {hidden // pack}], got {list(w1.shape)}"
    )
    assert tuple(w2.shape) == (num_experts, hidden, n // pack), (
        f"w2 must be [{num_experts}, {hidden}, {n // pack}]"
    )
    assert topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == num_tokens, (
        "routing must be [M, top_k]"
    )
    top_k = topk_ids.shape[1]
    dtype = kernel_dtype(x, quant)
    block_shape = quant.block_shape if quant is not None else None
    if config is None:
        config = default_config(num_tokens, num_experts, n, hidden, top_k, dtype, block_shape)
    quant_dtype = quant.dtype if quant is not None else None
    w1_scale = quant.w1_scale if quant is not None else None
    w2_scale = quant.w2_scale if quant is not None else None
    engine_gemm = gemm
    if gemm is None:
        gemm = gemm_launcher(quant)
    topk_weights = topk_weights.contiguous()
    # An engine's kernel reads a tuned entry's keys as its release does (vLLM 0.34's
    # USE_TMA is TMA-B on both GEMMs, SGLang's the split TMA layout).
    split = (split_configs if engine_gemm is None else engine_gemm.split_configs)(
        config, down_config
    )
    # vLLM's twin reads an entry without USE_TMA as vLLM 0.34 does: TMA-B on both GEMMs
    # where 0.34's launch takes it (None: the launch decides); USE_TMA false keeps it off,
    # and a USE_TMA true entry or a down config is SGLang's split layout, as before.
    vllm_tma_b = engine_gemm is None and down_config is None and TMA_B_KEY not in config
    layer_rule = getattr(getattr(engine_gemm, "release", None), "layer_refusal", None)
    reason = None if layer_rule is None else layer_rule(n, quant_dtype, block_shape)
    if reason:  # a layer the engine refuses to load is never timed
        raise SplitConfigError(reason)
    if split.up_tma or split.down_tma:  # before any launch
        tma_rule = getattr(getattr(engine_gemm, "release", None), "tma_refusal", None)
        if tma_rule is None:  # moetune's kernel: its own rule
            check_tma_request(quant_dtype, block_shape)
        else:  # an engine's launch: the engine's rule, and this Triton's descriptors
            reason = tma_rule(quant_dtype, block_shape)
            if reason:
                raise SplitConfigError(reason)
            check_tma_request(None, None)

    num_slots = num_tokens * top_k
    if not ids_may_be_nonlocal and naive_assignment(
        engine_gemm, num_slots, num_experts, quant, split
    ):
        # No alignment: block i is slot i, of expert topk_ids[i] (vLLM's decode path).
        sorted_ids = None
        expert_ids = topk_ids.reshape(-1)
        num_post_padded = torch.full(
            (1,), num_slots * split.up["BLOCK_SIZE_M"], dtype=torch.int32, device=x.device
        )
    else:
        sorted_ids, expert_ids, num_post_padded = align_block_size(
            topk_ids,
            split.up["BLOCK_SIZE_M"],
            num_experts,
            _sized(engine_gemm, "align_slots", num_slots, split.up["BLOCK_SIZE_M"], num_experts),
        )
    new_buffer = torch.zeros if ids_may_be_nonlocal else torch.empty
    # Sorted layout (down TMA): one row per sorted position, as many rows as the
    # engine allocates (SGLang: `sorted_rows`; its down GEMM's GDC_EARLY counts them),
    # else as many as there are sorted positions.
    gate_up_rows = num_slots
    if split.down_tma and sorted_ids is None:  # an engine's naive path (vLLM 0.34's sorted one)
        raise SplitConfigError(
            "the down config's sorted layout needs the alignment, which the engine skips at "
            "this batch size (naive assignment): it runs the up config alone there"
        )
    if split.down_tma:
        engine_rows = _sized(
            engine_gemm, "sorted_rows", num_slots, split.up["BLOCK_SIZE_M"], num_experts
        )
        gate_up_rows = sorted_ids.shape[0] if engine_rows is None else engine_rows
    gate_up = new_buffer(gate_up_rows, two_n, dtype=x.dtype, device=x.device)
    down = new_buffer(num_tokens, top_k, hidden, dtype=x.dtype, device=x.device)
    alignment = dict(
        sorted_token_ids=sorted_ids, expert_ids=expert_ids, num_tokens_post_padded=num_post_padded
    )

    a1, a1_scale = quantize_activation(x, quant)
    gemm(
        a1,
        w1,
        gate_up,
        a_scale=a1_scale,
        w_scale=w1_scale,
        **weight_launch_args(quant, quant.w1_zp if quant is not None else None),
        # The engines pass the routing weights to the up GEMM too (unused there).
        topk_weights=None if engine_gemm is None else topk_weights,
        mul_routed_weight=False,
        top_k=top_k,
        config=split.up,
        quant_dtype=quant_dtype,
        block_shape=block_shape,
        w_use_tma=None if vllm_tma_b else split.up_tma,
        c_sorted=split.down_tma,
        **alignment,
    )
    if block_shape is not None:
        # Block fp8: SiLU-and-mul and the per-token-group quantization in one pass.
        a2, a2_scale = silu_and_mul_quant_fp8(gate_up, block_shape[1])
    else:
        a2, a2_scale = quantize_activation(silu_and_mul(gate_up), quant)
    gemm(
        a2,
        w2,
        down,
        a_scale=a2_scale,
        w_scale=w2_scale,
        **weight_launch_args(quant, quant.w2_zp if quant is not None else None),
        topk_weights=topk_weights,
        mul_routed_weight=True,
        top_k=1,
        config=split.down,
        quant_dtype=quant_dtype,
        block_shape=block_shape,
        a_use_tma=split.down_tma,
        w_use_tma=None if vllm_tma_b else split.down_tma,
        **alignment,
    )
    # The top-k sum: the engine release's own where it has one (SGLang's), else moetune's.
    combine = getattr(getattr(engine_gemm, "release", None), "combine", None)
    return moe_sum(down) if combine is None else combine(down, engine_gemm)


def fused_moe(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool = True,
    config: dict | None = None,
    down_config: dict | None = None,
    quant: MoEQuant | None = None,
    gemm=None,  # noqa: ANN001 - an `EngineGemm`
) -> torch.Tensor:
    """One MoE layer: route x [M, K] by `router_logits` [M, E] to `top_k` experts and combine.

    w1 is [E, 2N, K], w2 [E, K, N]; `config` is a tuned-file entry (None: the
    default heuristic) and `down_config` the down GEMM's (see `fused_experts`);
    `quant` describes quantized weights (None: bf16/fp16); `gemm` the GEMM launcher
    (None: moetune's kernel; see `fused_experts`). Returns [M, K] in x's dtype.
    """
    topk_weights, topk_ids = topk_routing(router_logits, top_k, renormalize)
    return fused_experts(
        x,
        w1,
        w2,
        topk_weights,
        topk_ids,
        config=config,
        down_config=down_config,
        quant=quant,
        gemm=gemm,
    )
