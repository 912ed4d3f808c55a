"""How the `dctwin` commands print rows: a table sized to the terminal, TSV for pipes, or JSON.

``--format table`` draws a rich table as wide as the terminal, with at most ``--limit`` rows
(default: what fits on the screen) and a last line saying how many were left out;
``--format tsv`` writes every row (or ``--limit`` of them) tab-separated with a header line, for
``cut``, ``sort`` and spreadsheets; ``--format json`` writes the rows as one JSON array. Without
``--format``, a terminal gets the table and a pipe or file gets TSV, so ``dctwin headroom |
grep rack`` sees every row, never the 40 that fitted a screen.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table


class Format(StrEnum):
    table = "table"
    tsv = "tsv"
    json = "json"


FormatOpt = Annotated[
    Format | None,
    typer.Option(
        "--format",
        help="table (sized to the terminal), tsv (every row, tab-separated) or json; default:"
        " table on a terminal, tsv when piped.",
        case_sensitive=False,
    ),
]

LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit",
        min=0,
        help="Rows to show, 0 for all; default: what fits the terminal (table), all (tsv, json).",
    ),
]

#: Lines a table keeps free on the screen: its header and borders, the title and the hidden line.
_TABLE_CHROME_LINES = 8


@dataclass(frozen=True)
class Column:
    """One column: the row key, its header, and how a value is written (default: str, and a
    dash for a missing value)."""

    key: str
    header: str
    show: Callable[[Any], str] | None = None
    justify: str = "left"


def number(digits: int = 2) -> Callable[[Any], str]:
    """A formatter for numeric cells: fixed decimals, a dash for None or NaN."""

    def show(v: Any) -> str:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        return f"{v:,.{digits}f}"

    return show


def _cell(col: Column, row: dict[str, Any]) -> str:
    v = row.get(col.key)
    if col.show is not None:
        return col.show(v)
    return "-" if v is None else str(v)


def resolve_format(fmt: Format | None, as_json: bool = False) -> Format:
    """``--json`` wins; then ``--format``; else table on a terminal and TSV when piped."""
    if as_json:
        return Format.json
    if fmt is not None:
        return fmt
    return Format.table if sys.stdout.isatty() else Format.tsv


def emit_rows(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    fmt: Format,
    limit: int | None,
    *,
    title: str | None = None,
    what: str = "rows",
) -> None:
    """Print ``rows`` in ``fmt``; ``limit`` None means the format's default, 0 all."""
    if fmt is Format.json:
        shown = rows if not limit else rows[:limit]
        typer.echo(json.dumps([{c.key: r.get(c.key) for c in columns} for r in shown], default=str))
        return
    if fmt is Format.tsv:
        shown = rows if not limit else rows[:limit]
        lines = ["\t".join(c.key for c in columns)]
        lines += [
            "\t".join(_cell(c, r).replace("\t", " ").replace("\n", " ") for c in columns)
            for r in shown
        ]
        typer.echo("\n".join(lines))
        return
    out = Console()
    if limit is None:
        limit = max(5, shutil.get_terminal_size((100, 40)).lines - _TABLE_CHROME_LINES)
    shown = rows if limit == 0 else rows[:limit]
    table = Table(title=title, title_justify="left", expand=False, highlight=False)
    for c in columns:
        table.add_column(c.header, justify=c.justify, overflow="fold")  # type: ignore[arg-type]
    for r in shown:
        table.add_row(*(_cell(c, r) for c in columns))
    out.print(table)
    hidden = len(rows) - len(shown)
    if hidden > 0:
        out.print(
            f"{hidden:,} more {what} hidden ({len(shown):,} of {len(rows):,} shown):"
            " --limit 0 for all, --format tsv or json for every row",
            highlight=False,
        )
