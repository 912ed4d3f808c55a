"""What every API router shares: the app's state (the service's context and the per-app
helpers) handed to each endpoint by dependency, the write guard, request parsing and the
common error answers.

An endpoint takes ``api: Api`` and reads ``api.ctx`` (the :class:`~twin.api.context.ApiContext`
of the service), ``api.busy`` (the busy limit), ``api.forecast_cache``, ``api.site_index()``,
``api.silences()`` and ``api.active_alerts()``. :func:`create_app` builds one
:class:`ApiState` per app and keeps it in ``app.state.api``.
"""

from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from prometheus_client import CollectorRegistry

from twin.alerts import AlertDb, Silences
from twin.api import models as m
from twin.api import queries
from twin.api.context import ApiContext
from twin.api.guard import BusyLimit, LruCache
from twin.site.index import SiteLookups

API_VERSION = "v1"
#: The prefix of the versioned endpoints (every router but the probes: /healthz, /metrics).
V1 = f"/api/{API_VERSION}"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: "Latest" values are the newest within this window before the kind's newest sample. [s]
LATEST_WINDOW_S = 120.0
FORECAST_CACHE_S = 60.0
#: Most device ids one request may name (``ids=`` of a GET, or ``ids`` of a POST body; a GET's
#: URL holds about 500 of them before the server refuses it, so name more with POST).
MAX_IDS = 20_000

BAD = {400: {"model": m.ErrorBody}, 404: {"model": m.ErrorBody}}
BUSY = {429: {"model": m.ErrorBody, "description": "busy: retry after Retry-After s"}}
WRITE = {
    401: {"model": m.ErrorBody, "description": "missing or wrong bearer token"},
    403: {"model": m.ErrorBody, "description": "writes are off: no token configured"},
}


@dataclass
class ApiState:
    """One app's view of the service: its context and what the endpoints share."""

    ctx: ApiContext
    busy: BusyLimit
    forecast_cache: LruCache
    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=False)
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _index: SiteLookups | None = field(default=None, repr=False)
    _silences: Silences | None = field(default=None, repr=False)

    def site_index(self) -> SiteLookups:
        """The site's lookups (built on first use); 404 without a site."""
        site = site_or_404(self.ctx)
        with self._lock:
            if self._index is None:
                self._index = SiteLookups.build(site)
            return self._index

    def silences(self) -> Silences:
        """The alert engine's silences, or (alerting off) the store's, on a cursor of ours."""
        if self.ctx.engine is not None:
            return self.ctx.engine.silences
        with self._lock:
            if self._silences is None:
                self._silences = Silences(AlertDb(self.ctx.new_cursor()))
            return self._silences

    def active_alerts(self) -> list[dict[str, Any]]:
        if self.ctx.engine is None:
            return []
        for _ in range(5):  # the detection thread may change the groups while we read
            try:
                return list(self.ctx.engine.active())
            except RuntimeError:
                time.sleep(0.01)
        return []

    def broker_connected(self) -> bool | None:
        if self.ctx.health is not None:
            return self.ctx.health.broker.connected
        return None


def get_api(request: Request) -> ApiState:
    """The dependency every endpoint takes: the state of the app serving the request."""
    return request.app.state.api


Api = Annotated[ApiState, Depends(get_api)]


def require_token(request: Request, api: Api) -> str:
    """The dependency that guards writes: the service's bearer token, compared in constant
    time; 403 when the service has none, 401 when it is missing or wrong."""
    token = api.ctx.token
    if not token:
        raise bad(
            "writes are disabled: this service has no API token. Start `dctwin serve`"
            " with --api-token TOKEN (or set DCTWIN_API_TOKEN) and send"
            " 'Authorization: Bearer TOKEN'",
            403,
        )
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise HTTPException(
            401,
            "this write needs 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise HTTPException(401, "wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
    return "token"


#: ``dependencies=`` of a write endpoint.
WRITER = [Depends(require_token)]


def bad(detail: str, code: int = 400) -> HTTPException:
    return HTTPException(status_code=code, detail=detail)


def parse_time(value: str | None, name: str) -> datetime | None:
    """ISO 8601 (``Z`` or an offset; naive means UTC) or Unix seconds; 400 otherwise."""
    if value is None or value == "":
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise bad(
            f"{name}={value!r} is not a time: give ISO 8601 (2026-11-29T14:00:00Z) or Unix seconds"
        ) from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def parse_ids(value: str | list[str] | None) -> list[str] | None:
    """The ids a request names (comma-separated in a GET, a list in a POST body), at most
    :data:`MAX_IDS` of them; 400 for an empty list, 413 beyond the limit."""
    if value is None:
        return None
    raw = value.split(",") if isinstance(value, str) else value
    ids = [i.strip() for i in raw if i.strip()]
    if not ids:
        raise bad("ids= is empty: give comma-separated device ids, or leave it out for all")
    if len(ids) > MAX_IDS:
        raise bad(
            f"ids names {len(ids)} devices; at most {MAX_IDS} per request: split the request"
            " (a GET's URL holds about 500 ids; POST the same query with an 'ids' list for more)",
            413,
        )
    return list(dict.fromkeys(ids))


def site_or_404(ctx: ApiContext) -> Any:
    if ctx.site is None:
        raise bad("the service runs without a site model: start it with --site FILE", 404)
    return ctx.site


def as_utc(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    ts = datetime.fromisoformat(str(value))
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def acks_of_open(db: Any, active: list[dict[str, Any]]) -> dict[str, m.Ack]:
    """The acknowledgements of the open incidents ``active`` (of this incident, not an
    earlier one with the same key)."""
    starts = {a["dedup_key"]: as_utc(a["starts_at"]) for a in active}
    out: dict[str, m.Ack] = {}
    for key, inc_start, at, by, comment in queries.acks(db):
        if key in starts and (inc_start is None or inc_start == starts[key]):
            out[key] = m.Ack(acked_at=at, acked_by=by, comment=comment)
    return out
