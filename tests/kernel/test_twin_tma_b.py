"""vLLM's twin takes TMA-B where vLLM 0.34's launch takes it, and a tuned entry reads as 0.34
reads it (the twin times vLLM files where vLLM is not installed).

Launches are compared on meta tensors with the kernel replaced by a recorder, as
bench/sass_loop.py compiles them; whether the two compile to the same SASS is that script's
(bench/results/2026-12-06-sass-twin-034/), the TMA-B path's numbers `make test-gpu`'s.
"""

import importlib
import itertools

import pytest
import torch
from stand_ins import KernelRecorder  # tests/ is on sys.path

import moetune.kernel.fused_moe_kernel as twin
from moetune.engines.launch import vllm_0_34
from moetune.engines.launch.common import GemmCall
from moetune.kernel.fused_moe import fused_moe
from moetune.kernel.problem import make_problem

# The module (the package re-exports its function under the same name).
fused_moe_module = importlib.import_module("moetune.kernel.fused_moe")
E, K, M, TOP_K = 4, 256, 3, 2


def launch_args(n: int, config: dict, block_shape, contiguous: bool) -> dict:
    meta = dict(device="meta")
    fp8 = block_shape is not None
    element = torch.float8_e4m3fn if fp8 else torch.bfloat16
    w = torch.empty(E, n, K, dtype=element, **meta)
    if not contiguous:
        w = torch.empty(E, K, n, dtype=element, **meta).transpose(1, 2)
    return dict(
        a=torch.empty(M, K, dtype=element, **meta),
        w=w,
        c=torch.empty(M * TOP_K, n, dtype=torch.bfloat16, **meta),
        a_scale=torch.empty(M, K // 128, dtype=torch.float32, **meta) if fp8 else None,
        w_scale=torch.empty(E, -(-n // 128), K // 128, dtype=torch.float32, **meta)
        if fp8
        else None,
        topk_weights=None,
        sorted_token_ids=torch.empty(64, dtype=torch.int32, **meta),
        expert_ids=torch.empty(64 // config["BLOCK_SIZE_M"], dtype=torch.int32, **meta),
        num_tokens_post_padded=torch.empty(1, dtype=torch.int32, **meta),
        mul_routed_weight=False,
        top_k=TOP_K,
        config=config,
        quant_dtype="fp8_w8a8" if fp8 else None,
        block_shape=block_shape,
    )


def descriptor(arg) -> bool:
    return type(arg).__name__ == "TensorDescriptor"


CASES = list(
    itertools.product(
        [(9, 0), (10, 0), (8, 9)],  # capability
        [64, 128, 256],  # BLOCK_SIZE_N, against N = 256 and N = 192
        [256, 192],  # N
        [(128, 128), None],  # block fp8, bf16
        [None, False],  # the entry's USE_TMA: absent (on), off
        [True, False],  # B contiguous
    )
)


@pytest.mark.parametrize("capability, block_n, n, block_shape, use_tma, contiguous", CASES)
def test_the_twin_takes_tma_b_exactly_where_034_does(
    monkeypatch, capability, block_n, n, block_shape, use_tma, contiguous
):
    config = dict(
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4,
        num_stages=3, **({} if use_tma is None else {"USE_TMA": use_tma}),
    )  # fmt: skip
    launch = launch_args(n, config, block_shape, contiguous)
    engine = KernelRecorder()
    vllm_0_34.launch(engine, GemmCall(**launch), capability=capability)
    recorder = KernelRecorder()
    monkeypatch.setattr(twin, "fused_moe_kernel", recorder)
    monkeypatch.setattr(twin, "device_capability", lambda tensor: capability)
    twin.invoke_fused_moe_gemm(**launch, w_use_tma=None)
    taken = descriptor(engine.args[2])  # 0.34's b_desc
    assert descriptor(recorder.args[3]) is taken  # the twin's w_desc
    assert taken is (
        capability[0] in (9, 10)
        and block_shape is not None
        and use_tma is None
        and contiguous
        and n % block_n == 0
    )
    if taken:
        assert list(recorder.args[3].block_shape) == list(engine.args[2].block_shape)


def test_an_explicit_false_keeps_the_twin_off_tma_b(monkeypatch):
    config = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                  num_warps=4, num_stages=3)  # fmt: skip
    recorder = KernelRecorder()
    monkeypatch.setattr(twin, "fused_moe_kernel", recorder)
    monkeypatch.setattr(twin, "device_capability", lambda tensor: (9, 0))
    twin.invoke_fused_moe_gemm(**launch_args(256, config, (128, 128), True))  # default False
    assert recorder.args[3] is None


@pytest.mark.parametrize(
    "entry, down, expected",
    [
        ({}, None, [None, None]),  # vLLM 0.34's default: its launch decides, both GEMMs
        ({"USE_TMA": False}, None, [False, False]),  # written where off won
        ({}, {"USE_TMA": False}, [False, False]),  # a down config: SGLang's split layout
    ],
)
def test_fused_moe_reads_an_entry_for_the_twin_as_034_does(monkeypatch, entry, down, expected):
    seen = []
    real = fused_moe_module.invoke_fused_moe_gemm

    def spy(*args, **kwargs):
        seen.append(kwargs["w_use_tma"])
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_moe_module, "invoke_fused_moe_gemm", spy)
    problem = make_problem(5, 4, 128, 256, 2, "fp8_w8a8", block_shape=(128, 128), device="cpu")
    config = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                  num_warps=4, num_stages=2)  # fmt: skip
    down_config = None if down is None else {**config, **down}
    fused_moe(
        problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k,
        config={**config, **entry}, down_config=down_config, quant=problem.quant,
    )  # fmt: skip
    assert seen == expected
