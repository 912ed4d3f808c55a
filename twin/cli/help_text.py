"""Help text as users read it in ``dctwin --help`` and ``dctwin COMMAND --help``.

Typer renders help through Rich markup, where ``[kW]``, ``[s]`` or ``[min]`` are style tags:
they vanished from the rendered help ("the p90 and p95 peaks  and when", "HTTP timeout .").
Units in brackets are how this project writes them, so every command is built as a
:class:`RichSafeCommand`, which escapes its help, its summary and its parameters' help
(``rich.markup.escape``) when click builds it; a group's help is escaped by :func:`prepare`.
A command listing shows each command's first paragraph as one flowing line (Typer otherwise
keeps the docstring's hard line breaks in the listing).

The escaping is done on the click objects, not on Typer's ``typer.Option`` objects: with
postponed annotations, Typer evaluates each ``Annotated[..., typer.Option(...)]`` afresh when
it builds a command, so a ``typer.Option`` seen earlier is not the one rendered.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperCommand


def summary(doc: str | None) -> str | None:
    """The first paragraph of ``doc``, its lines joined into one (None without a doc)."""
    if not doc:
        return None
    first = inspect.cleandoc(doc).split("\n\n", 1)[0]
    return re.sub(r"\s+", " ", first).strip() or None


def escape_help(cmd: Any) -> None:
    """Escape what Rich would take for markup in the help of ``cmd`` (a click command), its
    summary (its help's first paragraph, on one line, where it has none of its own) and its
    parameters' help."""
    if cmd.short_help is None:
        short = summary(cmd.help)
        cmd.short_help = escape(short) if short else None
    else:
        cmd.short_help = escape(cmd.short_help)
    if isinstance(cmd.help, str):
        cmd.help = escape(cmd.help)
    for p in cmd.params:
        text = getattr(p, "help", None)
        if isinstance(text, str):
            p.help = escape(text)  # type: ignore[attr-defined]


class RichSafeCommand(TyperCommand):
    """A Typer command whose help shows bracketed units as written (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        escape_help(self)


def _tree(app: typer.Typer) -> Iterator[typer.Typer]:
    yield app
    for group in app.registered_groups:
        if group.typer_instance is not None:
            yield from _tree(group.typer_instance)


def prepare(app: typer.Typer) -> None:
    """Build every command of ``app`` and its groups as a :class:`RichSafeCommand` (unless it
    names a class of its own beyond Typer's) and escape each group's help. Call once, after
    registering."""
    for sub in _tree(app):
        for info in sub.registered_commands:
            if info.cls is None or info.cls is TyperCommand:
                info.cls = RichSafeCommand
        for group in (sub.info, *sub.registered_groups):  # each visited once
            if isinstance(group.help, str):
                group.help = escape(group.help)
