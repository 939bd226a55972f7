"""The config the fused-MoE kernel runs with when no tuned file covers the shape.

The heuristic reads the shape the way vLLM's published H200 files do
(``E=128,N=768``, ``E=128,N=384``, ``E=8,N=7168``): what matters is how many token
slots each expert gets, ``M * top_k / E``. Few slots per expert means a
weight-streaming GEMM (small ``BLOCK_SIZE_M``, a long ``BLOCK_SIZE_K`` so each
program moves a lot of weight bytes); many slots per expert means a
compute-bound GEMM (128 x 256 tiles, 8 warps), the shape every published bf16
file converges to from M = 1024 up; fp8 stops at 64 x 128 (`_fp8_config`). Block-quantized fp8 keeps ``BLOCK_SIZE_K`` a
divisor of the quantization block and ``BLOCK_SIZE_N`` at most its N size, as
vLLM's tuner requires, so the config also runs unchanged in vLLM. int8 w8a8 (one
byte per weight and activation) takes the fp8 heuristic; int4 w4a16 follows vLLM's
``moe_wna16`` Triton defaults (`_int4_config`).
"""

from __future__ import annotations

from moetune.dtypes import KERNEL_DTYPES

DTYPES = KERNEL_DTYPES

# The six keys of one batch-size entry in vLLM's and SGLang's tuned-config files, in their order.
CONFIG_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)


def _config(bm: int, bn: int, bk: int, group: int, warps: int, stages: int) -> dict:
    return dict(zip(CONFIG_KEYS, (bm, bn, bk, group, warps, stages), strict=True))


def default_config(
    M: int,
    E: int,
    N: int,
    K: int,
    top_k: int,
    dtype: str,
    block_shape: tuple[int, int] | None = None,
) -> dict:
    """A kernel config for M tokens, E experts, w1 ``[E, 2N, K]``, top-k routing and `dtype`.

    Returns exactly the six keys of a vLLM/SGLang tuned-config entry.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    slots_per_expert = M * top_k / E
    if dtype in ("fp8_w8a8", "int8_w8a8"):
        return _fp8_config(slots_per_expert, block_shape)
    if dtype == "int4_w4a16":
        return _int4_config(M)
    if slots_per_expert <= 8:
        return _config(16, 64 if E >= 64 else 128, 128, 1, 4, 4)
    if slots_per_expert <= 16:
        return _config(32, 128, 128, 16, 4, 3)
    if slots_per_expert <= 32:
        return _config(64, 128, 64 if E >= 64 else 128, 16, 4, 3)
    return _config(128, 256, 64, 16, 8, 4)


def _fp8_config(slots_per_expert: float, block_shape: tuple[int, int] | None) -> dict:
    """fp8 weights: one byte per element, so a 128-deep K step moves what 64 moves in bf16.

    vLLM's published H200 fp8 files (E=256,N=256 and E=128,N=384 block [128,128];
    E=128,N=1024 per tensor) never go past 64 x 128 tiles with 4 warps: the
    block-scaled K loop keeps a second fp32 tile live (each step's dot before it is
    scaled), and a 128 x 128 tile with 8 warps already needs all 255 registers
    (ptxas, sm_90).
    """
    if slots_per_expert <= 16:
        config = _config(16, 128 if block_shape is not None else 64, 128, 1, 4, 4)
    else:
        config = _config(64, 128, 128, 16, 4, 3)
    if block_shape is not None:
        bn, bk = block_shape
        config["BLOCK_SIZE_K"] = min(config["BLOCK_SIZE_K"], bk)
        config["BLOCK_SIZE_N"] = min(config["BLOCK_SIZE_N"], bn)
    return config


def _int4_config(M: int) -> dict:
    """int4 w4a16: vLLM's defaults for its ``moe_wna16`` Triton kernel.

    vLLM's `get_default_config` picks only BLOCK_SIZE_M (16 up to 20 tokens, 32 up
    to 40, else 64; GROUP_SIZE_M 1) and `get_moe_wna16_block_config` the rest:
    BLOCK_SIZE_N 32 and BLOCK_SIZE_K 64 for one token, else 64 and 32 (4 warps,
    Triton's default 3 stages). Any group size works with these: the kernel
    gathers a scale per K element.
    """
    bm = 16 if M <= 20 else 32 if M <= 40 else 64
    bn, bk = (32, 64) if M == 1 else (64, 32)
    return _config(bm, bn, bk, 1, 4, 3)
