"""The twin kernel's launch rules, which are vLLM 0.34.0's (`moetune.engines.launch.vllm_0_34`)
and, but for TMA-B (`use_tma_b`), 0.33.0's (`moetune.engines.launch.vllm_0_33` reuses them).

- expert assignment: the naive path (one block per token slot, no alignment) when
  ``M * top_k * 4 <= E``, except for int8/int4 w*a16 with a group;
- ``SWAP_AB``: fp8_w8a8 on compute capability 9.0 with a thin M tile and a wide N tile;
- TMA-B (0.34): block fp8's weights through a TMA descriptor on sm90/sm100 (`use_tma_b`);
- EM, the rows the grid covers (`grid_rows`);
- the kernel's ``compute_type`` and the GEMMs' output buffers (`ComputeRule`, `VLLM_COMPUTE`):
  activations that arrive as fp8/int8 (w8a8) compute in bf16 whatever the checkpoint's
  dtype, into buffers of the checkpoint's dtype;
- the operand and scale strides and the weight-block shape, passed as vLLM passes them
  (SGLang 0.5.23's launcher passes the operand strides, A's scale strides and the block
  shape alike; its weight-scale strides are its own).

Pure Python: the kernel and the engines' launchers read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.dtypes import DTYPES
from moetune.kernel.config import TMA_B_KEY

# Expert assignment skips alignment when each token slot is likely its own expert.
NAIVE_SPARSITY = 4


def naive_assignment(
    num_slots: int, num_experts: int, quant_dtype: str | None, block_shape: Any
) -> bool:
    """True when vLLM 0.33 runs this call on its naive (one block per slot) path.

    `num_slots` is M * top_k and `num_experts` the global expert count; the caller
    has no expert map (moetune tunes one rank's experts as the whole set).
    """
    grouped_weight_only = (
        quant_dtype in DTYPES.names("weight_only")
        and block_shape is not None
        and block_shape[1] > 0
    )
    return num_slots * NAIVE_SPARSITY <= num_experts and not grouped_weight_only


@dataclass(frozen=True)
class ComputeRule:
    """A release's ``compute_type`` (the dtype the kernel rounds its result to before the
    store) and the dtype of the GEMMs' output buffers, for a checkpoint whose activations
    are `checkpoint` (torch names: ``"bfloat16"``, ``"float16"``) and a GEMM in `quant_dtype`.

    The buffers (gate/up output, the activation, the down output) are the checkpoint's
    dtype in every release moetune launches; the compute type is too, except where the
    release sets `w8a8` for activations quantized to fp8/int8 before the GEMM.
    """

    w8a8: str | None = None  # compute_type where the GEMM reads 8-bit activations; None: as above

    def compute_dtype(self, quant_dtype: str | None, checkpoint: str) -> str:
        spec = DTYPES.get(quant_dtype)
        if self.w8a8 is not None and spec is not None and spec.quantizes_activations:
            return self.w8a8
        return checkpoint

    def buffer_dtype(self, quant_dtype: str | None, checkpoint: str) -> str:
        return checkpoint


# vLLM 0.33.0 and 0.34.0 (``TritonExperts.apply``, experts/triton_moe.py): ``compute_type``
# follows the dtype of the hidden states it receives, and w8a8 activations arrive quantized
# (fp8 or int8, quantized in the prepare step or at the top of ``apply``), which it maps to
# bf16, for both GEMMs; the workspaces are allocated in the unquantized hidden states' dtype
# (``workspace_dtype(in_dtype)``, modular_kernel.py). So an fp16 checkpoint's w8a8 GEMMs
# compute in bf16 and store into fp16. (The monolithic ``fused_experts_impl``, which maps
# fp16 to fp16, runs w8a8 only for Quark's static-scale int8, which moetune does not tune.)
VLLM_COMPUTE = ComputeRule(w8a8="bfloat16")


def dtype_name(dtype: Any) -> str:
    """A torch dtype's name without the module: ``torch.float16`` -> ``"float16"``."""
    return str(dtype).rpartition(".")[2]


