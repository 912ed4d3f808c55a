"""``dctwin collect ...``: run a collector on real hardware and publish over MQTT.

Every subcommand polls one source every ``--interval`` seconds and publishes its contract
messages at QoS 1 through :class:`collectors.runner.Runner`: while the broker is away they wait
in an on-disk spool (``--spool DIR``, bounded by ``--spool-max-mb``) and go out in order when it
returns. ``--once`` polls once, publishes and exits; ``--once --stdout`` prints the messages of
one poll, one JSON line each (``{"topic": ..., "payload": {...}}``), and publishes nothing: the
way to check a device by hand.

Secrets never go on the command line: broker credentials come from ``DCTWIN_MQTT_*``, a Redfish
password and an SNMP community from the environment variable named by ``--password-env`` /
``--community-env``.

Exit codes: 0 done; 2 a clear error (no NVIDIA driver, endpoint unreachable in ``--once``, bad
URL or option, broker unreachable in ``--once`` without ``--stdout``: what was polled then stays
in the spool for the next run). In continuous mode a device or broker that goes away is logged
and retried, not fatal.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
import typer

from collectors.mqtt import BrokerConfig
from collectors.snmp_profiles import profile_names
from twin.cli.common import err, fail
from twin.procs import on_stop_signals

#: The SNMP profiles shipped (file names only, so --help works even if one file is broken).
_SNMP_PROFILES = profile_names()

collect_app = typer.Typer(
    name="collect",
    help="Read real devices (NVML, dcgm-exporter, Redfish, SNMP) and publish over MQTT.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
#: Where spools go when --spool is not given: $DCTWIN_SPOOL_DIR, else the user's state dir.
DEFAULT_SPOOL_ROOT = Path(
    os.environ.get("DCTWIN_SPOOL_DIR")
    or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    / "dctwin"
    / "spool"
)

SiteOpt = Annotated[
    str | None,
    typer.Option(
        "--site",
        envvar="DCTWIN_SITE",
        help="Site name in the topic (env DCTWIN_SITE); must match the site file's name.",
    ),
]
BrokerOpt = Annotated[
    str | None,
    typer.Option(
        "--broker", help="MQTT broker HOST:PORT (default: DCTWIN_MQTT_HOST/PORT or 127.0.0.1:1883)."
    ),
]
IntervalOpt = Annotated[float, typer.Option("--interval", help="Seconds between polls.")]
SpoolOpt = Annotated[
    Path | None,
    typer.Option(
        "--spool",
        help="Spool directory for messages the broker has not acknowledged "
        "(default: $DCTWIN_SPOOL_DIR/<collector>, else ~/.local/state/dctwin/spool/<collector>).",
    ),
]
SpoolMaxOpt = Annotated[
    float,
    typer.Option(
        "--spool-max-mb", help="Bound on unsent messages [MiB]; when full, new ones are dropped."
    ),
]
OnceOpt = Annotated[bool, typer.Option("--once", help="Poll once, publish, exit.")]
StdoutOpt = Annotated[
    bool,
    typer.Option("--stdout", help="Print contract messages as JSON lines instead of publishing."),
]
ClientIdOpt = Annotated[
    str | None, typer.Option("--client-id", help="MQTT client id (default: unique per process).")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Debug logging.")]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "collector"


def _site_name(site: str | None, stdout: bool) -> str:
    if site:
        return site
    if stdout:
        return "local"
    raise fail("give --site NAME (or set DCTWIN_SITE): the site name the twin expects")


def _run(
    make: Callable[[str], Any],
    *,
    spool_name: str,
    site: str | None,
    broker: str | None,
    interval: float,
    spool: Path | None,
    spool_max_mb: float,
    once: bool,
    stdout: bool,
    client_id: str | None,
    verbose: bool,
) -> None:
    """Build the collector with ``make(site)`` and run it (shared by every subcommand)."""
    from collectors.base import CollectorError

    _setup_logging(verbose)
    if interval <= 0:
        raise fail("--interval must be positive")
    if spool_max_mb <= 0:
        raise fail("--spool-max-mb must be positive")
    site_name = _site_name(site, stdout)
    try:
        collector = make(site_name)
    except CollectorError as e:
        raise fail(str(e)) from None
    except ValueError as e:
        raise fail(str(e)) from None
    try:
        if stdout:
            _print_polls(collector, interval, once)
        else:
            _publish(
                collector,
                spool_name=spool_name,
                broker=broker,
                interval=interval,
                spool=spool,
                spool_max_mb=spool_max_mb,
                once=once,
                client_id=client_id,
            )
    finally:
        collector.close()


def _print_polls(collector: Any, interval: float, once: bool) -> None:
    from collectors.base import CollectorError

    stop = threading.Event()
    if not once:
        on_stop_signals(stop)
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            messages = collector.poll()
        except CollectorError as e:
            if once:
                raise fail(str(e)) from None
            err.print(f"poll failed: {e}", highlight=False)
            messages = []
        try:
            for topic, payload in messages:
                sys.stdout.buffer.write(
                    orjson.dumps({"topic": topic, "payload": orjson.Fragment(payload)}) + b"\n"
                )
            sys.stdout.flush()
        except BrokenPipeError:
            return  # the reader is gone (e.g. `| head`)
        if once:
            return
        stop.wait(max(0.0, interval - (time.monotonic() - t0)))


def _publish(
    collector: Any,
    *,
    spool_name: str,
    broker: str | None,
    interval: float,
    spool: Path | None,
    spool_max_mb: float,
    once: bool,
    client_id: str | None,
) -> None:
    from collectors.base import CollectorError
    from collectors.runner import Runner, RunnerConfig
    from collectors.spool import SpoolError

    try:
        cfg = BrokerConfig.parse(broker)
    except ValueError as e:
        raise fail(str(e)) from None
    spool_dir = spool or DEFAULT_SPOOL_ROOT / _slug(spool_name)
    rcfg = RunnerConfig(
        interval_s=interval,
        spool_dir=spool_dir,
        spool_max_bytes=int(spool_max_mb * 1024 * 1024),
        client_id=client_id,
    )
    try:
        runner = Runner(collector, cfg, rcfg)
    except SpoolError as e:
        raise fail(str(e)) from None
    if once:
        try:
            messages = collector.poll()
        except CollectorError as e:
            runner.spool.close()
            raise fail(str(e)) from None
        runner.start(poll=False)
        runner.submit(messages)
        deadline = time.monotonic() + rcfg.connect_timeout_s + 5
        while runner.spool.pending and time.monotonic() < deadline:
            s = runner.stats
            if s.connect_failures and not s.connected:
                break  # one try is enough for --once: the spool keeps the poll
            time.sleep(0.02)
        stats = runner.stop(drain_s=0)
        typer.echo(json.dumps(stats.as_dict()))
        if stats.pending:
            raise fail(
                f"MQTT broker at {cfg.describe()} did not take the messages: {stats.pending} "
                f"message(s) kept in the spool {spool_dir} for the next run"
            )
        return
    stop = threading.Event()
    on_stop_signals(stop)  # SIGTERM, SIGINT (unless ignored), SIGHUP
    err.print(
        f"collecting: {collector.name} every {interval:g} s -> {cfg.describe()} "
        f"(spool {spool_dir}; Ctrl-C or SIGTERM stops)",
        highlight=False,
    )
    runner.start()
    while not stop.wait(0.5):
        pass
    # stop polling, give the broker drain_on_stop_s for what is spooled; the rest stays on disk
    stats = runner.stop()
    typer.echo(json.dumps(stats.as_dict()))


@collect_app.command("nvml")
def nvml(
    node: Annotated[
        str | None,
        typer.Option(help="Node name: message source and GPU id prefix (default: hostname)."),
    ] = None,
    gpu_id: Annotated[
        str, typer.Option("--gpu-id", help="Sample id: 'index' (<node>:<index>) or 'uuid'.")
    ] = "index",
    site: SiteOpt = None,
    broker: BrokerOpt = None,
    interval: IntervalOpt = 1.0,
    spool: SpoolOpt = None,
    spool_max_mb: SpoolMaxOpt = 256.0,
    once: OnceOpt = False,
    stdout: StdoutOpt = False,
    client_id: ClientIdOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Read this host's GPUs through NVML (the NVIDIA driver)."""
    if gpu_id not in ("index", "uuid"):
        raise fail(f"--gpu-id {gpu_id!r}: expected index or uuid")

    def make(site_name: str) -> Any:
        from collectors.nvml import NvmlCollector

        return NvmlCollector(site=site_name, node=node, gpu_id=gpu_id)  # type: ignore[arg-type]

    _run(
        make,
        spool_name="nvml",
        site=site,
        broker=broker,
        interval=interval,
        spool=spool,
        spool_max_mb=spool_max_mb,
        once=once,
        stdout=stdout,
        client_id=client_id,
        verbose=verbose,
    )


