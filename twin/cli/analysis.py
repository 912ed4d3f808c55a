"""The twin's answers on a store: `dctwin headroom`, `hotspots`, `fleets` and `forecast`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from twin.cli.common import (
    DEMO_SITE,
    DbOpt,
    SiteOpt,
    err,
    fail,
    load_site_file,
    open_existing_store,
)
from twin.cli.output import Column, Format, FormatOpt, LimitOpt, emit_rows, number, resolve_format

_HEADROOM_COLUMNS = [
    Column("kind", "kind"),
    Column("id", "id"),
    Column("quantity", "quantity"),
    Column("headroom_now", "headroom", number(2), "right"),
    Column("unit", "unit"),
    Column("limit", "limit", number(1), "right"),
    Column("headroom_min_p50", "min p50", number(2), "right"),
    Column("headroom_min_p90", "min p90", number(2), "right"),
    Column("breach_in_s_p90", "breach p90 [s]", number(0), "right"),
]


def _tightest_first(row: dict) -> tuple:
    """Breaching within the horizon first, then by headroom as a share of the limit."""
    h, lim = row["headroom_now"], row["limit"]
    share = h / abs(lim) if h is not None and lim else float("inf")
    return (row["breach_in_s_p90"] is None, share, row["kind"], row["id"])


def headroom(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    shard: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="The store is this shard's (`dctwin serve --shard`): model its sub-site and"
            " list only its own components.",
        ),
    ] = None,
    horizon: Annotated[float, typer.Option(help="Seconds ahead.")] = 3600.0,
    step: Annotated[float, typer.Option(help="Seconds between path points.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """Headroom of every GPU, PDU phase, rack, CDU, loop and link: now, its minimum over the
    horizon, and the time to breach at p50 and p90 of the load forecast.

    Rows come tightest first: those that breach within the horizon at p90, then by headroom
    as a share of the limit. On a terminal the table holds what fits (--limit to change) and
    says how many rows it left out; piped, every row is written as TSV."""
    from twin.headroom import compute_headroom

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    view = None
    if shard is not None:
        from twin.site.shards import ShardError, shard_view

        try:
            view = shard_view(site_obj, shard)
        except ShardError as e:
            raise fail(f"--shard: {e}") from None
        site_obj = view.site
    with open_existing_store(db) as store:
        try:
            report = compute_headroom(store, site_obj, horizon_s=horizon, step_s=step)
        except ValueError as e:
            raise fail(str(e)) from None
    if view is not None:
        report.rows = [r for r in report.rows if view.owns_entity(r.kind, r.id)]
    if as_json:
        typer.echo(report.model_dump_json())
        return
    rows = sorted((r.model_dump() for r in report.rows), key=_tightest_first)
    title = f"headroom at {report.data_until:%Y-%m-%d %H:%M:%S} UTC, load: {report.load_basis}"
    out_fmt = resolve_format(fmt)
    if out_fmt is Format.tsv:
        err.print(title, highlight=False)
    emit_rows(rows, _HEADROOM_COLUMNS, out_fmt, limit, title=title, what="limits")
    for p in report.problems:
        err.print(f"[yellow]{p}[/]")


def hotspots(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    k_sigma: Annotated[float, typer.Option(help="Residual over the model, in sigma.")] = 3.0,
    minutes: Annotated[int, typer.Option(help="For this many minutes in a row.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """GPUs and racks running hotter than they should (catalog limit, calibrated model,
    thermal-resistance drift, ASHRAE inlet)."""
    from twin.hotspots import find_hotspots

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    with open_existing_store(db) as store:
        try:
            report = find_hotspots(store, site_obj, k_sigma=k_sigma, minutes=minutes)
        except ValueError as e:
            raise fail(str(e)) from None
    if as_json:
        typer.echo(report.model_dump_json())
        return
    if not report.hotspots:
        err.print("no hot spots")
    else:
        cols = [Column("kind", "kind"), Column("id", "id"), Column("reason", "reason")]
        cols.append(Column("detail", "detail"))
        rows = [h.model_dump() for h in report.hotspots]
        emit_rows(rows, cols, resolve_format(fmt), limit, title="hot spots", what="hot spots")
    for p in report.problems:
        err.print(f"[yellow]{p}[/]")


def fleets(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    window: Annotated[float, typer.Option(help="Seconds of activity to look at.")] = 86400.0,
    threshold: Annotated[
        float, typer.Option(help="Flag a fleet whose mean activity is under this (0..1).")
    ] = 0.4,
    target_util: Annotated[
        float,
        typer.Option(help="Utilization of its p95 load the remaining GPUs would run at (0..1)."),
    ] = 0.7,
    min_coverage: Annotated[
        float | None,
        typer.Option(
            help="Seconds of data needed to judge a fleet (default: 20/24 of the window).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """Underused inference fleets: mean activity under the threshold and GPUs to give back at
    the target utilization of their p95 load (GPUs, GPU-hours and kW). A fleet with too little
    data in the window is "not judged". A fleet's `underuse:` block in the site file overrides
    the threshold, target and coverage."""
    from twin.fleets import fleets_command_payload

    site_path = site or DEMO_SITE
    load_site_file(site_path, required=True)
    if not db.exists():
        raise fail(f"--db {db}: no such store")
    try:
        payload = fleets_command_payload(
            db, site_path, window, threshold, target_util, min_coverage_s=min_coverage
        )
    except ValueError as e:
        raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(payload, default=str))
        return
    rows = [
        dict(f, state="UNDERUSED" if f["flagged"] else "ok" if f["judged"] else "not judged")
        for f in payload["fleets"]
    ]
    cols = [
        Column("fleet", "fleet"),
        Column("state", "state"),
        Column("gpus_to_reclaim", "GPUs", number(0), "right"),
        Column("gpu_hours_to_reclaim", "GPU-h", number(0), "right"),
        Column("kw_freed", "kW", number(1), "right"),
        Column("reason", "reason"),
    ]
    emit_rows(rows, cols, resolve_format(fmt), limit, title="inference fleets", what="fleets")


def _skill_text(hs: list[dict]) -> str:
    """'15 min persistence 0.00; 1 h level +0.31' from a forecast's per-lead skill."""
    from twin.forecast.forecast import _dur

    parts = []
    for h in hs:
        sk = "-" if h["skill"] is None else f"{h['skill']:+.2f}"
        parts.append(f"{_dur(h['horizon_s'])} {h['model']} {sk}")
    return "; ".join(parts)


