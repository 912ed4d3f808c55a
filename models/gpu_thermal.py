"""GPU temperature above its local coolant: a first-order thermal RC model.

The GPU (or its HBM) is one heat capacity ``C`` joined to the local coolant (liquid cold plate)
or inlet air (air heat sink) through one thermal resistance ``R``:

    C dT/dt = P - (T - T_ref) / R

Every function takes scalars or numpy arrays that broadcast against each other, so one call
handles 10,000 GPUs. A fitter can reuse :func:`rc_simulate` as its output-error model.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["rc_simulate", "rc_step", "steady_temp_c", "time_constant_s"]


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
    physics.md §2.2 (steady state above the coolant) and §9.2 (R defaults: 0.03 K/W liquid,
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
    physics.md §2.3 and §9.2 (tau ≈ 10 s cold plate, ≈ 60 s air heat sink).
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
    physics.md §2.2 (steady state), §2.3 and §9.2 (time constants).

    Examples
    --------
    >>> round(float(rc_step(32.0, 32.0, 700.0, 0.03, 1000.0 / 3, 1e6)), 6)
    53.0
    """
    r = np.asarray(r_k_per_w, dtype=float)
    t_ss = steady_temp_c(ref_temp_c, power_w, r)
    decay = np.exp(-np.asarray(dt_s, dtype=float) / (r * np.asarray(c_j_per_k, dtype=float)))
    return t_ss + (np.asarray(temp_c, dtype=float) - t_ss) * decay


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
        Thermal resistance, shape ``(...)``. [K/W]
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
    physics.md §2.2, §2.3 and §9.2; DESIGN.md "Measured on this kind of machine" (fitting the
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
    per_step = dt.ndim > 0
    t = np.broadcast_to(
        np.asarray(temp0_c, dtype=float), np.broadcast_shapes(power.shape[1:], r.shape, c.shape)
    )
    out = np.empty((n, *t.shape))
    out[0] = t
    for k in range(1, n):
        t = rc_step(t, ref[k - 1], power[k - 1], r, c, dt[k - 1] if per_step else dt)
        out[k] = t
    return out
