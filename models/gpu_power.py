"""GPU board power as a function of SM activity.

One function per named model, arrays in and arrays out (pvlib style). Every parameter accepts a
scalar or a numpy array; arrays broadcast against each other.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["gpu_power_w"]


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
    physics.md §1.3 (shape: linear in utilization in ExaDigiT/RAPS ``raps/power.py``, with an
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
