"""The compile-rate family of a kernel problem comes from quant_rules.yaml's kernels: rows."""

import importlib.util
from pathlib import Path

import pytest

from moetune.dtypes import DTYPES, _compile_family, compile_family, kernel_variants
from moetune.errors import InvalidMappingsError
from moetune.tune.estimate import compile_family as problem_family
from moetune.tune.estimate import default_rates, search_seconds
from moetune.tune.problem import TuneProblem

R = default_rates()  # the packaged table's default GPU

ROOT = Path(__file__).resolve().parents[2]


def shape(dtype: str, **quant) -> TuneProblem:
    return TuneProblem(128, 768, 2048, 8, dtype, **quant)


@pytest.mark.parametrize(
    ("problem", "family"),
    [
        (shape("bf16"), "bf16"),
        (shape("fp16"), "bf16"),
        (shape("fp8_w8a8"), "fp8"),
        (shape("fp8_w8a8", per_channel=True), "fp8_channel"),
        (shape("fp8_w8a8", block_shape=(128, 128)), "fp8_block"),
        (shape("int8_w8a8", per_channel=True), "int8_w8a8"),
        (shape("int4_w4a16", group_size=128), "wna16"),
        # fused_moe_kernel, not the WNA16 kernel: priced as int8 weights there (no record).
        (shape("int8_w8a16"), "int8_w8a8"),
    ],
)
def test_each_kernel_problem_has_its_family(problem, family):
    assert problem_family(problem) == family


def test_every_kernels_row_names_a_priced_family():
    rows = kernel_variants()
    assert {row.dtype for row in rows} == set(DTYPES.quantized())
    assert all(row.compile_family in R.compile_s_per_timing for row in rows)
    assert compile_family("bf16") in R.compile_s_per_timing


def test_int8_w8a16_is_priced_at_the_int8_rate_not_the_int4_one():
    timed = {64: 1000.0}
    int8 = search_seconds(shape("int8_w8a16"), timed, {}, 1.0)
    int4 = search_seconds(shape("int4_w4a16", group_size=128), timed, {}, 1.0)
    assert int8 == pytest.approx(1000 * R.compile_s_per_timing["int8_w8a8"] / R.compile_workers)
    assert R.compile_s_per_timing["int8_w8a8"] == 0.54 and int8 < int4


def test_a_row_without_a_family_is_a_rules_error():
    with pytest.raises(InvalidMappingsError, match="int9 names no compile_family"):
        _compile_family("int9", {"dtype": "int9"})


def test_the_compile_rate_script_reads_the_same_families():
    spec = importlib.util.spec_from_file_location("compile_rates", ROOT / "bench/compile_rates.py")
    rates = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rates)
    keys = {
        "E=256,N=256,K=7168,topk=8,dtype=fp8_w8a8,block_shape=[128,128],kernel=x": "fp8_block",
        "E=16,N=2048,K=5120,topk=1,dtype=fp8_w8a8,per_channel": "fp8_channel",
        "E=128,N=192,K=2048,topk=8,dtype=fp8_w8a8": "fp8",
        "E=128,N=768,K=2048,topk=8,dtype=int8_w8a8,per_channel": "int8_w8a8",
        "E=128,N=768,K=2048,topk=8,dtype=int4_w4a16,group_size=128,kernel_rev=2": "wna16",
        "E=128,N=768,K=2048,topk=8,dtype=bf16": "bf16",
    }
    assert {key: rates.family(key) for key in keys} == keys
