"""The ``dctwin`` command line.

The same flags mean the same thing everywhere: ``--broker HOST:PORT``, ``--db PATH``,
``--site FILE``. Broker credentials and TLS come from the environment
(``DCTWIN_MQTT_USERNAME``, ``DCTWIN_MQTT_PASSWORD``, ``DCTWIN_MQTT_TLS``, ``DCTWIN_MQTT_CA_FILE``)
and never appear in logs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from collectors.mqtt import BrokerConfig, BrokerError
from twin import cli_replay
from twin.cli_collect import collect_app
from twin.procs import PARENT_ENV, exit_with_parent, on_stop_signals, stop_processes

app = typer.Typer(
    name="dctwin",
    help="dctwin: a live, calibrated digital twin of AI datacenters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, soft_wrap=True)


@app.callback()
def _main() -> None:
    """dctwin: a live, calibrated digital twin of AI datacenters."""
    exit_with_parent()  # a child of `dctwin demo` stops when the demo is gone


REPO = Path(__file__).resolve().parents[1]
DEMO_SITE = REPO / "sample_telemetry" / "demo_site.yaml"
DEMO_RULES = REPO / "deploy" / "alert_rules.yaml"
DASHBOARDS = REPO / "dashboards"

BrokerOpt = Annotated[
    str | None,
    typer.Option(
        "--broker",
        help="MQTT broker HOST:PORT (default: DCTWIN_MQTT_HOST/PORT or 127.0.0.1:1883).",
    ),
]
DbOpt = Annotated[Path, typer.Option("--db", help="DuckDB store file.")]
SiteOpt = Annotated[Path | None, typer.Option("--site", help="Site YAML file.")]
MaxFutureOpt = Annotated[
    float,
    typer.Option(
        "--max-future", help="Dead-letter timestamps more than this many s ahead; 0: off."
    ),
]
MaxPastOpt = Annotated[
    float,
    typer.Option("--max-past", help="Dead-letter timestamps more than this many s old; 0: off."),
]


#: Environment variables that hold secrets: their values are blanked in every log line.
SECRET_ENV = ("DCTWIN_API_TOKEN", "DCTWIN_MQTT_PASSWORD")
MIN_TOKEN_LEN = 16


def _setup_logging(verbose: bool) -> None:
    """Log to stderr; HTTP client loggers at WARNING (httpx logs every request's URL, and a
    hook's URL is its secret); every line redacted (:mod:`twin.redact`), also with --verbose."""
    from twin.redact import install_log_redaction, register_secret

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in ("amqtt", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for var in SECRET_ENV:
        register_secret(os.environ.get(var))
    install_log_redaction()


def _api_token(cli_token: str | None, token_file: Path | None) -> str | None:
    """The API token from --api-token-file, --api-token or DCTWIN_API_TOKEN (in that order of
    preference); at least MIN_TOKEN_LEN characters. Never printed."""
    from twin.redact import register_secret

    if cli_token and token_file is not None:
        raise _fail("give --api-token-file or --api-token, not both")
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            raise _fail(f"--api-token-file {token_file}: cannot read it ({why})") from None
        if not token:
            raise _fail(f"--api-token-file {token_file}: the file is empty")
        source = f"--api-token-file {token_file}"
    elif cli_token:
        token, source = cli_token, "--api-token"
        logging.getLogger("twin.cli").warning(
            "--api-token on the command line is visible to every local user (ps,"
            " /proc/*/cmdline); use --api-token-file PATH or DCTWIN_API_TOKEN"
        )
    else:
        token, source = os.environ.get("DCTWIN_API_TOKEN", "").strip(), "DCTWIN_API_TOKEN"
        if not token:
            return None
    register_secret(token)
    if len(token) < MIN_TOKEN_LEN:
        raise _fail(
            f"{source}: the API token has {len(token)} characters, at least {MIN_TOKEN_LEN}"
            " are required (e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')"
        )
    return token


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _broker(hostport: str | None) -> BrokerConfig:
    try:
        return BrokerConfig.parse(hostport)
    except ValueError as e:
        raise _fail(str(e)) from None


def _site(path: Path | None, required: bool = False):
    from twin.site import SiteError, load_site

    if path is None:
        if required:
            raise _fail("--site FILE is required")
        return None
    try:
        return load_site(path)
    except SiteError as e:
        raise _fail(str(e)) from None


def _parse_time(value: str, name: str) -> datetime:
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise _fail(
            f"{name} {value!r} is not an ISO 8601 time (e.g. 2026-11-29T14:00:00Z)"
        ) from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _store(db: Path, read_only: bool = False):
    from twin.store import Store, StoreError

    try:
        return Store(db, read_only=read_only)
    except StoreError as e:
        raise _fail(str(e)) from None


@app.command()
def sim(
    site: SiteOpt = None,
    broker: BrokerOpt = None,
    seed: Annotated[int, typer.Option(help="Random seed; same seed, same telemetry.")] = 0,
    rate: Annotated[
        float, typer.Option(help="Samples per simulated second per device [Hz].")
    ] = 1.0,
    speed: Annotated[
        float, typer.Option(help="Simulated seconds per wall second; 0 = as fast as possible.")
    ] = 1.0,
    duration: Annotated[
        float | None,
        typer.Option(help="Simulated seconds to run (default: until Ctrl-C or SIGTERM)."),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            help="Simulated start time, ISO 8601 UTC. Default: now; with --speed other than 1"
            " and a --duration, now minus the duration, so no timestamp lies in the future."
        ),
    ] = None,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            help="Inject a fault, KIND:TARGET@START[+DURATION]; kinds: cold_plate,"
            " cold_plate_decay and phase_creep (these two ramp up over DURATION), pump_failure,"
            " phase_overload, fleet_idle. Repeatable."
            " E.g. pump_failure:cdu-1/pump1@10m+15m."
        ),
    ] = None,
    truth: Annotated[
        Path | None, typer.Option(help="Write the true device parameters to this JSON file.")
    ] = None,
    jsonl: Annotated[
        Path | None, typer.Option(help="Also write every message to this JSONL file.")
    ] = None,
    no_mqtt: Annotated[
        bool, typer.Option("--no-mqtt", help="Do not publish (use --jsonl).")
    ] = False,
    verbose: bool = False,
) -> None:
    """Simulate a whole site (GPUs, nodes, PDUs, CDUs, links) and publish it over MQTT."""
    from collectors.simulator import SiteSimulator, parse_fault
    from collectors.simulator.publisher import run_simulation

    _setup_logging(verbose)
    site_obj = _site(site or DEMO_SITE, required=True)
    try:
        faults = [parse_fault(f) for f in fault or []]
    except ValueError as e:
        raise _fail(str(e)) from None
    if start:
        t_start = _parse_time(start, "--start")
    else:
        now = datetime.now(UTC).replace(microsecond=0)
        t_start = now - timedelta(seconds=duration) if duration and speed != 1 else now
    try:
        simulator = SiteSimulator(site_obj, seed=seed, start=t_start, rate_hz=rate, faults=faults)
    except ValueError as e:
        raise _fail(str(e)) from None
    cfg = None if no_mqtt else _broker(broker)
    if cfg is None and jsonl is None:
        raise _fail("--no-mqtt needs --jsonl PATH, or there is nowhere to send the telemetry")
    if truth:
        try:
            truth.write_text(json.dumps(simulator.truth(), indent=1, default=str))
        except OSError as e:
            raise _fail(f"--truth {truth}: cannot write: {e.strerror or e}") from None
    stop = threading.Event()
    on_stop_signals(stop)
    total = int(duration * rate) if duration else None
    with Progress(
        TextColumn("[bold]sim[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} ticks"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not sys.stderr.isatty(),
    ) as progress:
        task = progress.add_task(site_obj.name, total=total)
        try:
            stats = run_simulation(
                simulator,
                broker=cfg,
                jsonl=jsonl,
                speed=speed,
                duration_s=duration,
                stop=stop,
                on_tick=lambda n: progress.update(task, completed=n),
            )
        except BrokerError as e:
            raise _fail(str(e)) from None
        except OSError as e:
            what = f"--jsonl {jsonl}: cannot write" if jsonl else "simulator"
            raise _fail(f"{what}: {e.strerror or e}") from None
    typer.echo(json.dumps(stats))


@app.command()
def serve(
    broker: BrokerOpt = None,
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    client_id: Annotated[str, typer.Option(help="MQTT client id (the persistent session).")] = (
        "dctwin-ingest"
    ),
    share_group: Annotated[
        str | None, typer.Option(help="Subscribe as $share/GROUP/... to split load.")
    ] = None,
    flush_interval: Annotated[float, typer.Option(help="Seconds between batch writes.")] = 0.25,
    retention_days: Annotated[
        float | None, typer.Option(help="Delete raw samples older than this many days.")
    ] = None,
    max_future: MaxFutureOpt = 300.0,
    max_past: MaxPastOpt = 30 * 86400.0,
    stall_after: Annotated[
        float,
        typer.Option(
            help="/healthz answers 503 when received messages wait this many s with nothing"
            " committed (a failing or locked store); 0: never."
        ),
    ] = 60.0,
    calibrate_every: Annotated[
        float, typer.Option(help="Refit every device every this many s (needs --site); 0: off.")
    ] = 3600.0,
    calibrate_window: Annotated[
        float, typer.Option(help="Seconds of telemetry each refit uses.")
    ] = 7200.0,
    calibrate_holdout: Annotated[
        float, typer.Option(help="Last seconds of that window held out to score the fit.")
    ] = 1200.0,
    detect_every: Annotated[
        float,
        typer.Option(
            help="Recompute headroom and hot spots and evaluate alert rules every this many s"
            " (needs --site); 0: off."
        ),
    ] = 60.0,
    rules: Annotated[
        Path | None, typer.Option(help="Alert rule file (e.g. deploy/alert_rules.yaml).")
    ] = None,
    hooks: Annotated[
        Path | None, typer.Option(help="Alert hook file (e.g. deploy/alert_hooks.yaml).")
    ] = None,
    api: Annotated[bool, typer.Option("--api/--no-api", help="Serve the HTTP API.")] = True,
    api_host: Annotated[
        str, typer.Option(help="Address the HTTP API listens on (default: localhost only).")
    ] = "127.0.0.1",
    api_port: Annotated[int, typer.Option(help="HTTP API port (0: any free port).")] = 8420,
    api_allowed_hosts: Annotated[
        str | None,
        typer.Option(
            envvar="DCTWIN_API_ALLOWED_HOSTS",
            help="Comma-separated Host header names the API answers besides its address,"
            " localhost, 127.0.0.1 and [::1] (e.g. twin,twin.example.com; *.example.com for"
            " subdomains; * for any). Others get 400 (DNS rebinding).",
        ),
    ] = None,
    api_token: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="Bearer token (16+ characters) for the API's writes (acknowledge, silences);"
            " without one, writes are refused. Visible in `ps`: prefer --api-token-file or"
            " DCTWIN_API_TOKEN (the default).",
        ),
    ] = None,
    api_token_file: Annotated[
        Path | None,
        typer.Option(
            help="Read the API's bearer token from this file (surrounding whitespace is dropped)."
        ),
    ] = None,
    whatif_bundles: Annotated[
        Path, typer.Option(help="Directory of recorded bundles the API's what-if jobs use.")
    ] = REPO / "sample_telemetry",
    whatif_scenarios: Annotated[
        Path, typer.Option(help="Directory of scenario YAML files the what-if jobs offer.")
    ] = REPO / "sample_telemetry" / "scenarios",
    verbose: bool = False,
) -> None:
    """Run the twin service: ingest MQTT telemetry into the DuckDB store, refit the model and
    recompute headroom, hot spots and alerts on a schedule, and serve the HTTP API with
    /metrics (Ctrl-C or SIGTERM stops)."""
    from twin.health import ServiceHealth
    from twin.ingest import Ingester, IngestLimits
    from twin.ingest.mqtt_service import MqttIngestService, ServiceOptions

    _setup_logging(verbose)
    # the service's one health record: every loop reports into it; /healthz and /metrics read it
    health = ServiceHealth(stall_after_s=stall_after)
    api_token = _api_token(api_token, api_token_file)
    if calibrate_holdout >= calibrate_window:
        raise _fail("--calibrate-holdout must be shorter than --calibrate-window")
    site_obj = _site(site)
    # a bad rule or hook file is refused before anything starts
    alert_files = _alert_files(rules, hooks) if rules is not None else None
    cfg = _broker(broker)
    store = _store(db)
    ingester = Ingester(store, site_obj, IngestLimits(max_future, max_past))
    service = MqttIngestService(
        cfg,
        ingester,
        ServiceOptions(
            client_id=client_id,
            share_group=share_group,
            flush_interval_s=flush_interval,
            retention_days=retention_days,
        ),
        health=health,
    )
    try:
        service.start()
    except BrokerError as e:
        store.close()
        raise _fail(str(e)) from None
    scheduler = None
    if site_obj is not None and calibrate_every > 0:
        from twin.calibrate.schedule import CalibrationScheduler

        scheduler = CalibrationScheduler(
            store,
            site_obj,
            interval_s=calibrate_every,
            window_s=calibrate_window,
            holdout_s=calibrate_holdout,
            health=health,
        )
        scheduler.start()
    detector = delivery = engine = None
    if site_obj is not None and detect_every > 0:
        from twin.detect import DetectionScheduler

        if alert_files is not None:
            engine, delivery = _alerting(store, site_obj, *alert_files, health=health)
        detector = DetectionScheduler(
            store, site_obj, interval_s=detect_every, engine=engine, health=health
        )
        detector.start()
    signal.signal(signal.SIGHUP, _sighup_reload(engine, delivery, rules, hooks))
    api_server = None
    if api:
        from twin.api import ApiContext, ApiError, ApiServer
        from twin.api.whatif import whatif_router

        ctx = ApiContext(
            store,
            site=site_obj,
            ingester=ingester,
            detector=detector,
            calibrator=scheduler,
            engine=engine,
            service=service,
            token=api_token or None,
            health=health,
            allowed_hosts=[h for h in (api_allowed_hosts or "").split(",") if h.strip()],
        )
        reports = db.with_name(db.name + ".whatif")
        ctx.routers.append(whatif_router(ctx, whatif_bundles, whatif_scenarios, reports))
        try:
            api_server = ApiServer(ctx, host=api_host, port=api_port).start()
        except ApiError as e:
            for part in (scheduler, detector, delivery):
                if part is not None:
                    part.stop()
            service.stop()
            store.close()
            raise _fail(str(e)) from None
        writes = (
            "token required"
            if api_token
            else "off (no --api-token-file / DCTWIN_API_TOKEN / --api-token)"
        )
        err.print(
            f"api: {api_server.url} (OpenAPI at {api_server.url}/docs, Prometheus at"
            f" {api_server.url}/metrics; writes: {writes})",
            highlight=False,
        )
    # SIGTERM (systemd, docker stop, a script's background job) and SIGINT stop alike.
    stopping = threading.Event()
    on_stop_signals(stopping, hup=False)
    err.print(f"serving: {cfg.describe()} -> {db} (Ctrl-C or SIGTERM stops)", highlight=False)
    while not stopping.wait(0.5):
        pass
    err.print("stopping: flushing what has arrived", highlight=False)
    # The API first (no new requests), the loops, then the ingest (it writes what it holds),
    # and the store last; one part failing to stop does not keep the others running.
    parts = [api_server, scheduler, detector, delivery, service]
    for part in parts:
        if part is not None:
            try:
                part.stop()
            except Exception as e:  # say what failed, stop the rest
                err.print(f"[yellow]stopping {type(part).__name__}: {e}[/]", highlight=False)
    store.close()
    typer.echo(json.dumps(ingester.counters.as_dict()))


