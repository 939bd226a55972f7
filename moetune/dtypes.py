"""The kernel dtype strings moetune implements and tunes: the one list every layer reads.

`moetune extract` (its quantization notes), `moetune tune` (`--dtype` choices,
`TuneProblem` checks), the kernel (`make_problem`, `default_config`) and the
quantization rules all read these tuples, so a new kernel path is enabled in one
place once it is checked against `kernel/naive.py`. Plain data: no torch, no
triton.

The strings are the engines' own (``dtype=`` in vLLM's and SGLang's tuned-config
file names); "bf16"/"fp16" are the unquantized kernel, which the file names leave out.

| dtype | weights | activations into the GEMMs |
|---|---|---|
| ``bf16`` / ``fp16`` | unquantized | unquantized |
| ``fp8_w8a8`` | fp8 e4m3: per tensor, per output channel, or [bn, bk] blocks | fp8, dynamic: per tensor, per token, or per token group |
| ``int8_w8a8`` | int8, per output channel | int8, dynamic per token |
| ``int8_w8a16`` | int8, per output channel | unquantized |
| ``int4_w4a16`` | int4 packed two per byte along K, a scale (and optional zero point) per group of K | unquantized |
"""

from __future__ import annotations

from typing import Any

from moetune.errors import TuneError

UNQUANTIZED_DTYPES = ("bf16", "fp16")
QUANT_DTYPES = ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16")
# Every kernel dtype the kernel, the tuner and `--dtype` accept (besides "auto").
KERNEL_DTYPES = UNQUANTIZED_DTYPES + QUANT_DTYPES
# Dtypes whose weights may carry a per-output-channel scale with per-token activation scales.
PER_CHANNEL_DTYPES = ("fp8_w8a8", "int8_w8a8")
# Dtypes implemented per channel only (int8 w8a8 MoE checkpoints are per-channel in both engines).
ALWAYS_PER_CHANNEL_DTYPES = ("int8_w8a8",)
# Dtypes with group-wise weight scales along K (the engines' block_shape=[0, group_size]).
GROUP_QUANT_DTYPES = ("int4_w4a16",)
DEFAULT_INT4_GROUP_SIZE = 128
# Kernel revisions that change timings but not results, per dtype. The tuner's problem key
# carries them (`TuneProblem.key`), so a results store never resumes timings of an older
# kernel. int4 w4a16 rev 2: the kernel that compiles to vLLM's fused_moe_kernel_gptq_awq's SASS.
KERNEL_REVISIONS = {"int4_w4a16": 2}

# The names `extract` reads (what `moetune tune` can time and write files for).
# `--dtype` values `tune` accepts besides `auto`.
TUNE_DTYPES: tuple[str, ...] = KERNEL_DTYPES
# Of those, the ones tune can run with per-output-channel weight scales and per-token
# activation scales (SGLang's `per_channel_quant=True` files).
TUNE_PER_CHANNEL_DTYPES: tuple[str, ...] = PER_CHANNEL_DTYPES
# Of those, the ones tune can run with static (checkpoint) activation scales; the kernel
# computes activation scales on the fly, so none.
TUNE_STATIC_ACTIVATION_DTYPES: tuple[str, ...] = ()
# Of those, the ones with block-quantized weights (`block_shape=[bn, bk]`).
TUNE_BLOCK_DTYPES: tuple[str, ...] = ("fp8_w8a8",)
# Of those, the weight-only ones with group-wise scales (`block_shape=[0, group_size]`,
# GPTQ/AWQ style); int8_w8a16 is per-channel only.
TUNE_GROUP_DTYPES: tuple[str, ...] = GROUP_QUANT_DTYPES


def tune_accepts(
    dtype: str | None,
    *,
    per_channel: bool = False,
    static_activations: bool = False,
    block: bool = False,
    group: bool = False,
) -> bool:
    """Whether `moetune tune` can time this kernel variant (None: unquantized bf16)."""
    dtype = dtype or "bf16"
    return (
        dtype in TUNE_DTYPES
        and (not per_channel or dtype in TUNE_PER_CHANNEL_DTYPES)
        and (not static_activations or dtype in TUNE_STATIC_ACTIVATION_DTYPES)
        and (not block or dtype in TUNE_BLOCK_DTYPES)
        and (not group or dtype in TUNE_GROUP_DTYPES)
    )


def accepted_summary() -> str:
    """What tune accepts, for messages: ``bf16, fp16, ...; fp8_w8a8 also block-quantized...``."""
    text = ", ".join(TUNE_DTYPES)
    for dtypes, what in (
        (TUNE_BLOCK_DTYPES, "block-quantized"),
        (TUNE_GROUP_DTYPES, "with group scales"),
        (TUNE_PER_CHANNEL_DTYPES, "per-channel"),
        (TUNE_STATIC_ACTIVATION_DTYPES, "with static activation scales"),
    ):
        if dtypes:
            text += f"; {', '.join(dtypes)} also {what}"
    return text


def quant_details(options: dict[str, Any], kernel: Any, dtype: str) -> dict[str, Any]:
    """block_shape / per_channel / group_size / has_zp of the problem: the checkpoint's
    (as extract reports them), overridden by --per-channel-quant and --group-size.

    The engines' ``block_shape=[0, group_size]`` of weight-only group quantization
    becomes `group_size`; only a full ``[block_n, block_k]`` stays a block shape.
    """
    block = tuple(kernel.block_shape) if kernel.block_shape else None
    checkpoint_group = getattr(kernel, "group_size", None)
    if block is not None and not block[0]:
        checkpoint_group, block = block[1] or None, None
    group_size = options.get("group_size") or checkpoint_group
    if group_size is not None and dtype not in GROUP_QUANT_DTYPES:
        if options.get("group_size"):
            raise TuneError(f"--group-size applies to {', '.join(GROUP_QUANT_DTYPES)}, not {dtype}")
        group_size = None
    if dtype in GROUP_QUANT_DTYPES and group_size is None:
        group_size = DEFAULT_INT4_GROUP_SIZE
    per_channel = bool(options.get("per_channel_quant"))
    if per_channel and dtype not in PER_CHANNEL_DTYPES:
        raise TuneError(
            f"--per-channel-quant applies to {', '.join(PER_CHANNEL_DTYPES)}, not {dtype}"
        )
    per_channel = (
        per_channel
        or dtype in ALWAYS_PER_CHANNEL_DTYPES
        or (dtype in PER_CHANNEL_DTYPES and bool(getattr(kernel, "per_channel", False)))
    )
    zero_point = getattr(kernel, "has_zp", None) or getattr(kernel, "zero_point", None)
    has_zp = dtype in GROUP_QUANT_DTYPES and bool(zero_point)
    return dict(block_shape=block, per_channel=per_channel, group_size=group_size, has_zp=has_zp)
