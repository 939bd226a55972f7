"""Printing for a terminal of any width that never cuts a name or a path in two.

A path, a file name or a config split over two lines cannot be copied back
whole. So text is wrapped at spaces only, a word longer than the line (a path)
gets a line of its own, whole, and a table is never drawn narrower than its
longest words: on a narrow terminal its lines run past the edge, and the
terminal wraps them (a copy still gives the whole line). rich is imported only
by the commands that print with it.
"""

from __future__ import annotations

import textwrap
from typing import Any


def say(console: Any, text: str, indent: str = "  ") -> None:
    """Print `text` wrapped at spaces to `console`'s width; a word longer than a line
    (a path) stays whole on a line of its own. Later lines start with `indent`."""
    lines = textwrap.wrap(
        text,
        max(console.width, 20),
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    for line in lines or [""]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def print_table(console: Any, table: Any) -> None:
    """Print a rich `table` with every cell whole.

    Columns marked ``no_wrap`` (names, paths, numbers) keep their widest cell;
    the others wrap at spaces but never below their longest word. Where the
    terminal is narrower than that, the table is drawn as wide as it needs.
    """
    from rich.console import Console
    from rich.measure import Measurement

    wide = console.options.update_width(1 << 16)
    for column in table.columns:
        if column.no_wrap:
            cells = [column.header, *column.cells]
            column.min_width = max(Measurement.get(console, wide, cell).maximum for cell in cells)
    need = Measurement.get(console, wide, table).minimum
    if need <= console.width:
        console.print(table)
        return
    Console(
        file=console.file,
        width=need,
        highlight=False,
        force_terminal=console.is_terminal,
        no_color=console.no_color,
        color_system="auto" if console.color_system else None,
    ).print(table)
