"""vLLM's fused-MoE config lookup and its fallback config, ported (no vLLM import).

Followed: vLLM ``main`` after PR #34846 "[Perf] Improve default triton fused moe
configs" (merged 2026-02), file ``vllm/model_executor/layers/fused_moe/fused_moe.py``:
``get_default_config``, ``get_moe_configs``, ``try_get_optimal_moe_config``. The
stored vllm@13cb3e44 predates #34846 (its fallback is the old ``M <= E`` pair);
the post-#34846 body is the one quoted line for line by vLLM PRs #47593
(2026-07-04: the fp8-block ``BLOCK_SIZE_M = 16 if M <= 64 else 64``) and #54741
(2026-09-01: ``BLOCK_SIZE_N = 64 if M <= 64 else 128``), both still open, so
neither changed it. The lookup (``get_moe_configs``) is unchanged by #34846 and
read at vllm@13cb3e44.

Lookup: ``$VLLM_TUNED_CONFIG_FOLDER/<name>``, then the package's
``model_executor/layers/fused_moe/configs/<name>``; the first that exists is
loaded whole (its ``triton_version`` key dropped) and the row whose key is
nearest to M is used. No file: ``get_default_config(M, E, N, K, topk, dtype,
block_shape)``. CUDA values are ported; ROCm's ``num_stages=2`` and the
batch-invariant mode are not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from moetune.engines.lookup import Lookup, engine_fallback_table, package_dir
from moetune.extract.filenames import vllm_config_filename

ENGINE = "vllm"
FOLLOWS = "vLLM main after PR #34846"
FOLDER_ENV = "VLLM_TUNED_CONFIG_FOLDER"
PACKAGE_CONFIGS = ("model_executor", "layers", "fused_moe", "configs")


def default_config(
    M: int,
    E: int,
    N: int,
    K: int,
    topk: int,
    dtype: str | None,
    block_shape: Sequence[int] | None = None,
) -> dict[str, int]:
    """vLLM's `get_default_config` on CUDA: the config used when no tuned file exists.

    `dtype` is vLLM's config dtype string (None for bf16/fp16, ``"fp8_w8a8"``,
    ``"int8_w8a16"``, ``"int4_w4a16"``...). The WNA16 branch (int4/int8 weights with
    a group `block_shape`) sets only BLOCK_SIZE_M/GROUP_SIZE_M: vLLM fills N/K later
    (`get_moe_wna16_block_config`), or runs its CUDA WNA16 kernel instead.
    """
    if dtype == "fp8_w8a8" and block_shape is not None:
        # Block quantization: tiles follow the block; small M tile for thin decode batches.
        return {
            "BLOCK_SIZE_M": 16 if M <= 64 else 64,
            "BLOCK_SIZE_N": block_shape[0],
            "BLOCK_SIZE_K": block_shape[1],
            "GROUP_SIZE_M": 1 if M <= 16 else 32,
            "SPLIT_K": 1,
            "num_warps": 4,
            "num_stages": 3,
        }
    if dtype in ("int4_w4a16", "int8_w8a16") and block_shape is not None:
        bit = 4 if dtype == "int4_w4a16" else 8
        if _wna16_uses_cuda(M * topk, block_shape[1], E, bit):
            return {"BLOCK_SIZE_M": min(16, M), "SPLIT_K": 1}
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


def _wna16_uses_cuda(num_valid_tokens: int, group_size: int, num_experts: int, bit: int) -> bool:
    # vLLM's should_moe_wna16_use_cuda, on a CUDA platform.
    return bit == 4 and group_size in (32, 64, 128) and num_valid_tokens / num_experts <= 6


def package_config_dir() -> Path | None:
    """``<installed vllm>/model_executor/layers/fused_moe/configs``, or None without vLLM."""
    root = package_dir("vllm")
    return None if root is None else root.joinpath(*PACKAGE_CONFIGS)


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
    if package_configs == "find":
        package_configs = package_config_dir()
    candidates: list[Path] = [Path(d) / name for d in extra_dirs]
    notes = []
    if env.get(FOLDER_ENV):
        candidates.append(Path(env[FOLDER_ENV]) / name)
    else:
        notes.append(f"${FOLDER_ENV} is not set")
    if package_configs is not None:
        candidates.append(Path(package_configs) / name)
    else:
        notes.append("vllm is not installed here: its own configs/ folder was not searched")
    found = next((path for path in candidates if path.is_file()), None)
    return Lookup(
        engine=ENGINE,
        file_name=name,
        searched=tuple(str(path) for path in candidates),
        found=found,
        fallback=f"its get_default_config ({FOLLOWS}, ported)",
        notes=tuple(notes),
    )


# `default_config` at each batch size: what the engine runs with no tuned file.
fallback_table = partial(engine_fallback_table, default_config)
