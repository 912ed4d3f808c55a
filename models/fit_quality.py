"""Goodness of fit and data checks shared by every fitter in :mod:`models`.

Metrics compare a measured and a predicted series along axis 0 (time), one value per device on
the remaining axes, and skip every pair where either side is NaN (a gap). The ASHRAE
Guideline 14 style figures CV(RMSE) and NMBE are fractions here, not percent: 0.02 is 2 %.

:func:`data_problems` names what is wrong with a device's series before a fitter trusts it:
too few samples, a flat line, a stuck sensor, too many gaps. Fitters report those reasons with
``usable = False`` instead of returning a parameter fitted to bad data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "FitQuality",
    "cv_rmse",
    "data_problems",
    "fit_quality",
    "hold_gaps",
    "join_reasons",
    "mae",
    "mape",
    "nmbe",
    "rmse",
    "safe_pinv",
]

F64 = NDArray[np.float64]


def _pairs(measured: ArrayLike, predicted: ArrayLike) -> tuple[F64, F64, NDArray[np.bool_]]:
    """Broadcast both sides; return them with NaN pairs zeroed, and the validity mask."""
    m, p = np.broadcast_arrays(
        np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    )
    ok = np.isfinite(m) & np.isfinite(p)
    return np.where(ok, m, 0.0), np.where(ok, p, 0.0), ok


def _safe_div(num: F64, den: F64) -> F64:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)


def mae(measured: ArrayLike, predicted: ArrayLike) -> F64:
    r"""Mean absolute error along axis 0, NaN pairs skipped.

    Parameters
    ----------
    measured : array_like
        Measured series, time on axis 0, shape ``(T, ...)``. [any unit]
    predicted : array_like
        Predicted series, broadcastable to ``measured``. [same unit]

    Returns
    -------
    numpy.ndarray
        :math:`\frac{1}{n}\sum |\hat y - y|` per device, shape ``(...)``; NaN where no pair is
        valid. [same unit]

    Examples
    --------
    >>> float(mae([1.0, 2.0, np.nan], [1.5, 1.0, 3.0]))
    0.75
    """
    m, p, ok = _pairs(measured, predicted)
    return _safe_div(np.abs(p - m).sum(axis=0), ok.sum(axis=0).astype(float))


def rmse(measured: ArrayLike, predicted: ArrayLike) -> F64:
    r"""Root-mean-square error along axis 0, NaN pairs skipped.

    Parameters
    ----------
    measured, predicted : array_like
        As in :func:`mae`. [any unit]

    Returns
    -------
    numpy.ndarray
        :math:`\sqrt{\frac{1}{n}\sum (\hat y - y)^2}` per device. [same unit]

    Examples
    --------
    >>> float(rmse([0.0, 0.0], [3.0, 4.0]))
    3.5355339059327378
    """
    m, p, ok = _pairs(measured, predicted)
    return np.sqrt(_safe_div(((p - m) ** 2).sum(axis=0), ok.sum(axis=0).astype(float)))


def _mean_measured(m: F64, ok: NDArray[np.bool_]) -> F64:
    return _safe_div(m.sum(axis=0), ok.sum(axis=0).astype(float))


def cv_rmse(measured: ArrayLike, predicted: ArrayLike) -> F64:
    r"""Coefficient of variation of the RMSE: RMSE over the mean of the measured values.

    Parameters
    ----------
    measured, predicted : array_like
        As in :func:`mae`. [any unit]

    Returns
    -------
    numpy.ndarray
        CV(RMSE) per device, a fraction (0.3 is the 30 % of ASHRAE Guideline 14 for hourly
        data); NaN where the measured mean is 0. [1]

    Notes
    -----
    .. math:: CV(RMSE) = \sqrt{\tfrac{1}{n}\sum(\hat y_i - y_i)^2} \,/\, \bar y

    over the valid pairs. Meaningful for quantities with a natural zero (W, kW, K rise), not
    for temperatures in °C.

    References
    ----------
    docs/physics.md §8 (V4: CV(RMSE) ≤ 30 %, NMBE ≤ ±10 % hourly; Frontier twin < 2.7 %, ±2.5 %).

    Examples
    --------
    >>> round(float(cv_rmse([10.0, 10.0], [11.0, 9.0])), 3)
    0.1
    """
    m, p, ok = _pairs(measured, predicted)
    n = ok.sum(axis=0).astype(float)
    return _safe_div(np.sqrt(_safe_div(((p - m) ** 2).sum(axis=0), n)), _mean_measured(m, ok))


def nmbe(measured: ArrayLike, predicted: ArrayLike) -> F64:
    r"""Normalized mean bias error: positive when the model over-predicts.

    Parameters
    ----------
    measured, predicted : array_like
        As in :func:`mae`. [any unit]

    Returns
    -------
    numpy.ndarray
        NMBE per device, a fraction. [1]

    Notes
    -----
    .. math:: NMBE = \frac{\sum (\hat y_i - y_i)}{n\,\bar y}

    References
    ----------
    docs/physics.md §8 (V4, ASHRAE Guideline 14 style acceptance).

    Examples
    --------
    >>> round(float(nmbe([10.0, 10.0], [11.0, 10.0])), 3)
    0.05
    """
    m, p, ok = _pairs(measured, predicted)
    n = ok.sum(axis=0).astype(float)
    return _safe_div((p - m).sum(axis=0), n * _mean_measured(m, ok))


def mape(measured: ArrayLike, predicted: ArrayLike) -> F64:
    r"""Mean absolute percentage error, as a fraction; measured zeros are skipped.

    Parameters
    ----------
    measured, predicted : array_like
        As in :func:`mae`. [any unit]

    Returns
    -------
    numpy.ndarray
        :math:`\frac{1}{n}\sum |\hat y_i - y_i| / |y_i|` per device (0.02 is 2 %). [1]

    Examples
    --------
    >>> round(float(mape([100.0, 200.0, 0.0], [102.0, 196.0, 5.0])), 3)
    0.02
    """
    m, p, ok = _pairs(measured, predicted)
    ok = ok & (m != 0)
    rel = np.abs(p - m) / np.where(ok, np.abs(m), 1.0)
    return _safe_div(np.where(ok, rel, 0.0).sum(axis=0), ok.sum(axis=0).astype(float))


@dataclass(frozen=True)
class FitQuality:
    """Goodness of fit of one model per device, from :func:`fit_quality`.

    Attributes
    ----------
    mae, rmse : numpy.ndarray
        Mean absolute and root-mean-square error. [unit of the quantity]
    cv_rmse, nmbe, mape : numpy.ndarray
        Relative figures, fractions. [1]
    n_samples : numpy.ndarray
        Valid (measured, predicted) pairs. [1]
    """

    mae: F64
    rmse: F64
    cv_rmse: F64
    nmbe: F64
    mape: F64
    n_samples: NDArray[np.int64]


def fit_quality(measured: ArrayLike, predicted: ArrayLike) -> FitQuality:
    """Every metric of this module at once (see :class:`FitQuality`).

    Parameters
    ----------
    measured, predicted : array_like
        As in :func:`mae`. [any unit]
    """
    m, p = np.broadcast_arrays(
        np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    )
    n = (np.isfinite(m) & np.isfinite(p)).sum(axis=0)
    return FitQuality(
        mae=mae(m, p),
        rmse=rmse(m, p),
        cv_rmse=cv_rmse(m, p),
        nmbe=nmbe(m, p),
        mape=mape(m, p),
        n_samples=np.asarray(n, dtype=np.int64),
    )


_ROW_BLOCK = 256  # rows per block of the column statistics (bounds temporaries below 32 MB)


def _column_stats(
    v: F64, *, std: bool = True, runs: bool = True
) -> tuple[NDArray[np.int64], F64, NDArray[np.int64]]:
    """Per column: valid count, standard deviation and longest run of identical readings.

    The run is counted in intervals between consecutive equal finite readings. One pass over
    blocks of rows, so that a (3,600 x 10,000) array needs no full-size temporary; values are
    shifted by a per-column reference before squaring to keep the variance exact. With ``std``
    or ``runs`` False that figure is skipped (returned as zeros): a check that does not use it
    costs a count only.
    """
    n_t, n_c = v.shape
    n = np.zeros(n_c, dtype=np.int64)
    s1 = np.zeros(n_c)
    s2 = np.zeros(n_c)
    run = np.zeros(n_c, dtype=np.int32)
    longest = np.zeros(n_c, dtype=np.int32)
    if not std and not runs:  # count only
        ok = np.isfinite(v)
        n += n_t if ok.all() else ok.sum(axis=0)
        return n, s2, longest.astype(np.int64)
    head = v[: min(n_t, 64)]
    ok_head = np.isfinite(head)
    first = np.argmax(ok_head, axis=0) if n_t else np.zeros(n_c, dtype=np.int64)
    shift = head[first, np.arange(n_c)] if n_t else np.zeros(n_c)
    shift = np.where(np.isfinite(shift), shift, 0.0)  # first valid reading of the column
    for k0 in range(0, n_t, _ROW_BLOCK):
        blk = v[k0 : k0 + _ROW_BLOCK]
        dev = blk - shift
        ok = np.isfinite(dev)
        if ok.all():
            n += len(blk)
        else:
            n += ok.sum(axis=0)
            dev = np.where(ok, dev, 0.0)
        if std:
            s1 += dev.sum(axis=0)
            s2 += np.einsum("tn,tn->n", dev, dev)
        if not runs:
            continue
        same = np.zeros(blk.shape, dtype=np.int32)  # NaN != NaN, so a gap ends a run
        if k0:
            np.equal(blk, v[k0 - 1 : k0 - 1 + len(blk)], out=same, casting="unsafe")
        else:  # the first reading has no predecessor
            np.equal(blk[1:], blk[:-1], out=same[1:], casting="unsafe")
        for row in same:
            run += 1
            run *= row
            np.maximum(longest, run, out=longest)
    cnt = np.maximum(n, 1)
    var = np.maximum(s2 / cnt - (s1 / cnt) ** 2, 0.0)
    return n, np.sqrt(var), longest.astype(np.int64)


def _span(seconds: float) -> str:
    """A duration as a person says it: "40 s", "5 min", "2.5 h"."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def data_problems(
    values: ArrayLike,
    *,
    min_samples: int = 100,
    max_gap_frac: float = 0.2,
    flat_std: float = 1e-9,
    max_stuck_s: float | None = 600.0,
    dt_s: float = 1.0,
) -> list[str | None]:
    """What is wrong with each device's series, or None when nothing is.

    Parameters
    ----------
    values : array_like
        Readings on a regular time grid, time on axis 0, devices on axis 1 (a 1-D series is one
        device); NaN marks a missing reading. Shape ``(T, N)``. [any unit]
    min_samples : int, default 100
        Fewest valid readings a fit may use. [1]
    max_gap_frac : float, default 0.2
        Largest share of missing readings. [1]
    flat_std : float, default 1e-9
        A series whose standard deviation is below this is a flat line; set it to the sensor's
        resolution or noise floor (e.g. 0.05 K for a GPU temperature); 0 skips the check (for a
        reference that may legitimately hold still). [unit of values]
    max_stuck_s : float or None, default 600
        Longest run of identical consecutive readings before the sensor counts as stuck; None
        skips the check (for set points, which are legitimately constant). [s]
    dt_s : float, default 1.0
        Sample interval. [s]

    Returns
    -------
    list of (str or None)
        One entry per device: None, or the problems found, separated by ``"; "``, e.g.
        ``"gaps (35.0 % missing > 20 %)"``, ``"too few samples (40 s of readings < the
        100 s a fit needs; 40 < 100 at 1 s)"`` (the threshold in time, as it is stated),
        ``"flat line (std 0 < 0.05)"``,
        ``"stuck sensor (longest run of identical readings 900 s > 600 s)"``.

    Examples
    --------
    >>> data_problems(np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]), min_samples=2)
    [None, 'flat line (std 0 < 1e-09)']
    """
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[:, None]
    n_t = v.shape[0]
    n, std, run = _column_stats(v, std=flat_std > 0, runs=max_stuck_s is not None)
    gap = 1.0 - n / max(n_t, 1)
    run_s = run * dt_s
    few = n < min_samples
    gappy = gap > max_gap_frac
    flat = (n > 0) & (std < flat_std)
    stuck = np.zeros_like(few) if max_stuck_s is None else run_s > max_stuck_s
    out: list[str | None] = [None] * v.shape[1]
    for j in np.flatnonzero(few | gappy | flat | stuck):  # build strings for flagged columns only
        found: list[str] = []
        if few[j]:
            found.append(
                f"too few samples ({_span(int(n[j]) * dt_s)} of readings < the"
                f" {_span(min_samples * dt_s)} a fit needs; {int(n[j])} < {min_samples} at"
                f" {dt_s:g} s)"
            )
        if gappy[j]:
            found.append(f"gaps ({100 * gap[j]:.1f} % missing > {100 * max_gap_frac:g} %)")
        if flat[j]:
            found.append(f"flat line (std {std[j]:.3g} < {flat_std:g})")
        if stuck[j]:
            found.append(
                "stuck sensor (longest run of identical readings "
                f"{run_s[j]:g} s > {max_stuck_s:g} s)"
            )
        out[j] = "; ".join(found)
    return out


