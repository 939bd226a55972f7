"""The whole fused_moe call (routing -> alignment -> GEMM1 -> SiLU-and-mul -> GEMM2 -> sum)
against naive_fused_moe, the float32 reference, on every dtype path.

CPU: Triton's interpreter, small shapes. GPU (MOETUNE_GPU_TESTS=1): the same cases
compiled, plus real model shapes at M = 1 and 4096, and CUDA-graph capture.
"""

import importlib
import os

import pytest
import torch

from moetune.kernel.compare import assert_close, compare
from moetune.kernel.config import default_config
from moetune.kernel.fused_moe import fused_experts, fused_moe
from moetune.kernel.naive import naive_fused_experts, naive_fused_moe, naive_routing
from moetune.kernel.problem import make_problem

GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"
DEVICE = "cuda" if GPU else "cpu"

# (M, E, top_k, N, K)
SHAPES = [
    (1, 8, 2, 32, 64),  # decode: one token
    (7, 13, 3, 48, 80),  # odd M, prime E, N and K not multiples of the tiles
    (5, 4, 4, 32, 64),  # top_k = E: every expert gets every token
    (3, 32, 2, 16, 32),  # M < E: most experts get no token
    (33, 5, 1, 40, 96),  # top-1; M*top_k > BLOCK_SIZE_M: several blocks per expert
]
# Real shapes (GPU only): E, top_k, K, N of vLLM's TP shards, at M = 1 and 4096.
REAL = [
    ("qwen3-30b-a3b-tp1", 128, 8, 2048, 768, "bf16", None),
    ("mixtral-8x7b-tp2", 8, 2, 4096, 7168, "bf16", None),
    ("deepseek-v3-tp8", 256, 8, 7168, 256, "fp8_w8a8", (128, 128)),
    ("qwen3-30b-a3b-tp1", 128, 8, 2048, 768, "fp16", None),
    ("qwen3-30b-a3b-tp1", 128, 8, 2048, 768, "fp8_w8a8", None),
    ("qwen3-30b-a3b-tp1", 128, 8, 2048, 768, "int8_w8a16", None),
]

# Allowed rel. RMS error against the fp32 reference. The reference rounds the
# intermediate to x's dtype and quantizes activations exactly as the kernel path
# does, so what is left is accumulation order and the bf16/fp16 roundings of the
# GEMM outputs and of the sum; with fp8 a rounding difference in the intermediate
# can also flip an fp8 value to its neighbour (an eighth or a sixteenth of it).
# Under the interpreter the glue kernels' fp32 -> bf16 casts truncate (Triton 3.9,
# see fused_moe_kernel's docstring). Measured on these shapes (interpreter):
# fp16 <= 3.5e-4, bf16 <= 6.5e-3, int8 <= 6.8e-3, fp8 <= 2.0e-2; with rounding
# glue casts all bf16-based paths were <= 2.7e-3. Tolerances: about 2x measured.
DTYPES = [
    pytest.param("fp16", None, 1e-3, id="fp16"),
    pytest.param("bf16", None, 1.5e-2, id="bf16"),
    pytest.param("fp8_w8a8", None, 4e-2, id="fp8"),
    pytest.param("fp8_w8a8", (128, 128), 4e-2, id="fp8-block128"),
    pytest.param("int8_w8a16", None, 1.5e-2, id="int8w8a16"),
]


def shape_id(shape):
    return "M{}-E{}-top{}-N{}-K{}".format(*shape)


@pytest.mark.parametrize("dtype,block_shape,tol", DTYPES)
@pytest.mark.parametrize("M,E,top_k,N,K", [pytest.param(*s, id=shape_id(s)) for s in SHAPES])
def test_fused_moe_matches_reference(M, E, top_k, N, K, dtype, block_shape, tol, poison_empty):
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=M * E)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(*args, quant=problem.quant)
    assert out.shape == (M, K) and out.dtype == problem.x.dtype
    ref = naive_fused_moe(*args, quant=problem.quant)
    assert_close(f"fused_moe {dtype}", ref, out, tol)


