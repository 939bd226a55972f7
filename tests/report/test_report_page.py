"""The page, the JSON and the terminal table say the same numbers, whatever the rows hold."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from savedirs import Page, body_rows

from moetune.report.data import (
    FROM_SUMMARY,
    BaselineInfo,
    Comparison,
    Report,
    Row,
    ShapeReport,
)
from moetune.report.page import render_page
from moetune.report.text import report_lines

BASELINES = [
    BaselineInfo("vllm_fallback", "vLLM fallback", "get_default_config"),
    BaselineInfo("vllm_file", "vLLM file", "/x/E=4.json"),
]
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 32,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
times = st.one_of(st.none(), st.floats(0.5, 5000, allow_nan=False))


@st.composite
def shapes(draw, name="a", device="NVIDIA H200"):
    batch_sizes = draw(st.lists(st.integers(1, 8192), min_size=1, max_size=8, unique=True))
    rows = [
        Row(
            m,
            CONFIG,
            draw(times),
            {b.key: draw(times) for b in BASELINES},
            draw(times),
        )
        for m in sorted(batch_sizes)
    ]
    return ShapeReport(
        Path(f"/runs/{name}"),
        name,
        "E=4,N=32,K=64,topk=2,dtype=bf16",
        device,
        "3.6.0",
        FROM_SUMMARY,
        ("vllm",),
        rows,
        BASELINES,
    )


@settings(max_examples=40, deadline=None)
@given(shapes())
def test_page_cells_are_the_json_numbers(shape):
    report = Report([shape.save_dir], [shape], [], [])
    [table] = Page(render_page(report, {}, None)).tables_of("speedup")
    document = json.loads(json.dumps(report.to_json()))
    [kept] = document["shapes"]
    rows = body_rows(table)
    assert len(rows) == len(kept["results"])
    for row, result in zip(rows, kept["results"], strict=True):
        assert int(row["batch_size"]["text"]) == result["batch_size"]
        pairs = [("latency_us", result["latency_us"]), ("floor_us", result["floor_us"])]
        pairs += [("roofline_fraction", result["roofline_fraction"])]
        for key, value in result["baselines"].items():
            pairs += [(f"{key}_us", value["latency_us"]), (f"{key}_speedup", value["speedup"])]
        for column, value in pairs:
            cell = row[column]
            if value is None:
                assert cell["text"] == "-" and "data-value" not in cell
            else:
                assert float(cell["data-value"]) == value
        if result["roofline_fraction"] is not None:
            assert 0 < result["roofline_fraction"] <= 1
    text = report_lines(report)
    assert len([line for line in text if line.startswith("  ")]) == len(rows) + 1  # + header


@settings(max_examples=40, deadline=None)
@given(shapes("a"), shapes("b", device="NVIDIA H100"))
def test_ratios_are_time_over_the_reference(first, second):
    comparison = Comparison(first.problem_key, [first, second])
    ratios = []
    for m in comparison.batch_sizes():
        a, b = comparison.latency(first, m), comparison.latency(second, m)
        ratio = comparison.ratio(second, m)
        assert (ratio is None) == (not a or not b)
        if ratio is not None:
            assert abs(ratio * a - b) <= 1e-9 * b
            ratios.append(ratio)
    geomean = comparison.geomean_ratio(second)
    if ratios:
        assert min(ratios) * (1 - 1e-9) <= geomean <= max(ratios) * (1 + 1e-9)
    else:
        assert geomean is None
    report = Report([first.save_dir, second.save_dir], [first, second], [comparison], [])
    [table] = Page(render_page(report, {}, None)).tables_of("ratio")
    assert [cell["text"] for cell in table[1][0]] == ["M", "a us", "b us", "b / a"]
    assert len(body_rows(table)) == len(comparison.batch_sizes()) + 1  # + the geomean row


def test_one_shape_timed_on_two_kernels_is_compared_and_labelled_by_kernel():
    from dataclasses import replace

    from moetune.report.data import compare

    twin = ShapeReport(
        Path("/runs/a"),
        "a",
        "E=4,N=32,K=64,topk=2,dtype=bf16",
        "NVIDIA H200",
        "3.6.0",
        FROM_SUMMARY,
        ("vllm",),
        [Row(1, CONFIG, 10.0, {})],
        [],
    )
    engine = replace(twin, problem_key=twin.problem_key + ",kernel=vllm@0.33.0")
    other = replace(twin, problem_key="E=8,N=32,K=64,topk=2,dtype=bf16")
    [comparison] = compare([twin, engine, other])
    assert comparison.problem_key == "E=4,N=32,K=64,topk=2,dtype=bf16"
    assert comparison.labels() == ["a, moetune kernel", "a, kernel vllm@0.33.0"]


def test_error_bars_are_the_distances_to_each_interval():
    import pytest

    from moetune.report.plots import error_bars

    x, y, yerr = error_bars([(1, 10.0, (9.5, 10.7)), (2, None, None), (4, 8.0, None)])
    assert (x, y) == ([1, 4], [10.0, 8.0])
    assert yerr == [[pytest.approx(0.5), 0.0], [pytest.approx(0.7), 0.0]]
    # A summary without a confirmation: no bars at all.
    assert error_bars([(1, 10.0, None)]) == ([1], [10.0], None)
