"""bench/between_gemms.py on the CPU: what it counts as a stand-in, and its arithmetic."""

import json
import os

import between_gemms
import pytest
import torch

# `make test-gpu` runs without the interpreter: the script times on the GPU there.
GPU = os.environ.get("MOETUNE_GPU_TESTS") == "1"


def test_the_headroom_is_what_the_stand_ins_spend_above_their_floors():
    row = {
        "median_us": {"call": 200.0, "routing": 6.0, "SiLU-and-mul": 14.0, "top-k sum": 9.0},
        "steps": {
            "routing": {"stand_in": True, "floor_us": 4.0},
            "SiLU-and-mul": {"stand_in": True, "floor_us": 10.0},
            # the engine's own step (SGLang's Triton sum): timed, not counted
            "top-k sum": {"stand_in": False, "floor_us": None},
        },
    }
    summary = between_gemms.point_summary(row)
    assert summary["stand_in_us"] == pytest.approx(20.0)
    assert summary["stand_in_share"] == pytest.approx(0.10)
    assert summary["headroom"] == pytest.approx((2.0 + 4.0) / 200.0)
    # a step already faster than its floor adds nothing (never a negative headroom)
    row["median_us"]["routing"] = 3.0
    assert between_gemms.point_summary(row)["headroom"] == pytest.approx(4.0 / 200.0)


@pytest.mark.slow
def test_a_run_writes_rows_and_counts_only_moetunes_steps(tmp_path):
    rc = between_gemms.main(
        [
            "--engine",
            "sglang",
            "--device",
            "cuda" if GPU else "cpu",
            "--shape",
            "tiny-fp8-block",
            "--shape",
            "tiny-bf16",
            "--batch-sizes",
            "12",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    rows = {
        r["shape"]: r
        for r in map(json.loads, (tmp_path / "between_gemms.jsonl").read_text().splitlines())
    }
    fp8, bf16 = rows["tiny-fp8-block"]["steps"], rows["tiny-bf16"]["steps"]
    assert fp8["x quantization"]["stand_in"] and fp8["SiLU-and-mul + quant"]["stand_in"]
    assert not fp8["top-k sum"]["stand_in"]  # top-2: SGLang's own torch.add
    # top-4 at 12 tokens: SGLang's own Triton sum where the GPU has PDL, else moetune's
    assert bf16["top-k sum"]["stand_in"] is not (GPU and torch.cuda.get_device_capability()[0] >= 9)
    assert not bf16["torch: top-k sum"]["stand_in"]
    for row in rows.values():
        assert row["median_us"]["call"] > 0 and 0 < row["stand_in_share"]
        assert 0 <= row["headroom"] <= row["stand_in_share"]
    table = between_gemms.report(tmp_path / "between_gemms.jsonl")
    assert table.count("\n| tiny-") == 2