@app.command()
def ingest(
    file: Annotated[
        Path, typer.Option("--file", help="JSONL of {topic, payload} lines, or an export dir.")
    ],
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    site_name: Annotated[
        str | None, typer.Option(help="Site name for bundle topics (default: the site's).")
    ] = None,
    max_future: MaxFutureOpt = 300.0,
    max_past: MaxPastOpt = 30 * 86400.0,
) -> None:
    """Load telemetry from a file without a broker, through the same validation as live data."""
    from twin.ingest import Ingester, IngestLimits
    from twin.ingest.files import ingest_path
    from twin.ingest.ingester import StoreUnavailable

    _setup_logging(False)
    site_obj = _site(site)
    if not file.exists():
        raise _fail(f"--file {file}: no such file or directory")
    name = site_name or (site_obj.name if site_obj else "site")
    with _store(db) as store:
        ingester = Ingester(store, site_obj, IngestLimits(max_future, max_past))
        with Progress(
            TextColumn("[bold]ingest[/] {task.description}"),
            TextColumn("{task.completed} messages"),
            TimeElapsedColumn(),
            console=err,
            disable=not sys.stderr.isatty(),
        ) as progress:
            task = progress.add_task(str(file))
            try:
                ingest_path(ingester, file, name, lambda n: progress.advance(task, n))
                store.rollup()
            except StoreUnavailable as e:  # disk full, a lock: what is committed stays
                raise _fail(f"the store {db} failed: {e}") from None
    typer.echo(json.dumps(ingester.counters.as_dict()))


