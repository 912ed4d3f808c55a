"""`dctwin serve`: the twin service (ingest, background loops, HTTP API) until stopped."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from twin.cli.common import (
    REPO,
    BrokerOpt,
    DbOpt,
    MaxFutureOpt,
    MaxPastOpt,
    SiteOpt,
    broker_config,
    err,
    fail,
    load_site_file,
    resolve_api_token,
    setup_logging,
)
from twin.procs import on_stop_signals

#: What `serve` says of the API's writes when it runs without a token.
NO_WRITES = "off (no --api-token-file / DCTWIN_API_TOKEN / --api-token)"


#: --calibrate-every's help (held out of serve() for its length)
CALIBRATE_EVERY_HELP = (
    "Refit every device every this many s (needs --site); the first fit comes once 10 min of"
    " GPU telemetry exist, then each time it has doubled; 0: off."
)


WhatifBundlesOpt = Annotated[
    Path, typer.Option(help="Directory of recorded bundles the API's what-if jobs use.")
]
WhatifScenariosOpt = Annotated[
    Path, typer.Option(help="Directory of scenario YAML files the what-if jobs offer.")
]
WhatifReportsOpt = Annotated[
    Path | None,
    typer.Option(help="Directory the what-if jobs write their reports to (default: DB.whatif)."),
]


ExportToOpt = Annotated[
    str | None,
    typer.Option(
        help="Export closed hours as Parquet (kind=/day=/hour=/shard=) to this directory or"
        " URL (s3://..., pyarrow.fs); --retention-days then deletes exported hours only."
    ),
]
ExportEveryOpt = Annotated[
    float, typer.Option(min=1, help="Seconds between history exports (--export-to).")
]
ExportShardOpt = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="Shard name in the history tree (--export-to; default: --shard, else main).",
    ),
]
ClientIdOpt = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="MQTT client id (the persistent session); default: dctwin-ingest, or"
        " dctwin-ingest-SHARD with --shard.",
    ),
]
ShardOpt = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="Run as this shard of the site file's shards: (needs --site): subscribe only to"
        " its sources' topics (and those its spanning components read), store only them,"
        " and calibrate, forecast and detect its own components. The store remembers its"
        " shard and refuses another's. Default: the whole site (shard main).",
    ),
]


def _export_options(export_to: str | None, every_s: float, shard: str) -> dict[str, Any]:
    """The history export's ServiceOptions fields, the shard name checked."""
    if export_to is not None:
        from twin.store.history import HistoryError, check_shard

        try:
            check_shard(shard)
        except HistoryError as e:
            raise fail(f"--export-shard: {e}") from None
    return {"export_to": export_to, "export_every_s": every_s, "export_shard": shard}


SeedCalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        help="A recorded bundle of the same site (e.g. sample_telemetry/demo_bundle): a"
        " store without a calibration starts from the bundle's, marked seeded, until the"
        " first fit on live data (needs --site)."
    ),
]


StoreMemoryOpt = Annotated[
    int | None,
    typer.Option(
        min=64,
        help="Cap DuckDB's memory for the store at this many MB (default: DuckDB's, 80 %"
        " of the machine's RAM; give each service on a shared machine its own share).",
    ),
]

StoreThreadsOpt = Annotated[
    int | None,
    typer.Option(min=1, help="DuckDB's worker threads (default: one per core)."),
]

BackgroundNiceOpt = Annotated[
    int,
    typer.Option(
        min=0,
        max=19,
        help="Run calibration and detection this much nicer than ingest and the API, so"
        " that a long refit does not delay the writes (Linux; 0: the same priority).",
    ),
]

ApiTokenOpt = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="Bearer token (16+ characters) for the API's writes (acknowledge, silences);"
        " without one, writes are refused. Visible in `ps`: prefer --api-token-file or"
        " DCTWIN_API_TOKEN (the default).",
    ),
]

ApiAllowedHostsOpt = Annotated[
    str | None,
    typer.Option(
        envvar="DCTWIN_API_ALLOWED_HOSTS",
        help="Comma-separated Host header names the API answers besides its address,"
        " localhost, 127.0.0.1 and [::1] (e.g. twin,twin.example.com; *.example.com for"
        " subdomains; * for any). Others get 400 (DNS rebinding).",
    ),
]


