"""A tuned-config file as the engine reads it: per batch size, what the call launches with.

vLLM reads one table for both GEMMs. SGLang reads ``<name>.json`` for the gate/up
GEMM and, when ``<name>_down.json`` lies beside it, that table for the down GEMM
(else the up table again, ``USE_TMA`` included: `TunedFile.pick`); each table is
looked up on its own, at the key nearest the live M
(`moetune.engines.lookup.nearest_row`). SGLang's entries may carry ``"USE_TMA"``:
in the down table since its split tuner, in the up table since PR #33559. vLLM's
``"USE_TMA"`` is another switch (0.34 on: TMA-B, default true), read as the release
the file is for reads it (`moetune.engines.vllm.read_table_for`): a vLLM file with it
is refused in one line for 0.33, which it stops at start-up.

So timing a file means timing, per batch size, either one config (`Candidate`,
a "whole" call) or an up + down pair (`Probe` of kind "pair"). A pair is timed
with the routing outside the CUDA graph (`moetune.tune.measure.probe_timing`), which
reads a microsecond or two less than the whole-call harness; anything compared
with a pair must be timed the same way (`same_harness`).

The write side: where moetune puts an engine's files under a folder
(`tuned_file_paths`), their content (`file_payload`: the version key where the
engine's format has one, then batch sizes in numeric order), checked against the
schema as moetune writes them (`validate_tuned_config`), then written atomically,
keeping a different old file as ``<file>.bak-<UTC time>`` (`write_tuned_files`).
Each engine's format comes from `moetune.engines.formats`. No torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moetune.engines.formats import DOWN_SUFFIX, VERSION_KEY, engine_format
from moetune.engines.install import backup_stamp, write_keeping_backup
from moetune.engines.lookup import TRITON_LAUNCH_DEFAULTS, nearest_row
from moetune.engines.sglang import down_name
from moetune.engines.sglang import entry_refusal as sglang_entry_refusal
from moetune.engines.tables import (
    TunedConfigError,
    check_table,
    definition_for,
    parse_json,
    read_table,
)
from moetune.errors import MoetuneError, TuneError
from moetune.fileio import read_input_bytes
from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe

Entry = tuple[Candidate, bool]  # a table row: its config and whether it asks for TMA


def down_table_path(path: Path) -> Path:
    """The ``_down`` table beside the file at `path` (SGLang's name for it)."""
    return path.with_name(down_name(path.name))


def parse_entry(path: Path, key: int, value: Mapping[str, Any]) -> Entry:
    """One checked row (`read_table`) as the engine launches it: the six kernel keys
    (``num_warps``/``num_stages`` absent: Triton's launch defaults), ``USE_TMA`` (false when
    absent). ``SPLIT_K`` (a constexpr vLLM's kernel declares and never reads) and
    ``num_ctas`` 1 (Triton's default) are dropped; ROCm's extra keys are refused."""
    tma = bool(value.get("USE_TMA", False))
    rest = {**TRITON_LAUNCH_DEFAULTS, **value}
    for ignored in ("USE_TMA", "SPLIT_K"):
        rest.pop(ignored, None)
    if rest.get("num_ctas") == 1:
        del rest["num_ctas"]
    try:
        return Candidate.from_config(rest), tma
    except MoetuneError as exc:
        raise MoetuneError(f"{path}: batch size {key}: {exc}") from None


def parse_vllm_entry(path: Path, key: int, value: Mapping[str, Any]) -> Entry:
    """One checked row of a vLLM table: its ``USE_TMA`` is vLLM 0.34's TMA-B switch
    (`Candidate.USE_TMA`), never SGLang's TMA layout."""
    candidate, _ = parse_entry(path, key, value)
    return candidate.with_tma_b(bool(value.get("USE_TMA", True))), False


def is_vllm_table(path: Path) -> bool:
    """Whether the tuned file at `path` is vLLM's: it opens with a ``"triton_version"`` key
    (as `moetune.engines.tables.definition_for` tells the engines apart)."""
    try:
        payload = parse_json(read_input_bytes(path), str(path))  # a FIFO or /dev/zero: refused
    except (OSError, TunedConfigError):
        return False  # read_table says why
    return isinstance(payload, dict) and VERSION_KEY in payload


def _table(
    path: Path, *, down: bool, engine: str | None = None, vllm_release: str | None = None
) -> dict[int, Entry]:
    """The file at `path`, checked (`moetune.engines.tables`), as rows moetune can time;
    a vLLM table as `vllm_release` reads it (None: `moetune.engines.vllm.target_release`);
    `engine` "sglang": also refused where SGLang's launch would fail on it."""
    if not down and engine != "sglang" and is_vllm_table(path):
        from moetune.engines import vllm

        release = vllm_release or vllm.target_release()[0]
        rows = vllm.read_table_for(path, release)
        return {key: parse_vllm_entry(path, key, value) for key, value in rows.items()}
    table = read_table(path, down=down)
    if engine == "sglang":
        reason = sglang_entry_refusal(table)
        if reason:
            raise MoetuneError(f"{path}: {reason}")
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

        As SGLang 0.5.23 does: each table's nearest row, the down row's BLOCK_SIZE_M
        forced to the up row's (one alignment feeds both GEMMs). No down table: SGLang's
        ``get_moe_configs(down_moe=True)`` hands back the up table, and
        ``_prepare_fused_moe_run`` pops ``USE_TMA`` from each copy of the row, so an up
        row with ``"USE_TMA": true`` runs both GEMMs with TMA (the up GEMM reading w1
        through a descriptor and writing sorted rows, the down GEMM reading those rows
        and w2 through descriptors), whatever its warning says ("reusing the tuned
        up-projection config without TMA"); a row without it is one plain config.
        """
        up, up_tma = nearest_row(self.up, batch_size)
        if self.down is None:
            return Probe("pair", up, True, up, True) if up_tma else up
        down, down_tma = nearest_row(self.down, batch_size)
        down = replace(down, BLOCK_SIZE_M=up.BLOCK_SIZE_M)
        return Probe("pair", up, up_tma, down, down_tma)


def load_tuned_file(
    path: Path,
    down_path: Path | None = None,
    *,
    engine: str | None = None,
    vllm_release: str | None = None,
) -> TunedFile:
    """`path` with its ``_down`` table: `down_path`, else the one beside it, if any; a vLLM
    file as `vllm_release` reads it (None: the installed release, else the newest known).

    `engine` "sglang": a file SGLang 0.5.23 would fail to launch (`sglang.entry_refusal`)
    is a `MoetuneError`; None (a file of either engine) reads what either engine reads.
    """
    if path.name.endswith(DOWN_SUFFIX):
        main = path.name.removesuffix(DOWN_SUFFIX) + ".json"
        raise MoetuneError(
            f"{path.name} is SGLang's down-GEMM table: pass its main file {main} "
            "(the _down table beside it is paired with it automatically)"
        )
    if down_path is None and down_table_path(path).exists():
        down_path = down_table_path(path)
    up = _table(path, down=False, engine=engine, vllm_release=vllm_release)
    down = _table(down_path, down=True, engine=engine) if down_path is not None else None
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


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

Table = Mapping[int, Mapping[str, Any]]  # batch size -> entry


class FileWriteError(MoetuneError):
    """A tuned file that could not be written (the message names it and why)."""


def tuned_file_path(
    engine: str,
    folder: str | Path,
    E: int,
    N: int,
    device_name: str,
    dtype: str | None,
    block_shape: Sequence[int] | None,
    *,
    per_channel: bool = False,
    triton_version: str,
    down: bool = False,
) -> Path:
    """Where `engine`'s file for this shape (`down`: its down-GEMM table) goes under `folder`,
    in the engine's own layout: the file name it looks up, in the folder it reads.

    `dtype` is the dtype in the file name (None: unquantized); `N` the one the engine
    keys its file on (SGLang's int4: N // 2, `moetune.extract.quant.engine_file_n`).
    """
    row = engine_format(engine, TuneError)
    if down and not row.reads_down_file:
        raise TuneError(f"{row.label} reads no separate down-GEMM table")
    name = row.file_name(E, N, device_name, dtype, block_shape, per_channel=per_channel, down=down)
    return Path(folder) / row.folder(triton_version) / name


def tuned_file_paths(engine: str, folder: str | Path, *args: Any, **kwargs: Any) -> list[Path]:
    """`engine`'s files in the order written: its table, then its down table if it reads one
    (arguments as `tuned_file_path`)."""
    paths = [tuned_file_path(engine, folder, *args, **kwargs)]
    if engine_format(engine, TuneError).reads_down_file:
        paths.append(tuned_file_path(engine, folder, *args, **kwargs, down=True))
    return paths


def file_payload(
    engine: str, entries: Table, triton_version: str, *, down: bool = False
) -> dict[str, Any]:
    """The content of `engine`'s file (`down`: its down table): ``"triton_version"`` first
    where the engine's format has that key, then the batch sizes in numeric order."""
    if not entries:
        raise TuneError("no tuned batch sizes to write")
    table = {str(m): dict(entries[m]) for m in sorted(entries)}
    if engine_format(engine, TuneError).version_key and not down:
        return {VERSION_KEY: triton_version, **table}
    return table


def checked_files(
    engine: str,
    paths: Sequence[Path],
    tables: Sequence[Table],
    triton_version: str,
    *,
    tma_b: bool = False,
) -> list[tuple[Path, dict[str, Any]]]:
    """Each of `engine`'s files (`paths` as `tuned_file_paths` gives them, `tables` in the
    same order) with its content, every one checked as moetune writes it (`tma_b`: for a
    release that reads the engine's TMA-B switch, vLLM 0.34 on)."""
    downs = [index > 0 for index in range(len(paths))]  # the table, then its down table
    payloads = [
        file_payload(engine, table, triton_version, down=down)
        for table, down in zip(tables, downs, strict=True)
    ]
    for path, payload, down in zip(paths, payloads, downs, strict=True):
        validate_tuned_config(payload, engine, name=str(path), down=down, tma_b=tma_b)
    return list(zip(paths, payloads, strict=True))


def write_tuned_files(
    planned: Sequence[tuple[Path, dict[str, Any]]],
    notes: list[str] | None = None,
    *,
    within: Path | None = None,
) -> list[Path]:
    """Write each checked file (`checked_files`) atomically, as the engines' tuners indent
    them; return the paths in order.

    A different file already at a path is kept beside it as ``<file>.bak-<UTC time>``
    (as ``tune --install`` does) and a line saying so goes to `notes`; an identical one
    is left as it is. `FileWriteError` names a file that cannot be written, or one that
    is, or lies in a folder that is, a symlink below `within` (the save dir).
    """
    stamp = backup_stamp()
    written = []
    for path, payload in planned:
        try:
            text = json.dumps(payload, indent=4) + "\n"
            backup = write_keeping_backup(path, text, stamp, within=within)
        except OSError as exc:
            raise FileWriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        if backup is not None and notes is not None:
            notes.append(
                f"{path.name} in {path.parent} differed from the new file: "
                f"the old one is kept as {backup.name}"
            )
        written.append(path)
    return written


def validate_tuned_config(
    path_or_payload: str | Path | dict[str, Any],
    engine: str,
    name: str | None = None,
    *,
    down: bool | None = None,
    tma_b: bool = False,
) -> None:
    """Check a tuned-config file (a path) or its content against the engine's schema as
    moetune writes it.

    `down` selects the down-GEMM table schema as moetune writes it (``USE_TMA``
    on every entry); None: from the file name (``_down.json``). `tma_b`: the file is for
    a release that reads the engine's own TMA-B switch (vLLM 0.34: ``"USE_TMA": false``
    allowed).

    Raises `TuneError` naming the file and the offending key, e.g.
    ``E=8,...json: batch size 64: config: 'num_stages' is a required property``.
    """
    engine_format(engine, TuneError)
    if isinstance(path_or_payload, dict):
        payload, label = path_or_payload, name or "tuned config"
    else:
        label = name or str(path_or_payload)
        try:
            payload = parse_json(read_input_bytes(path_or_payload), label)
        except OSError as exc:
            raise TuneError(f"{label}: cannot read a tuned config: {exc.strerror or exc}") from None
        except TunedConfigError as exc:
            raise TuneError(str(exc)) from None
    if down is None:
        down = label.endswith(DOWN_SUFFIX)
    try:
        definition = definition_for(payload, engine, down=down, writing=True, tma_b=tma_b)
        check_table(payload, definition, label)
    except TunedConfigError as exc:
        raise TuneError(str(exc)) from None
