"""SGLang 0.5.23's launch as moetune runs it: what each kernel launch of a layer is given.

The kernel is replaced by a recorder, so each test sees the grid and the keywords
SGLang's launcher (`moetune.engines.launch.sglang_0_5_23`) would hand its kernel for
a whole layer (`fused_experts`), without computing anything. Expected values are
SGLang 0.5.23's (``moe_align_block_size``, ``_fused_moe_kernel_sequence``,
``invoke_fused_moe_kernel``, ``fused_moe_triton_config``); tests/engines_real/
test_sglang_launch_real.py compares with SGLang's own code where its files are present.
"""

import json
from types import SimpleNamespace

import pytest
import torch
from stand_ins import KernelRecorder  # tests/ is on sys.path

from moetune.engines.launch import EngineGemm, sglang_0_5_23, twin_ref
from moetune.engines.tuned_file import load_tuned_file
from moetune.errors import MoetuneError
from moetune.kernel.align import align_block_size
from moetune.kernel.problem import make_problem
from moetune.kernel.tma import SplitConfigError
from moetune.tune.measure.probe_timing import split_fused_experts

# The recorder computes nothing: the activation reads uninitialised buffers.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
TILE = {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
HOPPER = (9, 0)


def recording_gemm(capability=HOPPER) -> tuple[EngineGemm, KernelRecorder]:  # noqa: ANN001
    gemm = EngineGemm(twin_ref("sglang"))
    gemm.kernel, gemm.capability = KernelRecorder(), capability
    return gemm, gemm.kernel


def layer(M, E=8, N=64, K=128, top_k=2, seed=0):  # noqa: ANN001, ANN201
    """A bf16 layer on the CPU (Mixtral's 8 experts and top-2 by default)."""
    p = make_problem(M, E, N, K, top_k, "bf16", device="cpu", seed=seed)
    return p, torch.softmax(p.router_logits.float(), -1).topk(top_k)


def run_layer(M, config, down_config=None, E=8, top_k=2, capability=HOPPER):  # noqa: ANN001, ANN201
    """Both launches of one layer, as (up, down)."""
    p, (weights, ids) = layer(M, E=E, top_k=top_k)
    gemm, recorder = recording_gemm(capability)
    data = SimpleNamespace(x=p.x, w1=p.w1, w2=p.w2, quant=None, gemm=gemm)
    split_fused_experts(data, weights, ids.to(torch.int32), config, down_config)
    up, down = recorder.launches
    return up, down


def test_an_up_tma_file_without_down_table_times_the_down_gemm_with_tma(tmp_path):
    # SGLang reads the up table again for the down GEMM, USE_TMA included (issue 33, H).
    path = tmp_path / "E=8,N=64,device_name=NVIDIA_H200.json"
    path.write_text(json.dumps({"16": {"BLOCK_SIZE_M": 16, **TILE, "USE_TMA": True}}))
    pick = load_tuned_file(path).pick(16)
    up, down = run_layer(16, pick.up_config(), pick.down_config())
    # positional: a_ptr, a_desc, b_ptr, b_desc
    assert up.args[1] is None and up.args[3] is not None and up.kwargs["c_sorted"] is True
    assert down.args[1] is not None and down.args[3] is not None
    assert down.kwargs["c_sorted"] is False


def test_a_plain_file_without_down_table_runs_no_tma(tmp_path):
    path = tmp_path / "E=8,N=64,device_name=NVIDIA_H200.json"
    path.write_text(json.dumps({"16": {"BLOCK_SIZE_M": 16, **TILE}}))
    pick = load_tuned_file(path).pick(16)
    up, down = run_layer(16, pick.as_config())
    assert [up.args[1], up.args[3], down.args[1], down.args[3]] == [None] * 4
    assert up.kwargs["c_sorted"] is False


@pytest.mark.parametrize(
    ("slots", "block_m", "experts", "expected"),
    [
        (2, 16, 8, 32),  # fewer slots than E + 1: slots * BLOCK_SIZE_M
        (8, 16, 8, 128),
        (9, 16, 8, 9 + 9 * 15),  # E + 1 buckets of padding
        (10, 32, 8, 10 + 9 * 31 + 3),  # rounded up to a multiple of 4
        (234, 32, 8, 234 + 9 * 31 + 3),
        (4096 * 8, 64, 256, 4096 * 8 + 257 * 63 + 1),
    ],
)
def test_sorted_token_ids_are_as_long_as_sglang_allocates_them(slots, block_m, experts, expected):
    assert sglang_0_5_23.align_slots(slots, block_m, experts) == expected


@pytest.mark.parametrize("M", [1, 4, 5, 64, 117, 132, 200])
def test_the_grid_has_sglangs_row_blocks(M):
    # Mixtral (E = 8, top-2), BLOCK_SIZE_M 32: cdiv(len(sorted_token_ids), 32) row blocks
    config = {"BLOCK_SIZE_M": 32, **TILE}
    up, down = run_layer(M, config)
    length = sglang_0_5_23.align_slots(2 * M, 32, 8)
    assert up.args[9].shape[0] == length  # sorted_token_ids
    assert up.grid == ((length + 31) // 32 * (2 * 64 // 64),)
    assert down.grid == ((length + 31) // 32 * (128 // 64),)
    assert up.args[15] == length == down.args[15]  # EM


def test_at_117_tokens_sglangs_grid_has_one_more_row_block_than_the_bound():
    # 234 slots, E = 8 at BLOCK_SIZE_M 32: moetune's own bound 234 + 8 * 31 = 482 (16 row
    # blocks), SGLang's 234 + 9 * 31 = 513 -> 516 (17 row blocks).
    ids, _, _ = align_block_size(torch.zeros(117, 2, dtype=torch.int32), 32, 8)
    assert ids.shape[0] == 512
    up, _ = run_layer(117, {"BLOCK_SIZE_M": 32, **TILE})
    assert up.grid == (17 * 2,)


def test_a_length_below_the_bound_is_refused():
    with pytest.raises(ValueError, match="below the 16 slots' padded bound"):
        align_block_size(torch.zeros(8, 2, dtype=torch.int32), 16, 8, max_padded=16)


@pytest.mark.parametrize(
    ("M", "block_m", "early"),
    [
        # Mixtral: the activation has M * 2 + min(M * 2, 9) * (BLOCK_SIZE_M - 1) rows
        (116, 32, True),  # 232 + 279 = 511
        (117, 32, False),  # 234 + 279 = 513: SGLang's count (moetune's bound: 482)
        (132, 32, False),
        (133, 32, False),
        (188, 16, True),  # 376 + 135 = 511
        (189, 16, False),  # 378 + 135 = 513
        (196, 16, False),
    ],
)
def test_the_tma_down_gemms_early_trigger_counts_sglangs_rows(M, block_m, early):
    config = {"BLOCK_SIZE_M": block_m, **TILE}
    up, down = run_layer(M, config, {**config, "USE_TMA": True})
    rows = sglang_0_5_23.sorted_rows(2 * M, block_m, 8)
    assert down.args[0].shape[0] == rows  # A: the sorted activation
    assert up.args[5].shape[0] == rows  # C of the up GEMM, sorted
    assert down.kwargs["GDC_EARLY"] is early is (rows <= 512)
    assert up.kwargs["GDC_EARLY"] is (M <= 512)


def test_without_tma_the_down_gemms_rows_are_the_slots():
    config = {"BLOCK_SIZE_M": 32, **TILE}
    up, down = run_layer(300, config)
    assert down.args[0].shape[0] == 600 and down.kwargs["GDC_EARLY"] is False
    assert up.kwargs["GDC_EARLY"] is True


def test_no_programmatic_dependent_launch_before_hopper():
    up, down = run_layer(16, {"BLOCK_SIZE_M": 16, **TILE}, capability=(8, 0))
    assert not {"USE_GDC", "GDC_EARLY", "launch_pdl"} & (up.kwargs.keys() | down.kwargs.keys())


def quantized_layer(dtype, N=64, block_shape=None, M=16):  # noqa: ANN001, ANN201
    p = make_problem(M, 8, N, 256, 2, dtype, block_shape, device="cpu", seed=3)
    weights, ids = torch.softmax(p.router_logits.float(), -1).topk(2)
    return p, weights, ids.to(torch.int32)


@pytest.mark.parametrize(("dtype", "block_shape"), [("fp8_w8a8", None), ("int8_w8a8", None)])
def test_sglang_runs_tma_with_per_tensor_fp8_and_int8(dtype, block_shape):
    # SGLang's launcher builds the descriptors for these too (issue 33: moetune refused them).
    p, weights, ids = quantized_layer(dtype, block_shape=block_shape)
    config = {"BLOCK_SIZE_M": 16, **TILE, "USE_TMA": True}
    gemm, recorder = recording_gemm()
    data = SimpleNamespace(x=p.x, w1=p.w1, w2=p.w2, quant=p.quant, gemm=gemm)
    split_fused_experts(data, weights, ids, config, config)
    up, down = recorder.launches
    assert up.args[3] is not None and up.kwargs["c_sorted"] is True
    assert down.args[1] is not None and down.args[3] is not None
    # moetune's own kernel still refuses them (its rule, moetune.kernel.tma)
    data = SimpleNamespace(x=p.x, w1=p.w1, w2=p.w2, quant=p.quant, gemm=None)
    with pytest.raises(SplitConfigError, match="USE_TMA is supported for"):
        split_fused_experts(data, weights, ids, config, config)


@pytest.mark.parametrize("N", [192, 320])
def test_sglang_refuses_block_fp8_with_an_intermediate_size_off_the_block(N):
    p, weights, ids = quantized_layer("fp8_w8a8", N=N, block_shape=(128, 128))
    gemm, recorder = recording_gemm()
    data = SimpleNamespace(x=p.x, w1=p.w1, w2=p.w2, quant=p.quant, gemm=gemm)
    with pytest.raises(ValueError, match=f"intermediate size of {N} per rank: not a multiple"):
        split_fused_experts(data, weights, ids, {"BLOCK_SIZE_M": 16, **TILE}, None)
    assert recorder.launches == []


def test_block_fp8_on_the_block_runs():
    p, weights, ids = quantized_layer("fp8_w8a8", N=256, block_shape=(128, 128))
    gemm, recorder = recording_gemm()
    data = SimpleNamespace(x=p.x, w1=p.w1, w2=p.w2, quant=p.quant, gemm=gemm)
    split_fused_experts(data, weights, ids, {"BLOCK_SIZE_M": 16, **TILE}, None)
    assert len(recorder.launches) == 2


def test_an_entry_key_the_kernel_lacks_reaches_it_as_in_sglang():
    # SGLang splats the entry into the launch: SPLIT_K reaches the kernel (a KeyError there).
    up, down = run_layer(16, {"BLOCK_SIZE_M": 16, **TILE, "SPLIT_K": 1})
    assert up.kwargs["SPLIT_K"] == 1 == down.kwargs["SPLIT_K"]


def test_a_file_with_split_k_is_refused_as_sglangs(tmp_path):
    path = tmp_path / "E=8,N=64,device_name=NVIDIA_H200.json"
    path.write_text(
        json.dumps(
            {"16": {"BLOCK_SIZE_M": 16, **TILE}, "64": {**TILE, "BLOCK_SIZE_M": 32, "SPLIT_K": 1}}
        )
    )
    with pytest.raises(MoetuneError, match='batch size 64: config "SPLIT_K": SGLang passes'):
        load_tuned_file(path, engine="sglang")
    assert load_tuned_file(path).pick(64).BLOCK_SIZE_M == 32  # vLLM's kernel takes SPLIT_K


@pytest.mark.parametrize(
    ("top_k", "capability"), [(1, HOPPER), (2, HOPPER), (8, HOPPER), (8, None)]
)
def test_the_top_k_sum_is_sglangs_choice(top_k, capability):
    # top-1: no sum; top-2: torch.add; more: SGLang's Triton sum on sm90+ where SGLang is
    # installed (the twin has none: moetune's moe_sum stands in, as it does before sm90)
    from moetune.kernel.reduce import moe_sum

    gemm = EngineGemm(twin_ref("sglang"))
    gemm.capability = capability
    down = torch.randn(5, top_k, 40, generator=torch.Generator().manual_seed(top_k))
    out = sglang_0_5_23.combine(down, gemm)
    if top_k == 1:
        assert out.data_ptr() == down.data_ptr() and out.shape == (5, 40)
    elif top_k == 2:
        assert torch.equal(out, down[:, 0] + down[:, 1])
    else:
        assert torch.equal(out, moe_sum(down))
    assert sglang_0_5_23.sum_kernel(gemm.ref) is None  # the twin: SGLang is not installed
