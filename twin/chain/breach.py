"""Time to breach of every limit, from a frame's "now" and a load path: the live headroom's
forecasts (``twin.analysis.headroom``, one "now" and a path over the horizon) and a replay's
(``twin.replay.whatif``, every evaluation minute at once, each from the data up to it) run these
functions, so the alert benchmark measures what the service pages.

A frame is (T, N) arrays of one quantity per device on the site index, on a regular step;
"now" at a row is the mean of the samples of the last :data:`NOW_WINDOW_S` up to and including
it (:func:`minute_means`), as the live pass reads it.

- load: the persistence basis (what the live service uses until the store holds a day of node
  power, :data:`twin.forecast.forecast.MIN_RATIO_HISTORY_S`; on the demo day's recording it is
  what the live service would have used too): the p50 load is the present load, the p90 the
  last hour's 90th percentile of the rack's load over its present load (at least 1,
  :func:`p90_ratio`). A rack's load is its IT load (its nodes' input power) where every node
  reports, else its PDUs' power, as minute means on both paths (live:
  ``WindowReader.minute_means`` over the store; a replay: :func:`minute_means` over the
  recording, ``twin.replay.whatif._it_minutes``);
- PDU phases and breakers: the present current plus the trend that the IT load of the racks it
  feeds does not explain (:func:`twin.chain.trend.unexplained_trend` over
  :data:`twin.chain.trend.TREND_WINDOW_S` of minute means); the p50 path is ``current + slope *
  t`` (:func:`trend_breach_in_s` for every minute of a replay). The IT load, not the PDUs'
  power: load creeping onto a phase from outside the site's nodes raises the PDU's power too,
  and explaining the current by it hides part of the creep. Under persistence a checkpoint dip
  is taken for the load to come, so the forecast clears for the dip's minute, live as in
  replay: rules ride that out with the engine's ``keep_firing_for``;
- GPUs: the RC model of the chain at the load path's power (the present activity x the rack's
  load ratio on the calibrated curve, within the enforced cap,
  ``twin.chain.propagate.gpu_power_at_ratio_w``), from the present temperature less the
  model's level error of the last minute (``models.thermal_watch.model_bias_k``), against the
  limit less that error: stepped with the thermal controller for any path
  (:func:`gpu_temp_path`, live), in closed form for a constant p90 ratio
  (:func:`gpu_p90_breach_in_s`, a replay's persistence), which is exact on its steps;
- racks, CDU heat and flow, loop return, links: flat p50 paths under persistence, so the time to
  breach is 0 when the limit is breached now and "never" otherwise.

A breach is reported as the first path step (of ``step_s``) where the headroom is <= 0
(:func:`breach_in_s`); NaN when there is none within the horizon (an alert observation reports
twice the horizon, :func:`beyond_horizon`, as :func:`twin.analysis.detect.observations`).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from models import thermal_watch as tw
from twin.chain import propagate as chain
from twin.chain.thermal import gpu_temperatures
from twin.chain.trend import LEVEL_WINDOW_S, TREND_WINDOW_S, unexplained_trend

__all__ = [
    "HORIZON_S",
    "NOW_WINDOW_S",
    "PERSISTENCE_WINDOW_S",
    "STEP_S",
    "Z90",
    "GpuSeries",
    "beyond_horizon",
    "breach_in_s",
    "flat_breach_in_s",
    "gpu_breach_in_s",
    "gpu_p90_breach_in_s",
    "gpu_temp_path",
    "last_minute_bias_k",
    "minute_means",
    "minute_slopes",
    "p90_ratio",
    "trailing_quantile",
    "trend_breach_in_s",
]

#: The live headroom's horizon and step (``dctwin serve``:
#: twin.analysis.detect.DetectionScheduler). [s]
HORIZON_S = 3600.0
STEP_S = 60.0
#: Seconds averaged for "now" values (currents, power, heat, flow, traffic) to take out noise.
NOW_WINDOW_S = 60.0
#: Window of the persistence p90 load. [s]
PERSISTENCE_WINDOW_S = 3600.0
#: z of the one-sided 90 % quantile of a normal distribution.
Z90 = 1.2816


def minute_means(x: np.ndarray, rows: np.ndarray, dt_s: float) -> np.ndarray:
    """(M, N): per evaluation row, the mean of the samples of the last ``NOW_WINDOW_S`` up to and
    including it (NaN ignored; NaN where all are): the live headroom's "now" values.

    Summed over the window's few samples at the evaluation rows only (a minute at 10 s is six
    gathers of (M, N)), not through a running sum of the whole (T, N) array: four times less
    work for a replay's per-minute rows, and no cancellation error of a long running sum."""
    w = max(1, round(NOW_WINDOW_S / dt_s))
    x = np.asarray(x)
    rows = np.asarray(rows, dtype=np.int64)
    s = np.zeros((len(rows), *x.shape[1:]))
    c = np.zeros(s.shape)
    m = len(rows)
    if m > 1 and np.array_equal(rows, np.arange(m) * w):
        # a replay's minutes (a row every window, from row 0): the windows tile the rows, so
        # each step k is a strided view, not a gather; the same sums in the same order
        # (newest sample first) as the general path below, so the same bits
        tiles = x[1 : 1 + (m - 1) * w].reshape(m - 1, w, *x.shape[1:])
        parts = [(s[:1], c[:1], x[:1]), *((s[1:], c[1:], tiles[:, w - 1 - k]) for k in range(w))]
        if np.isfinite(x[: 1 + (m - 1) * w]).all():  # the usual case: nothing to leave out
            for s_k, c_k, v in parts:
                s_k += v  # float32 is taken exactly to float64 by the add, as by astype
                c_k += 1.0
        else:
            for s_k, c_k, v in parts:
                v = v.astype(float)
                ok = np.isfinite(v)
                s_k += np.where(ok, v, 0.0)
                c_k += ok
    else:
        for k in range(w):
            r = rows - k
            v = x[np.maximum(r, 0)].astype(float)
            ok = np.isfinite(v)
            if not (r >= 0).all():
                ok &= (r >= 0).reshape(-1, *([1] * (v.ndim - 1)))
            s += np.where(ok, v, 0.0)
            c += ok
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c > 0, s / np.maximum(c, 1), np.nan)


