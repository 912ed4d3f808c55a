"""An httpx transport with a total deadline per request (connect + send + read).

httpx's timeouts are per phase and per socket operation: a receiver that answers one byte every
3 s never trips a 5 s read timeout and holds the request for as long as it likes. Here every
socket operation (connect, TLS handshake, each write, each read) is given at most the time left
until the request's deadline, and one started after it fails at once, so a request is abandoned
(its connection closed) when its deadline passes, whatever the receiver does::

    transport = DeadlineTransport()
    client = httpx.Client(transport=transport, timeout=5.0)
    with transport.deadline(5.0):
        client.post(url, json=body)    # httpx.TimeoutException after 5 s at the latest

The deadline is per thread (each hook's delivery worker sends from its own thread). Name
resolution (``getaddrinfo``) is not covered: it has no timeout in the socket API. Proxies from
the environment are not used (a transport given to httpx replaces them).
"""

from __future__ import annotations

import ssl
import threading
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager

import httpcore
import httpx

__all__ = ["DeadlineTransport"]


class _Deadline(threading.local):
    at: float | None = None  # time.monotonic() value; None: no deadline


def _left(deadline: _Deadline, timeout: float | None, exc: type[Exception]) -> float | None:
    at = deadline.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise exc("request deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(self._deadline, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(self._deadline, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, left), self._deadline
        )

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, deadline: _Deadline) -> None:
        self._inner = httpcore.SyncBackend()
        self._deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        stream = self._inner.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        stream = self._inner.connect_unix_socket(path, left, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """:class:`httpx.HTTPTransport` whose requests end at :meth:`deadline` (see the module)."""

    def __init__(self, verify: ssl.SSLContext | bool = True) -> None:
        super().__init__(verify=verify)
        self._deadline = _Deadline()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            network_backend=_DeadlineBackend(self._deadline),
        )

    @contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Requests made by this thread inside the block end ``seconds`` from now at the latest."""
        self._deadline.at = time.monotonic() + seconds
        try:
            yield
        finally:
            self._deadline.at = None
