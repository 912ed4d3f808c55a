"""`dctwin broker`, `dctwin demo` (broker, simulator, service and console in one command) and
`dctwin console` (the Streamlit console)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from collectors.mqtt import BrokerError
from twin.cli.common import (
    CONSOLE_MODULES,
    DASHBOARDS,
    DEMO_BUNDLE,
    DEMO_RULES,
    DEMO_SITE,
    SERVICE_MODULES,
    SiteOpt,
    err,
    fail,
    free_port,
    load_site_file,
    require_modules,
)
from twin.procs import PARENT_ENV, on_stop_signals, stop_processes


def _require_embedded_broker(command: str, kind: str) -> None:
    """The embedded broker (taken when mosquitto is not on PATH) is amqtt, of the service
    extra: refuse before starting it rather than let its child process fail."""
    from importlib.util import find_spec

    from twin.broker import resolve_kind

    try:
        real = resolve_kind(kind)  # type: ignore[arg-type]
    except RuntimeError as e:
        raise fail(str(e)) from None
    if real == "embedded" and find_spec("amqtt") is None:
        where = "" if kind == "embedded" else " (mosquitto is not on PATH)"
        raise fail(
            f"dctwin {command}: the embedded broker{where} needs the service extra:"
            " pip install 'dctwin[service]' (amqtt is not installed)"
        )


def broker(
    kind: Annotated[str, typer.Option(help="auto | mosquitto | embedded")] = "auto",
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1.")] = 1883,
) -> None:
    """Run a local MQTT broker (mosquitto when on PATH, else the embedded one) until Ctrl-C,
    SIGTERM or a hang-up; the broker process stops with it."""
    from twin.broker import start_broker

    if kind not in ("auto", "mosquitto", "embedded"):
        raise fail(f"--kind {kind!r}: expected auto, mosquitto or embedded")
    _require_embedded_broker("broker", kind)
    stop = threading.Event()
    on_stop_signals(stop)
    try:
        b = start_broker(kind, port=port)  # type: ignore[arg-type]
    except RuntimeError as e:
        raise fail(str(e)) from None
    err.print(f"{b.kind} broker on {b.address} (Ctrl-C or SIGTERM stops)", highlight=False)
    try:
        while not stop.wait(0.5):
            if b.process.poll() is not None:
                raise fail(f"the {b.kind} broker exited with code {b.process.returncode}")
    finally:
        b.stop()


def default_data_dir() -> Path:
    """Where the demo keeps its store, what-if reports and env file: ``$XDG_DATA_HOME/dctwin/
    demo`` (``~/.local/share/dctwin/demo``), never the current directory (a checkout)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dctwin" / "demo"


#: The demo's preferred ports: MQTT's, and the API's and console's documented ones.
DEMO_BROKER_PORT = 1883


