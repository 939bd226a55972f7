"""vLLM's fused-MoE config lookup and its fallback config, ported (no vLLM import).

Followed: vLLM 0.33.0 and 0.34.0 (read from their wheels; 0.34 changed neither), ``vllm/model_executor/layers/fused_moe/
fused_moe.py``: ``get_config_file_name``, ``get_moe_configs``, ``get_default_config``,
``try_get_optimal_moe_config``.

Lookup: ``$VLLM_TUNED_CONFIG_FOLDER/<name>`` (set but empty: ``<name>`` in vLLM's
cwd), then the package's ``model_executor/layers/fused_moe/configs/<name>``; the
first that exists is loaded whole (its ``triton_version`` key dropped) and the
row whose key is nearest to M is used. E and N come from w2's shape, with N
doubled for int4_w4a16 (w2 packs two values a byte): int4 files are keyed on
the full N. No file: ``get_default_config(M, E, N, K, topk, dtype,
block_shape)``. ``$VLLM_BATCH_INVARIANT`` skips files altogether. CUDA values are
ported; ROCm's tiles and stages and the batch-invariant config are not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from moetune.dtypes import DTYPES
from moetune.engines.formats import DOWN_SUFFIX
from moetune.engines.installed import (
    RELEASES,
    InstalledEngine,
    current_release,
    find_installed,
    version_key,
)
from moetune.engines.lookup import Block, Lookup, engine_fallback_table
from moetune.engines.names import vllm_config_filename
from moetune.engines.tables import TunedConfigError, check_table, parse_json
from moetune.errors import MoetuneError
from moetune.fileio import read_input_bytes

ENGINE = "vllm"
# get_default_config and the lookup are the same in both releases moetune knows.
FOLLOWS = "vLLM 0.33.0 and 0.34.0"
FOLDER_ENV = "VLLM_TUNED_CONFIG_FOLDER"
# Set to a non-zero integer, vLLM skips tuned files (its batch-invariant mode).
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"


def default_config(
    M: int, E: int, N: int, K: int, topk: int, dtype: str | None, block_shape: Block = None
) -> dict[str, int]:
    """vLLM's `get_default_config` on CUDA: the config used when no tuned file exists.

    `dtype` is vLLM's config dtype string (None for bf16/fp16, ``"fp8_w8a8"``,
    ``"int8_w8a16"``, ``"int4_w4a16"``...). The WNA16 branch (int4/int8 weights with
    a group `block_shape`) sets only BLOCK_SIZE_M/GROUP_SIZE_M: vLLM fills N/K later
    (`get_moe_wna16_block_config`), or runs its CUDA WNA16 kernel instead.
    """
    if dtype == "fp8_w8a8" and block_shape is not None:
        # Block quantization: tiles follow the block; small M tile for thin decode batches,
        # and up to M = 8 a 64-wide N tile (when it divides the block) with a deeper
        # pipeline up to M = 4.
        thin = M <= 8 and block_shape[0] % 64 == 0
        return {
            "BLOCK_SIZE_M": 16 if M <= 64 else 64,
            "BLOCK_SIZE_N": 64 if thin else block_shape[0],
            "BLOCK_SIZE_K": block_shape[1],
            "GROUP_SIZE_M": 1 if M <= 16 else 32,
            "SPLIT_K": 1,
            "num_warps": 4,
            "num_stages": 4 if thin and M <= 4 else 3,
        }
    if dtype in DTYPES.names("weight_only") and block_shape is not None:
        bit = DTYPES[dtype].weight_bits
        if _wna16_uses_cuda(M * topk, block_shape[1], E, bit):
            return {"BLOCK_SIZE_M": min(16, _next_power_of_2(M)), "GROUP_SIZE_M": 1, "SPLIT_K": 1}
        block_m = 16 if M <= 20 else 32 if M <= 40 else 64
        return {"BLOCK_SIZE_M": block_m, "GROUP_SIZE_M": 1, "SPLIT_K": 1}
    # bf16/fp16, fp8 per tensor, and int8/int4 without a group block.
    if M <= 32:
        block_m = 16
    elif M <= 96:
        block_m = 32
    elif M <= 512:
        block_m = 64
    else:
        block_m = 128
    tokens_per_expert = M // max(E, 1)
    return {
        "BLOCK_SIZE_M": block_m,
        "BLOCK_SIZE_N": 64 if M <= 64 else 128,
        "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" or M <= 64 else 64,
        "GROUP_SIZE_M": 16 if tokens_per_expert > 128 else 1,
        "SPLIT_K": 1,
        "num_warps": 4 if M <= 128 else 8,
        "num_stages": 4 if M <= 32 else 3,
    }


def _next_power_of_2(n: int) -> int:
    power = 1
    while power < n:
        power *= 2
    return power


def _wna16_uses_cuda(num_valid_tokens: int, group_size: int, num_experts: int, bit: int) -> bool:
    # vLLM's should_moe_wna16_use_cuda, on a CUDA platform.
    return bit == 4 and group_size in (32, 64, 128) and num_valid_tokens / num_experts <= 6


def installed() -> InstalledEngine | None:
    """The vLLM on ``sys.path`` (found with `find_spec`, never imported), or None."""
    return find_installed(ENGINE)


def package_config_dir() -> Path | None:
    """``<installed vllm>/model_executor/layers/fused_moe/configs``, or None without vLLM."""
    found = installed()
    return None if found is None else found.configs_dir


def file_name(
    E: int, N: int, device_name: str, dtype: str | None, block_shape: Sequence[int] | None
) -> str:
    return vllm_config_filename(E, N, device_name, dtype, block_shape)


def lookup(
    name: str,
    *,
    env: Mapping[str, str] | None = None,
    package_configs: Path | None | str = "find",
    extra_dirs: Sequence[Path] = (),
) -> Lookup:
    """Where vLLM looks for `name` and what it finds (`extra_dirs` are tried first).

    `package_configs` defaults to the installed vLLM's folder (`find_spec`); tests pass
    a folder or None.
    """
    env = os.environ if env is None else env
    notes = []
    if package_configs == "find":
        engine = installed()
        package_configs = None if engine is None else engine.configs_dir
        if engine is not None and engine.note:
            notes.append(engine.note)
    candidates: list[Path] = [Path(d) / name for d in extra_dirs]
    # vLLM tests the variable against None: set but empty, it reads <name> from its cwd.
    if FOLDER_ENV in env:
        candidates.append(Path(env[FOLDER_ENV]) / name)
        if not env[FOLDER_ENV]:
            notes.append(f"${FOLDER_ENV} is set but empty: vLLM reads the file from its cwd")
    else:
        notes.append(f"${FOLDER_ENV} is not set")
    if package_configs is not None:
        candidates.append(Path(package_configs) / name)
    else:
        notes.append("vllm is not installed here: its own configs/ folder was not searched")
    if _batch_invariant(env.get(BATCH_INVARIANT_ENV)):
        notes.append(f"${BATCH_INVARIANT_ENV} is set: vLLM ignores tuned files and this lookup")
    found = next((path for path in candidates if path.is_file()), None)
    return Lookup(
        engine=ENGINE,
        file_name=name,
        searched=tuple(str(path) for path in candidates),
        found=found,
        fallback=f"its get_default_config ({FOLLOWS}, ported)",
        notes=tuple(notes),
    )


TMA_KEY = "USE_TMA"


def _release(release: str) -> Any:
    from moetune.engines.launch import release_module

    return release_module(ENGINE, release)


def target_release(
    choice: str | None = None, find: Callable[[str], Any] | None = None
) -> tuple[str, str | None]:
    """The vLLM release a vLLM file is written and checked for, and a note when it is not
    simply the installed one's.

    `choice` (``--vllm-release``) wins; else the installed vLLM (the known release it
    follows); else the newest release moetune knows, with a note saying so.
    """
    known = sorted(RELEASES[ENGINE], key=version_key)
    if choice is not None:
        if choice not in known:
            raise MoetuneError(
                f"--vllm-release {choice}: not a vLLM release moetune knows "
                f"(known: {', '.join(known)})"
            )
        return choice, None
    found = installed() if find is None else find(ENGINE)
    if found is None:
        newest, _ = current_release(ENGINE)
        return newest, (
            f"vLLM is not installed here: the vLLM file is for vLLM {newest}, the newest "
            "release moetune knows (--vllm-release chooses another)"
        )
    return found.release, None


def file_keys(release: str) -> frozenset[str]:
    """The keys of a tuned entry vLLM `release` accepts (others stop it at start-up)."""
    return _release(release).FILE_KEYS


def down_file_conditions(release: str) -> str | None:
    """When vLLM `release` runs the down GEMM on ``<name>_down.json``; None: never."""
    return _release(release).DOWN_FILE_CONDITIONS


def reads_down_file(release: str, dtype: str | None, block_shape: Block) -> bool:
    """Whether vLLM `release` looks up a ``_down.json`` for this dtype at all (fp8 block
    [128, 128]); whether it uses it depends on the serving path (`down_file_conditions`)."""
    module = _release(release)
    return (
        module.DOWN_FILE_CONDITIONS is not None
        and dtype == "fp8_w8a8"
        and block_shape is not None
        and tuple(block_shape) == module.DOWN_FILE_BLOCK
    )


def down_file_used(release: str, hidden_size: int) -> bool:
    """Whether vLLM `release` can run the down GEMM on a ``_down.json`` at this hidden size."""
    return hidden_size >= _release(release).DOWN_FILE_MIN_HIDDEN


def down_file_name(name: str) -> str:
    return name.removesuffix(".json") + DOWN_SUFFIX


def read_table_for(path: Path, release: str, *, down: bool = False) -> dict[int, dict]:
    """The vLLM tuned file at `path` as {batch size: entry}, checked as `release` reads it.

    An entry key the release does not accept is named with what it does at start-up and
    the fix; ``USE_TMA`` (0.34 on) must be a bool, and a ``_down`` table may hold guard
    entries of ``USE_TMA`` alone. Raises `TunedConfigError` (one line naming `path`).
    """
    try:
        payload = parse_json(read_input_bytes(path), str(path))
    except OSError as exc:
        raise TunedConfigError(
            f"{path}: cannot read a tuned config: {exc.strerror or exc}"
        ) from None
    if not isinstance(payload, dict):
        return check_table(payload, "vllm", str(path))  # raises: not a table
    accepted = file_keys(release)
    stripped: dict[str, Any] = {}
    for key, entry in payload.items():
        if not isinstance(entry, dict) or TMA_KEY not in entry:
            stripped[key] = entry
            continue
        if TMA_KEY not in accepted:
            raise TunedConfigError(
                f'{path}: batch size {key}: config "{TMA_KEY}": vLLM {release} passes every '
                "key of an entry to its kernel, so this file stops the server at start-up "
                f'(Triton: "Keyword argument {TMA_KEY} was specified but unrecognised"); '
                f"remove {TMA_KEY} from its entries, or run a vLLM that reads it (0.34.0 on)"
            )
        if not isinstance(entry[TMA_KEY], bool):
            raise TunedConfigError(
                f'{path}: batch size {key}: config "{TMA_KEY}": {entry[TMA_KEY]!r} is not '
                "true or false"
            )
        rest = {name: value for name, value in entry.items() if name != TMA_KEY}
        if rest or not down:
            stripped[key] = rest
    check_table(stripped, "vllm", str(path))
    return {int(key): entry for key, entry in payload.items() if key.isdigit()}


def _batch_invariant(value: str | None) -> bool:
    try:
        return bool(int(value or "0"))
    except ValueError:
        return False


# `default_config` at each batch size: what the engine runs with no tuned file.
fallback_table = partial(engine_fallback_table, default_config)