@app.command()
def export(
    db: DbOpt = Path("dctwin.duckdb"),
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("export"),
    start: Annotated[str | None, typer.Option(help="ISO 8601 start (default: oldest).")] = None,
    end: Annotated[str | None, typer.Option(help="ISO 8601 end, exclusive (default: newest).")] = (
        None
    ),
) -> None:
    """Export raw samples of a time range to Parquet, partitioned by kind and day."""
    with _store(db, read_only=True) as store:
        status = store.status()
        if status["time_range"] is None:
            raise _fail(f"{db} holds no samples")
        t0 = (
            _parse_time(start, "--start")
            if start
            else _parse_time(status["time_range"]["start"], "")
        )
        t1 = (
            _parse_time(end, "--end")
            if end
            else _parse_time(status["time_range"]["end"], "") + timedelta(microseconds=1)
        )
        if t1 <= t0:
            raise _fail(f"--end {t1.isoformat()} is not after --start {t0.isoformat()}")
        exported = store.export_parquet(out, t0, t1)
    typer.echo(
        json.dumps(
            {"out": str(out), "start": t0.isoformat(), "end": t1.isoformat(), "samples": exported}
        )
    )


@app.command()
def status(
    db: DbOpt = Path("dctwin.duckdb"),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """What the store holds: samples per kind, time range, dead letters, unknown ids."""
    with _store(db, read_only=True) as store:
        st = store.status()
    if as_json:
        typer.echo(json.dumps(st))
        return
    out = Console()
    out.print(f"[bold]{st['db']}[/]  {st['messages']} messages from {st['sources']} sources")
    if st["time_range"]:
        out.print(f"time range: {st['time_range']['start']} .. {st['time_range']['end']}")
    for kind, n in st["samples"].items():
        out.print(f"  {kind:5} {n:>12,} samples  {st['readings'][kind]:>14,} readings")
    out.print(f"dead letters: {st['dead_letters'] or 'none'}")
    total = st.get("unknown_ids_total", len(st["unknown_ids"]))
    out.print(f"unknown ids: {total}")
    for u in st["unknown_ids"][:20]:  # the most recently seen first
        out.print(f"  {u['kind']} {u['id']} from {u['source']}: {u['samples']} samples")
    if total > 20:
        out.print(f"  ... and {total - 20:,} more (--json lists {len(st['unknown_ids'])})")


@app.command()
def maintain(
    db: DbOpt = Path("dctwin.duckdb"),
    retention_days: Annotated[
        float | None, typer.Option(help="Delete raw samples older than this many days.")
    ] = None,
) -> None:
    """Bring the 1-minute and 1-hour rollups up to date and apply raw retention."""
    with _store(db) as store:
        result = {"rollup_rows": store.rollup()}
        if retention_days:
            result["deleted"] = store.apply_retention(retention_days)
    typer.echo(json.dumps(result))


@app.command()
def calibrate(
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    window: Annotated[float, typer.Option(help="Seconds of telemetry to fit on.")] = 7200.0,
    holdout: Annotated[
        float, typer.Option(help="Last seconds of the window held out to score the fit.")
    ] = 1200.0,
    end: Annotated[str | None, typer.Option(help="ISO 8601 end (default: newest sample).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Fit every device against the store and save the parameters as a new version."""
    from twin.calibrate.calibrate import calibrate as run_calibration
    from twin.calibrate.calibrate import save_run

    site_obj = _site(site or DEMO_SITE, required=True)
    if holdout >= window:
        raise _fail(f"--holdout {holdout:g} must be shorter than --window {window:g}")
    with _store(db) as store:
        try:
            result = run_calibration(
                store,
                site_obj,
                end=_parse_time(end, "--end") if end else None,
                window_s=window,
                holdout_s=holdout,
            )
        except ValueError as e:
            raise _fail(str(e)) from None
        save_run(store, result)
    if as_json:
        typer.echo(json.dumps(result))
        return
    out = Console()
    run = result["run"]
    out.print(
        f"calibration run {run['run_id']}: {run['window_start']} .. {run['window_end']}"
        f" ({run['gpus']} GPUs, {run['seconds']} s)"
    )
    for cls, d in sorted(result["classes"].items()):
        out.print(f"[bold]{cls}[/] usable {d['usable_fraction']:.0%}")
        for name, v in sorted(d.items()):
            if isinstance(v, dict) and "median" in v:
                out.print(
                    f"  {name:22} median {v['median']:.4g}  p10 {v['p10']:.4g}"
                    f"  p90 {v['p90']:.4g}  n={v['n']}"
                )
        for quantity, q in sorted(d.get("quality", {}).items()):
            out.print(
                f"  quality {quantity:18} MAE {q['mae']}  CV(RMSE) {q['cv_rmse']}  NMBE {q['nmbe']}"
            )
    for e in result["events"]:
        out.print(f"[yellow]event[/] {e['id']}: {e['detail']}")


def _alert_files(rules: Path, hooks: Path | None):
    """The rule set and the hooks, validated; a bad file exits with its error (file, rule,
    field), no traceback."""
    from twin.alerts import RuleFileError, load_rules
    from twin.alerts.hooks import load_hooks

    try:
        return load_rules(rules), (load_hooks(hooks) if hooks is not None else [])
    except RuleFileError as e:
        raise _fail(str(e)) from None


def _alerting(store, site_obj, rule_set, hook_list, health=None):
    """The alert engine on the store, and the delivery workers of its outbox (started; one
    per hook, reporting into ``health`` as ``outbox:<hook>`` when given)."""
    from twin.alerts import AlertEngine, Delivery, Outbox, Topology

    if not hook_list:
        err.print(
            "[yellow]no --hooks: alerts are kept in the store (alert_history, GET"
            " /api/v1/alerts), not sent[/]"
        )
    outbox = Outbox(store.cursor(), hook_list)
    engine = AlertEngine(rule_set, Topology.from_site(site_obj), outbox)
    delivery = Delivery(outbox, interval_s=1.0, health=health).start()
    for h in hook_list:
        logging.getLogger("twin.alerts").info("hook %s: %s", h.name, h.target)
    return engine, delivery


def _sighup_reload(engine, delivery, rules: Path | None, hooks: Path | None):
    """The SIGHUP handler of `dctwin serve`: reload the rule and hook files (see
    :mod:`twin.alerts.reload`), or say that there is nothing to reload."""
    if engine is None or delivery is None or rules is None:

        def nothing(signum, frame) -> None:
            logging.getLogger("twin.alerts.reload").warning(
                "SIGHUP: no alert rules to reload (serve runs alerting with --rules, --site"
                " and --detect-every > 0)"
            )

        return nothing
    from twin.alerts.reload import AlertReloader

    return AlertReloader(engine, delivery, rules, hooks).on_signal


def _existing_store(db: Path):
    if not db.exists():
        raise _fail(f"--db {db}: no such store (run `dctwin serve` or `dctwin ingest` first)")
    return _store(db, read_only=True)


@app.command()
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

    site_obj = _site(site or DEMO_SITE, required=True)
    with _existing_store(db) as store:
        try:
            report = compute_headroom(store, site_obj, horizon_s=horizon, step_s=step)
        except ValueError as e:
            raise _fail(str(e)) from None
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


@app.command()
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

    site_obj = _site(site or DEMO_SITE, required=True)
    with _existing_store(db) as store:
        try:
            report = find_hotspots(store, site_obj, k_sigma=k_sigma, minutes=minutes)
        except ValueError as e:
            raise _fail(str(e)) from None
    if as_json:
        typer.echo(report.model_dump_json())
        return
    for h in report.hotspots:
        typer.echo(f"{h.kind} {h.id} {h.reason}: {h.detail}")
    if not report.hotspots:
        typer.echo("no hot spots")
    for p in report.problems:
        err.print(f"[yellow]{p}[/]")


@app.command()
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
    _site(site_path, required=True)
    if not db.exists():
        raise _fail(f"--db {db}: no such store")
    try:
        payload = fleets_command_payload(db, site_path, window, threshold, target_util)
    except ValueError as e:
        raise _fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(payload, default=str))
        return
    for f in payload["fleets"]:
        mark = "UNDERUSED" if f["flagged"] else "ok"
        typer.echo(f"{f['fleet']:16} {mark:9} {f['reason']}")


@app.command()
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

    site_obj = _site(site or DEMO_SITE, required=True)
    with _existing_store(db) as store:
        newest = store.con.execute("SELECT max(ts) FROM node").fetchall()[0][0]
        if newest is None:
            raise _fail(f"--db {db}: no node power samples to forecast from")
        try:
            if backtest:
                result = run_backtest(store, site_obj, now=newest, horizon_s=horizon, step_s=step)
            else:
                result = forecast_site(store, site_obj, now=newest, horizon_s=horizon, step_s=step)
        except ValueError as e:
            raise _fail(str(e)) from None
    if as_json:
        typer.echo(result.model_dump_json())
        return
    typer.echo(result.model_dump_json(indent=1))


@app.command()
def broker(
    kind: Annotated[str, typer.Option(help="auto | mosquitto | embedded")] = "auto",
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1.")] = 1883,
) -> None:
    """Run a local MQTT broker (mosquitto when on PATH, else the embedded one) until Ctrl-C,
    SIGTERM or a hang-up; the broker process stops with it."""
    from twin.broker import start_broker

    if kind not in ("auto", "mosquitto", "embedded"):
        raise _fail(f"--kind {kind!r}: expected auto, mosquitto or embedded")
    stop = threading.Event()
    on_stop_signals(stop)
    try:
        b = start_broker(kind, port=port)  # type: ignore[arg-type]
    except RuntimeError as e:
        raise _fail(str(e)) from None
    err.print(f"{b.kind} broker on {b.address} (Ctrl-C or SIGTERM stops)", highlight=False)
    try:
        while not stop.wait(0.5):
            if b.process.poll() is not None:
                raise _fail(f"the {b.kind} broker exited with code {b.process.returncode}")
    finally:
        b.stop()


def _port(preferred: int) -> int:
    """``preferred`` when it is free on 127.0.0.1, else any free port."""
    import socket

    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise _fail("no free TCP port on 127.0.0.1")


@app.command()
def demo(
    site: SiteOpt = None,
    db: DbOpt = Path("demo.duckdb"),
    port: Annotated[int | None, typer.Option(help="Broker port (default: a free one).")] = None,
    broker_kind: Annotated[str, typer.Option(help="auto | mosquitto | embedded")] = "auto",
    speed: Annotated[float, typer.Option(help="Simulated seconds per wall second.")] = 1.0,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many wall seconds (default: Ctrl-C).")
    ] = None,
    seed: int = 0,
    api_port: Annotated[
        int, typer.Option(help="HTTP API port (another free one when it is taken).")
    ] = 8420,
    console: Annotated[
        bool, typer.Option("--console/--no-console", help="Start the Streamlit console.")
    ] = True,
    console_port: Annotated[
        int, typer.Option(help="Console port (another free one when it is taken).")
    ] = 8501,
    rules: Annotated[
        Path | None, typer.Option(help="Alert rules (default: deploy/alert_rules.yaml).")
    ] = None,
    fault: Annotated[
        list[str] | None,
        typer.Option(help="A simulator fault, KIND:TARGET@START[+DURATION]; repeatable."),
    ] = None,
    detect_every: Annotated[
        float, typer.Option(help="Headroom, hot spots and alerts every this many s.")
    ] = 60.0,
    console_writes: Annotated[
        bool,
        typer.Option(
            "--console-writes/--no-console-writes",
            help="Give the console the service's write token: whoever opens the console can"
            " then acknowledge and silence alerts. Default: the console is read-only.",
        ),
    ] = False,
) -> None:
    """One command: a local broker, the simulated demo site publishing live, the service with
    its HTTP API, and the console. Ctrl-C, SIGTERM or closing the terminal (SIGHUP) stops all
    of them, the broker included."""

    from twin.broker import start_broker

    site_path = site or DEMO_SITE
    _site(site_path, required=True)
    if broker_kind not in ("auto", "mosquitto", "embedded"):
        raise _fail(f"--broker-kind {broker_kind!r}: expected auto, mosquitto or embedded")
    rules_path = rules or DEMO_RULES
    if not rules_path.exists():
        raise _fail(f"--rules {rules_path}: no such file")
    stop = threading.Event()
    on_stop_signals(stop)  # SIGTERM, SIGINT (unless ignored) and SIGHUP: stop everything
    try:
        b = start_broker(broker_kind, port=port)  # type: ignore[arg-type]
    except RuntimeError as e:
        raise _fail(str(e)) from None
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        _demo_run(
            b,
            procs,
            stop,
            site_path=site_path,
            db=db,
            rules_path=rules_path,
            speed=speed,
            duration=duration,
            seed=seed,
            api_port=api_port,
            console=console,
            console_port=console_port,
            console_writes=console_writes,
            fault=fault or [],
            detect_every=detect_every,
        )
    finally:
        _demo_stop(procs, b)
        err.print("demo stopped.")


def _demo_run(
    b,
    procs: list[tuple[str, subprocess.Popen[bytes]]],
    stop: threading.Event,
    *,
    site_path: Path,
    db: Path,
    rules_path: Path,
    speed: float,
    duration: float | None,
    seed: int,
    api_port: int,
    console: bool,
    console_port: int,
    console_writes: bool,
    fault: list[str],
    detect_every: float,
) -> None:
    """Start the demo's children into ``procs`` and watch them until ``stop`` or the end."""
    import secrets

    api_port = _port(api_port)
    api_url = f"http://127.0.0.1:{api_port}"
    token = os.environ.get("DCTWIN_API_TOKEN") or secrets.token_urlsafe(18)
    env = {
        **os.environ,
        **b.client_env(),
        "DCTWIN_API_TOKEN": token,
        "DCTWIN_API_URL": api_url,
        PARENT_ENV: str(os.getpid()),  # each child stops when the demo is gone, even killed
    }
    # The service's session exists before the simulator's first poll: nothing published
    # while the service is still starting is lost.
    from collectors.contract import TOPIC_PREFIX
    from collectors.mqtt import prepare_session

    try:
        prepare_session(b.client_config(), "dctwin-ingest", f"{TOPIC_PREFIX}/#")
    except BrokerError as e:
        raise _fail(str(e)) from None
    me = [sys.executable, "-m", "twin.cli"]

    def spawn(name: str, args: list[str], child_env: dict[str, str], **kw) -> None:
        # Its own session: a terminal's Ctrl-C or hang-up reaches the demo only, which stops
        # its children in order (the simulator before the service, so nothing is lost).
        procs.append((name, subprocess.Popen(args, env=child_env, start_new_session=True, **kw)))

    spawn(
        "service",
        [
            *me,
            "serve",
            *("--broker", b.address, "--db", str(db), "--site", str(site_path)),
            *("--rules", str(rules_path), "--detect-every", str(detect_every)),
            *("--api-port", str(api_port)),
        ],
        env,
    )
    spawn(
        "simulator",
        [
            *me,
            "sim",
            *("--broker", b.address, "--site", str(site_path)),
            *("--seed", str(seed), "--speed", str(speed)),
            *[a for f in fault for a in ("--fault", f)],
        ],
        env,
    )
    console_line = "  console    off (--no-console)\n"
    if console:
        console_port = _port(console_port)
        # The console never gets the service's token unless asked (--console-writes).
        console_env = {k: v for k, v in env.items() if k != "DCTWIN_API_TOKEN"}
        console_env.pop("DCTWIN_CONSOLE_TOKEN", None)
        if console_writes:
            console_env["DCTWIN_CONSOLE_TOKEN"] = token
        spawn(
            "console",
            [*me, "console", "--host", "127.0.0.1", "--port", str(console_port), "--api", api_url],
            console_env,
            stdout=subprocess.DEVNULL,
        )
        writes = "with writes (--console-writes)" if console_writes else "read-only"
        console_line = f"  console    http://127.0.0.1:{console_port} ({writes})\n"
    err.print(
        "[bold]dctwin demo[/]\n"
        f"  broker     {b.kind} at mqtt://{b.address}\n"
        f"  simulator  site {site_path} publishing dctwin/v1/# at {speed:g}x real time\n"
        f"  service    ingesting into {db}, alert rules {rules_path}\n"
        f"  api        {api_url} (OpenAPI at {api_url}/docs, {api_url}/metrics)\n"
        f"{console_line}"
        f"  token      writes (acknowledge, silence) need 'Authorization: Bearer {token}'\n"
        f"  inspect    dctwin status --db {db} (after it stops: the service holds the file)\n"
        "  Ctrl-C (or SIGTERM) stops everything.",
        highlight=False,
    )
    deadline = time.monotonic() + duration if duration else None
    while not stop.wait(0.5):
        if deadline is not None and time.monotonic() >= deadline:
            return
        for name, p in procs:
            if p.poll() is not None:
                raise _fail(f"the {name} exited with code {p.returncode}", 1)


#: Seconds a demo child gets to stop on SIGTERM before it is killed.
DEMO_STOP_S = {"console": 8.0, "simulator": 8.0, "service": 12.0}


def _demo_stop(procs: list[tuple[str, subprocess.Popen[bytes]]], b) -> None:
    """Stop the console and the simulator, then the service (it flushes what arrived), then
    the broker; a child that does not stop within its deadline is killed."""
    by_name = dict(procs)
    first = [by_name[n] for n in ("console", "simulator") if n in by_name]
    try:
        for p in stop_processes(first, deadline_s=DEMO_STOP_S["simulator"]):
            err.print(f"[yellow]killed pid {p.pid}: it did not stop on SIGTERM[/]")
        service = by_name.get("service")
        if service is not None:
            if service.poll() is None:
                time.sleep(1.0)  # let the broker deliver the simulator's last messages
            for p in stop_processes([service], deadline_s=DEMO_STOP_S["service"]):
                err.print(f"[yellow]killed the service (pid {p.pid}): it did not stop[/]")
    finally:
        b.stop()


@app.command()
def console(
    host: Annotated[
        str, typer.Option(help="Address to listen on (default: this machine only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8501,
    api: Annotated[
        str | None,
        typer.Option(
            "--api",
            help="The service's API URL (default: DCTWIN_API_URL or http://127.0.0.1:8420).",
        ),
    ] = None,
    verbose: bool = False,
) -> None:
    """The Streamlit console, a client of the service's HTTP API, until Ctrl-C or SIGTERM.

    It has no login, so it listens on 127.0.0.1 unless --host says otherwise. It is read-only
    unless DCTWIN_CONSOLE_TOKEN holds the service's write token (then whoever opens it can
    acknowledge and silence); the service's own DCTWIN_API_TOKEN is never used."""
    import socket
    from urllib.parse import urlsplit

    url = api or os.environ.get("DCTWIN_API_URL") or "http://127.0.0.1:8420"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(f"--api {url!r}: expected an http(s) URL, e.g. http://127.0.0.1:8420")
    if not 1 <= port <= 65535:
        raise _fail(f"--port {port}: expected 1..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise _fail(f"--host {host!r}: {e.strerror or e}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(addr)
        except OSError as e:
            raise _fail(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    try:
        from streamlit.web import cli as stcli
    except ImportError as e:
        raise _fail(f"the console needs streamlit: {e}") from None
    os.environ["DCTWIN_API_URL"] = url
    os.environ.pop("DCTWIN_API_TOKEN", None)  # the service's token is not the console's
    if host not in ("127.0.0.1", "::1", "localhost"):
        err.print(
            f"[yellow]the console has no login: anyone who reaches {host}:{port} can use it[/]",
            highlight=False,
        )
    writes = (
        "writes on (DCTWIN_CONSOLE_TOKEN)"
        if os.environ.get("DCTWIN_CONSOLE_TOKEN")
        else ("read-only (no DCTWIN_CONSOLE_TOKEN)")
    )
    err.print(f"console: http://{host}:{port} -> {url}, {writes}", highlight=False)
    # Streamlit stops its server on SIGTERM and SIGINT; a hang-up stops it the same way.
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, lambda *_: signal.raise_signal(signal.SIGTERM))
    sys.argv = [
        "streamlit",
        "run",
        str(DASHBOARDS / "app.py"),
        *("--server.headless", "true"),
        *("--server.address", host),
        *("--server.port", str(port)),
        *("--browser.gatherUsageStats", "false"),
        *("--logger.level", "info" if verbose else "warning"),
    ]
    try:
        stcli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise typer.Exit(code) from None


app.add_typer(collect_app, name="collect")
app.command()(cli_replay.record)
app.command()(cli_replay.replay)
app.command()(cli_replay.whatif)

if __name__ == "__main__":
    app()
