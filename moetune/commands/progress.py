"""The progress bar of `moetune tune`: what it shows and how it fits the terminal.

rich is imported inside the functions: only the commands that draw a bar load it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def tune_progress(console: Any, get_time: Callable[[], float] | None = None) -> Any:
    """A rich `Progress` for a tune: stage, bar, percent, counts, elapsed time and ETA.

    A task's ``status`` field holds the counts (`counts_text`). `get_time` is the
    clock (tests pass their own).
    """
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=console, transient=False, get_time=get_time)


def counts_text(measured: int, stored: int, failed: int) -> str:
    """The counts the bar shows beside the percentage."""
    return f"{measured} timed, {stored} from store, {failed} failed"
