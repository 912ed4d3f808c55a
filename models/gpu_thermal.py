"""GPU temperature above its local coolant: a first-order thermal RC model.

The GPU (or its HBM) is one heat capacity ``C`` joined to the local coolant (liquid cold plate)
or inlet air (air heat sink) through one thermal resistance ``R``:

    C dT/dt = P - (T - T_ref) / R

Every function takes scalars or numpy arrays that broadcast against each other, so one call
handles 10,000 GPUs. A fitter can reuse :func:`rc_simulate` as its output-error model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from models.fit_quality import _column_stats, data_problems, hold_gaps, join_reasons, safe_pinv
from models.nanstats import nanmedian

__all__ = [
    "RcFit",
    "fit_rc",
    "hold_power_at_decay_w",
    "hold_power_w",
    "predict_temp_c",
    "r_at_flow_k_per_w",
    "rc_recurrence",
    "rc_simulate",
    "rc_step",
    "sensor_quantum_k",
    "steady_temp_c",
    "time_constant_s",
    "time_to_temp_s",
]

F64 = NDArray[np.float64]

#: Share of a cold plate's R that is convective at design flow [A]: docs/physics.md §2.2 says the
#: convective term "usually dominates"; half is the conservative reading.
CONVECTIVE_SHARE = 0.5
#: h ~ Re^0.8 for turbulent flow (Dittus-Boelter), docs/physics.md §2.2.
FLOW_EXPONENT = 0.8


def r_at_flow_k_per_w(
    r_nominal_k_per_w: ArrayLike,
    flow_ratio: ArrayLike,
    conv_share: ArrayLike = CONVECTIVE_SHARE,
    exponent: float = FLOW_EXPONENT,
) -> F64:
    r"""A cold plate's thermal resistance at a flow other than the one it was fitted at.

    Parameters
    ----------
    r_nominal_k_per_w : array_like
        R at the reference (design or calibration) flow. [K/W]
    flow_ratio : array_like
        Flow over the reference flow, clipped at 1e-3 (a stopped loop). [1]
    conv_share : array_like, default CONVECTIVE_SHARE
        Share of R that is convective at the reference flow. [1]
    exponent : float, default 0.8
        Convective coefficient exponent on flow.

    Returns
    -------
    numpy.ndarray
        R at that flow. [K/W]

    Notes
    -----
    .. math:: R(\dot V) = R_0\,\left[(1 - s) + s\,(\dot V / \dot V_0)^{-0.8}\right]

    The conductive part (TIM, base) does not depend on flow; the convective part follows
    h ~ Re^0.8. A loop that loses one of two pumps (79 % of its flow on the catalog's pump
    curve, ``models.cdu.parallel_pump_flow_lpm``) raises R by ~10 %; a loop with no flow raises
    it without bound, and the GPU throttles.

    References
    ----------
    docs/physics.md §2.2.
    """
    r0 = np.asarray(r_nominal_k_per_w, dtype=float)
    ratio = np.maximum(np.asarray(flow_ratio, dtype=float), 1e-3)
    share = np.asarray(conv_share, dtype=float)
    return r0 * ((1.0 - share) + share * ratio ** (-exponent))


def steady_temp_c(
    ref_temp_c: ArrayLike, power_w: ArrayLike, r_k_per_w: ArrayLike
) -> NDArray[np.float64]:
    r"""Steady-state GPU temperature.

    Parameters
    ----------
    ref_temp_c : array_like
        Local coolant temperature (liquid) or inlet air temperature (air). [°C]
    power_w : array_like
        Heat dissipated by the GPU (board power). [W]
    r_k_per_w : array_like
        Thermal resistance GPU sensor to coolant or air. [K/W]

    Returns
    -------
    numpy.ndarray
        Steady-state temperature. [°C]

    Notes
    -----
    .. math:: T_{ss} = T_{ref} + R\,P

    References
    ----------
    docs/physics.md §2.2 (steady state above the coolant) and §9.2 (R defaults: 0.03 K/W liquid,
    0.07 K/W air).

    Examples
    --------
    >>> float(steady_temp_c(32.0, 700.0, 0.03))
    53.0
    """
    return np.asarray(ref_temp_c, dtype=float) + np.asarray(r_k_per_w, dtype=float) * np.asarray(
        power_w, dtype=float
    )


def time_constant_s(r_k_per_w: ArrayLike, c_j_per_k: ArrayLike) -> NDArray[np.float64]:
    r"""Thermal time constant :math:`\tau = R C`. [s]

    Parameters
    ----------
    r_k_per_w : array_like
        Thermal resistance. [K/W]
    c_j_per_k : array_like
        Heat capacity. [J/K]

    References
    ----------
    docs/physics.md §2.3 and §9.2 (tau ≈ 10 s cold plate, ≈ 60 s air heat sink).
    """
    return np.asarray(r_k_per_w, dtype=float) * np.asarray(c_j_per_k, dtype=float)


def rc_step(
    temp_c: ArrayLike,
    ref_temp_c: ArrayLike,
    power_w: ArrayLike,
    r_k_per_w: ArrayLike,
    c_j_per_k: ArrayLike,
    dt_s: ArrayLike,
) -> NDArray[np.float64]:
    r"""Advance the RC model by one time step, exactly, with inputs held over the step.

    Parameters
    ----------
    temp_c : array_like
        Temperature at the start of the step. [°C]
    ref_temp_c : array_like
        Coolant or inlet-air temperature, held constant over the step. [°C]
    power_w : array_like
        Power, held constant over the step. [W]
    r_k_per_w : array_like
        Thermal resistance. [K/W]
    c_j_per_k : array_like
        Heat capacity. [J/K]
    dt_s : array_like
        Step length. [s]

    Returns
    -------
    numpy.ndarray
        Temperature at the end of the step. [°C]

    Notes
    -----
    Zero-order-hold discretization of :math:`C\,dT/dt = P - (T - T_{ref})/R`:

    .. math::

        T' = T_{ss} + (T - T_{ss})\,e^{-\Delta t/(R C)}, \qquad T_{ss} = T_{ref} + R P

    It is exact for piecewise-constant inputs at any ``dt_s``, so the discrete model is stable
    for every step length.

    References
    ----------
    docs/physics.md §2.2 (steady state), §2.3 and §9.2 (time constants).

    Examples
    --------
    >>> round(float(rc_step(32.0, 32.0, 700.0, 0.03, 1000.0 / 3, 1e6)), 6)
    53.0
    """
    r = np.asarray(r_k_per_w, dtype=float)
    t_ss = steady_temp_c(ref_temp_c, power_w, r)
    decay = np.exp(-np.asarray(dt_s, dtype=float) / (r * np.asarray(c_j_per_k, dtype=float)))
    return t_ss + (np.asarray(temp_c, dtype=float) - t_ss) * decay


def hold_power_w(
    temp_c: ArrayLike,
    target_c: ArrayLike,
    ref_temp_c: ArrayLike,
    r_k_per_w: ArrayLike,
    c_j_per_k: ArrayLike,
    dt_s: ArrayLike,
) -> NDArray[np.float64]:
    r"""The power that takes the RC model from ``temp_c`` to ``target_c`` in one step.

    Parameters
    ----------
    temp_c : array_like
        Temperature at the start of the step. [°C]
    target_c : array_like
        Temperature wanted at the end of the step. [°C]
    ref_temp_c : array_like
        Coolant or inlet-air temperature over the step. [°C]
    r_k_per_w, c_j_per_k : array_like
        Thermal resistance [K/W] and heat capacity [J/K].
    dt_s : array_like
        Step length. [s]

    Returns
    -------
    numpy.ndarray
        The power [W]; it can be below zero (no power holds the target) or above any limit.

    Notes
    -----
    :func:`rc_step` solved for the power, with :math:`e = e^{-\Delta t/(R C)}`:

    .. math:: P = \frac{T_{target} - T e - T_{ref}(1 - e)}{R (1 - e)}

    This is what a thermal controller does when it holds the slowdown temperature: the GPU's
    clocks, and so its power, fall until the temperature stops rising (docs/physics.md §2.4).

    Examples
    --------
    >>> p = hold_power_w(80.0, 87.0, 30.0, 0.05, 2000.0, 1.0)
    >>> round(float(rc_step(80.0, 30.0, p, 0.05, 2000.0, 1.0)), 9)
    87.0
    """
    r = np.asarray(r_k_per_w, dtype=float)
    e = np.exp(-np.asarray(dt_s, dtype=float) / (r * np.asarray(c_j_per_k, dtype=float)))
    return hold_power_at_decay_w(temp_c, target_c, ref_temp_c, r, e)


def hold_power_at_decay_w(
    temp_c: ArrayLike,
    target_c: ArrayLike,
    ref_temp_c: ArrayLike,
    r_k_per_w: ArrayLike,
    decay: ArrayLike,
) -> NDArray[np.float64]:
    r""":func:`hold_power_w` with the step's decay :math:`e = e^{-\Delta t/(R C)}` given.

    For a loop over time that has the decay of every step already (the thermal controller of
    ``twin.chain.thermal``): the same arithmetic, without an exponential per step.

    Examples
    --------
    >>> e = np.exp(-1.0 / (0.05 * 2000.0))
    >>> bool(hold_power_at_decay_w(80.0, 87.0, 30.0, 0.05, e) == hold_power_w(
    ...     80.0, 87.0, 30.0, 0.05, 2000.0, 1.0))
    True
    """
    r = np.asarray(r_k_per_w, dtype=float)
    e = np.asarray(decay, dtype=float)
    ref = np.asarray(ref_temp_c, dtype=float)
    num = np.asarray(target_c, dtype=float) - np.asarray(temp_c, dtype=float) * e - ref * (1 - e)
    return num / (r * np.maximum(1.0 - e, 1e-12))


def rc_recurrence(
    temp0_c: ArrayLike, steady_c: NDArray[np.floating], decay: ArrayLike, out: F64
) -> F64:
    r"""The RC model's exact step, repeated, from its precomputed terms, into ``out``.

    ``out[0] = temp0_c`` and, for each row k of ``out`` after the first,

    .. math:: T_{k+1} = T_{ss,k} + (T_k - T_{ss,k})\,d_k

    where ``steady_c[k]`` is :math:`T_{ss,k} = T_{ref,k} + R_k P_k` and ``decay[k]`` is
    :math:`d_k = e^{-\Delta t_k/(R_k C)}` (a broadcast view of one decay for a constant step).
    ``out`` is ``(m + 1, ...)``; ``steady_c`` and ``decay`` have at least ``m`` rows. This is the
    one loop over time of :func:`rc_simulate` and of the thermal controller
    (``twin.chain.thermal``), :func:`rc_step`'s arithmetic term for term.

    Examples
    --------
    >>> out = np.empty(3)
    >>> rc_recurrence(30.0, np.array([30.0, 40.0]), np.full(2, 0.5), out)
    array([30., 30., 35.])
    """
    out[0] = temp0_c
    for k in range(1, out.shape[0]):
        step = out[k, ...]  # a view, also for one GPU (0-d)
        np.subtract(out[k - 1, ...], steady_c[k - 1], out=step)
        step *= decay[k - 1]
        step += steady_c[k - 1]
    return out


def rc_simulate(
    temp0_c: ArrayLike,
    ref_temp_c: ArrayLike,
    power_w: ArrayLike,
    r_k_per_w: ArrayLike,
    c_j_per_k: ArrayLike,
    dt_s: ArrayLike,
) -> NDArray[np.float64]:
    r"""Simulate the RC model over a time axis (axis 0).

    Parameters
    ----------
    temp0_c : array_like
        Temperature at the first sample, shape ``(...)``. [°C]
    ref_temp_c : array_like
        Coolant or inlet-air temperature per sample, shape ``(n, ...)`` or broadcastable. [°C]
    power_w : array_like
        Power per sample, shape ``(n, ...)``. [W]
    r_k_per_w : array_like
        Thermal resistance, shape ``(...)``; or one per sample, ``(n, ...)`` with as many
        dimensions as ``power_w`` (2 or more: a loop whose flow changes), row k held over the
        interval from sample k to k + 1. [K/W]
    c_j_per_k : array_like
        Heat capacity, shape ``(...)``. [J/K]
    dt_s : array_like
        Sample interval: a scalar, or one value per interval, shape ``(n,)`` or ``(n, ...)``
        (the last one is unused). [s]

    Returns
    -------
    numpy.ndarray
        Temperature at each sample, shape ``(n, ...)``; ``out[0] = temp0_c``. [°C]

    Notes
    -----
    Repeated :func:`rc_step`, causal and aligned with the samples: the inputs of sample ``k``
    are held over the interval from sample ``k`` to ``k + 1``,

    .. math:: T_{k+1} = T_{ss,k} + (T_k - T_{ss,k})\,e^{-\Delta t_k/(R C)},
              \qquad T_{ss,k} = T_{ref,k} + R P_k

    so ``out[k]`` depends on the inputs of samples ``0 .. k-1`` only and the last sample's
    inputs are not used. For an output-error fit, pass the measured temperature of sample 0 as
    ``temp0_c`` and compare ``out`` with the measured series.

    References
    ----------
    docs/physics.md §2.2, §2.3 and §9.2; DESIGN.md "Measured on this kind of machine" (fitting the
    simulated trajectory recovers both R and C).

    Examples
    --------
    >>> rc_simulate(30.0, [30.0, 30.0, 30.0], [0.0, 100.0, 100.0], 0.1, 100.0, 10.0).round(3)
    array([30.   , 30.   , 36.321])
    """
    power = np.asarray(power_w, dtype=float)
    n = power.shape[0]
    ref = np.broadcast_to(np.asarray(ref_temp_c, dtype=float), power.shape)
    r = np.asarray(r_k_per_w, dtype=float)
    c = np.asarray(c_j_per_k, dtype=float)
    dt = np.asarray(dt_s, dtype=float)
    r_varies = power.ndim >= 2 and r.ndim == power.ndim  # (n, ...): one R per sample
    if r_varies and r.shape[0] != n:
        raise ValueError(f"a time-varying r_k_per_w needs {n} rows (one per sample), got {r.shape}")
    t = np.broadcast_to(
        np.asarray(temp0_c, dtype=float),
        np.broadcast_shapes(power.shape[1:], r.shape[1:] if r_varies else r.shape, c.shape),
    )
    out = np.empty((n, *t.shape))
    if n < 2:
        out[0] = t
        return out
    # rc_step's arithmetic, term for term (so the result is the same to the bit), with every
    # sample's steady state and decay computed at once, outside the loop over time: 2 vector
    # operations per sample instead of rc_step's dozen (1.2 s -> 0.03 s for 10,000 GPUs x 720
    # samples)
    lead = (1,) * (t.ndim - (power.ndim - 1))
    t_ss = ref.reshape(n, *lead, *ref.shape[1:]) + r * power.reshape(n, *lead, *power.shape[1:])
    rc = r * c
    if dt.ndim == 0 and not r_varies:
        decay = np.broadcast_to(np.exp(-dt / rc), (n - 1, *np.shape(rc)))
    else:
        if dt.ndim:  # one step per interval, (n, ...) or (n - 1, ...): on the sample axis
            dt = dt[: n - 1].reshape(-1, *(1,) * (t.ndim - dt.ndim + 1), *dt.shape[1:])
        decay = np.exp(-dt / (rc[: n - 1] if r_varies else rc))
    return rc_recurrence(t, t_ss, decay, out)


# ---- fitting and prediction ---------------------------------------------------------------------

#: Bounds of the fitted time constant as multiples of the sample interval [1]: below ~0.05 dt a
#: step is over before the next sample and C cannot be seen; 1e4 dt is far beyond a GPU's RC.
_TAU_BOUNDS_DT = (0.05, 1.0e4)
_OE_BLOCK = 64  # time samples per block of the output-error pass (cache-sized state buffer)
_OE_TOL = 1e-2  # convergence: predicted drop of the sum of squares below this x sigma^2


@dataclass(frozen=True)
class RcFit:
    """Per-GPU result of :func:`fit_rc`; every array has one entry per GPU (shape ``(N,)``).

    Parameters of an unusable fit are NaN; ``reason`` says why.

    Attributes
    ----------
    r_k_per_w : numpy.ndarray
        Thermal resistance R. [K/W]
    c_j_per_k : numpy.ndarray
        Heat capacity C. [J/K]
    offset_k : numpy.ndarray
        Local coolant (or air) temperature above the measured reference. [K]
    temp0_c : numpy.ndarray
        Fitted temperature at the first sample. [°C]
    tau_s : numpy.ndarray
        Time constant R·C. [s]
    r_stderr_k_per_w, c_stderr_j_per_k : numpy.ndarray
        Standard errors of R and C (Gauss-Newton covariance, inflated for residual
        autocorrelation). [K/W], [J/K]
    one_step_std_k : numpy.ndarray
        Standard deviation of the one-step-ahead prediction error (measured temperature of
        sample k advanced one step against sample k + 1). [K]
    sim_mae_k : numpy.ndarray
        Mean absolute error of the simulated trajectory (output error) over the fit window. [K]
    n_samples : numpy.ndarray
        Temperature samples used. [1]
    usable : numpy.ndarray
        False where the data or the fit cannot be trusted. [bool]
    reason : list of (str or None)
        Why a fit is unusable, None where it is usable.
    """

    r_k_per_w: F64
    c_j_per_k: F64
    offset_k: F64
    temp0_c: F64
    tau_s: F64
    r_stderr_k_per_w: F64
    c_stderr_j_per_k: F64
    one_step_std_k: F64
    sim_mae_k: F64
    n_samples: NDArray[np.int64]
    usable: NDArray[np.bool_]
    reason: list[str | None]


def _as_time_by_device(x: ArrayLike, n_t: int) -> F64:
    """A scalar, a ``(T,)`` series, ``(1, N)`` or ``(T, N)`` as a ``(T, 1)`` or ``(T, N)`` array."""
    a = np.asarray(x, dtype=float)
    if a.ndim == 0:
        a = a.reshape(1, 1)
    elif a.ndim == 1:
        a = a[:, None]
    return np.broadcast_to(a, (n_t, a.shape[1]))


def _interval_steps(dt_s: ArrayLike, n_t: int) -> tuple[float, F64 | None]:
    """A sample interval as ``(typical step, per-interval steps or None)``.

    ``dt_s`` is a scalar (a regular grid) or one step per interval: ``n_t - 1`` values, or
    ``n_t`` with the last unused (as :func:`rc_simulate` takes them). The per-interval steps
    come back padded to ``n_t`` (the last one repeated, unused); the typical step is their
    median (for the one-step seed, the data checks and the bounds of tau).
    """
    dt = np.asarray(dt_s, dtype=float)
    if dt.ndim == 0:
        if not (np.isfinite(dt) and dt > 0):
            raise ValueError(f"dt_s must be a positive finite step, got {float(dt)!r}")
        return float(dt), None
    if dt.ndim != 1 or dt.size not in (n_t - 1, n_t) or dt.size == 0:
        raise ValueError(
            f"dt_s must be a scalar or one step per interval ({n_t - 1} or {n_t} values), "
            f"got shape {dt.shape}"
        )
    steps = dt[: n_t - 1]
    if not (np.isfinite(steps).all() and (steps > 0).all()):
        bad = int(np.flatnonzero(~(np.isfinite(steps) & (steps > 0)))[0])
        raise ValueError(f"dt_s[{bad}] = {steps[bad]!r} is not a positive finite step")
    padded = np.concatenate([steps, steps[-1:]]) if steps.size else dt
    return float(np.median(steps)), padded


def _row_blocks(n_rows: int) -> list[tuple[int, int]]:
    return [(k0, min(k0 + _OE_BLOCK, n_rows)) for k0 in range(0, n_rows, _OE_BLOCK)]


def _one_step_moments(
    temp: NDArray[np.floating],
    ref: NDArray[np.floating],
    power: NDArray[np.floating],
    valid: NDArray[np.bool_] | None,
) -> dict[str, F64]:
    """Means and covariances of ``y = T[k+1] - T_ref[k]``, ``z = T[k] - T_ref[k]``, ``P[k]``.

    Over the pairs of consecutive valid temperatures, per GPU; accumulated over blocks of time
    in float64 from per-GPU shifted values (so that float32 inputs lose nothing that matters).
    """
    n_t, n = temp.shape
    sz = (temp[0] - ref[0]).astype(np.float64)
    sp = power[0].astype(np.float64)
    sz_d, sp_d = sz.astype(temp.dtype), sp.astype(temp.dtype)
    keys = ("n", "y", "z", "p", "zz", "zp", "pp", "zy", "py", "yy")
    s = {k: np.zeros(n) for k in keys}

    def dot(u: NDArray[np.floating], v: NDArray[np.floating]) -> F64:
        return np.einsum("tn,tn->n", u, v)

    zb, yb, pb = (np.empty((_OE_BLOCK, n), dtype=temp.dtype) for _ in range(3))
    for k0, k1 in _row_blocks(n_t - 1):
        z, y, p = zb[: k1 - k0], yb[: k1 - k0], pb[: k1 - k0]
        np.subtract(temp[k0:k1], ref[k0:k1], out=z)
        z -= sz_d
        np.subtract(temp[k0 + 1 : k1 + 1], ref[k0:k1], out=y)
        y -= sz_d
        np.subtract(power[k0:k1], sp_d, out=p)
        if valid is None:
            s["n"] += k1 - k0
        else:
            ok = valid[k0:k1] & valid[k0 + 1 : k1 + 1]
            z *= ok
            y *= ok
            p *= ok
            s["n"] += ok.sum(axis=0)
        s["y"] += y.sum(axis=0)
        s["z"] += z.sum(axis=0)
        s["p"] += p.sum(axis=0)
        s["zz"] += dot(z, z)
        s["zp"] += dot(z, p)
        s["pp"] += dot(p, p)
        s["zy"] += dot(z, y)
        s["py"] += dot(p, y)
        s["yy"] += dot(y, y)
    cnt = np.maximum(s["n"], 1.0)
    m = {k: s[k] / cnt for k in ("y", "z", "p")}
    out = {
        "n": s["n"],
        "my": m["y"] + sz,
        "mz": m["z"] + sz,
        "mp": m["p"] + sp,
    }
    for k in ("zz", "zp", "pp", "zy", "py", "yy"):
        out["c" + k] = s[k] / cnt - m[k[0]] * m[k[1]]
    return out


def _linear_seed(mom: dict[str, F64], dt_s: float) -> tuple[F64, F64, F64]:
    """One-step linear least squares on the exact ZOH model: returns (R, tau, offset).

    ``T[k+1] - T_ref[k] = a (T[k] - T_ref[k]) + b0 + b1 P[k]`` with ``a = exp(-dt/tau)``,
    ``b0 = (1 - a) offset``, ``b1 = (1 - a) R``, from the moments of
    :func:`_one_step_moments`.
    """
    det = mom["czz"] * mom["cpp"] - mom["czp"] ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(det > 0, (mom["czy"] * mom["cpp"] - mom["cpy"] * mom["czp"]) / det, np.nan)
        b1 = np.where(det > 0, (mom["czz"] * mom["cpy"] - mom["czp"] * mom["czy"]) / det, np.nan)
        b0 = mom["my"] - a * mom["mz"] - b1 * mom["mp"]
        lo, hi = np.exp(-1.0 / _TAU_BOUNDS_DT[0]), np.exp(-1.0 / _TAU_BOUNDS_DT[1])
        a_c = np.clip(np.nan_to_num(a, nan=0.5), lo, hi)
        r = b1 / (1.0 - a_c)
        off = b0 / (1.0 - a_c)
        tau = -dt_s / np.log(a_c)
    return r, tau, off


def _one_step_std(mom: dict[str, F64], r: F64, c: F64, off: F64, dt_s: float) -> F64:
    """Std of ``T[k+1] - rc_step(T[k], T_ref[k] + offset, P[k], R, C, dt)`` from the moments."""
    a = np.exp(-dt_s / (r * c))
    b = (1.0 - a) * r  # e = y - a z - (1 - a) offset - b P
    var = (
        mom["cyy"]
        + a * a * mom["czz"]
        + b * b * mom["cpp"]
        - 2.0 * a * mom["czy"]
        - 2.0 * b * mom["cpy"]
        + 2.0 * a * b * mom["czp"]
    )
    return np.sqrt(np.maximum(var, 0.0))


class _Work:
    """Scratch arrays of :func:`_oe_pass`, reused over passes (no large allocation per block)."""

    def __init__(self, n: int, dtype: type[np.floating]) -> None:
        self.n = n
        self.buf = np.empty((_OE_BLOCK + 1, 4, n), dtype=dtype)
        self.u = np.empty((_OE_BLOCK, n), dtype=dtype)
        # per step, what the recursion adds to rows x, sR, sa: (1 - a) U, (1 - a) P, x - U
        self.add = np.empty((_OE_BLOCK, 3, n), dtype=dtype)
        self.e = np.empty((_OE_BLOCK, n), dtype=dtype)


def _oe_pass(
    temp: NDArray[np.floating],
    ref: NDArray[np.floating],
    power: NDArray[np.floating],
    valid: NDArray[np.bool_] | None,
    theta: F64,
    dt_s: float | F64,
    work: _Work | None = None,
    huber_thr: F64 | None = None,
) -> dict[str, F64]:
    """Simulate the RC model and its forward sensitivities over the whole window, per GPU.

    ``theta`` rows: R [K/W], ln tau [ln s], offset [K], T0 [°C]. The trajectory is the one of
    :func:`rc_simulate` (the same exact ZOH recursion, written out so that the sensitivities
    ride along): with ``U[k] = T_ref[k] + offset + R P[k]`` and ``a = exp(-dt/tau)``,

        x[k+1]  = a x[k] + (1 - a) U[k]              x[0] = T0
        sR[k+1] = a sR[k] + (1 - a) P[k]             dx/dR
        sa[k+1] = a sa[k] + x[k] - U[k]              dx/da
        s0[k+1] = a s0[k]                            dx/dT0 (= a^k); dx/doffset = 1 - a^k

    ``temp`` holds 0 where ``valid`` is False (``valid`` None: every sample is valid);
    ``valid`` may also hold the square roots of per-sample weights (0 where missing), the
    iteratively reweighted pass of a robust loss. Returns the (weighted) Gauss-Newton normal
    equations (``gram`` (N, 4, 4), ``grad`` (N, 4) = J^T W e) in the parameters of ``theta``,
    the weighted sum of squared residuals, the unweighted sum of absolute residuals, the
    lag-1 residual product, the count of residuals (``n``) and the sum of weights
    (``wsum``). The loop runs over time in blocks (float32 by
    default); block sums are added up in float64. ``dt_s`` is a scalar or one step per
    sample (``(T,)``, :func:`_interval_steps`): then ``a`` is ``exp(-dt_k/tau)`` per interval,
    the exact zero-order hold of each.

    ``huber_thr`` (per GPU, K): the Huber loss instead of least squares, ``valid`` then a mask
    (or None). Each residual's weight ``min(1, thr / |e|)`` is taken from the residual of this
    very pass, so the normal equations are those of an IRLS step at ``theta`` (Newton's step
    for the Huber loss with the curvature of its quadratic part) and no separate simulation
    is needed for the weights; ``loss`` is then the Huber loss
    ``sum(|e| <= thr ? e^2 / 2 : thr |e| - thr^2 / 2)``, else the sum of squares.
    """
    dtype = temp.dtype
    n_t, n = temp.shape
    if work is None or work.n != n:
        work = _Work(n, dtype)  # type: ignore[arg-type]
    r, ln_tau, off, t0 = theta
    tau = np.exp(ln_tau)
    per_step = np.ndim(dt_s) > 0
    if per_step:  # sa carries dx/d(ln tau) directly: each step's da/dln tau applied in the loop
        dt_v = np.asarray(dt_s, dtype=float)[:, None]
        dadl: F64 | float = 1.0
    else:
        a64 = np.exp(-dt_s / tau)
        dadl = a64 * dt_s / tau  # da / d(ln tau)
        a = a64.astype(dtype)
        c1 = (1.0 - a64).astype(dtype)
    r_d, off_d = r.astype(dtype), off.astype(dtype)
    buf = work.buf
    state = np.zeros((4, n), dtype=dtype)
    state[0] = t0
    state[3] = 1.0
    keys = ("rr", "ra", "aa", "r0", "a0", "00", "re", "ae", "0e", "ee", "r", "a", "0", "e", "w")
    keys += ("cnt", "rho")
    acc = {k: np.zeros(n) for k in keys}
    thr_d = None if huber_thr is None else np.asarray(huber_thr).astype(dtype)
    sae = np.zeros(n)
    lag = np.zeros(n)
    prev_e: F64 | None = None
    with_s0 = True

    def dot(u: NDArray[np.floating], v: NDArray[np.floating]) -> F64:
        return np.einsum("tn,tn->n", u, v)

    for k0, k1 in _row_blocks(n_t):
        nb = k1 - k0
        p_b = power[k0:k1]
        u_b, add, e = work.u[:nb], work.add[:nb], work.e[:nb]
        np.multiply(p_b, r_d, out=u_b)
        u_b += ref[k0:k1]
        u_b += off_d
        if per_step:
            a_b64 = np.exp(-dt_v[k0:k1] / tau)
            a_b = a_b64.astype(dtype)
            q_b = (a_b64 * dt_v[k0:k1] / tau).astype(dtype)
            c1_b = (1.0 - a_b64).astype(dtype)
            np.multiply(u_b, c1_b, out=add[:, 0])
            np.multiply(p_b, c1_b, out=add[:, 1])
        else:
            np.multiply(u_b, c1, out=add[:, 0])
            np.multiply(p_b, c1, out=add[:, 1])
        buf[0] = state
        for kk in range(nb):  # three numpy calls per step: the same sums as row by row
            cur, nxt, add_k = buf[kk], buf[kk + 1], add[kk]
            np.subtract(cur[0], u_b[kk], out=add_k[2])
            if per_step:
                add_k[2] *= q_b[kk]
                np.multiply(a_b[kk], cur, out=nxt)
            else:
                np.multiply(a, cur, out=nxt)
            nxt[:3] += add_k
        state = buf[nb].copy()
        x, sr, sa, s0 = buf[:nb, 0], buf[:nb, 1], buf[:nb, 2], buf[:nb, 3]
        np.subtract(temp[k0:k1], x, out=e)
        w = _block_weights(e, None if valid is None else valid[k0:k1], thr_d, acc, sae)
        if w is not None or (valid is not None and valid.dtype == np.bool_):
            wm = valid[k0:k1] if w is None else w  # type: ignore[index]
            sr, sa, s0 = sr * wm, sa * wm, s0 * wm

        acc["rr"] += dot(sr, sr)
        acc["ra"] += dot(sr, sa)
        acc["aa"] += dot(sa, sa)
        acc["re"] += dot(sr, e)
        acc["ae"] += dot(sa, e)
        acc["ee"] += dot(e, e)
        acc["r"] += _weighted_sum(sr, w)
        acc["a"] += _weighted_sum(sa, w)
        acc["e"] += _weighted_sum(e, w)
        if with_s0:  # dx/dT0 = a^k dies out after a few time constants
            acc["r0"] += dot(sr, s0)
            acc["a0"] += dot(sa, s0)
            acc["00"] += dot(s0, s0)
            acc["0e"] += dot(s0, e)
            acc["0"] += _weighted_sum(s0, w)
            with_s0 = bool(np.abs(state[3]).max() > 1e-9)
        lag += dot(e[1:], e[:-1])
        if prev_e is not None:
            lag += prev_e * e[0]
        prev_e = e[-1].astype(np.float64)
    g, grad = _normal_equations(acc, dadl, n)
    return {
        "gram": g,
        "grad": grad,
        "loss": acc["ee"] if thr_d is None else acc["rho"],
        "sse": acc["ee"],
        "sae": sae,
        "lag": lag,
        "n": acc["cnt"],
        "wsum": acc["w"],
    }


def _block_weights(
    e: NDArray[np.floating],
    valid_b: NDArray[np.floating] | None,
    thr_d: NDArray[np.floating] | None,
    acc: dict[str, F64],
    sae: F64,
) -> NDArray[np.floating] | None:
    """Weigh one block's residuals ``e`` in place (mask, root weights or Huber weights from
    these very residuals), adding to the counts, sums of weights, |e| and the Huber loss.

    Returns the root weights to apply to the sensitivities, or None where none are needed
    (no mask and no robust loss) or the mask is boolean (the caller multiplies by it)."""
    nb = e.shape[0]
    if valid_b is None and thr_d is None:
        acc["w"] += nb
        acc["cnt"] += nb
        sae += np.abs(e).sum(axis=0)
        return None
    if thr_d is not None:  # Huber: weights from this pass's own residuals
        ae = np.abs(e)
        if valid_b is not None:
            ae *= valid_b
        m = np.minimum(ae, thr_d)
        acc["rho"] += np.einsum("tn,tn->n", m, ae - 0.5 * m)
        with np.errstate(divide="ignore"):
            w = np.divide(thr_d, ae)
        np.minimum(w, 1.0, out=w)
        np.sqrt(w, out=w)
        if valid_b is not None:
            w *= valid_b
    else:
        w = valid_b  # type: ignore[assignment]
    sae += np.abs(e * (w > 0)).sum(axis=0)
    acc["cnt"] += (w > 0).sum(axis=0)
    e *= w
    if w.dtype == np.bool_:
        acc["w"] += w.sum(axis=0)
        return None  # a mask: e is zero where missing, the caller masks the sensitivities
    acc["w"] += np.einsum("tn,tn->n", w, w)
    return w


def _normal_equations(acc: dict[str, F64], q: F64 | float, n: int) -> tuple[F64, F64]:
    """The Gauss-Newton normal equations (gram (N, 4, 4), grad (N, 4)) from a pass's sums.

    Jacobian columns: [sR, sa * da/dlntau (``q``), 1 - s0, s0]; sums with (1 - s0) by
    difference."""
    g = np.empty((n, 4, 4))
    g[:, 0, 0] = acc["rr"]
    g[:, 0, 1] = g[:, 1, 0] = acc["ra"] * q
    g[:, 1, 1] = acc["aa"] * q * q
    g[:, 0, 2] = g[:, 2, 0] = acc["r"] - acc["r0"]
    g[:, 1, 2] = g[:, 2, 1] = (acc["a"] - acc["a0"]) * q
    g[:, 0, 3] = g[:, 3, 0] = acc["r0"]
    g[:, 1, 3] = g[:, 3, 1] = acc["a0"] * q
    g[:, 2, 2] = acc["w"] - 2.0 * acc["0"] + acc["00"]  # sum of w (1 - s0)^2
    g[:, 2, 3] = g[:, 3, 2] = acc["0"] - acc["00"]
    g[:, 3, 3] = acc["00"]
    grad = np.stack([acc["re"], acc["ae"] * q, acc["e"] - acc["0e"], acc["0e"]], axis=1)
    return g, grad


def _weighted_sum(u: NDArray[np.floating], w: NDArray[np.floating] | None) -> F64:
    """Per-GPU sum over a block of ``u`` (already multiplied by the root weights ``w``) times
    ``w`` once more: the sum of weight x value; a plain sum without weights."""
    return u.sum(axis=0) if w is None else np.einsum("tn,tn->n", u, w)


def _solve_damped(gram: F64, grad: F64, lam: F64) -> F64:
    """Levenberg-Marquardt step (G + lam diag(G)) delta = g for every GPU at once."""
    diag = np.diagonal(gram, axis1=1, axis2=2)
    scale = np.where(diag > 0, diag, 1.0)
    m = gram + (lam[:, None] * scale + 1e-12 * scale)[:, :, None] * np.eye(4)[None]
    m = np.where(np.isfinite(m), m, 0.0) + 1e-300 * np.eye(4)[None]
    try:
        return np.linalg.solve(m, grad[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        out = np.zeros_like(grad)
        for i in range(len(grad)):  # singular systems only; rare
            out[i] = np.linalg.lstsq(m[i], grad[i], rcond=None)[0]
        return out


#: RMS over mean absolute residual above which the residuals count as heavy-tailed [1]:
#: sqrt(pi/2) = 1.253 for Gaussian noise, 1.155 for uniform rounding error; artifacts that put
#: a few samples far out raise it.
_HEAVY_TAIL_RATIO = 1.3
#: Huber fits per GPU, each to convergence with the robust scale taken at the parameters of
#: the one before (the first at the least-squares fit's) [1]
_HUBER_ROUNDS = 3
#: ... a GPU takes the next round only if this one moved R or tau by more than this
#: (relative): 0.1 %, a tenth of the smallest standard error calibration accepts as identified
_HUBER_TOL = 1e-3
#: Huber threshold in robust standard deviations (1.4826 MAD): 95 % efficiency under Gaussian
#: noise (Huber 1964; the usual tuning constant).
_HUBER_K = 1.345
#: Physical seed's time constants, multiples of the typical step, searched when the one-step
#: linear seed gives R or tau that is not positive and finite [1].
_TAU_SEED_DT = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
#: Catalog R for a last-resort seed: the liquid cold plate of docs/physics.md §9.2 [K/W].
_R_CATALOG_K_PER_W = 0.03
#: Levenberg-Marquardt's starting damping (Marquardt 1963 starts small, near Gauss-Newton);
#: also the most the Huber fit carries over from the least-squares run before it, so a GPU
#: whose run ended at a large damping (no step lowered its sum) is not frozen by it [1].
_LAM_START = 1e-3


def _levenberg_marquardt(
    t_w: NDArray[np.floating],
    ref_w: NDArray[np.floating],
    p_w: NDArray[np.floating],
    valid: NDArray[np.floating] | NDArray[np.bool_] | None,
    theta: F64,
    dt_pass: float | F64,
    *,
    iterations: int,
    bounds: tuple[float, float],
    dtype: type[np.floating],
    lam0: F64 | None = None,
    huber_thr: F64 | None = None,
) -> tuple[F64, dict[str, F64], NDArray[np.bool_], F64]:
    """Output-error Levenberg-Marquardt from ``theta`` for every GPU at once, until each has
    converged or ``iterations`` passes are spent. Returns the parameters, the pass at them
    (:func:`_oe_pass`), which GPUs converged (``iterations`` 0: all, the seed as asked) and
    the damping each GPU ended with. ``lam0``: the damping to start from per GPU (a warm
    start, e.g. the least-squares run's before a robust refit; at most :data:`_LAM_START`), else
    :data:`_LAM_START`. ``huber_thr``: minimize the Huber loss with these thresholds per GPU
    instead of the sum of squares (:func:`_oe_pass`)."""
    lo, hi = bounds
    theta = theta.copy()
    n = theta.shape[1]
    work = _Work(n, dtype)
    thr = huber_thr
    cur = _oe_pass(t_w, ref_w, p_w, valid, theta, dt_pass, work, thr)
    lam = np.full(n, _LAM_START) if lam0 is None else np.minimum(lam0, _LAM_START)
    converged = np.full(n, iterations == 0)
    act = np.arange(n)  # GPUs still iterating: the columns of t_w, p_w, ...
    for _ in range(iterations):
        step = _solve_damped(cur["gram"][act], cur["grad"][act], lam[act]).T
        # Converged: the step would lower the sum of squares by less than tol * sigma^2,
        # i.e. the parameters sit within ~0.1 standard error of the optimum; or no step of
        # any length lowers it (lam beyond 1e6).
        gain = np.einsum("pn,np->n", step, cur["grad"][act])
        sigma2 = cur["sse"][act] / np.maximum(cur["wsum"][act], 1.0)
        done = (gain < _OE_TOL * sigma2) | (lam[act] > 1e6)
        converged[act[done]] = True
        if done.all():
            break
        if done.mean() > 0.25:  # drop converged GPUs from the next passes
            left = ~done
            act, step = act[left], step[:, left]
            t_w, p_w = t_w[:, left], p_w[:, left]
            ref_w = ref_w if ref_w.shape[1] == 1 else ref_w[:, left]
            valid = None if valid is None else valid[:, left]
            thr = None if thr is None else thr[left]
            work = _Work(act.size, dtype)
        trial = theta[:, act] + step
        trial[1] = np.clip(trial[1], lo, hi)
        trial[0] = np.maximum(trial[0], 1e-6)
        new = _oe_pass(t_w, ref_w, p_w, valid, trial, dt_pass, work, thr)
        better = new["loss"] < cur["loss"][act]
        theta[:, act] = np.where(better, trial, theta[:, act])
        for k in cur:
            keep = better.reshape((-1,) + (1,) * (cur[k].ndim - 1))
            cur[k][act] = np.where(keep, new[k], cur[k][act])
        lam[act] = np.where(better, lam[act] * 0.2, lam[act] * 10.0)
    return theta, cur, converged, lam


def _physical_seed(
    mom: dict[str, F64],
    t_w: NDArray[np.floating],
    ref_w: NDArray[np.floating],
    p_w: NDArray[np.floating],
    valid: NDArray[np.bool_] | None,
    cols: NDArray[np.bool_],
    first: tuple[NDArray[np.bool_], F64, F64 | float, F64],
    dt_pass: float | F64,
    bounds: tuple[float, float],
    dtype: type[np.floating],
) -> F64:
    """Seed ``(R, ln tau, offset, T0)`` for the GPUs ``cols`` whose linear seed is unphysical.

    R is the steady-state slope of ``T - T_ref`` on power over the data (the ratio of the
    means if that is not positive, the catalog R if neither is); tau is the one of
    ``_TAU_SEED_DT`` whose simulated trajectory fits the data best (one pass each).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        r = mom["czp"][cols] / mom["cpp"][cols]
        ratio = mom["mz"][cols] / mom["mp"][cols]
    r = np.where(np.isfinite(r) & (r > 0), r, ratio)
    r = np.where(np.isfinite(r) & (r > 0), r, _R_CATALOG_K_PER_W)
    off = mom["mz"][cols] - r * mom["mp"][cols]
    ok0, temp0, ref0, p0 = first
    ref0_c = ref0 if np.ndim(ref0) == 0 else ref0[cols]
    t0 = np.where(ok0[cols], temp0[cols], ref0_c + off + r * p0[cols])
    t_s, p_s = t_w[:, cols], p_w[:, cols]
    ref_s = ref_w if ref_w.shape[1] == 1 else ref_w[:, cols]
    v_s = None if valid is None else valid[:, cols]
    dt_typ = float(np.median(dt_pass)) if np.ndim(dt_pass) else float(dt_pass)
    best_sse = np.full(r.shape, np.inf)
    best = np.full(r.shape, np.log(10.0))
    work = _Work(r.size, dtype)
    for mult in _TAU_SEED_DT:
        ln_tau = np.clip(np.log(mult * dt_typ), *bounds)
        theta = np.stack([r, np.full(r.shape, ln_tau), off, t0])
        sse = _oe_pass(t_s, ref_s, p_s, v_s, theta, dt_pass, work)["sse"]
        better = sse < best_sse
        best, best_sse = np.where(better, ln_tau, best), np.where(better, sse, best_sse)
    return np.stack([r, best, off, t0])


def _huber_refit(
    t_w: NDArray[np.floating],
    ref_w: NDArray[np.floating],
    p_w: NDArray[np.floating],
    valid: NDArray[np.bool_] | None,
    theta: F64,
    cur: dict[str, F64],
    converged: NDArray[np.bool_],
    dt_pass: float | F64,
    lm: dict,
    lam: F64 | None = None,
) -> None:
    """The Huber fit, in place on ``theta``, ``cur`` and ``converged``, for the GPUs whose
    least-squares residuals are heavier-tailed than Gaussian noise (or a sensor's rounding):
    elsewhere the Huber weights would all be about 1 and the refit would change nothing.

    Each round takes the robust scale (1.4826 x the median absolute residual) at the current
    parameters (the first at the least-squares fit's), then Levenberg-Marquardt minimizes the
    Huber loss with that threshold to convergence, warm-started from the parameters and the
    damping the run before ended with (``lam`` for the first). :func:`_oe_pass` weights each
    residual of each pass by its own size, so every pass is an IRLS step and no separate
    simulation is run for the weights. Later rounds (:data:`_HUBER_ROUNDS`) re-estimate
    the scale, on the GPUs whose R or time constant the round before moved by more than
    :data:`_HUBER_TOL`: the least-squares scale is inflated by the very artifacts the loss is
    to discount (tests/test_model_fits_robust.py). Before, each round also simulated the
    trajectory in float64 for the weights and ran LM on weights held fixed (bench/README.md:
    10 % more passes, and the weights cost a third of the robust fit)."""
    rms = np.sqrt(cur["sse"] / np.maximum(cur["n"], 1.0))
    mean_abs = cur["sae"] / np.maximum(cur["n"], 1.0)
    heavy = np.flatnonzero(rms > _HEAVY_TAIL_RATIO * mean_abs)
    if not heavy.size:
        return
    lam_h = np.full(heavy.size, _LAM_START) if lam is None else lam[heavy]
    for _ in range(_HUBER_ROUNDS):
        t_h, p_h = t_w[:, heavy], p_w[:, heavy]
        ref_h = ref_w if ref_w.shape[1] == 1 else ref_w[:, heavy]
        v_h = None if valid is None else valid[:, heavy]
        before = theta[:, heavy]
        thr = _HUBER_K * _robust_scale(t_h, ref_h, p_h, v_h, before, dt_pass)
        th, cur_h, conv_h, lam_h = _levenberg_marquardt(
            t_h, ref_h, p_h, v_h, before, dt_pass, lam0=lam_h, huber_thr=thr, **lm
        )
        theta[:, heavy], converged[heavy] = th, conv_h
        for k in cur:
            cur[k][heavy] = cur_h[k]
        moved = (np.abs(th[0] / before[0] - 1.0) > _HUBER_TOL) | (
            np.abs(th[1] - before[1]) > _HUBER_TOL
        )
        heavy, lam_h = heavy[moved], lam_h[moved]
        if not heavy.size:
            return


def _trajectory(
    ref_w: NDArray[np.floating],
    p_w: NDArray[np.floating],
    theta: F64,
    dt_pass: float | F64,
    dtype: type[np.floating],
) -> NDArray[np.floating]:
    """The simulated temperature ``(T, N)`` at ``theta`` in ``dtype``: the state row of
    :func:`_oe_pass`'s recursion alone (``x[k+1] = a x[k] + (1 - a) U[k]``, the same float32
    arithmetic), two vector operations per sample. :func:`rc_simulate` gives the same
    trajectory in float64 from float64 copies of the inputs, 2-3x the time at 10,000 GPUs x
    720 samples (bench/README.md)."""
    n_t = p_w.shape[0]
    r, ln_tau, off, t0 = theta
    tau = np.exp(ln_tau)
    x = np.empty((n_t, r.size), dtype=dtype)
    x[0] = t0
    per_step = np.ndim(dt_pass) > 0
    if per_step:
        dt_v = np.asarray(dt_pass, dtype=float)[:, None]
    else:
        a64 = np.exp(-float(dt_pass) / tau)  # type: ignore[arg-type]
        a_k = a64.astype(dtype)
        c1 = (1.0 - a64).astype(dtype)
    r_d, off_d = r.astype(dtype), off.astype(dtype)
    cu = np.empty((_OE_BLOCK, r.size), dtype=dtype)
    for k0, k1 in _row_blocks(n_t - 1):
        nb = k1 - k0
        cu_b = cu[:nb]
        np.multiply(p_w[k0:k1], r_d, out=cu_b)
        cu_b += ref_w[k0:k1]
        cu_b += off_d
        if per_step:
            a_b64 = np.exp(-dt_v[k0:k1] / tau)
            a_b = a_b64.astype(dtype)
            cu_b *= (1.0 - a_b64).astype(dtype)
        else:
            cu_b *= c1
        for kk in range(nb):
            k = k0 + kk
            np.multiply(a_b[kk] if per_step else a_k, x[k], out=x[k + 1])
            x[k + 1] += cu_b[kk]
    return x


def _robust_scale(
    t_w: NDArray[np.floating],
    ref_w: NDArray[np.floating],
    p_w: NDArray[np.floating],
    valid: NDArray[np.bool_] | None,
    theta: F64,
    dt_pass: float | F64,
) -> F64:
    """Per GPU, 1.4826 x the median absolute output error at ``theta`` (a robust standard
    deviation of the residuals; missing samples left out), at least 1e-6 K."""
    e = _trajectory(ref_w, p_w, theta, dt_pass, t_w.dtype.type)
    np.subtract(t_w, e, out=e)
    np.abs(e, out=e)
    if valid is not None:
        e[~valid] = np.nan
    return np.maximum(1.4826 * nanmedian(e, axis=0).astype(float), 1e-6)


def fit_rc(
    temp_c: ArrayLike,
    ref_temp_c: ArrayLike,
    power_w: ArrayLike,
    dt_s: ArrayLike,
    *,
    iterations: int = 50,
    min_samples: int = 300,
    max_gap_frac: float = 0.2,
    max_stuck_s: float | None = 300.0,
    max_rel_stderr_r: float = 0.02,
    max_rel_stderr_c: float = 0.05,
    loss: str = "huber",
    dtype: type[np.floating] = np.float32,
) -> RcFit:
    r"""Fit R, C and the coolant offset of the RC model per GPU, for thousands of GPUs at once.

    Parameters
    ----------
    temp_c : array_like
        Measured GPU (or HBM) temperature, shape ``(T, N)``, or ``(T,)`` for one GPU; NaN for
        a missing reading. [°C]
    ref_temp_c : array_like
        Reference temperature: coolant supply (liquid) or inlet air (air), shape ``(T, N)`` or
        broadcastable (``(T, 1)`` for one loop). Gaps are held from the last valid value. [°C]
    power_w : array_like
        Measured board power, shape ``(T, N)`` (``(T,)`` for one GPU); gaps held as for
        ``ref_temp_c``. [W]
    dt_s : float or array_like
        Sample interval of a regular grid, or one step per interval (``T - 1`` values, or
        ``T`` with the last unused) for irregular timestamps: each interval is then
        discretized exactly (its own zero-order hold); the median step sets the seed, the data
        checks and the bounds of tau. [s]
    iterations : int, default 50
        Most Levenberg-Marquardt passes of the output-error refinement, per run (the Huber
        loss adds one run on the Huber objective); each GPU stops when it has converged (the
        next step would lower the sum of squares by less than 1 % of the noise variance). A GPU that
        reaches the cap unconverged is refused with that reason (8 passes left R 89 % low on
        short windows of 1 °C readings). 0 returns the one-step linear least-squares seed
        (biased: C comes out low under sensor noise).
    min_samples : int, default 300
        Fewest temperature samples a GPU needs. [1]
    max_gap_frac : float, default 0.2
        Largest share of missing temperature (or power) readings. [1]
    max_stuck_s : float, default 300
        Longest run of identical power readings before the sensor counts as stuck; a
        temperature that holds one reading longer is stuck only if the model predicts at
        least three quantization steps of change over the hold (the step inferred from the
        readings, :func:`sensor_quantum_k`): a 1 °C sensor may hold one value for minutes at a
        steady load. None skips both checks. [s]
    max_rel_stderr_r, max_rel_stderr_c : float, default 0.02 and 0.05
        Largest relative standard error of R and of C for a usable fit: a GPU whose power
        barely moves leaves R tangled with the offset and C unseen. [1]
    loss : {"huber", "linear"}, default "huber"
        ``"huber"``: after the least-squares fit, the Huber loss (threshold 1.345 robust
        standard deviations of its residuals) minimized from there, so sensor artifacts
        (a reading that dips a few K on every power dip) do not drag R and C; ``"linear"``:
        plain least squares.
    dtype : numpy float type, default numpy.float32
        Precision of the simulated trajectories; sums are float64 either way.

    Returns
    -------
    RcFit
        Per-GPU parameters, standard errors, fit quality, ``usable`` and ``reason``.

    Notes
    -----
    The model (:func:`rc_step`, exact zero-order hold) with an offset of the local coolant
    above the measured reference:

    .. math::

        C\,\frac{dT}{dt} = P - \frac{T - T_{ref} - \Delta}{R}
        \quad\Rightarrow\quad
        T_{k+1} = a\,T_k + (1 - a)(T_{ref,k} + \Delta + R\,P_k),\quad a = e^{-\Delta t/(RC)}

    1. Seed: linear least squares of the one-step equation in :math:`(a, (1-a)\Delta,
       (1-a)R)`. Where it gives R or tau that is not positive and finite (sensor artifacts
       on real GPUs do), the physical seed replaces it: R from the steady-state slope of
       :math:`T - T_{ref}` on P over the data, tau the best of a grid of multiples of the
       step. Sensor noise on :math:`T_k`, a regressor, biases :math:`a` low, so the seed
       gets R nearly right and C low (18 % in the issue's synthetic case, 28 % in that of
       ``tests/test_model_fits.py``).
    2. Output error: simulate the whole trajectory from :math:`T_0` and minimize
       :math:`\sum_k (T_k - \hat T_k)^2` over :math:`(R, \ln\tau, \Delta, T_0)` with
       Levenberg-Marquardt, all GPUs at once, the Jacobian from forward sensitivities that
       ride along the simulation (time loop in numpy over blocks; no loop over GPUs). Output
       noise does not enter the regressors, so the estimate is consistent.

    Standard errors come from :math:`\sigma^2 (J^TJ)^{-1}`, inflated by
    :math:`(1+\rho_1)/(1-\rho_1)` for the lag-1 autocorrelation of the residuals.

    Cost: one pass is a time loop of a few numpy operations on ``(4, N)`` arrays plus float32
    reductions; 10,000 GPUs x 3,600 samples take a few seconds in all (see the tests).

    References
    ----------
    docs/physics.md §2.2 (steady state above the local coolant, position along the loop),
    §2.3 and §9.2 (time constants: fit an RC model from power steps, checkpoint dips and job
    starts being natural steps); DESIGN.md "Measured on this kind of machine" (the one-step fit
    gets C about 17 % low; fitting the simulated trajectory recovers both).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p = np.repeat(rng.choice([150.0, 650.0], (40, 2)), 30, axis=0)
    >>> t = rc_simulate(40.0, 30.0, p, np.array([0.03, 0.05]), np.array([300.0, 400.0]), 1.0)
    >>> fit = fit_rc(t + rng.normal(0, 0.2, t.shape), 30.0, p, 1.0)
    >>> fit.r_k_per_w.round(3), (fit.c_j_per_k / 100).round(), fit.usable
    (array([0.03, 0.05]), array([3., 4.]), array([ True,  True]))
    """
    return fit_rc_many(
        {"": temp_c},
        ref_temp_c,
        power_w,
        dt_s,
        iterations=iterations,
        min_samples=min_samples,
        max_gap_frac=max_gap_frac,
        max_stuck_s=max_stuck_s,
        max_rel_stderr_r=max_rel_stderr_r,
        max_rel_stderr_c=max_rel_stderr_c,
        loss=loss,
        dtype=dtype,
    )[""]


def fit_rc_many(
    temps_c: Mapping[str, ArrayLike],
    ref_temp_c: ArrayLike,
    power_w: ArrayLike,
    dt_s: ArrayLike,
    *,
    iterations: int = 50,
    min_samples: int = 300,
    max_gap_frac: float = 0.2,
    max_stuck_s: float | None = 300.0,
    max_rel_stderr_r: float = 0.02,
    max_rel_stderr_c: float = 0.05,
    loss: str = "huber",
    dtype: type[np.floating] = np.float32,
) -> dict[str, RcFit]:
    """:func:`fit_rc` for several temperatures of the same GPUs (core and HBM), by name.

    Every array of ``temps_c`` has the shape ``(T, N)``; power and reference are shared, so
    their data checks, gap filling and working copies are made once. Same parameters and
    results as :func:`fit_rc`, one :class:`RcFit` per name.
    """
    if loss not in ("huber", "linear"):
        raise ValueError(f"loss must be 'huber' or 'linear', got {loss!r}")
    if not temps_c:
        return {}
    shape = np.shape(next(iter(temps_c.values())))
    n_t, n_gpu = (shape[0], 1) if len(shape) == 1 else shape
    p_in = np.asarray(power_w, dtype=float)
    if p_in.ndim == 1 and p_in.shape[0] == n_t:  # one GPU's series, as its temperature
        p_in = p_in[:, None]
    power = np.broadcast_to(p_in, (n_t, n_gpu))
    ref = _as_time_by_device(ref_temp_c, n_t)
    dt, dt_steps = _interval_steps(dt_s, n_t)

    def prefix(what: str, reasons: list[str | None]) -> list[str | None]:
        return [f"{what}: {r}" if r else None for r in reasons]

    checks = {"min_samples": min_samples, "max_gap_frac": max_gap_frac, "dt_s": dt}
    ref_problems = data_problems(ref, flat_std=0.0, max_stuck_s=None, **checks)
    if len(ref_problems) == 1:
        ref_problems = ref_problems * n_gpu
    power_problems = data_problems(power, flat_std=0.1, max_stuck_s=max_stuck_s, **checks)
    shared = prefix("power", power_problems), prefix("reference", ref_problems)
    # gaps held and float32 working copies in C order, once for every temperature (the passes
    # run over blocks of rows; a reference made by fancy indexing, ``supply[:, gpu_cdu]``,
    # comes in Fortran order and would be read with a stride)
    p_held = hold_gaps(np.asarray(power))
    ref_held = hold_gaps(np.asarray(ref))
    p_32 = p_held.astype(dtype, order="C")
    ref_32 = ref_held.astype(dtype, order="C")
    fits = {}
    for name, temp_c in temps_c.items():
        temp = np.asarray(temp_c, dtype=float)
        if temp.ndim == 1:
            temp = temp[:, None]
        if temp.shape != (n_t, n_gpu):
            raise ValueError(f"temperature {name!r} has shape {temp.shape}, not {(n_t, n_gpu)}")
        # the temperature's stuck check needs the model (below), not the run length alone
        temp_problems = data_problems(temp, flat_std=0.05, max_stuck_s=None, **checks)
        reasons = join_reasons(prefix("temperature", temp_problems), *shared)
        fit = _fit_rc_one(
            temp, reasons, p_held, ref_held, p_32, ref_32, (dt, dt_steps), iterations,
            max_rel_stderr_r, max_rel_stderr_c, loss, dtype,
        )  # fmt: skip
        _refuse_stuck(fit, temp, ref_held, p_held, dt_steps if dt_steps is not None else dt,
                      max_stuck_s)  # fmt: skip
        fits[name] = fit
    return fits


#: A held reading is a stuck sensor when the model predicts at least this many quantization
#: steps of change over the hold [1]: one or two steps can hide in the rounding (a 1 °C sensor
#: holds one value while the true temperature wanders within the step).
_STUCK_QUANTA = 3.0
#: Finest quantum counted [K]: NVML and DCGM report whole °C; 0.1 K is below any GPU
#: sensor's noise, so a finer apparent step is noise, not resolution.
_MIN_QUANTUM_K = 0.1


def sensor_quantum_k(temp_c: ArrayLike) -> F64:
    """Per column, the smallest nonzero change between consecutive valid readings: the
    sensor's quantization step (1.0 for whole-°C readings), at least 0.1 K. [K]

    Examples
    --------
    >>> sensor_quantum_k(np.array([[40.0, 40.0], [41.0, 40.25], [43.0, 40.5]]))
    array([1.  , 0.25])
    """
    t = np.asarray(temp_c, dtype=float)
    if t.ndim == 1:
        t = t[:, None]
    d = np.abs(np.diff(t, axis=0))
    d = np.where(np.isfinite(d) & (d > 1e-9), d, np.inf)
    q = d.min(axis=0) if d.shape[0] else np.full(t.shape[1], np.inf)
    return np.where(np.isfinite(q), np.maximum(q, _MIN_QUANTUM_K), _MIN_QUANTUM_K)


def _refuse_stuck(
    fit: RcFit,
    temp: F64,
    ref: F64,
    power: F64,
    dt: float | F64,
    max_stuck_s: float | None,
) -> None:
    """Refuse (in place) the GPUs whose temperature held one reading for longer than
    ``max_stuck_s`` while the model predicted at least ``_STUCK_QUANTA`` quantization steps of
    change over that hold: the fitted model's trajectory from the held reading where the fit
    is usable, else the steady-state change of the catalog R times the power's range over the
    hold, plus the reference's range (docs/physics.md §9.2)."""
    if max_stuck_s is None:
        return
    n_t = temp.shape[0]
    step = np.full(n_t, float(dt)) if np.ndim(dt) == 0 else np.asarray(dt, dtype=float)
    t_at = np.concatenate([[0.0], np.cumsum(step[: n_t - 1])])
    longest = _column_stats(temp, std=False, runs=True)[2]  # samples in the longest run
    cand = np.flatnonzero(longest * step.max() > max_stuck_s)
    if not cand.size:
        return
    sub = temp[:, cand]
    same = sub[1:] == sub[:-1]  # NaN != NaN: a gap ends a run
    quantum = sensor_quantum_k(sub)
    for i, j in enumerate(cand):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], same[:, i].astype(np.int8), [0]])))
        starts, ends = edges[::2], edges[1::2]  # run of samples starts .. ends (inclusive)
        held_s = t_at[ends] - t_at[starts]
        long = held_s > max_stuck_s
        if not long.any():
            continue
        usable = bool(fit.usable[j])
        ref_j = ref[:, 0] if ref.shape[1] == 1 else ref[:, j]
        worst, worst_k = 0.0, 0
        for k0, k1 in zip(starts[long], ends[long], strict=True):
            seg = slice(k0, k1 + 1)
            if usable:
                pred = rc_simulate(
                    temp[k0, j], ref_j[seg] + fit.offset_k[j], power[seg, j],
                    fit.r_k_per_w[j], fit.c_j_per_k[j], step[seg],
                )  # fmt: skip
                change = float(np.ptp(pred))
            else:
                acting = slice(k0, max(k1, k0 + 1))  # the last sample's input acts after it
                change = _R_CATALOG_K_PER_W * float(np.ptp(power[acting, j]))
                change += float(np.ptp(ref_j[acting]))
            if change > worst:
                worst, worst_k = change, k0
        if worst >= _STUCK_QUANTA * quantum[i]:
            k_run = int(np.flatnonzero(starts == worst_k)[0])
            why = (
                f"temperature: stuck sensor (one reading, {temp[worst_k, j]:g} °C, held "
                f"{held_s[k_run]:g} s > {max_stuck_s:g} s while the model predicts a "
                f"{worst:.2g} K change, {worst / quantum[i]:.1f} steps of the sensor's "
                f"{quantum[i]:g} K)"
            )
            fit.reason[j] = why if fit.reason[j] is None else f"{why}; {fit.reason[j]}"
            fit.usable[j] = False
            for arr in (fit.r_k_per_w, fit.c_j_per_k, fit.offset_k, fit.tau_s):
                arr[j] = np.nan