def demo(
    site: SiteOpt = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Directory for the store, the what-if reports and demo.env"
            " (default: $XDG_DATA_HOME/dctwin/demo, i.e. ~/.local/share/dctwin/demo)."
        ),
    ] = None,
    db: Annotated[
        Path | None, typer.Option("--db", help="DuckDB store (default: DATA_DIR/demo.duckdb).")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(help="Broker port (default: 1883 when free, else a free one; printed)."),
    ] = None,
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
    hooks: Annotated[
        Path | None,
        typer.Option(
            help="Alert hook file (webhook, Slack, PagerDuty, Alertmanager; see"
            " deploy/alert_hooks.yaml): the demo's pages go to these hooks, each linking"
            " the component's console page. Default: alerts are kept in the store and shown"
            " on the console's Alerts page only."
        ),
    ] = None,
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
    of them, the broker included.

    The broker takes 1883, the API 8420 and the console 8501 when they are free, else other
    free ports; DATA_DIR/demo.env holds the ones in use (DCTWIN_MQTT_HOST, DCTWIN_MQTT_PORT,
    DCTWIN_API_URL, DCTWIN_API_TOKEN) for other shells while it runs, and is removed on stop.

    On the demo site, a store without a calibration starts from the demo bundle's (marked
    seeded: the API and the Calibration page say so, and when the first fit on live data is
    due, about 11 minutes in). A "ready" line follows the first detection pass and the first
    calibration (a seeded one counts, and the line says so); a "calibrated" line the first
    fit on live data."""

    from twin.broker import start_broker

    if console:
        require_modules("demo", "all", SERVICE_MODULES + CONSOLE_MODULES)
    else:
        require_modules("demo --no-console", "service", SERVICE_MODULES)
    data = data_dir or default_data_dir()
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise fail(f"--data-dir {data}: {e.strerror or e}") from None
    db = db or data / "demo.duckdb"
    site_path = site or DEMO_SITE
    seed_bundle = _demo_seed(load_site_file(site_path, required=True))
    if broker_kind not in ("auto", "mosquitto", "embedded"):
        raise fail(f"--broker-kind {broker_kind!r}: expected auto, mosquitto or embedded")
    _require_embedded_broker("demo", broker_kind)
    rules_path = rules or DEMO_RULES
    if not rules_path.exists():
        raise fail(f"--rules {rules_path}: no such file")
    if hooks is not None:
        _check_hooks(hooks)
    stop = threading.Event()
    on_stop_signals(stop)  # SIGTERM, SIGINT (unless ignored) and SIGHUP: stop everything
    try:
        b = start_broker(broker_kind, port=port or free_port(DEMO_BROKER_PORT))  # type: ignore[arg-type]
    except RuntimeError as e:
        raise fail(str(e)) from None
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        _demo_run(
            b,
            procs,
            stop,
            site_path=site_path,
            db=db,
            data_dir=data,
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
            hooks=hooks,
            seed_bundle=seed_bundle,
        )
    finally:
        stop.set()  # the readiness thread too, whatever ended the run
        _demo_stop(procs, b)
        # its ports and token are stale now: another shell must not read them as current
        (data / "demo.env").unlink(missing_ok=True)
        err.print("demo stopped.")


def _demo_run(
    b,
    procs: list[tuple[str, subprocess.Popen[bytes]]],
    stop: threading.Event,
    *,
    site_path: Path,
    db: Path,
    data_dir: Path,
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
    seed_bundle: Path | None,
    hooks: Path | None = None,
) -> None:
    """Start the demo's children into ``procs`` and watch them until ``stop`` or the end."""
    import secrets

    api_port = free_port(api_port)
    api_url = f"http://127.0.0.1:{api_port}"
    if console:  # chosen before the service starts: its pages link the console
        console_port = free_port(console_port)
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
        raise fail(str(e)) from None
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
            *("--whatif-reports", str(data_dir / "whatif")),
            *(("--seed-calibration", str(seed_bundle)) if seed_bundle else ()),
            *(("--hooks", str(hooks)) if hooks else ()),
            *(("--console-url", f"http://127.0.0.1:{console_port}") if console else ()),
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
    env_file = _write_env_file(data_dir, b.address, api_url, token)
    err.print(
        "[bold]dctwin demo[/]\n"
        f"  broker     {b.kind} at mqtt://{b.address}"
        f"{'' if b.address.endswith(':1883') else ' (1883 is taken)'}\n"
        f"  simulator  site {site_path} publishing dctwin/v1/# at {speed:g}x real time\n"
        f"  service    ingesting into {db}, alert rules {rules_path}\n"
        f"  hooks      {hooks or 'none (--hooks FILE sends pages; the console lists them)'}\n"
        f"  calibrate  {_seed_line(seed_bundle)}\n"
        f"  api        {api_url} (OpenAPI at {api_url}/docs, {api_url}/metrics)\n"
        f"{console_line}"
        f"  token      writes (acknowledge, silence) need 'Authorization: Bearer {token}'\n"
        f"  inspect    dctwin status --db {db} (after it stops: the service holds the file)\n"
        f"  env        {env_file} (. it in another shell: DCTWIN_MQTT_PORT, DCTWIN_API_URL, ...)\n"
        "  Ctrl-C (or SIGTERM) stops everything.",
        highlight=False,
    )
    # the readiness lines come from the API, polled on a thread of their own: a slow answer
    # (up to two 5 s timeouts while the service runs its first detection pass) must not keep
    # this loop from seeing a stop signal
    readiness = _Readiness(api_url, time.monotonic())
    threading.Thread(target=readiness.run, args=(stop,), name="readiness", daemon=True).start()
    deadline = time.monotonic() + duration if duration else None
    while not stop.wait(0.5):
        if deadline is not None and time.monotonic() >= deadline:
            return
        for name, p in procs:
            if p.poll() is not None:
                raise fail(f"the {name} exited with code {p.returncode}", 1)


def _check_hooks(path: Path) -> None:
    """Refuse a hook file that the service would refuse, before anything starts (its error
    passes through the secret redaction: it may quote a routing key)."""
    from twin.alerts.hooks import load_hooks
    from twin.alerts.rules import RuleFileError

    if not path.exists():
        raise fail(f"--hooks {path}: no such file")
    try:
        load_hooks(path)
    except (RuleFileError, ValueError, OSError) as e:
        raise fail(f"--hooks {path}: {e}") from None


def _demo_seed(site) -> Path | None:
    """The demo bundle, when it was recorded on ``site`` (its calibration then seeds a store
    without one); None for another site."""
    from twin.calibrate.seed import SeedError, check_bundle_site
    from twin.site import SiteError, load_site

    try:
        check_bundle_site(load_site(DEMO_BUNDLE / "site.yaml"), site, DEMO_BUNDLE)
    except (SeedError, SiteError, OSError):
        return None
    return DEMO_BUNDLE


def _seed_line(seed: Path | None) -> str:
    if seed is None:
        return "first fit once 10 min of GPU telemetry exist (no bundle of this site to seed from)"
    return (
        f"a store without a calibration is seeded from the demo bundle's ({seed}) until the"
        " first fit on live data (after 10 min of GPU telemetry)"
    )


