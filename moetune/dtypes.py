"""What `moetune tune` can time and write files for: the one list everyone reads.

`moetune extract` (its quantization notes), `moetune tune` (`--dtype` choices,
`TuneProblem` checks) and the quantization rules (`extract/quant.py`: may tune
write this engine's file?) all read these tuples, so a new kernel path is
enabled in one place: add its dtype here once the kernel is checked against
`kernel/naive.py`.

Kernel dtypes are spelled as the engines spell them in file names
(``fp8_w8a8``, ``int4_w4a16``...); ``bf16``/``fp16`` are the unquantized kernel.
"""

from __future__ import annotations

# `--dtype` values `tune` accepts besides `auto`.
TUNE_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8_w8a8", "int8_w8a16")

# Of those, the ones tune can also run with per-output-channel weight scales and
# per-token activation scales (SGLang's `per_channel_quant=True` files).
TUNE_PER_CHANNEL_DTYPES: tuple[str, ...] = ()

# Of those, the ones tune can run with static (checkpoint) activation scales;
# the kernel computes activation scales on the fly otherwise.
TUNE_STATIC_ACTIVATION_DTYPES: tuple[str, ...] = ()

# Of those, the ones with block-quantized weights (`block_shape=[bn, bk]`).
TUNE_BLOCK_DTYPES: tuple[str, ...] = ("fp8_w8a8",)

# Of those, the weight-only ones tune can run with group-wise scales
# (`block_shape=[0, group_size]`, GPTQ/AWQ style); int8_w8a16 is per-channel today.
TUNE_GROUP_DTYPES: tuple[str, ...] = ()


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
    """What tune accepts, for messages: ``bf16, fp16, fp8_w8a8, int8_w8a16; fp8_w8a8 also block-quantized``."""
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