def _quantum(temp: F64) -> F64:
    """(G,) each column's reading step when all its readings sit on one (1, 0.5 or 0.1 K:
    NVML's whole degrees, a BMC's tenths), else 0 (a continuous reading)."""
    t = np.asarray(temp, dtype=np.float64)
    finite = np.isfinite(t)
    out = np.zeros(t.shape[1])
    with np.errstate(invalid="ignore"):
        for q in (1.0, 0.5, 0.1):
            x = t / q
            on_grid = (~finite | (np.abs(x - np.round(x)) < 1e-6)).all(axis=0) & finite.any(axis=0)
            out = np.where((out == 0) & on_grid, q, out)
    return out


def _fit_rc_one(
    temp: F64,
    reasons: list[str | None],
    p_held: F64,
    ref_held: F64,
    p_32: NDArray[np.floating],
    ref_32: NDArray[np.floating],
    steps: tuple[float, F64 | None],
    iterations: int,
    max_rel_stderr_r: float,
    max_rel_stderr_c: float,
    loss: str,
    dtype: type[np.floating],
) -> RcFit:
    """The fit of :func:`fit_rc` for one temperature, on inputs checked and prepared.

    ``steps``: the typical step and the per-interval steps (None on a regular grid).
    """
    dt, dt_steps = steps
    dt_pass: float | F64 = dt if dt_steps is None else dt_steps
    n_gpu = temp.shape[1]
    good = np.array([r is None for r in reasons])
    cols = np.flatnonzero(good)
    out = {k: np.full(n_gpu, np.nan) for k in ("r", "c", "off", "t0", "tau", "ser", "sec")}
    out.update({k: np.full(n_gpu, np.nan) for k in ("one", "mae")})
    n_used = np.isfinite(temp).sum(axis=0).astype(np.int64)
    usable = np.zeros(n_gpu, dtype=bool)
    if cols.size:
        sub = cols.size < n_gpu
        one_ref = ref_held.shape[1] == 1
        t_g = temp[:, cols] if sub else temp
        p_w = np.ascontiguousarray(p_32[:, cols]) if sub else p_32
        ref_w = ref_32 if one_ref or not sub else np.ascontiguousarray(ref_32[:, cols])
        p0 = p_held[0, cols]
        ref0 = ref_held[0, 0] if one_ref else ref_held[0, cols]
        valid_g = np.isfinite(t_g)
        all_valid = bool(valid_g.all())
        valid: NDArray[np.bool_] | None = None if all_valid else valid_g
        t_w = t_g.astype(dtype, order="C")
        if valid is not None:
            t_w[~valid] = 0.0
        mom = _one_step_moments(t_w, ref_w, p_w, valid)
        r0, tau0, off0 = _linear_seed(mom, dt)
        t0 = np.where(valid_g[0], t_g[0], ref0 + off0 + r0 * p0)
        lo, hi = np.log(_TAU_BOUNDS_DT[0] * dt), np.log(_TAU_BOUNDS_DT[1] * dt)
        theta = np.stack([r0, np.clip(np.log(tau0), lo, hi), off0, t0])
        theta = np.where(np.isfinite(theta), theta, np.array([[0.03], [np.log(10.0)], [0], [40]]))
        seed_bad = ~(np.isfinite(r0) & (r0 > 0) & np.isfinite(tau0))
        if iterations > 0 and seed_bad.any():
            theta[:, seed_bad] = _physical_seed(
                mom, t_w, ref_w, p_w, valid, seed_bad, (valid_g[0], t_g[0], ref0, p0),
                dt_pass, (lo, hi), dtype,
            )  # fmt: skip
        lm = {"iterations": iterations, "bounds": (lo, hi), "dtype": dtype}
        theta, cur, converged, lam = _levenberg_marquardt(
            t_w, ref_w, p_w, valid, theta, dt_pass, **lm
        )
        if loss == "huber" and iterations > 0:
            _huber_refit(t_w, ref_w, p_w, valid, theta, cur, converged, dt_pass, lm, lam)
        r, ln_tau, off, t0 = theta
        tau = np.exp(ln_tau)
        c = tau / r
        n = cur["n"]
        # a quantized sensor (whole °C from NVML) cannot tell the fit more than its step: the
        # residual variance is at least the quantization's, q^2 / 12, so a flat, quantized
        # temperature at flat power (any R fits it exactly) gives a wide standard error
        sigma2 = np.maximum(cur["sse"] / np.maximum(n - 4.0, 1.0), _quantum(t_g) ** 2 / 12.0)
        rho = np.clip(cur["lag"] / np.maximum(cur["sse"], 1e-300), 0.0, 0.99)
        infl = (1.0 + rho) / (1.0 - rho)
        cov = safe_pinv(cur["gram"]) * (sigma2 * infl)[:, None, None]
        var_r = cov[:, 0, 0]
        var_lnc = cov[:, 1, 1] + var_r / r**2 - 2.0 * cov[:, 0, 1] / r  # ln C = ln tau - ln R
        se_r = np.sqrt(np.maximum(var_r, 0.0))
        se_c = c * np.sqrt(np.maximum(var_lnc, 0.0))
        one = _one_step_std(mom, r, c, off, dt)
        fitted = np.isfinite(r) & (r > 1e-6) & np.isfinite(c)
        # a standard error of exactly 0 is a singular Gram matrix (the pseudo-inverse gives 0
        # along the direction the data do not constrain: flat power and a flat, quantized
        # temperature), not a perfect fit: such an R or C is not identifiable either
        r_bad = fitted & ~((se_r > 0) & (se_r <= max_rel_stderr_r * r))
        c_bad = fitted & ~((se_c > 0) & (se_c <= max_rel_stderr_c * c))
        at_bound = fitted & ~((ln_tau > lo + 1e-6) & (ln_tau < hi - 1e-6))
        capped = fitted & ~converged
        fit_reason: list[str | None] = [None] * cols.size
        p_std = np.sqrt(np.maximum(mom["cpp"], 0.0))
        res_std = np.sqrt(np.maximum(sigma2, 0.0))
        for j in np.flatnonzero(~fitted | r_bad | c_bad | at_bound | capped):  # reasons only
            why: list[str] = []
            # what was measured, not a guessed cause: the standard errors grow with the
            # residual and shrink with the power's variation
            facts = f"power std {p_std[j]:.3g} W, residual std {res_std[j]:.2g} K"
            if not fitted[j]:
                data = (p_w, j, int(n_used[cols[j]]), facts, r[j], tau[j])
                why.append(_fit_failed(bool(seed_bad[j]), *data))
            if capped[j]:
                why.append(
                    f"not converged in {iterations} iterations (the last step still lowered "
                    "the sum of squares by more than the tolerance): raise iterations"
                )
            for name, bad, se, v, gate in (
                ("R", r_bad, se_r, r, max_rel_stderr_r),
                ("C", c_bad, se_c, c, max_rel_stderr_c),
            ):
                if not bad[j]:
                    continue
                if not se[j] > 0:  # a singular fit: no direction of the data constrains it
                    why.append(f"{name} not identifiable (the data do not constrain it; {facts})")
                else:
                    why.append(
                        f"{name} not identifiable (standard error {100 * se[j] / v[j]:.1f} % > "
                        f"{100 * gate:g} %; {facts})"
                    )
            if at_bound[j]:
                why.append(
                    f"C not identifiable (time constant {tau[j]:.3g} s at the bound of the fit)"
                )
            fit_reason[j] = "; ".join(why)
        ok = np.array([w is None for w in fit_reason])
        for key, val in (
            ("r", r),
            ("c", c),
            ("off", off),
            ("t0", t0),
            ("tau", tau),
            ("ser", se_r),
            ("sec", se_c),
            ("one", one),
            ("mae", cur["sae"] / np.maximum(n, 1.0)),
        ):
            out[key][cols] = np.where(ok, val, np.nan) if key in ("r", "c", "off", "tau") else val
        usable[cols] = ok
        for j, col in enumerate(cols):
            reasons[col] = fit_reason[j]
    return RcFit(
        r_k_per_w=out["r"],
        c_j_per_k=out["c"],
        offset_k=out["off"],
        temp0_c=out["t0"],
        tau_s=out["tau"],
        r_stderr_k_per_w=out["ser"],
        c_stderr_j_per_k=out["sec"],
        one_step_std_k=out["one"],
        sim_mae_k=out["mae"],
        n_samples=n_used,
        usable=usable,
        reason=reasons,
    )


