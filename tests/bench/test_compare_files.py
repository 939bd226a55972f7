"""bench/compare_files.py on the recorded fast-against-thorough benchmarks (2026-12-04, H200)."""

import json
from pathlib import Path

import compare_files  # bench/ is on sys.path (conftest.py)
import pytest

ROOT = Path(__file__).resolve().parents[2]
CALL = ROOT / "bench" / "results" / "2026-12-04-paired-climb" / "h200" / "call2"


def runs(engine):
    return [json.loads((CALL / f"bench-{engine}-{rep}.json").read_text()) for rep in (1, 2)]


def test_the_files_are_matched_by_path_whatever_their_order_in_each_run():
    first, second = runs("sglang")
    assert first["configs"].index(compare_files._column(first, "/qwen235/")) < first[
        "configs"
    ].index(compare_files._column(first, "/qwen235-thorough/"))
    assert second["configs"].index(compare_files._column(second, "/qwen235/")) > second[
        "configs"
    ].index(compare_files._column(second, "/qwen235-thorough/"))
    report = compare_files.compare([first, second], "/qwen235/", "/qwen235-thorough/")
    by_m = {row["batch_size"]: row for row in report["rows"]}
    assert len(by_m) == 18 and by_m[1]["a_us"] == pytest.approx([25.752, 23.4], abs=0.05)
    # M = 1: the two runs disagree in sign (the pairs differ in the down GEMM's GROUP_SIZE_M).
    assert by_m[1]["ratios"][0] < 0.96 and by_m[1]["ratios"][1] > 1.08
    assert by_m[2048]["ratio"] == pytest.approx(0.962, abs=0.001)
    assert report["within_by_run"] == [18, 17] and report["within_by_mean"] == 17
    assert report["same"] == 9


def test_identical_files_compare_at_one_and_the_command_line_prints_the_table(capsys):
    vllm = runs("vllm")
    report = compare_files.compare(vllm, "/qwen235/", "/qwen235/")  # a file against itself
    assert report["geomean"] == pytest.approx(1.0) and report["same"] == 18
    paths = [str(CALL / f"bench-vllm-{rep}.json") for rep in (1, 2)]
    assert compare_files.main([*paths, "--a", "/qwen235/", "--b", "/qwen235-thorough/"]) == 0
    out = capsys.readouterr().out
    assert "within 1% by the geomean of 2 run(s) at 18, in each run alone at 18, 18" in out
    with pytest.raises(SystemExit, match="2 configs of the run match 'qwen235'"):
        compare_files.main([*paths, "--a", "qwen235", "--b", "/qwen235-thorough/"])
