"""The report as one self-contained HTML page, its plots embedded, and the plots as PNG files.

`write_report` writes ``index.html`` and one PNG per plot into the output
folder (atomically, `moetune.fileio`; never through a symlink); the page embeds each PNG as a data URI,
so it stands alone when copied elsewhere. Table cells carry their unrounded
value in ``data-value`` for scripts that read the page.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from moetune.engines.formats import engine_label
from moetune.fileio import atomic_write_bytes, atomic_write_text, refuse_links_under
from moetune.report import plots
from moetune.report.data import Comparison, Report, ShapeReport
from moetune.report.text import (
    CPU_WARNING,
    config_text,
    cpu_warning,
    headline,
    origin_line,
    percent,
    timed_on_cpu,
    times,
    us,
)

PAGE_NAME = "index.html"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 110em; }
h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
.side { display: grid; grid-template-columns: minmax(0, 36em) minmax(0, 1fr); gap: 1.5em;
  align-items: start; }
.plots { display: flex; flex-direction: column; gap: 1em; }
.tables { overflow-x: auto; position: sticky; top: 0.5em; }
@media (max-width: 70em) { .side { grid-template-columns: minmax(0, 1fr); } }
figure { margin: 0; }
figure img { width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
.missing li { color: #8a4b00; }
.hint { background: #fff6d6; padding: 0.5em; }
.warning { background: #ffe0e0; border: 2px solid #c00; padding: 0.6em 1em; font-size: 1.1em; }
"""


@dataclass
class Written:
    """What `write_report` wrote: the page, the PNG files, and why plots were left out."""

    page: Path
    plots: list[Path] = field(default_factory=list)
    skipped: str | None = None  # one line: why there are no plots


@dataclass(frozen=True)
class Plot:
    file_name: str
    caption: str
    png: bytes


def slug(text: str, limit: int = 60) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:limit]


def make_plots(report: Report) -> dict[str, list[Plot]]:
    """Plots by section id (``shape-N``, ``compare-N``); {} without matplotlib."""
    if not plots.available():
        return {}
    made: dict[str, list[Plot]] = {}
    for index, shape in enumerate(report.shapes, start=1):
        section = f"shape-{index}"
        for engine in shape.plot_engines():
            name = f"{section}-{slug(shape.problem_key)}-{engine or 'all'}.png"
            caption = engine_label(engine, "all baselines")
            made.setdefault(section, []).append(
                Plot(name, caption, plots.shape_plot(shape, engine))
            )
            made[section].append(
                Plot(
                    name.replace(".png", "-speedup.png"),
                    f"{caption}: speedup",
                    plots.speedup_plot(shape, engine),
                )
            )
    for index, comparison in enumerate(report.comparisons, start=1):
        section = f"compare-{index}"
        name = f"{section}-{slug(comparison.problem_key)}.png"
        made[section] = [Plot(name, "tuned time", plots.comparison_plot(comparison))]
    return made


def write_report(report: Report, output: Path) -> Written:
    """Write the page and its PNGs into `output`; return what was written.

    Plots that cannot be made (matplotlib missing, or failing) leave the tables alone.
    Neither `output` nor a page or plot in it may be a symlink: the report would replace
    files where it points (`moetune.fileio.refuse_links_under`, a `LinkedPathError`).
    """
    written = Written(output / PAGE_NAME)
    within = output.parent
    refuse_links_under(within, written.page)
    try:
        made = make_plots(report)
    except Exception as exc:  # noqa: BLE001 - the tables must not be lost to a plotting failure
        made = {}
        first = str(exc).splitlines()[0] if str(exc) else ""
        written.skipped = f"no plots: matplotlib failed ({type(exc).__name__}: {first})"
    if not plots.available():
        written.skipped = plots.MISSING_LINE
    targets = [output / plot.file_name for section in made.values() for plot in section]
    for target in [written.page, *targets]:  # all refused before the first is written
        refuse_links_under(within, target)
    for plot in (plot for section in made.values() for plot in section):
        path = output / plot.file_name
        written.plots.append(atomic_write_bytes(path, plot.png, within=within))
    atomic_write_text(written.page, render_page(report, made, written.skipped), within=within)
    return written


def _cell(text: str, value: float | None = None, column: str = "") -> str:
    attrs = f' data-col="{escape(column)}"' if column else ""
    if value is not None:
        attrs += f' data-value="{value!r}"'
    return f'<td class="num"{attrs}>{escape(text)}</td>'


