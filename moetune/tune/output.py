"""The tuned-config files vLLM and SGLang load, written exactly as each expects.

    vLLM    <save_dir>/E=128,N=768,device_name=NVIDIA_H200.json
            {"triton_version": "3.6.0", "1": {...}, "2": {...}, ...}
    SGLang  <save_dir>/configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json
            {"1": {...}, "2": {...}, ...}            (no version key: the folder has it)
            <save_dir>/configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200_down.json
            {"1": {..., "USE_TMA": false}, ...}      (the down GEMM's table, `moetune.tune.search.split`)

Batch-size keys are decimal strings in numeric order; each entry holds the six
kernel keys. Both engines pick the entry whose key is nearest to the live batch
size. Files are validated against ``schemas/tuned_config.schema.json`` before
they are written, and written atomically; a different file already in their
place is kept beside it as ``<file>.bak-<UTC time>`` (`moetune.engines.install`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from moetune.dtypes import DTYPES, engine_file_n, engine_write_refusal
from moetune.engines.install import backup_stamp, write_keeping_backup
from moetune.engines.names import (
    sglang_config_filename,
    sglang_config_folder,
    sglang_down_config_filename,
    vllm_config_filename,
)
from moetune.engines.tables import (
    DOWN_SUFFIX,
    TunedConfigError,
    check_entry,
    check_table,
    definition_for,
    parse_json,
)
from moetune.errors import TuneError
from moetune.kernel.config import Candidate
from moetune.tune.problem import TuneProblem
from moetune.tune.search.split import SplitResult, reads_down_file, single_entries, split_entries

ENGINES = ("vllm", "sglang")


def _engine_dtype(problem: TuneProblem) -> str | None:
    """The dtype string in the engines' file names: none for unquantized bf16/fp16."""
    return DTYPES[problem.dtype].quant_dtype


def skipped_engines(problem: TuneProblem) -> dict[str, str]:
    """Engines that get no file for `problem`, each with the one-line reason (from the
    quantization rules: vLLM looks int8_w8a8 up under the unquantized file name)."""
    reasons = {
        engine: engine_write_refusal(engine, problem.dtype, per_channel=problem.per_channel)
        for engine in ENGINES
    }
    return {engine: why for engine, why in reasons.items() if why}


def _batch_entries(results: dict[int, Candidate]) -> dict[str, dict[str, int]]:
    if not results:
        raise TuneError("no tuned batch sizes to write")
    return {str(m): results[m].as_config() for m in sorted(results)}


def vllm_payload(results: dict[int, Candidate], triton_version: str) -> dict[str, Any]:
    """vLLM's file content: ``"triton_version"`` first, then batch sizes in numeric order."""
    return {"triton_version": triton_version, **_batch_entries(results)}


def sglang_payload(results: dict[int, Candidate]) -> dict[str, Any]:
    """SGLang's file content: batch sizes in numeric order, no version key."""
    return _batch_entries(results)


def engine_file_path(
    engine: str,
    problem: TuneProblem,
    device_name: str,
    triton_version: str,
    save_dir: str | Path,
    *,
    down: bool = False,
) -> Path:
    """Where `write_engine_files` puts `engine`'s file (`down`: its down-GEMM table) under `save_dir`."""
    dtype, block = _engine_dtype(problem), problem.block_shape
    E, N = problem.num_experts, problem.intermediate_size
    if engine == "vllm" and not down:
        return Path(save_dir) / vllm_config_filename(E, N, device_name, dtype, block)
    if engine == "sglang":
        folder = Path(save_dir) / sglang_config_folder(triton_version)
        N = engine_file_n("sglang", N, dtype)  # SGLang keys int4 on N // 2
        name = sglang_down_config_filename if down else sglang_config_filename
        return folder / name(E, N, device_name, dtype, block, per_channel_quant=problem.per_channel)
    if engine == "vllm":
        raise TuneError("vLLM reads no separate down-GEMM table")
    raise TuneError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")


