"""A checkpoint's routed experts as the backend table sees them, and what each engine runs.

`expert_case` names the case of `moetune/data/backends.yaml` (unquantized, fp8_block,
wna16...) from the quantization rules' `backend_case`; `serving_backends` asks the table,
for each engine and GPU family, which backend the engine release picks for that case on
this layout (`moetune.engines.backends`). Pure: no torch, no engine imports.
"""

from __future__ import annotations

import math

from moetune.engines.backends import BackendChoice, Deployment, choose, load_table
from moetune.engines.formats import ENGINES
from moetune.extract.quant import QuantInfo
from moetune.extract.shape import Extraction, ShardedShape

# vLLM refines an fp8 weight block to fit the TP shard only down to this size
# (model_executor/layers/fused_moe/oracle/fp8.py::refine_fp8_moe_block_shape).
_SMALLEST_REFINED_BLOCK = 32


def refined_fp8_block(
    block: tuple[int, int], intermediate_per_rank: int, hidden: int, moe_tp: int
) -> tuple[int, int] | None:
    """The finer block vLLM loads a block-fp8 checkpoint with when the TP shard does not
    split its blocks whole (``[64, 64]``...), else None; only Triton takes such a block."""
    block_n, block_k = block
    if intermediate_per_rank % block_n == 0 and (
        moe_tp == 1 or intermediate_per_rank % block_k == 0
    ):
        return None
    refine = math.gcd(block_n, block_k, intermediate_per_rank, hidden)
    return (refine, refine) if refine >= _SMALLEST_REFINED_BLOCK else None


def expert_case(quant: QuantInfo | None, local: ShardedShape) -> str | None:
    """The backends.yaml case of the routed experts; None where no quantization rule matched."""
    experts = quant.experts if quant is not None else None
    if experts is None:
        return "unquantized"
    case = experts.backend_case
    if case == "fp8_block" and experts.block_shape and all(experts.block_shape):
        moe_tp = max(local.tp_size // max(local.ep_size, 1), 1)
        if refined_fp8_block(
            experts.block_shape, local.intermediate_size, local.hidden_size, moe_tp
        ):
            return "fp8_block_refined"
    return case


def deployment(
    extraction: Extraction, local: ShardedShape, quant: QuantInfo | None, family: str
) -> Deployment | None:
    """The table's view of this checkpoint on this layout and GPU family (None: no case)."""
    case = expert_case(quant, local)
    if case is None:
        return None
    experts = quant.experts if quant is not None else None
    return Deployment(
        case=case,
        family=family,
        ep=local.ep_size > 1,
        architecture=extraction.architecture,
        quant_method=quant.method if quant is not None else None,
        num_experts=extraction.shape.num_experts,
        bits=experts.bits if experts else None,
        group_size=experts.group_size if experts else None,
        zero_point=experts.zero_point if experts else None,
        desc_act=experts.desc_act if experts else None,
    )


def serving_backends(
    extraction: Extraction,
    local: ShardedShape,
    quant: QuantInfo | None,
    releases: dict[str, tuple[str, str]],
) -> tuple[BackendChoice, ...]:
    """Each engine's backend on every GPU family of the table (engine by engine, families in
    the table's order); `releases` maps an engine to (release, why that release)."""
    choices = []
    for engine in ENGINES:
        release, why = releases[engine]
        for family in load_table().families:
            target = deployment(extraction, local, quant, family)
            if target is None:
                continue
            choice = choose(engine, target, release, why)
            if choice is not None:
                choices.append(choice)
    return tuple(choices)
