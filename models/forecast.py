r"""Load forecasts for fleets and racks: a point forecast (p50), conformal quantiles, a
seasonal-naive baseline and a rolling-origin backtest.

Every function takes a regular-grid history ``(T, N)`` of power [W] (any unit works), one column
per series, NaN where a step has no reading; row ``i`` is at ``start_s + i * step_s`` (epoch
seconds, UTC). A forecast covers the next ``horizon_steps`` grid steps after the last row, i.e.
times ``start_s + (T + j) * step_s`` for ``j = 0 .. H-1``. Each series has a kind, ``"training"``
or ``"inference"``.

Models
------
**Inference** (daily and weekly cycle). Weighted least squares on Fourier terms of the hour of
the day (``K = 6`` harmonics by default: a clipped sine or any smooth daily shape is captured to
a few tenths of a percent), with a separate profile for weekend days (Saturday and Sunday UTC)
when the history holds at least ``1.5`` days of each day type, else one profile for all days.
Observations are weighted with a recency half-life (14 days), so a slowly changing load is
followed. Why this and not a seasonal profile (mean of the same hour over past days): the
regression pools every sample into ``2 (2K + 1)`` numbers, so per-sample noise (bursty per-GPU
load) averages out over weeks instead of over the handful of days a profile would average, and
a missing day costs nothing. Two interacting day-type profiles rather than a multiplicative
weekend factor, because power is not proportional to load (idle power, ``a^gamma``).

**Training** (level with checkpoint dips). The level is the median over the recent
``level_window_s`` (6 h): robust to checkpoint dips and job gaps, which are short and take less
than half the time. Periodic dips are searched on the recent ``dip_window_s`` (12 h): a step is a
dip when it lies below ``level - max(6 sigma, 0.2 |level|)`` (sigma from the MAD); for each
candidate period ``P`` (2 steps to ``max_dip_period_s``, at least 8 whole cycles in the window),
the history is folded at ``P`` and the phase with the most dips is scored by its dip fraction;
the shortest period whose best phase dips in at least 75 % of the cycles (while some phase dips
in under 30 % and the overall dip rate is at most half the best phase's) wins, and the forecast
takes the median dip value at the phases that dip in at least half the cycles
(docs/physics.md §6.4). With no such period (dips
aliased away by a coarse step, or restarted at random with each job) the forecast is the level
alone. Job gaps (idle between jobs, warm-up ramps) are not in the point forecast; they are in
the quantiles, through the residuals.

**Recent-residual correction** (both kinds). With ``r`` the residual of the model above on the
history and ``m_t`` the mean residual over the last ``recent_s`` (1 h), the forecast at lead
``h`` adds ``beta(h) m_T`` where ``beta(h) = sum m_t r_{t+h} / sum m_t^2`` is fitted on the
history and clipped to [0, 1]. If the residuals are white (noise), ``beta`` is about 0 and
nothing changes; if they persist (a job level that differs from the recent median, an
inference day busier than usual, an ongoing job gap), the correction carries over with the
persistence the data show.

Quantiles
---------
Split-conformal by horizon bucket: the model is refitted at ``n_calib`` origins inside the
history (each using only the data before it) and forecasts the next ``H`` steps; the
out-of-sample residuals are pooled per series and per lead-time bucket (buckets double in length
so short leads keep their tighter spread), and their empirical 5/50/90/95 % quantiles are added
to the point forecast: no Gaussian assumption, and the bimodal spread of training jobs (busy or
between jobs) comes through as it is. ``p05``-``p95`` is the central 90 % prediction interval;
``p90`` is the level exceeded with 10 % probability, for headroom.

Baseline
--------
:func:`seasonal_naive`: for inference, the value one season (``season_s``, one day by default;
one week is available) before the target step; for training, the last valid value
(persistence): a training job has no daily cycle, and the value one checkpoint period ago is the
last value except at dips.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import bottleneck as bn
import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "KINDS",
    "BacktestResult",
    "Forecast",
    "backtest",
    "forecast",
    "interval_score",
    "last_valid",
    "point_forecast",
    "seasonal_naive",
]

F64 = NDArray[np.float64]
KINDS = ("training", "inference")
DAY_S = 86400.0
WEEK_S = 7 * DAY_S
QUANTILES = (0.05, 0.5, 0.9, 0.95)


@dataclass(frozen=True)
class Forecast:
    """Quantile forecasts, shape ``(H, N)`` each, on the times ``t_s`` (epoch seconds)."""

    t_s: F64
    p05: F64
    p50: F64
    p90: F64
    p95: F64
    point: F64
    dip_period_s: list[float | None] = field(default_factory=list)
    n_calib: int = 0


@dataclass(frozen=True)
class BacktestResult:
    """Rolling-origin backtest: per series (arrays of length N) and overall figures.

    ``improvement = 1 - mae_p50 / mae_baseline``; ``coverage_90`` is the share of actuals
    inside ``[p05, p95]``; ``below_p90`` the share at or under ``p90``.
    """

    mae_p50: F64
    mae_baseline: F64
    improvement: F64
    coverage_90: F64
    below_p90: F64
    n: NDArray[np.int64]
    overall_mae_p50: float
    overall_mae_baseline: float
    overall_improvement: float
    overall_coverage_90: float
    overall_below_p90: float
    origins: list[int]
    horizon_steps: int


# ---- helpers ----------------------------------------------------------------------------------


def _quiet_nan(fn):  # type: ignore[no-untyped-def]
    """Series with no data stay NaN (and are reported so); numpy's warnings about them add
    nothing."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(*args, **kwargs)

    return wrapper


def _as_history(history: ArrayLike) -> F64:
    y = np.asarray(history, dtype=float)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2:
        raise ValueError(f"history must be (T, N), got shape {y.shape}")
    return y


def _check_kinds(kinds: Sequence[str], n: int) -> list[str]:
    ks = list(kinds)
    if len(ks) != n:
        raise ValueError(f"{len(ks)} kinds for {n} series")
    bad = sorted({k for k in ks if k not in KINDS})
    if bad:
        raise ValueError(f"unknown series kind(s) {bad}; expected one of {KINDS}")
    return ks


def _fourier(t_s: F64, period_s: float, k: int) -> F64:
    """Columns ``[1, cos(w t), sin(w t), ..., cos(k w t), sin(k w t)]``, shape ``(T, 2k + 1)``."""
    w = 2 * np.pi * np.mod(t_s, period_s)[:, None] / period_s
    h = np.arange(1, k + 1)[None, :]
    return np.concatenate([np.ones((len(t_s), 1)), np.cos(w * h), np.sin(w * h)], axis=1)


def _weekend(t_s: F64) -> NDArray[np.bool_]:
    """Saturday or Sunday (UTC); 1970-01-01 was a Thursday."""
    dow = (np.floor_divide(t_s, DAY_S).astype(np.int64) + 3) % 7  # Monday = 0
    return dow >= 5


def last_valid(y: F64) -> F64:
    """Last finite value of each column (NaN where none)."""
    ok = np.isfinite(y)
    idx = np.where(ok.any(axis=0), y.shape[0] - 1 - np.argmax(ok[::-1], axis=0), -1)
    out = np.full(y.shape[1], np.nan)
    has = idx >= 0
    out[has] = y[idx[has], np.nonzero(has)[0]]
    return out


