"""Plots as PNG bytes: per (shape, engine) the time per batch size (log-log) and the speedup
per batch size (linear, where gains of 1-11 % show); one time plot per comparison. Where the
tune confirmed its times (`moetune.tune.confirm`), each point carries its 95 % interval as an
error bar.

matplotlib is optional (``pip install -e ".[report]"`` in the checkout) and imported inside the
plotting functions only, through its object API (`Figure`, the Agg canvas): no
pyplot, no display, no global state.
"""

from __future__ import annotations

import importlib.util
import io
import math
from typing import Any

from moetune.engines.formats import engine_label
from moetune.report.data import Comparison, ShapeReport

INSTALL_HINT = 'pip install matplotlib, or in the moetune checkout: pip install -e ".[report]"'
MISSING_LINE = f"no plots: matplotlib is not installed ({INSTALL_HINT})"
STYLES = {  # by baseline key: line style and marker
    "vllm_fallback": ("--", "s"),
    "sglang_fallback": ("--", "D"),
    "vllm_file": ("-.", "^"),
    "sglang_file": ("-.", "v"),
}


def available() -> bool:
    """Whether matplotlib can be imported (without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


# A plot's size in inches and its text sizes in points. The page shows a plot about 36em
# (some 580 px) wide beside its table, near its natural 576 px (6.4 in at 90 dpi), so its
# text reads at about the size of the page's own.
FIGURE_SIZE = (6.4, 4.2)
FIGURE_DPI = 90
TITLE_SIZE = 11
LABEL_SIZE = 10
TICK_SIZE = 10
LEGEND_SIZE = 9
# Tick labels on the log2 batch-size axis closer than this (in doublings) to the last one
# labelled are left out: 24 beside 16 and 32 would collide when set upright.
TICK_LABEL_SPACING = 0.9


def tick_labels(batch_sizes: list[int]) -> list[str]:
    """A label for each batch size, "" where it would crowd the one labelled before it on a
    log2 axis (every batch size keeps its tick)."""
    labels, last = [], None
    for m in batch_sizes:
        if last is None or math.log2(m) - math.log2(last) >= TICK_LABEL_SPACING:
            labels.append(str(m))
            last = m
        else:
            labels.append("")
    return labels


def _figure(title: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_SIZE, dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title, fontsize=TITLE_SIZE)
    return figure, axes


def _finish(figure: Any, axes: Any, batch_sizes: list[int], *, log_y: bool = True) -> bytes:
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axes.set_xscale("log", base=2)
    axes.set_xticks(batch_sizes, tick_labels(batch_sizes), fontsize=TICK_SIZE)
    axes.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        axes.set_yscale("log")
        axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axes.yaxis.set_major_formatter(ScalarFormatter())
        axes.yaxis.set_minor_formatter(NullFormatter())
        axes.set_ylabel("time per fused-MoE call (us)", fontsize=LABEL_SIZE)
    axes.tick_params(axis="y", which="both", labelsize=TICK_SIZE)
    axes.set_xlabel("batch size M (tokens)", fontsize=LABEL_SIZE)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize=LEGEND_SIZE)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _points(pairs: list[tuple[int, float | None]]) -> tuple[list[int], list[float]]:
    kept = [(m, v) for m, v in pairs if v is not None]
    return [m for m, _ in kept], [v for _, v in kept]


def error_bars(
    points: list[tuple[int, float | None, tuple[float, float] | None]],
) -> tuple[list[int], list[float], list[list[float]] | None]:
    """x, y and matplotlib's ``yerr`` (distances below and above each point) of the points
    that have a value; ``yerr`` None where no point has an interval (a tune without a
    confirmation), 0 for a point without one."""
    kept = [(m, v, span) for m, v, span in points if v is not None]
    if not any(span is not None for _, _, span in kept):
        return [m for m, _, _ in kept], [v for _, v, _ in kept], None
    below = [max(0.0, v - span[0]) if span else 0.0 for _, v, span in kept]
    above = [max(0.0, span[1] - v) if span else 0.0 for _, v, span in kept]
    return [m for m, _, _ in kept], [v for _, v, _ in kept], [below, above]


def _shape_title(shape: ShapeReport, what: str) -> str:
    """A plot's title in short lines (a long problem key on one line runs off the plot):
    the shape, the kernel and machine it was timed on, and what the plot shows."""
    return (
        f"{shape.shape_key}\n{shape.kernel}, {shape.device_name}, Triton "
        f"{shape.triton_version}\n{shape.name}: {what}"
    )


def shape_plot(shape: ShapeReport, engine: str | None) -> bytes:
    """The tuned config against `engine`'s baselines (None: all) and the floor, as PNG."""
    which = engine_label(engine, "all engines")
    figure, axes = _figure(_shape_title(shape, which))
    ms = [row.batch_size for row in shape.rows]
    x, y, yerr = error_bars([(r.batch_size, r.latency_us, r.latency_interval) for r in shape.rows])
    axes.errorbar(
        x, y, yerr=yerr, fmt="-o", color="C0", linewidth=2, markersize=4, capsize=2,
        label="tuned (moetune)",
    )  # fmt: skip
    for index, baseline in enumerate(shape.baselines_of(engine), start=1):
        style, marker = STYLES.get(baseline.key, ("--", "x"))
        x, y, yerr = error_bars(
            [
                (
                    r.batch_size,
                    r.baseline_us.get(baseline.key),
                    r.baseline_intervals.get(baseline.key),
                )
                for r in shape.rows
            ]
        )
        axes.errorbar(
            x, y, yerr=yerr, fmt=style, marker=marker, color=f"C{index}", markersize=4,
            capsize=2, label=baseline.label,
        )  # fmt: skip
    x, y = _points([(r.batch_size, r.floor_us) for r in shape.rows])
    if x:
        axes.plot(x, y, ":", color="0.4", label="roofline floor")
    return _finish(figure, axes, ms)