FastEveryOpt = Annotated[
    float,
    typer.Option(
        help="Between those passes, judge the breached-now limits (GPU temperature, PDU"
        " line and breaker current, CDU pumps) on the newest samples every this many s, so"
        " a step over a limit pages within seconds; 0: only the full pass judges them."
    ),
]
ConsoleUrlOpt = Annotated[
    str | None,
    typer.Option(
        help="The console's base URL as on-call reaches it (e.g. http://dctwin.example:8501):"
        " every page links the component's console page (Alertmanager's generatorURL)."
    ),
]


def serve(
    broker: BrokerOpt = None,
    db: DbOpt = Path("dctwin.duckdb"),
    site: SiteOpt = None,
    shard: ShardOpt = None,
    client_id: ClientIdOpt = None,
    share_group: Annotated[
        str | None, typer.Option(help="Subscribe as $share/GROUP/... to split load.")
    ] = None,
    flush_interval: Annotated[float, typer.Option(help="Seconds between batch writes.")] = 0.25,
    retention_days: Annotated[
        float | None, typer.Option(help="Delete raw samples older than this many days.")
    ] = None,
    export_to: ExportToOpt = None,
    export_every: ExportEveryOpt = 300.0,
    export_shard: ExportShardOpt = None,
    max_future: MaxFutureOpt = 300.0,
    max_past: MaxPastOpt = 30 * 86400.0,
    stall_after: Annotated[
        float,
        typer.Option(
            help="/healthz answers 503 when received messages wait this many s with nothing"
            " committed (a failing or locked store); 0: never."
        ),
    ] = 60.0,
    calibrate_every: Annotated[float, typer.Option(help=CALIBRATE_EVERY_HELP)] = 3600.0,
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
    fast_every: FastEveryOpt = 10.0,
    rules: Annotated[
        Path | None,
        typer.Option(
            help="Alert rule file (e.g. deploy/alert_rules.yaml); the API's what-if jobs list"
            " the alerts of this file too."
        ),
    ] = None,
    hooks: Annotated[
        Path | None, typer.Option(help="Alert hook file (e.g. deploy/alert_hooks.yaml).")
    ] = None,
    console_url: ConsoleUrlOpt = None,
    api: Annotated[bool, typer.Option("--api/--no-api", help="Serve the HTTP API.")] = True,
    api_host: Annotated[
        str, typer.Option(help="Address the HTTP API listens on (default: localhost only).")
    ] = "127.0.0.1",
    api_port: Annotated[int, typer.Option(help="HTTP API port (0: any free port).")] = 8420,
    api_allowed_hosts: ApiAllowedHostsOpt = None,
    api_token: ApiTokenOpt = None,
    api_token_file: Annotated[
        Path | None,
        typer.Option(
            help="Read the API's bearer token from this file (surrounding whitespace is dropped)."
        ),
    ] = None,
    whatif_bundles: WhatifBundlesOpt = REPO / "sample_telemetry",
    whatif_scenarios: WhatifScenariosOpt = REPO / "sample_telemetry" / "scenarios",
    whatif_reports: WhatifReportsOpt = None,
    seed_calibration: SeedCalibrationOpt = None,
    store_memory_mb: StoreMemoryOpt = None,
    store_threads: StoreThreadsOpt = None,
    background_nice: BackgroundNiceOpt = 10,
    verbose: bool = False,
) -> None:
    """Run the twin service: ingest MQTT telemetry into the DuckDB store, refit the model and
    recompute headroom, hot spots and alerts on a schedule, and serve the HTTP API with
    /metrics (Ctrl-C or SIGTERM stops)."""
    from twin.ingest.mqtt_service import ServiceOptions
    from twin.service import Service, ServiceConfig, ServiceError

    setup_logging(verbose)
    token = resolve_api_token(api_token, api_token_file)
    if calibrate_holdout >= calibrate_window:
        raise fail("--calibrate-holdout must be shorter than --calibrate-window")
    if fast_every < 0:
        raise fail(f"--fast-every {fast_every:g}: expected 0 (off) or a positive number of s")
    if console_url is not None and not console_url.startswith(("http://", "https://")):
        raise fail(f"--console-url {console_url!r}: expected an http:// or https:// URL")
    site_obj = load_site_file(site)
    if shard is not None:
        _check_shard(site_obj, shard)
    if rules is not None:  # a bad rule or hook file is refused before anything starts
        _check_alert_files(rules, hooks)
    cfg = broker_config(broker)
    config = ServiceConfig(
        db=db,
        site=site_obj,
        broker=cfg,
        ingest=ServiceOptions(
            client_id=client_id or (f"dctwin-ingest-{shard}" if shard else "dctwin-ingest"),
            share_group=share_group,
            flush_interval_s=flush_interval,
            retention_days=retention_days,
            **_export_options(export_to, export_every, export_shard or shard or "main"),
        ),
        max_future_s=max_future,
        max_past_s=max_past,
        stall_after_s=stall_after,
        calibrate_every_s=calibrate_every,
        calibrate_window_s=calibrate_window,
        calibrate_holdout_s=calibrate_holdout,
        detect_every_s=detect_every,
        fast_every_s=fast_every,
        rules=rules,
        hooks=hooks,
        console_url=console_url,
        api=api,
        api_host=api_host,
        api_port=api_port,
        api_allowed_hosts=tuple((api_allowed_hosts or "").split(",")),
        api_token=token,
        whatif_bundles=whatif_bundles,
        whatif_scenarios=whatif_scenarios,
        whatif_reports=whatif_reports,
        seed_calibration=seed_calibration,
        shard=shard,
        store_memory_mb=store_memory_mb,
        store_threads=store_threads,
        background_nice=background_nice,
    )
    try:
        service = Service(config).start()
    except ServiceError as e:
        raise fail(str(e)) from None
    signal.signal(signal.SIGHUP, service.on_sighup)
    _announce(service, token, seed_calibration)
    # SIGTERM (systemd, docker stop, a script's background job) and SIGINT stop alike.
    stopping = threading.Event()
    on_stop_signals(stopping, hup=False)
    err.print(f"serving: {cfg.describe()} -> {db} (Ctrl-C or SIGTERM stops)", highlight=False)
    while not stopping.wait(0.5):
        pass
    err.print("stopping: flushing what has arrived", highlight=False)
    for problem in service.stop():
        err.print(f"[yellow]{escape(problem)}[/]", highlight=False)
    typer.echo(json.dumps(service.ingester.counters.as_dict()))


