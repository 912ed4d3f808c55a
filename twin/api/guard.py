"""What keeps the API truthful and bounded under any client: the Host check, the busy limit,
the forecast cache, the request body limit, and the API's own line in the service's health.

- :class:`HostCheck` (ASGI middleware): a request whose ``Host`` header names none of the
  allowed hosts gets 400 (DNS rebinding: a page on ``evil.example`` that resolves to 127.0.0.1
  must not read the twin). Allowed: the listening address, ``localhost``, ``127.0.0.1``,
  ``[::1]``, and what ``dctwin serve --api-allowed-hosts`` adds (``*.example.com`` matches
  subdomains, ``*`` anything).
- :class:`BusyLimit`: expensive work (forecasts, long series, status, on-demand hot spots and
  fleets, what-if submissions) takes one of a few slots; without a free slot the answer is 429
  with ``Retry-After`` instead of a queue that grows without bound.
- :class:`LruCache`: answers kept by key for ``ttl_s``, at most ``max_entries`` of them (least
  recently used evicted first); one computation per key at a time (single flight), no lock
  held while computing.
- :class:`BodyLimit` (ASGI middleware): request bodies over ``max_bytes`` get 413.
- :class:`FiniteJson` (ASGI middleware): a JSON request body holding ``NaN``, ``Infinity``,
  ``-Infinity`` or a number past a double (``1e999``) gets 422 naming the field, on every
  route, as a query string with one does (Python's JSON reader takes them as floats, and a
  422 quoting such an input could not be written: a 500). :func:`finite_errors` makes any
  validation error's detail writable.
- :class:`HealthReport` (ASGI middleware): every answered request is a success of loop
  ``api``; an unhandled exception or a 500 is an error of it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import math
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import HTTPException

if TYPE_CHECKING:
    from twin.health import ServiceHealth

log = logging.getLogger(__name__)

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]

#: Hosts every API accepts, whatever address it listens on.
LOCAL_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "[::]", "")
#: Largest request body accepted [bytes] (a 20,000-id POST is well under 1 MiB).
MAX_BODY_BYTES = 4 * 1024 * 1024


def host_name(value: str) -> str:
    """The host part of a ``Host`` header or an address, lower case, IPv6 in brackets:
    ``Example.COM:80`` -> ``example.com``, ``[::1]:8420`` -> ``[::1]``, ``::1`` -> ``[::1]``."""
    v = value.strip().lower().rstrip(".")
    if v.startswith("["):
        end = v.find("]")
        return v[: end + 1] if end > 0 else v
    if v.count(":") > 1:  # a bare IPv6 address
        return f"[{v}]"
    return v.split(":", 1)[0].rstrip(".")


def allowed_hosts(listen_host: str, extra: Iterable[str] = ()) -> list[str]:
    """The Host values an API listening on ``listen_host`` accepts (see the module docstring).
    Listening on every address (0.0.0.0, ::) adds this machine's host name and FQDN; clients
    that use another name or an address need it in ``extra``."""
    hosts = list(LOCAL_HOSTS)
    if listen_host in WILDCARD_ADDRESSES:
        for name in (socket.gethostname(), socket.getfqdn()):
            if name:
                hosts.append(host_name(name))
    else:
        hosts.append(host_name(listen_host))
    for h in extra:
        h = h.strip()
        if h:
            hosts.append(h if h.startswith("*") else host_name(h))
    return list(dict.fromkeys(hosts))


async def _send_json(send: Callable[..., Any], status: int, detail: Any, **headers: str) -> None:
    body = orjson.dumps({"detail": detail})
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class HostCheck:
    """400 for a request whose Host header is not one of ``allowed`` (see the module
    docstring)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = list(allowed)
        self.any = "*" in self.allowed
        self.exact = {h for h in self.allowed if "*" not in h}
        self.patterns = [h.lower() for h in self.allowed if "*" in h and h != "*"]

    def ok(self, host: str) -> bool:
        if self.any:
            return True
        name = host_name(host)
        if not name:
            return False
        return name in self.exact or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self.any:
            await self.app(scope, receive, send)
            return
        host = ""
        for k, v in scope.get("headers", ()):
            if k == b"host":
                host = v.decode("latin-1")
                break
        if self.ok(host):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        shown = host[:100] if host else "(none)"
        await _send_json(
            send,
            400,
            f"Host header {shown!r} is not one this API answers to (allowed:"
            f" {', '.join(self.allowed)}); add it with `dctwin serve --api-allowed-hosts`",
        )