def _write_env_file(data_dir: Path, broker: str, api_url: str, token: str) -> Path:
    """DATA_DIR/demo.env (mode 0600: it holds the write token), for ``. demo.env`` elsewhere:
    ``export`` lines, so that the commands run from that shell (``dctwin headroom``, which
    reads ``DCTWIN_API_URL``) see them."""
    host, _, port = broker.rpartition(":")
    path = data_dir / "demo.env"
    text = (
        f"export DCTWIN_MQTT_HOST={host}\nexport DCTWIN_MQTT_PORT={port}\n"
        f"export DCTWIN_API_URL={api_url}\nexport DCTWIN_API_TOKEN={token}\n"
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path


class _Readiness:
    """Prints "ready" once the service's first detection pass and first calibration have
    run (a seeded calibration counts, and the line says so; before it, a "detecting" line),
    then "calibrated" after the first fit on live data, polling the API every 2 s."""

    def __init__(self, api_url: str, started: float) -> None:
        self.api_url = api_url
        self.started = started
        self.next_at = 0.0
        self.detected = False
        self.ready = False
        self.calibrated = False

    def run(self, stop: threading.Event) -> None:
        """Poll until the first fit on live data is seen or ``stop`` is set."""
        while not self.calibrated and not stop.wait(0.5):
            self.poll()

    def poll(self) -> None:
        now = time.monotonic()
        if self.calibrated or now < self.next_at:
            return
        self.next_at = now + 2.0
        import httpx

        try:
            with httpx.Client(base_url=self.api_url, timeout=5.0) as c:
                st = c.get("/api/v1/status", params={"limit": 0}).json()
                runs = (st.get("service") or {}).get("detection", {}).get("runs", 0)
                cal = c.get("/api/v1/calibration").json()
        except (httpx.HTTPError, ValueError):
            return  # the service is still starting
        took = f"+{now - self.started:.0f} s"
        run, note = cal.get("run"), cal.get("note", "")
        if not runs:
            return
        live = "first detection pass done; headroom and alerts are live"
        if run is None:
            if not self.detected:
                self.detected = True
                err.print(f"[bold]detecting[/] ({took}): {live}; {escape(note)}.", highlight=False)
            return
        if not self.ready:
            self.ready = True
            if run.get("source") == "seed":
                err.print(
                    f"[bold green]ready[/] ({took}): {live}; calibration {note}.",
                    highlight=False,
                )
            else:
                self.calibrated = True
                err.print(
                    f"[bold green]ready[/] ({took}): {live}; calibration {note}"
                    f" (run {run['run_id']}).",
                    highlight=False,
                )
                return
        if cal.get("fits"):
            self.calibrated = True
            err.print(
                f"[bold green]calibrated[/] ({took}): first fit on live data stored (run"
                f" {run['run_id']}), replacing the seeded calibration.",
                highlight=False,
            )


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


#: How the console's Streamlit starts (this launcher, tests/test_browser.py and
#: bench/bench_console.py): headless, no usage statistics, a minimal toolbar (no Deploy button:
#: this is an operations console), and no file watcher nor rerun on save (an installed
#: console's files do not change; the watcher is a thread over the package's tree).
CONSOLE_STREAMLIT_OPTIONS = (
    *("--server.headless", "true"),
    *("--browser.gatherUsageStats", "false"),
    *("--client.toolbarMode", "minimal"),
    *("--server.fileWatcherType", "none"),
    *("--server.runOnSave", "false"),
)


def _exit_before_streamlit(signum: int, _frame: object) -> None:
    """SIGTERM before Streamlit's own handler is set: flush what was printed and exit 0."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


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

    require_modules("console", "console", CONSOLE_MODULES)
    url = api or os.environ.get("DCTWIN_API_URL") or "http://127.0.0.1:8420"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(f"--api {url!r}: expected an http(s) URL, e.g. http://127.0.0.1:8420")
    if not 1 <= port <= 65535:
        raise fail(f"--port {port}: expected 1..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise fail(f"--host {host!r}: {e.strerror or e}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(addr)
        except OSError as e:
            raise fail(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    from streamlit.web import cli as stcli

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
    # Streamlit stops its server on SIGTERM and SIGINT once its own handlers are set, which is
    # after its port opens. A SIGTERM before that ends the process here with 0: the console
    # holds no state of its own, and raising SystemExit inside Streamlit's server start-up
    # (its ASGI lifespan) makes uvicorn report a start-up failure and exit 3 instead.
    signal.signal(signal.SIGTERM, _exit_before_streamlit)
    # Streamlit stops its server on SIGTERM and SIGINT; a hang-up stops it the same way.
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, lambda *_: signal.raise_signal(signal.SIGTERM))
    sys.argv = [
        "streamlit",
        "run",
        str(DASHBOARDS / "app.py"),
        *CONSOLE_STREAMLIT_OPTIONS,
        *("--server.address", host),
        *("--server.port", str(port)),
        *("--logger.level", "info" if verbose else "warning"),
    ]
    try:
        stcli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise typer.Exit(code) from None
