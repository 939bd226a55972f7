"""The twin kernel's launch rules, which are vLLM 0.33.0's (`moetune.engines.launch.vllm_0_33`).

- expert assignment: the naive path (one block per token slot, no alignment) when
  ``M * top_k * 4 <= E``, except for int8/int4 w*a16 with a group;
- ``SWAP_AB``: fp8_w8a8 on compute capability 9.0 with a thin M tile and a wide N tile.

Pure Python: the kernel and the vLLM 0.33 launcher both read them from here.
"""

from __future__ import annotations

from typing import Any

from moetune.dtypes import DTYPES

# Expert assignment skips alignment when each token slot is likely its own expert.
NAIVE_SPARSITY = 4


def naive_assignment(
    num_slots: int, num_experts: int, quant_dtype: str | None, block_shape: Any
) -> bool:
    """True when vLLM 0.33 runs this call on its naive (one block per slot) path.

    `num_slots` is M * top_k and `num_experts` the global expert count; the caller
    has no expert map (moetune tunes one rank's experts as the whole set).
    """
    grouped_weight_only = (
        quant_dtype in DTYPES.names("weight_only")
        and block_shape is not None
        and block_shape[1] > 0
    )
    return num_slots * NAIVE_SPARSITY <= num_experts and not grouped_weight_only


def swap_ab(config: dict, quant_dtype: str | None, capability: tuple[int, int] | None) -> bool:
    """vLLM's ``enable_swap_ab``: fp8 on sm90 with a thin M tile and a wide N tile."""
    return (
        quant_dtype == "fp8_w8a8"
        and capability == (9, 0)
        and config["BLOCK_SIZE_M"] < 64
        and config["BLOCK_SIZE_N"] >= 64
    )
