"""Printing for a terminal of any width that never cuts a name or a path in two.

A path, a file name or a config split over two lines cannot be copied back
whole. So text is wrapped at spaces only, a word longer than the line (a path)
gets a line of its own, whole, and a table is never drawn narrower than its
longest words: on a narrow terminal its lines run past the edge, and the
terminal wraps them (a copy still gives the whole line). rich is imported only
by the commands that print with it.
"""

from __future__ import annotations

import os
import re
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


def hanging_indent(line: str, width: int) -> str:
    """The indent of a wrapped line's continuation: under its second column where the line
    is aligned in columns (``Shape:       E=...``, ``  vLLM    E=...``: the first run of
    two or more spaces after its text), else two spaces past the line's own indent."""
    lead = len(line) - len(line.lstrip(" "))
    column = re.match(r" *\S+(?: \S+)*? {2,}(?=\S)", line)
    if column and column.end() <= width // 2:
        return " " * column.end()
    label = re.match(r"[A-Z][\w ]{6,12}: (?=\S)", line)  # ``Batch sizes: 1, 2, ...``
    if label:
        return " " * label.end()
    return " " * (lead + 2)


def wrap_spans(plain: str, width: int, indent: int) -> list[tuple[int, int]]:
    """(start, end) of each line of `plain` wrapped at spaces to `width` columns, lines after
    the first `indent` columns in; a word longer than a line stays whole, on its own."""
    spans: list[tuple[int, int]] = []
    start = end = 0
    for word in re.finditer(r"\S+", plain):
        margin = indent if spans else 0
        if end > start and margin + word.end() - start > width:
            spans.append((start, end))
            start = word.start()
        elif end == 0 and not spans:
            start = 0  # the first line keeps its leading spaces
        end = word.end()
    spans.append((start, end))
    return spans


def print_wrapped(console: Any, line: Any, indent: str | None = None) -> None:
    """Print one line, plain text or a rich `Text`, wrapped at spaces to `console`'s width,
    names and paths whole; continuation lines start with `indent` (`hanging_indent` when
    None). No markup is read from a plain string."""
    from rich.text import Text

    text = line if isinstance(line, Text) else Text(line)
    if "\n" in text.plain:
        for part in text.split("\n", allow_blank=True):
            print_wrapped(console, part, indent)
        return
    width = max(console.width, 20)
    plain = text.plain
    if len(plain) <= width or not wraps(console):
        console.print(text, highlight=False, soft_wrap=True)
        return
    if indent is None:
        indent = hanging_indent(plain, width)
    for number, (start, end) in enumerate(wrap_spans(plain, width, len(indent))):
        piece = text[start:end]
        if number:
            piece = Text(indent) + piece
        console.print(piece, highlight=False, soft_wrap=True)


def wraps(console: Any) -> bool:
    """Whether `print_wrapped` wraps for `console`: on a terminal, or where $COLUMNS sets a
    width. Into a pipe or a file with no $COLUMNS (``moetune check | grep``) a line stays
    one line."""
    return bool(console.is_terminal or os.environ.get("COLUMNS"))


def print_lines(console: Any, lines: Any) -> None:
    """`print_wrapped` each of `lines` (a plan, a report), each with its hanging indent."""
    for line in lines:
        print_wrapped(console, line)