def _figures(section: list[Plot]) -> str:
    return "".join(
        f'<figure><img alt="{escape(plot.caption)}" src="data:image/png;base64,'
        f'{base64.b64encode(plot.png).decode()}"><figcaption>{escape(plot.caption)}: '
        f'<a href="{escape(plot.file_name)}">{escape(plot.file_name)}</a></figcaption></figure>'
        for plot in section
    )


def _list(css: str, items: list[str]) -> str:
    if not items:
        return ""
    return f'<ul class="{css}">' + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def shape_table(shape: ShapeReport, index: int) -> str:
    head = ["M", "config", "tuned us"]
    for baseline in shape.baselines:
        head += [f"{baseline.label} us", f"speedup over the {baseline.label}"]
    head += ["floor us", "of roofline"]
    rows = []
    for row in shape.rows:
        cells = [
            _cell(str(row.batch_size), row.batch_size, "batch_size"),
            f'<td data-col="config">{escape(config_text(row.config))}</td>',
            _cell(us(row.latency_us), row.latency_us, "latency_us"),
        ]
        for baseline in shape.baselines:
            base, speedup = row.baseline_us.get(baseline.key), row.speedup_over(baseline.key)
            cells.append(_cell(us(base), base, f"{baseline.key}_us"))
            span = row.speedup_intervals.get(baseline.key)
            text = times(speedup) + ("" if span is None else f" [{span[0]:.3f}-{span[1]:.3f}]")
            cells.append(_cell(text, speedup, f"{baseline.key}_speedup"))
        cells.append(_cell(us(row.floor_us), row.floor_us, "floor_us"))
        fraction = row.roofline_fraction
        cells.append(_cell(percent(fraction), fraction, "roofline_fraction"))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    return (
        f'<table class="speedup" data-shape="{index}"><thead><tr>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def section_headings(shapes: list[ShapeReport]) -> list[str]:
    """Each shape's heading, distinct: the title (problem key, device, Triton), then, where
    two shapes share it, what tells them apart (the kernel timed, the engines written
    for, the save dir), else their number."""
    titles = [shape.title for shape in shapes]
    headings = list(titles)
    for title in set(titles):
        same = [i for i, t in enumerate(titles) if t == title]
        if len(same) < 2:
            continue
        telling = [
            part
            for part in (
                lambda s: s.kernel,
                lambda s: "files for " + " and ".join(map(engine_label, s.engines)),
                lambda s: f"save dir {s.name}",
            )
            if len({part(shapes[i]) for i in same}) > 1
        ]
        for number, i in enumerate(same, start=1):
            what = ", ".join(part(shapes[i]) for part in telling) or f"#{number}"
            headings[i] = f"{title} ({what})"
    return headings


def _figures_and_table(section: list[Plot], table: str) -> str:
    """The plots in a column, the table beside them (below on a narrow page)."""
    return (
        f'<div class="side"><div class="plots">{_figures(section)}</div>'
        f'<div class="tables">{table}</div></div>'
    )


def shape_section(
    shape: ShapeReport, index: int, section: list[Plot], heading: str | None = None
) -> str:
    counts = shape.measurements
    parts = [
        f'<section class="shape" id="shape-{index}">',
        f"<h2>{escape(heading or shape.title)}</h2>",
        f'<p class="origin">{escape(shape.name)}: {escape(origin_line(shape))}</p>',
    ]
    if timed_on_cpu(shape.device_name):
        parts.append(
            f'<p class="warning">{escape(CPU_WARNING.format(devices=shape.device_name))}</p>'
        )
    parts += [
        _figures_and_table(section, shape_table(shape, index)),
        f'<p class="headline">{escape(headline(shape))}</p>',
        *_confirmation_line(shape),
        _list("sources", [f"{b.label}: {b.source}" for b in shape.baselines]),
    ]
    if shape.floor:
        parts.append(f'<p class="floor">{escape(shape.floor)}</p>')
    if shape.missing:
        parts += ["<p>Not in this save dir:</p>", _list("missing", shape.missing)]
    if counts:
        parts.append(
            f'<p class="counts">The store holds {counts.get("full", 0)} full-fidelity and '
            f"{counts.get('quick', 0)} quick timings of this shape, {counts.get('failed', 0)} "
            f"failed candidates and {counts.get('split', 0)} split-GEMM timings.</p>"
        )
    if shape.files:
        parts += ["<p>Files written:</p>", _list("files", shape.files)]
    if shape.notes:
        parts.append(
            f"<details><summary>The tune's notes ({len(shape.notes)})</summary>"
            f"{_list('notes', shape.notes)}</details>"
        )
    parts.append("</section>")
    return "".join(parts)


def _confirmation_line(shape: ShapeReport) -> list[str]:
    """Where the times come from: the confirmation's rounds, or the search's own timings."""
    confirmation = shape.confirmation
    if not confirmation:
        text = "Times and speedups: the search's own timings (no confirmation round)."
    else:
        text = (
            f"Times and speedups: medians of {confirmation.get('rounds')} interleaved "
            f"confirmation rounds; [low-high]: {confirmation.get('interval')}."
        )
    return [f'<p class="confirmation">{escape(text)}</p>']


def comparison_table(comparison: Comparison, index: int) -> str:
    labels = comparison.labels()
    head = ["M", f"{labels[0]} us"]
    for label in labels[1:]:
        head += [f"{label} us", f"{label} / {labels[0]}"]
    rows = []
    for m in comparison.batch_sizes():
        ref = comparison.latency(comparison.reference, m)
        cells = [_cell(str(m), m, "batch_size"), _cell(us(ref), ref, "latency_us_0")]
        for number, member in enumerate(comparison.members[1:], start=1):
            mine, ratio = comparison.latency(member, m), comparison.ratio(member, m)
            cells.append(_cell(us(mine), mine, f"latency_us_{number}"))
            cells.append(_cell(times(ratio), ratio, f"ratio_{number}"))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    geo = [_cell("geomean", None, "batch_size"), "<td></td>"]
    for number, member in enumerate(comparison.members[1:], start=1):
        ratio = comparison.geomean_ratio(member)
        geo += ["<td></td>", _cell(times(ratio), ratio, f"ratio_{number}")]
    rows.append('<tr class="geomean">' + "".join(geo) + "</tr>")
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    return (
        f'<table class="ratio" data-compare="{index}"><thead><tr>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def comparison_section(comparison: Comparison, index: int, section: list[Plot]) -> str:
    labels = comparison.labels()
    members = [
        f"{label}: {m.device_name}, Triton {m.triton_version}, {m.save_dir}"
        for label, m in zip(labels, comparison.members, strict=True)
    ]
    return (
        f'<section class="compare" id="compare-{index}">'
        f"<h2>Compare {escape(comparison.problem_key)}</h2>"
        f"<p>Tuned time per batch size; the ratio is the time over {escape(labels[0])}'s "
        "(below 1 is faster).</p>"
        f"{_list('members', members)}"
        f"{_figures_and_table(section, comparison_table(comparison, index))}"
        "</section>"
    )


def render_page(report: Report, made: dict[str, list[Plot]], skipped: str | None) -> str:
    from moetune import __version__

    dirs = [
        f"<tr><td>{escape(str(path))}</td>"
        f'<td class="num">{sum(1 for s in report.shapes if s.save_dir == path)}</td></tr>'
        for path in report.save_dirs
    ]
    body = [
        "<h1>moetune report</h1>",
        f"<p>moetune {escape(__version__)}: {len(report.shapes)} tuned shape(s) from "
        f"{len(report.save_dirs)} save dir(s). Times are microseconds per fused-MoE call, "
        "timed by <code>moetune tune</code> in the same run as its baselines.</p>",
        '<table class="dirs"><thead><tr><th>save dir</th><th>shapes</th></tr></thead>'
        f"<tbody>{''.join(dirs)}</tbody></table>",
    ]
    warning = cpu_warning(report)
    if warning:
        body.insert(1, f'<p class="warning" id="cpu-warning" role="alert">{escape(warning)}</p>')
    if skipped:
        body.append(f'<p class="hint">{escape(skipped)}</p>')
    if report.diagnostics:
        body += ["<p>While reading:</p>", _list("diagnostics", report.diagnostics)]
    headings = section_headings(report.shapes)
    for index, (shape, heading) in enumerate(zip(report.shapes, headings, strict=True), start=1):
        body.append(shape_section(shape, index, made.get(f"shape-{index}", []), heading))
    for index, comparison in enumerate(report.comparisons, start=1):
        body.append(comparison_section(comparison, index, made.get(f"compare-{index}", [])))
    title = "moetune report: " + ", ".join(sorted({s.problem_key for s in report.shapes}))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
