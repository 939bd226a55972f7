"""default_config: six keys, always a config the kernel accepts, shaped by the problem."""

import pytest

from moetune.kernel.config import default_config
from moetune.kernel.fused_moe_kernel import CONFIG_KEYS, check_config

SHAPES = [  # E, N, K, top_k
    (8, 7168, 4096, 2),
    (128, 768, 2048, 8),
    (256, 256, 7168, 8),
    (112, 3072, 7168, 16),
    (5, 40, 96, 1),
]
DTYPES = [
    ("bf16", None),
    ("fp16", None),
    ("fp8_w8a8", None),
    ("fp8_w8a8", (128, 128)),
    ("int8_w8a16", None),
]
# Shared memory of the pipelined tiles must fit an H100/H200 block (227 KiB).
SMEM_LIMIT = 232_448


@pytest.mark.parametrize("dtype,block_shape", DTYPES)
@pytest.mark.parametrize("E,N,K,top_k", SHAPES)
def test_every_default_is_a_valid_config(E, N, K, top_k, dtype, block_shape):
    for M in (1, 2, 8, 64, 256, 1024, 4096, 16384):
        config = default_config(M, E, N, K, top_k, dtype, block_shape)
        assert tuple(config) == CONFIG_KEYS
        check_config(config, block_shape, None if dtype in ("bf16", "fp16") else dtype)
        a_bytes = 1 if dtype == "fp8_w8a8" else 2
        w_bytes = 1 if dtype in ("fp8_w8a8", "int8_w8a16") else 2
        tiles = config["BLOCK_SIZE_K"] * (
            config["BLOCK_SIZE_M"] * a_bytes + config["BLOCK_SIZE_N"] * w_bytes
        )
        assert config["num_stages"] * tiles <= SMEM_LIMIT, (
            f"M={M}: {config} needs too much shared memory"
        )
        if block_shape is not None:
            assert config["BLOCK_SIZE_N"] <= block_shape[0], (
                "vLLM's tuner keeps BLOCK_SIZE_N within block_n"
            )


def test_tiles_grow_with_the_tokens_per_expert():
    """Decode streams weights with thin row-blocks; prefill uses the big compute tiles."""
    decode = default_config(1, 128, 768, 2048, 8, "bf16")
    prefill = default_config(4096, 128, 768, 2048, 8, "bf16")
    assert decode["BLOCK_SIZE_M"] == 16
    assert prefill["BLOCK_SIZE_M"] == 128 and prefill["BLOCK_SIZE_N"] == 256
    sizes = [
        default_config(M, 8, 7168, 4096, 2, "bf16")["BLOCK_SIZE_M"] for M in (1, 64, 128, 256, 4096)
    ]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_fp8_stops_at_64_by_128_tiles():
    """Past 64 x 128 the block-scaled fp8 loop runs out of registers (255 at 128 x 128, 8 warps)."""
    for block_shape in (None, (128, 128)):
        decode = default_config(1, 256, 256, 7168, 8, "fp8_w8a8", block_shape)
        prefill = default_config(4096, 256, 256, 7168, 8, "fp8_w8a8", block_shape)
        assert decode["BLOCK_SIZE_M"] == 16 and decode["BLOCK_SIZE_K"] == 128
        assert (prefill["BLOCK_SIZE_M"], prefill["BLOCK_SIZE_N"], prefill["num_warps"]) == (
            64,
            128,
            4,
        )


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown dtype"):
        default_config(1, 8, 64, 64, 2, "fp4")