def speedup_plot(shape: ShapeReport, engine: str | None) -> bytes:
    """Speedup of the written file over each of `engine`'s baselines (None: all) per batch
    size, on a linear axis around 1, with the confirmation's intervals as error bars."""
    which = engine_label(engine, "all engines")
    figure, axes = _figure(_shape_title(shape, f"{which}, speedup"))
    ms = [row.batch_size for row in shape.rows]
    axes.axhline(1.0, color="0.4", linewidth=1, linestyle=":")
    for index, baseline in enumerate(shape.baselines_of(engine), start=1):
        style, marker = STYLES.get(baseline.key, ("--", "x"))
        x, y, yerr = error_bars(
            [
                (r.batch_size, r.speedup_over(baseline.key), r.speedup_intervals.get(baseline.key))
                for r in shape.rows
            ]
        )
        axes.errorbar(
            x, y, yerr=yerr, fmt=style, marker=marker, color=f"C{index}", markersize=4,
            capsize=2, label=f"over the {baseline.label}",
        )  # fmt: skip
    confirmed = "confirmed, 95 % interval" if shape.confirmation else "the search's timings"
    axes.set_ylabel(f"speedup of the written file ({confirmed})", fontsize=LABEL_SIZE)
    return _finish(figure, axes, ms, log_y=False)


def comparison_plot(comparison: Comparison) -> bytes:
    """Each member's tuned time (and its floor, where kept) on one set of axes, as PNG."""
    figure, axes = _figure(f"{comparison.problem_key}\ntuned time, compared")
    for index, (label, member) in enumerate(
        zip(comparison.labels(), comparison.members, strict=True)
    ):
        x, y = _points([(m, comparison.latency(member, m)) for m in comparison.batch_sizes()])
        axes.plot(x, y, "-o", color=f"C{index}", markersize=4, label=label)
        x, y = _points([(r.batch_size, r.floor_us) for r in member.rows])
        if x:
            axes.plot(x, y, ":", color=f"C{index}", label=f"{label}: roofline floor")
    return _finish(figure, axes, comparison.batch_sizes())
