"""A tuned-config file as the engine reads it: per batch size, what the call launches with.

vLLM reads one table for both GEMMs. SGLang reads ``<name>.json`` for the gate/up
GEMM and, when ``<name>_down.json`` lies beside it, that table for the down GEMM;
each table is looked up on its own, at the key nearest the live M
(`moetune.engines.lookup.nearest_row`). SGLang's entries may carry ``"USE_TMA"``:
in the down table since its split tuner, in the up table since PR #33559.

So timing a file means timing, per batch size, either one config (`Candidate`,
a "whole" call) or an up + down pair (`Probe` of kind "pair"). A pair is timed
with the routing outside the CUDA graph (`moetune.tune.measure.probe_timing`), which
reads a microsecond or two less than the whole-call harness; anything compared
with a pair must be timed the same way (`same_harness`).

Pure: files in, configs out; no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moetune.engines.lookup import TRITON_LAUNCH_DEFAULTS, nearest_row
from moetune.engines.sglang import down_name
from moetune.engines.tables import read_table
from moetune.errors import MoetuneError
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe

DOWN_SUFFIX = down_name("")

Entry = tuple[Candidate, bool]  # a table row: its config and whether it asks for TMA


def down_table_path(path: Path) -> Path:
    """The ``_down`` table beside the file at `path` (SGLang's name for it)."""
    return path.with_name(down_name(path.name))


def parse_entry(path: Path, key: int, value: Mapping[str, Any]) -> Entry:
    """One checked row (`read_table`) as the engine launches it: the six kernel keys
    (``num_warps``/``num_stages`` absent: Triton's launch defaults), ``USE_TMA`` (false when
    absent); ``SPLIT_K`` (a constexpr vLLM's kernel declares and never reads) is dropped; ROCm's extra keys are refused."""
    tma = bool(value.get("USE_TMA", False))
    rest = {**TRITON_LAUNCH_DEFAULTS, **value}
    for ignored in ("USE_TMA", "SPLIT_K"):
        rest.pop(ignored, None)
    try:
        return Candidate.from_config(rest), tma
    except MoetuneError as exc:
        raise MoetuneError(f"{path}: batch size {key}: {exc}") from None


def _table(path: Path, *, down: bool) -> dict[int, Entry]:
    """The file at `path`, checked (`moetune.engines.tables`), as rows moetune can time."""
    table = read_table(path, down=down)
    return {key: parse_entry(path, key, value) for key, value in table.items()}


@dataclass(frozen=True)
class TunedFile:
    """One tuned file, and the ``_down`` table SGLang pairs with it when there is one."""

    path: Path
    up: dict[int, Entry]
    down: dict[int, Entry] | None = None
    down_path: Path | None = None

    def pick(self, batch_size: int) -> Candidate | Probe:
        """What the engine launches at `batch_size`: one config, or an up + down pair.

        As SGLang does: each table's nearest row, the down row's BLOCK_SIZE_M forced
        to the up row's (one alignment feeds both GEMMs); no down table, the up
        config for both GEMMs, the down one without TMA.
        """
        up, up_tma = nearest_row(self.up, batch_size)
        if self.down is None:
            return Probe("pair", up, True, up, False) if up_tma else up
        down, down_tma = nearest_row(self.down, batch_size)
        down = replace(down, BLOCK_SIZE_M=up.BLOCK_SIZE_M)
        return Probe("pair", up, up_tma, down, down_tma)


def load_tuned_file(path: Path, down_path: Path | None = None) -> TunedFile:
    """`path` with its ``_down`` table: `down_path`, else the one beside it, if any."""
    if path.name.endswith(DOWN_SUFFIX):
        main = path.name.removesuffix(DOWN_SUFFIX) + ".json"
        raise MoetuneError(
            f"{path.name} is SGLang's down-GEMM table: pass its main file {main} "
            "(the _down table beside it is paired with it automatically)"
        )
    if down_path is None and down_table_path(path).exists():
        down_path = down_table_path(path)
    up = _table(path, down=False)
    down = _table(down_path, down=True) if down_path is not None else None
    return TunedFile(path, up, down, down_path)


def same_harness(picks: Iterable[Candidate | Probe]) -> bool:
    """True when every pick can be timed as a whole call (no pair among them)."""
    return not any(isinstance(p, Probe) for p in picks)


def as_pair(item: Candidate | Probe) -> Probe:
    """A pick timed in the pair harness: a single config as the pair of itself."""
    return item if isinstance(item, Probe) else Probe.single(item)


def describe(item: Candidate | Probe) -> dict[str, Any]:
    """The JSON a report prints for a pick: ``config`` (and ``down_config`` for a pair)."""
    if isinstance(item, Candidate):
        return {"config": item.as_config()}
    described: dict[str, Any] = {"config": item.up_config()}
    if item.down is not None and (item.down != item.candidate or item.down_tma or item.use_tma):
        described["down_config"] = item.down_config()
    return described
