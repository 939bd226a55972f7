"""Top-k routing: softmax over the router logits, then the k largest experts per token.

One Triton program per token row, one warp: the row (E <= a few thousand) sits in
registers, the softmax and the k arg-max passes are warp shuffles only, so M = 1
costs one short launch instead of the four or five PyTorch ops it replaces.

| array            | shape      | dtype               | meaning                                    |
|------------------|------------|---------------------|--------------------------------------------|
| `router_logits`  | [M, E]     | float16/bf16/fp32   | gate output per token, any row stride      |
| `topk_weights`   | [M, top_k] | float32             | routing weight of each chosen expert       |
| `topk_ids`       | [M, top_k] | int32               | chosen expert ids, largest weight first    |

With `renormalize` the k weights of a token sum to 1 (softmax over the chosen
logits); without it they are the plain softmax probabilities. Ties go to the
lower expert id.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def topk_routing_kernel(
    # Pointers
    logits_ptr,  # [M, E] router logits
    weights_ptr,  # [M, TOP_K] float32 out
    ids_ptr,  # [M, TOP_K] int32 out
    # Dimensions
    num_experts,
    # Strides (elements to step one token)
    stride_lm,
    stride_wm,
    stride_im,
    # Meta-parameters
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    in_row = offs_e < num_experts
    logits = tl.load(logits_ptr + row * stride_lm + offs_e, mask=in_row, other=float("-inf"))
    logits = logits.to(tl.float32)
    shifted = logits - tl.max(logits, axis=0)
    probs = tl.where(in_row, tl.exp(shifted), 0.0)
    probs = probs / tl.sum(probs, axis=0)

    # k arg-max passes; a chosen expert is knocked out with -1 (probabilities are >= 0).
    offs_k = tl.arange(0, BLOCK_K)
    chosen_weights = tl.zeros((BLOCK_K,), dtype=tl.float32)
    chosen_ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
    candidates = tl.where(in_row, probs, -1.0)
    for k in tl.static_range(TOP_K):
        best_weight, best_id = tl.max(
            candidates, axis=0, return_indices=True, return_indices_tie_break_left=True
        )
        chosen_weights = tl.where(offs_k == k, best_weight, chosen_weights)
        chosen_ids = tl.where(offs_k == k, best_id.to(tl.int32), chosen_ids)
        candidates = tl.where(offs_e == best_id, -1.0, candidates)
    if RENORMALIZE:
        chosen_weights = chosen_weights / tl.sum(chosen_weights, axis=0)

    in_k = offs_k < TOP_K
    tl.store(weights_ptr + row * stride_wm + offs_k, chosen_weights, mask=in_k)
    tl.store(ids_ptr + row * stride_im + offs_k, chosen_ids, mask=in_k)


def topk_routing(
    router_logits: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to its `top_k` most probable experts.

    Args:
        router_logits: [M, E] gate logits (float16, bfloat16 or float32).
        top_k: experts per token, 1 <= top_k <= E.
        renormalize: scale the k weights of each token to sum to 1.

    Returns:
        (topk_weights [M, top_k] float32, topk_ids [M, top_k] int32), largest first.
    """
    if router_logits.dim() != 2:
        raise ValueError(
            f"router_logits is expected to be 2-D [M, E] rather than {tuple(router_logits.shape)}"
        )
    num_tokens, num_experts = router_logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k is expected in [1, {num_experts}] rather than {top_k}")
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    device = router_logits.device
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=device)
    if num_tokens == 0:
        return weights, ids
    topk_routing_kernel[(num_tokens,)](
        router_logits,
        weights,
        ids,
        num_experts,
        router_logits.stride(0),
        weights.stride(0),
        ids.stride(0),
        TOP_K=top_k,
        RENORMALIZE=renormalize,
        BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK_K=max(2, triton.next_power_of_2(top_k)),  # no one-lane blocks
        num_warps=1,
    )
    return weights, ids