# ---- the two models ---------------------------------------------------------------------------


def _design(t_s: F64, harmonics: int, split_weekend: bool) -> F64:
    f = _fourier(t_s, DAY_S, harmonics)
    if not split_weekend:
        return f
    we = _weekend(t_s)[:, None]
    return np.concatenate([f * ~we, f * we], axis=1)


def _inference_fit(
    y: F64, t_s: F64, t_future: F64, harmonics: int, half_life_s: float
) -> tuple[F64, F64]:
    """Fitted values on the history and on ``t_future`` for inference series ``y`` (T, n)."""
    ok = np.isfinite(y)
    we = _weekend(t_s)
    per_day = DAY_S / max(float(t_s[1] - t_s[0]) if len(t_s) > 1 else DAY_S, 1e-9)
    n_we = (ok & we[:, None]).sum(axis=0) / per_day
    n_wd = (ok & ~we[:, None]).sum(axis=0) / per_day
    fit_hist = np.full(y.shape, np.nan)
    fit_fut = np.full((len(t_future), y.shape[1]), np.nan)
    w = np.exp2(-(t_s[-1] - t_s) / half_life_s) if half_life_s > 0 else np.ones(len(t_s))
    for split in (True, False):
        cols = np.nonzero(((n_we >= 1.5) & (n_wd >= 1.5)) == split)[0]
        if not len(cols):
            continue
        x = _design(t_s, harmonics, split)
        xf = _design(t_future, harmonics, split)
        # series with the same validity mask share one solve (the usual case: no gaps)
        groups: dict[bytes, list[int]] = {}
        for c in cols:
            groups.setdefault(ok[:, c].tobytes(), []).append(int(c))
        for members in groups.values():
            group = np.array(members)
            mask = ok[:, group[0]]
            if mask.sum() < x.shape[1] * 2:
                continue
            xm = x[mask]
            wm = w[mask][:, None]
            a = xm.T @ (xm * wm)
            a[np.diag_indices_from(a)] += 1e-9 * np.trace(a) / len(a)
            coef = np.linalg.solve(a, (xm * wm).T @ y[mask][:, group])
            fit_hist[:, group] = x @ coef
            fit_fut[:, group] = xf @ coef
    # too little data for a daily profile: the recent median, as for training
    missing = ~np.isfinite(fit_fut).all(axis=0)
    if missing.any():
        with warnings.catch_warnings():  # a series with no data at all stays NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            lvl = np.nanmedian(y[-max(1, int(per_day // 4)) :, missing], axis=0)
        fit_hist[:, missing] = lvl
        fit_fut[:, missing] = lvl
    return fit_hist, fit_fut


