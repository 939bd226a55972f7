"""The dtype the fused-MoE kernel runs in for a checkpoint and a `--dtype`.

`resolve_kernel_dtype` reads the checkpoint's quantization (`moetune.extract.quant`)
or the user's `--dtype` and gives a `KernelDtype`: the dtype string and block shape
the engines' file names carry (`moetune.engines.names` spells those names), the
activations' dtype and the scale layout. It lives in extract/ because only
extraction asks it; engines/ below it never needs the checkpoint's quantization.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moetune.dtypes import DTYPES, accepted_summary, tune_accepts
from moetune.engines.names import DTYPE_CHOICES
from moetune.errors import MoetuneError

if TYPE_CHECKING:
    from moetune.extract.quant import QuantInfo
    from moetune.extract.shape import MoEShape

# The unquantized kernel dtypes by name and by torch name, to the activations' torch name.
UNQUANTIZED = {
    alias: spec.activation_dtype
    for spec in DTYPES
    if not spec.quantized
    for alias in (spec.name, spec.activation_dtype)
}


@dataclass(frozen=True)
class KernelDtype:
    """The dtype the fused-MoE kernel runs in, as the engines' file names spell it.

    `engine_dtype` is the file-name string (``"fp8_w8a8"``...) or None for
    unquantized bf16/fp16; `activation_dtype` is the torch dtype name of the
    activations (``"bfloat16"``/``"float16"``); `block_shape` is the block shape
    the engines pass: the fp8 weight block ``(block_n, block_k)``, or
    ``(0, group_size)`` for int4/int8 weight-only kernels, or None; `per_channel`
    marks per-channel weight / per-token activation scales (SGLang's
    ``per_channel_quant``), `static_activations` activation scales stored in the
    checkpoint; `reason` says where the choice came from.
    """

    engine_dtype: str | None
    activation_dtype: str
    block_shape: tuple[int, int] | None
    reason: str
    note: str | None = None
    per_channel: bool = False
    static_activations: bool = False
    label: str | None = None  # the checkpoint's quantization scheme, when auto found one

    @property
    def name(self) -> str:
        """The kernel dtype in one word: the file-name dtype, else ``bf16`` or ``fp16``."""
        return self.engine_dtype or DTYPES.unquantized(self.activation_dtype).name

    def variant(self) -> str:
        """``int4_w4a16 group 128``, ``fp8_w8a8 per-channel``, ``bf16``..."""
        text = self.name
        block = self.block_shape
        if block and all(block):
            text += f" block {list(block)}"
        elif block and block[1]:
            text += f" group {block[1]}"
        if self.per_channel:
            text += " per-channel"
        if self.static_activations:
            text += " static activation scales"
        return text

    def tune_refusal(self) -> str | None:
        """Why `moetune tune` cannot time this kernel (naming what it accepts), or None."""
        if tune_accepts(
            self.engine_dtype,
            per_channel=self.per_channel,
            static_activations=self.static_activations,
            block_shape=self.block_shape,
        ):
            return None
        source = f" ({self.label})" if self.label else ""
        return (
            f"moetune tune cannot time {self.variant()}{source} yet; --dtype accepts "
            f"{accepted_summary()} ('moetune extract' names the engines' files)"
        )


def resolve_kernel_dtype(
    shape: MoEShape, requested: str = "auto", quant: QuantInfo | None = None
) -> KernelDtype:
    """Pick the kernel dtype from the checkpoint (``auto``) or the user's `--dtype`.

    With `quant` (see `moetune.extract.quant.detect_quantization`) ``auto``
    follows the scheme of the group that covers the routed experts: GPTQ/AWQ
    and compressed-tensors W4A16 -> ``int4_w4a16`` ``(0, group_size)``, W8A8
    int8 -> ``int8_w8a8`` per-channel, FP8-dynamic per-channel, fp8 block...
    Checkpoints whose experts run on kernels that read no tuned config (MXFP4,
    NVFP4) keep the unquantized names and say so. Without `quant`, ``auto``
    only knows ``quant_method: fp8``.
    """
    activation = DTYPES.unquantized(shape.dtype).activation_dtype
    if requested in UNQUANTIZED:
        return KernelDtype(None, UNQUANTIZED[requested], None, f"--dtype {requested}")
    spec = DTYPES.get(requested)
    if spec is not None and spec.quantized:
        # The checkpoint's own group of that dtype (mixed precision: any expert group)
        # brings its block/group shape and scale layout.
        groups = quant.expert_groups if quant is not None else ()
        match = next((g for g in groups if g.dtype == requested), None)
        if match is not None:
            return KernelDtype(
                requested,
                activation,
                match.block_shape,
                f"--dtype {requested}",
                per_channel=match.per_channel,
                static_activations=match.static_activations,
                label=match.label,
            )
        block = shape.weight_block_size if spec.block_quant else None
        return KernelDtype(requested, activation, block, f"--dtype {requested}")
    if requested != "auto":
        raise MoetuneError(
            f"unknown dtype {requested!r}; choose one of: {', '.join(DTYPE_CHOICES)}"
        )
    if quant is not None:
        return _auto_from_quant(quant, activation, shape.dtype)
    method = shape.quant_method
    if method is None:
        return KernelDtype(None, activation, None, f"checkpoint dtype {shape.dtype or 'unset'}")
    if method == "fp8":
        return KernelDtype(
            "fp8_w8a8", activation, shape.weight_block_size, "checkpoint quant_method fp8"
        )
    return KernelDtype(
        None,
        activation,
        None,
        f"checkpoint quant_method {method}",
        note=(
            f"quant_method {method!r}: no rule in quant_rules.yaml names its kernel; the "
            "names shown are the unquantized kernel's. "
            f"Pass --dtype ({', '.join(DTYPES.quantized())}) to name another."
        ),
    )


def _auto_from_quant(
    quant: QuantInfo, activation: str, checkpoint_dtype: str | None
) -> KernelDtype:
    experts = quant.experts
    method = quant.method or "unknown"
    if experts is None:
        return KernelDtype(
            None,
            activation,
            None,
            f"checkpoint dtype {checkpoint_dtype or 'unset'} (quant_method {method} leaves the experts out)",
        )
    reason = f"checkpoint quant_method {method}: {experts.label}"
    if experts.dtype is None:
        vllm, sglang = experts.engines.get("vllm"), experts.engines.get("sglang")
        served = (
            f"vLLM runs {vllm.kernel}, SGLang {sglang.kernel}"
            if vllm and sglang
            else "no moetune rule names the kernel"
        )
        return KernelDtype(
            None,
            activation,
            None,
            reason,
            note=(
                f"quant_method {method!r} ({experts.label}): no Triton config file; {served}. "
                "The names shown are the unquantized kernel's (what --dtype bf16 tunes). "
                f"Pass --dtype ({', '.join(DTYPES.quantized())}) to name another."
            ),
            label=experts.label,
        )
    return KernelDtype(
        experts.dtype,
        activation,
        experts.block_shape,
        reason,
        per_channel=experts.per_channel,
        static_activations=experts.static_activations,
        label=experts.label,
    )
