"""bench/fidelity.py against SGLang's released kernel, on the CPU (the H200 run's script, checked)."""

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engines, pytest.mark.reads_only("sglang")]

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
# `make test-gpu` runs without the interpreter: the script times on the GPU there.
DEVICE = "cuda" if os.environ.get("MOETUNE_GPU_TESTS") == "1" else "cpu"


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True])
def test_fidelity_times_the_sglang_twin_and_sglangs_kernel_side_by_side(
    tmp_path, monkeypatch, sglang_installed, split
) -> None:  # noqa: ANN001
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "fidelity", raising=False)
    import fidelity

    args = ["--engine", "sglang", "--shape", "tiny-fp8-block", "--device", DEVICE]
    args += ["--batch-sizes", "4", "--configs", "2", "--out", str(tmp_path)]
    assert fidelity.main([*args, *(["--split"] if split else [])]) == 0
    rows = [json.loads(line) for line in (tmp_path / "fidelity.jsonl").read_text().splitlines()]
    assert len(rows) == (8 if split else 2)  # up/down, with and without TMA, per config
    for row in rows:
        assert row["kernel"].startswith("sglang-0.5.23@")
        assert row["twin_us"] > 0 and row["engine_us"] > 0
        if not split:  # both kernels' outputs against the float32 reference
            assert row["engine_ok"] and row["twin_ok"]
    probes = {row.get("probe", "whole") for row in rows}
    assert probes == ({"up", "up+tma", "down", "down+tma"} if split else {"whole"})
    table = fidelity.report(tmp_path / "fidelity.jsonl")
    assert table.count("| tiny-fp8-block |") == len(probes)
