import pytest

from moetune.errors import TuneError
from moetune.extract.shape import ShardedShape
from moetune.tune.problem import TuneProblem


def test_key_names_every_dimension():
    problem = TuneProblem(128, 768, 2048, 8, "bf16")
    assert problem.shape_key() == "E=128,N=768,K=2048,topk=8,dtype=bf16"
    assert problem.key().startswith(problem.shape_key() + ",kernel=moetune-vllm-0.34.0@")
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
        (dict(dtype="fp8_w8a8", checkpoint_dtype="float32"), "checkpoint_dtype must be bfloat16"),
        (
            dict(dtype="int8_w8a16", checkpoint_dtype="float16"),
            "int8_w8a16 is tuned on bfloat16 activations, not float16",
        ),
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
        TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128), checkpoint_dtype="float16"),
        TuneProblem(128, 768, 2048, 8, "int8_w8a8", per_channel=True, checkpoint_dtype="float16"),
        TuneProblem(128, 768, 2048, 8, "fp16"),
    ],
)
def test_from_key_reads_back_every_kind_of_key(problem):
    assert TuneProblem.from_key(problem.key()) == problem


def test_from_key_refuses_what_is_not_a_key():
    with pytest.raises(TuneError, match="not a problem key: 'E=128,N=768'"):
        TuneProblem.from_key("E=128,N=768")


# Keys as they were written before the checkpoint's dtype reached the problem: a bf16
# checkpoint's key must stay these bytes, or every store written so far is orphaned.
BF16_CHECKPOINT_KEYS = {
    TuneProblem(256, 256, 7168, 8, "fp8_w8a8", (128, 128)): (
        "E=256,N=256,K=7168,topk=8,dtype=fp8_w8a8,block_shape=[128,128]"
    ),
    TuneProblem(16, 2048, 5120, 1, "fp8_w8a8", per_channel=True): (
        "E=16,N=2048,K=5120,topk=1,dtype=fp8_w8a8,per_channel"
    ),
    TuneProblem(128, 768, 2048, 8, "int8_w8a8", per_channel=True, routing_digest="3f9a0c21"): (
        "E=128,N=768,K=2048,topk=8,dtype=int8_w8a8,per_channel,routing=3f9a0c21"
    ),
    TuneProblem(128, 768, 2048, 8, "fp16"): "E=128,N=768,K=2048,topk=8,dtype=fp16",
}


@pytest.mark.parametrize("problem", BF16_CHECKPOINT_KEYS, ids=lambda p: p.dtype)
def test_a_bf16_checkpoints_key_is_unchanged_and_an_fp16_ones_is_its_own(problem):
    from dataclasses import replace

    from moetune.engines.launch import KernelRef

    shape_key = BF16_CHECKPOINT_KEYS[problem]
    vllm = KernelRef("vllm", "0.34.0", "0.34.0", "/site/vllm/fused_moe.py", "0123456789ab")
    on_vllm = replace(problem, kernel=vllm)
    assert problem.shape_key() == shape_key
    assert on_vllm.key() == shape_key + ",kernel=vllm-0.34.0@0123456789ab"
    assert replace(on_vllm, checkpoint_dtype="bfloat16").key() == on_vllm.key()
    fp16 = replace(on_vllm, checkpoint_dtype="float16")
    if problem.dtype == "fp16":  # the unquantized dtype names its activations itself
        assert fp16 == on_vllm and fp16.checkpoint_dtype == "float16"
        return
    assert fp16.key() != on_vllm.key()
    assert ",checkpoint=fp16" in fp16.key() and ",checkpoint" not in on_vllm.key()
    assert TuneProblem.from_key(fp16.key()) == replace(fp16, kernel=None)


def test_the_checkpoints_dtype_reaches_w8a8_problems_only():
    from types import SimpleNamespace

    from moetune.dtypes import quant_details

    fp16_fp8 = SimpleNamespace(block_shape=(128, 128), activation_dtype="float16")
    details = quant_details(fp16_fp8, "fp8_w8a8")
    assert details["checkpoint_dtype"] == "float16"
    sharded = ShardedShape(
        local_experts=8, top_k=2, intermediate_size=256, hidden_size=512, tp_size=1, ep_size=1
    )
    problem = TuneProblem.from_sharded(sharded, "fp8_w8a8", **details)
    assert problem.checkpoint_dtype == "float16" and problem.shape_key().endswith(
        ",block_shape=[128,128],checkpoint=fp16"
    )
    assert problem.kernel_options()["checkpoint_dtype"] == "float16"
    fp16_int8 = SimpleNamespace(block_shape=None, per_channel=True, activation_dtype="float16")
    assert quant_details(fp16_int8, "int8_w8a8")["checkpoint_dtype"] == "float16"
    # Weight-only dtypes run bf16 activations whatever the checkpoint's (not yet followed).
    fp16_int4 = SimpleNamespace(block_shape=(0, 128), activation_dtype="float16")
    assert quant_details(fp16_int4, "int4_w4a16")["checkpoint_dtype"] == "bfloat16"
    bf16_fp8 = SimpleNamespace(block_shape=None, activation_dtype="bfloat16")
    assert quant_details(bf16_fp8, "fp8_w8a8")["checkpoint_dtype"] == "bfloat16"
