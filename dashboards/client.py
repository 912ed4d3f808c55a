"""The console's only way to the twin: its HTTP API, over httpx.

Base URL from ``DCTWIN_API_URL`` (default ``http://127.0.0.1:8420``); the bearer token for
writes (acknowledge, silences) from ``DCTWIN_CONSOLE_TOKEN`` only: the console has no login, so
whoever opens it writes with that token, and the service's own ``DCTWIN_API_TOKEN`` (often in
the same shell) is never picked up by accident. Every failure is an
:class:`ApiError` naming the URL and the reason, for the page to show in an error box.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8420"
#: The one variable the console takes a write token from (never DCTWIN_API_TOKEN).
TOKEN_ENV = "DCTWIN_CONSOLE_TOKEN"
#: When set, every call appends ``{"method", "path", "s"}`` as a JSON line to this file (the
#: console benchmark, bench/bench_console.py, times each API call a page makes).
TIMINGS_ENV = "DCTWIN_CONSOLE_API_TIMINGS"


#: One connection pool for every session of the console (httpx's module-level ``request``
#: builds a client, and its TLS context, per call: about 35 ms each on the 2-vCPU VM).
_CLIENT = httpx.Client()


class ApiError(Exception):
    """A call to the API failed: ``url`` and a one-line ``reason``."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class Api:
    """A small client of the dctwin API."""

    def __init__(
        self, base_url: str | None = None, token: str | None = None, timeout_s: float = 15.0
    ):
        self.base_url = (base_url or os.environ.get("DCTWIN_API_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        url = f"{self.base_url}{path}"
        headers = kw.pop("headers", {})
        if method != "GET" and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        t0 = time.perf_counter()
        try:
            r = _CLIENT.request(method, url, headers=headers, timeout=self.timeout_s, **kw)
        except httpx.TimeoutException:
            raise ApiError(url, f"no answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise ApiError(url, f"cannot reach the API ({type(e).__name__}: {e})") from None
        if timings := os.environ.get(TIMINGS_ENV):
            line = {"method": method, "path": path, "s": round(time.perf_counter() - t0, 4)}
            with open(timings, "a") as f:
                f.write(json.dumps(line) + "\n")
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            if isinstance(detail, list):  # FastAPI's validation errors
                detail = "; ".join(
                    f"{'.'.join(str(x) for x in d.get('loc', []))}: {d.get('msg')}" for d in detail
                )
            raise ApiError(str(r.request.url), f"HTTP {r.status_code}: {detail}")
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.content

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self._call("GET", path, params=clean)

    def post(self, path: str, json: Any = None) -> Any:
        return self._call("POST", path, json=json)

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)
