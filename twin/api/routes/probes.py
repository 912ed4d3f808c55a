"""The service's probes, at the root where Kubernetes and Prometheus look for them: /healthz
and /metrics."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from twin.api import models as m
from twin.api import queries
from twin.api.deps import BAD, Api, bad
from twin.api.metrics import FilteredRegistry, FilterError, MetricFilter, headroom_exposition

#: No prefix: the probes answer at the root.
router = APIRouter(prefix="", tags=["service"])


@router.get(
    "/healthz",
    response_model=m.Health,
    responses={503: {"model": m.Health, "description": "ingest stalled: `reason` says why"}},
)
def healthz(api: Api) -> Response:
    """The service's health: 200 while it works (``status`` ok, or degraded with the
    failing loops or a lost broker in ``reason``), 503 when ingest is stalled (messages
    received but not stored for longer than ``serve --stall-after``). With the broker
    connection, ingest lag and last commit, each background loop's last success and error,
    and the telemetry kinds found missing."""
    queries.ping(api.ctx.db())
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


@router.get("/metrics", response_class=PlainTextResponse, responses={400: BAD[400]})
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
