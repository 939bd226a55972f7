"""The problem the tuner solves: one fused-MoE shape on one rank, in one dtype.

`TuneProblem` carries exactly what the kernel's speed depends on besides the
batch size: E experts on this rank, w1 ``[E, 2N, K]``, w2 ``[E, K, N]``, top-k,
the kernel dtype and its quantization details (fp8 weight block shape, per-channel
scales, int4 group size and zero points), and for w8a8 the checkpoint's activation
dtype (an fp16 checkpoint's GEMMs store fp16; vLLM's compute in bf16, SGLang's in
fp16: `moetune.kernel.launch_rules.ComputeRule`). Its `key()` names the problem
in the results store, so a store never mixes measurements of different shapes
(the engines' file names leave K and top-k out; the key does not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moetune.dtypes import DTYPES
from moetune.engines.launch import KernelRef
from moetune.errors import TuneError

# The checkpoints' activation dtypes a w8a8 problem runs (torch names).
CHECKPOINT_DTYPES = ("bfloat16", "float16")

if TYPE_CHECKING:
    from moetune.extract.shape import ShardedShape

# `TuneProblem.key()` read back: the inverse of its format, field by field (keys written
# before every key named its kernel have no ``kernel=``).
KEY_PATTERN = re.compile(
    r"E=(\d+),N=(\d+),K=(\d+),topk=(\d+),dtype=(\w+)(?:,block_shape=\[(\d+),(\d+)\])?"
    r"(,per_channel)?(?:,group_size=(\d+)(,zp)?)?(?:,checkpoint=(fp16))?(?:,kernel_rev=\d+)?"
    r"(?:,routing=(\w+))?"
    r"(?:,kernel=[\w.+-]+(?:@\w+)?)?$"
)


def split_key(key: str) -> tuple[str, str | None]:
    """A store key's shape part and its kernel tag (None: a key written before every key
    named its kernel)."""
    shape, found, tag = key.partition(",kernel=")
    return shape, (tag if found else None)


@dataclass(frozen=True)
class TuneProblem:
    """One rank's fused-MoE problem: ``x [M, K] @ w1 [E, 2N, K]``, SiLU-and-mul, ``@ w2 [E, K, N]``.

    `intermediate_size` is N, the engines' file-name N (per rank, after
    SiLU-and-mul); `hidden_size` is K, the width the routed experts see.
    `block_shape` is ``(block_n, block_k)`` of block-quantized fp8 weights;
    `per_channel`: per-output-channel weight scales and per-token activation scales
    (fp8 w8a8; always so for int8 w8a8); `group_size` and `has_zp`: int4 w4a16's
    K-group size (the engines' ``block_shape=[0, group_size]``) and zero points.
    `checkpoint_dtype` is the torch name of the checkpoint's activations (``"bfloat16"``,
    ``"float16"``) where w8a8 runs them: the buffers the GEMMs store into, and the compute
    type the engine picks for them. Other dtypes carry their own (fp16: ``"float16"``).
    """

    num_experts: int
    intermediate_size: int
    hidden_size: int
    top_k: int
    dtype: str
    block_shape: tuple[int, int] | None = None
    # A real-routing dump (`moetune.tune.measure.routing_dump`) replayed instead of uniform
    # random routing: its path and content digest (the digest names it in `key()`).
    routing: str | None = None
    routing_digest: str | None = None
    per_channel: bool = False
    group_size: int | None = None
    has_zp: bool = False
    # The engine kernel timed (`moetune.engines.launch`); None: moetune's twin.
    kernel: KernelRef | None = None
    checkpoint_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("num_experts", "intermediate_size", "hidden_size", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TuneError(f"{name} must be a positive integer, got {value!r}")
        if self.top_k > self.num_experts:
            raise TuneError(
                f"top_k ({self.top_k}) cannot exceed the experts on this rank ({self.num_experts})"
            )
        if self.dtype not in DTYPES:
            raise TuneError(
                f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES.names())}"
            )
        if self.block_shape is not None:
            if not DTYPES[self.dtype].block_quant:
                raise TuneError(
                    f"block_shape {list(self.block_shape)} needs dtype {', '.join(DTYPES.names('block_quant'))}, got {self.dtype}"
                )
            block = tuple(self.block_shape) if isinstance(self.block_shape, (list, tuple)) else ()
            if len(block) != 2 or not all(isinstance(v, int) and v > 0 for v in block):
                raise TuneError(
                    f"block_shape must be two positive integers [block_n, block_k], got {self.block_shape!r}"
                )
            object.__setattr__(self, "block_shape", block)
        self._check_quant_details()
        self._check_checkpoint_dtype()

    def _check_checkpoint_dtype(self) -> None:
        """Only w8a8 takes either checkpoint dtype; the others run their own activations."""
        spec = DTYPES[self.dtype]
        if self.checkpoint_dtype not in CHECKPOINT_DTYPES:
            raise TuneError(
                f"checkpoint_dtype must be {' or '.join(CHECKPOINT_DTYPES)}, "
                f"got {self.checkpoint_dtype!r}"
            )
        if spec.quantizes_activations:
            return
        if self.checkpoint_dtype not in ("bfloat16", spec.activation_dtype):
            raise TuneError(
                f"{self.dtype} is tuned on {spec.activation_dtype} activations, "
                f"not {self.checkpoint_dtype}"
            )
        object.__setattr__(self, "checkpoint_dtype", spec.activation_dtype)

    def _check_quant_details(self) -> None:
        spec = DTYPES[self.dtype]
        if self.per_channel and not spec.per_channel:
            raise TuneError(
                f"per-channel quantization applies to {', '.join(DTYPES.names('per_channel'))}, "
                f"not {self.dtype}"
            )
        if self.per_channel and self.block_shape is not None:
            raise TuneError("fp8 weights are either block-quantized or per-channel, not both")
        if spec.always_per_channel and not self.per_channel:
            raise TuneError(f"{self.dtype} is tuned per channel only (per_channel=True)")
        if spec.group_quant:
            size = self.group_size
            if isinstance(size, bool) or not isinstance(size, int) or size < 2 or size % 2:
                raise TuneError(
                    f"{self.dtype} needs an even group size >= 2, got {self.group_size!r}"
                )
            if self.hidden_size % 2 or self.intermediate_size % 2:
                raise TuneError(f"{self.dtype} packs two weights per byte: K and N must be even")
        elif self.group_size is not None or self.has_zp:
            raise TuneError(
                f"a group size and zero points go with {', '.join(DTYPES.names('group_quant'))}, "
                f"not {self.dtype}"
            )

    @property
    def engine_block_shape(self) -> tuple[int, int] | None:
        """The engines' ``block_shape``: ``(block_n, block_k)`` block fp8, ``(0, group_size)`` int4."""
        if self.group_size is not None:
            return (0, self.group_size)
        return self.block_shape

    def kernel_options(self) -> dict:
        """The quantization keywords of `moetune.kernel.problem.make_problem` for this problem."""
        return dict(
            per_channel=self.per_channel,
            group_size=self.group_size,
            zero_point=self.has_zp,
            checkpoint_dtype=self.checkpoint_dtype,
        )

    @classmethod
    def from_sharded(
        cls,
        sharded: ShardedShape,
        dtype: str,
        block_shape: tuple[int, int] | list[int] | None = None,
        *,
        per_channel: bool = False,
        group_size: int | None = None,
        has_zp: bool = False,
        checkpoint_dtype: str = "bfloat16",
    ) -> TuneProblem:
        """The problem of one rank of an extracted, sharded model (its `kernel_top_k`)."""
        return cls(
            num_experts=sharded.local_experts,
            intermediate_size=sharded.intermediate_size,
            hidden_size=sharded.hidden_size,
            top_k=sharded.kernel_top_k,
            dtype=dtype,
            block_shape=tuple(block_shape) if block_shape else None,
            per_channel=per_channel,
            group_size=group_size,
            has_zp=has_zp,
            checkpoint_dtype=checkpoint_dtype,
        )

    @property
    def w1_width(self) -> int:
        """Rows of w1: gate and up projections side by side (2N)."""
        return 2 * self.intermediate_size

    @classmethod
    def from_key(cls, key: str) -> TuneProblem:
        """The problem a results-store key names (`key()` read back).

        The dump a ``routing=`` digest names is not in the key: the problem comes back
        with the digest and no path. A ``kernel_rev`` is the kernel's, not the
        problem's: an older revision's key reads as today's problem; so is a
        ``kernel=`` tag (the problem comes back without a kernel).
        """
        match = KEY_PATTERN.match(key)
        if match is None:
            raise TuneError(f"not a problem key: {key!r}")
        e, n, k, top_k, dtype, bn, bk, per_channel, group, zp, fp16, routing = match.groups()
        return cls(
            int(e),
            int(n),
            int(k),
            int(top_k),
            dtype,
            (int(bn), int(bk)) if bn else None,
            per_channel=bool(per_channel),
            group_size=int(group) if group else None,
            has_zp=bool(zp),
            routing_digest=routing,
            checkpoint_dtype="float16" if fp16 else "bfloat16",
        )

    def key(self) -> str:
        """The results-store key: `shape_key` and the kernel timed, e.g.
        ``E=128,N=768,K=2048,topk=8,dtype=bf16,kernel=moetune-vllm-0.34.0@1b2c3d4e5f60``.

        Every key names its kernel (`moetune.engines.launch.kernel_tag`): an engine's by
        its installed source's digest, a twin by its own files' digest, so a store written
        by another kernel (or an earlier revision of a twin) is never reused.
        """
        from moetune.engines.launch import kernel_tag

        return f"{self.shape_key()},kernel={kernel_tag(self.kernel, self.dtype)}"

    def shape_key(self) -> str:
        """The problem without its kernel, as the plan shows it, e.g.
        ``E=128,N=768,K=2048,topk=8,dtype=bf16`` (the ``Kernel:`` line names the kernel)."""
        key = (
            f"E={self.num_experts},N={self.intermediate_size},K={self.hidden_size},"
            f"topk={self.top_k},dtype={self.dtype}"
        )
        if self.block_shape is not None:
            key += f",block_shape=[{self.block_shape[0]},{self.block_shape[1]}]"
        if self.per_channel:
            key += ",per_channel"
        if self.group_size is not None:
            key += f",group_size={self.group_size}" + (",zp" if self.has_zp else "")
        if DTYPES[self.dtype].quantizes_activations and self.checkpoint_dtype == "float16":
            # A bf16 checkpoint's key names no checkpoint dtype: its stores stay valid.
            key += ",checkpoint=fp16"
        revision = DTYPES[self.dtype].kernel_revision
        if revision is not None:
            key += f",kernel_rev={revision}"
        if self.routing_digest is not None:
            key += f",routing={self.routing_digest}"
        return key
