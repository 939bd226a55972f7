"""Deployment layouts (TP, EP, dtype) of one model, and the per-rank shard each one runs.

A layout sweep (``moetune tune --tp 1,2,4 --dtype bf16,fp8_w8a8``) expands into
every combination of the listed values (`expand_layouts`). `resolve_layouts`
reads the model's config once and shards it for each layout: a layout the
engines cannot split (experts or intermediate size not divisible) comes back as a `SkippedLayout` with the reason,
never as an error; only the model itself (config, registry) can fail the call.

No torch, no triton: `extract` stays importable on its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from moetune.errors import MoetuneError
from moetune.extract.evaluate import extract_shape
from moetune.extract.kernel_dtype import KernelDtype, resolve_kernel_dtype
from moetune.extract.mappings import load_registry
from moetune.extract.quant import QuantInfo, detect_quantization
from moetune.extract.shape import Extraction, ShardedShape
from moetune.extract.sharding import fewer_experts_note, shard
from moetune.extract.sources import LoadedConfig, load_config


@dataclass(frozen=True)
class Layout:
    """One way to serve the model: TP size, vLLM EP (`ep`) or SGLang EP size, kernel dtype."""

    tp: int
    ep: bool = False
    ep_size: int | None = None
    dtype: str = "auto"
    # What `dtype` ("auto" included) resolved to for the model (`resolve_layouts`); labels
    # show it. Not part of the layout's identity: a resolved layout equals the asked one.
    resolved_dtype: str | None = field(default=None, compare=False)

    def split(self) -> str:
        """``TP2``, ``TP8 EP`` (vLLM) or ``TP8 EP4`` (SGLang)."""
        if self.ep:
            return f"TP{self.tp} EP"
        if self.ep_size is not None:
            return f"TP{self.tp} EP{self.ep_size}"
        return f"TP{self.tp}"

    def label(self) -> str:
        """``TP2 bf16``, ``TP8 EP fp8_w8a8``: how plans and summaries name the layout
        (with the dtype ``auto`` resolved to, once known)."""
        return f"{self.split()} {self.resolved_dtype or self.dtype}"


@dataclass(frozen=True)
class LayoutShard:
    """A layout the engines can run: its per-rank shard and kernel dtype."""

    layout: Layout
    sharded: ShardedShape
    kernel_dtype: KernelDtype

    @property
    def notes(self) -> tuple[str, ...]:
        """What the plan should say about this layout's kernel (dtype, top-k on a rank)."""
        return tuple(
            note for note in (self.kernel_dtype.note, fewer_experts_note(self.sharded)) if note
        )


@dataclass(frozen=True)
class SkippedLayout:
    """A layout that cannot be served as asked, and why (the sharding error's message)."""

    layout: Layout
    reason: str


@dataclass(frozen=True)
class ResolvedLayouts:
    """A model's config, its extraction and each asked layout, sharded or skipped."""

    loaded: LoadedConfig
    extraction: Extraction
    shards: tuple[LayoutShard, ...]
    skipped: tuple[SkippedLayout, ...]
    # The asked layouts, each once, dtypes resolved, in the asked order.
    layouts: tuple[Layout, ...] = ()


def expand_layouts(
    tps: Sequence[int],
    *,
    ep: bool = False,
    ep_sizes: Sequence[int] = (),
    dtypes: Sequence[str] = ("auto",),
) -> list[Layout]:
    """Every combination of the listed values, TP-major, duplicates dropped, in the given order.

    `ep` applies to every TP; `ep_sizes` (SGLang) multiply with the TP sizes.
    Both at once is a user error, as for a single layout.
    """
    if ep and ep_sizes:
        raise MoetuneError(
            "--ep (vLLM: EP size = TP size) and --ep-size (SGLang) both set the EP size; pass one"
        )
    if not tps or not dtypes:
        raise MoetuneError("a layout needs at least one --tp and one --dtype")
    sizes: Sequence[int | None] = tuple(ep_sizes) or (None,)
    layouts = [
        Layout(tp, ep, ep_size, dtype)
        for tp, ep_size, dtype in itertools.product(tps, sizes, dtypes)
    ]
    return list(dict.fromkeys(layouts))


def shard_layout(
    extraction: Extraction, layout: Layout, quant: QuantInfo | None = None
) -> LayoutShard | SkippedLayout:
    """Shard one layout (its dtype resolved); a split the engines refuse becomes a `SkippedLayout`."""
    kernel_dtype = resolve_kernel_dtype(extraction.shape, layout.dtype, quant)
    layout = replace(layout, resolved_dtype=kernel_dtype.name)
    try:
        sharded = shard(extraction.shape, tp=layout.tp, ep=layout.ep, ep_size=layout.ep_size)
    except MoetuneError as exc:
        return SkippedLayout(layout, str(exc))
    return LayoutShard(layout, sharded, kernel_dtype)


def resolve_layouts(
    model: str,
    layouts: Sequence[Layout],
    *,
    revision: str | None = None,
    mappings: str | None = None,
    replace_mappings: bool = False,
    allow_huge_shape: bool = False,
) -> ResolvedLayouts:
    """Load `model`'s config once and shard it for each layout (see the module docstring)."""
    loaded = load_config(model, revision=revision)
    registry = load_registry(mappings, replace=replace_mappings)
    extraction = extract_shape(
        loaded.config,
        registry,
        source=loaded.path or loaded.description,
        allow_huge_shape=allow_huge_shape,
    )
    quant = detect_quantization(loaded.config)
    results = [shard_layout(extraction, layout, quant) for layout in layouts]
    # `--dtype auto,bf16` on a bf16 checkpoint asks for one layout twice: keep the first.
    distinct: dict[str, LayoutShard | SkippedLayout] = {}
    for result in results:
        distinct.setdefault(result.layout.label(), result)
    results = list(distinct.values())
    return ResolvedLayouts(
        loaded=loaded,
        extraction=extraction,
        shards=tuple(r for r in results if isinstance(r, LayoutShard)),
        skipped=tuple(r for r in results if isinstance(r, SkippedLayout)),
        layouts=tuple(r.layout for r in results),
    )
