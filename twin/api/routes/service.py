"""The service's own endpoints under /api/v1: the index /api/v1 and /api/v1/status."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from twin.api import models as m
from twin.api.deps import API_VERSION, BUSY, V1, Api

router = APIRouter(prefix=V1, tags=["service"])

#: Default and largest number of unknown ids /api/v1/status lists (it counts them all).
STATUS_UNKNOWN_IDS = 100
STATUS_UNKNOWN_IDS_MAX = 10_000


@router.get("", response_model=m.ApiIndex)
def index(request: Request, api: Api) -> m.ApiIndex:
    """The endpoints this service offers and its optional features."""
    # the OpenAPI document lists included routers' paths too (app.routes may hold them
    # as one included-router entry)
    paths = sorted(request.app.openapi()["paths"])
    return m.ApiIndex(
        version=API_VERSION,
        site=api.ctx.site.name if api.ctx.site else None,
        endpoints=paths,
        features={"whatif": any(p.startswith(f"{V1}/whatif") for p in paths)},
    )


@router.get(
    "/status",
    response_model=m.StatusResponse,
    responses=BUSY,
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
