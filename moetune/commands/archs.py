"""`moetune archs`: list the architectures the registry knows."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from moetune.commands.options import mappings_options
from moetune.commands.terminal import say

DESCRIPTION_MIN_WIDTH = 20


@click.command()
@mappings_options
@click.option("--json", "json_", is_flag=True, help="Print JSON for scripts instead of a table.")
def archs(mappings: str | None, replace_mappings: bool, json_: bool) -> None:
    """List the registry's architecture entries, in matching order.

    An entry matches a config.json on architectures[0], else on model_type;
    the generic fallback (last) catches the rest and marks its values guessed.

    \b
    Examples:
        moetune archs
        moetune archs --mappings my_mappings.yaml --json
    """
    if replace_mappings and mappings is None and not os.environ.get("MOETUNE_MAPPINGS"):
        raise click.UsageError("--replace-mappings needs --mappings FILE (or $MOETUNE_MAPPINGS)")
    from moetune.extract.mappings import load_registry

    registry = load_registry(mappings, replace=replace_mappings)
    rows = [
        {
            "name": entry.name,
            "architectures": list(entry.architectures),
            "model_types": list(entry.model_types),
            "description": entry.description,
            "fallback": entry.fallback,
            "source_file": entry.source_file,
        }
        for entry in registry.entries
    ]
    if json_:
        click.echo(
            json.dumps({"source_files": list(registry.source_files), "entries": rows}, indent=2)
        )
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    cells = [
        (
            row["name"] + (" (fallback)" if row["fallback"] else ""),
            "\n".join(row["architectures"]) or "-",
            "\n".join(row["model_types"]) or "-",
            row["description"],
        )
        for row in rows
    ]
    # Names are never cut or wrapped: their columns are as wide as their longest name,
    # and only the description wraps. A terminal too narrow even for that wraps the lines.
    table = Table(box=None, pad_edge=False)
    widths = []
    for i, column in enumerate(("entry", "architectures", "model_types")):
        width = max(len(line) for cell in cells for line in [column, *cell[i].splitlines()])
        widths.append(width)
        table.add_column(column, no_wrap=True, min_width=width)
    table.add_column("description", overflow="fold", min_width=DESCRIPTION_MIN_WIDTH)
    for cell in cells:
        table.add_row(*(escape(text) for text in cell))
    console = Console(highlight=False, soft_wrap=True)
    needed = sum(widths) + DESCRIPTION_MIN_WIDTH + 3  # one space between columns
    if needed <= console.width:
        console.print(table)
    else:  # too narrow for the table: one short paragraph per entry
        _print_entries(console, rows)
    say(console, f"{len(rows)} entries from {', '.join(registry.source_files)}")


def _print_entries(console: Any, rows: list[dict[str, Any]]) -> None:
    """The registry as a list, for a terminal too narrow for its table: the entry and its
    description, then its architectures and model types, every name whole."""
    for row in rows:
        name = row["name"] + (" (fallback)" if row["fallback"] else "")
        say(console, f"{name}: {row['description']}", indent="    ")
        for label, names in (
            ("architectures", row["architectures"]),
            ("model_types", row["model_types"]),
        ):
            if names:
                say(console, f"  {label}: {', '.join(names)}", indent="    ")
