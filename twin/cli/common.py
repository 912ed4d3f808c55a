"""What every `dctwin` command shares: the common options, logging, errors, and opening the
site file and the store (each failure a clear message and exit code 2)."""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from collectors.mqtt import BrokerConfig

err = Console(stderr=True, soft_wrap=True)

REPO = Path(__file__).resolve().parents[2]
DEMO_SITE = REPO / "sample_telemetry" / "demo_site.yaml"
#: The shipped day of the demo site (its calibration seeds the demo's store)
DEMO_BUNDLE = REPO / "sample_telemetry" / "demo_bundle"

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


def setup_logging(verbose: bool) -> None:
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


def resolve_api_token(cli_token: str | None, token_file: Path | None) -> str | None:
    """The API token from --api-token-file, --api-token or DCTWIN_API_TOKEN (in that order of
    preference); at least MIN_TOKEN_LEN characters. Never printed."""
    from twin.redact import register_secret

    if cli_token and token_file is not None:
        raise fail("give --api-token-file or --api-token, not both")
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            raise fail(f"--api-token-file {token_file}: cannot read it ({why})") from None
        if not token:
            raise fail(f"--api-token-file {token_file}: the file is empty")
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
        raise fail(
            f"{source}: the API token has {len(token)} characters, at least {MIN_TOKEN_LEN}"
            " are required (e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')"
        )
    return token


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as an error (as written: brackets such as ``[s]`` or a path's
    ``[2]`` are not Rich markup) and return the exit to raise."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


#: Import names of what the ``service`` and ``console`` extras bring (pyproject.toml). The base
#: install (the collectors and ``dctwin collect``) has none of them, so ``dctwin serve`` there
#: meets a ModuleNotFoundError for one of these, which :func:`missing_extra` turns into a message.
EXTRA_MODULES = frozenset(
    {
        *("numpy", "scipy", "bottleneck", "pandas", "polars", "pyarrow", "duckdb", "amqtt"),
        *("fastapi", "starlette", "uvicorn", "jinja2", "plotly", "streamlit"),
    }
)

#: What each extra brings, by import name (without amqtt, needed only for the embedded broker).
SERVICE_MODULES = (
    *("numpy", "scipy", "bottleneck", "pandas", "polars", "pyarrow", "duckdb", "fastapi"),
    "uvicorn",
)
CONSOLE_MODULES = ("streamlit", "pandas")

#: The extra a top-level command needs beyond the base; every other command but ``collect``
#: and ``--help`` needs ``service``.
COMMAND_EXTRA = {"console": "console", "demo": "all"}


def needs_extra(command: str, extra: str, module: str) -> typer.Exit:
    """The message (and exit 2) for a command run on an install without its extra."""
    return fail(
        f"dctwin {command} needs the {extra} extra: pip install 'dctwin[{extra}]'"
        f" ({module} is not installed)"
    )


def missing_extra(command: str, e: ModuleNotFoundError) -> typer.Exit | None:
    """:func:`needs_extra` for ``e`` when it is a module of an extra, else None (a real bug)."""
    module = (e.name or "").split(".")[0]
    if module not in EXTRA_MODULES:
        return None
    return needs_extra(command, COMMAND_EXTRA.get(command.split()[0], "service"), module)


def require_modules(command: str, extra: str, modules: tuple[str, ...]) -> None:
    """Refuse up front (exit 2) when one of ``modules`` is not installed: for a command whose
    failure would otherwise come from a child process (the broker, the console, the demo)."""
    from importlib.util import find_spec

    for module in modules:
        if find_spec(module) is None:
            raise needs_extra(command, extra, module)


def broker_config(hostport: str | None) -> BrokerConfig:
    try:
        return BrokerConfig.parse(hostport)
    except ValueError as e:
        raise fail(str(e)) from None


def load_site_file(path: Path | None, required: bool = False):
    from twin.site import SiteError, load_site

    if path is None:
        if required:
            raise fail("--site FILE is required")
        return None
    try:
        return load_site(path)
    except SiteError as e:
        raise fail(str(e)) from None


def parse_time(value: str, name: str) -> datetime:
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise fail(
            f"{name} {value!r} is not an ISO 8601 time (e.g. 2026-11-29T14:00:00Z)"
        ) from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def open_store(db: Path, read_only: bool = False):
    from twin.store import Store, StoreError

    try:
        return Store(db, read_only=read_only)
    except StoreError as e:
        raise fail(str(e)) from None


def open_existing_store(db: Path):
    if not db.exists():
        raise fail(f"--db {db}: no such store (run `dctwin serve` or `dctwin ingest` first)")
    return open_store(db, read_only=True)


def free_port(preferred: int) -> int:
    """``preferred`` when it is free on 127.0.0.1, else any free port."""
    import socket

    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise fail("no free TCP port on 127.0.0.1")
