"""The tuned-config files vLLM and SGLang load, written exactly as each expects.

    vLLM    <save_dir>/E=128,N=768,device_name=NVIDIA_H200.json
            {"triton_version": "3.6.0", "1": {...}, "2": {...}, ...}
    SGLang  <save_dir>/configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json
            {"1": {...}, "2": {...}, ...}            (no version key: the folder has it)
            <save_dir>/configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200_down.json
            {"1": {..., "USE_TMA": false}, ...}      (the down GEMM's table, `moetune.tune.split`)

Batch-size keys are decimal strings in numeric order; each entry holds the six
kernel keys. Both engines pick the entry whose key is nearest to the live batch
size. Files are validated against ``schemas/tuned_config.schema.json`` before
they are written, and written atomically.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from moetune.errors import TuneError
from moetune.extract.filenames import (
    sglang_config_filename,
    sglang_config_folder,
    sglang_down_config_filename,
    vllm_config_filename,
)
from moetune.fileio import atomic_write_json
from moetune.tune.problem import TuneProblem
from moetune.tune.space import Candidate
from moetune.tune.split import SplitResult, reads_down_file, single_entries, split_entries

ENGINES = ("vllm", "sglang")


def _engine_dtype(problem: TuneProblem) -> str | None:
    """The dtype string in the engines' file names: none for unquantized bf16/fp16."""
    return None if problem.dtype in ("bf16", "fp16") else problem.dtype


def skipped_engines(problem: TuneProblem) -> dict[str, str]:
    """Engines that get no file for `problem`, each with the one-line reason (from the
    quantization rules: vLLM looks int8_w8a8 up under the unquantized file name)."""
    from moetune.extract.quant import engine_write_refusal

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
        from moetune.extract.quant import engine_file_n  # SGLang keys int4 on N // 2

        folder = Path(save_dir) / sglang_config_folder(triton_version)
        N = engine_file_n("sglang", N, dtype)
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
) -> list[Path]:
    """Write each engine's file(s) (validated, atomically); return the paths in `engines` order.

    An engine that reads a down-GEMM table (SGLang) gets two files: from `split`
    (one `SplitResult` per batch size) when given, else the single config in both
    with ``"USE_TMA": false`` in the down table (see `moetune.tune.split`).
    """
    written = []
    for engine in engines:
        paths = engine_file_paths(engine, problem, device_name, triton_version, save_dir)
        if engine == "vllm":
            payloads = [(vllm_payload(results, triton_version), False)]
        else:
            up, down = split_entries(split) if split else single_entries(results)
            payloads = [(_table(up), False), (_table(down), True)]
        for path, (payload, down_table) in zip(paths, payloads, strict=True):
            validate_tuned_config(payload, engine, name=str(path), down=down_table)
            written.append(atomic_write_json(path, payload, indent=4))
    return written


@cache
def _schema() -> dict[str, Any]:
    source = resources.files("moetune") / "data" / "schemas" / "tuned_config.schema.json"
    return json.loads(source.read_text())


def validate_tuned_config(
    path_or_payload: str | Path | dict[str, Any],
    engine: str,
    name: str | None = None,
    *,
    down: bool | None = None,
) -> None:
    """Check a tuned-config file (a path) or its content against the engine's schema.

    `down` selects SGLang's down-GEMM table schema; None: from the file name (``_down.json``).

    Raises `TuneError` naming the file and the offending key, e.g.
    ``E=8,...json: key "64": 'num_stages' is a required property``.
    """
    if engine not in ENGINES:
        raise TuneError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if down is None:
        label_name = name or ("" if isinstance(path_or_payload, dict) else str(path_or_payload))
        down = label_name.endswith("_down.json")
    if down and not reads_down_file(engine):
        raise TuneError(f"{engine} reads no separate down-GEMM table")
    if isinstance(path_or_payload, dict):
        payload, label = path_or_payload, name or "tuned config"
    else:
        path = Path(path_or_payload)
        label = name or str(path)
        try:
            payload = json.loads(path.read_text())
        except OSError as exc:
            raise TuneError(f"cannot read {label}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise TuneError(f"{label} is not valid JSON: {exc}") from None
    if isinstance(payload, dict):
        if engine == "sglang" and "triton_version" in payload:
            raise TuneError(
                f'{label} is not a valid sglang tuned config: key "triton_version" is not allowed '
                "(SGLang reads every key as a batch size; its triton_X_Y_Z folder carries the version)"
            )
        if not [key for key in payload if key != "triton_version"]:
            raise TuneError(
                f"{label} is not a valid {engine} tuned config: it holds no batch sizes"
            )
    schema = _schema()
    definition = f"{engine}_down" if down else engine
    validator = Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"})
    error = best_match(validator.iter_errors(payload))
    if error is None:
        return
    where = ".".join(
        f'"{part}"' if isinstance(part, str) else str(part) for part in error.absolute_path
    )
    location = f"key {where}: " if where else ""
    what = f"{engine} down-GEMM" if down else engine
    raise TuneError(f"{label} is not a valid {what} tuned config: {location}{error.message}")
