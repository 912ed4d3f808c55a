"""Run the API with uvicorn in a thread of the service process (DuckDB: one process per file).

The listening socket is bound in the caller's thread, so a taken port fails at once with a
clear :class:`ApiError` instead of inside the server thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time

import uvicorn

from twin.api.app import create_app
from twin.api.context import ApiContext
from twin.api.guard import allowed_hosts

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8420


class ApiError(RuntimeError):
    """The API could not start (the address is taken or not ours)."""


class ApiServer:
    """The HTTP API over ``ctx`` on ``host:port`` (port 0: any free port), in a thread. It
    answers requests whose Host header names ``host``, localhost or ``ctx.allowed_hosts``
    (:func:`twin.api.guard.allowed_hosts`)."""

    def __init__(self, ctx: ApiContext, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
        self.ctx = ctx
        self.host = host
        self.allowed_hosts = allowed_hosts(host, ctx.allowed_hosts)
        self.app = create_app(ctx, self.allowed_hosts)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise ApiError(f"cannot listen on {host}:{port} for the API: {e.strerror or e}") from e
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        for name in ("uvicorn.access", "uvicorn.error"):  # the service logs what matters
            logging.getLogger(name).setLevel(logging.WARNING)
        self._thread = threading.Thread(target=self._run, name="dctwin-api", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except Exception:
            log.exception("the API server stopped")

    def start(self, timeout_s: float = 10.0) -> ApiServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ApiError(f"the API did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        with contextlib.suppress(OSError):
            self._sock.close()
        self.ctx.close()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
