"""Triton's CPU interpreter, made to compute bf16 right, for the engines' own kernels.

Under ``TRITON_INTERPRET=1`` (checked on Triton 3.9) the interpreter keeps bf16 values as
their raw uint16 bits, and three of its operations treat those bits as integers:

- ``tl.dot`` of bf16 operands multiplies the bit patterns (numpy ``matmul`` on uint16);
- an integer -> bf16 cast stores the integer's value as bits (``astype(uint16)``);
- an fp32 -> bf16 cast truncates the mantissa instead of rounding to nearest even.

moetune's twins work around all three inside the kernel (their ``INTERPRETER_BF16``
constexpr). The engines' kernels, compiled from the installed release's source, cannot
be changed, so without this a bf16 tune on vLLM's or SGLang's kernel fails every
candidate's check against the reference on a CPU. `patch_interpreter_bf16` corrects the
interpreter's two builder methods instead: bf16 dot operands are widened to fp32 (exact),
and every cast to bf16 goes through fp32 and rounds to nearest even, as the GPU does. It
changes nothing for other dtypes, and nothing at all outside the interpreter: compiled
kernels never reach these methods.
"""

from __future__ import annotations

from typing import Any

PATCHED = "_moetune_bf16"


def round_to_bf16_bits(values: Any) -> Any:
    """fp32 values (a numpy array) to bf16 bit patterns (uint16), round to nearest even;
    NaN stays NaN."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    return np.where(np.isnan(values), np.uint32(0x7FC0), rounded).astype(np.uint16)


def patch_interpreter_bf16() -> bool:
    """Correct the interpreter's bf16 dot and casts (once per process). Returns True when
    this call patched it, False when it was already patched."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, PATCHED, False):
        return False
    original_dot, original_cast = builder.create_dot, builder.cast_impl

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        source, target = src.dtype.scalar, dst_type.scalar
        if target == tl.bfloat16 and source != tl.bfloat16:
            wide = src if source == tl.float32 else original_cast(self, src, tl.float32)
            return interpreter.TensorHandle(round_to_bf16_bits(wide.data), tl.bfloat16)
        return original_cast(self, src, dst_type)

    def create_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        if a.dtype.scalar == tl.bfloat16:
            a = original_cast(self, a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = original_cast(self, b, tl.float32)
        return original_dot(self, a, b, d, *args)

    builder.cast_impl, builder.create_dot = cast_impl, create_dot
    setattr(builder, PATCHED, True)
    return True
