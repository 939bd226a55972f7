"""The plain-PyTorch fused-MoE reference: a float32 loop over the experts that got tokens.

The tests and the tuner's winner check compare the kernel against this one
function. It follows the kernel's numerics only where they are part of the
definition, not an accident of it:

- quantized weights are dequantized to fp32 (`moetune.kernel.quant.dequantize_weights`);
- w8a8 quantizes the activations exactly as the kernel path does (dynamic per
  tensor, per token, or per token group of ``block_k`` columns), then dequantizes them;
- int4 w4a16 weights are unpacked and dequantized ``(code - zero) * scale`` in fp32
  (the kernel rounds that product to x's dtype before its dot: a 2**-9 relative
  difference per weight, well inside the tolerances);
- the gate/up output and the SiLU-and-mul output are rounded to x's dtype, where
  the kernel stores them, so the intermediate's quantization sees the same values;
  where the kernel computes in another dtype than it stores (`compute_dtype`: vLLM's
  w8a8 GEMMs of an fp16 checkpoint round to bf16, then store fp16), the gate/up output
  is rounded to that dtype first.

Everything else is fp32. Slow (a host sync per expert); never time it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moetune.dtypes import DTYPES
from moetune.kernel.quant import (
    MoEQuant,
    dequantize_weights,
    per_tensor_quant_fp8,
    per_token_group_quant_fp8_reference,
    per_token_quant_reference,
)

if TYPE_CHECKING:
    import torch


def _fake_quant_activation(x: torch.Tensor, quant: MoEQuant | None) -> torch.Tensor:
    """x as the GEMM sees it, in fp32: quantized and dequantized again for w8a8."""
    if quant is None or not DTYPES[quant.dtype].quantizes_activations:
        return x.float()
    if quant.per_channel:
        q, scale = per_token_quant_reference(x, quant.dtype)
        return q.float() * scale
    if quant.block_shape is None:
        q, scale = per_tensor_quant_fp8(x)
        return q.float() * scale
    group = quant.block_shape[1]
    q, scale = per_token_group_quant_fp8_reference(x, group)
    return q.float() * scale.repeat_interleave(group, dim=1)[:, : x.shape[1]]


def _expert_weight(
    w: torch.Tensor,
    scale: torch.Tensor | None,
    expert: int,
    quant: MoEQuant | None,
    zero_points: torch.Tensor | None = None,
):
    if quant is None:
        return w[expert].float()
    return dequantize_weights(
        w[expert : expert + 1],
        scale[expert : expert + 1],
        quant.block_shape,
        group_size=quant.group_size,
        zero_points=None if zero_points is None else zero_points[expert : expert + 1],
    )[0]


def naive_fused_experts(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    quant: MoEQuant | None = None,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The MoE layer for given routing. ids -1 or >= E (experts on another rank) add nothing.

    x ``[M, K]``, w1 ``[E, 2N, K]``, w2 ``[E, K, N]``, topk_weights/ids ``[M, top_k]``;
    `compute_dtype` the dtype the kernel rounds the gate/up output to before storing it in
    x's dtype (None: x's dtype). Returns float32 ``[M, K]``.
    """
    import torch

    compute = x.dtype if compute_dtype is None else compute_dtype

    num_tokens, top_k = topk_ids.shape
    num_experts, two_n, _ = w1.shape  # int4: w1 is packed along K, 2N is unchanged
    n = two_n // 2
    x_used = _fake_quant_activation(x, quant)
    inter = torch.zeros(num_tokens, top_k, n, dtype=torch.float32, device=x.device)
    local = (topk_ids >= 0) & (topk_ids < num_experts)
    experts = topk_ids[local].unique().tolist()
    w1_scale = quant.w1_scale if quant is not None else None
    w2_scale = quant.w2_scale if quant is not None else None
    w1_zp = quant.w1_zp if quant is not None else None
    w2_zp = quant.w2_zp if quant is not None else None
    for expert in experts:
        tokens, slots = torch.nonzero(topk_ids == expert, as_tuple=True)
        gate_up = (
            (x_used[tokens] @ _expert_weight(w1, w1_scale, expert, quant, w1_zp).T)
            .to(compute)
            .to(x.dtype)
            .float()
        )
        act = torch.nn.functional.silu(gate_up[:, :n]) * gate_up[:, n:]
        inter[tokens, slots] = act.to(x.dtype).float()

    inter_used = _fake_quant_activation(inter.view(num_tokens * top_k, n).to(x.dtype), quant)
    inter_used = inter_used.view(num_tokens, top_k, n)
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    for expert in experts:
        tokens, slots = torch.nonzero(topk_ids == expert, as_tuple=True)
        down = inter_used[tokens, slots] @ _expert_weight(w2, w2_scale, expert, quant, w2_zp).T
        out.index_add_(0, tokens, down * topk_weights[tokens, slots, None].float())
    return out


def naive_routing(router_logits: torch.Tensor, top_k: int, renormalize: bool = True):
    """Softmax over the experts, then the top-k: ``(fp32 weights, int32 ids)``, each ``[M, top_k]``."""
    import torch

    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def naive_fused_moe(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool = True,
    quant: MoEQuant | None = None,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Reference for `moetune.kernel.fused_moe.fused_moe`: same arguments (`compute_dtype`:
    see `naive_fused_experts`), float32 ``[M, K]`` out."""
    weights, ids = naive_routing(router_logits, top_k, renormalize)
    return naive_fused_experts(x, w1, w2, weights, ids, quant=quant, compute_dtype=compute_dtype)
