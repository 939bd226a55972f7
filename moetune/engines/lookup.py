"""The value every engine lookup returns, and the helpers both engines share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The six keys of a tuned entry, in the engines' order.
CONFIG_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)
# What Triton launches with when a config omits them (triton.Config / JITFunction defaults on
# CUDA). Old engine fallbacks leave them out, so timing such a config needs these values.
TRITON_LAUNCH_DEFAULTS = {"num_warps": 4, "num_stages": 3}
# The engines' block_shape argument: the fp8 weight block (N, K), or [0, group] for WNA16.
Block = Sequence[int] | None
# The batch sizes both engines' tuners write (and `moetune tune` by default).
ENGINE_BATCH_SIZES = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    256,
    512,
    1024,
    1536,
    2048,
    3072,
    4096,
)


@dataclass(frozen=True)
class Lookup:
    """Where an engine looks for one tuned file, and what it finds.

    `searched` lists the exact paths the engine tries, in its order; `found` is the
    first that exists (None: the engine uses `fallback`). `triton_folder` is the
    ``triton_X_Y_Z`` folder SGLang actually picked (None for vLLM or on a miss).
    `invalid` says why the found file is no table the engine reads (None: it is,
    or it was not checked).
    """

    engine: str
    file_name: str
    searched: tuple[str, ...]
    found: Path | None
    fallback: str
    triton_folder: str | None = None
    notes: tuple[str, ...] = field(default=())
    invalid: str | None = None

    @property
    def present(self) -> bool:
        return self.found is not None

    @property
    def usable(self) -> bool:
        """Found, and not found invalid."""
        return self.present and self.invalid is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "file_name": self.file_name,
            "searched": list(self.searched),
            "found": None if self.found is None else str(self.found),
            "triton_folder": self.triton_folder,
            "fallback": self.fallback,
            "notes": list(self.notes),
            "invalid": self.invalid,
        }


def load_table(path: Path) -> dict[int, dict[str, Any]]:
    """A tuned file as {batch size: entry}, checked (`moetune.engines.tables.read_table`);
    vLLM's ``triton_version`` key is skipped."""
    from moetune.engines.tables import read_table

    return read_table(path)


def nearest_row(table: dict[int, Any], batch_size: int) -> Any:
    """The row both engines use at `batch_size`: ``min(keys, key=lambda x: abs(x - M))``.

    Python's `min` keeps the first of equally near keys, so a tie goes to the key
    that comes first in the file (the smaller one in files written in numeric order).
    """
    return table[min(table, key=lambda key: abs(key - batch_size))]


def timeable(config: dict[str, Any]) -> dict[str, int] | None:
    """The six-key entry a fallback config launches with, or None when it lacks tiles.

    Missing ``num_warps``/``num_stages`` take Triton's launch defaults (what the engine
    gets when it splats a config without them); ``SPLIT_K`` (always 1) is dropped. A
    config without BLOCK_SIZE_N/K (vLLM's WNA16 path, filled in later by the engine)
    returns None.
    """
    if any(key not in config for key in CONFIG_KEYS[:4]):
        return None
    return {key: int(config.get(key, TRITON_LAUNCH_DEFAULTS.get(key, 0))) for key in CONFIG_KEYS}


def short(config: dict[str, Any]) -> str:
    """``M16 N64 K128 G1 w4 s4`` (``w-``/``s-``: the engine leaves it to Triton)."""
    tags = (
        ("M", "BLOCK_SIZE_M"),
        ("N", "BLOCK_SIZE_N"),
        ("K", "BLOCK_SIZE_K"),
        ("G", "GROUP_SIZE_M"),
        ("w", "num_warps"),
        ("s", "num_stages"),
    )
    return " ".join(f"{tag}{config.get(key, '-')}" for tag, key in tags)


def summarize(rows: dict[int, dict[str, Any]]) -> list[tuple[int, int, dict[str, Any]]]:
    """Consecutive batch sizes with the same config merged: [(first M, last M, config)]."""
    ranges: list[tuple[int, int, dict[str, Any]]] = []
    for m in sorted(rows):
        if ranges and ranges[-1][2] == rows[m]:
            ranges[-1] = (ranges[-1][0], m, rows[m])
        else:
            ranges.append((m, m, rows[m]))
    return ranges


def engine_fallback_table(
    default_config: Callable[..., dict[str, Any]],
    batch_sizes: Sequence[int],
    E: int,
    N: int,
    K: int,
    topk: int,
    dtype: str | None,
    block_shape: Sequence[int] | None = None,
) -> dict[int, dict[str, Any]]:
    """An engine's `default_config` at each batch size (each engine module binds its own)."""
    return {m: default_config(m, E, N, K, topk, dtype, block_shape) for m in batch_sizes}
