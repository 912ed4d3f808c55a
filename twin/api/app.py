"""The HTTP API of `dctwin serve` (FastAPI): state, series, headroom, alerts, /metrics.

Reads go through the service's store (a cursor per worker thread); writes (acknowledging an
alert, adding or ending a silence) need the bearer token the service was started with
(``--api-token`` or ``DCTWIN_API_TOKEN``); without one configured, writes are refused (403).
Bad kinds, quantities, ids and time ranges are answered with a 4xx whose ``detail`` says what
was wrong, never with a 500.

The endpoints are FastAPI routers, one module per group under :mod:`twin.api.routes`, each
taking the app's :class:`twin.api.deps.ApiState` (the service's context) by dependency; this
module only builds the app: middleware, the shared state, the routers. With
:class:`twin.api.context.ApiContext` ``whatif`` set, the app keeps its own what-if jobs
(:class:`twin.api.whatif.WhatifJobs`, ``app.state.whatif``) and mounts their router under
``/api/v1/whatif``; extension point: the context's ``routers`` are mounted last, as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from twin.api import queries
from twin.api.context import ApiContext
from twin.api.deps import API_VERSION, ARROW_STREAM, FORECAST_CACHE_S, MAX_IDS, ApiState
from twin.api.guard import (
    BodyLimit,
    BusyLimit,
    FiniteJson,
    HealthReport,
    HostCheck,
    LruCache,
    allowed_hosts,
    finite_errors,
)
from twin.api.metrics import HealthCollector, StoreCollector
from twin.api.routes import ROUTERS
from twin.api.whatif import WhatifJobs
from twin.api.whatif import router as whatif_router

__all__ = ["API_VERSION", "ARROW_STREAM", "MAX_IDS", "Factory", "create_app"]


def create_app(ctx: ApiContext, hosts: list[str] | None = None) -> FastAPI:
    """The FastAPI application over ``ctx`` (see the module docstring). ``hosts``: the Host
    header values it answers (default: :func:`twin.api.guard.allowed_hosts` of 127.0.0.1 and
    ``ctx.allowed_hosts``)."""
    app = FastAPI(
        title="dctwin API",
        version=API_VERSION,
        description=(
            "The live digital twin of an AI datacenter: current state, series, headroom,"
            " forecasts, hot spots, fleets, calibration and alerts. Units are in the field"
            " names (`power_kw`, `temp_c`) or in a `unit` field; times are UTC. Writes"
            " (POST, DELETE) need `Authorization: Bearer <token>`."
        ),
    )
    # outermost first: the Host check, the body limit, the health report, finite JSON bodies
    app.add_middleware(FiniteJson)
    if ctx.health is not None:
        app.add_middleware(HealthReport, health=ctx.health)
    app.add_middleware(BodyLimit)
    app.add_middleware(
        HostCheck,
        allowed=hosts if hosts is not None else allowed_hosts("127.0.0.1", ctx.allowed_hosts),
    )
    state = ApiState(
        ctx,
        busy=BusyLimit(ctx.max_busy),
        forecast_cache=LruCache(ctx.forecast_cache_entries, FORECAST_CACHE_S),
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.state.api = state
    app.state.busy = state.busy
    app.state.forecast_cache = state.forecast_cache
    setup = ctx.db()
    queries.ensure_tables(setup)
    state.registry.register(StoreCollector(ctx, state.active_alerts))
    state.registry.register(HealthCollector(ctx, state.busy, state.forecast_cache))
    routers = list(ROUTERS)
    if ctx.whatif is not None:
        app.state.whatif = WhatifJobs(ctx.whatif)
        routers.append(whatif_router)
    for router in [*routers, *ctx.routers]:
        app.include_router(router)
    return app


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422, with inputs it could not write as JSON (NaN, infinities) as text."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(status_code=422, content={"detail": finite_errors(exc.errors())})


Factory = Callable[[ApiContext], FastAPI]