def predict_temp_c(
    temp0_c: ArrayLike,
    ref_temp_c: ArrayLike,
    power_w: ArrayLike,
    r_k_per_w: ArrayLike,
    c_j_per_k: ArrayLike,
    dt_s: ArrayLike,
    offset_k: ArrayLike = 0.0,
    *,
    return_held: bool = False,
) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.bool_]]:
    r"""Temperature path of a GPU for a given power path (transient), from a fitted model.

    Parameters
    ----------
    temp0_c : array_like
        Temperature at the first sample, e.g. the latest measurement, shape ``(...)``. [°C]
    ref_temp_c : array_like
        Coolant or inlet-air reference per sample, shape ``(n, ...)`` or broadcastable; a 1-D
        series of length ``n`` is one value per sample for every GPU. NaN: held. [°C]
    power_w : array_like
        Power path, shape ``(n, ...)`` (``(n,)`` for one GPU). A NaN (missing reading) holds
        the last valid power (leading NaN: the first valid one). [W]
    r_k_per_w, c_j_per_k : array_like
        Fitted thermal resistance [K/W] and heat capacity [J/K] (:func:`fit_rc`).
    dt_s : array_like
        Sample interval, scalar or per interval (``n - 1`` values, or ``n`` with the last
        unused); each interval is advanced by its exact zero-order-hold step. [s]
    offset_k : array_like, default 0.0
        Fitted offset of the local coolant above the reference (:attr:`RcFit.offset_k`). [K]
    return_held : bool, default False
        Also return the mask of samples whose power or reference was held (missing in the
        input). A prediction at sample ``k + 1`` uses the inputs of sample ``k``, so the
        predictions that rest on held input are ``held[:-1]`` shifted by one.

    Returns
    -------
    numpy.ndarray, or (numpy.ndarray, numpy.ndarray) with ``return_held``
        Temperature at each sample, shape ``(n, ...)`` [°C]; with ``return_held``, also the
        held-input mask of the same shape [bool].

    Notes
    -----
    :func:`rc_simulate` with the reference raised by the offset. The steady state of a
    constant power is ``steady_temp_c(ref + offset, P, R)``:
    :math:`T_{ss} = T_{ref} + \Delta + R\,P`.

    References
    ----------
    docs/physics.md §2.2 and §2.3.

    Examples
    --------
    >>> predict_temp_c(40.0, 30.0, [700.0] * 3, 0.03, 1000.0, 30.0, 0.5).round(2)
    array([40.  , 47.27, 49.94])
    """
    power, ref, held = _held_inputs(power_w, ref_temp_c, offset_k)
    dt = _per_sample_dt(dt_s, power.shape[0])
    out = rc_simulate(temp0_c, ref, power, r_k_per_w, c_j_per_k, dt)
    if not return_held:
        return out
    return out, np.broadcast_to(held.reshape(held.shape + (1,) * (out.ndim - held.ndim)), out.shape)


