"""Random fused-MoE inputs of a given shape, for the tests, the benchmark and the tuner.

Scales are chosen so every stage is O(1): x and the router logits are standard
normal, w1 is ``randn / sqrt(K)`` and w2 ``randn / sqrt(N)``, so the gate/up
output, the SiLU-and-mul output and the layer output all have entries of order 1
and a relative error means the same thing at every shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from moetune.dtypes import DTYPES
from moetune.errors import MoetuneError
from moetune.kernel.quant import MoEQuant, check_quant_args, quantize_weights

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MoEProblem:
    """Inputs of one `fused_moe` call: x ``[M, K]``, w1 ``[E, 2N, K]``, w2 ``[E, K, N]``, logits ``[M, E]``."""

    x: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    router_logits: torch.Tensor
    top_k: int
    quant: MoEQuant | None
    # The GEMM launcher the calls run (`moetune.engines.launch.EngineGemm`: an engine's
    # own kernel); None: moetune's kernel.
    gemm: Any = None


def activation_dtype(dtype: str, checkpoint: str | None = None):
    """The torch dtype of x and of the output: fp16 for "fp16", bf16 otherwise; a w8a8
    `dtype` takes the `checkpoint`'s activation dtype (``"float16"``/``"bfloat16"``) when given."""
    import torch

    spec = DTYPES.get(dtype)
    if checkpoint is not None and spec is not None and spec.quantizes_activations:
        return getattr(torch, checkpoint)
    return getattr(torch, spec.activation_dtype if spec is not None else "bfloat16")


def _random_weights(shape, std: float, dtype: str, block_shape, generator, device, **quant):
    """Expert weights ``[E, rows, cols]``, made and quantized one expert at a time to bound memory.

    Returns ``(weights, scales or None, zero points or None)``.
    """
    import torch

    num_experts, rows, cols = shape
    if not DTYPES[dtype].quantized:
        w = torch.empty(shape, dtype=activation_dtype(dtype), device=device)
        for expert in range(num_experts):
            w[expert] = torch.randn(rows, cols, generator=generator, device=device) * std
        return w, None, None
    parts, scales, zeros = [], [], []
    for _ in range(num_experts):
        dense = torch.randn(1, rows, cols, generator=generator, device=device) * std
        if quant.get("zero_point"):
            from moetune.kernel.quant_wna16 import quantize_int4

            quantized, scale, zero = quantize_int4(dense, quant["group_size"], zero_point=True)
            zeros.append(zero)
        else:
            quantized, scale = quantize_weights(
                dense,
                dtype,
                block_shape,
                per_channel=quant["per_channel"],
                group_size=quant["group_size"],
            )
        parts.append(quantized)
        scales.append(scale)
    return torch.cat(parts), torch.cat(scales), torch.cat(zeros) if zeros else None


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
    *,
    per_channel: bool = False,
    group_size: int | None = None,
    zero_point: bool = False,
    checkpoint_dtype: str | None = None,
) -> MoEProblem:
    """Random inputs for M tokens, E experts, intermediate size N (per rank), hidden size K.

    `dtype` is the engines' string: "bf16", "fp16", "fp8_w8a8" (with `block_shape`
    for block quantization, or `per_channel`), "int8_w8a8" (always per channel),
    "int8_w8a16" or "int4_w4a16" (`group_size`, default 128; `zero_point` for
    AWQ-style zero points); quantized problems take bf16 x, but w8a8 ones take the
    `checkpoint_dtype`'s (``"float16"``: an fp16 checkpoint) where it is given.
    """
    import torch

    spec = DTYPES.get(dtype)
    if spec is None:
        raise MoetuneError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES.names())}")
    if not 1 <= top_k <= E:
        raise MoetuneError(f"top_k must be between 1 and E={E}, got {top_k}")
    if block_shape is not None and not spec.block_quant:
        raise MoetuneError(
            f"block_shape applies to {', '.join(DTYPES.names('block_quant'))} only, not {dtype}"
        )
    if spec.always_per_channel:
        per_channel = True
    if spec.group_quant and group_size is None:
        group_size = spec.default_group_size
    if zero_point and not spec.group_quant:
        raise MoetuneError(
            f"zero points apply to {', '.join(DTYPES.names('group_quant'))} only, not {dtype}"
        )
    if spec.quantized:
        check_quant_args(dtype, block_shape, per_channel, group_size)
    if checkpoint_dtype not in (None, "bfloat16", "float16"):
        raise MoetuneError(
            f"checkpoint_dtype must be bfloat16 or float16, got {checkpoint_dtype!r}"
        )
    quant_args = dict(per_channel=per_channel, group_size=group_size, zero_point=zero_point)
    generator = torch.Generator(device=device).manual_seed(seed)
    act = activation_dtype(dtype, checkpoint_dtype)
    x = torch.randn(M, K, generator=generator, device=device).to(act)
    logits = torch.randn(M, E, generator=generator, device=device).to(act)
    w1, w1_scale, w1_zp = _random_weights(
        (E, 2 * N, K), 1 / math.sqrt(K), dtype, block_shape, generator, device, **quant_args
    )
    w2, w2_scale, w2_zp = _random_weights(
        (E, K, N), 1 / math.sqrt(N), dtype, block_shape, generator, device, **quant_args
    )
    quant = None
    if spec.quantized:
        quant = MoEQuant(
            dtype,
            w1_scale,
            w2_scale,
            None if block_shape is None else tuple(block_shape),
            per_channel=per_channel,
            group_size=group_size,
            w1_zp=w1_zp,
            w2_zp=w2_zp,
        )
    return MoEProblem(x=x, w1=w1, w2=w2, router_logits=logits, top_k=top_k, quant=quant)


def with_tokens(problem: MoEProblem, num_tokens: int, seed: int = 0) -> MoEProblem:
    """`problem`'s expert weights with `num_tokens` fresh tokens: x and the router logits
    drawn (standard normal, as `make_problem` draws them) from `seed` and the token count.

    Drawing and quantizing the weights is most of `make_problem`'s work; the tuner's
    workers keep one problem's weights while the batch size changes.
    """
    import torch

    x, logits = problem.x, problem.router_logits
    generator = torch.Generator(device=x.device).manual_seed(seed * 1_000_003 + num_tokens)
    tokens = torch.randn(num_tokens, x.shape[1], generator=generator, device=x.device)
    scores = torch.randn(num_tokens, logits.shape[1], generator=generator, device=x.device)
    return replace(problem, x=tokens.to(x.dtype), router_logits=scores.to(logits.dtype))
