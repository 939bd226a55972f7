"""bench/kernel.py on the CPU interpreter: a tiny run so the script never rots."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kernel.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_kernel", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_checked_results(bench, tmp_path):
    rows = bench.main(["--quick", "--batch-sizes", "1,3", "--out", str(tmp_path)])
    assert [(r["dtype"], r["M"]) for r in rows] == [
        ("bf16", 1),
        ("bf16", 3),
        ("fp8-block", 1),
        ("fp8-block", 3),
    ]
    for row in rows:
        assert row["floor_us"] > 0 and row["bound"] in ("memory", "compute")
        assert row["rel_rms_error"]["default"] < 3e-2, row["rel_rms_error"]
        glue = ["glue_routing", "glue_align", "glue_silu", "glue_sum"]
        if row["dtype"] == "fp8-block":
            glue += ["glue_quant_x", "glue_quant_act", "glue_silu_quant_fused"]
        for variant in ("whole_default", "gemms_default", *glue):
            assert row["timings"][variant]["p50_us"] > 0, (variant, row["errors"])
        assert row["whole_best_x_floor"] > 0
    assert rows[0]["timings"]["grouped_mm"]["p50_us"] > 0, rows[0]["errors"]
    assert "grouped_mm" in rows[2]["errors"]  # no block-scaled fp8 grouped GEMM in torch

    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["rows"]) == 4 and saved["machine"]["triton"]
    markdown = (tmp_path / "results.md").read_text()
    assert "| shape | dtype | M |" in markdown and "| tiny | fp8-block | 3 |" in markdown
    assert "| shape | dtype | M | routing | align |" in markdown


def test_vllm_config_takes_the_nearest_batch_size(bench):
    shape = bench.Shape("mixtral-like", E=8, top_k=2, K=4096, N=7168)
    table = json.loads(
        (bench.VLLM_CONFIG_DIR / "E=8,N=7168,device_name=NVIDIA_H200.json").read_text()
    )
    for M, key in [(1, "1"), (5000, "4096"), (1100, "1024"), (1300, "1536")]:
        assert bench.vllm_config(shape, "bf16", None, M, "NVIDIA H200") == table[key]
    assert bench.vllm_config(shape, "fp8_w8a8", (128, 128), 1, "NVIDIA H200") is None


def test_unknown_shape_is_one_line_error(bench):
    with pytest.raises(SystemExit, match="unknown shape"):
        bench.main(["--shapes", "no-such-model"])
