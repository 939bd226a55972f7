"""vLLM's fused-MoE config lookup and its fallback config, ported (no vLLM import).

Followed: vLLM 0.33.0 (read from its wheel), ``vllm/model_executor/layers/fused_moe/
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
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from moetune.dtypes import DTYPES
from moetune.engines.installed import InstalledEngine, find_installed
from moetune.engines.lookup import Block, Lookup, engine_fallback_table
from moetune.engines.names import vllm_config_filename

ENGINE = "vllm"
FOLLOWS = "vLLM 0.33.0"
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


def _batch_invariant(value: str | None) -> bool:
    try:
        return bool(int(value or "0"))
    except ValueError:
        return False


# `default_config` at each batch size: what the engine runs with no tuned file.
fallback_table = partial(engine_fallback_table, default_config)
