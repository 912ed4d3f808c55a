"""How the `dctwin` commands print rows: a table sized to the terminal, TSV or CSV for pipes,
or JSON.

``--format table`` draws a rich table as wide as the terminal, with at most ``--limit`` rows
(default: what fits on the screen) and a last line saying how many were left out;
``--format tsv`` writes every row (or ``--limit`` of them) tab-separated with a header line, for
``cut``, ``sort`` and spreadsheets (``--format csv`` the same comma-separated, quoted where
needed); ``--format json`` writes the rows as one JSON array. Without ``--format``, a terminal
gets the table and a pipe or file gets TSV, so ``dctwin headroom | grep rack`` sees every row,
never the 40 that fitted a screen.

In TSV and CSV a number is written plain (``1234.5``: no thousands separator, a dot for the
decimals) and a missing value is an empty field, so that DuckDB, pandas and polars read a
number column as numbers; the table writes ``1,234.50`` and a dash for the reader's eye.
"""

from __future__ import annotations

import csv
import io
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
from rich.text import Text


class Format(StrEnum):
    table = "table"
    tsv = "tsv"
    csv = "csv"
    json = "json"


FormatOpt = Annotated[
    Format | None,
    typer.Option(
        "--format",
        help="table (sized to the terminal), tsv or csv (every row; numbers plain, a missing"
        " value empty) or json; default: table on a terminal, tsv when piped.",
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
    """One column: the row key, its header, and how a value is written.

    ``digits`` makes it a number column: fixed decimals, ``1,234.50`` and a dash for a missing
    value in a table, ``1234.50`` and an empty field in TSV and CSV. ``show`` writes any other
    value (default: str; a dash, or in TSV and CSV an empty field, for a missing one). ``style``
    gives a row's cell a rich style in the table (e.g. its band's colour)."""

    key: str
    header: str
    show: Callable[[Any], str] | None = None
    justify: str = "left"
    digits: int | None = None
    style: Callable[[dict[str, Any]], str] | None = None


def number(digits: int = 2) -> Callable[[Any], str]:
    """A formatter for numeric table cells: fixed decimals, a dash for None or NaN."""

    def show(v: Any) -> str:
        if not _finite(v):
            return "-"
        return f"{v:,.{digits}f}"

    return show


def _finite(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and not math.isfinite(v))


def _cell(col: Column, row: dict[str, Any], plain: bool = False) -> str:
    """A cell for the table, or with ``plain`` for TSV and CSV."""
    v = row.get(col.key)
    if col.digits is not None:
        if not _finite(v):
            return "" if plain else "-"
        return f"{v:.{col.digits}f}" if plain else f"{v:,.{col.digits}f}"
    if col.show is not None:
        return "" if plain and v is None else col.show(v)
    if v is None:
        return "" if plain else "-"
    return str(v)


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
    if fmt in (Format.tsv, Format.csv):
        shown = rows if not limit else rows[:limit]
        typer.echo(_delimited(shown, columns, "\t" if fmt is Format.tsv else ","), nl=False)
        return
    out = Console()
    if limit is None:
        limit = max(5, shutil.get_terminal_size((100, 40)).lines - _TABLE_CHROME_LINES)
    shown = rows if limit == 0 else rows[:limit]
    table = Table(title=title, title_justify="left", expand=False, highlight=False)
    for c in columns:
        justify = "right" if c.digits is not None and c.justify == "left" else c.justify
        table.add_column(c.header, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in shown:
        table.add_row(*(Text(_cell(c, r), style=c.style(r) if c.style else "") for c in columns))
    out.print(table)
    hidden = len(rows) - len(shown)
    if hidden > 0:
        out.print(
            f"{hidden:,} more {what} hidden ({len(shown):,} of {len(rows):,} shown):"
            " --limit 0 for all, --format tsv or json for every row",
            highlight=False,
        )


def _delimited(rows: Sequence[dict[str, Any]], columns: Sequence[Column], sep: str) -> str:
    """A header line of the column keys and one line per row; TSV's tabs and newlines inside a
    value become spaces, CSV quotes as RFC 4180 says."""
    if sep == "\t":
        lines = ["\t".join(c.key for c in columns)]
        lines += [
            "\t".join(
                _cell(c, r, plain=True).replace("\t", " ").replace("\n", " ") for c in columns
            )
            for r in rows
        ]
        return "\n".join(lines) + "\n"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in columns])
    w.writerows([_cell(c, r, plain=True) for c in columns] for r in rows)
    return buf.getvalue()
