"""`dctwin site-view`: one HTTP API for a site served by several shards (twin/siteview)."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Annotated

import typer

from twin.cli.common import err, fail, setup_logging
from twin.procs import on_stop_signals


def site_view(
    shards: Annotated[
        str | None,
        typer.Option(
            help="The shards' APIs, comma-separated URL or NAME=URL"
            " (e.g. hall-a=http://10.0.0.5:8420,hall-b=http://10.0.0.6:8420)."
        ),
    ] = None,
    site: Annotated[
        Path | None,
        typer.Option(
            help="A site file whose shards: list gives each shard's name and api_url"
            " (instead of --shards)."
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on (default: localhost only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free port).")] = 8420,
    timeout_s: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds each shard has to answer before it is reported stale."),
    ] = 5.0,
    answer_within: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds to wait for a shard that has answered the same API read before:"
            " past them that answer is shown, the shard marked stale with its age, while the"
            " shard is asked again (0: always wait --timeout-s).",
        ),
    ] = 1.0,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            envvar="DCTWIN_API_ALLOWED_HOSTS",
            help="Comma-separated Host header names answered besides the address, localhost,"
            " 127.0.0.1 and [::1] (e.g. site-view,twin.example.com; * for any).",
        ),
    ] = None,
    verbose: bool = False,
) -> None:
    """Serve the dctwin API for a whole site by asking every shard's API at once.

    The console (dctwin console --api URL) and Prometheus (/metrics, each sample labelled
    shard) use it as they use one service. Totals are summed, lists concatenated, alerts
    merged by dedup key, headroom re-sorted tightest first. A shard that does not answer
    within --timeout-s is reported stale with its age in every answer's `shards` section and
    in /healthz; the others are still served. A shard slower than --answer-within that has
    answered the same read before is shown with that answer, marked stale with its age.
    Writes (acknowledge, silences) are passed to the shards with the caller's token. Runs
    until Ctrl-C or SIGTERM."""
    setup_logging(verbose)
    import uvicorn

    from twin.siteview import create_siteview_app, parse_shards, shards_from_site_file
    from twin.siteview.fanout import ShardsError

    if (shards is None) == (site is None):
        raise fail("give exactly one of --shards URL,... and --site FILE")
    if not 0 <= port <= 65535:
        raise fail(f"--port {port}: expected 0..65535")
    try:
        parsed = parse_shards(shards) if shards is not None else shards_from_site_file(site)  # type: ignore[arg-type]
    except ShardsError as e:
        raise fail(str(e)) from None
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as e:
        raise fail(f"--host {host!r}: {e.strerror or e}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise fail(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    bound = sock.getsockname()[1]
    extra = tuple(h for h in (allowed_hosts or "").split(",") if h.strip())
    app = create_siteview_app(
        parsed,
        timeout_s=timeout_s,
        host=host,
        extra_hosts=extra,
        answer_within_s=answer_within or None,
    )
    shown = f"[{host}]" if ":" in host else host
    names = ", ".join(f"{s.name}={s.url}" for s in parsed)
    err.print(
        f"serving: site view on http://{shown}:{bound} over {len(parsed)} shards ({names})"
        " (Ctrl-C or SIGTERM stops)",
        highlight=False,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5
        )
    )
    # uvicorn in a thread, the signals here: SIGTERM and Ctrl-C stop it and exit 0
    stopping = threading.Event()
    on_stop_signals(stopping, hup=False)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="site-view", daemon=True
    )
    thread.start()
    while not stopping.wait(0.5):
        if not thread.is_alive():
            raise fail("the site view's server stopped")
    server.should_exit = True
    thread.join(10)
    sock.close()
    err.print("stopped", highlight=False)