def _announce(service: Any, token: str | None, seed_calibration: Path | None) -> None:
    """Say where the API is, for a shard what it subscribes to, and a seeded calibration."""
    if service.shard is not None:
        v = service.shard
        err.print(
            f"shard {v.name}: {len(v.racks)} racks, {len(v.sources)} sources of its own,"
            f" {len(v.reads)} read from other shards, {len(v.topic_filters)} topic filters",
            highlight=False,
        )
    store = service.store.settings()
    err.print(
        f"store: DuckDB memory limit {store.get('memory_limit', '?')},"
        f" {store.get('threads', '?')} threads; calibration and detection at nice"
        f" +{service.config.background_nice}",
        highlight=False,
    )
    if service.url is not None:
        writes = "token required" if token else NO_WRITES
        err.print(
            f"api: {service.url} (OpenAPI at {service.url}/docs, Prometheus at"
            f" {service.url}/metrics; writes: {writes})",
            highlight=False,
        )
    if service.seeded is not None:
        err.print(
            f"calibration: run {service.seeded.run_id} seeded from {seed_calibration}"
            f" ({service.seeded.params} parameters) until the first fit on live data",
            highlight=False,
        )


def _check_shard(site: Any, shard: str) -> None:
    """Exit 2 with one line when ``--shard`` names no shard of the site file (or has no site)."""
    from twin.site.shards import shard_names

    if site is None:
        raise fail("--shard needs --site (the shards are named in the site file)")
    if shard not in shard_names(site):
        raise fail(
            f"--shard: no shard {shard!r} in site {site.name!r}; its shards:"
            f" {', '.join(shard_names(site))}"
        )


def _check_alert_files(rules: Path, hooks: Path | None) -> None:
    """Exit with the error of a bad rule or hook file (file, rule, field), no traceback."""
    from twin.alerts import RuleFileError, load_rules
    from twin.alerts.hooks import load_hooks

    try:
        load_rules(rules)
        if hooks is not None:
            load_hooks(hooks)
    except RuleFileError as e:
        raise fail(str(e)) from None
