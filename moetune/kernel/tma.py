"""TMA (tensor memory accelerator) operands for the fused-MoE GEMM, and the split up/down configs.

SGLang runs the two GEMMs of a MoE layer with two configs: the tuned file
``E=..,N=..,device_name=...json`` for the up (gate/up) GEMM and ``..._down.json``
for the down GEMM. Either entry may carry ``"USE_TMA": true``:

- down: the up GEMM writes its output at the *sorted* position (expert-contiguous,
  each expert's run padded to BLOCK_SIZE_M: ``c_sorted``), and the down GEMM reads
  that A, and w2, through TMA descriptors. A row-block of A is then one contiguous
  [BLOCK_SIZE_M, BLOCK_SIZE_K] box;
- up (SGLang PR #33559): w1 through a TMA descriptor; A (the tokens) is still gathered.

One alignment serves both GEMMs, so both configs must have the same BLOCK_SIZE_M.
Without a down entry the down GEMM runs on the up config without TMA (SGLang:
``down_config or config``, its TMA flag popped from the down entry only).

Descriptors are host-side ``triton.tools.tensor_descriptor.TensorDescriptor`` objects,
as in SGLang: the descriptor travels as a kernel argument. SGLang ships USE_TMA for
bf16 (PR #34150) and block-quantized fp8 (its H200 DeepSeek files); its kernel asserts
block fp8 for the A descriptor in debug builds only. moetune accepts TMA for bf16,
fp16 and block fp8, and refuses the other quantizations with a one-line error.

Everything here but `make_descriptor` is pure Python, so the checks test on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moetune.errors import MoetuneError

if TYPE_CHECKING:
    import torch

TMA_KEY = "USE_TMA"
# A TMA box is at most 256 elements along each dimension; its inner dimension spans
# at least 16 bytes; strides (all but the last, which must be 1) and the base address
# are multiples of 16 bytes (CUDA's cuTensorMapEncodeTiled).
TMA_MAX_BOX = 256
TMA_ALIGN_BYTES = 16


class SplitConfigError(MoetuneError, ValueError):
    """An up/down config pair or a TMA request the kernel cannot run."""


@dataclass(frozen=True)
class SplitConfigs:
    """What `fused_experts` runs: the two GEMMs' configs (six keys each) and their TMA flags."""

    up: dict
    down: dict
    up_tma: bool
    down_tma: bool


def _tma_flag(config: dict, which: str) -> bool:
    flag = config.get(TMA_KEY, False)
    if not isinstance(flag, bool):
        raise SplitConfigError(f"{which} config {TMA_KEY} must be true or false, got {flag!r}")
    return flag


def split_configs(config: dict, down_config: dict | None) -> SplitConfigs:
    """Resolve an up config and an optional down config into what each GEMM runs with.

    ``down_config=None``: the down GEMM uses the up config's tile and no TMA (SGLang's
    ``down_config or config``). Raises `SplitConfigError` when the BLOCK_SIZE_Ms differ
    or a USE_TMA value is not a bool. The inputs are not modified.
    """
    up_tma = _tma_flag(config, "up")
    up = {key: value for key, value in config.items() if key != TMA_KEY}
    if down_config is None:
        return SplitConfigs(up=up, down=dict(up), up_tma=up_tma, down_tma=False)
    down_tma = _tma_flag(down_config, "down")
    down = {key: value for key, value in down_config.items() if key != TMA_KEY}
    if up.get("BLOCK_SIZE_M") != down.get("BLOCK_SIZE_M"):
        raise SplitConfigError(
            f"down config BLOCK_SIZE_M={down.get('BLOCK_SIZE_M')} differs from the up config's "
            f"{up.get('BLOCK_SIZE_M')}: one alignment serves both GEMMs, so they must be equal"
        )
    return SplitConfigs(up=up, down=down, up_tma=up_tma, down_tma=down_tma)


def tma_supported() -> bool:
    """True when the installed Triton has host-side tensor descriptors (SGLang's own test)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def check_tma_quant(quant_dtype: str | None, block_shape: Any) -> None:
    """Refuse TMA for quantizations SGLang does not run with it (one-line error)."""
    if quant_dtype is None or (quant_dtype == "fp8_w8a8" and block_shape is not None):
        return
    what = f"{quant_dtype} per-tensor" if quant_dtype == "fp8_w8a8" else quant_dtype
    raise SplitConfigError(
        f"USE_TMA is supported for bf16, fp16 and block-quantized fp8_w8a8, not {what}"
    )


def check_tma_request(quant_dtype: str | None, block_shape: Any) -> None:
    """`check_tma_quant`, and refuse TMA when this Triton has no tensor descriptors."""
    check_tma_quant(quant_dtype, block_shape)
    if not tma_supported():
        import triton

        raise SplitConfigError(
            f"USE_TMA needs triton.tools.tensor_descriptor, which Triton {triton.__version__} lacks"
        )


def check_tma_operand(
    name: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    element_bytes: int,
    data_ptr: int,
    block: tuple[int, ...],
) -> None:
    """Raise `SplitConfigError` unless a tensor and box satisfy TMA's alignment rules."""
    if strides[-1] != 1:
        raise SplitConfigError(f"TMA operand {name} must be contiguous in its last dimension")
    if data_ptr % TMA_ALIGN_BYTES:
        raise SplitConfigError(f"TMA operand {name} must start at a 16-byte aligned address")
    for dim, stride in enumerate(strides[:-1]):
        if (stride * element_bytes) % TMA_ALIGN_BYTES:
            raise SplitConfigError(
                f"TMA operand {name} {list(shape)}: stride {stride} of dimension {dim} is "
                f"{stride * element_bytes} bytes, not a multiple of 16"
            )
    for size in block:
        if size < 1 or size & (size - 1) or size > TMA_MAX_BOX:
            raise SplitConfigError(
                f"TMA box {list(block)} for {name}: every size must be a power of two <= 256"
            )
    if block[-1] * element_bytes < TMA_ALIGN_BYTES:
        raise SplitConfigError(
            f"TMA box {list(block)} for {name}: the inner size spans "
            f"{block[-1] * element_bytes} bytes, TMA needs at least 16"
        )


def make_descriptor(tensor: torch.Tensor, block: tuple[int, ...], name: str):
    """A host-side TMA descriptor of `tensor` with box `block`, after `check_tma_operand`."""
    if not tma_supported():
        check_tma_request(None, None)  # raises
    from triton.tools.tensor_descriptor import TensorDescriptor

    check_tma_operand(
        name,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.element_size(),
        tensor.data_ptr(),
        tuple(block),
    )
    _set_allocator_once(tensor)
    return TensorDescriptor(tensor, list(tensor.shape), list(tensor.stride()), list(block))


_ALLOCATOR_SET = False


def _set_allocator_once(tensor: torch.Tensor) -> None:
    """Give Triton a scratch allocator once per process (as SGLang does) for TMA kernels."""
    global _ALLOCATOR_SET
    if _ALLOCATOR_SET or tensor.device.type != "cuda":
        return
    import torch
    import triton

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, device=tensor.device, dtype=torch.int8)

    triton.set_allocator(alloc)
    _ALLOCATOR_SET = True