def _parse_now(now: str | None):  # type: ignore[no-untyped-def]
    """``--now`` as an aware UTC datetime (a time without an offset is UTC)."""
    from datetime import UTC, datetime

    if now is None:
        return None
    try:
        t = datetime.fromisoformat(now)
    except ValueError:
        raise fail(f"--now {now!r}: not an ISO-8601 time (2026-12-01T06:00:00Z)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def forecast(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    horizon: Annotated[float, typer.Option(help="Seconds ahead.")] = 6 * 3600.0,
    step: Annotated[float, typer.Option(help="Seconds per forecast step.")] = 300.0,
    now: Annotated[
        str | None,
        typer.Option(
            help="Forecast (or backtest) from this past time, ISO 8601 (no offset: UTC), using"
            " only the data before it (default: the newest node sample).",
            show_default=False,
        ),
    ] = None,
    backtest: Annotated[
        bool, typer.Option(help="Backtest on the store's history instead of forecasting.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    fmt: FormatOpt = None,
    limit: LimitOpt = None,
) -> None:
    """Load forecast (p05/p50/p90/p95 W) per fleet and per rack, or its backtest.

    Each entity's model is chosen by its skill against persistence (1 - MAE/MAE_persistence)
    on rolling origins of its own history; the table shows the model and skill per lead, the
    origins scored, where the interval comes from and how often it held. --json prints
    everything, the forecast paths included."""
    from twin.forecast import forecast_site, run_backtest

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    at = _parse_now(now)
    with open_existing_store(db) as store:
        newest = store.con.execute("SELECT max(ts) FROM node").fetchall()[0][0]
        if newest is None:
            raise fail(f"--db {db}: no node power samples to forecast from")
        if at is not None:
            oldest = store.con.execute("SELECT min(ts) FROM node").fetchall()[0][0]
            if at <= oldest:
                raise fail(
                    f"--now {now}: the store's node power starts at {oldest:%Y-%m-%d %H:%M:%S} UTC"
                )
        try:
            if backtest:
                result = run_backtest(
                    store, site_obj, now=at or newest, horizon_s=horizon, step_s=step
                )
            else:
                result = forecast_site(
                    store, site_obj, now=at or newest, horizon_s=horizon, step_s=step
                )
        except ValueError as e:
            raise fail(str(e)) from None
    if as_json:
        typer.echo(result.model_dump_json())
        return
    out_fmt = resolve_format(fmt)
    if backtest:
        title = (
            f"backtest to {result.window_end:%Y-%m-%d %H:%M} UTC: {len(result.origins)} origins"
            f" scored of {result.origins_listed} tried, horizon {result.horizon_s:g} s"
        )
        rows = [
            dict(
                e.model_dump(),
                skill_by_lead="; ".join(
                    f"{h.horizon_s / 60:g} min {'-' if h.skill is None else f'{h.skill:+.2f}'}"
                    f" (cov {'-' if h.coverage_p05_p95 is None else f'{h.coverage_p05_p95:.2f}'})"
                    for h in e.horizons
                ),
            )
            for e in result.entities
        ]
        cols = [
            Column("entity", "entity"),
            Column("id", "id"),
            Column("improvement", "vs seasonal-naive", number(3), "right"),
            Column("coverage_p05_p95", "p05-p95 coverage", number(3), "right"),
            Column("skill_by_lead", "skill vs persistence (coverage) by lead"),
        ]
    else:
        title = (
            f"forecast from {result.now:%Y-%m-%d %H:%M} UTC, {result.horizon_s:g} s ahead;"
            " skill = 1 - MAE/MAE_persistence on the entity's own history"
        )
        rows = [
            dict(
                e.model_dump(),
                skill_by_lead=_skill_text([h.model_dump() for h in e.skill]),
                interval_basis=e.interval.basis,
                coverage=e.interval.checked_coverage,
                p50_end_w=e.p50_w[-1] if e.p50_w else None,
            )
            for e in result.entities
        ]
        cols = [
            Column("entity", "entity"),
            Column("id", "id"),
            Column("model", "model"),
            Column("skill_by_lead", "model and skill by lead"),
            Column("origins_scored", "origins", number(0), "right"),
            Column("interval_basis", "interval from"),
            Column("coverage", "p05-p95 held", number(2), "right"),
            Column("last_w", "last [W]", number(0), "right"),
            Column("p50_end_w", "p50 at horizon [W]", number(0), "right"),
            Column("note", "why"),
        ]
    if out_fmt is Format.tsv:
        err.print(title, highlight=False)
    emit_rows(rows, cols, out_fmt, limit, title=title, what="entities")