class BodyLimit:
    """413 for a request body over ``max_bytes`` (by Content-Length, or as it streams in)."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = f"request body over {self.max_bytes} bytes: send less (at most 20000 ids)"
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = 0
                if n > self.max_bytes:
                    await _send_json(send, 413, too_big)
                    return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, too_big)
            return msg

        await self.app(scope, limited, send)


class _NonFinite(str):
    """A non-finite number of a request body, as written (``NaN``, ``1e999``)."""


def non_finite_path(body: bytes) -> tuple[list[str | int], str] | None:
    """(location, the number as written) of the first non-finite number of a JSON ``body``;
    None when it has none or is not JSON (the route then says what is wrong with it)."""
    seen: list[str] = []

    def constant(text: str) -> _NonFinite:
        seen.append(text)
        return _NonFinite(text)

    def number(text: str) -> float | _NonFinite:
        value = float(text)
        return value if math.isfinite(value) else constant(text)

    try:
        doc = json.loads(body, parse_constant=constant, parse_float=number)
    except (ValueError, RecursionError):
        return None
    if not seen:
        return None
    stack: list[tuple[list[str | int], Any]] = [([], doc)]
    while stack:  # iterative: any nesting the reader took
        loc, value = stack.pop()
        if type(value) is _NonFinite:
            return loc, str(value)
        if isinstance(value, dict):
            stack.extend(([*loc, k], v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend(([*loc, i], v) for i, v in reversed(list(enumerate(value))))
    return None


def finite_errors(errors: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validation errors with each non-finite ``input`` (or context value) as its text, so
    that the 422 can be written as JSON."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        if v is None or isinstance(v, str | int | float | bool):
            return v
        return str(v)

    return [clean(dict(e)) for e in errors]


class FiniteJson:
    """422 for a JSON request body with a non-finite number (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            try:
                msg = await receive()
            except HTTPException as e:  # the body limit's 413
                await _send_json(send, e.status_code, e.detail)
                return
            if msg["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([msg]), send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        found = non_finite_path(body) if body else None
        if found is not None:
            loc, text = found
            where = ".".join(map(str, loc)) or "body"
            await _send_json(
                send,
                422,
                [
                    {
                        "type": "finite_number",
                        "loc": ["body", *loc],
                        "msg": f"{where}: {text} is not a finite number",
                        "input": text,
                    }
                ],
            )
            return
        await self.app(scope, _replay([{"type": "http.request", "body": body}], receive), send)


def _replay(msgs: list[dict[str, Any]], then: Any = None) -> Any:
    """An ASGI ``receive`` that gives ``msgs``, then defers to ``then``."""
    pending = list(msgs)

    async def receive() -> Any:
        if pending:
            return pending.pop(0)
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive


class HealthReport:
    """Reports each request into ``health`` as loop ``api`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, health: ServiceHealth) -> None:
        self.app = app
        self.health = health
        health.register("api")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def watch(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                status.append(msg["status"])
            await send(msg)

        what = f"{scope.get('method', '')} {scope.get('path', '')}"
        try:
            await self.app(scope, receive, watch)
        except Exception as e:
            self.health.error("api", f"{what}: {type(e).__name__}: {e}")
            if status:  # the answer had started: the server can only cut the connection
                raise
            # Answer the 500 here, with the traceback in the service log, so that the server
            # sees a finished request and keeps the client's connection (re-raised, uvicorn
            # closes it, and a client that sent its next request meanwhile is reset).
            log.error("%s failed", what, exc_info=True)
            body = orjson.dumps({"detail": "internal error (the service log has the traceback)"})
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if status and status[0] == 500:
            self.health.error("api", f"{what}: answered 500")
        else:
            self.health.ok("api")


class BusyLimit:
    """At most ``slots`` expensive requests at once; the next gets 429 with Retry-After."""

    def __init__(self, slots: int, retry_after_s: int = 2) -> None:
        self.slots = max(1, int(slots))
        self.retry_after_s = retry_after_s
        self._sem = threading.BoundedSemaphore(self.slots)
        self._lock = threading.Lock()
        self.in_use = 0
        self.rejected_total = 0

    def try_acquire(self) -> bool:
        if not self._sem.acquire(blocking=False):
            with self._lock:
                self.rejected_total += 1
            return False
        with self._lock:
            self.in_use += 1
        return True

    def release(self) -> None:
        with self._lock:
            self.in_use -= 1
        self._sem.release()

    @contextlib.contextmanager
    def slot(self, what: str) -> Iterator[None]:
        """Hold a slot for ``what`` or raise the 429."""
        if not self.try_acquire():
            raise HTTPException(
                429,
                f"busy: {self.slots} expensive requests are being served already; {what} was"
                f" not started. Retry in {self.retry_after_s} s",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        try:
            yield
        finally:
            self.release()


class _Flight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class LruCache:
    """Values by key for ``ttl_s``, at most ``max_entries``; see the module docstring."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self.max_entries = max(1, int(max_entries))
        self.ttl_s = ttl_s
        self._data: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self._flights: dict[Any, _Flight] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def get_or_compute(self, key: Any, compute: Callable[[], Any]) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                self._data.move_to_end(key)
                return hit[1]
            flight = self._flights.get(key)
            owner = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        if not owner:
            flight.done.wait()
            if isinstance(flight.error, HTTPException):
                e = flight.error
                raise HTTPException(e.status_code, e.detail, headers=e.headers)
            if flight.error is not None:
                raise RuntimeError(f"the computation this request waited on failed: {flight.error}")
            return flight.value
        try:
            value = compute()
        except BaseException as e:
            flight.error = e
            raise
        else:
            flight.value = value
            with self._lock:
                self._data[key] = (time.monotonic(), value)
                self._data.move_to_end(key)
                while len(self._data) > self.max_entries:
                    self._data.popitem(last=False)
            return value
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.done.set()