def minute_slopes(x: np.ndarray, rows: np.ndarray, dt_s: float) -> np.ndarray:
    """(M, N): per evaluation row, the slope of ``x`` from the first to the last sample of the
    last ``NOW_WINDOW_S`` up to and including it [per s] (0 where it cannot be told), as
    ``models.thermal_watch.minute_aggregates`` gives the live headroom's last minute."""
    w = max(1, round(NOW_WINDOW_S / dt_s))
    lo = np.maximum(rows - (w - 1), 0)
    span_s = (rows - lo).astype(float)[:, None] * dt_s
    x = np.asarray(x, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(span_s > 0, (x[rows] - x[lo]) / span_s, 0.0)
    return np.where(np.isfinite(slope), slope, 0.0)


def trailing_quantile(a: np.ndarray, k: int, q: float) -> np.ndarray:
    """(M,): at each m, the ``q`` quantile (linear, as ``np.quantile``) of the finite values of
    ``a[m-k+1 .. m]`` (fewer at the start; NaN where none is finite). One sort of the
    (M, min(k, M)) windows, no loop over minutes."""
    a = np.asarray(a, dtype=float)
    m = a.shape[0]
    k = max(1, min(k, m))
    if m == 0:
        return np.zeros(0)
    pad = np.concatenate([np.full(k - 1, np.nan), a])
    return _sorted_quantile(np.sort(sliding_window_view(pad, k), axis=1), q, axis=1)


def _sorted_quantile(win: np.ndarray, q: float, axis: int) -> np.ndarray:
    """The ``q`` quantile of the finite values along ``axis`` of windows sorted along it (NaN
    last), linear between order statistics as ``np.nanquantile``'s default; NaN where none."""
    n = np.isfinite(win).sum(axis=axis)
    pos = q * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    v_lo = np.take_along_axis(win, np.expand_dims(lo, axis), axis=axis).squeeze(axis)
    v_hi = np.take_along_axis(win, np.expand_dims(hi, axis), axis=axis).squeeze(axis)
    return np.where(n > 0, v_lo + (pos - lo) * (v_hi - v_lo), np.nan)


def _windows(x: np.ndarray, k: int) -> np.ndarray:
    """(k, M, N): for each minute m, rows m-k+1..m of ``x`` (M, N), NaN before the start."""
    pad = np.concatenate([np.full((k - 1, x.shape[1]), np.nan), x])
    return np.moveaxis(sliding_window_view(pad, k, axis=0), -1, 0)


def beyond_horizon(b: np.ndarray, horizon_s: float = HORIZON_S) -> np.ndarray:
    """The observed value: twice the horizon where no breach is forecast (NaN)."""
    return np.where(np.isfinite(b), b, 2.0 * horizon_s)


def breach_in_s(headroom: np.ndarray, step_s: float) -> np.ndarray:
    """First time (s) each column's headroom path (axis 0: the path's steps of ``step_s``, the
    first is now) is <= 0; NaN when it never is (or is unknown)."""
    hit = headroom <= 0
    first = np.argmax(hit, axis=0).astype(float)
    first[~hit.any(axis=0)] = np.nan
    return first * step_s


def flat_breach_in_s(headroom: np.ndarray) -> np.ndarray:
    """A flat path: breached now (0) or never within the horizon (NaN); NaN stays unknown."""
    with np.errstate(invalid="ignore"):
        return breach_in_s(np.asarray(headroom)[None], STEP_S)


def _first_step(headroom: np.ndarray, rate: np.ndarray, horizon_s: float, step_s: float):
    """First step k*step_s (k <= horizon/step) where ``headroom - rate * t <= 0``; NaN if none."""
    n_last = round(horizon_s / step_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        k = np.ceil(headroom / np.where(rate > 0, rate * step_s, np.nan))
        out = np.where(headroom <= 0, 0.0, np.where(k <= n_last, k * step_s, np.nan))
    return out


def trend_breach_in_s(
    current_a: np.ndarray,
    load: np.ndarray,
    limit_a: np.ndarray,
    ratio50: np.ndarray | None = None,
    *,
    horizon_s: float = HORIZON_S,
    step_s: float = STEP_S,
) -> np.ndarray:
    """(M, P) p50 time to breach of phases and breakers: present current x the load ratio,
    plus the unexplained trend.

    ``current_a`` and ``load`` are (M, P) minute means (``load``: the power of the racks each
    phase feeds); each minute's trend is fitted on the :data:`TREND_WINDOW_S` up to it, with the
    load over its value at that minute, exactly as the live headroom does. ``ratio50`` (M, P):
    the p50 load ratio of the racks each phase feeds (default 1: persistence).
    """
    m, p = current_a.shape
    k = max(3, round(TREND_WINDOW_S / step_s))
    cur_w = _windows(current_a, k).reshape(k, m * p)
    # each window over its last minute's load (1 where that is not positive), in place on
    # one contiguous copy: the strided windows' arithmetic cost 8x the time
    load_w = np.array(_windows(load, k), dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        now_pos = load_w[-1] > 0
        load_w /= np.where(now_pos, load_w[-1], 1.0)
        load_w[:, ~now_pos] = 1.0
    # the highest minute of the LEVEL_WINDOW_S before each minute's trend window (the live
    # headroom's hour of history less the trend's): a rising trend must make new highs over it
    kb = max(1, round(LEVEL_WINDOW_S / step_s))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: no history, no guard
        top = np.nanmax(_windows(current_a, kb), axis=0)  # (M, P): minutes m-kb+1 .. m
    level = np.full_like(top, np.nan)
    level[k:] = top[: m - k] if m > k else level[k:]
    slope, _ = unexplained_trend(
        cur_w, load_w.reshape(k, m * p), step_s, level_before=level.reshape(m * p)
    )
    r = np.ones_like(current_a) if ratio50 is None else ratio50
    headroom = limit_a[None, :] - current_a * r
    return _first_step(headroom, slope.reshape(m, p), horizon_s, step_s)


def p90_ratio(rack_w: np.ndarray, step_s: float = STEP_S, *, last: bool = False) -> np.ndarray:
    """(M, R): per row, the last hour's 90th percentile of each rack's load over its present
    load (the row's), at least 1 (1 where unknown): the persistence basis's p90 load ratio.
    ``last``: the last row's only, (R,) (the live headroom's "now").

    The quantile is numpy's default (linear) over the finite values of each window, as
    ``np.nanquantile`` gives, from one sort of every window at once.
    """
    rack_w = np.asarray(rack_w, dtype=float)
    k = max(1, round(PERSISTENCE_WINDOW_S / step_s))
    if last:
        q90 = _sorted_quantile(np.sort(rack_w[-k:], axis=0), 0.9, axis=0)
        return chain.p90_load_ratio(q90, rack_w[-1])
    q90 = _sorted_quantile(np.sort(_windows(rack_w, k), axis=0), 0.9, axis=0)  # (k, M, R)
    return chain.p90_load_ratio(q90, rack_w)


def gpu_breach_in_s(
    temp_c: np.ndarray,
    ref_c: np.ndarray,
    power_w: np.ndarray,
    r_k_per_w: np.ndarray,
    c_j_per_k: np.ndarray,
    max_temp_c: np.ndarray,
    *,
    horizon_s: float = HORIZON_S,
    step_s: float = STEP_S,
) -> np.ndarray:
    """(M, G) time for the RC model at constant power to reach ``max_temp_c`` from ``temp_c``.

    ``T(t) = T_ss + (T_0 - T_ss) exp(-t / (R C))`` with ``T_ss = ref + R P`` (the model of
    :func:`models.gpu_thermal.rc_step`); reported on the path's steps: 0 when at or over the
    limit now, NaN when the steady state stays below it or the crossing is past the horizon.
    """
    n_last = round(horizon_s / step_s)
    tss = ref_c + r_k_per_w * power_w
    tau = r_k_per_w * c_j_per_k
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = (tss - max_temp_c) / (tss - temp_c)  # exp(-t/tau) at the crossing, in (0, 1)
        t = -tau * np.log(np.where((tss > max_temp_c) & (frac > 0), frac, np.nan))
        k = np.ceil(t / step_s - 1e-9)
        out = np.where(temp_c >= max_temp_c, 0.0, np.where(k <= n_last, k * step_s, np.nan))
    return out


class GpuSeries(NamedTuple):
    """A replay's GPU series ``(T, G)`` and the rows (one per evaluation minute) to judge at."""

    temp_c: np.ndarray
    power_w: np.ndarray
    activity: np.ndarray  # SM activity, else GPU-Util / 100 (NaN: none)
    ref_c: np.ndarray  # coolant supply (inlet air) plus the fitted offset
    rows: np.ndarray
    dt_s: float


def gpu_p90_breach_in_s(
    s: GpuSeries,
    r_k_per_w: np.ndarray,
    ratio90: np.ndarray,
    cap_w: np.ndarray,
    gp: Any,
    cols: Any = slice(None),
    from_util: Any = None,
    *,
    horizon_s: float = HORIZON_S,
    step_s: float = STEP_S,
) -> np.ndarray:
    """(M, G) the GPUs' p90 time to breach at each evaluation row, as the live headroom
    (``twin.analysis.headroom``) forecasts it under its persistence basis, beyond the horizon
    reported as twice it.

    Power: the present activity (the last minute's mean) scaled by the rack's p90 load ratio on
    the calibrated curve, within the cap (``twin.chain.propagate.gpu_power_at_ratio_w``, the
    live path's own step); temperature: the RC model from the present temperature (the row's
    sample) at that constant power (:func:`gpu_breach_in_s`), the model's level error of the
    last minute (``models.thermal_watch.model_bias_k``) taken out of the start and the limit.
    ``r_k_per_w``: (M, G) R at each row; ``ratio90``: (M, G) each GPU's rack's p90 ratio."""
    rows, dt = s.rows, s.dt_s
    p_now = minute_means(s.power_w, rows, dt)
    ref_now = minute_means(s.ref_c, rows, dt)
    c = gp.c_j_per_k[cols][None, :]
    t_mean, slope = minute_means(s.temp_c, rows, dt), minute_slopes(s.temp_c, rows, dt)
    bias = tw.model_bias_k(t_mean, p_now, slope, ref_now, r_k_per_w, c)
    a_now = minute_means(s.activity, rows, dt)
    p90 = chain.gpu_power_at_ratio_w(p_now, a_now, ratio90, gp, cap_w, cols, from_util)
    t_now = s.temp_c[rows]
    limit = gp.max_temp_c[cols][None, :] - bias
    b = gpu_breach_in_s(
        t_now - bias, ref_now, p90, r_k_per_w, c, limit, horizon_s=horizon_s, step_s=step_s
    )
    return np.where(np.isfinite(t_now), beyond_horizon(b, horizon_s), np.nan)


def last_minute_bias_k(
    temp_c: np.ndarray,
    power_w: np.ndarray,
    dt_s: float,
    ref_c: np.ndarray,
    r_k: np.ndarray,
    c: np.ndarray,
) -> np.ndarray:
    """(G,) the model's level error over the last minute of a frame's samples (``temp_c``,
    ``power_w``: (T, G) at ``dt_s``; ``models.thermal_watch.model_bias_k`` on their minute
    aggregates); ``ref_c`` includes the offset. 0 where the frame holds no whole minute."""
    t_m, p_m, slope = tw.minute_aggregates(temp_c, power_w, dt_s)
    if not t_m.shape[0]:
        return np.zeros(temp_c.shape[1])
    return tw.model_bias_k(t_m[-1], p_m[-1], slope[-1], ref_c, r_k, c)


def gpu_temp_path(
    temp_now: np.ndarray,
    ref_now: np.ndarray,
    power_now: np.ndarray,
    act_now: np.ndarray,
    bias_k: np.ndarray,
    ratio: np.ndarray,
    cap_w: np.ndarray,
    r_k: np.ndarray,
    gp: Any,
    step_s: float,
    from_util: np.ndarray | None = None,
) -> np.ndarray:
    """(n, G) temperature path of every GPU for a load-ratio path (n, G) of its rack.

    The rack's load ratio scales each GPU's activity; power follows the calibrated curve
    (measured power plus the curve's change: ``twin.chain.propagate.gpu_power_at_ratio_w``, the
    step :func:`gpu_p90_breach_in_s` takes too) and the temperature the RC model with the
    thermal controller (``twin.chain.gpu_temperatures``).
    A GPU without activity telemetry scales its power with the ratio instead; ``from_util``
    marks the GPUs whose activity is GPU-Util (their curve may be a util-only one).

    The path is the model's plus its bias now (``bias_k``, :func:`last_minute_bias_k`), as the
    what-if's is the recording plus the model's change: the model's level error is not headroom
    (a seeded or stale R that puts a healthy GPU's steady state 30 K over what it measures must
    not forecast its slowdown), while its response to the load path and its transients are.
    The controller holds the model at the max operating temperature less the bias.
    """
    n, g = ratio.shape
    p = chain.gpu_power_at_ratio_w(
        power_now[None, :], act_now[None, :], ratio, gp, cap_w[None, :], from_util=from_util
    )
    ref = np.broadcast_to(np.nan_to_num(ref_now) + gp.offset_k, (n, g))
    res = gpu_temperatures(
        np.where(np.isfinite(temp_now), temp_now, ref_now) - bias_k,
        ref,
        p,
        np.broadcast_to(r_k, (n, g)),
        gp.c_j_per_k,
        step_s,
        idle_w=gp.idle_w,
        max_temp_c=gp.max_temp_c - bias_k,
    )
    # the path starts at the measured temperature; a GPU with no reference is unknown
    return np.where(np.isfinite(ref_now)[None, :], res.temp_c + bias_k[None, :], np.nan)
