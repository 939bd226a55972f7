"""TP/EP sharding with vLLM's `--enable-expert-parallel` and SGLang's `--ep-size` semantics."""

import pytest

from moetune.errors import ShardingError
from moetune.extract.shape import MoEShape
from moetune.extract.sharding import shard

# Kimi K3: routed experts run on a 3584-wide latent, not on hidden_size 7168.
KIMI_K3 = MoEShape(896, 16, 3072, 7168, 3584)
DEEPSEEK_V3 = MoEShape(256, 8, 2048, 7168, 7168, 1, "bfloat16", "fp8", (128, 128))
MIXTRAL = MoEShape(8, 2, 14336, 4096, 4096)


def test_kimi_k3_tp8_vllm_ep():
    local = shard(KIMI_K3, tp=8, ep=True)
    assert local.local_experts == 112
    assert local.intermediate_size == 3072
    assert local.w1_width == 6144
    assert local.hidden_size == 3584  # K of the kernel is the expert hidden size
    assert (local.tp_size, local.ep_size, local.global_experts, local.top_k) == (8, 8, 896, 16)


def test_plain_tp_splits_the_intermediate():
    local = shard(MIXTRAL, tp=2)
    assert (local.local_experts, local.intermediate_size, local.w1_width) == (8, 7168, 14336)
    assert local.ep_size == 1


def test_tp1_is_the_whole_model():
    local = shard(MIXTRAL)
    assert (local.local_experts, local.intermediate_size, local.hidden_size) == (8, 14336, 4096)


def test_sglang_ep_size_splits_experts_and_the_rest_of_tp():
    # tp 8, ep-size 2: 448 experts per rank, intermediate split tp/ep = 4 ways.
    local = shard(KIMI_K3, tp=8, ep_size=2)
    assert (local.local_experts, local.intermediate_size, local.ep_size) == (448, 768, 2)


def test_sglang_ep_size_equal_to_tp_matches_vllm_ep():
    assert shard(KIMI_K3, tp=8, ep_size=8) == shard(KIMI_K3, tp=8, ep=True)


def test_intermediate_does_not_divide():
    with pytest.raises(ShardingError) as exc:
        shard(KIMI_K3, tp=5)
    assert str(exc.value) == (
        "--tp 5 cannot split the expert intermediate size 3072 5 ways; "
        "valid --tp: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, ..."
    )


def test_experts_do_not_divide_under_vllm_ep():
    with pytest.raises(ShardingError) as exc:
        shard(KIMI_K3, tp=6, ep=True)
    assert str(exc.value) == (
        "--tp 6 --ep cannot split 896 experts evenly over 6 ranks; "
        "valid --tp with --ep: 1, 2, 4, 7, 8, 14, 16, 28, 32, 56, 64, 112, ..."
    )


def test_ep_size_must_divide_tp():
    with pytest.raises(ShardingError) as exc:
        shard(KIMI_K3, tp=8, ep_size=3)
    assert str(exc.value) == "--ep-size 3 does not divide --tp 8; valid --ep-size: 1, 2, 4, 8"


def test_ep_size_must_divide_experts():
    with pytest.raises(ShardingError) as exc:
        shard(MIXTRAL, tp=16, ep_size=16)
    assert (
        str(exc.value) == "--ep-size 16 cannot split 8 experts evenly; valid --ep-size: 1, 2, 4, 8"
    )


def test_sglang_remaining_tp_must_divide_the_intermediate():
    odd = MoEShape(64, 6, 1407, 2048, 2048)
    with pytest.raises(ShardingError) as exc:
        shard(odd, tp=4, ep_size=2)
    assert str(exc.value) == (
        "--tp 4 --ep-size 2 cannot split the expert intermediate size 1407 2 ways; "
        "valid --tp / --ep-size: 1, 3, 7, 21, 67, 201, 469"
    )


def test_fp8_block_must_still_tile_the_local_intermediate():
    # 2048 / 32 = 64 divides, but is not a multiple of the 128-wide fp8 block.
    with pytest.raises(ShardingError) as exc:
        shard(DEEPSEEK_V3, tp=32)
    assert str(exc.value) == (
        "--tp 32 cannot split the expert intermediate size 2048 32 ways into multiples of "
        "the fp8 weight block [128, 128]; valid --tp: 1, 2, 4, 8, 16; or keep --tp 32 with "
        "expert parallelism: --ep (vLLM: 8 whole experts per rank) or --ep-size 2, 4, 8, 16 "
        "or 32 (SGLang)"
    )
    assert shard(DEEPSEEK_V3, tp=16).intermediate_size == 128


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tp": 0}, "--tp must be at least 1, got 0"),
        ({"tp": 8, "ep_size": 0}, "--ep-size must be at least 1, got 0"),
        (
            {"tp": 8, "ep": True, "ep_size": 8},
            "--ep (vLLM: EP size = TP size) and --ep-size (SGLang) both set the EP size; pass one",
        ),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ShardingError) as exc:
        shard(KIMI_K3, **kwargs)
    assert str(exc.value) == message
