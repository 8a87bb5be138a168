"""Terminal tables (rich) as plain text: the ``status`` command's table and the demo's report."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table


def table_text(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    total: Sequence[object] | None = None,
    indent: int = 0,
) -> str:
    """A table with a header line, the first column left-aligned and the others right-aligned, as text.

    Args:
        columns: Column headings.
        rows: One sequence of cells per row.
        total: A last row, set off by a rule.
        indent: Spaces before every line.
    """
    table = Table(box=box.SIMPLE, pad_edge=False, show_edge=False, show_footer=total is not None)
    footer = [str(cell) for cell in total] if total is not None else [""] * len(columns)
    for index, heading in enumerate(columns):
        table.add_column(heading, footer[index], justify="left" if index == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    buffer = io.StringIO()
    # No colours, no terminal width: the text is the same in a terminal, a pipe and a test.
    Console(file=buffer, width=1000, color_system=None, force_terminal=False).print(table)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines() if line.strip()]
    return "\n".join(" " * indent + line for line in lines)