def swap_ab(config: dict, quant_dtype: str | None, capability: tuple[int, int] | None) -> bool:
    """vLLM's ``enable_swap_ab``: fp8 on sm90 with a thin M tile and a wide N tile."""
    return (
        quant_dtype == "fp8_w8a8"
        and capability == (9, 0)
        and config["BLOCK_SIZE_M"] < 64
        and config["BLOCK_SIZE_N"] >= 64
    )


# Capability families whose launches take TMA-B (0.34's ``is_device_capability_family(90/100)``).
TMA_B_FAMILIES = (9, 10)


def use_tma_b(
    config: dict,
    quant_dtype: str | None,
    block_shape: Any,
    capability: tuple[int, int] | None,
    n: int,
    k: int,
    block_k: int,
    contiguous: bool = True,
) -> bool:
    """vLLM 0.34's ``use_tma_b``: the weights through a TMA descriptor.

    The entry's ``USE_TMA`` (default True) holds and the call is fp8_w8a8 with a block
    shape (both sides non-zero) on a CUDA device of capability family 9.x or 10.x, with
    B contiguous, ``N % BLOCK_SIZE_N == 0`` and ``K % BLOCK_SIZE_K == 0``. `capability`
    None is not a CUDA device (never TMA-B); `block_k` is BLOCK_SIZE_K after the clamp to
    the block; `contiguous` whether B is.
    """
    return (
        bool(config.get(TMA_B_KEY, True))
        and quant_dtype == "fp8_w8a8"
        and block_shape is not None
        and all(block_shape)
        and capability is not None
        and capability[0] in TMA_B_FAMILIES
        and contiguous
        and n % config["BLOCK_SIZE_N"] == 0
        and k % block_k == 0
    )


def grid_rows(sorted_token_ids: Any, num_slots: int, rows: int, top_k: int, block_m: int) -> int:
    """EM, the rows the grid covers, as vLLM 0.33 sizes it.

    Aligned: ``len(sorted_token_ids)``, capped at ``rows * top_k * block_m`` when A has
    fewer `rows` than `block_m` (every used row block holds a slot, so at most that many
    are used). Naive (`sorted_token_ids` None): one block per slot, ``num_slots * block_m``.
    """
    if sorted_token_ids is None:
        return num_slots * block_m
    em = sorted_token_ids.shape[0]
    if rows < block_m:
        em = min(em, rows * top_k * block_m)
    return em


def operand_strides(a: Any, w: Any) -> tuple[int, int, int, int, int]:
    """A ``[rows, K]`` by row and K, then W ``[E, N, K]`` by expert, K and N (the dot reads W^T)."""
    return a.stride(0), a.stride(1), w.stride(0), w.stride(2), w.stride(1)


def a_scale_strides(a_scale: Any) -> tuple[int, int]:
    """Activation scales by row and K group when 2-D (per token or per token group), else 0."""
    two_d = a_scale is not None and a_scale.ndim == 2
    return (a_scale.stride(0) if two_d else 0, a_scale.stride(1) if two_d else 0)


def w_scale_strides(w_scale: Any) -> tuple[int, int, int]:
    """Weight scales by expert, K group (3-D block scales) and out-channel (when there are
    several), else 0: vLLM's convention."""
    return (
        w_scale.stride(0) if w_scale is not None else 0,
        w_scale.stride(2) if w_scale is not None and w_scale.ndim == 3 else 0,
        w_scale.stride(1)
        if w_scale is not None and w_scale.ndim >= 2 and w_scale.shape[1] > 1
        else 0,
    )


def group_shape(block_shape: Any) -> tuple[int, int]:
    """(group_n, group_k) of block-quantized weights; (0, 0) without blocks."""
    return (0, 0) if block_shape is None else (block_shape[0], block_shape[1])
