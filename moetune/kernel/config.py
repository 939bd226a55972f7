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

from dataclasses import dataclass, replace
from typing import Any

from moetune.dtypes import DTYPES
from moetune.errors import TuneError

# The six keys of one batch-size entry in vLLM's and SGLang's tuned-config files, in their order.
CONFIG_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)


TILE_KEYS = CONFIG_KEYS[:3]
# vLLM 0.34's per-entry switch of its TMA-B weight loads (block fp8 on sm90/sm100): its
# launcher pops it with a default of true, so an entry carries it only when it is false.
TMA_B_KEY = "USE_TMA"
# The engines' fp8 kernels on sm90 swap A and B (SWAP_AB) for thin M tiles: BLOCK_SIZE_M 8 is legal there.
SWAP_AB_BLOCK_M = 8


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, order=True)
class Candidate:
    """One kernel config. Field names are the engines' JSON keys.

    Tiles are powers of two of at least 16 (``tl.arange`` and ``tl.dot``
    require it), but BLOCK_SIZE_M may be 8: the engines' fp8 kernels on sm90 swap
    A and B (``SWAP_AB``), which makes the token tile the dot's N (see
    `swap_ab_candidates`). `num_warps` is a power of two; anything else raises `TuneError`.

    ``USE_TMA`` is vLLM 0.34's TMA-B switch (`TMA_B_KEY`), true (its default) unless a
    tune timed it off: `as_config` then writes ``"USE_TMA": false`` and leaves the key
    out otherwise, so every other config reads and writes the six keys as before. It is
    not SGLang's ``USE_TMA`` (its split TMA layout: `moetune.kernel.probe.Probe`).
    """

    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int
    num_stages: int
    USE_TMA: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.USE_TMA, bool):
            raise TuneError(f"{TMA_B_KEY} must be true or false, got {self.USE_TMA!r}")
        for name in CONFIG_KEYS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TuneError(f"{name} must be a positive integer, got {value!r}")
        for name in TILE_KEYS:
            value = getattr(self, name)
            least = SWAP_AB_BLOCK_M if name == "BLOCK_SIZE_M" else 16
            if value < least or not _is_power_of_two(value):
                raise TuneError(f"{name} must be a power of two >= {least}, got {value}")
        if not _is_power_of_two(self.num_warps) or self.num_warps > 32:
            raise TuneError(f"num_warps must be 1, 2, 4, 8, 16 or 32, got {self.num_warps}")

    def as_config(self) -> dict[str, int]:
        """The engines' per-batch-size entry, keys in their usual order (``"USE_TMA": false``
        last where TMA-B is off)."""
        config: dict[str, int | bool] = {name: getattr(self, name) for name in CONFIG_KEYS}
        if not self.USE_TMA:
            config[TMA_B_KEY] = False
        return config

    @classmethod
    def from_config(cls, config: Any) -> Candidate:
        """Parse an engine entry: exactly the six keys, integer values, and optionally
        vLLM 0.34's ``USE_TMA`` (a bool)."""
        if not isinstance(config, dict):
            raise TuneError(
                f"a config must be a mapping of {', '.join(CONFIG_KEYS)}, got {config!r}"
            )
        missing = [name for name in CONFIG_KEYS if name not in config]
        unknown = sorted(set(config) - {*CONFIG_KEYS, TMA_B_KEY})
        if missing:
            raise TuneError(f"config {config} is missing {', '.join(missing)}")
        if unknown:
            raise TuneError(
                f"config {config} has unknown key(s) {', '.join(map(str, unknown))}; "
                f"expected {', '.join(CONFIG_KEYS)}"
            )
        return cls(
            **{name: config[name] for name in CONFIG_KEYS}, USE_TMA=config.get(TMA_B_KEY, True)
        )

    def short(self) -> str:
        """Compact label for tables and logs: ``M64 N128 K64 G16 w4 s3`` (`` TMA-B off``)."""
        return (
            f"M{self.BLOCK_SIZE_M} N{self.BLOCK_SIZE_N} K{self.BLOCK_SIZE_K} "
            f"G{self.GROUP_SIZE_M} w{self.num_warps} s{self.num_stages}"
        ) + ("" if self.USE_TMA else " TMA-B off")

    def with_tma_b(self, on: bool) -> Candidate:
        """This config with vLLM 0.34's TMA-B switch set to `on`."""
        return replace(self, USE_TMA=on)


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
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES.names())}")
    slots_per_expert = M * top_k / E
    spec = DTYPES[dtype]
    if spec.quantizes_activations:  # one byte per weight and activation: fp8's heuristic
        return _fp8_config(slots_per_expert, block_shape)
    if spec.gptq_awq:
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