def _training_fit(
    y: F64,
    step_s: float,
    horizon_steps: int,
    level_window_s: float,
    dip_window_s: float,
    max_dip_period_s: float,
) -> tuple[F64, F64, list[float | None]]:
    """Level (+ periodic dips) on the history and the next ``horizon_steps`` for ``y`` (T, n)."""
    t_n, n = y.shape
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lw = max(1, round(level_window_s / step_s))
        level = np.nanmedian(y[-lw:], axis=0)
        empty = ~np.isfinite(level)
        if empty.any():  # nothing recent: the median of the whole history
            level[empty] = np.nanmedian(y[:, empty], axis=0)
        fit_hist = np.broadcast_to(level, y.shape).copy()
        fit_fut = np.broadcast_to(level, (horizon_steps, n)).copy()
        periods: list[float | None] = [None] * n
        dw = min(t_n, max(1, round(dip_window_s / step_s)))
        recent = y[-dw:]
        sigma = 1.4826 * np.nanmedian(np.abs(recent - level), axis=0)
        thr = level - np.maximum(6 * sigma, 0.2 * np.abs(level))
        dip = np.where(np.isfinite(recent), recent < thr, np.nan)
        found = np.zeros(n, bool)
        p_max = min(dw // 3, int(max_dip_period_s // step_s))
        for p in range(2, p_max + 1):
            if found.all():
                break
            k = dw // p
            folded = dip[-k * p :].reshape(k, p, n)
            frac = np.nanmean(folded, axis=0)  # (p, n)
            best = np.nanmax(frac, axis=0)
            worst = np.nanmin(frac, axis=0)
            base = np.nanmean(dip, axis=0)
            new = ~found & (k >= 8) & (best >= 0.75) & (worst < 0.3) & (base <= 0.5 * best)
            for j in np.nonzero(new)[0]:
                found[j] = True
                periods[j] = p * step_s
                phases = np.nonzero(frac[:, j] >= 0.5)[0]
                vals = y[-k * p :, j].reshape(k, p)[:, phases]
                isdip = folded[:, phases, j] == 1
                dip_val = np.nanmedian(np.where(isdip, vals, np.nan), axis=0)
                # phase of a row i (absolute) is (i - (t_n - k p)) mod p
                hist_phase = (np.arange(t_n) - (t_n - k * p)) % p
                fut_phase = (np.arange(t_n, t_n + horizon_steps) - (t_n - k * p)) % p
                for ph, v in zip(phases, dip_val, strict=True):
                    if np.isfinite(v):
                        fit_hist[hist_phase == ph, j] = v
                        fit_fut[fut_phase == ph, j] = v
    return fit_hist, fit_fut, periods


def _residual_correction(
    y: F64, fit_hist: F64, horizon_steps: int, recent_steps: int
) -> tuple[F64, F64]:
    """``beta(h) * m_T`` (H, n): the recent median residual carried forward, and ``beta``."""
    r = y - fit_hist
    t_n, n = r.shape
    win = max(1, min(recent_steps, t_n))
    # the median of the finite residuals of each window of ``win`` rows, row i + win - 1
    # (NaN where none is, without a warning): bottleneck's moving median, along the rows of
    # the transposed copy (contiguous windows, a third faster); equal to
    # models.nanstats.nanmedian over the windows to the bit (tests/test_forecast.py)
    m = bn.move_median(np.ascontiguousarray(r.T), win, min_count=1, axis=1).T[win - 1 :]
    m_now = m[-1]
    # beta(h) = sum_t m_t r_{t+h} / sum_t m_t^2 over pairs where both exist, m placed on the
    # row it belongs to: cross-correlations at leads 1..H
    mm = np.zeros((t_n, n))
    mm[win - 1 :] = np.where(np.isfinite(m), m, 0.0)
    ok_r = np.isfinite(r)
    rz = np.where(ok_r, r, 0.0)
    num = _lagged_products(mm, rz, horizon_steps)
    den = _lagged_products(mm * mm, ok_r.astype(float), horizon_steps)
    beta = np.zeros((horizon_steps, n))
    h_ok = min(horizon_steps, max(0, t_n - win - 10))  # leads with at least ~10 pairs
    with np.errstate(invalid="ignore", divide="ignore"):
        b = np.where(den > 1e-12 * max(float(den.max(initial=0.0)), 1e-300), num / den, 0.0)
    beta[:h_ok] = np.clip(b[:h_ok], 0.0, 1.0)
    corr = beta * np.where(np.isfinite(m_now), m_now, 0.0)
    return corr, beta


#: Leads up to which :func:`_lagged_products` sums directly (H x T x N products); beyond, the
#: FFT (about 20 T log T x N) is cheaper. At the live headroom's 14 leads the direct sums
#: take a fifth of the FFT's time (315 racks over 14 days at 300 s).
DIRECT_LAGS_MAX = 48


def _lagged_products(a: F64, b: F64, leads: int) -> F64:
    """``out[h] = sum_t a[t] * b[t + h + 1]`` over the rows, for ``h < leads``: (leads, N)."""
    t_n = a.shape[0]
    if leads <= DIRECT_LAGS_MAX:
        out = np.zeros((leads, a.shape[1]))
        for h in range(min(leads, t_n - 1)):
            out[h] = np.einsum("tn,tn->n", a[: t_n - h - 1], b[h + 1 :])
        return out
    from scipy.signal import fftconvolve  # imported when a forecast needs it (~0.5 s)

    out = np.zeros((leads, a.shape[1]))
    lagged = fftconvolve(a[::-1], b, axes=0)[t_n : t_n + leads]
    out[: len(lagged)] = lagged  # leads past the history's length stay 0
    return out


@_quiet_nan
def point_forecast(
    history: ArrayLike,
    start_s: float,
    step_s: float,
    horizon_steps: int,
    kinds: Sequence[str],
    *,
    harmonics: int = 6,
    half_life_s: float = 14 * DAY_S,
    level_window_s: float = 6 * 3600.0,
    dip_window_s: float = 12 * 3600.0,
    max_dip_period_s: float = 2 * 3600.0,
    recent_s: float = 3600.0,
) -> tuple[F64, list[float | None]]:
    """Point forecast (the model's median), shape ``(horizon_steps, N)``, and the detected
    checkpoint period [s] per series (None: none detected, or an inference series).

    Parameters
    ----------
    history : array_like
        ``(T, N)`` series on a regular grid, NaN in gaps. [W]
    start_s : float
        Epoch time of row 0. [s]
    step_s : float
        Grid step. [s]
    horizon_steps : int
        Number of future steps.
    kinds : sequence of str
        ``"training"`` or ``"inference"`` per series.
    """
    y = _as_history(history)
    ks = _check_kinds(kinds, y.shape[1])
    t_n, n = y.shape
    t_s = start_s + step_s * np.arange(t_n)
    t_fut = start_s + step_s * np.arange(t_n, t_n + horizon_steps)
    fit_hist = np.full(y.shape, np.nan)
    fut = np.full((horizon_steps, n), np.nan)
    periods: list[float | None] = [None] * n
    inf = np.array([k == "inference" for k in ks])
    if inf.any():
        fh, ff = _inference_fit(y[:, inf], t_s, t_fut, harmonics, half_life_s)
        fit_hist[:, inf], fut[:, inf] = fh, ff
    if (~inf).any():
        fh, ff, pr = _training_fit(
            y[:, ~inf], step_s, horizon_steps, level_window_s, dip_window_s, max_dip_period_s
        )
        fit_hist[:, ~inf], fut[:, ~inf] = fh, ff
        for j, p in zip(np.nonzero(~inf)[0], pr, strict=True):
            periods[j] = p
    corr, _ = _residual_correction(y, fit_hist, horizon_steps, round(recent_s / step_s))
    return fut + corr, periods


def _buckets(horizon_steps: int, n_calib: int, min_count: int) -> list[tuple[int, int]]:
    """Lead-time buckets [lo, hi) that double in length, each with >= ``min_count`` residuals."""
    base = max(1, int(np.ceil(min_count / max(n_calib, 1))))
    out: list[tuple[int, int]] = []
    lo, length = 0, base
    while lo < horizon_steps:
        hi = min(horizon_steps, lo + length)
        if horizon_steps - hi < length:  # a short remainder joins this bucket
            hi = horizon_steps
        out.append((lo, hi))
        lo, length = hi, length * 2
    return out


class _Points:
    """Point forecasts from ``y[:o]`` for origins ``o``, memoized: a backtest's forecasts share
    most of their calibration origins."""

    def __init__(
        self,
        y: F64,
        start_s: float,
        step_s: float,
        h_n: int,
        kinds: list[str],
        model_kw: dict[str, float],
    ) -> None:
        self.y, self.start_s, self.step_s, self.h_n = y, start_s, step_s, h_n
        self.kinds, self.model_kw = kinds, model_kw
        self._cache: dict[int, tuple[F64, list[float | None]]] = {}

    def __call__(self, o: int) -> tuple[F64, list[float | None]]:
        if o not in self._cache:
            self._cache[o] = point_forecast(
                self.y[:o],
                self.start_s,
                self.step_s,
                self.h_n,
                self.kinds,
                **self.model_kw,  # type: ignore[arg-type]
            )
        return self._cache[o]


def _forecast_at(
    points: _Points,
    o: int,
    n_calib: int,
    calib_spacing_s: float,
    min_bucket_count: int,
    min_calib_history_s: float = DAY_S,
) -> Forecast:
    """The forecast from ``y[:o]``, its quantiles from calibration origins before ``o`` (each
    with at least ``min_calib_history_s`` of data before it)."""
    y, step_s, h_n = points.y, points.step_s, points.h_n
    n = y.shape[1]
    point, periods = points(o)
    t_fut = points.start_s + step_s * np.arange(o, o + h_n)
    spacing = max(1, round(calib_spacing_s / step_s))
    min_fit = max(2, int(np.ceil(min_calib_history_s / step_s)))
    origins = [c for c in (o - h_n - k * spacing for k in range(n_calib)) if c >= min_fit]
    res = np.full((len(origins), h_n, n), np.nan)
    for i, c in enumerate(origins):
        res[i] = y[c : c + h_n] - points(c)[0]
    q = {qq: np.zeros((h_n, n)) for qq in QUANTILES}
    if origins:
        for b_lo, b_hi in _buckets(h_n, len(origins), min_bucket_count):
            r = res[:, b_lo:b_hi].reshape(-1, n)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                qs = np.nanquantile(r, QUANTILES, axis=0)  # (4, n)
            for i, qq in enumerate(QUANTILES):
                q[qq][b_lo:b_hi] = np.where(np.isfinite(qs[i]), qs[i], 0.0)
    p50 = point
    p05 = np.minimum(point + q[0.05], p50)
    p90 = np.maximum(point + q[0.9], p50)
    p95 = np.maximum(point + q[0.95], p90)
    return Forecast(t_fut, p05, p50, p90, p95, point, periods, len(origins))


@_quiet_nan
def forecast(
    history: ArrayLike,
    start_s: float,
    step_s: float,
    horizon_steps: int,
    kinds: Sequence[str],
    *,
    n_calib: int = 16,
    calib_spacing_s: float = 6 * 3600.0,
    min_bucket_count: int = 64,
    min_calib_history_s: float = DAY_S,
    **model_kw: float,
) -> Forecast:
    """p05, p50, p90 and p95 forecasts for the next ``horizon_steps`` steps.

    The point forecast is :func:`point_forecast`; the quantiles add the empirical quantiles of
    out-of-sample residuals per series and per lead-time bucket. The residuals come from
    ``n_calib`` calibration origins ``T - H - k * calib_spacing_s`` (k = 0, 1, ...; each with at
    least ``min_calib_history_s`` of data before it: one day by default, what the inference
    model's daily profile needs; a training series' level needs only its ``level_window_s``),
    where the model is refitted on the data before the origin and scored on the ``H`` steps
    after it. With too little history for any calibration origin the quantiles equal the point
    forecast (``n_calib = 0`` in the result). Units follow ``history``.
    """
    y = _as_history(history)
    ks = _check_kinds(kinds, y.shape[1])
    points = _Points(y, start_s, step_s, int(horizon_steps), ks, dict(model_kw))
    return _forecast_at(
        points, y.shape[0], n_calib, calib_spacing_s, min_bucket_count, min_calib_history_s
    )


def seasonal_naive(
    history: ArrayLike,
    start_s: float,
    step_s: float,
    horizon_steps: int,
    kinds: Sequence[str],
    *,
    season_s: float = DAY_S,
) -> F64:
    """The baseline, ``(horizon_steps, N)``: inference series repeat the value one season
    (``season_s``) before each target step (the latest full season for leads beyond one
    season); training series repeat their last valid value (persistence). A series with less
    than one season of history falls back to persistence.
    """
    y = _as_history(history)
    ks = _check_kinds(kinds, y.shape[1])
    t_n, n = y.shape
    last = last_valid(y)
    out = np.broadcast_to(last, (horizon_steps, n)).copy()
    s = round(season_s / step_s)
    if s >= 1 and t_n >= s:
        j = np.arange(horizon_steps)
        k = (j // s) + 1  # smallest k with t_n + j - k s <= t_n - 1
        src = t_n + j - k * s
        inf = np.array([kk == "inference" for kk in ks])
        out[:, inf] = y[src][:, inf]
    return out


@_quiet_nan
def backtest(
    history: ArrayLike,
    start_s: float,
    step_s: float,
    horizon_steps: int,
    kinds: Sequence[str],
    origins: Sequence[int],
    *,
    season_s: float = DAY_S,
    n_calib: int = 16,
    calib_spacing_s: float = 6 * 3600.0,
    min_bucket_count: int = 64,
    min_calib_history_s: float = DAY_S,
    **model_kw: float,
) -> BacktestResult:
    """Rolling-origin backtest: at each origin row ``o`` forecast from ``history[:o]`` exactly as
    :func:`forecast` would (calibration origins before ``o`` included; point forecasts shared
    between origins are computed once) and score the next ``horizon_steps`` rows (NaN actuals
    skipped) against :func:`seasonal_naive`.

    Overall figures pool every scored step of every series: ``overall_mae_*`` is the mean
    absolute error over them (units of ``history``) and the improvement is ``1 - sum |e_p50| /
    sum |e_baseline|``.
    """
    y = _as_history(history)
    ks = _check_kinds(kinds, y.shape[1])
    t_n, n = y.shape
    h_n = int(horizon_steps)
    used = [int(o) for o in origins if 0 < int(o) <= t_n - 1]
    ae = np.zeros(n)
    ae_b = np.zeros(n)
    inside = np.zeros(n)
    below = np.zeros(n)
    cnt = np.zeros(n, np.int64)
    points = _Points(y, start_s, step_s, h_n, ks, dict(model_kw))
    for o in used:
        actual = y[o : o + h_n]
        h = actual.shape[0]
        fc = _forecast_at(
            points, o, n_calib, calib_spacing_s, min_bucket_count, min_calib_history_s
        )
        base = seasonal_naive(y[:o], start_s, step_s, h_n, ks, season_s=season_s)[:h]
        ok = np.isfinite(actual) & np.isfinite(fc.p50[:h]) & np.isfinite(base)
        a = np.where(ok, actual, 0.0)
        ae += np.where(ok, np.abs(a - np.nan_to_num(fc.p50[:h])), 0).sum(axis=0)
        ae_b += np.where(ok, np.abs(a - np.nan_to_num(base)), 0).sum(axis=0)
        inside += (ok & (actual >= fc.p05[:h]) & (actual <= fc.p95[:h])).sum(axis=0)
        below += (ok & (actual <= fc.p90[:h])).sum(axis=0)
        cnt += ok.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(cnt > 0, cnt, np.nan)
        mae, mae_b = ae / c, ae_b / c
        impr = 1.0 - mae / mae_b
        total = cnt.sum()
        return BacktestResult(
            mae_p50=mae,
            mae_baseline=mae_b,
            improvement=impr,
            coverage_90=inside / c,
            below_p90=below / c,
            n=cnt,
            overall_mae_p50=float(ae.sum() / total) if total else float("nan"),
            overall_mae_baseline=float(ae_b.sum() / total) if total else float("nan"),
            overall_improvement=float(1 - ae.sum() / ae_b.sum()) if ae_b.sum() else float("nan"),
            overall_coverage_90=float(inside.sum() / total) if total else float("nan"),
            overall_below_p90=float(below.sum() / total) if total else float("nan"),
            origins=used,
            horizon_steps=h_n,
        )


# ---- forecasts chosen by their own skill --------------------------------------------------------

#: The candidate point forecasts, scored against each other on the series' own history.
CANDIDATES = ("persistence", "level", "profile", "blend")
#: Ends of the lead-time buckets a model is chosen for and its skill reported on. [s]
HORIZON_MARKS_S = (900.0, 3600.0, 6 * 3600.0, DAY_S, WEEK_S)
#: Weight of a past h-step change in persistence's interval per grid step of its age (the
#: newest completed change weighs ``RECENCY_WEIGHT``, the one before it its square, ...):
#: non-exchangeable split conformal, Barber et al. 2023 (Ann. Statist. 51(2)), whose
#: electricity experiment uses 0.99 per step; 1 is plain split conformal. At 300 s steps the
#: weight halves every 5.75 h.
RECENCY_WEIGHT = 0.99
INTERVAL_BASES = ("conformal", "empirical h-step changes", "none")


@dataclass(frozen=True)
class SkillForecast:
    """A forecast whose point model was chosen per series and lead bucket by its skill.

    Arrays ``(H, N)`` on ``t_s``; per bucket ``b`` (leads ``[bucket_lo[b], bucket_hi[b])``
    steps) and series ``n``: ``model[b][n]`` (one of :data:`CANDIDATES`), its ``skill[b, n]``
    (``1 - MAE/MAE_persistence`` on the scoring origins; 0 for persistence, NaN where nothing
    was scored), the MAEs and the number of origins scored. ``skill_candidates[m][b, n]`` is
    every candidate's skill. ``interval_basis[n]`` says where p05..p95 come from and
    ``coverage_90[n]`` is the share of actuals inside p05..p95 on rolling origins (each checked
    with quantiles from the origins before it; NaN: too few to check) over
    ``coverage_points[n]`` actuals.
    """

    t_s: F64
    p05: F64
    p50: F64
    p90: F64
    p95: F64
    bucket_lo: list[int]
    bucket_hi: list[int]
    model: list[list[str]]
    skill: F64
    mae: F64
    mae_persistence: F64
    skill_candidates: dict[str, F64]
    origins_scored: NDArray[np.int64]
    interval_basis: list[str]
    interval_samples: NDArray[np.int64]
    coverage_90: F64
    coverage_points: NDArray[np.int64]
    dip_period_s: list[float | None]


def _horizon_buckets(h_n: int, step_s: float) -> tuple[list[int], list[int]]:
    """Lead buckets ``[lo, hi)`` in steps whose ends are the :data:`HORIZON_MARKS_S` (lead of
    step ``j`` is ``(j + 1) step_s``), the last one ending at ``h_n``."""
    ends = sorted({min(h_n, max(1, round(m / step_s))) for m in HORIZON_MARKS_S} | {h_n})
    ends = [e for e in ends if e <= h_n]
    los = [0, *ends[:-1]]
    return los, ends


def _h_step_changes(y: F64, h_n: int) -> list[F64]:
    """``d[j] = y[k + j + 1] - y[k]`` over the history (rows, N) for each lead ``j``: what
    persistence gets wrong at that lead."""
    t_n = y.shape[0]
    return [y[j + 1 :] - y[: t_n - j - 1] if j + 1 < t_n else y[:0] for j in range(h_n)]


def _conformal_levels(n: int) -> dict[float, float]:
    """Quantile levels with the finite-sample correction of split conformal prediction
    (Vovk et al. 2005; Lei et al. 2018, eq. 2): ``ceil((n + 1) q) / n`` around the median."""
    return {q: float(np.clip(0.5 + (q - 0.5) * (n + 1) / max(n, 1), 0.0, 1.0)) for q in QUANTILES}


def _conformal_quantiles(z: F64, qs: Sequence[float]) -> tuple[F64, NDArray[np.int64]]:
    """Per column of ``z`` (rows, N): the conformal quantiles ``qs`` of its finite values
    (``np.quantile`` at :func:`_conformal_levels` of their count; NaN where there are none),
    and that count. The columns with the same count share one ``np.quantile`` call over their
    sorted values, which gives each column what a call on its own values gives."""
    ok = np.isfinite(z)
    cnt = ok.sum(axis=0)
    out = np.full((len(qs), z.shape[1]), np.nan)
    if not cnt.any():
        return out, cnt
    srt = np.sort(z, axis=0)  # NaN last: a column's first cnt rows are its finite values
    for c in np.unique(cnt[cnt > 0]):
        cols = np.flatnonzero(cnt == c)
        lv = _conformal_levels(int(c))
        out[:, cols] = np.quantile(srt[:c, cols], [lv[q] for q in qs], axis=0)
    return out, cnt


class _Candidates:
    """Candidate point forecasts from ``y[:c]`` at any origin ``c``, memoized."""

    def __init__(
        self, y: F64, start_s: float, step_s: float, h_n: int, model_kw: dict[str, float]
    ) -> None:
        n = y.shape[1]
        self.y, self.step_s, self.h_n = y, step_s, h_n
        self.level = _Points(y, start_s, step_s, h_n, ["training"] * n, model_kw)
        self.profile = _Points(y, start_s, step_s, h_n, ["inference"] * n, model_kw)
        # finite samples before row c: cum[c]
        self.cum = np.vstack([np.zeros((1, n)), np.cumsum(np.isfinite(y), axis=0)])
        self._cache: dict[int, dict[str, F64]] = {}

    def __call__(self, c: int) -> dict[str, F64]:
        if c not in self._cache:
            h_n, n = self.h_n, self.y.shape[1]
            pers = np.broadcast_to(last_valid(self.y[:c]), (h_n, n)).copy()
            level = self.level(c)[0]
            profile = self.profile(c)[0].copy()
            # a daily profile needs a day of data before it means anything
            profile[:, self.cum[c] * self.step_s < DAY_S] = np.nan
            self._cache[c] = {
                "persistence": pers,
                "level": level,
                "profile": profile,
                "blend": 0.5 * (pers + level),
            }
        return self._cache[c]


def _candidate_skill(
    rm: F64, rp: F64, min_origins: int, z_gain: float
) -> tuple[F64, NDArray[np.bool_], NDArray[np.bool_]]:
    """A candidate's |errors| ``rm`` against persistence's ``rp`` (origins, leads, series):
    its skill (NaN where fewer than ``min_origins`` origins score both), whether it was
    scored, and whether its mean per-origin gain over persistence exceeds ``z_gain`` standard
    errors (a Diebold-Mariano-style screen; the origins' windows overlap when they are closer
    than the lead, so it is a screen against noise, not an exact test)."""
    both = np.isfinite(rm) & np.isfinite(rp)
    both_o = both.any(axis=1)
    n_orig = both_o.sum(axis=0)
    s_m = np.where(both, rm, 0).sum(axis=(0, 1))
    s_p = np.where(both, rp, 0).sum(axis=(0, 1))
    ok = (n_orig >= min_origins) & (s_p > 0)
    sk = np.where(ok, 1.0 - s_m / np.where(s_p > 0, s_p, 1.0), np.nan)
    gain = np.where(both, rp - rm, 0).sum(axis=1) / np.maximum(both.sum(axis=1), 1)
    g_mean = np.where(both_o, gain, 0).sum(axis=0) / np.maximum(n_orig, 1)
    g_var = np.where(both_o, (gain - g_mean) ** 2, 0).sum(axis=0) / np.maximum(n_orig - 1, 1)
    sure = g_mean > z_gain * np.sqrt(g_var / np.maximum(n_orig, 1))
    return sk, ok, sure


def _score_origins(
    cands: _Candidates, o: int, n_score: int, spacing: int, min_history_steps: int
) -> tuple[list[int], F64, dict[str, F64]]:
    """The scoring origins before ``o`` (on a grid fixed to row 0, shared by every forecast
    of a backtest; each with its whole horizon before ``o``), what followed each (NaN for a
    series without ``min_history_steps`` of data before it) and every candidate's residuals,
    shapes ``(origins, H, N)``."""
    y, h_n = cands.y, cands.h_n
    grid = np.arange(spacing, o - h_n + 1, spacing)
    origins = [int(c) for c in grid[-n_score:]] if len(grid) else []
    actual = np.full((len(origins), h_n, y.shape[1]), np.nan)
    res = {m: np.full_like(actual, np.nan) for m in CANDIDATES}
    for i, c in enumerate(origins):
        a = y[c : c + h_n].copy()
        a[:, cands.cum[c] < min_history_steps] = np.nan  # not enough data before c
        actual[i] = a
        for m, f in cands(c).items():
            res[m][i] = a - f
    return origins, actual, res


def _nanmean_abs(r: F64) -> F64:
    """Mean |r| over axes 0 and 1 where finite (NaN where none is)."""
    a = np.abs(r)
    ok = np.isfinite(a)
    cnt = ok.sum(axis=(0, 1))
    return np.where(cnt > 0, np.where(ok, a, 0).sum(axis=(0, 1)) / np.maximum(cnt, 1), np.nan)


def interval_score(a: ArrayLike, lo: ArrayLike, hi: ArrayLike, alpha: float = 0.1) -> F64:
    """Interval score of the central ``1 - alpha`` interval (Gneiting and Raftery 2007, eq.
    43): its width plus ``2 / alpha`` times how far the actual lies outside. Lower is better;
    it is minimised in expectation by the true ``alpha / 2`` and ``1 - alpha / 2`` quantiles."""
    a, lo, hi = (np.asarray(v, dtype=np.float64) for v in (a, lo, hi))
    return (hi - lo) + (2 / alpha) * (np.maximum(lo - a, 0) + np.maximum(a - hi, 0))


def _weighted_quantiles(x: F64, age: F64, rho: float, qs: Sequence[float]) -> list[float]:
    """Quantiles ``qs`` of the scores ``x`` (1-D, finite), each weighted ``rho ** age``, with
    the coming point's weight 1 placed at +inf for a quantile above the median and at -inf
    below it (Barber et al. 2023: the non-exchangeable split-conformal quantile; with
    ``rho = 1`` the ``ceil((n + 1) q)``-th of ``n``). A quantile that needs the coming point's
    mass is the most extreme score (an interval from the data alone)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    w = rho ** age[order]
    total = w.sum() + 1.0
    up = np.cumsum(w) / total  # mass at or below each sorted score
    down = np.cumsum(w[::-1]) / total  # mass at or above, from the top
    out = []
    for q in qs:
        if q >= 0.5:
            out.append(float(xs[min(int(np.searchsorted(up, q - 1e-12)), len(xs) - 1)]))
        else:
            k = min(int(np.searchsorted(down, 1.0 - q - 1e-12)), len(xs) - 1)
            out.append(float(xs[::-1][k]))
    return out


def _pers_quantiles(
    d_j: F64, upto: int, rho: float, qs: Sequence[float]
) -> tuple[list[float], int]:
    """Persistence's interval offsets at one lead: the recency-weighted quantiles ``qs`` of
    the h-step changes completed before the origin (``d_j[:upto]``; the newest is one step
    old), and how many changes there were."""
    x = d_j[:upto]
    age = upto - np.arange(len(x), dtype=np.float64)
    ok = np.isfinite(x)
    if ok.sum() < 2:
        return [np.nan] * len(qs), int(ok.sum())
    return _weighted_quantiles(x[ok], age[ok], rho, qs), int(ok.sum())


def _rolling_coverage(
    models: list[str],
    buckets: tuple[list[int], list[int]],
    origins: list[int],
    actual: F64,
    res: F64,
    d: list[F64],
    model_q: tuple[F64, NDArray[np.int64], F64],
    min_origins: int,
    floor: float | None,
    rho: float,
) -> tuple[float, int]:
    """One series' p05..p95 checked at each bucket's last lead on its scoring origins (rows of
    ``actual``/``res``, in time order), each against quantiles from the data before it
    (persistence: the h-step changes ``d`` completed before the origin, recency-weighted by
    ``rho``; a model: the conformal quantiles of the scaled residuals of the scoring origins
    before it, ``model_q``: their (origins, buckets, 2) p05 and p95 from
    :func:`_model_quantiles_before`, their count, and the scale per lead): (inside, checked)."""
    q_model, n_model, scale = model_q
    inside, checked = 0.0, 0
    for i_k, c in enumerate(origins):
        for b, hi in enumerate(buckets[1]):
            jj = hi - 1
            a = actual[i_k, jj]
            f50 = a - res[i_k, jj]
            if not np.isfinite(a) or not np.isfinite(f50):
                continue
            if models[b] == "persistence":
                (q_lo, q_hi), n_x = _pers_quantiles(d[jj], max(0, c - jj - 1), rho, (0.05, 0.95))
            else:
                n_x = int(n_model[i_k, b]) if i_k >= min_origins else 0
                q_lo, q_hi = q_model[i_k, b] * scale[jj]
            if n_x < 2 * min_origins:
                continue
            lo_b, hi_b = f50 + q_lo, f50 + q_hi
            if floor is not None:
                lo_b, hi_b = max(lo_b, floor), max(hi_b, floor)
            inside += float(lo_b <= a <= hi_b)
            checked += 1
    return inside, checked


def _model_quantiles_before(
    z: F64, valid_o: NDArray[np.bool_], buckets: tuple[list[int], list[int]]
) -> tuple[F64, NDArray[np.int64]]:
    """For every series, at each of its valid scoring origins (in time order) and lead bucket,
    the conformal p05 and p95 of its scaled residuals ``z`` (origins, H, N) over the origins
    before it, ``(max valid origins, buckets, 2, N)``, and how many residuals they are of
    (an origin of no data for a series has no finite residual, so "before it" is the same
    whether its invalid origins are counted or not)."""
    n_o, _, n = z.shape
    nb = len(buckets[0])
    q = np.full((n_o, nb, 2, n), np.nan)
    cnt = np.zeros((n_o, nb, n), np.int64)
    # the row of each series' k-th valid origin
    rank = np.cumsum(valid_o, axis=0) - 1  # (n_o, N)
    for i in range(n_o):
        cols = np.flatnonzero(valid_o[i])
        if not cols.size:
            continue
        for b, (lo, hi) in enumerate(zip(*buckets, strict=True)):
            x = z[:i, lo:hi][:, :, cols].reshape(-1, cols.size)
            qb, cb = _conformal_quantiles(x, (0.05, 0.95))
            q[rank[i, cols], b, :, cols] = qb.T
            cnt[rank[i, cols], b, cols] = cb
    return q, cnt


@_quiet_nan
def _skill_forecast_at(
    cands: _Candidates,
    o: int,
    start_s: float,
    *,
    n_score: int,
    score_spacing: int,
    min_history_steps: int,
    min_origins: int,
    margin: float,
    z_gain: float,
    floor: float | None,
    rho: float = RECENCY_WEIGHT,
) -> SkillForecast:
    """The selected forecast from ``y[:o]`` (see :func:`forecast_skill`)."""
    y, step_s, h_n = cands.y, cands.step_s, cands.h_n
    n = y.shape[1]
    los, his = _horizon_buckets(h_n, step_s)
    nb = len(los)
    origins, actual, res = _score_origins(cands, o, n_score, score_spacing, min_history_steps)
    n_o = len(origins)
    valid_o = np.isfinite(actual).any(axis=1)  # (n_o, n): origins with data before and after
    origins_scored = valid_o.sum(axis=0).astype(np.int64)
    now = cands(o)
    p50 = np.full((h_n, n), np.nan)
    chosen_res = np.full((n_o, h_n, n), np.nan)
    model = [["persistence"] * n for _ in range(nb)]
    skill = np.full((nb, n), np.nan)
    mae = np.full((nb, n), np.nan)
    mae_p = np.full((nb, n), np.nan)
    skills = {m: np.full((nb, n), np.nan) for m in CANDIDATES}
    for b, (lo, hi) in enumerate(zip(los, his, strict=True)):
        rp = np.abs(res["persistence"][:, lo:hi])
        best = np.zeros(n)
        pick = np.array(["persistence"] * n, dtype=object)
        for m in CANDIDATES:
            sk, ok, sure = _candidate_skill(np.abs(res[m][:, lo:hi]), rp, min_origins, z_gain)
            skills[m][b] = sk
            if m == "persistence":
                continue
            have_now = np.isfinite(now[m][lo:hi]).all(axis=0)
            better = ok & have_now & sure & (sk > best + margin)
            best = np.where(better, sk, best)
            pick[better] = m
        for j in range(n):
            m = str(pick[j])
            model[b][j] = m
            p50[lo:hi, j] = now[m][lo:hi, j]
            chosen_res[:, lo:hi, j] = res[m][:, lo:hi, j]
            if np.isfinite(skills["persistence"][b, j]):
                skill[b, j] = 0.0 if m == "persistence" else skills[m][b, j]
        mae_p[b] = _nanmean_abs(rp)
        mae[b] = _nanmean_abs(chosen_res[:, lo:hi])
    # ---- the interval ----
    hist = y[:o]
    d = _h_step_changes(hist, h_n)  # persistence's residuals at every past origin, per lead
    scale = np.array(
        [np.nanmean(np.abs(dj), axis=0) if len(dj) else np.full(n, np.nan) for dj in d]
    )
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, np.nan)  # (H, n)
    z = chosen_res / scale[None]
    # persistence's residuals are the h-step changes themselves: its interval is their
    # recency-weighted conformal quantiles (Barber et al. 2023), nothing rescaled, so it never
    # exceeds the changes this series has made
    q = {qq: np.zeros((h_n, n)) for qq in QUANTILES}
    basis = ["none"] * n
    samples = np.zeros(n, np.int64)
    cover_in = np.zeros(n)
    cover_n = np.zeros(n, np.int64)
    few = origins_scored < min_origins
    q_before, n_before = _model_quantiles_before(z, valid_o, (los, his))
    # every series' conformal quantiles per bucket over all its scoring origins (the models')
    q_now = [
        _conformal_quantiles(z[:, lo:hi].reshape(-1, n), QUANTILES)
        for lo, hi in zip(los, his, strict=True)
    ]
    for j in range(n):
        if few[j]:  # too few scored origins: persistence everywhere, said so
            for b in range(nb):
                model[b][j] = "persistence"
                skill[b, j] = np.nan
            p50[:, j] = now["persistence"][:, j]
        n_pairs = []
        for b, (lo, hi) in enumerate(zip(los, his, strict=True)):
            if model[b][j] == "persistence":
                for jj in range(lo, hi):
                    qs, n_x = _pers_quantiles(d[jj][:, j], len(d[jj]), rho, QUANTILES)
                    n_pairs.append(n_x)
                    if n_x < 2 * min_origins:
                        continue
                    for qq, v in zip(QUANTILES, qs, strict=True):
                        q[qq][jj, j] = v
            else:
                q_b, n_b = q_now[b]
                n_pairs.append(int(n_b[j]))
                for k, qq in enumerate(QUANTILES):
                    q[qq][lo:hi, j] = q_b[k, j] * scale[lo:hi, j]
        samples[j] = min(n_pairs, default=0)
        if samples[j] < 2 * min_origins:
            for qq in QUANTILES:
                q[qq][:, j] = 0.0
            continue
        if all(model[b][j] == "persistence" for b in range(nb)):
            basis[j] = "empirical h-step changes"
        else:
            basis[j] = "conformal on scoring origins"
        cover_in[j], cover_n[j] = _rolling_coverage(
            [model[b][j] for b in range(nb)],
            (los, his),
            [origins[k] for k in np.nonzero(valid_o[:, j])[0]],
            actual[valid_o[:, j], :, j],
            chosen_res[valid_o[:, j], :, j],
            [dd[:, j] for dd in d],
            (q_before[:, :, :, j], n_before[:, :, j], scale[:, j]),
            min_origins,
            floor,
            rho,
        )
    p05, p50, p90, p95 = _bands(p50, q, floor)
    with np.errstate(all="ignore"):
        coverage = np.where(cover_n > 0, cover_in / np.maximum(cover_n, 1), np.nan)
    return SkillForecast(
        t_s=start_s + step_s * np.arange(o, o + h_n),
        p05=p05,
        p50=p50,
        p90=p90,
        p95=p95,
        bucket_lo=los,
        bucket_hi=his,
        model=model,
        skill=skill,
        mae=mae,
        mae_persistence=mae_p,
        skill_candidates=skills,
        origins_scored=origins_scored,
        interval_basis=basis,
        interval_samples=samples,
        coverage_90=coverage,
        coverage_points=cover_n,
        dip_period_s=cands.level(o)[1],
    )


def _bands(p50: F64, q: dict[float, F64], floor: float | None) -> tuple[F64, F64, F64, F64]:
    """p05, p50, p90, p95 from the point and the quantile offsets, ordered, each at least
    ``floor`` (power: 0)."""
    p05 = np.minimum(p50 + q[0.05], p50)
    p90 = np.maximum(p50 + q[0.9], p50)
    p95 = np.maximum(p50 + q[0.95], p90)
    if floor is None:
        return p05, p50, p90, p95
    return tuple(np.maximum(a, floor) for a in (p05, p50, p90, p95))  # type: ignore[return-value]


def _recency(recency_weight: float) -> float:
    if not 0.0 < recency_weight <= 1.0:
        raise ValueError(f"recency_weight must be in (0, 1], got {recency_weight}")
    return float(recency_weight)


def _score_spacing(h_n: int, score_spacing_s: float | None, step_s: float) -> int:
    if score_spacing_s is None:  # a quarter horizon: 15 min for 1 h, 6 h for a day
        return max(1, h_n // 4)
    return max(1, round(score_spacing_s / step_s))


@_quiet_nan
def forecast_skill(
    history: ArrayLike,
    start_s: float,
    step_s: float,
    horizon_steps: int,
    *,
    n_score: int = 32,
    score_spacing_s: float | None = None,
    min_history_s: float = 3600.0,
    min_origins: int = 8,
    margin: float = 0.02,
    z_gain: float = 2.0,
    floor: float | None = 0.0,
    recency_weight: float = RECENCY_WEIGHT,
    **model_kw: float,
) -> SkillForecast:
    """The forecast each series earns on its own history.

    Candidates (:data:`CANDIDATES`): **persistence** (the last value), the **level** model
    (training: robust recent level, checkpoint dips, recent-residual correction), the daily
    **profile** (the inference model; only where the series has a day of data before the
    origin) and a **blend** (the mean of persistence and the level). Each is refitted at up to
    ``n_score`` scoring origins (every ``score_spacing_s``, default a quarter of the horizon,
    each with its whole horizon inside the history) and scored on what followed; an origin
    counts for a series only with ``min_history_s`` of its data before it and some data after.
    Per series and lead bucket (ends at 15 min, 1 h, 6 h, 1 day, 1 week and the horizon) the
    candidate with the best skill ``1 - MAE/MAE_persistence`` wins if it beats persistence by
    more than ``margin`` on at least ``min_origins`` origins, and its mean gain per origin is
    more than ``z_gain`` standard errors; otherwise the forecast is persistence.

    Intervals: split conformal on the chosen model's out-of-sample residuals at the scoring
    origins, scaled per lead by the series' mean absolute h-step change (so a bucket's pooled
    residuals keep the lead's own spread) with the finite-sample correction. With fewer than
    ``min_origins`` scored origins the forecast is persistence and the interval comes from the
    series' empirical h-step changes (``interval_basis`` says which; "none" when even those are
    too few). Where the model is persistence its residuals are the series' h-step changes at
    every past row, and the interval is their weighted conformal quantiles, each change
    weighted ``recency_weight ** age`` (age in grid steps; Barber et al. 2023; 1 gives plain
    split conformal), so a change of volatility is followed within hours and the interval is
    never wider than the changes the series has made. The 90 % interval's coverage is checked
    on rolling scoring origins, each with quantiles from the data before it. Every quantile is
    at least ``floor`` (power: 0).

    Leading rows where no series has data (a history window padded past the recording) are
    not scored and cost nothing.
    """
    y = _as_history(history)
    has = np.isfinite(y).any(axis=1)
    first = int(np.argmax(has)) if has.any() else y.shape[0]
    y2 = y[first:] if first < y.shape[0] else y[-1:]
    s0 = start_s + step_s * (y.shape[0] - y2.shape[0])
    h_n = int(horizon_steps)
    cands = _Candidates(y2, s0, step_s, h_n, dict(model_kw))
    return _skill_forecast_at(
        cands,
        y2.shape[0],
        s0,
        n_score=n_score,
        score_spacing=_score_spacing(h_n, score_spacing_s, step_s),
        min_history_steps=max(1, round(min_history_s / step_s)),
        min_origins=min_origins,
        margin=margin,
        z_gain=z_gain,
        floor=floor,
        rho=_recency(recency_weight),
    )


@dataclass(frozen=True)
class SkillBacktest:
    """Rolling-origin backtest of :func:`forecast_skill`: at each listed origin the forecast
    from the data before it, scored on what followed. Per bucket ``b`` and series ``n``:
    ``skill[b, n]`` (1 - MAE/MAE_persistence), ``coverage_90[b, n]`` (share in p05..p95);
    ``improvement[n]`` over :func:`seasonal_naive` on every lead; ``n[n]`` scored steps;
    ``origins`` only those where some series had an actual to score."""

    bucket_lo: list[int]
    bucket_hi: list[int]
    skill: F64
    coverage_90: F64
    points: NDArray[np.int64]
    mae_p50: F64
    mae_baseline: F64
    improvement: F64
    coverage_all: F64
    below_p90: F64
    n: NDArray[np.int64]
    overall_improvement: float
    overall_coverage_90: float
    overall_below_p90: float
    overall_mae_p50: float
    overall_mae_baseline: float
    origins: list[int]
    origins_listed: int


@_quiet_nan
def backtest_skill(
    history: ArrayLike,
    start_s: float,
    step_s: float,
    horizon_steps: int,
    kinds: Sequence[str],
    origins: Sequence[int],
    *,
    season_s: float = DAY_S,
    n_score: int = 32,
    score_spacing_s: float | None = None,
    min_history_s: float = 3600.0,
    min_origins: int = 8,
    margin: float = 0.02,
    z_gain: float = 2.0,
    floor: float | None = 0.0,
    recency_weight: float = RECENCY_WEIGHT,
    **model_kw: float,
) -> SkillBacktest:
    """Backtest :func:`forecast_skill` (same arguments) at ``origins`` (rows): each forecast
    sees ``history[:o]`` only (its model choice and interval included); candidates' forecasts
    shared between origins are computed once."""
    y = _as_history(history)
    ks = _check_kinds(kinds, y.shape[1])
    t_n, n = y.shape
    h_n = int(horizon_steps)
    cands = _Candidates(y, start_s, step_s, h_n, dict(model_kw))
    los, his = _horizon_buckets(h_n, step_s)
    nb = len(los)
    ae = np.zeros((nb, n))
    ae_p = np.zeros((nb, n))
    ins = np.zeros((nb, n))
    pts = np.zeros((nb, n), np.int64)
    ae_all, ae_b, in_all, below, cnt = (np.zeros(n) for _ in range(5))
    used: list[int] = []
    listed = [int(o) for o in origins if 0 < int(o) <= t_n - 1]
    for o in listed:
        f = _skill_forecast_at(
            cands,
            o,
            start_s,
            n_score=n_score,
            score_spacing=_score_spacing(h_n, score_spacing_s, step_s),
            min_history_steps=max(1, round(min_history_s / step_s)),
            min_origins=min_origins,
            margin=margin,
            z_gain=z_gain,
            floor=floor,
            rho=_recency(recency_weight),
        )
        actual = y[o : o + h_n]
        h = actual.shape[0]
        pers = np.broadcast_to(last_valid(y[:o]), (h, n))
        base = seasonal_naive(y[:o], start_s, step_s, h_n, ks, season_s=season_s)[:h]
        ok = np.isfinite(actual) & np.isfinite(f.p50[:h]) & np.isfinite(pers)
        if not ok.any():
            continue
        used.append(o)
        a = np.where(ok, actual, 0.0)
        e50 = np.where(ok, np.abs(a - np.nan_to_num(f.p50[:h])), 0.0)
        ep = np.where(ok, np.abs(a - np.nan_to_num(pers)), 0.0)
        inside = ok & (actual >= f.p05[:h]) & (actual <= f.p95[:h])
        for b, (lo, hi) in enumerate(zip(los, his, strict=True)):
            ae[b] += e50[lo:hi].sum(axis=0)
            ae_p[b] += ep[lo:hi].sum(axis=0)
            ins[b] += inside[lo:hi].sum(axis=0)
            pts[b] += ok[lo:hi].sum(axis=0)
        okb = ok & np.isfinite(base)
        ae_all += np.where(okb, e50, 0).sum(axis=0)
        ae_b += np.where(okb, np.abs(a - np.nan_to_num(base)), 0).sum(axis=0)
        in_all += (inside & okb).sum(axis=0)
        below += (okb & (actual <= f.p90[:h])).sum(axis=0)
        cnt += okb.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(cnt > 0, cnt, np.nan)
        tot = cnt.sum()
        return SkillBacktest(
            bucket_lo=los,
            bucket_hi=his,
            skill=np.where(ae_p > 0, 1.0 - ae / ae_p, np.nan),
            coverage_90=np.where(pts > 0, ins / np.maximum(pts, 1), np.nan),
            points=pts,
            mae_p50=ae_all / c,
            mae_baseline=ae_b / c,
            improvement=1.0 - ae_all / ae_b,
            coverage_all=in_all / c,
            below_p90=below / c,
            n=cnt.astype(np.int64),
            overall_improvement=float(1 - ae_all.sum() / ae_b.sum()) if ae_b.sum() else np.nan,
            overall_coverage_90=float(in_all.sum() / tot) if tot else np.nan,
            overall_below_p90=float(below.sum() / tot) if tot else np.nan,
            overall_mae_p50=float(ae_all.sum() / tot) if tot else np.nan,
            overall_mae_baseline=float(ae_b.sum() / tot) if tot else np.nan,
            origins=used,
            origins_listed=len(listed),
        )
