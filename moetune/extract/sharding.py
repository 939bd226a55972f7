"""What one GPU rank's fused-MoE kernel sees under a TP/EP layout.

Both engines split the routed experts the same way once their flags are
translated: EP size P puts E/P experts on each rank, and the remaining
tensor parallelism, T/P, splits each expert's intermediate size.

- plain TP (both engines, ``--tp T``): P = 1, every rank holds all E experts, N = I/T.
- vLLM ``--enable-expert-parallel`` (moetune ``--ep``): P = T, E/T experts, N = I.
- SGLang ``--ep-size P`` (moetune ``--ep-size P``): E/P experts, N = I/(T/P).

vLLM's MoE layers span its data-parallel ranks too (``flatten_tp_across_dp``):
with ``--data-parallel-size D`` pass T x D as the TP size here.

Kimi K3 (E=896, I=3072, K=3584) with ``--tp 8 --ep``: 112 experts per rank,
N = 3072, w1 ``[112, 6144, 3584]``.
"""

from __future__ import annotations

from collections.abc import Callable

from moetune.errors import ShardingError
from moetune.extract.shape import MoEShape, ShardedShape

# Candidate sizes offered when a split does not divide; wide EP reaches a few hundred ranks.
_MAX_SUGGESTED = 512
_MAX_LISTED = 12


def _valid_sizes(ok: Callable[[int], bool]) -> str:
    sizes = [n for n in range(1, _MAX_SUGGESTED + 1) if ok(n)]
    listed = ", ".join(str(n) for n in sizes[:_MAX_LISTED])
    return listed + (", ..." if len(sizes) > _MAX_LISTED else "") if sizes else "none"


def _intermediate_ok(shape: MoEShape, moe_tp: int) -> bool:
    if shape.intermediate_size % moe_tp:
        return False
    local = shape.intermediate_size // moe_tp
    if shape.weight_block_size is None:
        return True
    block_n, block_k = shape.weight_block_size
    # As vLLM's and SGLang's fp8 MoE weights check: w1's rows split along block_n
    # always, w2's columns along block_k once the intermediate is split at all.
    return local % block_n == 0 and (moe_tp == 1 or local % block_k == 0)


def shard(
    shape: MoEShape, tp: int = 1, ep: bool = False, ep_size: int | None = None
) -> ShardedShape:
    """Split `shape` over `tp` ranks: plain TP, vLLM's EP (`ep`) or SGLang's `ep_size`.

    Raises `ShardingError` (naming the number that does not divide and the
    sizes that would) for a split the engines would refuse.
    """
    if tp < 1:
        raise ShardingError(f"--tp must be at least 1, got {tp}")
    if ep and ep_size is not None:
        raise ShardingError(
            "--ep (vLLM: EP size = TP size) and --ep-size (SGLang) both set the EP size; pass one"
        )
    if ep_size is not None and ep_size < 1:
        raise ShardingError(f"--ep-size must be at least 1, got {ep_size}")

    experts = shape.num_experts
    if ep:
        if experts % tp:
            raise ShardingError(
                f"--tp {tp} --ep cannot split {experts} experts evenly over {tp} ranks; "
                f"valid --tp with --ep: {_valid_sizes(lambda n: experts % n == 0)}"
            )
        ep_ranks, moe_tp = tp, 1
    elif ep_size is not None:
        if tp % ep_size:
            raise ShardingError(
                f"--ep-size {ep_size} does not divide --tp {tp}; "
                f"valid --ep-size: {_valid_sizes(lambda n: n <= tp and tp % n == 0)}"
            )
        if experts % ep_size:
            raise ShardingError(
                f"--ep-size {ep_size} cannot split {experts} experts evenly; "
                f"valid --ep-size: {_valid_sizes(lambda n: experts % n == 0)}"
            )
        ep_ranks, moe_tp = ep_size, tp // ep_size
    else:
        ep_ranks, moe_tp = 1, tp

    if not _intermediate_ok(shape, moe_tp):
        if ep_ranks == 1:
            split, choice = f"--tp {tp}", "--tp"
        else:
            split, choice = f"--tp {tp} --ep-size {ep_ranks}", "--tp / --ep-size"
        block = (
            f" into multiples of the fp8 weight block {list(shape.weight_block_size)}"
            if shape.weight_block_size and shape.intermediate_size % moe_tp == 0
            else ""
        )
        raise ShardingError(
            f"{split} cannot split the expert intermediate size {shape.intermediate_size} "
            f"{moe_tp} ways{block}; valid {choice}: "
            f"{_valid_sizes(lambda n: _intermediate_ok(shape, n))}"
            + (_expert_parallel_hint(shape, tp) if ep_ranks == 1 else "")
        )

    return ShardedShape(
        local_experts=experts // ep_ranks,
        top_k=shape.top_k,
        intermediate_size=shape.intermediate_size // moe_tp,
        hidden_size=shape.expert_hidden_size,
        tp_size=tp,
        ep_size=ep_ranks,
        global_experts=experts,
    )


def _expert_parallel_hint(shape: MoEShape, tp: int) -> str:
    """Where plain --tp `tp` cannot split the intermediate size, the expert-parallel layouts
    of the same `tp` ranks that can: vLLM's --ep, SGLang's --ep-size (or "" if none can)."""
    experts = shape.num_experts
    ep_sizes = [
        size
        for size in range(2, tp + 1)
        if tp % size == 0 and experts % size == 0 and _intermediate_ok(shape, tp // size)
    ]
    if not ep_sizes:
        return ""
    layouts = []
    if tp in ep_sizes:
        layouts.append(f"--ep (vLLM: {experts // tp} whole experts per rank)")
    sizes = ", ".join(map(str, ep_sizes[:-1])) + (" or " if len(ep_sizes) > 1 else "")
    layouts.append(f"--ep-size {sizes}{ep_sizes[-1]} (SGLang)")
    return f"; or keep --tp {tp} with expert parallelism: {' or '.join(layouts)}"


def fewer_experts_note(local: ShardedShape) -> str | None:
    """What a rank holding fewer experts than top-k means for the tuner, or None."""
    if local.kernel_top_k == local.top_k:
        return None
    return (
        f"--tp {local.tp_size} with EP {local.ep_size} leaves {local.local_experts} expert(s) "
        f"per rank, fewer than top-k {local.top_k}: a token "
        f"reaches at most {local.kernel_top_k} of them on a rank, so the kernel is tuned "
        f"with top-k {local.kernel_top_k} (the engines' file names carry no top-k)"
    )
