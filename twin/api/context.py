"""What the API serves from: the service's store, site, ingester, schedulers and alert engine.

The API runs inside `dctwin serve` (DuckDB allows one process per file), in a thread of its
own; FastAPI runs each request in a worker thread, and every worker thread reads through its
own cursor of the service's one connection (:meth:`ApiContext.db`).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from twin.store import Store

if TYPE_CHECKING:
    from fastapi import APIRouter

    from twin.alerts import AlertEngine
    from twin.analysis.detect import DetectionScheduler
    from twin.api.whatif import WhatifSettings
    from twin.calibrate.schedule import CalibrationScheduler
    from twin.health import ServiceHealth
    from twin.ingest import Ingester
    from twin.site import Site

#: Expensive requests (forecasts, long series, status, hot spots and fleets computed on demand)
#: served at once; more are answered 429 with Retry-After instead of queueing.
DEFAULT_MAX_BUSY = 4
#: Forecast answers kept (least recently used evicted first).
DEFAULT_FORECAST_CACHE_ENTRIES = 64


@dataclass
class ApiContext:
    """Everything the endpoints read. Only ``store`` is required.

    ``health``: the service's :class:`twin.health.ServiceHealth`; ``/healthz`` and ``/metrics``
    report from it, and the API reports into it as loop ``api``. ``allowed_hosts``: Host header
    values accepted besides the listening address, ``localhost``, ``127.0.0.1`` and ``[::1]``
    (``*``: any). ``max_busy``: expensive requests served at once (the rest get 429).

    ``whatif``: where what-if jobs read bundles and scenarios and write reports (None: the
    service runs none); each app built on this context then has its own jobs
    (:class:`twin.api.whatif.WhatifJobs` in ``app.state.whatif``) and the ``/api/v1/whatif``
    routes, which the console's What-if page looks for in the OpenAPI document.
    ``routers``: extra FastAPI routers mounted under the app as they are (an extension point).
    """

    store: Store
    site: Site | None = None
    ingester: Ingester | None = None
    detector: DetectionScheduler | None = None
    calibrator: CalibrationScheduler | None = None
    engine: AlertEngine | None = None
    service: Any = None  # MqttIngestService: broker connection state, write errors
    token: str | None = None
    health: ServiceHealth | None = None
    allowed_hosts: list[str] = field(default_factory=list)
    max_busy: int = DEFAULT_MAX_BUSY
    forecast_cache_entries: int = DEFAULT_FORECAST_CACHE_ENTRIES
    whatif: WhatifSettings | None = None
    routers: list[APIRouter] = field(default_factory=list)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    _local: threading.local = field(default_factory=threading.local, repr=False)
    _cursors: list[Store] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _root: Store | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # The API's own connection, made here (in the thread that builds the service), which
        # only hands out the worker threads' cursors: the service's connection stays the
        # ingest thread's.
        self._root = self.store.cursor()

    def new_cursor(self) -> Store:
        """A cursor of the API's own (for a component that hands out cursors itself)."""
        with self._lock:
            assert self._root is not None, "the API context is closed"
            cur = self._root.cursor()
            self._cursors.append(cur)
        return cur

    def db(self) -> Store:
        """This thread's cursor on the service's store (created on first use)."""
        cur = getattr(self._local, "store", None)
        if cur is None:
            cur = self._local.store = self.new_cursor()
        return cur

    def close(self) -> None:
        """Close every cursor the API opened (the store itself stays the service's)."""
        with self._lock:
            cursors, self._cursors = self._cursors, []
            if self._root is not None:
                cursors.append(self._root)
                self._root = None
        for cur in cursors:
            with contextlib.suppress(Exception):  # already closed with its connection
                cur.close()
