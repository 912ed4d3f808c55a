"""Load forecasts per fleet and per rack from the store, and their backtest.

The series come from :mod:`twin.forecast.series` (sums of node input power); the models are
:mod:`models.forecast` (training: a robust recent level with checkpoint dips; inference: daily
and weekly Fourier profiles; conformal p05/p50/p90/p95). A rack takes the role most of its nodes
have; a rack in no fleet is forecast as a level.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from models import forecast as fc
from twin.forecast.series import grid_window, load_power_series
from twin.procs import lower_this_thread
from twin.site import Site
from twin.store import Store
from twin.store.reads import sample_span

__all__ = [
    "BacktestEntity",
    "BacktestReport",
    "EntityForecast",
    "ForecastCache",
    "SiteForecast",
    "forecast_site",
    "run_backtest",
]

log = logging.getLogger(__name__)

EntityKind = Literal["fleet", "rack"]
Role = Literal["training", "inference", "none"]


def _floats(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else round(float(v), 1) for v in a]


class HorizonSkill(BaseModel):
    """The model chosen for one lead bucket and how it scored on the entity's own history."""

    from_s: float = Field(description="leads after this [s]")
    horizon_s: float = Field(description="up to this lead [s]")
    model: str = Field(description="persistence | level | profile | blend")
    skill: float | None = Field(
        description="1 - MAE/MAE_persistence on the scoring origins (0: persistence itself;"
        " null: too few origins with data to score)"
    )
    mae_w: float | None
    mae_persistence_w: float | None
    candidates: dict[str, float | None] = Field(description="every candidate's skill")


class IntervalInfo(BaseModel):
    """Where p05..p95 come from and how often it held."""

    basis: str = Field(
        description="'empirical h-step changes' (persistence's own residuals), 'conformal on"
        " scoring origins' (the chosen model's), or 'none' (too little data: p05 = p95 = p50)"
    )
    samples: int = Field(description="residuals behind the quantiles (the fewest of any lead)")
    nominal_coverage: float = 0.9
    checked_coverage: float | None = Field(
        description="share of actuals inside p05..p95 on rolling origins, each with quantiles"
        " from the data before it (null: too few to check)"
    )
    checked_points: int


class EntityForecast(BaseModel):
    """Forecast power of one fleet or rack on the times ``t`` (UTC)."""

    entity: EntityKind
    id: str
    role: Role = Field(description="fleet role; a rack takes its nodes' majority role")
    kind: Literal["training", "inference"] = Field(description="the series' load kind")
    model: str = Field(description="the published point model, by lead (see `skill`)")
    note: str = Field(description="why this model, in words")
    origins_scored: int = Field(
        description="scoring origins with data before and after them, for this entity"
    )
    skill: list[HorizonSkill]
    interval: IntervalInfo
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
    calibration_origins: int = Field(
        description="the most scoring origins with data any entity had (each entity lists its"
        " own `origins_scored`)"
    )
    nodes_without_data: list[str]
    entities: list[EntityForecast]


def _now(now: datetime | None) -> datetime:
    return (now or datetime.now(UTC)).astimezone(UTC)


def _model_summary(models: list[str], his_s: list[float]) -> str:
    """ "persistence", "level", or "blend to 15 min, profile to 6 h" (by lead bucket)."""
    if len(set(models)) == 1:
        return models[0]
    parts: list[str] = []
    for m, h in zip(models, his_s, strict=True):
        if parts and parts[-1].startswith(m + " "):
            parts[-1] = f"{m} to {_dur(h)}"
        else:
            parts.append(f"{m} to {_dur(h)}")
    return ", ".join(parts)


def _dur(s: float) -> str:
    return f"{s / 3600:g} h" if s >= 3600 else f"{s / 60:g} min"


