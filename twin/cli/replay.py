"""`dctwin record`, `dctwin replay` and `dctwin whatif`: recorded bundles and what-if runs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from twin.cli.common import (
    DEMO_RULES,
    DEMO_SITE,
    broker_config,
    err,
    fail,
    load_site_file,
    open_store,
    parse_time,
)

#: DuckDB's memory limit while replaying into a store (its cache of what it wrote).
REPLAY_DUCKDB_MEMORY = "768MB"
#: ... and while it brings the rollups up to date (their GROUP BY's hash tables: with less,
#: DuckDB spills them to disk and the rollup of the demo day takes twice as long).
ROLLUP_DUCKDB_MEMORY = "1536MB"

if TYPE_CHECKING:
    import threading

    from twin.replay.bundle import Bundle


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
    from twin.store.reads import sample_span

    site_path = site or DEMO_SITE
    load_site_file(site_path, required=True)
    if not db.exists():
        raise fail(f"--db {db}: no such store")
    with open_store(db, read_only=True) as store:
        lo, hi = sample_span(store, "gpu")
        if lo is None:
            raise fail(f"--db {db}: no GPU samples to record")
        t0 = parse_time(start, "--start") if start else lo
        t1 = parse_time(end, "--end") if end else hi + timedelta(seconds=resolution or 1)
        try:
            with err.status(f"recording {t0:%Y-%m-%d %H:%M} .. {t1:%Y-%m-%d %H:%M} UTC to {out}"):
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
        Path | None,
        typer.Option(
            "--db", help="Ingest straight into this (separate) store, column-wise (no MQTT)."
        ),
    ] = None,
    broker: Annotated[
        str | None,
        typer.Option(help="Publish contract messages to this broker (host:port) instead."),
    ] = None,
    speed: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Recorded seconds per wall second (600: ten minutes a second); the default, 0,"
            " is as fast as possible.",
        ),
    ] = 0.0,
    shift_to_now: Annotated[
        bool, typer.Option(help="Move the recording so it ends now (for a live console).")
    ] = False,
) -> None:
    """Feed a bundle through the ingest path: into a separate store, or over MQTT to a
    running `dctwin serve`, with the contract's validation either way. Progress (rows and
    recorded time done) goes to stderr; the counts as JSON to stdout. Ctrl-C or SIGTERM stops
    it after what was fed is stored or acknowledged."""
    import threading

    from twin.procs import on_stop_signals
    from twin.replay.bundle import Bundle, BundleError

    if (db is None) == (broker is None):
        raise fail("give exactly one of --db (direct) or --broker (over MQTT)")
    try:
        b = Bundle.load(bundle)
    except BundleError as e:
        raise fail(str(e)) from None
    stop = threading.Event()
    on_stop_signals(stop)
    with _progress(b) as on_progress:
        if db is not None:
            stats = _replay_db(b, db, speed, shift_to_now, stop, on_progress)
        else:
            from collectors.mqtt import BrokerError
            from twin.replay.replay import replay as run_replay

            cfg = broker_config(broker)
            try:
                stats = run_replay(
                    b,
                    broker=cfg,
                    speed=speed,
                    shift_to_now=shift_to_now,
                    stop=stop,
                    on_progress=on_progress,
                )
            except BrokerError as e:
                raise fail(str(e)) from None
    stats["stopped"] = stop.is_set()
    typer.echo(json.dumps(stats))


def _replay_db(
    b: Bundle,
    db: Path,
    speed: float,
    shift_to_now: bool,
    stop: threading.Event,
    on_progress: Callable[[int, datetime], None],
) -> dict:
    """Replay bundle ``b`` into the store ``db``; the stats with the ingest's counters."""
    import time

    from twin.ingest import Ingester, IngestLimits
    from twin.ingest.ingester import StoreUnavailable
    from twin.replay.bundle import BundleError
    from twin.replay.replay import replay_into
    from twin.store.reads import set_memory_limit

    with open_store(db) as store:
        # DuckDB keeps what it wrote cached up to 80 % of RAM by default; a replay writes far
        # more than it reads back, so a bound keeps the command's peak near its own tables'
        set_memory_limit(store, REPLAY_DUCKDB_MEMORY)
        ingester = Ingester(store, b.site, IngestLimits(max_future_s=0, max_past_s=0))
        try:
            stats = replay_into(
                b,
                ingester,
                speed=speed,
                shift_to_now=shift_to_now,
                stop=stop,
                on_progress=on_progress,
            )
            t0 = time.monotonic()
            set_memory_limit(store, ROLLUP_DUCKDB_MEMORY)
            store.rollup()
            stats["rollup_s"] = round(time.monotonic() - t0, 3)
        except StoreUnavailable as e:  # disk full, a lock: what is committed stays
            raise fail(f"the store {db} failed: {e}") from None
        except BundleError as e:
            raise fail(str(e)) from None
    stats["ingest"] = ingester.counters.as_dict()
    return stats


