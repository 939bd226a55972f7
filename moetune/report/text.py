"""The report as plain-text tables, for the terminal (the page shows the same numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from moetune.report.data import FROM_SUMMARY, Comparison, Report, ShapeReport
from moetune.tune.store import STORE_FILENAME
from moetune.tune.summary_file import SUMMARY_FILENAME


def us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def config_text(config: dict[str, int] | None) -> str:
    """``M16 N64 K128 G1 w4 s3``, as the tune's summary shows a config."""
    if not config:
        return "-"
    tags = ("M", "N", "K", "G", "w", "s")
    keys = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
    keys += ("num_warps", "num_stages")
    return " ".join(f"{tag}{config.get(key, '-')}" for tag, key in zip(tags, keys, strict=True))


def with_speedup(base: float | None, speedup: float | None) -> str:
    return "-" if base is None else f"{base:.1f} ({times(speedup)})"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = ()
) -> list[str]:
    """Columns padded to their widest cell; those in `left` left-aligned, the rest right."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(width) if index in left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  " + "  ".join(parts).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def shape_table(shape: ShapeReport) -> tuple[list[str], list[list[str]]]:
    """The speedup table's headers and rows (text cells)."""
    headers = ["M", "config", "tuned us"]
    headers += [f"{b.label} us (speedup)" for b in shape.baselines]
    headers += ["floor us", "of roofline"]
    rows = []
    for row in shape.rows:
        cells = [str(row.batch_size), config_text(row.config), us(row.latency_us)]
        cells += [
            with_speedup(row.baseline_us.get(b.key), row.speedup_over(b.key))
            for b in shape.baselines
        ]
        cells += [us(row.floor_us), percent(row.roofline_fraction)]
        rows.append(cells)
    return headers, rows


def origin_line(shape: ShapeReport) -> str:
    if shape.origin == FROM_SUMMARY:
        return f"From {Path(shape.save_dir) / SUMMARY_FILENAME}"
    return f"Rebuilt from {Path(shape.save_dir) / STORE_FILENAME} and the written files"


def headline(shape: ShapeReport) -> str:
    parts = [
        f"{times(shape.geomean_speedup(b.key))} over the {b.label}"
        for b in shape.baselines
        if shape.geomean_speedup(b.key) is not None
    ]
    return "Geomean speedup: " + ("; ".join(parts) if parts else "no baseline timed") + "."


def shape_lines(shape: ShapeReport) -> list[str]:
    headers, rows = shape_table(shape)
    lines = [shape.title, origin_line(shape), *table(headers, rows, left=(1,)), headline(shape)]
    if shape.floor:
        lines.append(shape.floor)
    lines += [f"Missing: {line}" for line in shape.missing]
    if shape.notes:
        count = len(shape.notes)
        lines.append(f"The tune left {count} note{'s' if count > 1 else ''} (on the page).")
    return lines


def comparison_lines(comparison: Comparison) -> list[str]:
    labels = comparison.labels()
    reference = labels[0]
    lines = [
        f"Compare {comparison.problem_key}: tuned us per batch size "
        f"(ratio: time over {reference}'s; below 1 is faster)"
    ]
    lines += [
        f"  {label}: {member.device_name}, Triton {member.triton_version}, {member.save_dir}"
        for label, member in zip(labels, comparison.members, strict=True)
    ]
    headers = ["M", *(f"{label} us" for label in labels)]
    rows = []
    for m in comparison.batch_sizes():
        cells = [str(m), us(comparison.latency(comparison.reference, m))]
        cells += [
            with_speedup(comparison.latency(member, m), comparison.ratio(member, m))
            for member in comparison.members[1:]
        ]
        rows.append(cells)
    lines += table(headers, rows)
    ratios = [
        f"{label} {times(comparison.geomean_ratio(member))}"
        for label, member in zip(labels[1:], comparison.members[1:], strict=True)
    ]
    lines.append("Geomean ratio: " + "; ".join(ratios) + ".")
    return lines


# The device name of a tune timed on the CPU under the Triton interpreter (its plans and
# files say "cpu"; moetune.commands.options.CPU_DEVICE_NAME).
CPU_DEVICE = "cpu"
CPU_WARNING = (
    "Timed on the CPU under the Triton interpreter (TRITON_INTERPRET=1, device {devices}): "
    "these times and speedups test moetune's pipeline only and say nothing about any GPU. "
    "Tune on the GPU you serve with for numbers that mean something."
)


def timed_on_cpu(device_name: str) -> bool:
    """Whether a shape's times come from the CPU (the interpreter), not a GPU."""
    return device_name.strip().lower() == CPU_DEVICE


def cpu_warning(report: Report) -> str | None:
    """`CPU_WARNING` where some shape of `report` was timed on the CPU, else None."""
    on_cpu = sorted({s.device_name for s in report.shapes if timed_on_cpu(s.device_name)})
    return CPU_WARNING.format(devices=", ".join(on_cpu)) if on_cpu else None


def report_lines(report: Report) -> list[str]:
    """Every shape's table, then every comparison's, a blank line between them; first, the
    warning of a report timed on the CPU."""
    warning = cpu_warning(report)
    blocks = [[f"Warning: {warning}"]] if warning else []
    blocks += [shape_lines(shape) for shape in report.shapes]
    blocks += [comparison_lines(c) for c in report.comparisons]
    lines: list[str] = []
    for block in blocks:
        if lines:
            lines.append("")
        lines += block
    return lines
