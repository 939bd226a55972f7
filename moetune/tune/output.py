"""The tuner's side of the engines' files: its results as per-batch-size tables.

`write_engine_files` turns the tuned configs (and, for an engine that reads a
down-GEMM table, the split pairs of `moetune.tune.search.split`) into one table per
file, and hands them to `moetune.engines.tuned_file`, which names, checks and writes
each file as its engine reads it (`moetune.engines.formats` has each engine's format).
`engine_file_path` is where that file goes for a `TuneProblem`; `skipped_engines` and
`check_space` say, before any tuning, which files the tune cannot write and which
configs the files cannot hold, and `check_outputs` which writes would go through a
symlink (under a save dir, or over an ``--install`` target).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moetune.dtypes import DTYPES, engine_file_n, engine_write_refusal
from moetune.engines.formats import ENGINES, engine_format
from moetune.engines.tables import TunedConfigError, check_entry
from moetune.engines.tuned_file import (
    FileWriteError,
    Table,
    checked_files,
    tuned_file_path,
    tuned_file_paths,
    write_tuned_files,
)
from moetune.errors import TuneError
from moetune.fileio import refuse_links_under
from moetune.kernel.config import TMA_B_KEY, Candidate
from moetune.tune.problem import TuneProblem
from moetune.tune.search.split import SplitResult, single_entries, split_entries


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


def _name_args(engine: str, problem: TuneProblem, device_name: str) -> tuple:
    """What `engine`'s file name is made of for `problem` (`moetune.engines.tuned_file`)."""
    dtype = _engine_dtype(problem)
    N = engine_file_n(engine, problem.intermediate_size, dtype)
    return (problem.num_experts, N, device_name, dtype, problem.block_shape)


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
    return tuned_file_path(
        engine,
        save_dir,
        *_name_args(engine, problem, device_name),
        per_channel=problem.per_channel,
        triton_version=triton_version,
        down=down,
    )


def engine_file_paths(
    engine: str, problem: TuneProblem, device_name: str, triton_version: str, save_dir: str | Path
) -> list[Path]:
    """`engine`'s files in the order written: its table, then its down table if it reads one."""
    return tuned_file_paths(
        engine,
        save_dir,
        *_name_args(engine, problem, device_name),
        per_channel=problem.per_channel,
        triton_version=triton_version,
    )


def vllm_file_release(release: str | None) -> str:
    """The vLLM release a vLLM file is written for: `release`, else the newest moetune knows
    (the tune command passes the installed one's: `moetune.engines.vllm.target_release`)."""
    from moetune.engines.installed import current_release

    return release or current_release("vllm")[0]


def writes_tma_b(engine: str, vllm_release: str | None) -> bool:
    """Whether `engine`'s file may carry ``"USE_TMA": false`` (TMA-B off): vLLM's, for a
    release that reads the key (0.34 on; 0.33 stops at start-up on it)."""
    if engine != "vllm":
        return False
    from moetune.engines import vllm

    return TMA_B_KEY in vllm.file_keys(vllm_file_release(vllm_release))


def engine_tables(
    engine: str,
    results: dict[int, Candidate],
    split: list[SplitResult] | None = None,
    *,
    vllm_release: str | None = None,
) -> list[Table]:
    """The tables of `engine`'s files, in `engine_file_paths` order: the tuned config per
    batch size; for an engine that reads a down table, the up and down tables, from
    `split` (one `SplitResult` per batch size) when given, else the single config in both
    with ``"USE_TMA": false`` in the down table (see `moetune.tune.search.split`).

    A config timed with vLLM 0.34's TMA-B off keeps ``"USE_TMA": false`` only in a vLLM
    file for a release that reads it (`writes_tma_b`); every other file leaves it out."""
    if not writes_tma_b(engine, vllm_release):
        results = {m: config.with_tma_b(True) for m, config in results.items()}
    if not engine_format(engine, TuneError).reads_down_file:
        return [{m: results[m].as_config() for m in results}]
    up, down = split_entries(split) if split else single_entries(results)
    return [up, down]


def write_engine_files(
    results: dict[int, Candidate],
    problem: TuneProblem,
    device_name: str,
    triton_version: str,
    save_dir: str | Path,
    engines: tuple[str, ...] | list[str] = ENGINES,
    split: list[SplitResult] | None = None,
    notes: list[str] | None = None,
    vllm_release: str | None = None,
) -> list[Path]:
    """Write each engine's file(s) (validated, atomically); return the paths in `engines` order.

    An engine that reads a down-GEMM table (SGLang) gets two files (`engine_tables`).
    A different file already at a path is kept beside it as ``<file>.bak-<UTC time>``
    (as ``tune --install`` does) and a line saying so goes to `notes`; an identical one
    is left as it is. Every payload is checked before anything is written. The vLLM file
    is for `vllm_release` (None: the newest release moetune knows, `vllm_file_release`).
    """
    planned = []
    for engine in engines:
        paths = engine_file_paths(engine, problem, device_name, triton_version, save_dir)
        tables = engine_tables(engine, results, split, vllm_release=vllm_release)
        tma_b = writes_tma_b(engine, vllm_release)
        planned += checked_files(engine, paths, tables, triton_version, tma_b=tma_b)
    try:
        return write_tuned_files(planned, notes, within=Path(save_dir))
    except FileWriteError as exc:
        raise TuneError(
            f"{exc}; the measurements are in the results store: fix this and rerun the "
            "same command to write the files"
        ) from None


def check_space(space: list[Candidate], source: str) -> list[Candidate]:
    """`space` unchanged when every candidate is one the tuned files may hold, else
    `TuneError` before any tuning (rather than a refused write after it)."""
    for candidate in space:
        try:
            check_entry(candidate.as_config(), f"search space {source}: {candidate.short()}")
        except TunedConfigError as exc:
            raise TuneError(f"{exc}; the engines' tuned files hold no such config") from None
    return space


def check_outputs(plans: Sequence[Any], targets: Sequence[Any] = ()) -> None:
    """Before any tuning, refuse a write the run would make through a symlink.

    Under each plan's save dir (`moetune.fileio.refuse_links_under`): the engine files and
    their folders, the results store, summary.json and their locks (a link appearing
    later is refused by each writer). Over an ``--install`` target (an
    `moetune.engines.install.InstallTarget`): a file of this run that is a symlink
    (`moetune.engines.install.check_target_files`). `plans` are `TunePlan`s.
    """
    from moetune.engines.install import check_target_files
    from moetune.tune.dir_lock import LOCK_FILENAME
    from moetune.tune.store import store_lock_path
    from moetune.tune.summary_file import summary_paths

    for plan in plans:
        request = plan.request
        save_dir = Path(request.save_dir)
        store = Path(plan.store_path)
        kept = [save_dir / LOCK_FILENAME, store, store_lock_path(store)]
        for path in [*kept, *summary_paths(save_dir), *plan.files]:
            refuse_links_under(save_dir, path)
        for target in targets:
            if target.engine in request.engines:
                names = engine_file_paths(
                    target.engine,
                    request.problem,
                    request.device_name,
                    request.triton_version,
                    save_dir,
                )
                check_target_files(target, [path.name for path in names])
