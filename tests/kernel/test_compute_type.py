"""fp16 checkpoints with w8a8 weights: each engine's compute type and buffers, on the twins.

vLLM 0.33 and 0.34 (``TritonExperts``) compute an fp16 checkpoint's fp8/int8 w8a8 GEMMs in
bf16 and store them into the checkpoint's fp16 buffers; SGLang 0.5.23 computes them in
fp16 (`moetune.kernel.launch_rules.ComputeRule`, each release module's ``COMPUTE``). The
twin of vLLM's kernel follows vLLM: its fp16 outputs are bf16 values. The launches are
compared on meta tensors (the constexprs that make the compiled kernel); the numbers run
under Triton's interpreter on the CPU (bf16's quirks there are the kernel's to work
around), against the reference, which rounds where the kernel rounds; on a GPU
(MOETUNE_GPU_TESTS=1) compiled.
"""

import os

import pytest
import torch
import triton.language as tl

import moetune.kernel.fused_moe_kernel as twin
from moetune.engines.launch import EngineGemm, sglang_0_5_23, twin_ref, vllm_0_33, vllm_0_34
from moetune.engines.launch.common import GemmCall
from moetune.kernel.align import align_block_size
from moetune.kernel.fused_moe import fused_moe, gemm_compute_dtype
from moetune.kernel.naive import naive_fused_moe
from moetune.kernel.problem import make_problem
from moetune.tune.measure.verify import compare

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"
CONFIG = dict(
    BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2
)
# (dtype, block shape, per channel): every w8a8 layout moetune tunes
W8A8 = [
    ("fp8_w8a8", None, False),
    ("fp8_w8a8", (32, 32), False),
    ("fp8_w8a8", None, True),
    ("int8_w8a8", None, True),
]
W8A8_IDS = ["fp8-tensor", "fp8-block", "fp8-channel", "int8-channel"]


@pytest.mark.parametrize(
    "module, quant_dtype, checkpoint, compute",
    [
        (vllm_0_33, "fp8_w8a8", "float16", "bfloat16"),
        (vllm_0_33, "int8_w8a8", "float16", "bfloat16"),
        (vllm_0_33, "fp8_w8a8", "bfloat16", "bfloat16"),
        (vllm_0_33, None, "float16", "float16"),
        (vllm_0_33, "int8_w8a16", "float16", "float16"),  # 16-bit activations: the checkpoint's
        (vllm_0_34, "fp8_w8a8", "float16", "bfloat16"),
        (vllm_0_34, "int8_w8a8", "float16", "bfloat16"),
        (sglang_0_5_23, "fp8_w8a8", "float16", "float16"),
        (sglang_0_5_23, "int8_w8a8", "float16", "float16"),
        (sglang_0_5_23, "fp8_w8a8", "bfloat16", "bfloat16"),
    ],
)
def test_each_release_declares_its_compute_type(module, quant_dtype, checkpoint, compute):
    assert module.COMPUTE.compute_dtype(quant_dtype, checkpoint) == compute
    assert module.COMPUTE.buffer_dtype(quant_dtype, checkpoint) == checkpoint


