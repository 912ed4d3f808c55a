"""Coolant distribution units (CDUs): pumps, loop hydraulics, supply temperature, capacity.

Hydraulic units throughout: head or differential pressure in kPa, volume flow in L/min, so
curve coefficients ``k`` are in kPa/(L/min)². A CDU runs ``n`` identical pumps in parallel on
the technology cooling system (TCS) loop; the loop is a pure quadratic system curve (no static
head, the usual assumption for a closed loop).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "SHUTOFF_HEAD_RATIO",
    "available_capacity_kw",
    "loop_dp_kpa",
    "parallel_pump_flow_lpm",
    "pump_curve_from_design",
    "pump_power_w",
    "pump_rated_power_w",
    "supply_temp_c",
]

#: Shutoff head of a pump as a multiple of the loop's design differential pressure [1]. A
#: centrifugal pump's shutoff head is typically 1.1-1.4x its head at the best-efficiency point;
#: 1.25 is an assumption (physics.md tags: A), to calibrate from speed/flow/dP telemetry.
SHUTOFF_HEAD_RATIO = 1.25


def pump_curve_from_design(
    max_flow_lpm: ArrayLike,
    design_dp_kpa: ArrayLike,
    n_pumps: ArrayLike,
    shutoff_ratio: float = SHUTOFF_HEAD_RATIO,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    r"""Pump and system curves that put the design point where all pumps at full speed give it.

    Parameters
    ----------
    max_flow_lpm : array_like
        Loop flow with every pump at speed 1. [L/min]
    design_dp_kpa : array_like
        Loop differential pressure at that flow. [kPa]
    n_pumps : array_like
        Number of identical pumps in parallel. [1]
    shutoff_ratio : float, default 1.25
        Shutoff head over design differential pressure, :data:`SHUTOFF_HEAD_RATIO`. [1]

    Returns
    -------
    shutoff_head_kpa : numpy.ndarray
        :math:`H_0`, head of one pump at zero flow and speed 1. [kPa]
    pump_k : numpy.ndarray
        :math:`k_p` of one pump's curve :math:`H = H_0 s^2 - k_p q^2`. [kPa/(L/min)²]
    system_k : numpy.ndarray
        :math:`k_s` of the system curve :math:`H = k_s Q^2`. [kPa/(L/min)²]

    Notes
    -----
    With :math:`Q_d` = ``max_flow_lpm``, :math:`H_d` = ``design_dp_kpa``, :math:`n` pumps:

    .. math::

        H_0 = 1.25\,H_d, \qquad k_s = H_d / Q_d^2, \qquad
        k_p = (H_0 - H_d)\,n^2 / Q_d^2

    so that each pump delivers :math:`Q_d/n` at head :math:`H_d` when all run at speed 1.

    References
    ----------
    physics.md §3.6 (a pump curve intersected with a system curve k·Q²) and §9.3 (loop ΔP).

    Examples
    --------
    >>> [round(float(x), 6) for x in pump_curve_from_design(300.0, 100.0, 2)]
    [125.0, 0.001111, 0.001111]
    """
    q = np.asarray(max_flow_lpm, dtype=float)
    h = np.asarray(design_dp_kpa, dtype=float)
    n = np.asarray(n_pumps, dtype=float)
    h0 = shutoff_ratio * h
    return h0, (h0 - h) * n**2 / q**2, h / q**2


def parallel_pump_flow_lpm(
    n_running: ArrayLike,
    speed_frac: ArrayLike,
    shutoff_head_kpa: ArrayLike,
    pump_k: ArrayLike,
    system_k: ArrayLike,
) -> NDArray[np.float64]:
    r"""Loop flow of ``n_running`` identical pumps in parallel at one speed.

    Parameters
    ----------
    n_running : array_like
        Pumps running. [1]
    speed_frac : array_like
        Pump speed as a fraction of full speed, 0..1. [1]
    shutoff_head_kpa : array_like
        :math:`H_0`, one pump's shutoff head at speed 1. [kPa]
    pump_k : array_like
        :math:`k_p` of the pump curve. [kPa/(L/min)²]
    system_k : array_like
        :math:`k_s` of the system curve. [kPa/(L/min)²]

    Returns
    -------
    numpy.ndarray
        Loop flow; 0 when no pump runs. [L/min]

    Notes
    -----
    Each pump follows :math:`H = H_0 s^2 - k_p q^2` (affinity laws: head ∝ s²), the loop
    :math:`H = k_s Q^2`, and :math:`Q = n q`, so

    .. math:: Q = s \sqrt{H_0 / (k_s + k_p / n^2)}

    Losing one of two pumps lowers the flow, by less than half, because the remaining pump
    moves out along its curve.

    References
    ----------
    physics.md §3.6 (affinity laws; pump curve intersected with a system curve).

    Examples
    --------
    >>> h0, kp, ks = pump_curve_from_design(300.0, 100.0, 2)
    >>> round(float(parallel_pump_flow_lpm(2, 1.0, h0, kp, ks)), 6)
    300.0
    """
    n = np.asarray(n_running, dtype=float)
    s = np.asarray(speed_frac, dtype=float)
    n_safe = np.where(n > 0, n, 1.0)
    q = s * np.sqrt(
        np.asarray(shutoff_head_kpa, dtype=float)
        / (np.asarray(system_k, dtype=float) + np.asarray(pump_k, dtype=float) / n_safe**2)
    )
    return np.where(n > 0, q, 0.0)


def loop_dp_kpa(flow_lpm: ArrayLike, system_k: ArrayLike) -> NDArray[np.float64]:
    r"""Loop differential pressure on the system curve :math:`\Delta p = k_s Q^2`.

    Parameters
    ----------
    flow_lpm : array_like
        Loop flow. [L/min]
    system_k : array_like
        :math:`k_s` of the system curve. [kPa/(L/min)²]

    Returns
    -------
    numpy.ndarray
        Differential pressure. [kPa]

    References
    ----------
    physics.md §3.6.
    """
    return np.asarray(system_k, dtype=float) * np.asarray(flow_lpm, dtype=float) ** 2


def pump_rated_power_w(
    max_flow_lpm: ArrayLike,
    design_dp_kpa: ArrayLike,
    n_pumps: ArrayLike,
    efficiency: ArrayLike = 0.5,
) -> NDArray[np.float64]:
    r"""Electrical power of one pump at speed 1 at the design point.

    Parameters
    ----------
    max_flow_lpm : array_like
        Loop flow with every pump at speed 1. [L/min]
    design_dp_kpa : array_like
        Loop differential pressure at that flow. [kPa]
    n_pumps : array_like
        Pumps sharing the flow. [1]
    efficiency : array_like, default 0.5
        Wire-to-water efficiency (motor × drive × pump), an assumption (physics.md: A). [1]

    Returns
    -------
    numpy.ndarray
        Electrical power per pump. [W]

    Notes
    -----
    .. math:: P = \Delta p\,(Q/n) / \eta

    with :math:`\Delta p` in Pa and :math:`Q` in m³/s. A 300 L/min, 100 kPa in-rack CDU with
    two pumps draws 0.5 kW per pump at full speed, 0.26 kW at speed 0.8: ~0.5 % of a 100 kW
    load, in the band of physics.md §9.3 (RAPS Frontier ≈ 0.75 %).

    References
    ----------
    physics.md §3.5 and §9.3 (pump power relative to heat load).
    """
    q_m3s = np.asarray(max_flow_lpm, dtype=float) / 60_000.0
    dp_pa = np.asarray(design_dp_kpa, dtype=float) * 1000.0
    return dp_pa * q_m3s / np.asarray(n_pumps, dtype=float) / np.asarray(efficiency, dtype=float)


def pump_power_w(
    speed_frac: ArrayLike, rated_power_w: ArrayLike, base_w: ArrayLike = 0.0
) -> NDArray[np.float64]:
    r"""Electrical power of a pump from its speed, by the affinity laws.

    Parameters
    ----------
    speed_frac : array_like
        Pump speed as a fraction of full speed, 0..1; 0 is a stopped pump. [1]
    rated_power_w : array_like
        Power at speed 1 on the design system curve (:func:`pump_rated_power_w`). [W]
    base_w : array_like, default 0.0
        Speed-independent draw of a running pump (drive, controls). [W]

    Returns
    -------
    numpy.ndarray
        Electrical power; 0 for a stopped pump. [W]

    Notes
    -----
    .. math:: P = P_{base} + P_{rated}\,s^3 \quad (s > 0), \qquad P = 0 \quad (s = 0)

    The cube law holds on a fixed quadratic system curve; with a DP setpoint or static head
    fit :math:`a + b s^3` instead (physics.md §3.6).

    References
    ----------
    physics.md §3.6 (affinity laws: shaft power ∝ speed³) and §9.3.

    Examples
    --------
    >>> round(float(pump_power_w(0.8, 500.0)), 6)
    256.0
    """
    s = np.asarray(speed_frac, dtype=float)
    p = np.asarray(base_w, dtype=float) + np.asarray(rated_power_w, dtype=float) * s**3
    return np.where(s > 0, p, 0.0)


def supply_temp_c(
    fw_supply_c: ArrayLike, approach_k: ArrayLike, setpoint_c: ArrayLike
) -> NDArray[np.float64]:
    r"""TCS supply temperature a liquid-to-liquid CDU can hold.

    Parameters
    ----------
    fw_supply_c : array_like
        Facility water (FWS) supply temperature. [°C]
    approach_k : array_like
        CDU approach: TCS supply minus FWS supply at full duty. [K]
    setpoint_c : array_like
        TCS supply setpoint. [°C]

    Returns
    -------
    numpy.ndarray
        TCS supply temperature. [°C]

    Notes
    -----
    .. math:: T_{TCS,supply} = \max(T_{set}, T_{FWS,supply} + \Delta T_{approach})

    The CDU's control valve holds the setpoint while facility water is cold enough; otherwise
    the supply floats at facility water plus the approach.

    References
    ----------
    physics.md §3.5 (approach 3-5 K) and §9.3.

    Examples
    --------
    >>> float(supply_temp_c(30.0, 4.0, 32.0))
    34.0
    """
    return np.maximum(
        np.asarray(setpoint_c, dtype=float),
        np.asarray(fw_supply_c, dtype=float) + np.asarray(approach_k, dtype=float),
    )


def available_capacity_kw(
    capacity_kw: ArrayLike,
    heat_kw: ArrayLike,
    flow_lpm: ArrayLike | None = None,
    max_flow_lpm: ArrayLike | None = None,
) -> NDArray[np.float64]:
    r"""Heat a CDU can still take.

    Parameters
    ----------
    capacity_kw : array_like
        Rated heat capacity at full flow. [kW]
    heat_kw : array_like
        Heat it carries now. [kW]
    flow_lpm : array_like, optional
        Current loop flow. [L/min]
    max_flow_lpm : array_like, optional
        Loop flow at rating. [L/min]

    Returns
    -------
    numpy.ndarray
        Remaining capacity; negative when overloaded. [kW]

    Notes
    -----
    .. math:: Q_{avail} = Q_{rated}\,\min(1, \dot V / \dot V_{max}) - Q

    At a fixed design rise the heat a loop carries scales with flow (physics.md §3.1), so a
    CDU that lost a pump loses capacity in proportion to its flow. Without flows the rating is
    used as is.

    References
    ----------
    physics.md §3.1, §3.5 and §9.3.
    """
    cap = np.asarray(capacity_kw, dtype=float)
    if flow_lpm is not None and max_flow_lpm is not None:
        cap = cap * np.minimum(
            1.0, np.asarray(flow_lpm, dtype=float) / np.asarray(max_flow_lpm, dtype=float)
        )
    return cap - np.asarray(heat_kw, dtype=float)