def _held_inputs(
    power_w: ArrayLike, ref_temp_c: ArrayLike, offset_k: ArrayLike
) -> tuple[F64, F64, NDArray[np.bool_]]:
    """Power and reference + offset on the power's time axis, NaN held (zero-order hold), and
    the mask of samples where either was held."""
    power = np.asarray(power_w, dtype=float)
    if power.ndim == 0:
        raise ValueError("power_w must be a path (one value per sample), got a scalar")
    ref = np.asarray(ref_temp_c, dtype=float)
    if ref.ndim == 1 and power.ndim > 1 and ref.shape[0] == power.shape[0] != power.shape[-1]:
        ref = ref.reshape((-1,) + (1,) * (power.ndim - 1))  # one reference series for all
    shape = np.broadcast_shapes(power.shape, ref.shape)
    if shape[0] != power.shape[0]:
        raise ValueError(f"ref_temp_c of shape {ref.shape} does not fit power {power.shape}")
    power = np.broadcast_to(power, shape)
    ref = np.broadcast_to(ref, shape) + np.asarray(offset_k, dtype=float)
    held = ~np.isfinite(power) | ~np.isfinite(ref)
    if held.any():
        power, ref = hold_gaps(power), hold_gaps(ref)
    return power, ref, held


def _per_sample_dt(dt_s: ArrayLike, n: int) -> ArrayLike:
    """A scalar step, or per-interval steps padded to one per sample (as rc_simulate takes)."""
    if np.ndim(dt_s) == 0:
        _interval_steps(dt_s, n)  # validates
        return dt_s
    steps = _interval_steps(dt_s, n)[1]
    return steps if steps is not None else dt_s


