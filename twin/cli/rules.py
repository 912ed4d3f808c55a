"""`dctwin rules ...`: work on alert rule files without a running service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from twin.cli.common import err
from twin.cli.output import Column, emit_rows, resolve_format

rules_app = typer.Typer(
    help="Alert rule files: check one before deploying it.", no_args_is_help=True
)


def check(
    file: Annotated[Path, typer.Argument(help="The rule file (YAML, as for serve --rules).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    hooks: Annotated[
        Path | None,
        typer.Option(
            "--hooks",
            help="Also check this hook file (as for serve --hooks): hooks, receivers and the"
            " route; secrets are not read. Prints where each severity goes.",
        ),
    ] = None,
) -> None:
    """Validate a rule file as `promtool check rules` does, then list the limits no rule covers.

    Validation: YAML, every field, metric names and the entity kinds they are emitted for,
    label names, inhibitions naming an unknown rule or the rule itself. Coverage: every kind of
    limit (GPU temperature, PDU phase and breaker, rack feed, CDU heat, CDU flow, loop return,
    network link) needs a threshold rule on its breached-now metric and a forecast_breach rule
    on its time-to-breach metric; the report names the missing half. A forecast rule that no
    breached-now rule inhibits is a warning.

    Routing (with --hooks, or when the rule file holds hooks): receivers name existing hooks,
    routes name existing receivers, and severity info can reach no receiver with `pages: true`
    (info is a ticket); a hook file without a route is a warning (everything goes everywhere).

    Exit codes: 0 valid and every limit covered; 1 the file is invalid (one line per problem,
    naming file, rule and field); 3 valid but some limit uncovered; 2 usage error.
    """
    from twin.alerts.check import check_rules

    report = check_rules(file, hooks)
    if as_json:
        typer.echo(json.dumps(report.to_json()))
        raise typer.Exit(report.exit_code)
    if not report.valid:
        for line in report.error_text.splitlines():
            err.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
        raise typer.Exit(report.exit_code)
    for w in report.warnings:
        err.print(
            f"warning: {escape(f'{report.path}: rule {w.rule}: {w.message}')}", highlight=False
        )
    rows = [
        {
            "limit": c.limit.title,
            "entity_kind": c.limit.entity_kind,
            "breached_now": ", ".join(c.now_rules) or f"MISSING ({c.limit.now_metric})",
            "forecast": ", ".join(c.forecast_rules) or f"MISSING ({c.limit.forecast_metric})",
        }
        for c in report.coverage
    ]
    columns = [
        Column("limit", "limit"),
        Column("entity_kind", "entity kind"),
        Column("breached_now", "breached-now rule"),
        Column("forecast", "forecast rule"),
    ]
    emit_rows(rows, columns, resolve_format(None), 0, title=f"{report.path}: limit coverage")
    if report.routing:
        emit_rows(
            [
                {
                    "severity": r["severity"],
                    "receiver": r["receiver"],
                    "hooks": ", ".join(r["hooks"]) if r["hooks"] is not None else "every hook",
                    "pages": {True: "yes", False: "no (ticket)", None: "-"}[r["pages"]],
                }
                for r in report.routing
            ],
            [
                Column("severity", "severity"),
                Column("receiver", "receiver"),
                Column("hooks", "hooks"),
                Column("pages", "pages"),
            ],
            resolve_format(None),
            0,
            title="routing",
        )
    uncovered = report.uncovered
    if uncovered:
        names = "; ".join(f"{c.limit.title} ({' and '.join(c.missing)})" for c in uncovered)
        typer.echo(f"{report.path}: {report.rules} rules valid; uncovered limits: {names}")
    else:
        typer.echo(f"{report.path}: {report.rules} rules valid; every limit covered")
    raise typer.Exit(report.exit_code)


rules_app.command()(check)
