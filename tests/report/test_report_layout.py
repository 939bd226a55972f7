"""The page's layout and warnings (issue 31): plots beside their tables, headings that tell
sections apart, readable plots, and a banner where the times come from the CPU."""

from __future__ import annotations

import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from moetune.report.data import FROM_SUMMARY, BaselineInfo, Report, Row, ShapeReport, compare
from moetune.report.page import render_page, section_headings
from moetune.report.plots import FIGURE_DPI, FIGURE_SIZE, tick_labels

BASELINES = [BaselineInfo("vllm_fallback", "vLLM fallback", "get_default_config")]
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 32,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
KEY = "E=4,N=32,K=64,topk=2,dtype=bf16"


def shape(name="a", device="NVIDIA H200", engines=("vllm",), key=KEY):
    rows = [Row(m, CONFIG, 100.0 * m, {"vllm_fallback": 121.0 * m}) for m in (1, 2, 4)]
    return ShapeReport(
        Path(f"/runs/{name}"), name, key, device, "3.6.0", FROM_SUMMARY, engines, rows, BASELINES
    )


def page_of(*shapes):
    report = Report([s.save_dir for s in shapes], list(shapes), compare(shapes), [])
    return render_page(report, {}, None)


class Outline(HTMLParser):
    """Headings, and for each element with a class the classes of its parents."""

    def __init__(self, text):
        super().__init__()
        self.headings, self.stack, self.nested, self.warnings = [], [], [], []
        self._in = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        css = dict(attrs).get("class") or ""
        self.nested.append((tag, css, [c for _, c in self.stack]))
        if tag not in ("img", "meta", "br"):
            self.stack.append((tag, css))
        self._in = tag if tag == "h2" else ("warning" if css == "warning" else None)
        if self._in == "h2":
            self.headings.append("")
        elif self._in == "warning":
            self.warnings.append("")

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1][0] == tag:
            self.stack.pop()
        self._in = None

    def handle_data(self, data):
        if self._in == "h2":
            self.headings[-1] += data
        elif self._in == "warning":
            self.warnings[-1] += data


def test_each_table_sits_beside_its_plots_in_a_grid():
    text = page_of(shape("a"), shape("b"))
    outline = Outline(text)
    tables = [parents for tag, css, parents in outline.nested if tag == "table" and css != "dirs"]
    assert len(tables) == 3  # two shapes, one comparison
    for parents in tables:
        assert parents[-2:] == ["side", "tables"]
    plots = [parents for tag, css, parents in outline.nested if css == "plots"]
    assert len(plots) == 3 and all(parents[-1] == "side" for parents in plots)
    style = re.search(r"\.side \{([^}]*)\}", text)[1]
    assert "display: grid" in style and "grid-template-columns" in style


def test_two_sections_of_one_shape_have_distinct_headings_saying_what_differs():
    first, second = shape("h200-12-01"), shape("h200-11-30", engines=("vllm", "sglang"))
    headings = Outline(page_of(first, second)).headings
    assert headings[0] != headings[1]
    assert headings[0].endswith("(files for vLLM, save dir h200-12-01)")
    assert headings[1].endswith("(files for vLLM and SGLang, save dir h200-11-30)")
    assert headings[2] == f"Compare {KEY}"


def test_headings_that_differ_already_are_left_alone():
    one, two = shape("a"), shape("a", key=KEY + ",kernel=sglang-0.5.23")
    assert section_headings([one, two]) == [one.title, two.title]


def test_sections_nothing_tells_apart_are_numbered():
    assert section_headings([shape("a"), shape("a")]) == [
        f"{KEY} on NVIDIA H200, Triton 3.6.0 (#1)",
        f"{KEY} on NVIDIA H200, Triton 3.6.0 (#2)",
    ]


def test_a_cpu_page_warns_that_its_times_mean_nothing():
    text = page_of(shape("cpu-run", device="cpu"))
    outline = Outline(text)
    assert len(outline.warnings) == 2  # at the top, and in the section
    assert 'id="cpu-warning" role="alert"' in text
    assert text.index('id="cpu-warning"') < text.index('<section class="shape"')
    for warning in outline.warnings:
        assert "CPU under the Triton interpreter" in warning
        assert "say nothing about any GPU" in warning


def test_a_gpu_page_has_no_cpu_warning():
    text = page_of(shape("gpu-run"))
    assert Outline(text).warnings == [] and "interpreter" not in text


def test_tick_labels_are_upright_and_thinned_where_they_would_collide():
    engines = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
    labels = tick_labels(engines)
    assert len(labels) == len(engines)
    assert [m for m, label in zip(engines, labels, strict=True) if label] == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
    ]  # fmt: skip
    assert tick_labels([1, 4]) == ["1", "4"]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_a_plot_is_drawn_near_the_width_the_page_shows_it_at():
    """About 580 px, the page's 36em column: the text is not scaled down to a thumbnail."""
    pytest.importorskip("matplotlib")
    from moetune.report.plots import shape_plot, speedup_plot

    for plot in (shape_plot, speedup_plot):
        width, height = png_size(plot(shape("a"), "vllm"))
        assert width == round(FIGURE_SIZE[0] * FIGURE_DPI) and 500 <= width <= 640
        assert height < width
