"""The service's own endpoints: /healthz, /metrics, the index /api/v1 and /api/v1/status."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from twin.api import models as m
from twin.api.deps import (
    API_VERSION,
    BAD,
    BUSY,
    Api,
    bad,
)
from twin.api.metrics import FilteredRegistry, FilterError, MetricFilter, headroom_exposition

router = APIRouter()

#: Default and largest number of unknown ids /api/v1/status lists (it counts them all).
STATUS_UNKNOWN_IDS = 100
STATUS_UNKNOWN_IDS_MAX = 10_000


@router.get(
    "/healthz",
    response_model=m.Health,
    responses={503: {"model": m.Health, "description": "ingest stalled: `reason` says why"}},
    tags=["service"],
)
def healthz(api: Api) -> Response:
    """The service's health: 200 while it works (``status`` ok, or degraded with the
    failing loops or a lost broker in ``reason``), 503 when ingest is stalled (messages
    received but not stored for longer than ``serve --stall-after``). With the broker
    connection, ingest lag and last commit, each background loop's last success and error,
    and the telemetry kinds found missing."""
    api.ctx.db().con.execute("SELECT 1").fetchall()
    base = {
        "site": api.ctx.site.name if api.ctx.site else None,
        "started_at": api.ctx.started_at,
        "uptime_s": (datetime.now(UTC) - api.ctx.started_at).total_seconds(),
    }
    if api.ctx.health is None:
        body = m.Health(status="ok", reason=None, broker_connected=None, **base)
        return JSONResponse(body.model_dump(mode="json"))
    snap = api.ctx.health.snapshot()
    broker = snap["broker"]
    failing = sorted(name for name, lp in snap["loops"].items() if lp["failing"])
    status: str = "ok"
    reason = snap["stalled"]
    if reason:
        status = "stalled"
    else:
        why = []
        if broker["connected"] is False:
            why.append(f"broker disconnected ({broker['last_reason'] or 'no reason given'})")
        for name in failing:
            why.append(f"loop {name} failing: {snap['loops'][name]['last_error']}")
        if snap["store_retrying"]:
            why.append(f"store write retrying: {snap['store_retrying']}")
        if why:
            status, reason = "degraded", "; ".join(why)
    body = m.Health(
        status=status,  # type: ignore[arg-type]
        reason=reason,
        broker_connected=broker["connected"],
        broker=m.BrokerHealth(**broker),
        ingest=m.IngestProgress(
            lag_s=snap["ingest_lag_s"],
            last_commit_at=snap["last_commit_at"],
            store_retrying=snap["store_retrying"],
            stall_after_s=api.ctx.health.stall_after_s,
            samples=(
                None
                if api.ctx.ingester is None
                else {k: int(v) for k, v in api.ctx.ingester.counters.as_dict()["samples"].items()}
            ),
        ),
        loops={name: m.LoopHealth(**lp) for name, lp in snap["loops"].items()},
        missing_telemetry=snap["missing_telemetry"],
        **base,
    )
    code = 503 if status == "stalled" else 200
    return JSONResponse(body.model_dump(mode="json"), status_code=code)


@router.get(
    "/metrics", response_class=PlainTextResponse, responses={400: BAD[400]}, tags=["service"]
)
def metrics(
    api: Api,
    name: Annotated[
        list[str] | None,
        Query(
            alias="name[]",
            description="only this family (or sample) name; repeatable, e.g."
            " name[]=dctwin_headroom_celsius",
        ),
    ] = None,
    match: Annotated[
        list[str] | None,
        Query(
            alias="match[]",
            description='only the families a selector names: NAME, {__name__="NAME"} or'
            ' {__name__=~"REGEX"}; repeatable',
        ),
    ] = None,
) -> Response:
    """Prometheus exposition: headroom per component in its unit, ingest counters, dead
    letters, calibration quality, active alerts (see twin/api/metrics.py for every name);
    ``name[]`` and ``match[]`` keep only the families they name (any of them)."""
    try:
        keep = MetricFilter.parse(name or [], match or [])
    except FilterError as e:
        raise bad(str(e)) from None
    registry = api.registry if keep.everything else FilteredRegistry(api.registry, keep)
    body = headroom_exposition(api.ctx, keep).encode() + generate_latest(registry)  # type: ignore[arg-type]
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/api/v1", response_model=m.ApiIndex, tags=["service"])
def index(request: Request, api: Api) -> m.ApiIndex:
    """The endpoints this service offers and its optional features."""
    # the OpenAPI document lists included routers' paths too (app.routes may hold them
    # as one included-router entry)
    paths = sorted(request.app.openapi()["paths"])
    return m.ApiIndex(
        version=API_VERSION,
        site=api.ctx.site.name if api.ctx.site else None,
        endpoints=paths,
        features={"whatif": any(p.startswith("/api/v1/whatif") for p in paths)},
    )


@router.get(
    "/api/v1/status",
    response_model=m.StatusResponse,
    responses=BUSY,
    tags=["service"],
)
def status(
    api: Api,
    limit: Annotated[
        int,
        Query(
            ge=0,
            le=STATUS_UNKNOWN_IDS_MAX,
            description="most unknown ids listed (all are counted in unknown_ids_total)",
        ),
    ] = STATUS_UNKNOWN_IDS,
) -> dict[str, Any]:
    """What the store holds (as `dctwin status --json`, the unknown ids cut to ``limit``
    with their total in ``unknown_ids_total``) and the service's counters and health."""
    with api.busy.slot("the store status"):
        st = api.ctx.db().status()
    unknown = st.get("unknown_ids") or []
    st["unknown_ids_total"] = len(unknown)
    st["unknown_ids"] = unknown[:limit]
    svc: dict[str, Any] = {}
    if api.ctx.ingester is not None:
        svc["ingest"] = api.ctx.ingester.counters.as_dict()
    if api.ctx.service is not None:
        for attr in ("write_errors", "last_error", "disconnects", "receiver_restarts"):
            svc[attr] = getattr(api.ctx.service, attr, None)
    for name, sched in (("calibration", api.ctx.calibrator), ("detection", api.ctx.detector)):
        if sched is not None:
            svc[name] = {"runs": sched.runs, "failures": sched.failures}
    if api.ctx.health is not None:
        svc["health"] = api.ctx.health.snapshot()
    st["service"] = svc
    return st
