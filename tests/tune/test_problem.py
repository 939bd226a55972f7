import pytest

from moetune.errors import TuneError
from moetune.extract.shape import ShardedShape
from moetune.tune.problem import TuneProblem


def test_key_names_every_dimension():
    problem = TuneProblem(128, 768, 2048, 8, "bf16")
    assert problem.shape_key() == "E=128,N=768,K=2048,topk=8,dtype=bf16"
    assert problem.key().startswith(problem.shape_key() + ",kernel=moetune-vllm-0.33.0@")
    assert problem.w1_width == 1536


def test_key_carries_the_block_shape_without_spaces():
    problem = TuneProblem(256, 256, 7168, 8, "fp8_w8a8", [128, 128])
    assert problem.block_shape == (128, 128)
    assert problem.shape_key() == "E=256,N=256,K=7168,topk=8,dtype=fp8_w8a8,block_shape=[128,128]"


def test_keys_differ_where_engine_file_names_do_not():
    # vLLM's file name omits K and top-k; the store must not mix such problems.
    assert (
        TuneProblem(8, 7168, 4096, 2, "bf16").key() != TuneProblem(8, 7168, 2048, 2, "bf16").key()
    )
    assert (
        TuneProblem(8, 7168, 4096, 2, "bf16").key() != TuneProblem(8, 7168, 4096, 1, "bf16").key()
    )


def test_from_sharded_takes_the_rank_local_sizes():
    # Kimi K3 at TP8 with EP: 112 local experts, full intermediate, latent K.
    sharded = ShardedShape(
        local_experts=112, top_k=16, intermediate_size=3072, hidden_size=3584, tp_size=8, ep_size=8
    )
    problem = TuneProblem.from_sharded(sharded, "fp8_w8a8", [128, 128])
    assert problem == TuneProblem(112, 3072, 3584, 16, "fp8_w8a8", (128, 128))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dtype="fp4"), "unknown dtype 'fp4'"),
        (dict(top_k=200), "top_k (200) cannot exceed"),
        (dict(num_experts=0), "num_experts must be a positive integer"),
        (dict(block_shape=(128, 128)), "block_shape [128, 128] needs dtype fp8_w8a8"),
        (dict(dtype="fp8_w8a8", block_shape=(128,)), "block_shape must be two positive integers"),
    ],
)
def test_bad_problems_are_one_line_errors(kwargs, message):
    base = dict(num_experts=128, intermediate_size=768, hidden_size=2048, top_k=8, dtype="bf16")
    with pytest.raises(TuneError) as info:
        TuneProblem(**{**base, **kwargs})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "problem",
    [
        TuneProblem(128, 768, 2048, 8, "bf16"),
        TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128)),
        TuneProblem(16, 2048, 5120, 1, "fp8_w8a8", per_channel=True),
        TuneProblem(128, 768, 2048, 8, "int8_w8a8", per_channel=True),
        TuneProblem(128, 768, 2048, 8, "int4_w4a16", group_size=64, has_zp=True),
        TuneProblem(128, 768, 2048, 8, "bf16", routing_digest="3f9a0c21"),
    ],
)
def test_from_key_reads_back_every_kind_of_key(problem):
    assert TuneProblem.from_key(problem.key()) == problem


def test_from_key_refuses_what_is_not_a_key():
    with pytest.raises(TuneError, match="not a problem key: 'E=128,N=768'"):
        TuneProblem.from_key("E=128,N=768")