@pytest.mark.parametrize("renormalize", [True, False])
def test_renormalize_is_passed_through(renormalize):
    problem = make_problem(6, 8, 32, 64, 3, "fp16", device=DEVICE, seed=1)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(*args, renormalize=renormalize)
    assert_close("renormalize", naive_fused_moe(*args, renormalize=renormalize), out, 1e-3)


def test_explicit_configs_agree():
    """Two very different tilings of the same problem give the same numbers."""
    problem = make_problem(9, 6, 48, 64, 2, "fp16", device=DEVICE, seed=2)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    small = dict(
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=1, num_warps=4, num_stages=2
    )
    large = dict(
        BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=3
    )
    ref = naive_fused_moe(*args)
    assert_close("small tiles", ref, fused_moe(*args, config=small), 1e-3)
    assert_close("large tiles", ref, fused_moe(*args, config=large), 1e-3)


@pytest.mark.parametrize(
    "dtype,block_shape", [("fp16", None), ("fp8_w8a8", None), ("fp8_w8a8", (128, 128))]
)
def test_slots_of_other_ranks_add_nothing(dtype, block_shape, poison_empty):
    """Expert parallelism: ids -1 or >= E belong to another rank and must contribute zero,
    also to the per-tensor activation scale."""
    M, E, top_k, N, K = 8, 6, 3, 32, 64
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=3)
    weights, ids = naive_routing(problem.router_logits, top_k)
    ids[0] = -1  # a token with no local expert at all
    ids[2, 1] = E
    ids[5, 0] = E + 7
    out = fused_experts(
        problem.x,
        problem.w1,
        problem.w2,
        weights,
        ids,
        quant=problem.quant,
        ids_may_be_nonlocal=True,
    )
    ref = naive_fused_experts(problem.x, problem.w1, problem.w2, weights, ids, quant=problem.quant)
    assert (out[0] == 0).all(), "a token routed only to other ranks must give zeros"
    assert_close(f"expert parallel {dtype}", ref, out, 1e-3 if dtype == "fp16" else 4e-2)


def test_naive_reference_matches_a_dense_formula():
    """The reference itself, against a per-token formula with no gathering (fp16, no rounding to emulate
    beyond the intermediate's)."""
    M, E, top_k, N, K = 4, 5, 2, 8, 16
    problem = make_problem(M, E, N, K, top_k, "fp16", device="cpu", seed=4)
    weights, ids = naive_routing(problem.router_logits, top_k)
    rows = []
    for t in range(M):
        acc = torch.zeros(K)
        for k in range(top_k):
            e = int(ids[t, k])
            h = (problem.x[t].float() @ problem.w1[e].float().T).half().float()
            act = (torch.nn.functional.silu(h[:N]) * h[N:]).half().float()
            acc += weights[t, k] * (act @ problem.w2[e].float().T)
        rows.append(acc)
    ref = naive_fused_moe(problem.x, problem.w1, problem.w2, problem.router_logits, top_k)
    assert_close("naive vs dense", torch.stack(rows), ref, 1e-6)
    probs = torch.softmax(problem.router_logits.float(), dim=-1)
    assert torch.allclose(weights.sum(-1), torch.ones(M)), "renormalized weights must sum to 1"
    assert torch.equal(ids.long(), probs.topk(top_k, dim=-1).indices), (
        "ids must be the top-k experts"
    )


