"""GPU board power as a function of SM activity.

One function per named model, arrays in and arrays out (pvlib style). Every parameter accepts a
scalar or a numpy array; arrays broadcast against each other.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from models.fit_quality import _span, data_problems, join_reasons, safe_pinv

__all__ = [
    "CURVE_KINDS",
    "POWER_LAW",
    "SATURATING",
    "TWO_LEVEL",
    "UTIL_ONLY_KINDS",
    "PowerCurveFit",
    "UtilCurveFit",
    "curve_power_w",
    "fit_power_curve",
    "fit_saturating",
    "fit_two_level",
    "fit_util_power_curve",
    "gpu_power_w",
    "saturating_power_w",
    "two_level_power_w",
]

F64 = NDArray[np.float64]


def gpu_power_w(
    activity: ArrayLike,
    idle_w: ArrayLike,
    limit_w: ArrayLike,
    gamma: ArrayLike = 1.0,
    cap_w: ArrayLike | None = None,
) -> NDArray[np.float64]:
    r"""Board power of a GPU from its SM activity.

    Parameters
    ----------
    activity : array_like
        SM activity ``sm_active`` (DCGM_FI_PROF_SM_ACTIVE), clipped to [0, 1]. [1]
    idle_w : array_like
        Power at zero activity. [W]
    limit_w : array_like
        Power at full activity; the GPU's power limit (default: its TDP). [W]
    gamma : array_like, default 1.0
        Shape exponent of the activity curve; 1 is the linear RAPS model, fits give 0.7-1. [1]
    cap_w : array_like, optional
        Enforced power limit (``nvidia-smi -pl``) when it is below ``limit_w``; default
        ``limit_w``. [W]

    Returns
    -------
    numpy.ndarray
        Board power. [W]

    Notes
    -----
    .. math::

        P = \min\left(P_{idle} + (P_{limit} - P_{idle})\,\mathrm{clip}(a, 0, 1)^{\gamma},
                      P_{cap}\right)

    The clamp is where NVML reports the SW power cap clock-event reason (0x4).

    References
    ----------
    docs/physics.md §1.3 (shape: linear in utilization in ExaDigiT/RAPS ``raps/power.py``, with an
    optional concave exponent) and §9.1 (defaults).

    Examples
    --------
    >>> float(gpu_power_w(0.5, 75.0, 700.0))
    387.5
    """
    a = np.clip(np.asarray(activity, dtype=float), 0.0, 1.0)
    idle = np.asarray(idle_w, dtype=float)
    limit = np.asarray(limit_w, dtype=float)
    p = idle + (limit - idle) * a ** np.asarray(gamma, dtype=float)
    cap = limit if cap_w is None else np.asarray(cap_w, dtype=float)
    return np.minimum(p, cap)


# ---- fitting ------------------------------------------------------------------------------------

_GAMMA_RANGE = (0.5, 1.5)
_ACT_BINS = 1000  # activity bins for the sufficient statistics (bin width 0.001, the DCGM step)


@dataclass(frozen=True)
class PowerCurveFit:
    """Per-GPU result of :func:`fit_power_curve`; every array has shape ``(N,)``.

    A parameter the data cannot identify is NaN and ``reason`` says why; ``usable`` needs
    all three. A GPU seen only near full load (training) often gets its limit but not its
    idle power.

    Attributes
    ----------
    idle_w : numpy.ndarray
        Power at zero activity, :math:`P_{idle}`. [W]
    limit_w : numpy.ndarray
        Effective power at full activity, :math:`P_{idle} + \\text{span}` (above the enforced
        limit when the GPU clamps before activity 1). [W]
    gamma : numpy.ndarray
        Shape exponent. [1]
    idle_stderr_w, limit_stderr_w, gamma_stderr : numpy.ndarray
        Standard errors. [W], [W], [1]
    mae_w : numpy.ndarray
        Mean absolute error of the fitted curve (with the clamp) over every valid sample; NaN
        when the fit was asked not to compute it (``in_sample_mae=False``). [W]
    n_samples : numpy.ndarray
        Samples used for the shape fit (valid and below the clamp). [1]
    activity_range : numpy.ndarray
        Spread of the activity seen, 1st to 99th percentile. [1]
    usable : numpy.ndarray
        False where the data cannot identify the curve. [bool]
    reason : list of (str or None)
        Why a fit is unusable, None where it is usable.
    """

    idle_w: F64
    limit_w: F64
    gamma: F64
    idle_stderr_w: F64
    limit_stderr_w: F64
    gamma_stderr: F64
    mae_w: F64
    n_samples: NDArray[np.int64]
    activity_range: F64
    usable: NDArray[np.bool_]
    reason: list[str | None]


_COL_BLOCK = 256  # GPUs per block of the binning and MAE passes (cache-sized bincounts)


def _bin_stats(
    act: F64, power: F64, use: NDArray[np.bool_]
) -> tuple[NDArray[np.int64], F64, F64, F64, F64, F64]:
    """Per (GPU, activity bin) sufficient statistics of the samples in ``use``.

    Returns the GPU index, count, mean activity, mean power and within-bin sum of squares of
    power of every occupied bin (sorted by GPU, then bin), and per GPU the total count.
    ``act`` must already lie in [0, 1] (NaN allowed).

    One pass over blocks of ``_COL_BLOCK`` GPUs, so the bincount targets stay cache-sized and
    no full-size temporaries are made; samples outside ``use`` go to a spare bin that is
    dropped. Within a bin the samples are summed in time order, as a single bincount would.
    """
    n_gpu = act.shape[1]
    nb = _ACT_BINS + 1
    parts = []
    total = np.zeros(n_gpu)
    for j0 in range(0, n_gpu, _COL_BLOCK):
        j1 = min(j0 + _COL_BLOCK, n_gpu)
        nc = j1 - j0
        a = act[:, j0:j1]
        p = power[:, j0:j1]
        u = use[:, j0:j1]
        size = nc * nb
        key = np.rint(a * _ACT_BINS)
        key += (np.arange(nc) * nb).astype(float)
        key = np.where(u, key, float(size)).astype(np.intp).ravel()
        a = np.ascontiguousarray(a).ravel()
        p = np.ascontiguousarray(p).ravel()
        cnt = np.bincount(key, minlength=size + 1)[:size]
        s_a = np.bincount(key, weights=a, minlength=size + 1)[:size]
        s_p = np.bincount(key, weights=p, minlength=size + 1)[:size]
        s_pp = np.bincount(key, weights=p * p, minlength=size + 1)[:size]
        occ = np.flatnonzero(cnt)
        w = cnt[occ].astype(float)
        a_m = s_a[occ] / w
        p_m = s_p[occ] / w
        g = occ // nb
        wss = np.maximum(s_pp[occ] - w * p_m**2, 0.0)
        total[j0:j1] = np.bincount(g, weights=w, minlength=nc)
        parts.append((g + j0, w, a_m, p_m, wss))
    if not parts:
        e = np.zeros(0)
        return np.zeros(0, dtype=np.int64), e, e, e, e, total
    gpu, w, a_m, p_m, wss = (np.concatenate(x) for x in zip(*parts, strict=True))
    return gpu.astype(np.int64), w, a_m, p_m, wss, total


class _Bins:
    """The occupied (GPU, activity bin) pairs of some GPUs, for the least squares in gamma.

    The pairs are sorted by GPU, so per-GPU sums are ``np.add.reduceat`` over contiguous
    segments; the gamma-free sums (of w, w p, w p^2) are made once.
    """

    def __init__(self, gpu: NDArray[np.int64], w: F64, ln_a: F64, p_m: F64, n_gpu: int):
        self.n_gpu = n_gpu
        self.gpu, self.w, self.ln_a, self.p_m = gpu, w, ln_a, p_m
        n_pair = np.bincount(gpu, minlength=n_gpu)
        self.has = n_pair > 0
        self.starts = (np.cumsum(n_pair) - n_pair)[self.has]
        self.wp = w * p_m
        self.sw, self.sp, self.spp = self.seg([w, self.wp, self.wp * p_m])

    def subset(self, sel: NDArray[np.bool_]) -> _Bins:
        """The pairs of the GPUs where ``sel`` is True, renumbered 0..sel.sum()-1."""
        keep = sel[self.gpu]
        new_id = np.cumsum(sel) - 1
        return _Bins(
            new_id[self.gpu[keep]], self.w[keep], self.ln_a[keep], self.p_m[keep], int(sel.sum())
        )

    def seg(self, v: F64 | list[F64]) -> F64:
        """Per-GPU sums over the last axis of ``v`` (pairs), shape ``v.shape[:-1] + (N,)``;
        a list of per-pair arrays is summed one by one (no stacked copy of them)."""
        if isinstance(v, list):
            out = np.zeros((len(v), self.n_gpu))
            if self.starts.size:
                for i, row in enumerate(v):
                    out[i, self.has] = np.add.reduceat(row, self.starts)
            return out
        out = np.zeros((*v.shape[:-1], self.n_gpu))
        if self.starts.size:
            out[..., self.has] = np.add.reduceat(v, self.starts, axis=-1)
        return out

    def ls(self, gamma: F64 | float, x: F64 | None = None) -> tuple[F64, F64, F64]:
        """Weighted LS of bin-mean power on [1, a^gamma] per GPU: (idle, span, between SSE).

        ``gamma`` is a scalar (one candidate for every GPU) or one value per GPU; ``x``, if
        given, is ``a^gamma`` per pair already (:meth:`powers`) and ``gamma`` is not used.
        """
        buf = np.empty((3 if x is not None else 4, self.w.size))
        wx = buf[0]
        if x is None:
            g = gamma if np.ndim(gamma) == 0 else np.asarray(gamma)[self.gpu]
            x = buf[3]
            np.multiply(g, self.ln_a, out=x)
            np.exp(x, out=x)  # a^gamma; a = 0 gives exp(-inf) = 0
        np.multiply(self.w, x, out=wx)
        np.multiply(wx, x, out=buf[1])
        np.multiply(wx, self.p_m, out=buf[2])
        sx, sxx, sxp = self.seg(buf[:3])
        sw, sp, spp = self.sw, self.sp, self.spp
        det = sw * sxx - sx * sx
        with np.errstate(divide="ignore", invalid="ignore"):
            span = np.where(det > 0, (sw * sxp - sx * sp) / det, np.nan)
            idle = (sp - span * sx) / sw
        sse = spp - idle * sp - span * sxp
        return idle, span, np.where(np.isfinite(sse), np.maximum(sse, 0.0), np.inf)


def _grid_powers(bins: _Bins, cand: F64) -> Iterator[F64]:
    """``a^gamma`` per pair for each row of the candidate grid ``cand`` (K, N) in turn.

    Where a GPU's candidates are evenly spaced (all but those clipped at the edge of the
    gamma range), ``a^(g + h) = a^g a^h``: one multiplication per pair and candidate instead
    of an exponential (the grid search's largest cost, bench/README.md); the rest are
    exponentiated exactly. Equal to ``exp(gamma ln a)`` to a few ulp. The yielded array is
    updated in place for the next candidate."""
    gpu, ln_a = bins.gpu, bins.ln_a
    with np.errstate(invalid="ignore"):  # a = 0: ln a = -inf, and a^g = 0 for every g
        x = np.exp(cand[0][gpu] * ln_a)
        if cand.shape[0] < 2:
            yield x
            return
        d = np.diff(cand, axis=0)
        even = np.all(np.abs(d - d[0]) <= 1e-12, axis=0)
        odd = np.flatnonzero(~even[gpu])  # pairs of the GPUs stepped unevenly
        f = np.exp(np.where(even, d[0], 0.0)[gpu] * ln_a)
        f[ln_a == -np.inf] = 0.0
        yield x
        for k in range(1, cand.shape[0]):
            x *= f
            if odd.size:
                x[odd] = np.exp(cand[k][gpu[odd]] * ln_a[odd])
            yield x


def _parabola_best(cand: F64, sse: F64) -> tuple[F64, NDArray[np.intp]]:
    """Best gamma per GPU from candidates ``cand`` (K, N) and their SSE: the grid minimum,
    refined by a parabola through it and its neighbours unless it sits at the grid's edge.
    Returns it and the index of the grid minimum."""
    n = sse.shape[1]
    k = np.argmin(sse, axis=0)
    kk = np.clip(k, 1, cand.shape[0] - 2)
    cols = np.arange(n)
    y0, y1, y2 = sse[kk - 1, cols], sse[kk, cols], sse[kk + 1, cols]
    with np.errstate(divide="ignore", invalid="ignore"):  # a GPU with no data: NaN, refused
        den = y0 - 2 * y1 + y2
        shift = np.where(den > 0, 0.5 * (y0 - y2) / den, 0.0)
    g_k = cand[kk, cols] + np.clip(shift, -1.0, 1.0) * (cand[kk + 1, cols] - cand[kk, cols])
    at_edge = (k == 0) | (k == cand.shape[0] - 1)
    return np.clip(np.where(at_edge, cand[k, cols], g_k), *_GAMMA_RANGE), k


def _fit_on_bins(bins: _Bins) -> tuple[F64, F64, F64]:
    """Idle, span and gamma per GPU: gamma on a grid, the other two in closed form for each.

    Coarse grid of step 0.05, refined by a parabola, then a fine grid of step 0.005 over
    +-0.05 around the coarse optimum, refined again. The fine grid is searched over +-0.015
    first; the parabola then uses the same three points as on the full +-0.05 grid wherever
    the minimum lies inside that window, and the GPUs whose minimum falls on the window's edge
    are searched again over the full grid.
    """
    grid_g = np.arange(_GAMMA_RANGE[0], _GAMMA_RANGE[1] + 1e-9, 0.05)
    coarse = np.broadcast_to(grid_g[:, None], (grid_g.size, bins.n_gpu))

    def sse_of(b: _Bins, cand: F64) -> F64:
        return np.stack([b.ls(0.0, x)[2] for x in _grid_powers(b, cand)])

    best, _ = _parabola_best(coarse, sse_of(bins, coarse))
    step = 0.005
    offs = np.arange(-3, 4) * step
    cand = np.clip(best[None, :] + offs[:, None], *_GAMMA_RANGE)
    fine, k = _parabola_best(cand, sse_of(bins, cand))
    wide = (k == 0) | (k == offs.size - 1)
    if wide.any():
        sub = bins.subset(wide)
        offs = np.arange(-10, 11) * step
        cand = np.clip(best[None, wide] + offs[:, None], *_GAMMA_RANGE)
        fine[wide] = _parabola_best(cand, sse_of(sub, cand))[0]
    idle, span, _ = bins.ls(fine)
    return idle, span, fine


def _curve_mae(act: F64, power: F64, idle: F64, limit: F64, gamma: F64, cap: F64) -> F64:
    """MAE of :func:`gpu_power_w` (with the clamp at ``cap``) against ``power`` per GPU.

    The same figure as ``mae(power, gpu_power_w(act, idle, limit, gamma, cap))``, over every
    sample, computed over blocks of GPUs so no full-size temporary is made; ``act`` must already
    lie in [0, 1]. ``a ** gamma`` is taken as ``exp(gamma ln a)`` (equal to rounding).
    """
    n_t, n_gpu = act.shape
    cap = np.broadcast_to(cap, (n_gpu,) if cap.ndim < 2 else (n_t, n_gpu))
    out = np.empty(n_gpu)
    for j0 in range(0, n_gpu, _COL_BLOCK):
        j1 = min(j0 + _COL_BLOCK, n_gpu)
        with np.errstate(divide="ignore", invalid="ignore"):
            model = np.log(act[:, j0:j1])
            model *= gamma[j0:j1]
            np.exp(model, out=model)
            model *= limit[j0:j1] - idle[j0:j1]
            model += idle[j0:j1]
            np.minimum(model, cap[..., j0:j1], out=model)
            model -= power[:, j0:j1]
            ok = np.isfinite(model)  # finite model and power: the pairs mae() counts
            np.abs(model, out=model)
            n = ok.sum(axis=0)
            err = np.where(ok, model, 0.0).sum(axis=0)
            out[j0:j1] = np.where(n > 0, err / np.maximum(n, 1), np.nan)
    return out


def fit_power_curve(
    activity: ArrayLike,
    power_w: ArrayLike,
    limit_w: ArrayLike | None = None,
    *,
    min_samples: int = 100,
    min_range: float = 0.1,
    min_levels: int = 3,
    max_gap_frac: float = 0.2,
    max_stuck_s: float | None = None,
    max_rel_stderr: float = 0.01,
    idle_reach: float = 0.05,
    min_idle_samples: int = 10,
    dt_s: float = 1.0,
    in_sample_mae: bool = True,
) -> PowerCurveFit:
    r"""Fit idle power, effective limit and shape exponent of :func:`gpu_power_w` per GPU.

    Parameters
    ----------
    activity : array_like
        SM activity (``sm_active``; utilization / 100 where SM activity is absent), shape
        ``(T, N)``, or ``(T,)`` for one GPU; NaN for a missing reading. [1]
    power_w : array_like
        Measured board power, shape ``(T, N)`` or ``(T,)``; NaN for a missing reading. [W]
    limit_w : array_like, optional
        Enforced power limit per GPU (``power_limit_w``), shape ``(N,)`` or ``(T, N)``;
        samples at or above 99 % of it sit on the clamp and are left out of the shape fit.
        [W]
    min_samples : int, default 100
        Fewest samples below the clamp. [1]
    min_range : float, default 0.1
        Smallest activity spread (1st to 99th percentile) to attempt a fit at all; whether the
        spread identifies idle and limit is then judged by their standard errors (a GPU whose
        activity wanders over 0.1-0.3 at night pins the idle power well). [1]
    min_levels : int, default 3
        Fewest distinct activity levels (0.05-wide bins holding at least 1 % of the samples).
    max_gap_frac : float, default 0.2
        Largest share of missing power or activity readings. [1]
    max_stuck_s : float or None, default None
        Longest run of identical power readings before the sensor counts as stuck; None skips
        the check (a GPU at its clamp can read the same power for a long time). [s]
    max_rel_stderr : float, default 0.01
        Largest relative standard error of the idle power and of the limit. [1]
    idle_reach, min_idle_samples : float and int, default 0.05 and 10
        The idle power is only identified from a GPU that spent at least ``min_idle_samples``
        samples at an activity of ``idle_reach`` or less (the idle threshold of docs/physics.md
        §6.3, SM activity < 5 %): the shape a^gamma is an assumption near zero, so a curve
        seen only from 0.1 up is not extrapolated down to idle, however small its standard
        error.
    dt_s : float, default 1.0
        Sample interval, for the stuck-sensor check. [s]
    in_sample_mae : bool, default True
        Compute ``mae_w`` (one more pass over every sample); a caller that scores the curve
        on held-out data instead can skip it.

    Returns
    -------
    PowerCurveFit

    Notes
    -----
    Model (docs/physics.md §1.3): :math:`P = P_{idle} + (P_{limit} - P_{idle})\,a^{\gamma}`,
    clamped at the enforced limit. For a fixed :math:`\gamma` the model is linear in
    :math:`(P_{idle}, \text{span})`, so :math:`\gamma` is searched on a grid over 0.5..1.5
    (step 0.05, then 0.005 around the best point, each refined by a parabola through the three
    best points) with closed-form weighted least squares for the other two, all GPUs at once.
    The data enter through sufficient statistics per GPU and 0.001-wide activity bin (count,
    mean activity, mean and sum of squares of power), so the cost of the search does not grow
    with the number of samples.

    The curve is refused (``usable`` False) when the activity does not span enough range or
    levels, when the GPU was never near idle, and when the standard error of idle or limit
    exceeds ``max_rel_stderr``: a training GPU that sits at ~0.9 activity with a few
    checkpoint dips identifies the limit well but the idle power only through
    :math:`\gamma`. The standard errors are heteroscedasticity-consistent (the noise of a
    board-power reading grows with the power).

    References
    ----------
    docs/physics.md §1.3 (shape, linear RAPS model with an optional exponent, clamp at the
    enforced limit) and §9.1 (defaults: idle ~10 % of TDP, :math:`\gamma` 0.7-1).

    Examples
    --------
    >>> a = np.tile(np.linspace(0.0, 1.0, 101), 3)[:, None]
    >>> p = gpu_power_w(a, 75.0, 700.0, 0.85)
    >>> fit = fit_power_curve(a, p)
    >>> fit.idle_w.round(2), fit.limit_w.round(2), fit.gamma.round(3)
    (array([75.]), array([700.]), array([0.85]))
    """
    act = np.asarray(activity, dtype=float)
    if act.ndim == 1:
        act = act[:, None]
    p_in = np.asarray(power_w, dtype=float)
    p_in = p_in[:, None] if p_in.ndim == 1 and len(p_in) == len(act) else p_in  # one GPU
    power = np.broadcast_to(p_in, act.shape)
    n_gpu = act.shape[1]
    act = np.clip(act, 0.0, 1.0)

    reasons = _input_problems(act, power, min_samples, max_gap_frac, max_stuck_s, dt_s)
    (gpu, w, a_m, p_m, wss, ln_a), stage1, changed = _usable_bins(act, power, limit_w)
    total = np.bincount(gpu, weights=w, minlength=n_gpu)
    n_used = np.rint(total).astype(np.int64)

    levels, near_idle, q01, spread = _excitation(gpu, w, a_m, total, n_gpu, idle_reach)
    need = (min_samples, min_range, min_levels)
    _excitation_reasons(reasons, n_used, spread, levels, *need, dt_s=dt_s)

    bins = _Bins(gpu, w, ln_a, p_m, n_gpu)
    if stage1 is None:
        idle, span, gamma = _fit_on_bins(bins)
    else:
        idle, span, gamma = stage1
        if changed.any():
            idle[changed], span[changed], gamma[changed] = _fit_on_bins(bins.subset(changed))
    limit_eff = idle + span

    se_idle, se_lim, se_g = _hc1_stderr(bins, a_m, p_m, wss, idle, span, gamma, total)
    scored, idle_ok, limit_ok = _judge(
        reasons,
        idle,
        span,
        gamma,
        (se_idle, se_lim),
        near_idle,
        q01,
        idle_reach=idle_reach,
        min_idle_samples=min_idle_samples,
        max_rel_stderr=max_rel_stderr,
    )
    usable = np.array([r is None for r in reasons])
    cap = limit_eff if limit_w is None else np.asarray(limit_w, dtype=float)
    mae_w = np.full(n_gpu, np.nan)
    if in_sample_mae:
        mae_w = np.where(scored, _curve_mae(act, power, idle, limit_eff, gamma, cap), np.nan)

    return PowerCurveFit(
        idle_w=np.where(idle_ok, idle, np.nan),
        limit_w=np.where(limit_ok, limit_eff, np.nan),
        gamma=np.where(usable, gamma, np.nan),
        idle_stderr_w=se_idle,
        limit_stderr_w=se_lim,
        gamma_stderr=se_g,
        mae_w=mae_w,
        n_samples=n_used.astype(np.int64),
        activity_range=spread,
        usable=usable,
        reason=reasons,
    )


def _input_problems(
    act: F64,
    power: F64,
    min_samples: int,
    max_gap_frac: float,
    max_stuck_s: float | None,
    dt_s: float,
) -> list[str | None]:
    """Per GPU, what is wrong with its power and activity readings (None: nothing)."""

    def prefix(what: str, reasons: list[str | None]) -> list[str | None]:
        return [f"{what}: {r}" if r else None for r in reasons]

    common = {"min_samples": min_samples, "max_gap_frac": max_gap_frac, "dt_s": dt_s}
    return join_reasons(
        prefix("power", data_problems(power, flat_std=0.1, max_stuck_s=max_stuck_s, **common)),
        prefix("activity", data_problems(act, flat_std=1e-4, max_stuck_s=None, **common)),
    )


def _excitation(
    gpu: NDArray[np.int64], w: F64, a_m: F64, total: F64, n_gpu: int, idle_reach: float
) -> tuple[NDArray[np.int64], F64, F64, F64]:
    """Per GPU: distinct 0.05-wide activity levels (holding at least 1 % of its samples), the
    samples at activity <= ``idle_reach``, and the 1st percentile and the 1st-99th
    percentile spread of its activity (on the 0.001 grid of the bins).

    The pairs come sorted by GPU, then activity bin (:func:`_bin_stats`), so a percentile is
    the bin of the first pair whose running count reaches it: one cumulative sum over the
    pairs and a binary search per GPU, instead of a cumulative count over every GPU's 1,001
    bins (an (N, 1001) array, 80 MB at 10,000 GPUs). The counts are whole numbers, so the sums
    are exact either way."""
    lvl = np.bincount(
        gpu * 21 + np.rint(a_m * 20).astype(np.int64), weights=w, minlength=21 * n_gpu
    ).reshape(n_gpu, 21)
    levels = (lvl >= np.maximum(3.0, 0.01 * total)[:, None]).sum(axis=1)
    act_bin = np.rint(a_m * _ACT_BINS).astype(np.int64)
    at_idle = act_bin <= round(idle_reach * _ACT_BINS)
    near_idle = np.bincount(gpu, weights=np.where(at_idle, w, 0.0), minlength=n_gpu)
    running = np.cumsum(w)
    before = np.cumsum(total) - total  # samples of the GPUs before each one
    q = []
    for frac in (0.01, 0.99):
        first = np.searchsorted(running, before + frac * total, side="left")
        b = act_bin[np.minimum(first, max(act_bin.size - 1, 0))] if act_bin.size else first
        q.append(np.where(total > 0, b / _ACT_BINS, 0.0))
    q01, q99 = q
    spread = np.where(total > 0, q99 - q01, 0.0)
    return levels, near_idle, q01, spread


def _hc1_stderr(
    bins: _Bins,
    a_m: F64,
    p_m: F64,
    wss: F64,
    idle: F64,
    span: F64,
    gamma: F64,
    total: F64,
) -> tuple[F64, F64, F64]:
    """Standard errors of idle, limit and gamma per GPU from J = [1, a^g, span a^g ln a] on the
    bins, heteroscedasticity-consistent (White's sandwich, HC1): G^-1 M G^-1 n/(n-3) with
    G = sum_b w_b J_b J_b^T and M = sum_b S_b J_b J_b^T, S_b the sum of squared residuals of
    bin b. Board-power noise grows with power (a reading error relative to it), so one pooled
    variance would take the noise of the high-power samples for that of the idle ones and
    overstate the idle error several times over. J is constant across a 0.001-wide bin."""
    gpu, w, ln_a, n_gpu = bins.gpu, bins.w, bins.ln_a, bins.n_gpu
    x = np.exp(gamma[gpu] * ln_a)
    lx = x * np.where(a_m > 0, ln_a, 0.0) * span[gpu]
    res_b = p_m - idle[gpu] - span[gpu] * x
    s_b = wss + w * res_b * res_b

    def gram_of(weight: F64, sum_weight: F64) -> F64:
        wx, wlx = weight * x, weight * lx
        s = bins.seg([wx, wlx, wx * x, wx * lx, wlx * lx])
        g = np.empty((n_gpu, 3, 3))
        g[:, 0, 0] = sum_weight
        g[:, 0, 1] = g[:, 1, 0] = s[0]
        g[:, 0, 2] = g[:, 2, 0] = s[1]
        g[:, 1, 1] = s[2]
        g[:, 1, 2] = g[:, 2, 1] = s[3]
        g[:, 2, 2] = s[4]
        return g

    with np.errstate(invalid="ignore"):  # a GPU with no data: NaN, refused by the caller
        g_inv = safe_pinv(gram_of(w, bins.sw))
        meat = gram_of(s_b, bins.seg(s_b[None])[0])
        cov = g_inv @ meat @ g_inv
        cov *= (total / np.maximum(total - 3.0, 1.0))[:, None, None]
    se_idle = np.sqrt(np.maximum(cov[:, 0, 0], 0.0))
    se_lim = np.sqrt(np.maximum(cov[:, 0, 0] + cov[:, 1, 1] + 2 * cov[:, 0, 1], 0.0))
    se_g = np.sqrt(np.maximum(cov[:, 2, 2], 0.0))
    return se_idle, se_lim, se_g


def _below_the_clamp(
    lim: F64, stats: tuple[NDArray[np.int64], F64, F64, F64, F64, F64], n_gpu: int
) -> tuple[tuple[NDArray[np.int64], F64, F64, F64, F64, F64], tuple[F64, F64, F64], NDArray]:
    """The bins below the clamp of a fixed limit ``lim``, the stage-1 fit, and the GPUs whose
    set of bins stage 2 changed (only those are fitted again).

    Samples on the clamp are left out by their activity, not by their measured power:
    dropping the readings that noise pushed over 0.99 x the limit would keep only the low
    ones near it and bend the curve (and the idle power it extrapolates) down. Stage 1 fits
    the bins whose mean power is below 0.99 x the limit; stage 2 keeps the bins whose
    activity lies below where that curve reaches it. ``stats``: (gpu, w, a_m, p_m, wss,
    ln_a) of the bins."""
    gpu, w, a_m, p_m, wss, ln_a = stats
    cap = 0.99 * np.broadcast_to(lim, (n_gpu,))
    cap = np.where(np.isfinite(cap), cap, np.inf)  # a GPU that never reported its limit
    keep1 = p_m < cap[gpu]
    idle1, span1, gamma1 = _fit_on_bins(_Bins(gpu[keep1], w[keep1], ln_a[keep1], p_m[keep1], n_gpu))
    with np.errstate(all="ignore"):
        a_cap = ((cap - idle1) / span1) ** (1.0 / gamma1)
    ok1 = np.isfinite(idle1) & (span1 > 0) & np.isfinite(gamma1)
    keep = np.where(ok1[gpu], a_m < np.where(np.isnan(a_cap), 0.0, a_cap)[gpu], keep1)
    changed = np.bincount(gpu, weights=keep != keep1, minlength=n_gpu) > 0
    kept = (gpu[keep], w[keep], a_m[keep], p_m[keep], wss[keep], ln_a[keep])
    return kept, (idle1, span1, gamma1), changed


def _excitation_reasons(
    reasons: list[str | None],
    n_used: NDArray[np.int64],
    spread: F64,
    levels: NDArray[np.int64],
    min_samples: int,
    min_range: float,
    min_levels: int,
    dt_s: float = 1.0,
) -> None:
    """Set the reason of each GPU with clean data whose samples do not excite the curve
    enough (too few, too narrow a range, too few levels)."""
    clean = np.array([r is None for r in reasons])
    weak = clean & ((n_used < min_samples) | (spread < min_range) | (levels < min_levels))
    for j in np.flatnonzero(weak):  # reason strings only
        why = []
        if n_used[j] < min_samples:
            why.append(
                f"too few samples below the clamp ({_span(int(n_used[j]) * dt_s)} of readings <"
                f" {_span(min_samples * dt_s)}; {int(n_used[j])} < {min_samples} at {dt_s:g} s)"
            )
        if spread[j] < min_range:
            why.append(f"activity range {spread[j]:.2f} < {min_range:g}: curve not identifiable")
        if levels[j] < min_levels:
            why.append(f"{int(levels[j])} distinct activity levels < {min_levels}")
        reasons[j] = "; ".join(why)


def _identification_reason(
    j: int,
    *,
    fitted: NDArray[np.bool_],
    reached: NDArray[np.bool_],
    idle_ok: NDArray[np.bool_],
    limit_ok: NDArray[np.bool_],
    gamma_ok: NDArray[np.bool_],
    near_idle: F64,
    q01: F64,
    idle: F64,
    limit_eff: F64,
    se_idle: F64,
    se_lim: F64,
    idle_reach: float,
    min_idle_samples: int,
    max_rel_stderr: float,
) -> str | None:
    """Why GPU ``j``'s fitted curve is refused (None: it is not)."""
    why = []
    if not fitted[j]:
        why.append("fit failed (idle or span not positive)")
    elif not reached[j]:
        why.append(
            f"idle power not identifiable ({int(near_idle[j])} samples at activity <= "
            f"{idle_reach:g}, fewer than {min_idle_samples}: the curve is not "
            f"extrapolated from {q01[j]:.2f} down to idle)"
        )
    elif not idle_ok[j]:
        why.append(
            f"idle power not identifiable (standard error {100 * se_idle[j] / idle[j]:.1f}"
            f" % > {100 * max_rel_stderr:g} %)"
        )
    if fitted[j] and not limit_ok[j]:
        why.append(
            f"limit not identifiable (standard error "
            f"{100 * se_lim[j] / limit_eff[j]:.1f} % > {100 * max_rel_stderr:g} %)"
        )
    if fitted[j] and not gamma_ok[j]:
        why.append(f"gamma at the edge of {_GAMMA_RANGE[0]}..{_GAMMA_RANGE[1]}")
    return "; ".join(why) if why else None


def _usable_bins(
    act: F64, power: F64, limit_w: ArrayLike | None
) -> tuple[tuple[NDArray[np.int64], F64, F64, F64, F64, F64], tuple[F64, F64, F64] | None, NDArray]:
    """The (GPU, activity bin) statistics (gpu, w, a_m, p_m, wss, ln_a) of the samples below
    the clamp, with the stage-1 fit and the GPUs stage 2 changed when the limit is fixed
    (:func:`_below_the_clamp`; None and none changed otherwise)."""
    n_gpu = act.shape[1]
    use = np.isfinite(act) & np.isfinite(power)
    lim = None if limit_w is None else np.asarray(limit_w, dtype=float)
    if lim is not None and lim.ndim == 2:  # a limit that changes: clamped samples one by one
        use &= ~(power >= 0.99 * lim)
    gpu, w, a_m, p_m, wss, _ = _bin_stats(act, power, use)
    with np.errstate(divide="ignore"):
        ln_a = np.log(a_m)
    if lim is None or lim.ndim == 2:
        return (gpu, w, a_m, p_m, wss, ln_a), None, np.zeros(n_gpu, dtype=bool)
    return _below_the_clamp(lim, (gpu, w, a_m, p_m, wss, ln_a), n_gpu)


def _judge(
    reasons: list[str | None],
    idle: F64,
    span: F64,
    gamma: F64,
    stderr: tuple[F64, F64],
    near_idle: F64,
    q01: F64,
    *,
    idle_reach: float,
    min_idle_samples: int,
    max_rel_stderr: float,
) -> tuple[NDArray[np.bool_], NDArray[np.bool_], NDArray[np.bool_]]:
    """Which fitted values identify what (see :func:`fit_power_curve`'s notes); sets the
    reason of each GPU with clean data whose curve is refused. Returns the GPUs whose curve
    was fitted on clean data, those whose idle power and those whose limit is usable."""
    se_idle, se_lim = stderr
    limit_eff = idle + span
    data_ok = np.array([r is None for r in reasons])
    fitted = np.isfinite(idle) & np.isfinite(span) & (span > 0) & (idle > 0)
    reached = near_idle >= min_idle_samples
    idle_ok = data_ok & fitted & reached & (se_idle <= max_rel_stderr * idle)
    limit_ok = data_ok & fitted & (se_lim <= max_rel_stderr * limit_eff)
    gamma_ok = (gamma > _GAMMA_RANGE[0] + 1e-9) & (gamma < _GAMMA_RANGE[1] - 1e-9)
    for j in np.flatnonzero(data_ok & ~(fitted & idle_ok & limit_ok & gamma_ok)):
        reasons[j] = _identification_reason(
            j,
            fitted=fitted,
            reached=reached,
            idle_ok=idle_ok,
            limit_ok=limit_ok,
            gamma_ok=gamma_ok,
            near_idle=near_idle,
            q01=q01,
            idle=idle,
            limit_eff=limit_eff,
            se_idle=se_idle,
            se_lim=se_lim,
            idle_reach=idle_reach,
            min_idle_samples=min_idle_samples,
            max_rel_stderr=max_rel_stderr,
        )
    return data_ok & fitted, idle_ok & gamma_ok, limit_ok & gamma_ok


# ---- curves in GPU-Util (utilization.gpu) -------------------------------------------------------
#
# GPU-Util is not a load level: NVML defines it as the "percent of time over the past sample
# period during which one or more kernels was executing on the GPU" (nvmlUtilization_t.gpu), so
# one tiny kernel kept in flight reads 100 % at a fraction of full power. Power in util is near
# on/off (docs/physics.md §1.3.1); the two curves below say so, and they apply to util input only.

#: the curve families, by the code ``curve_kind`` stores (index into this tuple)
CURVE_KINDS = ("power_law", "two_level", "saturating")
POWER_LAW, TWO_LEVEL, SATURATING = 0, 1, 2
#: kinds fitted on GPU-Util, never to be fed SM activity
UTIL_ONLY_KINDS = (TWO_LEVEL, SATURATING)

_UTIL_BINS = 100  # 1 %-wide bins: NVML reports utilization.gpu in whole percent
_THRESHOLD_MAX = 0.5  # a GPU busy below 50 % GPU-Util is still "on": thresholds searched 0..0.5
_U0_GRID = np.geomspace(0.005, 2.0, 61)  # saturation scale of the saturating curve [1]


def two_level_power_w(
    util: ArrayLike, idle_w: ArrayLike, busy_w: ArrayLike, threshold: ArrayLike
) -> NDArray[np.float64]:
    r"""Board power from GPU-Util as two levels: idle at or below ``threshold``, busy above.

    Parameters
    ----------
    util : array_like
        GPU-Util (``util_pct`` / 100), 0..1; NaN gives NaN. [1]
    idle_w, busy_w : array_like
        Mean power with no kernel running and with kernels running. [W]
    threshold : array_like
        Util above which the GPU counts as busy. [1]

    Returns
    -------
    numpy.ndarray
        :math:`P = P_{idle} + (P_{busy} - P_{idle})\,[u > u_t]`. [W]

    Examples
    --------
    >>> two_level_power_w([0.0, 0.9], 60.0, 290.0, 0.05).tolist()
    [60.0, 290.0]
    """
    u = np.asarray(util, dtype=float)
    p = np.where(u > np.asarray(threshold, dtype=float), busy_w, idle_w).astype(float)
    return np.where(np.isnan(u), np.nan, p)


def _sat_shape(u: F64, u0: ArrayLike) -> F64:
    """(1 - exp(-u/u0)) / (1 - exp(-1/u0)): 0 at u = 0, 1 at u = 1."""
    u0 = np.asarray(u0, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return -np.expm1(-u / u0) / -np.expm1(-1.0 / u0)


def saturating_power_w(
    util: ArrayLike, idle_w: ArrayLike, limit_w: ArrayLike, u0: ArrayLike
) -> NDArray[np.float64]:
    r"""Board power from GPU-Util rising fast and saturating.

    Parameters
    ----------
    util : array_like
        GPU-Util (``util_pct`` / 100), clipped to [0, 1]; NaN gives NaN. [1]
    idle_w, limit_w : array_like
        Power at util 0 and at util 1. [W]
    u0 : array_like
        Saturation scale: small is near two-level, large near linear. [1]

    Returns
    -------
    numpy.ndarray
        :math:`P = P_{idle} + (P_{limit} - P_{idle})\,(1 - e^{-u/u_0}) / (1 - e^{-1/u_0})`. [W]

    Examples
    --------
    >>> saturating_power_w([0.0, 1.0], 60.0, 300.0, 0.1).round(6).tolist()
    [60.0, 300.0]
    """
    u = np.clip(np.asarray(util, dtype=float), 0.0, 1.0)
    idle = np.asarray(idle_w, dtype=float)
    return idle + (np.asarray(limit_w, dtype=float) - idle) * _sat_shape(u, u0)


def curve_power_w(
    kind: ArrayLike,
    activity: ArrayLike,
    idle_w: ArrayLike,
    limit_w: ArrayLike,
    shape: ArrayLike,
    cap_w: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """Board power through the curve of each GPU's ``kind`` (:data:`CURVE_KINDS` codes).

    ``shape`` is the kind's third parameter: gamma (power law), the threshold (two-level) or
    u0 (saturating); ``limit_w`` the power at activity 1 (the busy level of a two-level
    curve). ``activity`` must be SM activity where the kind is power law and GPU-Util where
    it is a util-only kind (:data:`UTIL_ONLY_KINDS`); the caller picks the input. The result is
    clamped at ``cap_w`` (default ``limit_w`` for the power law, none for the others). [W]

    Examples
    --------
    >>> curve_power_w([0, 1, 2], [0.5, 0.5, 0.5], 60.0, 300.0, [1.0, 0.05, 0.1]).round(1)
    array([180. , 300. , 298.4])
    """
    k = np.asarray(kind)
    a = np.asarray(activity, dtype=float)
    p = gpu_power_w(a, idle_w, limit_w, np.where(k == POWER_LAW, shape, 1.0), cap_w)
    if not np.isin(k, UTIL_ONLY_KINDS).any():
        return p
    u = np.where(k == TWO_LEVEL, two_level_power_w(a, idle_w, limit_w, shape), np.nan)
    u = np.where(k == SATURATING, saturating_power_w(a, idle_w, limit_w, shape), u)
    if cap_w is not None:
        u = np.minimum(u, np.asarray(cap_w, dtype=float))
    return np.where(np.isin(k, UTIL_ONLY_KINDS), u, p)


@dataclass(frozen=True)
class UtilCurveFit:
    """Per-GPU result of :func:`fit_two_level`, :func:`fit_saturating` or
    :func:`fit_util_power_curve`; arrays have shape ``(N,)``.

    Attributes
    ----------
    kind : numpy.ndarray
        Curve family, a :data:`CURVE_KINDS` code. [int]
    idle_w, limit_w : numpy.ndarray
        Power at util 0 and at util 1 (the busy level of a two-level curve). [W]
    shape : numpy.ndarray
        gamma, threshold or u0 by ``kind``. [1]
    idle_stderr_w, limit_stderr_w, shape_stderr : numpy.ndarray
        Standard errors (the threshold's is NaN: it is picked from a grid). [W], [W], [1]
    holdout_mae_w : numpy.ndarray
        Shape ``(N, 3)``: MAE of each kind on the held-out block (NaN: unusable there); only
        :func:`fit_util_power_curve` fills it. [W]
    n_samples : numpy.ndarray
        Valid samples used. [1]
    usable : numpy.ndarray
        False where the data cannot identify the curve. [bool]
    reason : list of (str or None)
        Why a fit is unusable, None where it is usable.
    linear, note : numpy.ndarray, list, optional
        :func:`fit_util_power_curve` only: where the families were refused and the straight
        line in GPU-Util is published instead (its slope identifiable, its cross-validated
        error known), and the note that says so.
    """

    kind: NDArray[np.int64]
    idle_w: F64
    limit_w: F64
    shape: F64
    idle_stderr_w: F64
    limit_stderr_w: F64
    shape_stderr: F64
    holdout_mae_w: F64
    n_samples: NDArray[np.int64]
    usable: NDArray[np.bool_]
    reason: list[str | None]
    #: True where the curve families were refused and the published curve is the straight
    #: line in GPU-Util (``kind`` power law, ``shape`` 1), with ``note`` saying so
    linear: NDArray[np.bool_] | None = None
    note: list[str | None] | None = None


def _as_columns(util: ArrayLike, power_w: ArrayLike) -> tuple[F64, F64]:
    """``(T, N)`` util clipped to [0, 1] and power; a 1-D pair is one GPU."""
    u = np.asarray(util, dtype=float)
    u = u[:, None] if u.ndim == 1 else u
    p = np.asarray(power_w, dtype=float)
    p = p[:, None] if p.ndim == 1 else p
    return np.clip(u, 0.0, 1.0), np.broadcast_to(p, u.shape)


def _util_hist(u: F64, p: F64) -> tuple[F64, F64, F64, F64]:
    """Per GPU and 1 %-wide util bin: count, sum of util, of power and of power squared,
    each ``(N, 102)``; pairs with a NaN side go to the last bin (the caller drops it)."""
    n_gpu = u.shape[1]
    nb = _UTIL_BINS + 2  # the last bin takes the pairs left out
    ok = np.isfinite(u) & np.isfinite(p)
    key = np.where(ok, np.rint(np.nan_to_num(u) * _UTIL_BINS), nb - 1).astype(np.intp)
    key = (key + np.arange(n_gpu) * nb).ravel()
    w = ok.ravel().astype(float)
    uu = np.where(ok, u, 0.0).ravel()
    pp = np.where(ok, p, 0.0).ravel()
    size = n_gpu * nb
    out = [np.bincount(key, weights=x, minlength=size).reshape(n_gpu, nb) for x in (w, uu, pp)]
    out.append(np.bincount(key, weights=pp * pp, minlength=size).reshape(n_gpu, nb))
    return out[0], out[1], out[2], out[3]


def _level_reasons(
    n_lo: F64, n_hi: F64, idle: F64, busy: F64, se: tuple[F64, F64], min_level: int, rel: float
) -> list[str | None]:
    """Why each GPU's two levels (idle, busy) are not identified, None where they are."""
    span = busy - idle
    out: list[str | None] = []
    for j in range(idle.size):
        why = []
        if n_lo[j] < min_level or n_hi[j] < min_level:
            why.append(
                f"{int(n_lo[j])} idle and {int(n_hi[j])} busy samples "
                f"(fewer than {min_level} on one side)"
            )
        elif not span[j] > 0 or not idle[j] >= 0:
            why.append("busy power not above idle power")
        elif not max(se[0][j], se[1][j]) <= rel * span[j]:
            why.append(
                f"levels not identifiable (standard error {max(se[0][j], se[1][j]):.1f} W > "
                f"{100 * rel:g} % of the {span[j]:.1f} W step)"
            )
        out.append("; ".join(why) if why else None)
    return out


def fit_two_level(
    util: ArrayLike,
    power_w: ArrayLike,
    *,
    min_samples: int = 100,
    min_level_samples: int = 10,
    max_gap_frac: float = 0.2,
    max_rel_stderr: float = 0.05,
    dt_s: float = 1.0,
) -> UtilCurveFit:
    r"""Fit :func:`two_level_power_w` per GPU: threshold on a 1 % grid, levels as means.

    Parameters
    ----------
    util : array_like
        GPU-Util (``util_pct`` / 100), shape ``(T, N)`` or ``(T,)``; NaN for a gap. [1]
    power_w : array_like
        Board power, same shape; NaN for a gap. [W]
    min_samples, max_gap_frac, dt_s
        As in :func:`fit_power_curve`.
    min_level_samples : int, default 10
        Fewest samples on each side of the threshold. [1]
    max_rel_stderr : float, default 0.05
        Largest standard error of either level relative to the step between them: the two
        levels must be told apart, not each known to 1 % as the power law's idle and limit. [1]

    Returns
    -------
    UtilCurveFit

    Notes
    -----
    For each threshold :math:`u_t \in \{0.005, 0.015, ..., 0.495\}` the levels are the means of
    the power at or below and above it; the threshold with the least squared error wins. The
    standard errors of the levels are those of a mean (samples taken as independent).

    Examples
    --------
    >>> u = np.tile([0.0, 0.0, 0.9, 0.95, 1.0], 40)
    >>> f = fit_two_level(u, np.where(u > 0, 290.0, 60.0) + np.tile([1.0, -1.0], 100))
    >>> f.idle_w.round(1), f.limit_w.round(1), bool(f.usable[0])
    (array([60.]), array([290.]), True)
    """
    u, p = _as_columns(util, power_w)
    cnt, _, s_p, s_pp = _util_hist(u, p)
    k_max = round(_THRESHOLD_MAX * _UTIL_BINS)
    cn, cs, css = (np.cumsum(x[:, :k_max], axis=1) for x in (cnt, s_p, s_pp))
    n_t, s_t, ss_t = (x[:, :-1].sum(axis=1, keepdims=True) for x in (cnt, s_p, s_pp))
    n_hi = n_t - cn
    with np.errstate(divide="ignore", invalid="ignore"):
        sse = ss_t - cs**2 / cn - (s_t - cs) ** 2 / n_hi
    sse = np.where((cn >= min_level_samples) & (n_hi >= min_level_samples), sse, np.inf)
    k = np.argmin(sse, axis=1)
    rows = np.arange(u.shape[1])
    n_lo, s_lo, ss_lo = cn[rows, k], cs[rows, k], css[rows, k]
    n_up, s_up, ss_up = n_hi[rows, k], s_t[:, 0] - s_lo, ss_t[:, 0] - ss_lo
    with np.errstate(divide="ignore", invalid="ignore"):
        idle, busy = s_lo / n_lo, s_up / n_up
        se_idle = np.sqrt(np.maximum(ss_lo - n_lo * idle**2, 0.0) / (n_lo - 1) / n_lo)
        se_busy = np.sqrt(np.maximum(ss_up - n_up * busy**2, 0.0) / (n_up - 1) / n_up)
    reasons = join_reasons(
        _input_problems(u, p, min_samples, max_gap_frac, None, dt_s),
        _level_reasons(
            n_lo, n_up, idle, busy, (se_idle, se_busy), min_level_samples, max_rel_stderr
        ),
    )
    threshold = (k + 0.5) / _UTIL_BINS
    return _util_fit(TWO_LEVEL, idle, busy, threshold, (se_idle, se_busy), n_t, reasons)


def _util_fit(
    kind: int,
    idle: F64,
    limit: F64,
    shape: F64,
    se: tuple[F64, ...],
    n_t: F64,
    reasons: list[str | None],
) -> UtilCurveFit:
    """A :class:`UtilCurveFit` of one kind; refused GPUs get NaN parameters."""
    usable = np.array([r is None for r in reasons], dtype=bool)
    n = idle.size

    def keep(x: F64) -> F64:
        return np.where(usable, x, np.nan)

    se_shape = se[2] if len(se) > 2 else np.full(n, np.nan)
    return UtilCurveFit(
        kind=np.full(n, kind, dtype=np.int64),
        idle_w=keep(idle),
        limit_w=keep(limit),
        shape=keep(shape),
        idle_stderr_w=se[0],
        limit_stderr_w=se[1],
        shape_stderr=se_shape,
        holdout_mae_w=np.full((n, len(CURVE_KINDS)), np.nan),
        n_samples=np.rint(np.ravel(n_t)).astype(np.int64),
        usable=usable,
        reason=reasons,
    )


def _sat_ls(cnt: F64, u_m: F64, p_m: F64, u0: F64) -> tuple[F64, F64, F64]:
    """Weighted LS of bin-mean power on [1 - g, g], g = :func:`_sat_shape` at ``u0`` per GPU:
    (idle, limit, between-bin SSE)."""
    g = _sat_shape(u_m, u0[:, None])
    sw, sx, sxx = cnt.sum(1), (cnt * g).sum(1), (cnt * g * g).sum(1)
    sp, sxp = (cnt * p_m).sum(1), (cnt * g * p_m).sum(1)
    det = sw * sxx - sx * sx
    with np.errstate(divide="ignore", invalid="ignore"):
        span = np.where(det > 0, (sw * sxp - sx * sp) / det, np.nan)
        idle = (sp - span * sx) / sw
    res = p_m - idle[:, None] - span[:, None] * g
    sse = np.where(cnt > 0, cnt * res * res, 0.0).sum(1)
    return idle, idle + span, np.where(np.isfinite(sse), sse, np.inf)


def fit_saturating(
    util: ArrayLike,
    power_w: ArrayLike,
    *,
    min_samples: int = 100,
    min_level_samples: int = 10,
    max_gap_frac: float = 0.2,
    max_rel_stderr: float = 0.05,
    dt_s: float = 1.0,
) -> UtilCurveFit:
    r"""Fit :func:`saturating_power_w` per GPU: u0 on a log grid, idle and limit in closed form.

    Parameters as in :func:`fit_two_level`; ``min_level_samples`` applies to the samples at
    util <= 0.05 (the idle threshold of docs/physics.md §6.3) and above it.

    Notes
    -----
    For fixed :math:`u_0` the curve is linear in idle and limit; :math:`u_0` is searched over
    61 log-spaced values from 0.005 to 2 and refined by a parabola in :math:`\ln u_0`
    (refused at the grid's edge). The data enter as 1 %-wide util bins. Standard errors are
    HC1 (White's sandwich) over the bins, with the Jacobian in (idle, limit, u0).

    Examples
    --------
    >>> u = np.tile(np.r_[np.zeros(5), np.linspace(0.02, 1.0, 50)], 4)
    >>> f = fit_saturating(u, saturating_power_w(u, 60.0, 300.0, 0.1))
    >>> f.idle_w.round(2), f.limit_w.round(2), f.shape.round(3)
    (array([60.]), array([300.]), array([0.1]))
    """
    u, p = _as_columns(util, power_w)
    cnt, s_u, s_p, s_pp = (x[:, :-1] for x in _util_hist(u, p))
    with np.errstate(divide="ignore", invalid="ignore"):
        u_m = np.where(cnt > 0, s_u / cnt, 0.0)
        p_m = np.where(cnt > 0, s_p / cnt, 0.0)
    ln_u0, at_edge = _sat_search(cnt, u_m, p_m)
    u0 = np.exp(ln_u0)
    idle, limit, _ = _sat_ls(cnt, u_m, p_m, u0)
    se = _sat_stderr(cnt, u_m, p_m, s_pp, idle, limit, u0)
    n_lo = cnt[:, :6].sum(1)
    n_t = cnt.sum(1)
    level = _level_reasons(n_lo, n_t - n_lo, idle, limit, se[:2], min_level_samples, max_rel_stderr)
    for j in np.flatnonzero(at_edge & np.isfinite(idle)):
        edge = f"u0 at the edge of {_U0_GRID[0]:g}..{_U0_GRID[-1]:g}"
        level[j] = f"{level[j]}; {edge}" if level[j] else edge
    reasons = join_reasons(_input_problems(u, p, min_samples, max_gap_frac, None, dt_s), level)
    return _util_fit(SATURATING, idle, limit, u0, se, n_t, reasons)


def _sat_search(cnt: F64, u_m: F64, p_m: F64) -> tuple[F64, NDArray[np.bool_]]:
    """ln u0 of least squared error per GPU, and whether it sits at the grid's edge: the
    coarse log grid, then 11 points over +-1 of its steps around the best, each refined by a
    parabola through the best point and its neighbours."""
    n_gpu = cnt.shape[0]
    cols = np.arange(n_gpu)

    def best(cand: F64) -> tuple[F64, NDArray[np.intp]]:
        sse = np.stack([_sat_ls(cnt, u_m, p_m, np.exp(c))[2] for c in cand])
        k = np.argmin(sse, axis=0)
        kk = np.clip(k, 1, cand.shape[0] - 2)
        y0, y1, y2 = sse[kk - 1, cols], sse[kk, cols], sse[kk + 1, cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            den = y0 - 2 * y1 + y2
            shift = np.clip(np.where(den > 0, 0.5 * (y0 - y2) / den, 0.0), -1.0, 1.0)
        step = cand[kk + 1, cols] - cand[kk, cols]
        edge = (k == 0) | (k == cand.shape[0] - 1)
        return np.where(edge, cand[k, cols], cand[kk, cols] + shift * step), k

    ln_grid = np.log(_U0_GRID)
    coarse, k = best(np.broadcast_to(ln_grid[:, None], (ln_grid.size, n_gpu)))
    at_edge = (k == 0) | (k == ln_grid.size - 1)
    step = ln_grid[1] - ln_grid[0]
    fine_cand = np.clip(
        coarse[None, :] + np.linspace(-step, step, 11)[:, None], ln_grid[0], ln_grid[-1]
    )
    fine, _ = best(fine_cand)
    return np.where(at_edge, coarse, fine), at_edge


def _sat_stderr(
    cnt: F64, u_m: F64, p_m: F64, s_pp: F64, idle: F64, limit: F64, u0: F64
) -> tuple[F64, F64, F64]:
    """HC1 standard errors of idle, limit and u0 from the bins, J = [1 - g, g, span dg/du0]
    (dg/du0 by a central difference)."""
    g = _sat_shape(u_m, u0[:, None])
    h = 1e-4 * u0[:, None]
    dg = (_sat_shape(u_m, u0[:, None] + h) - _sat_shape(u_m, u0[:, None] - h)) / (2 * h)
    jac = np.stack([1.0 - g, g, (limit - idle)[:, None] * dg], axis=-1)  # (N, B, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        wss = np.maximum(s_pp - cnt * p_m * p_m, 0.0)
    res = p_m - idle[:, None] * (1.0 - g) - limit[:, None] * g
    s_b = np.where(cnt > 0, wss + cnt * res * res, 0.0)
    with np.errstate(invalid="ignore"):
        bread = safe_pinv(np.einsum("nb,nbi,nbj->nij", cnt, jac, jac))
        meat = np.einsum("nb,nbi,nbj->nij", s_b, jac, jac)
        total = cnt.sum(1)
        cov = bread @ meat @ bread * (total / np.maximum(total - 3.0, 1.0))[:, None, None]
    d = np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0.0))
    return d[:, 0], d[:, 1], d[:, 2]


#: GPU-Util at or under which a sample may be idle (the two-level default's 5 %). [1]
IDLE_UTIL = 0.05
#: GPU-Util that reads as 0 %: no kernel seen in the sample window, whatever the power. [1]
ZERO_UTIL = 0.005
#: How long GPU-Util must stay idle on both sides of a sample before its power counts as idle:
#: the board keeps drawing for seconds after the last kernel (the shared RTX 4090 log decays
#: from ~150-250 W to ~34 W over 7-8 s of 0 % GPU-Util) and GPU-Util reads 0 % for single
#: samples in the middle of a load. [s]
IDLE_LAG_S = 10.0


def idle_inconsistent(
    util: ArrayLike,
    power_w: ArrayLike,
    dt_s: float = 1.0,
    *,
    idle_util: float = IDLE_UTIL,
    lag_s: float = IDLE_LAG_S,
    min_idle_samples: int = 10,
) -> NDArray[np.bool_]:
    """Samples idle by GPU-Util but not by power, shape ``(T, N)``: GPU-Util at or under
    ``idle_util`` with power above the GPU's idle band, where GPU-Util reads 0 % (no kernel
    seen) or was above ``idle_util`` within the ``lag_s`` before (power decaying from a load;
    a low but non-zero GPU-Util long after a load may draw more than idle on a saturating
    curve, and is kept). The idle band is the 5th percentile of its settled idle
    samples (GPU-Util idle for the whole ``lag_s`` before: not power still decaying from a
    load, nor a kernel between two util samples) plus ``max(5 W, 25 %)``. A GPU with fewer
    than ``min_idle_samples`` settled idle samples has no idle band: nothing is flagged."""
    u, p = _as_columns(util, power_w)
    low = u <= idle_util
    zero = u <= ZERO_UTIL
    busy = np.where(np.isfinite(u), u > idle_util, False).astype(float)
    k = max(0, round(lag_s / max(dt_s, 1e-9)))
    pad = np.pad(busy, ((k, 0), (0, 0)))
    c = np.vstack([np.zeros((1, busy.shape[1])), np.cumsum(pad, axis=0)])
    near = (c[k + 1 :] - c[: c.shape[0] - k - 1]) > 0  # a busy sample within the last k
    settled = low & ~near & np.isfinite(p)
    n_set = settled.sum(axis=0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        floor = np.nanquantile(np.where(settled, p, np.nan), 0.05, axis=0)
    band = floor + np.maximum(5.0, 0.25 * np.abs(floor))
    by_power = np.where(n_set >= min_idle_samples, p <= band, True)
    return low & ~by_power & (zero | near)


def fit_util_power_curve(
    util: ArrayLike,
    power_w: ArrayLike,
    limit_w: ArrayLike | None = None,
    *,
    holdout_frac: float = 0.25,
    min_gain: float = 0.05,
    min_samples: int = 100,
    min_idle_samples: int = 10,
    dt_s: float = 1.0,
    idle_lag_s: float = IDLE_LAG_S,
) -> UtilCurveFit:
    r"""The power curve of each GPU seen through GPU-Util only, its family chosen on held-out
    error among the power law (:func:`fit_power_curve`), two-level and saturating curves.

    Parameters
    ----------
    util : array_like
        GPU-Util (``util_pct`` / 100), shape ``(T, N)`` or ``(T,)``, in time order; NaN for a
        gap. [1]
    power_w : array_like
        Board power, same shape. [W]
    limit_w : array_like, optional
        Enforced power limit per GPU, shape ``(N,)``: the power law's clamp, and every
        prediction is clamped at it. [W]
    holdout_frac : float, default 0.25
        The last share of the samples, held out to choose the family (a time-blocked split:
        the choice is judged on a later period than the fit, as the twin will use it). [1]
    min_gain : float, default 0.05
        A util-only family replaces a usable power law only when its held-out MAE is lower by
        at least this share. [1]
    min_samples, min_idle_samples, dt_s
        As in :func:`fit_power_curve` (``min_idle_samples`` is also each level's minimum).

    Returns
    -------
    UtilCurveFit
        The chosen family per GPU (``kind``), its parameters refitted on all the samples, and
        each family's held-out MAE (``holdout_mae_w``, columns in :data:`CURVE_KINDS` order).

    Notes
    -----
    Each family is fitted on the first ``1 - holdout_frac`` of the samples and scored (MAE,
    with the clamp) on the rest; the usable family of least held-out MAE wins, the power law
    on a tie within ``min_gain``. Where none is usable the GPU keeps the power law's result
    with every family's reason. docs/physics.md §1.3.1.

    Examples
    --------
    >>> u = np.tile(np.r_[np.zeros(20), np.full(80, 0.97)], 10)
    >>> p = np.where(u > 0, 290.0, 60.0) + np.tile([2.0, -2.0], 500)
    >>> f = fit_util_power_curve(u, p, 450.0)
    >>> CURVE_KINDS[int(f.kind[0])], f.idle_w.round(1), f.limit_w.round(1)
    ('two_level', array([60.]), array([290.]))
    """
    u, p = _as_columns(util, power_w)
    n_t, n_gpu = u.shape
    if not 0.0 < holdout_frac < 1.0:
        raise ValueError(f"holdout_frac {holdout_frac!r} must lie in (0, 1)")
    lim = None if limit_w is None else np.broadcast_to(np.asarray(limit_w, dtype=float), (n_gpu,))
    cap = np.full(n_gpu, np.inf) if lim is None else np.where(np.isfinite(lim), lim, np.inf)
    # fitted on samples whose power agrees with their GPU-Util (idle ones idle by power too,
    # lag-aware); scored on every sample
    p_fit = np.where(
        idle_inconsistent(u, p, dt_s, lag_s=idle_lag_s, min_idle_samples=min_idle_samples),
        np.nan,
        p,
    )
    masked = np.isnan(p_fit) & ~np.isnan(p)
    # the masked samples are left out, not missing: the gap check allows for them
    gap_ok = min(1.0, 0.2 + float(masked.mean(axis=0).max(initial=0.0)))
    n_fold = max(2, round(1.0 / holdout_frac))
    edges = np.linspace(0, n_t, n_fold + 1).round().astype(int)
    kw = {"min_samples": min_samples, "dt_s": dt_s, "max_gap_frac": gap_ok}
    lvl = {**kw, "min_level_samples": min_idle_samples}

    def fit_all(rows: NDArray[np.bool_] | slice) -> list[UtilCurveFit]:
        uu, pp = u[rows], p_fit[rows]
        pl = fit_power_curve(
            uu, pp, lim, in_sample_mae=False, min_idle_samples=min_idle_samples, **kw
        )
        as_util = _util_fit(
            POWER_LAW,
            pl.idle_w,
            pl.limit_w,
            pl.gamma,
            (pl.idle_stderr_w, pl.limit_stderr_w, pl.gamma_stderr),
            pl.n_samples.astype(float),
            pl.reason,
        )
        return [as_util, fit_two_level(uu, pp, **lvl), fit_saturating(uu, pp, **lvl)]

    # blocked cross-validation (Bergmeir & Benitez 2012): each contiguous block held out in
    # turn, the family fitted on the others and scored on it; a family's held-out MAE pools
    # the blocks where it was usable (at least two), so a log whose only idle minutes are at
    # its end is still scored on them
    err = np.zeros((n_gpu, len(CURVE_KINDS)))
    cnt = np.zeros((n_gpu, len(CURVE_KINDS)))
    folds_ok = np.zeros((n_gpu, len(CURVE_KINDS)), np.int64)
    block: list[UtilCurveFit] = []
    for i in range(n_fold):
        out = np.zeros(n_t, bool)
        out[edges[i] : edges[i + 1]] = True
        fits = fit_all(~out)
        if i == n_fold - 1:
            block = fits  # the reasons of the classic split (fit on all but the last block)
        for k, f in enumerate(fits):
            pred = curve_power_w(k, u[out], f.idle_w, f.limit_w, f.shape, cap)
            ok = np.isfinite(p[out]) & np.isfinite(pred) & f.usable[None, :]
            err[:, k] += np.where(ok, np.abs(pred - p[out]), 0.0).sum(axis=0)
            cnt[:, k] += ok.sum(axis=0)
            folds_ok[:, k] += f.usable & ok.any(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        held = np.where((folds_ok >= 2) & (cnt > 0), err / cnt, np.nan)
    score = np.where(np.isfinite(held), held, np.inf)
    best_util = 1 + np.argmin(score[:, 1:], axis=1)
    util_score = score[np.arange(n_gpu), best_util]
    chosen = np.where(util_score < (1.0 - min_gain) * score[:, 0], best_util, POWER_LAW)
    full = fit_all(slice(None))
    return _linear_fallback(_pick(full, chosen, held, block), u, p, p_fit, edges, min_samples)


#: A straight line in GPU-Util is published for a refused curve only with its slope known to
#: this share (two standard errors under 10 %): the same 5 % gate as the util families' levels.
LINEAR_MAX_REL_STDERR = 0.05


def _ols_line(u: F64, p: F64, rows: NDArray[np.bool_]) -> tuple[F64, F64, F64, F64, F64]:
    """Per column, least squares ``p = a + b u`` on ``rows``: a, b, their standard errors
    (independent samples) and the samples used."""
    ok = rows[:, None] & np.isfinite(u) & np.isfinite(p)
    n = ok.sum(axis=0).astype(float)
    x, y = np.where(ok, u, 0.0), np.where(ok, p, 0.0)
    sx, sy, sxx, sxy = x.sum(0), y.sum(0), (x * x).sum(0), (x * y).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        det = n * sxx - sx * sx
        b = (n * sxy - sx * sy) / det
        a = (sy - b * sx) / n
        s2 = np.where(ok, p - a - b * u, 0.0) ** 2
        s2 = s2.sum(0) / np.maximum(n - 2, 1)
        se_b = np.sqrt(s2 * n / det)
        se_a = np.sqrt(s2 * sxx / det)
    return a, b, se_a, se_b, n


def _linear_fallback(
    fit: UtilCurveFit, u: F64, p: F64, p_fit: F64, edges: NDArray[np.int64], min_samples: int
) -> UtilCurveFit:
    """Where every family was refused, the straight line in GPU-Util (the power law at
    gamma 1), published when its slope is identifiable (positive, standard error under
    :data:`LINEAR_MAX_REL_STDERR` of it) on the whole window and its error is known from the
    same blocked cross-validation (at least two blocks). Marked in ``linear`` and ``note``."""
    n_gpu = u.shape[1]
    linear = np.zeros(n_gpu, bool)
    note: list[str | None] = [None] * n_gpu
    refused = ~fit.usable
    if not refused.any():
        return dataclasses.replace(fit, linear=linear, note=note)
    err, cnt, folds = np.zeros(n_gpu), np.zeros(n_gpu), np.zeros(n_gpu, np.int64)
    for i in range(len(edges) - 1):
        out = np.zeros(u.shape[0], bool)
        out[edges[i] : edges[i + 1]] = True
        a, b, _, se_b, n = _ols_line(u, p_fit, ~out)
        good = (b > 0) & (se_b <= LINEAR_MAX_REL_STDERR * b) & (n >= min_samples)
        pred = a + b * u[out]
        ok = np.isfinite(pred) & np.isfinite(p[out]) & good[None, :]
        err += np.where(ok, np.abs(pred - p[out]), 0.0).sum(axis=0)
        cnt += ok.sum(axis=0)
        folds += ok.any(axis=0)
    a, b, se_a, se_b, n = _ols_line(u, p_fit, np.ones(u.shape[0], bool))
    with np.errstate(invalid="ignore", divide="ignore"):
        cv = np.where((folds >= 2) & (cnt > 0), err / cnt, np.nan)
        mean_p = np.nanmean(p, axis=0)
    publish = refused & (b > 0) & (se_b <= LINEAR_MAX_REL_STDERR * b) & np.isfinite(cv)
    publish &= n >= min_samples
    if not publish.any():
        return dataclasses.replace(fit, linear=linear, note=note)
    held = fit.holdout_mae_w.copy()
    held[publish, POWER_LAW] = cv[publish]
    reasons = list(fit.reason)
    for j in np.flatnonzero(publish):
        linear[j] = True
        note[j] = (
            f"linear in GPU-Util (gamma fixed at 1; slope standard error"
            f" {100 * se_b[j] / b[j]:.1f} %, cross-validated MAE {cv[j]:.1f} W ="
            f" {100 * cv[j] / mean_p[j]:.1f} % of the mean power): the curve was refused:"
            f" {reasons[j]}"
        )
        reasons[j] = None

    def put(x: F64, v: F64) -> F64:
        return np.where(publish, v, x)

    return dataclasses.replace(
        fit,
        kind=np.where(publish, POWER_LAW, fit.kind).astype(np.int64),
        idle_w=put(fit.idle_w, a),
        limit_w=put(fit.limit_w, a + b),
        shape=put(fit.shape, np.ones(n_gpu)),
        idle_stderr_w=put(fit.idle_stderr_w, se_a),
        limit_stderr_w=put(fit.limit_stderr_w, np.sqrt(se_a**2 + se_b**2)),
        shape_stderr=put(fit.shape_stderr, np.zeros(n_gpu)),
        holdout_mae_w=held,
        n_samples=np.where(publish, n, fit.n_samples).astype(np.int64),
        usable=fit.usable | publish,
        reason=reasons,
        linear=linear,
        note=note,
    )


def _nan_mae(meas: F64, pred: F64) -> F64:
    """MAE along axis 0 over the pairs where both sides are finite (NaN where none is)."""
    ok = np.isfinite(meas) & np.isfinite(pred)
    n = ok.sum(axis=0)
    err = np.where(ok, np.abs(pred - meas), 0.0).sum(axis=0)
    return np.where(n > 0, err / np.maximum(n, 1), np.nan)


_FEW_BLOCKS = (
    "usable in fewer than 2 of the cross-validation fits (each without one block): no held-out"
    " error to choose it on"
)


def _pick(
    fits: list[UtilCurveFit], chosen: NDArray[np.intp], held: F64, block: list[UtilCurveFit]
) -> UtilCurveFit:
    """Per GPU, the fit of kind ``chosen``; a GPU where no kind was usable on the fit block
    keeps the power law and every kind's reason on that block (where it was judged)."""
    cols = np.arange(chosen.size)
    none = ~np.isfinite(held).any(axis=1)

    def take(name: str) -> F64:
        return np.stack([getattr(f, name) for f in fits])[chosen, cols]

    reasons: list[str | None] = []
    for j, k in enumerate(chosen):
        r = fits[k].reason[j]
        if none[j]:
            # the power law's reason on the whole window; the util families' on the block
            # they were judged on (one may fit the whole window yet not its first part)
            r = "; ".join(
                f"{name}: {(fits if i == 0 else block)[i].reason[j] or _FEW_BLOCKS}"
                for i, name in enumerate(CURVE_KINDS)
            )
        reasons.append(r)
    usable = take("usable").astype(bool) & ~none
    return UtilCurveFit(
        kind=chosen.astype(np.int64),
        idle_w=take("idle_w"),
        limit_w=take("limit_w"),
        shape=take("shape"),
        idle_stderr_w=take("idle_stderr_w"),
        limit_stderr_w=take("limit_stderr_w"),
        shape_stderr=take("shape_stderr"),
        holdout_mae_w=held,
        n_samples=take("n_samples").astype(np.int64),
        usable=usable,
        reason=reasons,
    )
