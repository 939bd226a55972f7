"""SGLang's fused-MoE config lookup (with its ``_down`` twin) and fallback config, ported.

Followed: SGLang 0.5.23 (read from its wheel),
``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``
(``get_config_file_name``, ``get_moe_configs``, ``get_default_config``,
``try_get_optimal_moe_config``); /work/shared/notes/sglang-split-configs.md has
the history. Where older releases keep the file: `moetune.engines.installed`.

Lookup, for the up file ``<name>.json`` and again for ``<name>_down.json``:

1. root = ``$SGLANG_MOE_CONFIG_DIR`` (set but empty: SGLang's cwd), else the
   folder of ``fused_moe_triton_config.py`` in the installed package;
2. ``<root>/configs/triton_<installed Triton, "." -> "_">/<name>``;
3. on a miss, every ``<root>/configs/triton_*`` folder, newest version first,
   skipping the installed version's; the first holding ``<name>`` wins (it may
   be *newer* than the installed Triton). Releases up to 0.5.11 try a fixed
   list instead (3.4.0, 3.3.1, 3.2.0, 3.1.0);
4. no file: the up GEMM uses `default_config`; a missing ``_down`` file makes
   the down GEMM reuse the up table's row, ``USE_TMA`` included (SGLang's warning
   says "without TMA", its code copies the flag): an up row asking for TMA runs
   the down GEMM with TMA and the up GEMM with sorted output (`down_fallback`).

E and N come from w2's shape (``E, _, N = w2_shape``), so int4_w4a16 files are
keyed on the packed N/2. The row used is the key nearest to M, separately in
each file; the down row's BLOCK_SIZE_M is then forced to the up row's (one sort
feeds both GEMMs). CUDA values are ported; ROCm's ``num_stages=2``, Marlin,
deterministic mode and 0.5.23's fp8 default for GPUs with under 128 KiB of
shared memory per block are not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from moetune.engines.installed import InstalledEngine, find_installed
from moetune.engines.lookup import Block, Lookup, engine_fallback_table
from moetune.engines.names import sglang_config_filename

ENGINE = "sglang"
FOLLOWS = "SGLang 0.5.23"
FOLDER_ENV = "SGLANG_MOE_CONFIG_DIR"


def default_config(
    M: int, E: int, N: int, K: int, topk: int, dtype: str | None, block_shape: Block = None
) -> dict[str, int]:
    """SGLang's `get_default_config` on CUDA (``is_marlin=False``).

    Only fp8_w8a8 sets ``num_warps``/``num_stages``; every other dtype (bf16/fp16,
    int8, int4) gets one of two tiles and Triton's launch defaults.
    """
    if dtype == "fp8_w8a8":
        if block_shape is None:
            if M <= E:
                return {
                    "BLOCK_SIZE_M": 64,
                    "BLOCK_SIZE_N": 128,
                    "BLOCK_SIZE_K": 128,
                    "GROUP_SIZE_M": 1,
                    "num_warps": 4,
                    "num_stages": 4,
                }
            return {
                "BLOCK_SIZE_M": 128,
                "BLOCK_SIZE_N": 256,
                "BLOCK_SIZE_K": 128,
                "GROUP_SIZE_M": 32,
                "num_warps": 8,
                "num_stages": 4,
            }
        return {
            "BLOCK_SIZE_M": 64,
            "BLOCK_SIZE_N": block_shape[0],
            "BLOCK_SIZE_K": block_shape[1],
            "GROUP_SIZE_M": 32,
            "num_warps": 4,
            "num_stages": 3,
        }
    if M <= E:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def installed() -> InstalledEngine | None:
    """The SGLang on ``sys.path`` (found with `find_spec`, never imported), or None."""
    return find_installed(ENGINE)


def package_root() -> Path | None:
    """The installed SGLang's config root (the folder of its fused_moe_triton_config.py).

    0.5.11 and later: ``srt/layers/moe/moe_runner/triton_utils``; up to 0.5.10.post1:
    ``srt/layers/moe/fused_moe_triton`` (see `moetune.engines.installed.RELEASES`).
    """
    found = installed()
    return None if found is None else found.config_root


def triton_folder(triton_version: str) -> str:
    """``triton_3_6_0`` for Triton 3.6.0."""
    return f"triton_{triton_version.replace('.', '_')}"


def file_name(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None,
    block_shape: Sequence[int] | None,
    *,
    per_channel: bool = False,
    down: bool = False,
) -> str:
    """SGLang's ``get_config_file_name``: per-channel fp8/int8 files end in
    ``,per_channel_quant=True``."""
    return sglang_config_filename(
        E, N, device_name, dtype, block_shape, per_channel_quant=per_channel, down=down
    )


def down_name(name: str) -> str:
    """``<name without .json>_down.json``."""
    return f"{name.removesuffix('.json')}_down.json"


def _version_key(version: str) -> tuple[int, ...] | None:
    # SGLang's sort key, ``tuple(int(x) for x in v.split("."))``; None where it raises.
    try:
        return tuple(int(x) for x in version.split("."))
    except ValueError:
        return None


def config_root(env: Mapping[str, str] | None = None, package: Path | None | str = "find"):
    """(root folder, how it was chosen) as SGLang picks it; root None when neither exists.

    SGLang reads the variable with ``os.environ.get(..., <its folder>)``: set but
    empty, its root is the folder it is started from.
    """
    env = os.environ if env is None else env
    if FOLDER_ENV in env:
        if not env[FOLDER_ENV]:
            return Path(), f"${FOLDER_ENV} is set but empty: SGLang's cwd"
        return Path(env[FOLDER_ENV]), f"${FOLDER_ENV}"
    if package == "find":
        package = package_root()
    if package is None:
        return None, "sglang is not installed here and $SGLANG_MOE_CONFIG_DIR is not set"
    return Path(package), "the installed sglang package"


def lookup(
    name: str,
    triton_version: str | None,
    *,
    env: Mapping[str, str] | None = None,
    package: Path | None | str = "find",
    extra_dirs: Sequence[Path] = (),
    fallback: str | None = None,
    triton_fallback: Sequence[str] | None = None,
) -> Lookup:
    """Where SGLang looks for `name` and what it finds (`extra_dirs` are tried first, flat).

    `triton_version` is the installed Triton's (None: not installed, so the exact
    folder is unknown and only the other folders are shown). After the installed
    Triton's folder, SGLang tries `triton_fallback` (the versions releases up to
    0.5.11 list) or, when None, every ``triton_*`` folder newest first; with
    `package` "find" the installed release decides.
    """
    notes, engine = [], None
    if package == "find":
        engine = installed()
        package = None if engine is None else engine.config_root
        if engine is not None:
            triton_fallback = engine.triton_fallback
            if engine.note:
                notes.append(engine.note)
    root, how = config_root(env, package)
    if engine is not None and how == "the installed sglang package":
        how = f"the installed {engine.label} package"
    candidates: list[tuple[Path, str | None]] = [(Path(d) / name, None) for d in extra_dirs]
    notes.insert(0, f"config root: {root} ({how})" if root is not None else how)
    if triton_version is None:
        notes.append("triton is not installed: SGLang's first folder (triton_X_Y_Z) is unknown")
    if root is not None:
        configs = root / "configs"
        first = triton_folder(triton_version) if triton_version else None
        if first:
            candidates.append((configs / first / name, first))
        if triton_fallback is not None:
            for version in triton_fallback:
                if version != triton_version:
                    folder = triton_folder(version)
                    candidates.append((configs / folder / name, folder))
        elif configs.is_dir():
            # SGLang turns each triton_* entry into a version, sorts on it (stable, newest
            # first), skips the installed Triton's and probes triton_<version, "." -> "_">.
            others = []
            for entry in configs.iterdir():
                if not entry.name.startswith("triton_"):
                    continue
                version = entry.name.removeprefix("triton_").replace("_", ".")
                key = _version_key(version)
                if key is None:
                    notes.append(f"{entry.name}: not a version SGLang can sort (it would fail)")
                    continue
                if version != triton_version:
                    others.append((key, triton_folder(version)))
            for _, folder in sorted(others, key=lambda other: other[0], reverse=True):
                candidates.append((configs / folder / name, folder))
        else:
            notes.append(f"{configs} does not exist (SGLang's version scan would fail on it)")
    hit = next(((path, folder) for path, folder in candidates if path.is_file()), None)
    if (
        hit is not None
        and hit[1] is not None
        and triton_version
        and hit[1] != triton_folder(triton_version)
    ):
        notes.append(
            f"no file for Triton {triton_version}: SGLang falls back to {hit[1]} "
            "(tuned on another Triton; performance might be sub-optimal)"
        )
    return Lookup(
        engine=ENGINE,
        file_name=name,
        searched=tuple(str(path) for path, _ in candidates),
        found=None if hit is None else hit[0],
        fallback=fallback or f"its get_default_config ({FOLLOWS}, ported)",
        triton_folder=None if hit is None else hit[1],
        notes=tuple(notes),
    )


def lookup_pair(
    name: str,
    triton_version: str | None,
    *,
    env: Mapping[str, str] | None = None,
    package: Path | None | str = "find",
    extra_dirs: Sequence[Path] = (),
    triton_fallback: Sequence[str] | None = None,
) -> tuple[Lookup, Lookup]:
    """The up file and its ``_down`` twin, each looked up the same way."""
    up = lookup(
        name,
        triton_version,
        env=env,
        package=package,
        extra_dirs=extra_dirs,
        triton_fallback=triton_fallback,
    )
    down = lookup(
        down_name(name),
        triton_version,
        env=env,
        package=package,
        extra_dirs=extra_dirs,
        fallback=down_fallback(up.found),
        triton_fallback=triton_fallback,
    )
    return up, down


def tma_batch_sizes(path: Path) -> list[int]:
    """The batch sizes whose entry in the table at `path` asks for ``"USE_TMA": true``
    (none where the file cannot be read: `check` reports that file on its own)."""
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return []
    if not isinstance(table, dict):
        return []
    return sorted(
        int(key)
        for key, entry in table.items()
        if key.isdigit() and isinstance(entry, dict) and entry.get("USE_TMA") is True
    )


# Keys an entry may carry that SGLang 0.5.23's launch hands its kernel (``**config``),
# which declares no such parameter: Triton raises KeyError ("Keyword argument SPLIT_K
# was specified but unrecognised") at the first call. vLLM's kernel declares SPLIT_K.
KERNEL_REFUSES = ("SPLIT_K",)


def entry_refusal(table: Mapping[int, Mapping[str, object]]) -> str | None:
    """Why SGLang 0.5.23 cannot launch a table read by `moetune.engines.tables`, or None."""
    for key, entry in table.items():
        refused = [name for name in KERNEL_REFUSES if name in entry]
        if refused:
            return (
                f'batch size {key}: config "{refused[0]}": SGLang passes every key of an entry '
                "to its fused_moe_kernel, which has no such parameter (Triton raises KeyError "
                "at the first call)"
            )
    return None


def down_fallback(up_found: Path | None) -> str:
    """What SGLang 0.5.23 runs for the down GEMM without a ``_down`` file.

    ``get_moe_configs(down_moe=True)`` returns the up table and ``_prepare_fused_moe_run``
    pops ``USE_TMA`` from the down copy of the row too: where an up entry asks for TMA,
    the down GEMM runs with TMA (and the up GEMM writes sorted rows), whatever SGLang's
    warning says.
    """
    if up_found is None:
        return "the down GEMM reuses the up config (SGLang's default), without TMA"
    tma = tma_batch_sizes(up_found)
    if not tma:
        return "the down GEMM reuses the up config, without TMA"
    keys = ", ".join(map(str, tma[:6])) + (", ..." if len(tma) > 6 else "")
    return (
        "the down GEMM reuses the up config, USE_TMA included: where the up entry asks for "
        f"TMA (M {keys}) the down GEMM runs with TMA and the up GEMM writes sorted rows"
    )


# `default_config` at each batch size: what the engine runs with no tuned file.
fallback_table = partial(engine_fallback_table, default_config)