@contextlib.contextmanager
def _progress(b: Bundle) -> Iterator[Callable[[int, datetime], None]]:
    """A progress callback (rows done, recorded time reached) that shows a rich progress bar
    on a terminal's stderr, or writes a line to stderr at every tenth of the rows otherwise."""
    import sys

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from twin.cli.common import err

    total = sum(b.manifest.rows.values())
    start = b.manifest.start
    recorded_s = max((b.manifest.end - start).total_seconds(), 1.0)
    if not sys.stderr.isatty():
        step = max(total // 10, 1)
        state = {"next": step}

        def line(rows: int, ts: datetime) -> None:
            if rows >= state["next"] or rows >= total:
                state["next"] = (rows // step + 1) * step
                print(
                    f"replay: {rows:,}/{total:,} rows, {_when(ts, start, recorded_s)}",
                    file=sys.stderr,
                    flush=True,
                )

        yield line
        return
    with Progress(
        TextColumn("[bold]replay[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows, {task.fields[when]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
    ) as progress:
        task = progress.add_task("replay", total=total, when="")

        def bar(rows: int, ts: datetime) -> None:
            progress.update(task, completed=rows, when=_when(ts, start, recorded_s))

        yield bar


def _when(ts: datetime, start: datetime, recorded_s: float) -> str:
    """How far into the recording ``ts`` is, e.g. 'recorded time 06:00:00 of 24:00:00'."""
    done_s = min(max((ts - start).total_seconds(), 0.0), recorded_s)  # shifted: still in range
    return f"recorded time {_hms(done_s)} of {_hms(recorded_s)}"


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


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
    min_breach: Annotated[
        str,
        typer.Option(
            "--min-breach",
            help="A new breach shorter than this (600, 600s, 10m, 1.5h) makes a scenario"
            ' "fits with risks" naming its length, not "does not fit".',
        ),
    ] = "5m",
    tariff_per_kwh: Annotated[
        float | None,
        typer.Option(
            "--tariff-per-kwh",
            min=0.0,
            help="Price of 1 kWh: the report prices each scenario's facility energy.",
        ),
    ] = None,
    pue: Annotated[
        float | None,
        typer.Option(min=1.0, help="Power usage effectiveness: facility energy = IT energy x PUE."),
    ] = None,
    currency: Annotated[
        str, typer.Option(help="Shown after prices (with --tariff-per-kwh), e.g. EUR.")
    ] = "",
) -> None:
    """Run the baseline and each scenario through the calibrated twin; write report.md and
    report.html (an executive summary; per scenario its verdict with a one-line reason,
    headroom against the same component's baseline, time over limits, first breach,
    throttled GPU-hours, alerts, energy and, with --tariff-per-kwh, its cost; figures on
    clock time)."""
    from collectors.base import parse_duration_s
    from twin.alerts import RuleFileError, load_rules
    from twin.replay.bundle import Bundle, BundleError
    from twin.replay.report import Costs, write_report
    from twin.replay.scenario import ScenarioError, load_scenario
    from twin.replay.verdict import Tolerance
    from twin.replay.whatif import load, run_all

    try:
        min_breach_s = parse_duration_s(min_breach, "--min-breach")
    except ValueError as e:
        raise fail(str(e)) from None
    if len(currency) > 8:
        raise fail(f"--currency {currency!r} is longer than 8 characters")
    costs = (
        Costs(tariff_per_kwh=tariff_per_kwh, pue=pue, currency=currency)
        if tariff_per_kwh is not None or pue is not None
        else None
    )
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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    tol = Tolerance(fraction=tolerance, temp_k=tolerance_k, min_breach_s=min_breach_s)
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("reading the bundle", total=len(loaded) + 2)
        data = load(b)

        def started(name: str) -> None:
            what = "baseline" if name == "baseline" else f"scenario {name}"
            bar.update(task, advance=1, description=what)

        base, runs = run_all(data, loaded, rule_set, tol, progress=started)
        bar.update(task, advance=1, description="report")
        md, html = write_report(b, base, runs, out, costs)
    if as_json:
        # pydantic's JSON writes an unknown figure (NaN: a CDU without a flow reading) as null
        rows = [json.loads(r.model_dump_json(exclude={"series"})) for r in [base, *runs]]
        typer.echo(json.dumps(rows))
        return
    for r in runs:
        typer.echo(f"{r.name}: {r.verdict}")
        for reason in r.reasons:
            typer.echo(f"  - {reason}")
    typer.echo(f"report: {md} {html}")
