"""Computed answers: /api/v1/forecast, /hotspots, /fleets and /calibration."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from twin.api import models as m
from twin.api import queries
from twin.api.deps import (
    BAD,
    BUSY,
    V1,
    Api,
    bad,
    site_or_404,
)

router = APIRouter(prefix=V1, tags=["twin"])


@router.get("/forecast", responses={**BAD, **BUSY})
def forecast(
    api: Api,
    horizon_s: Annotated[float, Query(gt=0, le=7 * 86400)] = 6 * 3600.0,
    step_s: Annotated[float, Query(ge=60, le=86400)] = 300.0,
) -> Response:
    """p05/p50/p90/p95 power [W] per fleet and rack over the horizon (cached 60 s, the
    64 most recently asked horizons and steps; computing one takes a busy slot). The
    schema is `twin.forecast.SiteForecast`."""
    from twin.forecast import forecast_site

    site = site_or_404(api.ctx)
    if horizon_s / step_s > 2000:
        raise bad(f"horizon_s / step_s = {horizon_s / step_s:.0f} steps; at most 2000")

    def compute() -> bytes:
        with api.busy.slot("a forecast"):
            db = api.ctx.db()
            nw = queries.newest(db, "node")
            if nw is None:
                raise bad("no node power samples yet: nothing to forecast from", 409)
            try:
                result = forecast_site(db, site, now=nw, horizon_s=horizon_s, step_s=step_s)
            except ValueError as e:
                raise bad(str(e), 409) from None
            return result.model_dump_json().encode()

    body = api.forecast_cache.get_or_compute((horizon_s, step_s), compute)
    return Response(body, media_type="application/json")


@router.get("/hotspots", responses={**BAD, **BUSY})
def hotspots(
    api: Api,
    k_sigma: Annotated[float | None, Query(gt=0, le=100)] = None,
    minutes: Annotated[int | None, Query(ge=1, le=240)] = None,
) -> Response:
    """GPUs over their limit, above their calibrated model by k sigma, drifting R; racks
    with hot inlet air. The schema is `twin.analysis.hotspots.HotSpotReport`. Without parameters,
    the service's latest detection pass; with them, computed now."""
    from twin.analysis.hotspots import find_hotspots

    site = site_or_404(api.ctx)
    last = api.ctx.detector.last if api.ctx.detector is not None else None
    if last is not None and k_sigma is None and minutes is None:
        return Response(last.hotspots.model_dump_json(), media_type="application/json")
    try:
        with api.busy.slot("a hot spot search"):
            report = find_hotspots(api.ctx.db(), site, k_sigma=k_sigma or 3.0, minutes=minutes or 5)
    except ValueError as e:
        raise bad(str(e), 409) from None
    return Response(report.model_dump_json(), media_type="application/json")


@router.get("/fleets", responses={**BAD, **BUSY})
def fleets(
    api: Api,
    window_s: Annotated[float | None, Query(gt=0, le=30 * 86400)] = None,
    threshold: Annotated[float | None, Query(gt=0, le=1)] = None,
    target_util: Annotated[float | None, Query(gt=0, le=1)] = None,
) -> Response:
    """Fleet utilization and underused inference fleets (GPUs and kW to reclaim). The
    schema is `twin.analysis.fleets.FleetReport`. Without parameters, the latest detection pass."""
    from twin.analysis.fleets import DEFAULT_TARGET_UTIL, DEFAULT_THRESHOLD, underused_fleets

    site = site_or_404(api.ctx)
    last = api.ctx.detector.last if api.ctx.detector is not None else None
    default = window_s is None and threshold is None and target_util is None
    if last is not None and last.fleets is not None and default:
        return Response(last.fleets.model_dump_json(), media_type="application/json")
    db = api.ctx.db()
    nw = queries.newest(db, "gpu")
    if nw is None:
        raise bad("no GPU samples yet: no fleet activity to judge", 409)
    try:
        with api.busy.slot("a fleet report"):
            report = underused_fleets(
                db,
                site,
                now=nw,
                window_s=window_s or 86400.0,
                threshold=threshold or DEFAULT_THRESHOLD,
                target_util=target_util or DEFAULT_TARGET_UTIL,
            )
    except ValueError as e:
        raise bad(str(e), 409) from None
    return Response(report.model_dump_json(), media_type="application/json")


@router.get("/calibration", response_model=m.CalibrationResponse)
def calibration(api: Api) -> dict[str, Any]:
    """The newest calibration: parameter spread and held-out fit quality (MAE, CV(RMSE))
    per device class, unusable parameters with their reasons, drift events; whether it is
    a fit on live data or seeded from a bundle, and when the first fit is expected; which
    model-based alert rules judge, and which wait for the first fit on this site's data."""
    engine = api.ctx.engine
    return queries.calibration_summary(
        api.ctx.db(),
        api.ctx.site,
        api.ctx.calibrator,
        rules=engine.rules if engine is not None else None,
    )