class Capture:
    """Stands for a Triton kernel: records ``kernel[grid](*args, **kwargs)``."""

    def __init__(self) -> None:
        self.calls = []

    def __getitem__(self, grid):  # noqa: ANN001, ANN204
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def meta_call(quant_dtype, block_shape, per_channel, checkpoint) -> dict:  # noqa: ANN001
    """One up GEMM's `invoke_fused_moe_gemm` arguments on meta tensors, C in `checkpoint`."""
    E, N, K, rows, top_k, bm = 8, 64, 128, 4, 2, CONFIG["BLOCK_SIZE_M"]
    meta = dict(device="meta")
    c_dtype = getattr(torch, checkpoint)
    element = {"fp8_w8a8": torch.float8_e4m3fn, "int8_w8a8": torch.int8}.get(quant_dtype, c_dtype)
    f32 = dict(dtype=torch.float32, **meta)
    a_scale = w_scale = None
    if block_shape is not None:
        a_scale, w_scale = (
            torch.empty(rows, K // 32, **f32),
            torch.empty(E, N // 32, K // 32, **f32),
        )
    elif per_channel:
        a_scale, w_scale = torch.empty(rows, 1, **f32), torch.empty(E, N, **f32)
    elif quant_dtype is not None:
        a_scale, w_scale = torch.empty(1, **f32), torch.empty(E, **f32)
    padded = rows * top_k + E * (bm - 1)
    return dict(
        a=torch.empty(rows, K, dtype=element, **meta),
        w=torch.empty(E, N, K, dtype=element, **meta),
        c=torch.empty(rows * top_k, N, dtype=c_dtype, **meta),
        a_scale=a_scale,
        w_scale=w_scale,
        topk_weights=None,
        sorted_token_ids=torch.empty(padded, dtype=torch.int32, **meta),
        expert_ids=torch.empty(padded // bm, dtype=torch.int32, **meta),
        num_tokens_post_padded=torch.empty(1, dtype=torch.int32, **meta),
        mul_routed_weight=False,
        top_k=top_k,
        config=dict(CONFIG),
        quant_dtype=quant_dtype,
        block_shape=block_shape,
        per_channel=per_channel,
    )


def launched(module, call: dict):  # noqa: ANN001, ANN201
    """(compute_type, C's dtype) as `module`'s launch passes them to its kernel."""
    kernel = Capture()
    module.launch(kernel, GemmCall(**call), None)
    _, args, kwargs = kernel.calls[0]
    c = next(arg for arg in args if isinstance(arg, torch.Tensor) and arg.shape[-1] == 64)
    return kwargs["compute_type"], c.dtype


def twin_launched(monkeypatch, call: dict):  # noqa: ANN001, ANN201
    kernel = Capture()
    monkeypatch.setattr(twin, "fused_moe_kernel", kernel)
    twin.invoke_fused_moe_gemm(**call)
    _, args, kwargs = kernel.calls[0]
    return kwargs["COMPUTE_TYPE"], args[4].dtype  # c_ptr


@pytest.mark.parametrize("checkpoint", ["float16", "bfloat16"])
@pytest.mark.parametrize("quant", [*W8A8, (None, None, False)], ids=[*W8A8_IDS, "unquantized"])
def test_vllms_launches_and_the_twin_compute_in_bf16_for_w8a8_and_sglang_in_the_checkpoints(
    monkeypatch, quant, checkpoint
):
    call = meta_call(*quant, checkpoint)
    buffers = getattr(torch, checkpoint)
    w8a8 = quant[0] is not None
    vllm = tl.bfloat16 if w8a8 else getattr(tl, checkpoint)
    assert launched(vllm_0_33, call) == (vllm, buffers)
    assert launched(vllm_0_34, call) == (vllm, buffers)
    assert twin_launched(monkeypatch, call) == (vllm, buffers)
    assert launched(sglang_0_5_23, call) == (getattr(tl, checkpoint), buffers)


def on_bf16_grid(values: torch.Tensor) -> bool:
    return torch.equal(values.to(torch.bfloat16).to(values.dtype), values)


@pytest.mark.parametrize("quant", W8A8, ids=W8A8_IDS)
def test_the_vllm_twin_stores_bf16_values_in_fp16_and_the_sglang_twin_fp16_ones(quant):
    dtype, block_shape, per_channel = quant
    p = make_problem(
        24, 4, 64, 64, 2, dtype, block_shape, device=DEVICE, seed=7, per_channel=per_channel,
        checkpoint_dtype="float16",
    )  # fmt: skip
    assert p.x.dtype == torch.float16
    from moetune.kernel.fused_moe import quantize_activation

    a, a_scale = quantize_activation(p.x, p.quant)
    ids = torch.randint(0, 4, (24, 2), generator=torch.Generator().manual_seed(1))
    ids = ids.to(torch.int32).to(DEVICE)
    sorted_ids, expert_ids, post_padded = align_block_size(ids, CONFIG["BLOCK_SIZE_M"], 4)
    launch = dict(
        a_scale=a_scale, w_scale=p.quant.w1_scale, topk_weights=None,
        sorted_token_ids=sorted_ids, expert_ids=expert_ids, num_tokens_post_padded=post_padded,
        mul_routed_weight=False, top_k=2, config=dict(CONFIG), quant_dtype=dtype,
        block_shape=block_shape, per_channel=per_channel,
    )  # fmt: skip
    vllm_out = torch.zeros(48, 128, dtype=torch.float16, device=DEVICE)
    twin.invoke_fused_moe_gemm(a, p.w1, vllm_out, **launch)
    sglang_out = torch.zeros(48, 128, dtype=torch.float16, device=DEVICE)
    EngineGemm(twin_ref("sglang"))(a, p.w1, sglang_out, **launch)
    assert vllm_out.abs().sum() > 0 and on_bf16_grid(vllm_out)
    assert not on_bf16_grid(sglang_out)
    # Both are the same product, rounded differently: within bf16's rounding of each other.
    torch.testing.assert_close(vllm_out, sglang_out, rtol=2**-8, atol=1e-3)


@pytest.mark.parametrize("quant", W8A8, ids=W8A8_IDS)
def test_an_fp16_checkpoints_w8a8_layer_matches_the_reference_on_both_twins(quant):
    dtype, block_shape, per_channel = quant
    p = make_problem(
        17, 4, 32, 64, 2, dtype, block_shape, device=DEVICE, seed=3, per_channel=per_channel,
        checkpoint_dtype="float16",
    )  # fmt: skip
    args = (p.x, p.w1, p.w2, p.router_logits, 2)
    for gemm, compute in ((None, torch.bfloat16), (EngineGemm(twin_ref("sglang")), torch.float16)):
        assert gemm_compute_dtype(p.x, p.quant, gemm) == compute
        out = fused_moe(*args, config=dict(CONFIG), quant=p.quant, gemm=gemm)
        assert out.dtype == torch.float16
        ref = naive_fused_moe(*args, quant=p.quant, compute_dtype=compute)
        # The reference rounds the gate/up output where the kernel does: what is left is
        # the down GEMM's rounding, well under the w8a8 tolerance (6e-2).
        result = compare(out, ref, dtype)
        assert result.ok and result.rel_rms < 5e-3, (gemm, result)
