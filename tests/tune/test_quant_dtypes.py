"""The tune side of the quantized dtypes: problem keys, pruning rules, roofline rows,
default configs and the engines' file names."""

import pytest

from moetune.device import DeviceLimits
from moetune.dtypes import DTYPES
from moetune.errors import TuneError
from moetune.kernel.config import Candidate, default_config
from moetune.roofline import moe_roofline
from moetune.tune.output import engine_file_path, skipped_engines
from moetune.tune.problem import TuneProblem
from moetune.tune.search.space import default_space, prune

H200 = DeviceLimits.h200()
INT4 = TuneProblem(128, 768, 2048, 8, "int4_w4a16", group_size=128)


def test_every_kernel_dtype_is_tunable():
    for dtype in DTYPES.names():
        quant = {"per_channel": True} if DTYPES[dtype].always_per_channel else {}
        group = {"group_size": 128} if DTYPES[dtype].group_quant else {}
        assert TuneProblem(128, 768, 2048, 8, dtype, **quant, **group).dtype == dtype
    assert {"int4_w4a16", "int8_w8a8"} <= set(DTYPES.names())


def test_keys_carry_the_quantization_details():
    base = dict(num_experts=128, intermediate_size=768, hidden_size=2048, top_k=8)
    keys = {
        TuneProblem(**base, dtype="int4_w4a16", group_size=128).key(),
        TuneProblem(**base, dtype="int4_w4a16", group_size=64).key(),
        TuneProblem(**base, dtype="int4_w4a16", group_size=128, has_zp=True).key(),
        TuneProblem(**base, dtype="fp8_w8a8").key(),
        TuneProblem(**base, dtype="fp8_w8a8", per_channel=True).key(),
        TuneProblem(**base, dtype="int8_w8a8", per_channel=True).key(),
    }
    assert len(keys) == 6, "stores must never mix differently quantized problems"
    assert (
        INT4.shape_key() == "E=128,N=768,K=2048,topk=8,dtype=int4_w4a16,group_size=128,kernel_rev=2"
    )
    assert (
        TuneProblem(**base, dtype="int4_w4a16", group_size=32, has_zp=True)
        .shape_key()
        .endswith(",group_size=32,zp,kernel_rev=2")
    )
    assert (
        TuneProblem(**base, dtype="fp8_w8a8", per_channel=True)
        .shape_key()
        .endswith("dtype=fp8_w8a8,per_channel")
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dtype="bf16", per_channel=True), "per-channel quantization applies to"),
        (dict(dtype="int8_w8a8"), "per channel only"),
        (dict(dtype="int4_w4a16"), "needs an even group size"),
        (dict(dtype="int4_w4a16", group_size=33), "needs an even group size"),
        (dict(dtype="bf16", group_size=128), "a group size and zero points go with"),
        (dict(dtype="int4_w4a16", group_size=128, hidden_size=2047), "K and N must be even"),
        (
            dict(dtype="fp8_w8a8", per_channel=True, block_shape=(128, 128)),
            "either block-quantized or per-channel",
        ),
    ],
)
def test_bad_quantized_problems_are_one_line_errors(kwargs, message):
    base = dict(num_experts=128, intermediate_size=768, hidden_size=2048, top_k=8)
    with pytest.raises(TuneError) as info:
        TuneProblem(**{**base, **kwargs})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_int4_pruning_keeps_what_vllms_wna16_tuner_keeps():
    report = prune(default_space(), INT4, 4096, H200)
    assert report.removed["wna16_blocks"] == 640  # every BLOCK_SIZE_K = 64 (of 64/128/256)
    assert report.kept and all(c.BLOCK_SIZE_K in (128, 256) for c in report.kept)
    g32 = TuneProblem(128, 768, 2048, 8, "int4_w4a16", group_size=32)
    assert prune(default_space(), g32, 4096, H200).removed["wna16_blocks"] == 0
    # N = 640: 256 does not divide it (the CUDA wna16 kernel and vLLM's tuner need it to)
    odd_n = TuneProblem(128, 640, 2048, 8, "int4_w4a16", group_size=128)
    kept = prune(default_space(), odd_n, 64, H200).kept
    assert kept and {c.BLOCK_SIZE_K for c in kept} == {128}


def test_eight_bit_dots_never_get_block_k_16():
    space = [
        Candidate(16, 64, bk, 1, 4, 2)
        for bk in (16, 32, 64)  # a user space; the default grid starts at 64
    ]
    for problem in (
        TuneProblem(8, 256, 512, 2, "int8_w8a8", per_channel=True),
        TuneProblem(8, 256, 512, 2, "fp8_w8a8", per_channel=True),
    ):
        report = prune(space, problem, 1, H200)
        assert report.removed["eight_bit_dot"] == 1
        assert all(c.BLOCK_SIZE_K >= 32 for c in report.kept)
    assert prune(space, TuneProblem(8, 256, 512, 2, "bf16"), 1, H200).removed["eight_bit_dot"] == 0


