"""`moetune report`: a finished tune's summary again, from its save dir, with plots."""

from __future__ import annotations

import json
from pathlib import Path

import click

REPORT_FOLDER = "report"


@click.command("report")
@click.argument(
    "save_dirs", metavar="SAVE_DIR...", nargs=-1, required=True, type=click.Path(path_type=Path)
)
@click.option(
    "--output",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Folder for index.html and the PNG plots. Default: <first SAVE_DIR>/{REPORT_FOLDER}/.",
)
@click.option(
    "json_",
    "--json",
    is_flag=True,
    help="Print the report as JSON on stdout and write no files (with --output: the page too).",
)
def report(save_dirs: tuple[Path, ...], output: Path | None, json_: bool) -> None:
    """Show tune results again: time per batch size against the engines' configs, with plots.

    Reads each SAVE_DIR (the folder `moetune tune --save-dir` wrote): the summary
    the tune kept there (summary.json), else what the results store and the written
    files still tell, and says what is missing. Prints a table per tuned shape
    (the tuned config's time, each baseline's, the speedup, the roofline floor)
    and writes one self-contained HTML page with a log-log plot per shape and
    engine, the plots also as PNG files beside it. Shapes found in several save
    dirs (two GPUs, two Triton versions) are compared on the page, with a ratio
    table. Needs no GPU, torch or triton; the plots need matplotlib
    (in the moetune checkout: pip install -e ".[report]").

    \b
    Example usage:
        moetune report tuned
        moetune report tuned-h200 tuned-h100 --output h200-vs-h100
        moetune report tuned --json > tuned.json
    """
    from moetune.report.data import ReportError, load_report

    report_data = load_report(save_dirs)
    for line in report_data.diagnostics:
        click.echo(f"Note: {line}", err=True)
    document = report_data.to_json() if json_ else None
    written = None
    if output is not None or not json_:
        folder = output if output is not None else report_data.save_dirs[0] / REPORT_FOLDER
        from moetune.fileio import LinkedPathError
        from moetune.report.page import write_report

        try:
            written = write_report(report_data, folder)
        except LinkedPathError:
            raise  # its line names the link and what to do
        except OSError as exc:
            raise ReportError(f"cannot write the report in {folder}: {exc}") from None
        if written.skipped:
            click.echo(f"Note: {written.skipped}", err=True)
    if document is not None:
        if written is not None:
            document["output"] = {
                "page": str(written.page),
                "plots": [str(path) for path in written.plots],
            }
        click.echo(json.dumps(document, indent=2))
        return
    from moetune.report.text import report_lines

    for line in report_lines(report_data):
        click.echo(line)
    count = len(written.plots)
    plotted = f" and {count} plot{'s' if count != 1 else ''} beside it" if count else ""
    click.echo(f"\nWrote {written.page}{plotted}.")
