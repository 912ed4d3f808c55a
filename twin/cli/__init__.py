"""The ``dctwin`` command line.

The same flags mean the same thing everywhere: ``--broker HOST:PORT``, ``--db PATH``,
``--site FILE``. Broker credentials and TLS come from the environment
(``DCTWIN_MQTT_USERNAME``, ``DCTWIN_MQTT_PASSWORD``, ``DCTWIN_MQTT_TLS``, ``DCTWIN_MQTT_CA_FILE``)
and never appear in logs.

This module only assembles the Typer app; the commands live in one module each group
(:mod:`twin.cli.sim`, :mod:`~twin.cli.serve`, :mod:`~twin.cli.data`, :mod:`~twin.cli.analysis`,
:mod:`~twin.cli.demo`, :mod:`~twin.cli.replay`, :mod:`~twin.cli.collect`,
:mod:`~twin.cli.imports`, :mod:`~twin.cli.rules`, :mod:`~twin.cli.siteview`,
:mod:`~twin.cli.site`), which share
:mod:`twin.cli.common` (options, errors) and :mod:`twin.cli.output` (tables, TSV, JSON) and
never import this module or each other.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from twin.cli import analysis, data, demo, help_text, replay, serve, sim, siteview
from twin.cli.collect import collect_app
from twin.cli.common import missing_extra
from twin.cli.history import query_app
from twin.cli.imports import import_app
from twin.cli.rules import rules_app
from twin.cli.site import site_app
from twin.procs import exit_with_parent


class _ExtrasGroup(TyperGroup):
    """A command group whose commands, run on an install without the extra they need (the
    service's and the console's libraries are imported inside the commands), end in a message
    naming the extra and exit 2, not in a traceback."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as e:
            names: list[str] = [ctx.invoked_subcommand or ""]
            parent: typer.Context | None = ctx
            while parent is not None and parent.parent is not None:  # the root is `dctwin`
                names.insert(0, parent.info_name or "")
                parent = parent.parent
            exit_ = missing_extra(" ".join(n for n in names if n), e)
            if exit_ is None:
                raise
            raise exit_ from None


app = typer.Typer(
    cls=_ExtrasGroup,
    name="dctwin",
    help="dctwin: a live, calibrated digital twin of AI datacenters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main() -> None:
    """dctwin: a live, calibrated digital twin of AI datacenters."""
    exit_with_parent()  # a child of `dctwin demo` stops when the demo is gone


# The order here is the order of `dctwin --help`.
for command in (
    sim.sim,
    serve.serve,
    siteview.site_view,
    data.ingest,
    data.export,
    data.status,
    data.maintain,
    data.calibrate,
    analysis.headroom,
    analysis.hotspots,
    analysis.fleets,
    analysis.forecast,
    demo.broker,
    demo.demo,
    demo.console,
):
    app.command()(command)
app.add_typer(collect_app, name="collect", cls=_ExtrasGroup)
app.add_typer(import_app, name="import", cls=_ExtrasGroup)
app.add_typer(rules_app, name="rules", cls=_ExtrasGroup)
app.add_typer(query_app, name="query", cls=_ExtrasGroup)
app.add_typer(site_app, name="site", cls=_ExtrasGroup)
for command in (replay.record, replay.replay, replay.whatif):
    app.command()(command)
help_text.prepare(app)  # units in brackets survive Rich markup; one-line listings

__all__ = ["app"]