def test_roofline_rows_for_the_new_dtypes():
    m, e, n, k, top_k = 1, 128, 768, 2048, 8
    elements = 8 * 3 * n * k  # M=1, top-8: 8 distinct experts' weights
    int4 = moe_roofline(m, e, n, k, top_k, "int4_w4a16", INT4.engine_block_shape)
    assert INT4.engine_block_shape == (0, 128)
    scales = 8 * (2 * n * (k // 128) + k * (n // 128)) * 2
    assert int4.bytes == pytest.approx(elements * 0.5 + scales + m * k * 2 + m * k * 2)
    bf16 = moe_roofline(m, e, n, k, top_k, "bf16")
    int8 = moe_roofline(m, e, n, k, top_k, "int8_w8a8")
    assert int4.bytes < int8.bytes < bf16.bytes
    # int8_w8a8 runs per channel: one fp32 scale per output channel of w1 and of w2.
    per_channel = moe_roofline(m, e, n, k, top_k, "int8_w8a8", per_channel=True)
    assert per_channel.bytes - int8.bytes == pytest.approx(8 * ((2 * n + k) - 2) * 4)
    assert DTYPES["int4_w4a16"].weight_bytes == 0.5


def test_default_configs_for_the_new_dtypes():
    # vLLM's moe_wna16 Triton defaults: BLOCK_SIZE_N/K 32/64 for one token, else 64/32
    assert default_config(1, 128, 768, 2048, 8, "int4_w4a16") == dict(
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=3
    )
    assert default_config(4096, 128, 768, 2048, 8, "int4_w4a16")["BLOCK_SIZE_M"] == 64
    for m in (1, 64, 4096):
        assert default_config(m, 128, 768, 2048, 8, "int8_w8a8")["BLOCK_SIZE_K"] >= 32


def test_file_names_and_skipped_engines():
    per_channel = TuneProblem(16, 2048, 5120, 1, "fp8_w8a8", per_channel=True)
    names = {
        engine: engine_file_path(engine, per_channel, "NVIDIA H200", "3.6.0", ".").name
        for engine in ("vllm", "sglang")
    }
    assert names["vllm"] == "E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    assert names["sglang"] == (
        "E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True.json"
    )
    int8 = TuneProblem(128, 768, 2048, 8, "int8_w8a8", per_channel=True)
    assert engine_file_path("sglang", int8, "NVIDIA H200", "3.6.0", ".").name == (
        "E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json"
    )
    assert set(skipped_engines(int8)) == {"vllm"}
    assert engine_file_path("vllm", INT4, "NVIDIA H200", "3.6.0", ".").name == (
        "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    )
    assert skipped_engines(INT4) == {} and skipped_engines(per_channel) == {}


def test_options_take_the_engines_group_block_shape_as_the_group_size():
    from types import SimpleNamespace

    from moetune.dtypes import QuantChoice, quant_details

    gptq = SimpleNamespace(block_shape=(0, 64), per_channel=False, zero_point=True)
    assert quant_details(gptq, "int4_w4a16") == dict(
        block_shape=None, per_channel=False, group_size=64, has_zp=True, checkpoint_dtype="bfloat16"
    )
    assert quant_details(gptq, "int4_w4a16", QuantChoice(group_size=32))["group_size"] == 32
    fp8_block = SimpleNamespace(block_shape=(128, 128), per_channel=False)
    assert quant_details(fp8_block, "fp8_w8a8")["block_shape"] == (128, 128)
    dynamic = SimpleNamespace(block_shape=None, per_channel=True)
    assert quant_details(dynamic, "fp8_w8a8")["per_channel"] is True
    bf16 = SimpleNamespace(block_shape=None)
    assert quant_details(bf16, "int8_w8a8")["per_channel"] is True  # int8 w8a8 always is
    assert quant_details(bf16, "int4_w4a16")["group_size"] == 128  # the default


def test_a_quant_choice_the_dtype_has_no_use_for_is_refused_in_values_not_flags():
    from types import SimpleNamespace

    from moetune.dtypes import QuantChoice, QuantChoiceError, quant_details

    bf16 = SimpleNamespace(block_shape=None)
    with pytest.raises(QuantChoiceError) as found:
        quant_details(bf16, "bf16", QuantChoice(group_size=64))
    assert str(found.value) == "a group size applies to int4_w4a16, not bf16"
    assert found.value.worded("--group-size") == "--group-size applies to int4_w4a16, not bf16"
    with pytest.raises(QuantChoiceError, match="^per-channel quantization applies to .*, not "):
        quant_details(bf16, "int4_w4a16", QuantChoice(per_channel=True))


def test_tune_accepts_what_the_kernel_implements():
    from moetune.dtypes import tune_accepts

    assert tune_accepts("int4_w4a16", block_shape=(0, 128))
    assert tune_accepts("int8_w8a8", per_channel=True)
    assert tune_accepts("fp8_w8a8", per_channel=True)
    assert tune_accepts("fp8_w8a8", block_shape=(128, 128))
    assert not tune_accepts("int8_w8a16", block_shape=(0, 128))
    assert not tune_accepts("fp8_w8a8", static_activations=True)
    assert not tune_accepts("nvfp4")


def test_a_store_never_resumes_timings_of_an_older_int4_kernel(tmp_path):
    """The int4 kernel's revision is in the problem key: rev-1 rows (keyed without it) stay unused."""
    from moetune.kernel.config import Candidate
    from moetune.tune.store import Measurement, ResultStore

    old_key = "E=128,N=768,K=2048,topk=8,dtype=int4_w4a16,group_size=128"
    assert INT4.key() != old_key and INT4.key().startswith(old_key + ",kernel_rev=")
    candidate = Candidate(16, 32, 256, 16, 4, 4)
    store = ResultStore(tmp_path)
    row = dict(
        batch_size=16, candidate=candidate, fidelity="full", status="ok", latency_us=624.6,
        p20_us=620.0, p80_us=630.0, compile_s=1.0, error=None, device_name="NVIDIA H200",
        triton_version="3.6.0", moetune_version="0.1.0", timestamp=0.0,
    )  # fmt: skip
    store.add(Measurement(problem_key=old_key, **row))
    reopened = ResultStore(tmp_path)
    assert reopened.get(old_key, 16, candidate, "full", "NVIDIA H200", "3.6.0") is not None
    assert reopened.get(INT4.key(), 16, candidate, "full", "NVIDIA H200", "3.6.0") is None
