import pytest

from moetune.roofline import expected_experts_hit, moe_roofline


def test_one_token_hits_top_k_experts():
    assert expected_experts_hit(1, 128, 8) == pytest.approx(8.0)


def test_many_tokens_hit_every_expert():
    assert expected_experts_hit(4096, 128, 8) == pytest.approx(128.0)


def test_bf16_bytes_and_flops_match_hand_count():
    # Qwen3-30B-A3B TP1 at M=1: 8 experts of (2*768*2048 + 2048*768) bf16 weights.
    r = moe_roofline(1, 128, 768, 2048, 8, "bf16")
    weights = 8 * 3 * 768 * 2048 * 2
    assert r.bytes == pytest.approx(weights + 2048 * 2 + 2048 * 2)
    assert r.flops == pytest.approx(2 * 8 * 3 * 768 * 2048)
    assert r.bound(4.2e12, 780e12) == "memory"


def test_large_m_is_compute_bound():
    r = moe_roofline(4096, 8, 7168, 4096, 2, "bf16")
    assert r.bound(4.2e12, 780e12) == "compute"


def test_fp8_halves_weight_bytes_plus_block_scales():
    bf16 = moe_roofline(1, 256, 256, 7168, 8, "bf16")
    fp8 = moe_roofline(1, 256, 256, 7168, 8, "fp8_w8a8", (128, 128))
    scales = 8 * ((512 // 128) * (7168 // 128) + (7168 // 128) * (256 // 128)) * 4
    weights = 8 * 3 * 256 * 7168
    assert fp8.bytes == pytest.approx(weights + scales + 7168 + 7168 * 2)
    assert fp8.bytes < bf16.bytes


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="unknown dtype"):
        moe_roofline(1, 8, 64, 64, 2, "fp4")


# The floor's ceilings: read bandwidth and the peak of the dtype's matmul.

from moetune.roofline import Ceilings, hbm_spec  # noqa: E402
from moetune.tune.measure.ceilings import choose_bandwidth  # noqa: E402


def ceilings(**peaks):
    sources = {kind: f"measured: {kind}" for kind in peaks}
    return Ceilings(4.6e12, "measured: stream-read kernel, 2 GiB", peaks, sources)


def test_each_dtype_is_bounded_by_its_own_matmul_peak():
    c = ceilings(bf16=700e12, fp8=1400e12, int8=1500e12)
    assert c.peak_for("bf16") == (700e12, "measured: bf16")
    assert c.peak_for("int8_w8a16")[0] == 700e12  # dequantized to bf16 before the dot
    assert c.peak_for("int4_w4a16")[0] == 700e12
    assert c.peak_for("fp8_w8a8") == (1400e12, "measured: fp8")
    assert c.peak_for("int8_w8a8") == (1500e12, "measured: int8")


def test_an_unmeasured_8bit_peak_is_assumed_and_says_so():
    peak, source = ceilings(bf16=700e12).peak_for("fp8_w8a8")
    assert peak == 1400e12 and "assumed 2x the bf16 peak" in source


def test_fp8_floor_uses_the_fp8_peak():
    roof = moe_roofline(4096, 8, 7168, 4096, 2, "fp8_w8a8")
    c = ceilings(bf16=700e12, fp8=1400e12)
    assert c.floor_seconds(roof, "fp8_w8a8") == pytest.approx(roof.flops / 1400e12)


def test_json_says_what_the_floor_is_made_of():
    j = ceilings(bf16=700e12, fp8=1400e12).to_json("fp8_w8a8")
    assert j["read_bandwidth_tb_s"] == 4.6
    assert j["bandwidth_source"] == "measured: stream-read kernel, 2 GiB"
    assert j["peak_tflops"] == 1400.0 and j["peak_source"] == "measured: fp8"


def test_floor_bandwidth_is_the_hbm_spec_and_the_measurement_only_without_one():
    # The spec bounds every kernel, so it sets the floor; the measurement is reported beside it.
    assert choose_bandwidth(3.96e12, 4.8e12) == (
        4.8e12,
        "HBM spec (stream-read kernel measured 3.96 TB/s)",
    )
    bw, source = choose_bandwidth(None, 4.8e12, "OutOfMemoryError: x")
    assert bw == 4.8e12 and "OutOfMemoryError" in source
    bw, source = choose_bandwidth(2.1e12, None)
    assert bw == 2.1e12 and source.startswith("measured") and "no HBM spec" in source
    with pytest.raises(RuntimeError, match="no spec"):
        choose_bandwidth(None, None, "boom")
    assert hbm_spec("NVIDIA H200") == 4.8e12 and hbm_spec("NVIDIA H100 80GB HBM3") == 3.35e12
    assert hbm_spec("Some GPU") is None


def test_int4_weights_are_half_a_byte_plus_group_scales():
    int4 = moe_roofline(1, 128, 768, 2048, 8, "int4_w4a16")
    weights = 8 * 3 * 768 * 2048 * 0.5
    scales = 8 * (2 * 768 * (2048 // 128) + 2048 * (768 // 128)) * 2
    assert int4.bytes == pytest.approx(weights + scales + 2048 * 2 + 2048 * 2)


def test_roofline_fraction_never_exceeds_one():
    from moetune.tune.runner import BatchResult

    row = BatchResult(
        8,
        None,
        latency_us=10.0,
        floor_us=11.0,
        verified_rank=0,
        rel_rms=0.0,
        baseline_us={"vllm_fallback": 12.0},
    )
    assert row.roofline_fraction == 1.0
    row = BatchResult(8, None, 20.0, 10.0, 0, 0.0)
    assert row.roofline_fraction == 0.5
