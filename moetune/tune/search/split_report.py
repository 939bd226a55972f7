"""The split tune's table for the summary: per batch size, the pair against the single config."""

from __future__ import annotations

from typing import Any


def _short(entry: dict[str, Any]) -> str:
    text = (
        f"M{entry['BLOCK_SIZE_M']} N{entry['BLOCK_SIZE_N']} K{entry['BLOCK_SIZE_K']} "
        f"G{entry['GROUP_SIZE_M']} w{entry['num_warps']} s{entry['num_stages']}"
    )
    return text + (" TMA" if entry.get("USE_TMA") else "")


def _written(result: Any) -> str:
    if result.split:
        return f"split {result.speedup:.2f}x"
    if result.stopped:
        return f"single ({result.stopped})"
    return "single"


def split_rows(results: list[Any]) -> list[tuple[str, ...]]:
    """(M, up entry, down entry, pair us, single us, written) per batch size, as text."""
    rows = []
    for result in results:
        rows.append(
            (
                str(result.batch_size),
                _short(result.up_entry()),
                _short(result.down_entry()),
                "-" if result.pair_us is None else f"{result.pair_us:.1f}",
                "-" if result.single_us is None else f"{result.single_us:.1f}",
                _written(result),
            )
        )
    return rows


def split_table(results: list[Any]) -> Any:
    from rich.table import Table

    table = Table(title="SGLang up/down tables (whole call: split pair vs single config)")
    for name in ("M", "up", "down", "pair us", "single us", "written"):
        table.add_column(name, justify="right" if name.endswith("us") or name == "M" else "left")
    for row in split_rows(results):
        table.add_row(*row)
    return table
