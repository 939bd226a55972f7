"""What each engine's tuned-config files look like: the one table every layer asks.

    vLLM    <dir>/E=128,N=768,device_name=NVIDIA_H200.json
            {"triton_version": "3.6.0", "1": {...}, "2": {...}, ...}
    SGLang  <dir>/configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json
            {"1": {...}, "2": {...}, ...}            (no version key: the folder has it)
            <dir>/configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200_down.json
            {"1": {..., "USE_TMA": false}, ...}      (the down GEMM's table)

A row of `ENGINE_FORMATS` says how the engine spells its file name
(`moetune.engines.names`), which folder under a root it reads, whether the file
opens with a ``"triton_version"`` key, whether a ``_down`` table for the down GEMM
sits beside it, whether entries may carry ``"USE_TMA"`` (SGLang's split TMA; vLLM
0.34's TMA-B switch is per release: `moetune.engines.vllm.file_keys`), and which definitions of
``schemas/tuned_config.schema.json`` check what the engine reads and what moetune
writes (`moetune.engines.tables`). vLLM plans the same split as SGLang
(vllm-project/vllm#46338): flip its row then.

Which dtypes an engine gets a file for is the quantization rules' to say
(`moetune.extract.quant.engine_write_refusal`), not this table's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from moetune.engines.names import (
    sglang_config_filename,
    sglang_config_folder,
    vllm_config_filename,
)
from moetune.errors import MoetuneError

ENGINES = ("vllm", "sglang")
VERSION_KEY = "triton_version"
DOWN_SUFFIX = "_down.json"


def _vllm_name(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None,
    block_shape: Sequence[int] | None,
    *,
    per_channel: bool,
    down: bool,
) -> str:
    # vLLM's name carries no per-channel mark; 0.34 looks its down table up as the main
    # file's name with ``_down`` before ``.json`` (``get_moe_configs(..., down_moe=True)``).
    name = vllm_config_filename(E, N, device_name, dtype, block_shape)
    return name.removesuffix(".json") + DOWN_SUFFIX if down else name


def _sglang_name(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None,
    block_shape: Sequence[int] | None,
    *,
    per_channel: bool,
    down: bool,
) -> str:
    return sglang_config_filename(
        E, N, device_name, dtype, block_shape, per_channel_quant=per_channel, down=down
    )


@dataclass(frozen=True)
class EngineFormat:
    """What one engine's tuned-config files hold, and where and how they are named."""

    engine: str
    label: str  # the engine's name in messages: "vLLM"
    version_key: bool  # the file opens with "triton_version"
    version_folder: bool  # the file lies in configs/triton_X_Y_Z/ (the folder carries the version)
    reads_down_file: bool  # a second table for the down GEMM (``<name>_down.json``)
    tma_key: bool  # entries may carry "USE_TMA"
    read_schema: str  # the schema definition of a table the engine reads
    written_schema: str  # ... and of one moetune writes (all six kernel keys)
    down_read_schema: str | None = None  # the same for the down table
    down_written_schema: str | None = None
    # ... and of one moetune writes for a release that reads the engine's own per-entry
    # USE_TMA (vLLM 0.34 on: TMA-B, written only as false); None: no release does.
    tma_b_written_schema: str | None = None
    namer: Callable[..., str] = _vllm_name

    def schema(
        self, *, down: bool = False, writing: bool = False, tma_b: bool = False
    ) -> str | None:
        """The schema definition a table of this engine is checked by (None: no such table);
        `tma_b`: a written table for a release that reads the engine's TMA-B switch."""
        if tma_b and writing and not down and self.tma_b_written_schema is not None:
            return self.tma_b_written_schema
        if down:
            return self.down_written_schema if writing else self.down_read_schema
        return self.written_schema if writing else self.read_schema

    def folder(self, triton_version: str) -> str:
        """The folder under a root the engine reads its files from (``""``: the root itself)."""
        return sglang_config_folder(triton_version) if self.version_folder else ""

    def file_name(
        self,
        E: int,
        N: int,
        device_name: str,
        dtype: str | None = None,
        block_shape: Sequence[int] | None = None,
        *,
        per_channel: bool = False,
        down: bool = False,
    ) -> str:
        """The engine's file name for this shape (`down`: its down table's), as it spells it."""
        return self.namer(E, N, device_name, dtype, block_shape, per_channel=per_channel, down=down)


ENGINE_FORMATS = {
    "vllm": EngineFormat(
        engine="vllm",
        label="vLLM",
        version_key=True,
        version_folder=False,
        reads_down_file=False,
        tma_key=False,
        read_schema="vllm",
        written_schema="vllm_written",
        tma_b_written_schema="vllm_tma_written",
        # vLLM 0.34 reads a down table on one serving path only (`moetune.tune.search.
        # split_vllm`), so `reads_down_file` stays False: these check that table.
        down_read_schema="vllm_down",
        down_written_schema="vllm_down_written",
        namer=_vllm_name,
    ),
    "sglang": EngineFormat(
        engine="sglang",
        label="SGLang",
        version_key=False,
        version_folder=True,
        reads_down_file=True,
        tma_key=True,
        read_schema="sglang",
        written_schema="sglang_written",
        down_read_schema="sglang",
        down_written_schema="sglang_down",
        namer=_sglang_name,
    ),
}


def engine_format(engine: str, error: type[MoetuneError] = MoetuneError) -> EngineFormat:
    """`engine`'s row; `error` (one line naming the engines) for an engine moetune does not know."""
    try:
        return ENGINE_FORMATS[engine]
    except (KeyError, TypeError):
        raise error(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}") from None


def format_of_table(*, version_key: bool, down: bool) -> EngineFormat:
    """The engine a table given by name belongs to: a down table's is the one that reads
    down tables; else the one that writes a version key exactly when the table has one."""
    if down:
        return next(f for f in ENGINE_FORMATS.values() if f.reads_down_file)
    return next(f for f in ENGINE_FORMATS.values() if f.version_key == version_key)


def engines_named(choice: str) -> tuple[str, ...]:
    """The engines an ``--engine``/``--install`` choice names: ``both`` is every engine."""
    return ENGINES if choice == "both" else (choice,)


def engine_label(engine: str | None, default: str | None = None) -> str | None:
    """``vLLM``/``SGLang`` for a known engine; else `default` (None: `engine` itself)."""
    found = ENGINE_FORMATS.get(engine or "")
    if found is not None:
        return found.label
    return engine if default is None else default