def _entity_forecast(
    e, j: int, f: fc.SkillForecast, ps, times: list[datetime], last: np.ndarray, step_s: float
) -> EntityForecast:
    nb = len(f.bucket_lo)
    models = [f.model[b][j] for b in range(nb)]
    his_s = [f.bucket_hi[b] * step_s for b in range(nb)]
    skill = [
        HorizonSkill(
            from_s=f.bucket_lo[b] * step_s,
            horizon_s=his_s[b],
            model=models[b],
            skill=_opt(f.skill[b, j]),
            mae_w=_opt(f.mae[b, j]),
            mae_persistence_w=_opt(f.mae_persistence[b, j]),
            candidates={m: _opt(f.skill_candidates[m][b, j]) for m in fc.CANDIDATES},
        )
        for b in range(nb)
    ]
    n_o = int(f.origins_scored[j])
    if n_o < MIN_ORIGINS:
        note = (
            f"persistence: {n_o} scoring origin(s) with data, {MIN_ORIGINS} needed to score a model"
        )
    elif all(m == "persistence" for m in models):
        note = f"persistence: no candidate beat it on {n_o} scoring origins"
    else:
        note = f"chosen on {n_o} scoring origins by skill against persistence"
    cov = f.coverage_90[j]
    return EntityForecast(
        entity=e.entity,  # type: ignore[arg-type]
        id=e.id,
        role=e.role,  # type: ignore[arg-type]
        kind=e.model_kind,  # type: ignore[arg-type]
        model=_model_summary(models, his_s),
        note=note,
        origins_scored=n_o,
        skill=skill,
        interval=IntervalInfo(
            basis=f.interval_basis[j],
            samples=int(f.interval_samples[j]),
            checked_coverage=None if not np.isfinite(cov) else round(float(cov), 3),
            checked_points=int(f.coverage_points[j]),
        ),
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


#: Scoring origins with data an entity needs before a model other than persistence is
#: chosen for it or its interval is checked.
MIN_ORIGINS = 8


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
    forecast steps start at that floored ``now``. Each entity's point model is chosen by its
    skill against persistence on rolling origins of its own history
    (:func:`models.forecast.forecast_skill`); where nothing beats persistence, the forecast is
    persistence and says so. A series with no data in the window gets all-``None`` forecasts.
    """
    start, end = grid_window(_now(now), history_s, step_s)
    ps = load_power_series(store, site, start, end, step_s)
    h_n = max(1, int(np.ceil(horizon_s / step_s)))
    f = fc.forecast_skill(ps.power_w, ps.start_s, step_s, h_n, min_origins=MIN_ORIGINS)
    times = [end + timedelta(seconds=i * step_s) for i in range(h_n)]
    last = fc.last_valid(ps.power_w)
    ents = [_entity_forecast(e, j, f, ps, times, last, step_s) for j, e in enumerate(ps.entities)]
    return SiteForecast(
        site=site.name,
        now=end,
        history_start=start,
        step_s=step_s,
        history_s=history_s,
        horizon_s=h_n * step_s,
        calibration_origins=max((e.origins_scored for e in ents), default=0),
        nodes_without_data=ps.nodes_without_data,
        entities=ents,
    )


class HorizonScore(BaseModel):
    """What the backtest's published forecasts did in one lead bucket."""

    from_s: float
    horizon_s: float
    skill: float | None = Field(description="1 - MAE(p50)/MAE(persistence)")
    coverage_p05_p95: float | None = Field(description="share of actuals in [p05, p95]")
    n: int = Field(description="steps scored")


class BacktestEntity(BaseModel):
    entity: EntityKind
    id: str
    role: Role
    kind: Literal["training", "inference"]
    baseline: str = Field(description="seasonal naive used for this series")
    mae_p50_w: float | None
    mae_baseline_w: float | None
    improvement: float | None = Field(description="1 - MAE(p50) / MAE(baseline)")
    coverage_p05_p95: float | None = Field(description="share of actuals in [p05, p95]")
    share_below_p90: float | None
    n: int
    horizons: list[HorizonScore] = Field(description="skill and coverage per lead bucket")


class BacktestReport(BaseModel):
    site: str
    window_start: datetime
    window_end: datetime
    step_s: float
    horizon_s: float
    origins: list[datetime] = Field(description="the origins scored (each had an actual)")
    origins_listed: int = Field(description="origins tried; those without data are not listed")
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
    """Rolling-origin backtest of the published forecast over the ``history_s`` before ``now``.

    Origins sit every ``origin_spacing_s`` back from ``now - horizon_s`` (84 x 2 h by default,
    so every hour of the day and every day of the week is scored). Each forecast is what
    :func:`forecast_site` would have published then (model chosen and interval calibrated on
    the data before its origin) and is scored on the next ``horizon_s`` against persistence
    (skill, per lead bucket) and :func:`models.forecast.seasonal_naive` (inference: the value
    one day earlier; training: the last value). Origins with less than two days of data
    before them (counted from the first step with data, not the window's start) are not
    tried; origins with no actual after them are not listed.
    """
    start, end = grid_window(_now(now), history_s, step_s)
    ps = load_power_series(store, site, start, end, step_s)
    t_n = ps.power_w.shape[0]
    h_n = max(1, int(np.ceil(horizon_s / step_s)))
    spacing = max(1, round(origin_spacing_s / step_s))
    has = np.isfinite(ps.power_w).any(axis=1)
    first = int(np.argmax(has)) if has.any() else t_n
    min_row = first + round(2 * 86400.0 / step_s)
    origins = [t_n - h_n - k * spacing for k in range(n_origins)]
    origins = sorted(o for o in origins if o >= min_row)
    kinds = [e.model_kind for e in ps.entities]
    r = fc.backtest_skill(
        ps.power_w, ps.start_s, step_s, h_n, kinds, origins, min_origins=MIN_ORIGINS
    )
    nb = len(r.bucket_lo)
    ents = [
        BacktestEntity(
            entity=e.entity,  # type: ignore[arg-type]
            id=e.id,
            role=e.role,  # type: ignore[arg-type]
            kind=e.model_kind,  # type: ignore[arg-type]
            baseline="value one day earlier"
            if e.model_kind == "inference"
            else "last value (persistence)",
            mae_p50_w=_opt(r.mae_p50[j]),
            mae_baseline_w=_opt(r.mae_baseline[j]),
            improvement=_opt(r.improvement[j]),
            coverage_p05_p95=_opt(r.coverage_all[j]),
            share_below_p90=_opt(r.below_p90[j]),
            n=int(r.n[j]),
            horizons=[
                HorizonScore(
                    from_s=r.bucket_lo[b] * step_s,
                    horizon_s=r.bucket_hi[b] * step_s,
                    skill=_opt(r.skill[b, j]),
                    coverage_p05_p95=_opt(r.coverage_90[b, j]),
                    n=int(r.points[b, j]),
                )
                for b in range(nb)
            ],
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
        origins_listed=r.origins_listed,
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


class ForecastCache:
    """The newest site forecast, kept for the passes that ask for the same one.

    :func:`forecast_site` floors ``now`` to its grid, so every pass within one 5-min step asks
    for the same forecast; the live detection pass runs every minute and a forecast with model
    selection costs seconds at tens of racks and minutes at thousands (313 racks over 14
    days: 11 s; 3,125 racks: 195 s, bench/README.md). One cache serves one store.

    ``background=False`` (``dctwin headroom --db``): :meth:`get` makes the forecast of a new step
    at once and keeps it for the rest of the step. ``background=True`` (the detection loop of
    ``dctwin serve``): a new step's forecast is made on a thread of its own, from the data the
    store holds when the step's first pass asks (a sample of the last step that arrives later
    waits for the next step); meanwhile :meth:`get` answers with the newest finished forecast
    when it is at most ``max_age_steps`` steps old, else raises ValueError (the headroom then
    takes persistence and says so), so no pass waits for a forecast."""

    def __init__(self, *, background: bool = False, max_age_steps: int = 2, nice: int = 0) -> None:
        self.background = background
        self.max_age_steps = max_age_steps
        self.nice = nice  # how much lower than the process the forecast thread runs (Linux)
        self._lock = threading.Lock()
        self._key: tuple | None = None  # (site, step end, horizon, step) of _value
        self._value: SiteForecast | None = None
        self._job: threading.Thread | None = None
        self._job_store: Store | None = None  # the job's own connection (a cursor)
        self._closed = False
        self._job_error = ""
        self._failed: tuple | None = None  # the step whose forecast failed: not retried
        self.made = 0  # forecasts finished (the rest of the answers came from here)

    def get(
        self, store: Store, site: Site, now: datetime, horizon_s: float, step_s: float
    ) -> SiteForecast:
        """``forecast_site(store, site, now=now, horizon_s=horizon_s, step_s=step_s)`` of this
        step, or (in the background) of one at most ``max_age_steps`` before it."""
        end = grid_window(_now(now), 0.0, step_s)[1]  # the step end forecast_site starts at
        key = (site.name, end, horizon_s, step_s)
        with self._lock:
            have_key, have = self._key, self._value
        if have_key == key and have is not None:
            return have
        if not self.background:
            made = forecast_site(store, site, now=now, horizon_s=horizon_s, step_s=step_s)
            self._keep(key, made)
            return made
        with self._lock:
            idle = self._job is None or not self._job.is_alive()
            if idle and self._failed != key and not self._closed:
                self._job_store = store.cursor()
                self._job = threading.Thread(
                    target=self._make,
                    args=(self._job_store, site, now, key),
                    name="dctwin-forecast",
                    daemon=True,  # a stopping service does not wait for numpy
                )
                self._job.start()
        if have is not None and have_key is not None and _same_series(have_key, key):
            age_s = (end - have_key[1]).total_seconds()
            if 0 <= age_s <= self.max_age_steps * step_s:
                return have
        with self._lock:
            error = self._job_error if self._failed == key else ""
        if error:
            raise ValueError(f"the load forecast of this step failed ({error})")
        raise ValueError(
            f"the load forecast of the step ending {end:%H:%M} UTC is still being made"
        )

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the background forecast being made (if any) is finished."""
        job = self._job
        if job is not None:
            job.join(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop making forecasts: a query of the forecast being made is interrupted and its
        connection closed (DuckDB refuses to close a connection whose cursor is busy, so the
        caller can close its own after this); the numpy part is left to end with the process
        (the thread is a daemon)."""
        with self._lock:
            self._closed = True
            st = self._job_store
        if st is None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(Exception):
                st.con.interrupt()
            try:
                st.close()
                return
            except Exception:  # busy until the interrupted query has unwound
                if time.monotonic() > deadline:
                    log.warning("load forecast: its query did not stop in %g s", timeout_s)
                    return
                time.sleep(0.02)

    def _keep(self, key: tuple, value: SiteForecast) -> None:
        with self._lock:
            if self._key is None or key[1] >= self._key[1] or not _same_series(key, self._key):
                self._key, self._value = key, value
            self.made += 1

    def _make(self, store: Store, site: Site, now: datetime, key: tuple) -> None:
        lower_this_thread(self.nice)
        try:
            self._keep(key, forecast_site(store, site, now=now, horizon_s=key[2], step_s=key[3]))
            self._job_error = ""
        except Exception as e:  # logged once per distinct error; the next step tries again
            if self._closed:  # interrupted by close(): nothing to report
                return
            self._failed = key
            text = f"{type(e).__name__}: {e}"
            if text != self._job_error:
                log.warning("load forecast failed (headroom on persistence): %s", text)
            self._job_error = text
        finally:
            with contextlib.suppress(Exception):  # the service closed the database meanwhile
                store.close()


def _same_series(a: tuple, b: tuple) -> bool:
    """Two forecast keys of the same site, horizon and step (any step end)."""
    return (a[0], a[2], a[3]) == (b[0], b[2], b[3])


def rack_ratio_paths(
    store: Store,
    site: Site,
    now: datetime,
    horizon_s: float,
    step_s: float,
    *,
    present_w: np.ndarray | None = None,
    forecast_step_s: float = 300.0,
    cache: ForecastCache | None = None,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Each rack's p50 and p90 load over its present load, on ``now + k * step_s``.

    Shapes ``(round(horizon_s / step_s) + 1, n_racks)`` in site rack order; the first row is
    ``now``, where the load is the present one (ratio 1, p50 and p90); each forecast mean over
    ``[t, t + forecast_step_s)`` is reached at its middle, linearly in between. The present
    load is ``present_w`` (racks,), the caller's "now" that it multiplies the ratios with (the
    headroom's last-minute IT load), where known and positive; else the forecast's last
    5-min mean. The ratio must be over the same "now" it is multiplied by: at a checkpoint
    dip the last 5-min mean (4.4 kW) and the last minute (10.2 kW) differ, and a 15.7 kW
    level over the one times the other forecast 36.6 kW, over the rack's feeds.
    A rack with less than :data:`MIN_RATIO_HISTORY_S` of history keeps ratio 1 (p50 and p90:
    persistence) and the basis says how many racks were forecast. Raises ValueError when no
    rack has enough history, so the caller can fall back on its own persistence. ``cache``:
    the caller's :class:`ForecastCache` (the live detection loop's), else a forecast per call.
    """
    oldest, _ = sample_span(store, "node", since=now - timedelta(days=14))
    if oldest is None or (now - oldest).total_seconds() < MIN_RATIO_HISTORY_S:
        raise ValueError(
            f"less than {MIN_RATIO_HISTORY_S / 3600:g} h of node power history for a forecast"
        )
    fc = (cache or ForecastCache()).get(
        store, site, now, horizon_s + 2 * forecast_step_s, forecast_step_s
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
        base = e.last_w
        if present_w is not None and np.isfinite(present_w[j]) and present_w[j] > 0:
            base = float(present_w[j])
        t_mid = np.array([(t - now).total_seconds() for t in e.t]) + fc.step_s / 2
        p50 = np.array([np.nan if v is None else v for v in e.p50_w]) / base
        p90 = np.array([np.nan if v is None else v for v in e.p90_w]) / base
        ok = np.isfinite(p50) & np.isfinite(p90) & (t_mid > 0)
        if ok.sum() < 2:
            continue
        t_k = np.concatenate([[0.0], t_mid[ok]])
        r50[:, j] = np.interp(t_target, t_k, np.concatenate([[1.0], p50[ok]]))
        r90[:, j] = np.maximum(
            np.interp(t_target, t_k, np.concatenate([[1.0], p90[ok]])), r50[:, j]
        )
        forecast += 1
    if forecast == 0:
        raise ValueError(
            f"no rack has {MIN_RATIO_HISTORY_S / 3600:g} h of power history for a forecast"
        )
    return r50, r90, f"forecast ({forecast} of {len(racks)} racks; persistence for the rest)"