def time_to_temp_s(
    temp0_c: ArrayLike,
    ref_temp_c: ArrayLike,
    power_w: ArrayLike,
    r_k_per_w: ArrayLike,
    c_j_per_k: ArrayLike,
    dt_s: ArrayLike,
    threshold_c: ArrayLike,
    offset_k: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    r"""First time a power path takes the GPU to a temperature threshold, e.g. its slowdown.

    Parameters
    ----------
    temp0_c : array_like
        Temperature now, shape ``(...)``. [°C]
    ref_temp_c : array_like
        Coolant or inlet-air reference per sample, shape ``(n, ...)`` or broadcastable. [°C]
    power_w : array_like
        Power path, one value per sample held over the interval that follows it (the last
        sample's value is not used), shape ``(n, ...)``. [W]
    r_k_per_w, c_j_per_k : array_like
        Thermal resistance [K/W] and heat capacity [J/K].
    dt_s : float or array_like
        Sample interval, or one step per interval (``n - 1`` values, or ``n`` with the last
        unused). [s]
    threshold_c : array_like
        Temperature to reach, e.g. ``max_operating_temp_c`` or ``slowdown_temp_c``. [°C]
    offset_k : array_like, default 0.0
        Local coolant above the reference. [K]

    Returns
    -------
    numpy.ndarray
        Seconds from the first sample until the temperature first reaches the threshold
        (rising); 0 if it is already there; ``inf`` if it does not within the path. [s]

    Notes
    -----
    Within an interval the exact solution is
    :math:`T(t) = T_{ss} + (T_k - T_{ss})\,e^{-t/\tau}`, so the crossing inside interval
    :math:`k` is found exactly:
    :math:`t^* = t_k + \tau \ln\frac{T_k - T_{ss}}{T_{th} - T_{ss}}`.

    References
    ----------
    docs/physics.md §2.1 (slowdown thresholds), §2.2 and §2.3.

    Examples
    --------
    >>> # 30 °C coolant, R = 0.03 K/W, tau = 10 s, 700 W: steady 51 °C; 50 °C at tau ln 21
    >>> round(float(time_to_temp_s(30.0, 30.0, [700.0] * 61, 0.03, 1000 / 3, 1.0, 50.0)), 3)
    30.445
    >>> float(time_to_temp_s(30.0, 30.0, [700.0] * 61, 0.03, 1000 / 3, 1.0, 60.0))
    inf
    """
    power, ref, _ = _held_inputs(power_w, ref_temp_c, offset_k)
    r = np.asarray(r_k_per_w, dtype=float)
    c = np.asarray(c_j_per_k, dtype=float)
    thr = np.asarray(threshold_c, dtype=float)
    n_s = power.shape[0]
    step, steps = _interval_steps(dt_s, n_s)
    traj = rc_simulate(temp0_c, ref, power, r, c, step if steps is None else steps)
    shape = np.broadcast_shapes(traj.shape[1:], thr.shape)
    start, end = traj[:-1], traj[1:]
    t_ss = steady_temp_c(ref[:-1], power[:-1], r)
    cross = (start < thr) & (end >= thr)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = time_constant_s(r, c) * np.log((start - t_ss) / (thr - t_ss))
    col = (-1,) + (1,) * (traj.ndim - 1)
    if steps is None:
        width, t_start = step, np.arange(n_s - 1).reshape(col) * step
    else:
        width = steps[:-1].reshape(col)
        t_start = np.concatenate([[0.0], np.cumsum(steps[:-2])]).reshape(col)
    frac = np.clip(np.where(cross, frac, 0.0), 0.0, width)
    times = t_start + frac
    any_cross = np.broadcast_to(cross.any(axis=0), shape)
    first = np.broadcast_to(np.argmax(cross, axis=0), shape)
    t_first = np.take_along_axis(
        np.broadcast_to(times, (times.shape[0], *shape)), first[None], axis=0
    )[0]
    out = np.where(any_cross, t_first, np.inf)
    return np.where(np.broadcast_to(traj[0] >= thr, shape), 0.0, out)


def _fit_failed(
    seed_bad: bool, p_w: NDArray, j: int, n: int, facts: str, r: float, tau: float
) -> str:
    """ "fit failed" with the data facts that explain it: the power range, the samples, the
    residual, and where R and the time constant ended."""
    pj = p_w[:, j] if p_w.ndim == 2 and p_w.shape[1] > j else p_w[:, 0]
    pj = pj[np.isfinite(pj)]
    span = f"{float(pj.min()):.0f}-{float(pj.max()):.0f} W" if pj.size else "none"
    return (
        "fit failed (R or C not positive and finite"
        + (", from the physical seed: the linear seed was not" if seed_bad else "")
        + f"; data: power {span}, {n} temperature samples, {facts}, fitted R {r:.3g} K/W,"
        f" time constant {tau:.3g} s)"
    )
