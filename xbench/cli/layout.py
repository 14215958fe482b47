"""Tables whose identifying columns never truncate: a table where it fits whole at the console's
width, else the same facts stacked, one block per row, its identifiers first and the other columns
under them."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text


def fits(table: Table, width: int) -> bool:
    """Whether the table fits `width` columns with no cell wrapped, squeezed or cut."""
    console = Console(width=max(width, 10_000), file=io.StringIO())
    return Measurement.get(console, console.options, table).maximum <= width


def stacked(title: str, blocks: Sequence[tuple[str, Sequence[str]]]) -> Group:
    """One block per row: its identifiers on one line (never wrapped), then each of the other
    columns as an indented line that wraps within the width."""
    parts: list[RenderableType] = [Text(title, style="italic")]
    for head, lines in blocks:
        parts.append(Text.from_markup(head, overflow="fold"))
        # not expanded: a short line gets no trailing blanks out to the width
        parts += [Padding(Text.from_markup(line), (0, 0, 0, 4), expand=False) for line in lines]
    return Group(*parts)


def table_or_stacked(table: Table, width: int, blocks: Sequence[tuple[str, Sequence[str]]]) -> RenderableType:
    """`table` where it fits `width` whole, else `stacked(blocks)`: rich would otherwise wrap,
    squeeze or cut its columns, identifiers among them."""
    if fits(table, width):
        return table
    return stacked(str(table.title or ""), blocks)
