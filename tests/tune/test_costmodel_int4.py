"""The cost model's ranking of int4 w4a16 candidates against H200 measurements.

Data, Qwen3-30B-A3B GPTQ-Int4 TP1 (E=128, N=768, K=2048, top-8, group 128) on an H200:

- h200_qwen3_30b_int4_quick.json: every quick timing of the first tunes (int4 kernel
  rev 1, before the cost model knew int4; a broad sample, so it is the one the rank
  correlation is checked on), at M = 1, 16, 64, 256;
- h200_qwen3_30b_int4_rev2_quick.json: every quick timing of the full 18-batch-size
  tune of kernel rev 2 (vLLM's SASS), searched with this model: its sample clusters
  around the model's favourites, so it checks where the measured best ranks and the
  model's time of it, at every batch size.

Fast search times the model's favourites first, so the measured best must rank near
the top and the huge tiles that spill (and take 20-30 s to compile) last.
"""

import json
from pathlib import Path

import pytest

from moetune.device import DeviceLimits
from moetune.kernel.config import Candidate
from moetune.tune.problem import TuneProblem
from moetune.tune.search.costmodel import expected_row_blocks, predicted_seconds
from moetune.tune.search.space import default_space, prune

H200 = DeviceLimits.h200()
QWEN3_30B_INT4 = TuneProblem(128, 768, 2048, 8, "int4_w4a16", group_size=128)
DATA = json.loads((Path(__file__).parent / "data" / "h200_qwen3_30b_int4_quick.json").read_text())
BATCH_SIZES = sorted(int(m) for m in DATA["measurements"])
REV2 = json.loads(
    (Path(__file__).parent / "data" / "h200_qwen3_30b_int4_rev2_quick.json").read_text()
)
REV2_BATCH_SIZES = sorted(int(m) for m in REV2["measurements"])


def measured(batch_size, data=DATA):
    return {Candidate(*row[:6]): row[6] for row in data["measurements"][str(batch_size)]}


def ranking(batch_size):
    space = prune(default_space(), QWEN3_30B_INT4, batch_size, H200).kept
    seconds = {c: predicted_seconds(QWEN3_30B_INT4, batch_size, c, H200) for c in space}
    return sorted(space, key=seconds.__getitem__), seconds


def ranks(values):
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    for position, index in enumerate(order):
        out[index] = float(position)
    return out


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    mean = (len(a) - 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb, strict=True))
    var = sum((x - mean) ** 2 for x in ra)
    return cov / var


def test_data_is_the_shape_under_test():
    # Rev 1's timings were keyed before kernel revisions were; rev 2 is today's kernel (its
    # key was written before every key named its kernel by a digest).
    assert QWEN3_30B_INT4.shape_key() == DATA["problem"] + ",kernel_rev=2" == REV2["problem"]
    assert BATCH_SIZES == [1, 16, 64, 256]
    assert len(REV2_BATCH_SIZES) == 18


@pytest.mark.parametrize("batch_size", REV2_BATCH_SIZES)
def test_todays_kernel_best_ranks_in_the_models_top_twentieth(batch_size):
    order, seconds = ranking(batch_size)
    times = measured(batch_size, REV2)
    best = min(times, key=times.__getitem__)
    assert order.index(best) < len(order) // 20, f"{best.short()} at {order.index(best)}"
    # ...and the model's time of it is the measured order of magnitude.
    assert times[best] / 1.5 < seconds[best] * 1e6 < times[best] * 1.5


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_measured_best_is_in_the_models_top_tenth(batch_size):
    order, _ = ranking(batch_size)
    times = measured(batch_size)
    best = min(times, key=times.__getitem__)
    assert order.index(best) < len(order) // 10, f"{best.short()} at {order.index(best)}"


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_wide_deep_four_warp_tiles_rank_in_the_bottom_half(batch_size):
    order, _ = ranking(batch_size)
    huge = [
        c for c in order if c.BLOCK_SIZE_N == 256 and c.BLOCK_SIZE_K == 256 and c.num_warps == 4
    ]
    assert huge
    assert min(order.index(c) for c in huge) >= len(order) // 2


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_model_orders_the_measured_candidates(batch_size):
    _, seconds = ranking(batch_size)
    times = measured(batch_size)
    common = [c for c in times if c in seconds]
    assert len(common) == len(times)  # every timed candidate survives pruning
    rho = spearman([seconds[c] for c in common], [times[c] for c in common])
    assert rho >= 0.7, f"Spearman {rho:.2f} at M={batch_size}"


def test_model_time_of_the_best_is_the_measured_order_of_magnitude():
    # L1-bound at about 2 dequantized elements per SM cycle: within a factor 1.5 of the H200.
    for batch_size in BATCH_SIZES:
        times = measured(batch_size)
        best = min(times, key=times.__getitem__)
        model_us = predicted_seconds(QWEN3_30B_INT4, batch_size, best, H200) * 1e6
        assert times[best] / 1.5 < model_us < times[best] * 1.5, (batch_size, model_us)


def test_expected_row_blocks_counts_partial_blocks():
    # One token per expert slot at most when M=1: exactly top_k blocks.
    assert expected_row_blocks(1, 128, 8, 16) == pytest.approx(8.0)
    # M=256, top-8 of 128: 16 tokens per expert on average, but the spread means
    # many experts need two 16-row blocks; with 32 rows nearly all need one.
    assert expected_row_blocks(256, 128, 8, 16) > 1.4 * 128
    assert expected_row_blocks(256, 128, 8, 32) < 1.05 * 128
    # Every expert hit with probability 1: ceil(M / BLOCK_SIZE_M) each.
    assert expected_row_blocks(20, 4, 4, 16) == pytest.approx(4 * 2)


def test_bf16_has_no_dequantization_term():
    bf16 = TuneProblem(128, 768, 2048, 8, "bf16")
    c = Candidate(16, 256, 256, 1, 4, 3)
    assert predicted_seconds(bf16, 16, c, H200) < predicted_seconds(QWEN3_30B_INT4, 16, c, H200) / 5
