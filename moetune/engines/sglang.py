"""SGLang's fused-MoE config lookup (with its ``_down`` twin) and fallback config, ported.

Followed: sgl-project/sglang@02c7c97fea5f8c72abab610262e1a73cbba38203,
``python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``
(``get_moe_configs``, ``get_default_config``, ``try_get_optimal_moe_config``); see
/work/shared/notes/sglang-split-configs.md (CFG-B) for the history.

Lookup, for the up file ``<name>.json`` and again for ``<name>_down.json``:

1. root = ``$SGLANG_MOE_CONFIG_DIR``, else the folder of
   ``fused_moe_triton_config.py`` in the installed package;
2. ``<root>/configs/triton_<installed Triton, "." -> "_">/<name>``;
3. on a miss, every ``<root>/configs/triton_*`` folder, newest version first,
   skipping the installed version's; the first holding ``<name>`` wins (it may
   be *newer* than the installed Triton);
4. no file: the up GEMM uses `default_config`; a missing ``_down`` file makes
   the down GEMM reuse the up config, without TMA.

The row used is the key nearest to M, separately in each file; the down row's
BLOCK_SIZE_M is then forced to the up row's (one sort feeds both GEMMs).
CUDA values are ported; ROCm's ``num_stages=2``, Marlin and deterministic mode are not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from moetune.engines.lookup import Lookup, engine_fallback_table, package_dir
from moetune.extract.filenames import sglang_config_filename

ENGINE = "sglang"
FOLLOWS = "sglang@02c7c97f"
FOLDER_ENV = "SGLANG_MOE_CONFIG_DIR"
# Where fused_moe_triton_config.py lives, newest layout first (its folder is SGLang's root).
PACKAGE_ROOTS = (
    ("srt", "layers", "moe", "moe_runner", "triton_utils"),
    ("srt", "layers", "moe", "fused_moe_triton"),
)
CONFIG_MODULE = "fused_moe_triton_config.py"


def default_config(
    M: int,
    E: int,
    N: int,
    K: int,
    topk: int,
    dtype: str | None,
    block_shape: Sequence[int] | None = None,
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


def package_root() -> Path | None:
    """The installed SGLang's config root (the folder holding fused_moe_triton_config.py)."""
    root = package_dir("sglang")
    if root is None:
        return None
    for parts in PACKAGE_ROOTS:
        folder = root.joinpath(*parts)
        if (folder / CONFIG_MODULE).is_file():
            return folder
    return root.joinpath(*PACKAGE_ROOTS[0])


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
    down: bool = False,
) -> str:
    return sglang_config_filename(E, N, device_name, dtype, block_shape, down=down)


def down_name(name: str) -> str:
    """``<name without .json>_down.json``."""
    return f"{name.removesuffix('.json')}_down.json"


def _version_key(folder: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in folder.removeprefix("triton_").split("_"))
    except ValueError:
        return None


def config_root(env: Mapping[str, str] | None = None, package: Path | None | str = "find"):
    """(root folder, how it was chosen) as SGLang picks it; root None when neither exists."""
    env = os.environ if env is None else env
    if env.get(FOLDER_ENV):
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
) -> Lookup:
    """Where SGLang looks for `name` and what it finds (`extra_dirs` are tried first, flat).

    `triton_version` is the installed Triton's (None: not installed, so the exact
    folder is unknown and only the version scan is shown).
    """
    root, how = config_root(env, package)
    candidates: list[tuple[Path, str | None]] = [(Path(d) / name, None) for d in extra_dirs]
    notes = [f"config root: {root} ({how})" if root else how]
    if triton_version is None:
        notes.append("triton is not installed: SGLang's first folder (triton_X_Y_Z) is unknown")
    if root is not None:
        configs = root / "configs"
        installed = triton_folder(triton_version) if triton_version else None
        if installed:
            candidates.append((configs / installed / name, installed))
        if configs.is_dir():
            others = []
            for entry in configs.iterdir():
                if not entry.name.startswith("triton_") or entry.name == installed:
                    continue
                key = _version_key(entry.name)
                if key is None:
                    notes.append(f"{entry.name}: not a version SGLang can sort (it would fail)")
                    continue
                others.append((key, entry.name))
            for _, folder in sorted(others, reverse=True):
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
) -> tuple[Lookup, Lookup]:
    """The up file and its ``_down`` twin, each looked up the same way."""
    up = lookup(name, triton_version, env=env, package=package, extra_dirs=extra_dirs)
    down_fallback = (
        "the down GEMM reuses the up config, without TMA"
        if up.present
        else "the down GEMM reuses the up config (SGLang's default), without TMA"
    )
    down = lookup(
        down_name(name),
        triton_version,
        env=env,
        package=package,
        extra_dirs=extra_dirs,
        fallback=down_fallback,
    )
    return up, down


# `default_config` at each batch size: what the engine runs with no tuned file.
fallback_table = partial(engine_fallback_table, default_config)