@pytest.mark.skipif(not GPU, reason="real shapes run on the GPU only")
@pytest.mark.parametrize("M", [1, 4096])
@pytest.mark.parametrize("name,E,top_k,K,N,dtype,block_shape", REAL, ids=lambda v: str(v))
def test_real_shapes(name, E, top_k, K, N, dtype, block_shape, M):
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=5)
    args = (problem.x, problem.w1, problem.w2, problem.router_logits, problem.top_k)
    out = fused_moe(*args, quant=problem.quant)
    ref = naive_fused_moe(*args, quant=problem.quant)
    # Per-tensor fp8 takes one scale from the whole intermediate's max: where kernel and
    # reference round that one element differently, every value is quantized with a
    # slightly different scale, so only fp8's own noise (~2% rel. RMS) can be asked
    # for (measured on the H200: 2.0e-2 at M=4096, 2.4e-3 at M=1).
    tol = {"fp16": 1e-3, "fp8_w8a8": 2e-2 if block_shape else 5e-2}.get(dtype, 2e-2)
    result = assert_close(f"{name} {dtype} M={M}", ref, out, tol)
    print(f"{name} {dtype} M={M}: {result}")


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize(
    "dtype,block_shape", [("bf16", None), ("fp8_w8a8", None), ("fp8_w8a8", (128, 128))]
)
def test_cuda_graph_capture_replays_the_eager_result(dtype, block_shape):
    """No host sync, no data-dependent shape: the call captures and replays, on new inputs too."""
    M, E, top_k, N, K = 64, 16, 4, 256, 512
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=6)
    x, logits = problem.x.clone(), problem.router_logits.clone()
    config = default_config(M, E, N, K, top_k, dtype, block_shape)

    def call():
        return fused_moe(
            x, problem.w1, problem.w2, logits, top_k, config=config, quant=problem.quant
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    other = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=7)
    x.copy_(other.x)
    logits.copy_(other.router_logits)
    graph.replay()
    torch.cuda.synchronize()
    eager = call()
    assert compare(eager, out).max_abs == 0.0, "graph replay differs from the eager call"
    ref = naive_fused_moe(x, problem.w1, problem.w2, logits, top_k, quant=problem.quant)
    assert_close("graph replay", ref, out, 2e-2)


def _refuse_alignment(*args, **kwargs):
    raise AssertionError("aligned although vLLM 0.33 takes the naive path here")


@pytest.mark.parametrize("dtype,block_shape,tol", DTYPES)
def test_twin_takes_vllms_naive_path_at_few_slots_per_expert(
    dtype, block_shape, tol, monkeypatch, poison_empty
):
    """M * top_k * 4 <= E: vLLM 0.33 skips alignment (one block per slot), so the twin does."""
    fused_moe_module = importlib.import_module("moetune.kernel.fused_moe")  # not the function
    M, E, top_k, N, K = 2, 16, 2, 32, 64
    problem = make_problem(M, E, N, K, top_k, dtype, block_shape, device=DEVICE, seed=9)
    weights, ids = naive_routing(problem.router_logits, top_k)
    monkeypatch.setattr(fused_moe_module, "align_block_size", _refuse_alignment)
    out = fused_experts(problem.x, problem.w1, problem.w2, weights, ids, quant=problem.quant)
    ref = naive_fused_experts(problem.x, problem.w1, problem.w2, weights, ids, quant=problem.quant)
    assert_close(f"naive path {dtype}", ref, out, tol)


def test_twin_aligns_where_vllm_does():
    """One slot more than E / 4, ids of other ranks, int4's groups or SGLang's TMA: aligned."""
    from moetune.kernel.fused_moe import naive_assignment
    from moetune.kernel.quant import MoEQuant
    from moetune.kernel.tma import split_configs

    config = default_config(1, 16, 32, 64, 2, "bf16")
    plain, tma = split_configs(config, None), split_configs(dict(config, USE_TMA=True), None)
    assert naive_assignment(None, 4, 16, None, plain)
    assert not naive_assignment(None, 5, 16, None, plain)
    assert not naive_assignment(None, 4, 16, None, tma)
    int4 = MoEQuant("int4_w4a16", None, None, group_size=128)
    assert not naive_assignment(None, 4, 16, int4, plain)
    fp8 = MoEQuant("fp8_w8a8", None, None, block_shape=(128, 128))
    assert naive_assignment(None, 4, 16, fp8, plain)

    problem = make_problem(2, 16, 32, 64, 2, "fp16", device=DEVICE, seed=10)
    weights, ids = naive_routing(problem.router_logits, 2)
    ids[1, 1] = -1
    out = fused_experts(
        problem.x, problem.w1, problem.w2, weights, ids, ids_may_be_nonlocal=True
    )  # aligned: the naive path has no slot to skip
    ref = naive_fused_experts(problem.x, problem.w1, problem.w2, weights, ids)
    assert_close("other ranks at few slots", ref, out, 1e-3)