@collect_app.command("dcgm")
def dcgm(
    url: Annotated[
        str, typer.Option(help="dcgm-exporter endpoint, e.g. http://127.0.0.1:9400/metrics.")
    ],
    node: Annotated[
        str | None,
        typer.Option(help="Node name, overriding the exporter's Hostname label."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="HTTP timeout [s].")] = 5.0,
    site: SiteOpt = None,
    broker: BrokerOpt = None,
    interval: IntervalOpt = 1.0,
    spool: SpoolOpt = None,
    spool_max_mb: SpoolMaxOpt = 256.0,
    once: OnceOpt = False,
    stdout: StdoutOpt = False,
    client_id: ClientIdOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Scrape a dcgm-exporter /metrics endpoint."""
    from urllib.parse import urlsplit

    def make(site_name: str) -> Any:
        from collectors.dcgm import DcgmCollector

        return DcgmCollector(url, site=site_name, node=node, timeout_s=timeout)

    _run(
        make,
        spool_name=f"dcgm-{urlsplit(url).netloc or url}",
        site=site,
        broker=broker,
        interval=interval,
        spool=spool,
        spool_max_mb=spool_max_mb,
        once=once,
        stdout=stdout,
        client_id=client_id,
        verbose=verbose,
    )


def _secret(env_name: str | None, what: str, required: bool) -> str | None:
    if env_name is None:
        if required:
            raise fail(f"{what}: name the environment variable that holds it")
        return None
    value = os.environ.get(env_name)
    if not value:
        raise fail(f"{what}: environment variable {env_name} is not set or empty")
    return value


@collect_app.command("redfish")
def redfish(
    url: Annotated[str, typer.Option(help="Redfish service root, e.g. https://pdu-r01-a.")],
    kind: Annotated[
        str | None, typer.Option(help="pdu or cdu (default: what the service offers).")
    ] = None,
    source: Annotated[
        str | None, typer.Option(help="Message source (default: from the device).")
    ] = None,
    user: Annotated[str | None, typer.Option("--user", help="Redfish user name.")] = None,
    password_env: Annotated[
        str | None,
        typer.Option("--password-env", help="Environment variable holding the password."),
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Do not verify the TLS certificate.")
    ] = False,
    ca_file: Annotated[
        Path | None, typer.Option("--ca-file", help="CA bundle to verify the device with.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="HTTP timeout [s].")] = 5.0,
    site: SiteOpt = None,
    broker: BrokerOpt = None,
    interval: IntervalOpt = 5.0,
    spool: SpoolOpt = None,
    spool_max_mb: SpoolMaxOpt = 64.0,
    once: OnceOpt = False,
    stdout: StdoutOpt = False,
    client_id: ClientIdOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Poll a Redfish PDU or CDU (PowerDistribution / CoolingUnit)."""
    from urllib.parse import urlsplit

    if kind not in (None, "pdu", "cdu"):
        raise fail(f"--kind {kind!r}: expected pdu or cdu")
    if insecure and ca_file is not None:
        raise fail("--insecure and --ca-file exclude each other")
    if ca_file is not None and not ca_file.is_file():
        raise fail(f"--ca-file {ca_file}: no such file")
    password = _secret(password_env, "--password-env", required=False)
    if password is not None and user is None:
        raise fail("--password-env needs --user")
    verify: bool | str = False if insecure else (str(ca_file) if ca_file else True)
    k: Literal["pdu", "cdu"] | None = kind  # type: ignore[assignment]

    def make(site_name: str) -> Any:
        try:
            from collectors.redfish import RedfishCollector
        except ImportError as e:
            raise fail(f"the Redfish collector is not available in this build: {e}") from None
        return RedfishCollector(
            url,
            site=site_name,
            source=source,
            kind=k,
            username=user,
            password=password,
            verify=verify,
            timeout_s=timeout,
        )

    _run(
        make,
        spool_name=f"redfish-{urlsplit(url).netloc or url}",
        site=site,
        broker=broker,
        interval=interval,
        spool=spool,
        spool_max_mb=spool_max_mb,
        once=once,
        stdout=stdout,
        client_id=client_id,
        verbose=verbose,
    )


@collect_app.command("snmp")
def snmp(
    host: Annotated[str, typer.Option(help="PDU host name or address.")],
    profile: Annotated[
        str,
        typer.Option(
            help="Vendor profile, one per MIB: "
            + ", ".join(_SNMP_PROFILES)
            + " (collectors/snmp_profiles/<name>.yaml; aliases raritan, apc, servertech, eaton,"
            + " geist, vertiv, cpdu)."
        ),
    ],
    community_env: Annotated[
        str,
        typer.Option("--community-env", help="Environment variable holding the SNMP community."),
    ] = "DCTWIN_SNMP_COMMUNITY",
    port: Annotated[int, typer.Option(help="SNMP UDP port.")] = 161,
    source: Annotated[str | None, typer.Option(help="Message source (default: the host).")] = None,
    timeout: Annotated[float, typer.Option(help="SNMP timeout per request [s].")] = 2.0,
    retries: Annotated[int, typer.Option(help="SNMP retries per request.")] = 1,
    site: SiteOpt = None,
    broker: BrokerOpt = None,
    interval: IntervalOpt = 5.0,
    spool: SpoolOpt = None,
    spool_max_mb: SpoolMaxOpt = 64.0,
    once: OnceOpt = False,
    stdout: StdoutOpt = False,
    client_id: ClientIdOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Poll an SNMP PDU (SNMPv2c) with a vendor profile."""
    from collectors.snmp_profiles import ProfileError, resolve

    try:
        prof = resolve(profile)
    except ProfileError as e:  # a broken profile file: name the file and the field
        raise fail(f"SNMP profiles: {e}") from None
    except ValueError as e:
        raise fail(f"--profile: {e}") from None
    if not 1 <= port <= 65535:
        raise fail(f"--port {port}: expected 1..65535")
    community = _secret(community_env, "--community-env", required=True)
    assert community is not None

    def make(site_name: str) -> Any:
        try:
            from collectors.snmp import SnmpPduCollector
        except ImportError as e:
            raise fail(f"the SNMP collector is not available in this build: {e}") from None
        return SnmpPduCollector(
            host,
            site=site_name,
            profile=prof,
            community=community,
            port=port,
            source=source,
            timeout_s=timeout,
            retries=retries,
        )

    _run(
        make,
        spool_name=f"snmp-{host}-{port}",
        site=site,
        broker=broker,
        interval=interval,
        spool=spool,
        spool_max_mb=spool_max_mb,
        once=once,
        stdout=stdout,
        client_id=client_id,
        verbose=verbose,
    )
