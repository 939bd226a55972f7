"""The values that flow out of extraction: what a model's MoE layer looks like.

`MoEShape` is the model as released (global sizes); `ShardedShape` is what one
GPU rank sees under a TP/EP layout, i.e. exactly the problem the fused-MoE
kernel solves and the tuner tunes. Both are plain frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class MoEShape:
    """The routed-expert MoE block of a model, as declared in its config.json.

    Sizes are global (before any sharding). `expert_hidden_size` is the K that
    the routed experts really see: equal to `hidden_size` except for latent-MoE
    models (Kimi K3's `routed_expert_hidden_size`, Nemotron-H's `moe_latent_size`).
    `dtype` is the checkpoint's dtype string as written in the config
    ("bfloat16", "float16", ...); `quant_method` and `weight_block_size` come
    from `quantization_config` when the checkpoint is quantized.
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    hidden_size: int
    expert_hidden_size: int
    num_shared_experts: int | None = None
    dtype: str | None = None
    quant_method: str | None = None
    weight_block_size: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.weight_block_size is not None:
            data["weight_block_size"] = list(self.weight_block_size)
        return data


@dataclass(frozen=True)
class Extraction:
    """An extracted `MoEShape` together with how each value was found.

    `sources` maps each parameter name to where its value came from: the dotted
    path that resolved (``"text_config.num_experts_per_token"``), ``"default"``
    for a literal default from the mapping, or ``"transformers default"`` for a
    value the JSON omitted and transformers' config class supplies.
    `guessed` is True when no registry entry matched and the generic fallback
    entry produced the numbers.
    """

    shape: MoEShape
    entry: str
    architecture: str | None
    model_type: str | None
    sources: dict[str, str] = field(default_factory=dict)
    guessed: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShardedShape:
    """What one rank computes: the kernel's problem and the config file's key.

    `local_experts` is E in the tuned-config file name and `intermediate_size`
    (per rank, after SiLU-and-mul) is its N; w1 is ``[local_experts, w1_width,
    hidden_size]`` with ``w1_width = 2 * intermediate_size`` and w2 is
    ``[local_experts, hidden_size, intermediate_size]``. `hidden_size` here is
    the K of the first GEMM, i.e. the model's `expert_hidden_size`.
    """

    local_experts: int
    top_k: int
    intermediate_size: int
    hidden_size: int
    tp_size: int = 1
    ep_size: int = 1
    global_experts: int | None = None

    @property
    def w1_width(self) -> int:
        return 2 * self.intermediate_size

    @property
    def kernel_top_k(self) -> int:
        """The experts one token reaches on this rank: top-k, or all the rank's experts
        where expert parallelism leaves fewer (Mixtral ``--tp 8 --ep``: 1 expert, top-k 2).
        The file names carry no top-k; the tuner times this one."""
        return min(self.top_k, self.local_experts)
