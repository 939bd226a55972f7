"""The problem the tuner solves: one fused-MoE shape on one rank, in one dtype.

`TuneProblem` carries exactly what the kernel's speed depends on besides the
batch size: E experts on this rank, w1 ``[E, 2N, K]``, w2 ``[E, K, N]``, top-k,
the kernel dtype and the fp8 weight block shape. Its `key()` names the problem
in the results store, so a store never mixes measurements of different shapes
(the engines' file names leave K and top-k out; the key does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moetune.dtypes import TUNE_BLOCK_DTYPES
from moetune.dtypes import TUNE_DTYPES as _TUNE_DTYPES
from moetune.errors import TuneError

if TYPE_CHECKING:
    from moetune.extract.shape import ShardedShape

# Kernel dtype strings the tuner accepts, as the engines spell them ("bf16"/"fp16" unquantized),
# and those with a block-quantized path: one list for extract and tune, in moetune/dtypes.py.
TUNE_DTYPES = _TUNE_DTYPES
BLOCK_QUANT_DTYPES = TUNE_BLOCK_DTYPES


@dataclass(frozen=True)
class TuneProblem:
    """One rank's fused-MoE problem: ``x [M, K] @ w1 [E, 2N, K]``, SiLU-and-mul, ``@ w2 [E, K, N]``.

    `intermediate_size` is N, the engines' file-name N (per rank, after
    SiLU-and-mul); `hidden_size` is K, the width the routed experts see.
    `block_shape` is ``(block_n, block_k)`` of block-quantized fp8 weights.
    """

    num_experts: int
    intermediate_size: int
    hidden_size: int
    top_k: int
    dtype: str
    block_shape: tuple[int, int] | None = None
    # A real-routing dump (`moetune.tune.routing_dump`) replayed instead of uniform
    # random routing: its path and content digest (the digest names it in `key()`).
    routing: str | None = None
    routing_digest: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_experts", "intermediate_size", "hidden_size", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TuneError(f"{name} must be a positive integer, got {value!r}")
        if self.top_k > self.num_experts:
            raise TuneError(
                f"top_k ({self.top_k}) cannot exceed the experts on this rank ({self.num_experts})"
            )
        if self.dtype not in TUNE_DTYPES:
            raise TuneError(
                f"unknown dtype {self.dtype!r}; expected one of {', '.join(TUNE_DTYPES)}"
            )
        if self.block_shape is not None:
            if self.dtype not in BLOCK_QUANT_DTYPES:
                raise TuneError(
                    f"block_shape {list(self.block_shape)} needs dtype fp8_w8a8, got {self.dtype}"
                )
            block = tuple(self.block_shape) if isinstance(self.block_shape, (list, tuple)) else ()
            if len(block) != 2 or not all(isinstance(v, int) and v > 0 for v in block):
                raise TuneError(
                    f"block_shape must be two positive integers [block_n, block_k], got {self.block_shape!r}"
                )
            object.__setattr__(self, "block_shape", block)

    @classmethod
    def from_sharded(
        cls,
        sharded: ShardedShape,
        dtype: str,
        block_shape: tuple[int, int] | list[int] | None = None,
    ) -> TuneProblem:
        """The problem of one rank of an extracted, sharded model."""
        return cls(
            num_experts=sharded.local_experts,
            intermediate_size=sharded.intermediate_size,
            hidden_size=sharded.hidden_size,
            top_k=sharded.top_k,
            dtype=dtype,
            block_shape=tuple(block_shape) if block_shape else None,
        )

    @property
    def w1_width(self) -> int:
        """Rows of w1: gate and up projections side by side (2N)."""
        return 2 * self.intermediate_size

    def key(self) -> str:
        """A stable, readable name, e.g. ``E=128,N=768,K=2048,topk=8,dtype=bf16``."""
        key = (
            f"E={self.num_experts},N={self.intermediate_size},K={self.hidden_size},"
            f"topk={self.top_k},dtype={self.dtype}"
        )
        if self.block_shape is not None:
            key += f",block_shape=[{self.block_shape[0]},{self.block_shape[1]}]"
        if self.routing_digest is not None:
            key += f",routing={self.routing_digest}"
        return key
