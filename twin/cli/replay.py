"""`dctwin record`, `dctwin replay` and `dctwin whatif`: recorded bundles and what-if runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from twin.cli.common import (
    DEMO_RULES,
    DEMO_SITE,
    broker_config,
    fail,
    load_site_file,
    open_store,
    parse_time,
)


def record(
    out: Annotated[Path, typer.Option("--out", help="Bundle directory to write.")],
    db: Annotated[Path, typer.Option("--db", help="DuckDB store file.")] = Path("dctwin.duckdb"),
    site: Annotated[Path | None, typer.Option("--site", help="Site YAML file.")] = None,
    start: Annotated[str | None, typer.Option(help="ISO 8601 start (default: oldest).")] = None,
    end: Annotated[str | None, typer.Option(help="ISO 8601 end (default: newest).")] = None,
    resolution: Annotated[
        float, typer.Option(help="Average into buckets of this many s; 0: raw samples.")
    ] = 10.0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing bundle.")] = False,
) -> None:
    """Export a time range of the store as a bundle: Parquet, the site file, the calibration."""
    from datetime import timedelta

    from twin.replay.bundle import BundleError
    from twin.replay.bundle import record as write_bundle

    site_path = site or DEMO_SITE
    load_site_file(site_path, required=True)
    if not db.exists():
        raise fail(f"--db {db}: no such store")
    with open_store(db, read_only=True) as store:
        lo, hi = store.con.execute("SELECT min(ts), max(ts) FROM gpu").fetchall()[0]
        if lo is None:
            raise fail(f"--db {db}: no GPU samples to record")
        t0 = parse_time(start, "--start") if start else lo
        t1 = parse_time(end, "--end") if end else hi + timedelta(seconds=resolution or 1)
        try:
            manifest = write_bundle(
                store, site_path, out, t0, t1, resolution_s=resolution, overwrite=overwrite
            )
        except BundleError as e:
            raise fail(str(e)) from None
    size = sum(f.stat().st_size for f in out.iterdir())
    typer.echo(
        json.dumps({"out": str(out), "bytes": size, **json.loads(manifest.model_dump_json())})
    )


def replay(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory (dctwin record).")],
    db: Annotated[
        Path | None, typer.Option("--db", help="Ingest straight into this (separate) store.")
    ] = None,
    broker: Annotated[
        str | None, typer.Option(help="Publish to this broker (host:port) instead.")
    ] = None,
    speed: Annotated[
        float, typer.Option(help="Recorded seconds per wall second; 0: as fast as possible.")
    ] = 0.0,
    shift_to_now: Annotated[
        bool, typer.Option(help="Move the recording so it ends now (for a live console).")
    ] = False,
) -> None:
    """Feed a bundle through the ingest path: into a separate store, or over MQTT to a
    running `dctwin serve`. Ctrl-C or SIGTERM stops it after what was fed is stored or
    acknowledged."""
    import threading

    from twin.ingest import Ingester, IngestLimits
    from twin.ingest.ingester import StoreUnavailable
    from twin.procs import on_stop_signals
    from twin.replay.bundle import Bundle, BundleError
    from twin.replay.replay import replay as run_replay

    if (db is None) == (broker is None):
        raise fail("give exactly one of --db (direct) or --broker (over MQTT)")
    try:
        b = Bundle.load(bundle)
    except BundleError as e:
        raise fail(str(e)) from None
    stop = threading.Event()
    on_stop_signals(stop)
    if db is not None:
        with open_store(db) as store:
            ingester = Ingester(store, b.site, IngestLimits(max_future_s=0, max_past_s=0))
            try:
                stats = run_replay(
                    b, sink=ingester.ingest, speed=speed, shift_to_now=shift_to_now, stop=stop
                )
                store.rollup()
            except StoreUnavailable as e:  # disk full, a lock: what is committed stays
                raise fail(f"the store {db} failed: {e}") from None
        stats["ingest"] = ingester.counters.as_dict()
    else:
        from collectors.mqtt import BrokerError

        cfg = broker_config(broker)
        try:
            stats = run_replay(b, broker=cfg, speed=speed, shift_to_now=shift_to_now, stop=stop)
        except BrokerError as e:
            raise fail(str(e)) from None
    stats["stopped"] = stop.is_set()
    typer.echo(json.dumps(stats))


def whatif(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory (dctwin record).")],
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario YAML files.")],
    out: Annotated[Path, typer.Option("--out", help="Report directory.")] = Path("whatif-report"),
    rules: Annotated[
        Path | None,
        typer.Option(help="Alert rule file whose alerts the report lists (default: deploy's)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    tolerance: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Headroom a scenario may take from a component and still fit, as a fraction"
            " of its limit (currents, power, heat, flow, traffic).",
        ),
    ] = 0.05,
    tolerance_k: Annotated[
        float,
        typer.Option(
            "--tolerance-k", min=0.0, help="The same for temperatures (GPU, loop return) [K]."
        ),
    ] = 2.0,
) -> None:
    """Run the baseline and each scenario through the calibrated twin; write report.md and
    report.html (verdict against the recording, headroom, time over limits, first breach,
    throttled GPU-hours, alerts, energy)."""
    from twin.alerts import RuleFileError, load_rules
    from twin.replay.bundle import Bundle, BundleError
    from twin.replay.report import write_report
    from twin.replay.scenario import ScenarioError, load_scenario
    from twin.replay.verdict import Tolerance
    from twin.replay.whatif import load, run

    try:
        b = Bundle.load(bundle)
        loaded = [load_scenario(p, b.site) for p in scenarios]
    except (BundleError, ScenarioError) as e:
        raise fail(str(e)) from None
    rule_path = rules or DEMO_RULES
    try:
        rule_set = load_rules(rule_path) if rule_path.exists() else None
    except RuleFileError as e:
        raise fail(str(e)) from None
    data = load(b)
    base = run(data, None, rule_set)
    tol = Tolerance(fraction=tolerance, temp_k=tolerance_k)
    runs = [run(data, s, rule_set, tol) for s in loaded]
    md, html = write_report(b, base, runs, out)
    if as_json:
        typer.echo(
            json.dumps([r.model_dump(mode="json", exclude={"series"}) for r in [base, *runs]])
        )
        return
    for r in runs:
        typer.echo(f"{r.name}: {r.verdict}")
        for reason in r.reasons:
            typer.echo(f"  - {reason}")
    typer.echo(f"report: {md} {html}")
