"""The twin's answers on a store: `dctwin headroom`, `hotspots`, `fleets` and `forecast`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from twin.cli.common import (
    DEMO_SITE,
    DbOpt,
    SiteOpt,
    err,
    fail,
    load_site_file,
    open_existing_store,
)


def headroom(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    horizon: Annotated[float, typer.Option(help="Seconds ahead.")] = 3600.0,
    step: Annotated[float, typer.Option(help="Seconds between path points.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Headroom of every GPU, PDU phase, rack, CDU, loop and link: now, its minimum over the
    horizon, and the time to breach at p50 and p90 of the load forecast."""
    from twin.headroom import compute_headroom

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    with open_existing_store(db) as store:
        try:
            report = compute_headroom(store, site_obj, horizon_s=horizon, step_s=step)
        except ValueError as e:
            raise fail(str(e)) from None
    if as_json:
        typer.echo(report.model_dump_json())
        return
    out = Console()
    out.print(f"headroom at {report.data_until:%Y-%m-%d %H:%M:%S} UTC, load: {report.load_basis}")
    rows = sorted(report.rows, key=lambda r: (r.breach_in_s_p90 is None, r.headroom_now or 0))
    for r in rows[:40]:
        when = "" if r.breach_in_s_p90 is None else f"  breach p90 in {r.breach_in_s_p90:.0f} s"
        out.print(
            f"{r.kind:9} {r.id:24} {r.quantity:14} {r.headroom_now:9.2f} {r.unit:5}"
            f" (min p50 {r.headroom_min_p50:.2f}, p90 {r.headroom_min_p90:.2f}){when}",
            highlight=False,
        )
    for p in report.problems:
        err.print(f"[yellow]{p}[/]")


def hotspots(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    k_sigma: Annotated[float, typer.Option(help="Residual over the model, in sigma.")] = 3.0,
    minutes: Annotated[int, typer.Option(help="For this many minutes in a row.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
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
    for h in report.hotspots:
        typer.echo(f"{h.kind} {h.id} {h.reason}: {h.detail}")
    if not report.hotspots:
        typer.echo("no hot spots")
    for p in report.problems:
        err.print(f"[yellow]{p}[/]")


def fleets(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    window: Annotated[float, typer.Option(help="Seconds of activity to look at.")] = 86400.0,
    threshold: Annotated[
        float, typer.Option(help="Flag a fleet whose activity p95 stays under this (0..1).")
    ] = 0.3,
    target_util: Annotated[
        float, typer.Option(help="Utilization the remaining GPUs would run at (0..1).")
    ] = 0.7,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Underused inference fleets: GPUs that would serve their p95 load, and the kW freed."""
    from twin.fleets import fleets_command_payload

    site_path = site or DEMO_SITE
    load_site_file(site_path, required=True)
    if not db.exists():
        raise fail(f"--db {db}: no such store")
    try:
        payload = fleets_command_payload(db, site_path, window, threshold, target_util)
    except ValueError as e:
        raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(payload, default=str))
        return
    for f in payload["fleets"]:
        mark = "UNDERUSED" if f["flagged"] else "ok"
        typer.echo(f"{f['fleet']:16} {mark:9} {f['reason']}")


def forecast(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    horizon: Annotated[float, typer.Option(help="Seconds ahead.")] = 6 * 3600.0,
    step: Annotated[float, typer.Option(help="Seconds per forecast step.")] = 300.0,
    backtest: Annotated[
        bool, typer.Option(help="Backtest on the store's history instead of forecasting.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Load forecast (p05/p50/p90/p95 W) per fleet and per rack, or its backtest."""
    from twin.forecast import forecast_site, run_backtest

    site_obj = load_site_file(site or DEMO_SITE, required=True)
    with open_existing_store(db) as store:
        newest = store.con.execute("SELECT max(ts) FROM node").fetchall()[0][0]
        if newest is None:
            raise fail(f"--db {db}: no node power samples to forecast from")
        try:
            if backtest:
                result = run_backtest(store, site_obj, now=newest, horizon_s=horizon, step_s=step)
            else:
                result = forecast_site(store, site_obj, now=newest, horizon_s=horizon, step_s=step)
        except ValueError as e:
            raise fail(str(e)) from None
    if as_json:
        typer.echo(result.model_dump_json())
        return
    typer.echo(result.model_dump_json(indent=1))
