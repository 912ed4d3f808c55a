"""Load forecasts per fleet and per rack from the store, and their backtest.

The series come from :mod:`twin.forecast.series` (sums of node input power); the models are
:mod:`models.forecast` (training: a robust recent level with checkpoint dips; inference: daily
and weekly Fourier profiles; conformal p05/p50/p90/p95). A rack takes the role most of its nodes
have; a rack in no fleet is forecast as a level.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from models import forecast as fc
from twin.forecast.series import grid_window, load_power_series
from twin.site import Site
from twin.store import Store

__all__ = [
    "BacktestEntity",
    "BacktestReport",
    "EntityForecast",
    "SiteForecast",
    "forecast_site",
    "run_backtest",
]

EntityKind = Literal["fleet", "rack"]
Role = Literal["training", "inference", "none"]


def _floats(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else round(float(v), 1) for v in a]


class EntityForecast(BaseModel):
    """Forecast power of one fleet or rack on the times ``t`` (UTC)."""

    entity: EntityKind
    id: str
    role: Role = Field(description="fleet role; a rack takes its nodes' majority role")
    model: Literal["training", "inference"]
    nodes: list[str]
    history_points: int = Field(description="grid steps with data in the history window")
    last_w: float | None = Field(description="the last value in the history [W]")
    checkpoint_period_s: float | None = Field(description="periodic dips detected (training)")
    t: list[datetime]
    p05_w: list[float | None]
    p50_w: list[float | None]
    p90_w: list[float | None]
    p95_w: list[float | None]


class SiteForecast(BaseModel):
    site: str
    now: datetime
    history_start: datetime
    step_s: float
    history_s: float
    horizon_s: float
    calibration_origins: int = Field(description="origins whose residuals set the quantiles")
    nodes_without_data: list[str]
    entities: list[EntityForecast]


def _now(now: datetime | None) -> datetime:
    return (now or datetime.now(UTC)).astimezone(UTC)


def forecast_site(
    store: Store,
    site: Site,
    now: datetime | None = None,
    history_s: float = 14 * 86400.0,
    horizon_s: float = 6 * 3600.0,
    step_s: float = 300.0,
) -> SiteForecast:
    """p05/p50/p90/p95 power [W] of every fleet and rack over the next ``horizon_s``.

    The history is the ``history_s`` before ``now`` (floored to the ``step_s`` grid); the
    forecast steps start at that floored ``now``. A series with no data in the window gets
    all-``None`` forecasts.
    """
    start, end = grid_window(_now(now), history_s, step_s)
    ps = load_power_series(store, site, start, end, step_s)
    h_n = max(1, int(np.ceil(horizon_s / step_s)))
    kinds = [e.model_kind for e in ps.entities]
    f = fc.forecast(ps.power_w, ps.start_s, step_s, h_n, kinds)
    times = [end + timedelta(seconds=i * step_s) for i in range(h_n)]
    last = fc.last_valid(ps.power_w)
    ents = []
    for j, e in enumerate(ps.entities):
        ents.append(
            EntityForecast(
                entity=e.entity,  # type: ignore[arg-type]
                id=e.id,
                role=e.role,  # type: ignore[arg-type]
                model=e.model_kind,  # type: ignore[arg-type]
                nodes=list(e.nodes),
                history_points=int(np.isfinite(ps.power_w[:, j]).sum()),
                last_w=None if not np.isfinite(last[j]) else round(float(last[j]), 1),
                checkpoint_period_s=f.dip_period_s[j],
                t=times,
                p05_w=_floats(f.p05[:, j]),
                p50_w=_floats(f.p50[:, j]),
                p90_w=_floats(f.p90[:, j]),
                p95_w=_floats(f.p95[:, j]),
            )
        )
    return SiteForecast(
        site=site.name,
        now=end,
        history_start=start,
        step_s=step_s,
        history_s=history_s,
        horizon_s=h_n * step_s,
        calibration_origins=f.n_calib,
        nodes_without_data=ps.nodes_without_data,
        entities=ents,
    )


class BacktestEntity(BaseModel):
    entity: EntityKind
    id: str
    role: Role
    model: Literal["training", "inference"]
    baseline: str = Field(description="seasonal naive used for this series")
    mae_p50_w: float | None
    mae_baseline_w: float | None
    improvement: float | None = Field(description="1 - MAE(p50) / MAE(baseline)")
    coverage_p05_p95: float | None = Field(description="share of actuals in [p05, p95]")
    share_below_p90: float | None
    n: int


class BacktestReport(BaseModel):
    site: str
    window_start: datetime
    window_end: datetime
    step_s: float
    horizon_s: float
    origins: list[datetime]
    mae_p50_w: float | None
    mae_baseline_w: float | None
    improvement: float | None
    coverage_p05_p95: float | None
    share_below_p90: float | None
    entities: list[BacktestEntity]


def _opt(v: float) -> float | None:
    return None if not np.isfinite(v) else float(v)


def run_backtest(
    store: Store,
    site: Site,
    now: datetime | None = None,
    history_s: float = 28 * 86400.0,
    horizon_s: float = 24 * 3600.0,
    step_s: float = 300.0,
    n_origins: int = 84,
    origin_spacing_s: float = 2 * 3600.0,
) -> BacktestReport:
    """Rolling-origin backtest over the ``history_s`` before ``now``.

    Origins sit every ``origin_spacing_s`` back from ``now - horizon_s`` (84 x 2 h by default,
    so every hour of the day and every day of the week is scored). With few origins the
    persistence baseline of a training series wins or loses by whether an origin happens to
    fall in a job gap. Each forecast uses only the data before its origin and is scored on the
    next ``horizon_s`` against :func:`models.forecast.seasonal_naive` (inference: the value one
    day earlier; training: the last value). Origins that would leave less than two days of
    history are dropped.
    """
    start, end = grid_window(_now(now), history_s, step_s)
    ps = load_power_series(store, site, start, end, step_s)
    t_n = ps.power_w.shape[0]
    h_n = max(1, int(np.ceil(horizon_s / step_s)))
    spacing = max(1, round(origin_spacing_s / step_s))
    min_hist = round(2 * 86400.0 / step_s)
    origins = [t_n - h_n - k * spacing for k in range(n_origins)]
    origins = sorted(o for o in origins if o >= min_hist)
    kinds = [e.model_kind for e in ps.entities]
    r = fc.backtest(ps.power_w, ps.start_s, step_s, h_n, kinds, origins)
    ents = [
        BacktestEntity(
            entity=e.entity,  # type: ignore[arg-type]
            id=e.id,
            role=e.role,  # type: ignore[arg-type]
            model=e.model_kind,  # type: ignore[arg-type]
            baseline="value one day earlier"
            if e.model_kind == "inference"
            else "last value (persistence)",
            mae_p50_w=_opt(r.mae_p50[j]),
            mae_baseline_w=_opt(r.mae_baseline[j]),
            improvement=_opt(r.improvement[j]),
            coverage_p05_p95=_opt(r.coverage_90[j]),
            share_below_p90=_opt(r.below_p90[j]),
            n=int(r.n[j]),
        )
        for j, e in enumerate(ps.entities)
    ]
    return BacktestReport(
        site=site.name,
        window_start=start,
        window_end=end,
        step_s=step_s,
        horizon_s=h_n * step_s,
        origins=[start + timedelta(seconds=o * step_s) for o in r.origins],
        mae_p50_w=_opt(r.overall_mae_p50),
        mae_baseline_w=_opt(r.overall_mae_baseline),
        improvement=_opt(r.overall_improvement),
        coverage_p05_p95=_opt(r.overall_coverage_90),
        share_below_p90=_opt(r.overall_below_p90),
        entities=ents,
    )


#: History a rack needs before its forecast replaces persistence in the headroom: one day, so
#: the inference model has seen its daily cycle once. [s]
MIN_RATIO_HISTORY_S = 86400.0


def rack_ratio_paths(
    store: Store,
    site: Site,
    now: datetime,
    horizon_s: float,
    step_s: float,
    *,
    forecast_step_s: float = 300.0,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Each rack's p50 and p90 load over its present load, on ``now + k * step_s``.

    Shapes ``(round(horizon_s / step_s) + 1, n_racks)`` in site rack order; the first row is
    ``now``. A rack with less than :data:`MIN_RATIO_HISTORY_S` of history keeps ratio 1 (p50
    and p90: persistence) and the basis says how many racks were forecast. Raises ValueError
    when no rack has enough history, so the caller can fall back on its own persistence.
    """
    oldest = store.con.execute(
        "SELECT min(ts) FROM node WHERE ts >= ?", [now - timedelta(days=14)]
    ).fetchall()[0][0]
    if oldest is None or (now - oldest).total_seconds() < MIN_RATIO_HISTORY_S:
        raise ValueError(
            f"less than {MIN_RATIO_HISTORY_S / 3600:g} h of node power history for a forecast"
        )
    fc = forecast_site(
        store,
        site,
        now=now,
        horizon_s=horizon_s + forecast_step_s,
        step_s=forecast_step_s,
    )
    racks = site.racks
    by_id = {e.id: e for e in fc.entities if e.entity == "rack"}
    n = round(horizon_s / step_s) + 1
    t_target = np.arange(n) * step_s
    r50 = np.ones((n, len(racks)))
    r90 = np.ones((n, len(racks)))
    forecast = 0
    for j, rack in enumerate(racks):
        e = by_id.get(rack.name)
        if e is None or not e.last_w or e.history_points * fc.step_s < MIN_RATIO_HISTORY_S:
            continue
        t_rel = np.array([(t - now).total_seconds() for t in e.t])
        p50 = np.array([np.nan if v is None else v for v in e.p50_w]) / e.last_w
        p90 = np.array([np.nan if v is None else v for v in e.p90_w]) / e.last_w
        ok = np.isfinite(p50) & np.isfinite(p90)
        if ok.sum() < 2:
            continue
        r50[:, j] = np.interp(t_target, t_rel[ok], p50[ok])
        r90[:, j] = np.maximum(np.interp(t_target, t_rel[ok], p90[ok]), r50[:, j])
        forecast += 1
    if forecast == 0:
        raise ValueError(
            f"no rack has {MIN_RATIO_HISTORY_S / 3600:g} h of power history for a forecast"
        )
    return r50, r90, f"forecast ({forecast} of {len(racks)} racks; persistence for the rest)"