def join_reasons(*reasons: list[str | None]) -> list[str | None]:
    """Merge per-device reason lists element-wise: None where all are None, else ``"; "``-joined.

    Examples
    --------
    >>> join_reasons([None, "a"], ["power: b", None])
    ['power: b', 'a']
    """
    out: list[str | None] = []
    for parts in zip(*reasons, strict=True):
        found = [p for p in parts if p]
        out.append("; ".join(found) if found else None)
    return out


def hold_gaps(values: ArrayLike) -> F64:
    """Fill gaps (NaN) along axis 0 with the last valid reading (zero-order hold).

    Leading gaps take the first valid reading of their column; an all-NaN column stays NaN.
    This is how inputs such as power or a reference temperature are held over a missing
    sample, consistent with the zero-order-hold models of :mod:`models.gpu_thermal`.

    Parameters
    ----------
    values : array_like
        Readings, time on axis 0. [any unit]

    Returns
    -------
    numpy.ndarray
        The readings with gaps held; the input itself when it has none. [same unit]

    Examples
    --------
    >>> hold_gaps([np.nan, 1.0, np.nan, 3.0])
    array([1., 1., 1., 3.])
    """
    x = np.asarray(values, dtype=float)
    bad = ~np.isfinite(x)
    if not bad.any():
        return x
    n_t = x.shape[0]
    idx = np.where(bad, 0, np.arange(n_t).reshape((n_t,) + (1,) * (x.ndim - 1)))
    np.maximum.accumulate(idx, axis=0, out=idx)
    filled = np.take_along_axis(x, idx, axis=0)
    first = np.argmax(~bad, axis=0)
    first_val = np.take_along_axis(x, first[None], axis=0)[0]
    return np.where(np.isfinite(filled), filled, first_val)


def safe_pinv(stack: ArrayLike) -> F64:
    """Pseudo-inverse of each matrix in a ``(..., k, k)`` stack; NaN for a matrix holding NaN
    or infinity (a device with no usable data), instead of failing the whole stack.

    Examples
    --------
    >>> safe_pinv([[[2.0, 0.0], [0.0, 4.0]], [[np.nan, 0.0], [0.0, 1.0]]])[:, 0, 0]
    array([0.5, nan])
    """
    a = np.asarray(stack, dtype=np.float64)
    out = np.full(a.shape, np.nan)
    ok = np.isfinite(a).all(axis=(-2, -1))
    if ok.any():
        out[ok] = np.linalg.pinv(a[ok])
    return out
