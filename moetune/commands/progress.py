"""The progress bar of `moetune tune`: what it shows and how it fits the terminal.

The ETA is the time left at the rate of the run so far (elapsed time over the
share done), so it is a time as soon as the first unit of work is done, and a
pause (a compile, a stage without timings) raises it while it lasts. The bar takes
what the line leaves; on a narrow terminal the stage text and the counts then give
up their width, ending in "…", and the elapsed time and the ETA stay whole. rich is imported inside
the functions: only the commands that draw a bar load it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BAR_WIDTH = (5, 30)  # the bar's least and greatest width; between them, what the line leaves


def seconds_left(elapsed: float | None, done: float, total: float | None) -> float | None:
    """Time left at the run's rate so far; None before any work is done."""
    if elapsed is None or total is None or done <= 0:
        return None
    return max(0.0, elapsed * (total - done) / done)


def clock_text(seconds: float | None) -> str:
    """H:MM:SS, or -:--:-- when unknown."""
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}"


def tune_progress(console: Any, get_time: Callable[[], float] | None = None) -> Any:
    """A rich `Progress` for a tune: stage, bar, percent, counts, elapsed time and ETA.

    A task's ``status`` field holds the counts (`counts_text`). `get_time` is the
    clock (tests pass their own).
    """
    from rich.cells import cell_len
    from rich.progress import BarColumn, Progress, ProgressColumn, TaskProgressColumn
    from rich.table import Column
    from rich.text import Text

    def elapsed_text(task: Any) -> str:
        return clock_text((task.finished_time if task.finished else task.elapsed) or 0.0)

    def eta_text(task: Any) -> str:
        left = 0.0 if task.finished else seconds_left(task.elapsed, task.completed, task.total)
        return f"ETA {clock_text(left)}"

    class Shrinking(ProgressColumn):
        """Text that gives up its width first: one line, cut with "…" where it must be."""

        def __init__(self, field: str) -> None:
            self.field = field
            super().__init__(table_column=Column(no_wrap=False))

        def render(self, task: Any) -> Any:
            text = task.description if self.field == "description" else task.fields[self.field]
            return Text(text, no_wrap=True, overflow="ellipsis")

    class Whole(ProgressColumn):
        def __init__(self, text: Callable[[Any], str], style: str) -> None:
            self.text, self.style = text, style
            super().__init__(table_column=Column(no_wrap=True))

        def render(self, task: Any) -> Any:
            return Text(self.text(task), style=self.style)

    class Bar(BarColumn):
        """A bar as wide as the rest of the line leaves, within `BAR_WIDTH`."""

        def __init__(self) -> None:
            super().__init__(table_column=Column(no_wrap=True))

        def render(self, task: Any) -> Any:
            texts = (task.description, task.fields.get("status", ""), "100%")
            used = sum(map(cell_len, texts)) + len(elapsed_text(task)) + len(eta_text(task))
            room = console.width - used - 5  # a space between each two of the 6 columns
            self.bar_width = min(max(room, BAR_WIDTH[0]), BAR_WIDTH[1])
            return super().render(task)

    columns = (
        Shrinking("description"),
        Bar(),
        TaskProgressColumn(),
        Shrinking("status"),
        Whole(elapsed_text, "progress.elapsed"),
        Whole(eta_text, "progress.remaining"),
    )
    return Progress(*columns, console=console, transient=False, get_time=get_time)


def counts_text(measured: int, stored: int, failed: int) -> str:
    """The counts the bar shows beside the percentage: timings, and the others that happened."""
    parts = [f"{measured} timed"]
    if stored:
        parts.append(f"{stored} from store")
    if failed:
        parts.append(f"{failed} failed")
    return ", ".join(parts)