def engine_file_paths(
    engine: str, problem: TuneProblem, device_name: str, triton_version: str, save_dir: str | Path
) -> list[Path]:
    """`engine`'s files in the order written: its table, then its down table if it reads one."""
    paths = [engine_file_path(engine, problem, device_name, triton_version, save_dir)]
    if reads_down_file(engine):
        paths.append(
            engine_file_path(engine, problem, device_name, triton_version, save_dir, down=True)
        )
    return paths


def _table(entries: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if not entries:
        raise TuneError("no tuned batch sizes to write")
    return {str(m): dict(entries[m]) for m in sorted(entries)}


def write_engine_files(
    results: dict[int, Candidate],
    problem: TuneProblem,
    device_name: str,
    triton_version: str,
    save_dir: str | Path,
    engines: tuple[str, ...] | list[str] = ENGINES,
    split: list[SplitResult] | None = None,
    notes: list[str] | None = None,
) -> list[Path]:
    """Write each engine's file(s) (validated, atomically); return the paths in `engines` order.

    An engine that reads a down-GEMM table (SGLang) gets two files: from `split`
    (one `SplitResult` per batch size) when given, else the single config in both
    with ``"USE_TMA": false`` in the down table (see `moetune.tune.search.split`).

    A different file already at a path is kept beside it as ``<file>.bak-<UTC time>``
    (as ``tune --install`` does) and a line saying so goes to `notes`; an identical one
    is left as it is. Every payload is checked before anything is written.
    """
    planned = []
    for engine in engines:
        paths = engine_file_paths(engine, problem, device_name, triton_version, save_dir)
        if engine == "vllm":
            payloads = [(vllm_payload(results, triton_version), False)]
        else:
            up, down = split_entries(split) if split else single_entries(results)
            payloads = [(_table(up), False), (_table(down), True)]
        for path, (payload, down_table) in zip(paths, payloads, strict=True):
            validate_tuned_config(payload, engine, name=str(path), down=down_table)
            planned.append((path, payload))
    stamp = backup_stamp()
    written = []
    for path, payload in planned:
        try:
            backup = write_keeping_backup(path, json.dumps(payload, indent=4) + "\n", stamp)
        except OSError as exc:
            raise TuneError(
                f"cannot write {path}: {exc.strerror or exc}; the measurements are in the "
                "results store: fix this and rerun the same command to write the files"
            ) from None
        if backup is not None and notes is not None:
            notes.append(
                f"{path.name} in {path.parent} differed from the new file: "
                f"the old one is kept as {backup.name}"
            )
        written.append(path)
    return written


def check_space(space: list[Candidate], source: str) -> list[Candidate]:
    """`space` unchanged when every candidate is one the tuned files may hold, else
    `TuneError` before any tuning (rather than a refused write after it)."""
    for candidate in space:
        try:
            check_entry(candidate.as_config(), f"search space {source}: {candidate.short()}")
        except TunedConfigError as exc:
            raise TuneError(f"{exc}; the engines' tuned files hold no such config") from None
    return space


def validate_tuned_config(
    path_or_payload: str | Path | dict[str, Any],
    engine: str,
    name: str | None = None,
    *,
    down: bool | None = None,
) -> None:
    """Check a tuned-config file (a path) or its content against the engine's schema.

    `down` selects SGLang's down-GEMM table schema as moetune writes it (``USE_TMA``
    on every entry); None: from the file name (``_down.json``).

    Raises `TuneError` naming the file and the offending key, e.g.
    ``E=8,...json: batch size 64: config: 'num_stages' is a required property``.
    """
    if engine not in ENGINES:
        raise TuneError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if isinstance(path_or_payload, dict):
        payload, label = path_or_payload, name or "tuned config"
    else:
        label = name or str(path_or_payload)
        try:
            payload = parse_json(Path(path_or_payload).read_bytes(), label)
        except OSError as exc:
            raise TuneError(f"{label}: cannot read a tuned config: {exc.strerror or exc}") from None
        except TunedConfigError as exc:
            raise TuneError(str(exc)) from None
    if down is None:
        down = label.endswith(DOWN_SUFFIX)
    try:
        check_table(payload, definition_for(payload, engine, down=down, writing=True), label)
    except TunedConfigError as exc:
        raise TuneError(str(exc)) from None
