"""Watching GPUs against their thermal model, minute by minute: residual and R re-estimate.

Both detectors of a degrading cold plate work on per-minute aggregates of each GPU (its mean
temperature and power and its temperature's slope over the minute), vectorized over GPUs and
minutes, so the live service (its last minutes) and a what-if replay (every minute of a day,
causally) run the same arithmetic.

The RC model ``C dT/dt = P - (T - T_ref - offset) / R`` averaged over a minute is exact in
the minute means (docs/physics.md §2):

.. math:: \\bar T - T_{ref} - \\mathrm{offset} = R\\,(\\bar P - C\\,\\overline{dT/dt}) = R\\,x

so with ``x`` (the heat the cold plate carried away, W) the model's minute mean is
``T_ref + offset + R x``, and ``R`` is re-estimated over a trailing window by least squares
through the origin, ``R = sum(y x) / sum(x^2)`` with ``y = T - T_ref - offset``: no simulation
and no per-second grid. A loop's flow changes R (``models.gpu_thermal.r_at_flow_k_per_w``) by a
factor the same for every R; ``flow_factor`` divides it out, so the estimate is R at the flow
the GPU was calibrated at, comparable across a fleet whose loops run at different flows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

#: Least heat through the cold plate, per minute, for that minute to count in the R estimate:
#: below it the sensor's 1 K step is more than 5 % of R x (0.031 K/W x 150 W = 4.7 K for an
#: H100 on a cold plate, docs/physics.md §9.2). An idle GPU says nothing about its R. [W]
MIN_HEAT_W = 150.0
#: Fewest such minutes in the window for an R estimate. [1]
MIN_R_MINUTES = 10
#: Fewest loaded minutes among the judged ones for a residual figure. [1]
MIN_RESIDUAL_MINUTES = 3
#: A judged minute carries at least this share of the heat of its window's heaviest: the
#: minutes of a checkpoint dip and of the climb back (a third of the load and less) are left
#: out of the residual's minimum. [1]
LOAD_FRACTION = 0.7
#: How far below its coolant (or inlet air) reference a GPU's model may sit before its residual
#: is not judged: a little, for the reference sensor's own 1 K quantization and offset error
#: (docs/physics.md §2.6); more is a model outside its calibration. [K]
MODEL_BELOW_REF_K = 2.0
#: Fewest GPUs with an estimate for a group's median to be a fleet reference. [1]
MIN_GROUP = 3


def minute_aggregates(
    temp_c: NDArray[np.floating], power_w: NDArray[np.floating], step_s: float
) -> tuple[F64, F64, F64]:
    """Per whole minute of a ``(T, N)`` grid sampled every ``step_s``: mean temperature [°C],
    mean power [W] and the temperature's slope from its first to its last valid sample [K/s]
    (0 with fewer than two), each ``(T // per_minute, N)``. A partial last minute is dropped;
    NaN samples are skipped (a device reporting every 10 s on a 1 s grid has its slope from
    its first and last reading of the minute)."""
    per = max(1, round(60.0 / step_s))
    m = temp_c.shape[0] // per
    n = temp_c.shape[1]
    # reshaped views of the input (float32 stays float32): the sums run in float64 over the
    # same values in the same order as on a float64 copy, without making the copy
    t = np.asarray(temp_c)[: m * per].reshape(m, per, n)
    p = np.asarray(power_w)[: m * per].reshape(m, per, n)
    ok = np.isfinite(t)
    mean_t = _mean_over_minute(t, ok)
    mean_p = _mean_over_minute(p, ok if p is t else np.isfinite(p))
    if per == 1:
        return mean_t, mean_p, np.zeros((m, n))
    first = np.argmax(ok, axis=1)[:, None, :]  # (m, 1, n): the minute's first valid sample
    last = per - 1 - np.argmax(ok[:, ::-1, :], axis=1)[:, None, :]
    span_s = ((last - first) * step_s)[:, 0, :]
    t_last = np.take_along_axis(t, last, axis=1)[:, 0, :].astype(float)
    rise = t_last - np.take_along_axis(t, first, axis=1)[:, 0, :].astype(float)
    with np.errstate(all="ignore"):
        slope = np.where(span_s > 0, rise / span_s, 0.0)
    return mean_t, mean_p, np.where(np.isfinite(slope), slope, 0.0)


def _mean_over_minute(a: NDArray[np.floating], ok: NDArray[np.bool_]) -> F64:
    """``np.nanmean(a, axis=1)`` in float64 (NaN where a minute has no finite sample)."""
    total = np.add.reduce(np.where(ok, a, 0), axis=1, dtype=float)
    count = np.add.reduce(ok, axis=1, dtype=np.intp)
    with np.errstate(all="ignore"):
        return total / count


def heat_w(mean_power_w: F64, slope_k_per_s: F64, c_j_per_k: F64) -> F64:
    """x = P - C dT/dt: the minute's mean heat through the cold plate. [W]"""
    return mean_power_w - np.nan_to_num(c_j_per_k, nan=0.0) * slope_k_per_s


def trailing_sum(a: F64, window: int) -> F64:
    """``out[k] = sum(a[k - window + 1 : k + 1])`` along axis 0 (shorter at the start)."""
    c = np.cumsum(a, axis=0)
    out = c.copy()
    if window < a.shape[0]:
        out[window:] = c[window:] - c[:-window]
    return out


def trailing_min(a: F64, window: int, min_valid: int | None = None) -> F64:
    """``out[k] = min(a[k - window + 1 : k + 1])`` along axis 0 over the finite values; NaN
    where fewer than ``min_valid`` (default: all ``window``) of them are finite, and before
    ``window`` minutes are there."""
    m = a.shape[0]
    out = np.full_like(a, np.nan)
    if m < window:
        return out
    from numpy.lib.stride_tricks import sliding_window_view

    need = window if min_valid is None else min_valid
    win = sliding_window_view(a, window, axis=0)
    valid = np.isfinite(win).sum(axis=-1)
    low = np.where(np.isfinite(win), win, np.inf).min(axis=-1)
    out[window - 1 :] = np.where(valid >= need, low, np.nan)
    return out


def loaded_min(
    z: F64,
    x_w: F64,
    window: int,
    min_valid: int,
    *,
    min_heat_w: float = 0.0,
    load_fraction: float = LOAD_FRACTION,
) -> F64:
    """``out[k]``: the smallest ``z`` of the trailing ``window`` minutes that carried the
    window's load: at least ``min_heat_w`` and ``load_fraction`` of the window's heaviest
    minute. A degraded plate shows in proportion to its heat (``dR x``), so a checkpoint's dip
    or the minute the GPU climbs back from it says little and must not clear a hot spot; a GPU
    steadily at low load is judged at its own level (6 K over the model at 120 W is a plate
    gone bad, though R's estimate there is too coarse for the drift detector). NaN
    where fewer than ``min_valid`` minutes qualify, and before ``window`` minutes are there."""
    m = z.shape[0]
    out = np.full_like(z, np.nan)
    if m < window:
        return out
    from numpy.lib.stride_tricks import sliding_window_view

    zw = sliding_window_view(z, window, axis=0)
    xw = sliding_window_view(np.where(np.isfinite(x_w), x_w, -np.inf), window, axis=0)
    heaviest = xw.max(axis=-1, keepdims=True)
    ok = np.isfinite(zw) & (xw >= min_heat_w) & (xw >= load_fraction * heaviest)
    low = np.where(ok, zw, np.inf).min(axis=-1)
    out[window - 1 :] = np.where(ok.sum(axis=-1) >= min_valid, low, np.nan)
    return out


def residual_k(
    mean_temp_c: F64, ref_c: F64, offset_k: F64, r_k_per_w: F64, x_w: F64
) -> tuple[F64, F64]:
    """(measured - model, model) per minute [K, °C]; ``r_k_per_w`` at the minute's flow.

    The residual is NaN (no judgement) in a minute where the model sits more than
    :data:`MODEL_BELOW_REF_K` below its reference: a GPU cannot be colder than the coolant or
    air that cools it, so such a model is outside what its calibration saw (a negative offset
    fitted on loaded data, extrapolated to an idle minute), and its residual would read as a
    hot GPU where there is none."""
    model = ref_c + offset_k + r_k_per_w * x_w
    with np.errstate(invalid="ignore"):
        unphysical = model < ref_c - MODEL_BELOW_REF_K
    return np.where(unphysical, np.nan, mean_temp_c - model), model


def model_bias_k(
    mean_temp_c: F64,
    mean_power_w: F64,
    slope_k_per_s: F64,
    ref_c: F64,
    r_k_per_w: F64,
    c_j_per_k: F64,
) -> F64:
    """The model's level error now: a minute's measured mean temperature over the RC model's
    for that minute's mean heat ``x = P - C dT/dt`` (:func:`residual_k`, exact in minute
    means, so a transient is no error), 0 where it cannot be told. ``ref_c`` includes the
    GPU's offset; ``r_k_per_w`` is R at the minute's flow. [K]

    A forecast adds it to the model's path (the what-if adds the model's change to the
    recording): a seeded or stale R that puts a healthy GPU's steady state 30 K over what it
    measures is an error of the model's level, not headroom.

    Examples
    --------
    >>> # 700 W at steady state (no slope) over 30 °C coolant: the model (R 0.08) says 86 °C
    >>> float(model_bias_k(np.array(51.0), np.array(700.0), np.array(0.0), np.array(30.0),
    ...                    np.array(0.08), np.array(400.0)).round(6))
    -35.0
    """
    resid, _ = residual_k(
        mean_temp_c, ref_c, 0.0, r_k_per_w, heat_w(mean_power_w, slope_k_per_s, c_j_per_k)
    )
    return np.where(np.isfinite(resid), resid, 0.0)


def r_estimate(
    mean_temp_c: F64,
    ref_c: F64,
    offset_k: F64,
    x_w: F64,
    flow_factor: F64,
    window: int,
    *,
    min_heat_w: float = MIN_HEAT_W,
    min_minutes: int = MIN_R_MINUTES,
) -> tuple[F64, F64]:
    """R at the calibration's flow, re-estimated over each trailing ``window`` of minutes, and
    the heat it was made at: the mean of ``flow_factor * x_w`` over the window's minutes that
    entered it (``(M, N)`` each; NaN where fewer than ``min_minutes`` minutes carried
    ``min_heat_w``) [K/W], [W]. An R that is ``dr`` over a reference R runs ``dr * heat``
    kelvin hotter than the reference would at the same heat and flow: what a drift amounts to
    in the GPU's temperature."""
    fx = flow_factor * x_w
    y = mean_temp_c - ref_c - offset_k
    ok = np.isfinite(y) & np.isfinite(fx) & (x_w >= min_heat_w)
    yx = trailing_sum(np.where(ok, y * fx, 0.0), window)
    xx = trailing_sum(np.where(ok, fx * fx, 0.0), window)
    xs = trailing_sum(np.where(ok, fx, 0.0), window)
    cnt = trailing_sum(ok.astype(float), window)
    enough = (cnt >= min_minutes) & (xx > 0)
    with np.errstate(all="ignore"):
        r = yx / xx
        heat = xs / cnt
    return np.where(enough, r, np.nan), np.where(enough, heat, np.nan)


def group_median(values: F64, group: NDArray[np.int64], min_group: int = MIN_GROUP) -> F64:
    """``(M, N)``: each column's group's median over its finite members, minute by minute
    (NaN where fewer than ``min_group`` members have a value). ``group``: ``(N,)`` codes."""
    out = np.full_like(values, np.nan)
    import warnings

    for g in np.unique(group):
        cols = np.flatnonzero(group == g)
        v = values[:, cols]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(v, axis=1)
        enough = np.isfinite(v).sum(axis=1) >= min_group
        out[:, cols] = np.where(enough, med, np.nan)[:, None]
    return out


class Watch(NamedTuple):
    """:func:`watch`'s figures, ``(M, N)`` each: ``z`` (the residual over sigma, the smallest of
    the trailing loaded minutes, :func:`loaded_min`), ``model_c`` (the model's minute mean
    [°C]), ``r_est`` and ``r_heat`` (R re-estimated at the calibration's flow [K/W] and the heat
    it was made at [W], :func:`r_estimate`)."""

    z: F64
    model_c: F64
    r_est: F64
    r_heat: F64


def watch(
    mean_temp_c: F64,
    mean_power_w: F64,
    slope_k_per_s: F64,
    ref_c: F64,
    offset_k: F64,
    c_j_per_k: F64,
    flow_factor: F64,
    sigma_k: F64,
    r_k_per_w: F64 | Callable[[F64], F64],
    *,
    minutes: int,
    window: int,
) -> Watch:
    """Both detectors on a GPU's minute aggregates, every minute: the heat (:func:`heat_w`), R
    re-estimated over the trailing ``window`` minutes, the residual against the model with R
    ``r_k_per_w`` (or ``r_k_per_w(r_est)``: an R that depends on the re-estimates so far) at
    the minute's flow, and that residual over ``sigma_k``, the smallest of the trailing
    ``minutes`` loaded minutes. The live detector (``twin.analysis.hotspots``, its last minutes)
    and a replay (``twin.replay.hotspot_feed``, every minute) both call this."""
    x = heat_w(mean_power_w, slope_k_per_s, c_j_per_k)
    r_est, r_heat = r_estimate(mean_temp_c, ref_c, offset_k, x, flow_factor, window)
    r = r_k_per_w(r_est) if callable(r_k_per_w) else r_k_per_w
    resid, model = residual_k(mean_temp_c, ref_c, offset_k, r * flow_factor, x)
    with np.errstate(all="ignore"):
        z = loaded_min(resid / sigma_k, x, minutes, min(minutes, MIN_RESIDUAL_MINUTES))
    return Watch(z, model, r_est, r_heat)


def fleet_drift(r_est: F64, r_heat: F64, group: NDArray[np.int64]) -> tuple[F64, F64, F64]:
    """Each GPU's re-estimated R against its group's median (:func:`group_median`), ``(M, N)``
    each: the median [K/W], the drift ``r_est / median - 1`` and what it amounts to at the
    GPU's heat, ``(r_est - median) x r_heat`` [K]."""
    fleet = group_median(r_est, group)
    with np.errstate(all="ignore"):
        return fleet, r_est / fleet - 1.0, (r_est - fleet) * r_heat
