"""Random fused-MoE inputs of a given shape, for the tests, the benchmark and the tuner.

Scales are chosen so every stage is O(1): x and the router logits are standard
normal, w1 is ``randn / sqrt(K)`` and w2 ``randn / sqrt(N)``, so the gate/up
output, the SiLU-and-mul output and the layer output all have entries of order 1
and a relative error means the same thing at every shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moetune.errors import MoetuneError
from moetune.kernel.quant import QUANT_DTYPES, MoEQuant, quantize_weights

if TYPE_CHECKING:
    import torch

DTYPES = ("bf16", "fp16") + QUANT_DTYPES


@dataclass(frozen=True)
class MoEProblem:
    """Inputs of one `fused_moe` call: x ``[M, K]``, w1 ``[E, 2N, K]``, w2 ``[E, K, N]``, logits ``[M, E]``."""

    x: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    router_logits: torch.Tensor
    top_k: int
    quant: MoEQuant | None


def activation_dtype(dtype: str):
    """The torch dtype of x and of the output: fp16 for "fp16", bf16 otherwise."""
    import torch

    return torch.float16 if dtype == "fp16" else torch.bfloat16


def _random_weights(shape, std: float, dtype: str, block_shape, generator, device):
    """Expert weights ``[E, rows, cols]``, made and quantized one expert at a time to bound memory."""
    import torch

    num_experts, rows, cols = shape
    if dtype not in QUANT_DTYPES:
        w = torch.empty(shape, dtype=activation_dtype(dtype), device=device)
        for expert in range(num_experts):
            w[expert] = torch.randn(rows, cols, generator=generator, device=device) * std
        return w, None
    parts, scales = [], []
    for _ in range(num_experts):
        dense = torch.randn(1, rows, cols, generator=generator, device=device) * std
        quantized, scale = quantize_weights(dense, dtype, block_shape)
        parts.append(quantized)
        scales.append(scale)
    return torch.cat(parts), torch.cat(scales)


def make_problem(
    M: int,
    E: int,
    N: int,
    K: int,
    top_k: int,
    dtype: str,
    block_shape: tuple[int, int] | None = None,
    device: str = "cuda",
    seed: int = 0,
) -> MoEProblem:
    """Random inputs for M tokens, E experts, intermediate size N (per rank), hidden size K.

    `dtype` is the engines' string: "bf16", "fp16", "fp8_w8a8" (with `block_shape`
    for block quantization) or "int8_w8a16"; quantized problems take bf16 x.
    """
    import torch

    if dtype not in DTYPES:
        raise MoetuneError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if not 1 <= top_k <= E:
        raise MoetuneError(f"top_k must be between 1 and E={E}, got {top_k}")
    if block_shape is not None and dtype != "fp8_w8a8":
        raise MoetuneError(f"block_shape applies to fp8_w8a8 only, not {dtype}")
    generator = torch.Generator(device=device).manual_seed(seed)
    act = activation_dtype(dtype)
    x = torch.randn(M, K, generator=generator, device=device).to(act)
    logits = torch.randn(M, E, generator=generator, device=device).to(act)
    w1, w1_scale = _random_weights(
        (E, 2 * N, K), 1 / math.sqrt(K), dtype, block_shape, generator, device
    )
    w2, w2_scale = _random_weights(
        (E, K, N), 1 / math.sqrt(N), dtype, block_shape, generator, device
    )
    quant = None
    if dtype in QUANT_DTYPES:
        quant = MoEQuant(
            dtype, w1_scale, w2_scale, None if block_shape is None else tuple(block_shape)
        )
    return MoEProblem(x=x, w1=w1, w2=w2, router_logits=logits, top_k=top_k, quant=quant)
