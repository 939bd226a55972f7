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
