"""``dctwin query``: the API's series questions over the Parquet history of every shard
(twin/store/history.py), with no store and no service."""

from __future__ import annotations

from typing import Annotated

import typer

from twin.cli.common import fail, parse_time
from twin.cli.output import Column, FormatOpt, LimitOpt, emit_rows, resolve_format

query_app = typer.Typer(
    help="Read the Parquet history (`dctwin export --to`) of every shard, without a service.",
    no_args_is_help=True,
)


@query_app.command("series")
def series(
    kind: Annotated[str, typer.Argument(help="Telemetry kind (gpu, node, pdu, ...).")],
    component_id: Annotated[
        str | None, typer.Argument(metavar="[ID]", help="Component id; all when omitted.")
    ] = None,
    source: Annotated[
        str, typer.Option("--from", help="History root: a directory or URL (s3://...).")
    ] = "history",
    start: Annotated[str, typer.Option(help="ISO 8601 start (inclusive).")] = "",
    end: Annotated[str, typer.Option(help="ISO 8601 end (exclusive).")] = "",
    step_s: Annotated[
        float | None, typer.Option("--step", help="Bucket seconds (means); raw rows if omitted.")
    ] = None,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """A kind's series (one component or all) over [--start, --end), from every shard."""
    from collectors.contract import QUANTITIES
    from twin.store.history import HistoryError, check_kind, query_series

    if not start or not end:
        raise fail("--start and --end are required (ISO 8601)")
    t0, t1 = parse_time(start, "--start"), parse_time(end, "--end")
    try:
        check_kind(kind)
        rows = query_series(source, kind, component_id, t0, t1, step_s)
    except HistoryError as e:
        raise fail(str(e)) from None
    for r in rows:
        r["ts"] = r["ts"].isoformat()
    head = ["ts", "id"] + (["n"] if step_s else ["shard", "source"])
    cols = [Column(k, k) for k in head] + [Column(q, q, digits=3) for q in QUANTITIES[kind]]
    emit_rows(rows, cols, resolve_format(fmt), limit)
