"""`dctwin serve`: the twin service (ingest, background loops, HTTP API) until stopped."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from collectors.mqtt import BrokerError
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
    open_store,
    resolve_api_token,
    setup_logging,
)
from twin.procs import on_stop_signals


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

    setup_logging(verbose)
    # the service's one health record: every loop reports into it; /healthz and /metrics read it
    health = ServiceHealth(stall_after_s=stall_after)
    api_token = resolve_api_token(api_token, api_token_file)
    if calibrate_holdout >= calibrate_window:
        raise fail("--calibrate-holdout must be shorter than --calibrate-window")
    site_obj = load_site_file(site)
    cfg = broker_config(broker)
    store = open_store(db)
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
        raise fail(str(e)) from None
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

        if rules is not None:
            engine, delivery = _alerting(store, site_obj, rules, hooks, health=health)
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
            raise fail(str(e)) from None
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


def _alerting(store, site_obj, rules: Path, hooks: Path | None, health=None):
    """The alert engine on the store, and the delivery workers of its outbox (started; one
    per hook, reporting into ``health`` as ``outbox:<hook>`` when given)."""
    from twin.alerts import AlertEngine, Delivery, Outbox, RuleFileError, Topology, load_rules
    from twin.alerts.hooks import load_hooks

    try:
        rule_set = load_rules(rules)
        hook_list = load_hooks(hooks) if hooks is not None else []
    except RuleFileError as e:
        raise fail(str(e)) from None
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
