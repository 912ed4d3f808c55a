"""Coolant distribution units (CDUs): pumps, loop hydraulics, supply temperature, capacity.

Hydraulic units throughout: head or differential pressure in kPa, volume flow in L/min, so
curve coefficients ``k`` are in kPa/(L/min)². A CDU runs ``n`` identical pumps in parallel on
the technology cooling system (TCS) loop; the loop is a pure quadratic system curve (no static
head, the usual assumption for a closed loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from models import coolant, gpu_thermal
from models.fit_quality import data_problems, fit_quality, hold_gaps

__all__ = [
    "LAG_GRID_S",
    "SHUTOFF_HEAD_RATIO",
    "CaptureFit",
    "available_capacity_kw",
    "cdu_heat_kw",
    "first_order_lag",
    "fit_capture_fraction",
    "loop_dp_kpa",
    "parallel_pump_flow_lpm",
    "predict_return_temp_c",
    "pump_curve_from_design",
    "pump_power_w",
    "pump_rated_power_w",
    "supply_temp_c",
]

F64 = NDArray[np.float64]

#: Shutoff head of a pump as a multiple of the loop's design differential pressure [1]. A
#: centrifugal pump's shutoff head is typically 1.1-1.4x its head at the best-efficiency point;
#: 1.25 is an assumption (docs/physics.md tags: A), to calibrate from speed/flow/dP telemetry.
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
    docs/physics.md §3.6 (a pump curve intersected with a system curve k·Q²) and §9.3 (loop ΔP).

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
    docs/physics.md §3.6 (affinity laws; pump curve intersected with a system curve).

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
    docs/physics.md §3.6.
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
        Wire-to-water efficiency (motor × drive × pump), an assumption (docs/physics.md: A). [1]

    Returns
    -------
    numpy.ndarray
        Electrical power per pump. [W]

    Notes
    -----
    .. math:: P = \Delta p\,(Q/n) / \eta

    with :math:`\Delta p` in Pa and :math:`Q` in m³/s. A 300 L/min, 100 kPa in-rack CDU with
    two pumps draws 0.5 kW per pump at full speed, 0.26 kW at speed 0.8: ~0.5 % of a 100 kW
    load, in the band of docs/physics.md §9.3 (RAPS Frontier ≈ 0.75 %).

    References
    ----------
    docs/physics.md §3.5 and §9.3 (pump power relative to heat load).
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
    fit :math:`a + b s^3` instead (docs/physics.md §3.6).

    References
    ----------
    docs/physics.md §3.6 (affinity laws: shaft power ∝ speed³) and §9.3.

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
    docs/physics.md §3.5 (approach 3-5 K) and §9.3.

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

    At a fixed design rise the heat a loop carries scales with flow (docs/physics.md §3.1), so a
    CDU that lost a pump loses capacity in proportion to its flow. Without flows the rating is
    used as is.

    References
    ----------
    docs/physics.md §3.1, §3.5 and §9.3.
    """
    cap = np.asarray(capacity_kw, dtype=float)
    if flow_lpm is not None and max_flow_lpm is not None:
        cap = cap * np.minimum(
            1.0, np.asarray(flow_lpm, dtype=float) / np.asarray(max_flow_lpm, dtype=float)
        )
    return cap - np.asarray(heat_kw, dtype=float)


# ---- liquid capture: fit and prediction ---------------------------------------------------------

#: Candidate loop lags [s] searched by :func:`fit_capture_fraction` (then refined by a parabola).
LAG_GRID_S: tuple[float, ...] = (0.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 90.0, 120.0)


def first_order_lag(
    x: ArrayLike, tau_s: ArrayLike, dt_s: float, y0: ArrayLike | None = None
) -> NDArray[np.float64]:
    r"""First-order lag of a series along axis 0, exact for inputs held over each step.

    Parameters
    ----------
    x : array_like
        Input series, shape ``(T, ...)``. [any unit]
    tau_s : array_like
        Time constant, broadcast against ``x.shape[1:]`` (a trailing axis of candidates works
        too); 0 passes the input through. [s]
    dt_s : float
        Sample interval. [s]
    y0 : array_like, optional
        Output at the first sample; default the first input (steady state). [unit of x]

    Returns
    -------
    numpy.ndarray
        :math:`y_k = x_k + (y_{k-1} - x_k)\,e^{-\Delta t/\tau}`, shape
        ``(T, *broadcast(x.shape[1:], tau.shape))``. [unit of x]

    Notes
    -----
    The return temperature of a loop (docs/physics.md §2.3, §9.3: TCS transport delay
    :math:`V/Q`; "fit a first-order lag for CDU supply/return temperatures") follows its
    heat-balance target with this lag. It is the same exact zero-order-hold step as the GPU
    RC model, so it runs on :func:`models.gpu_thermal.rc_simulate` with :math:`R = 1`,
    :math:`C = \tau`, no power and the target as the reference (shifted one sample so that
    the input of sample ``k`` already acts at ``k``).

    Examples
    --------
    >>> first_order_lag([0.0, 1.0, 1.0, 1.0], 1.0, 1.0).round(4)
    array([0.    , 0.6321, 0.8647, 0.9502])
    """
    xa = np.asarray(x, dtype=float)
    target = np.concatenate([xa[1:], xa[-1:]], axis=0)  # ref[k - 1] = x[k]
    tau = np.maximum(np.asarray(tau_s, dtype=float), 1e-9)
    start = xa[0] if y0 is None else np.asarray(y0, dtype=float)
    with np.errstate(over="ignore", under="ignore"):
        return gpu_thermal.rc_simulate(
            start, target, np.broadcast_to(0.0, target.shape), 1.0, tau, dt_s
        )


def cdu_heat_kw(
    rack_power_w: ArrayLike,
    fraction: ArrayLike,
    rack_cdu_index: ArrayLike,
    n_cdus: int | None = None,
) -> NDArray[np.float64]:
    r"""Heat each CDU takes from its racks: :math:`Q_c = \sum_{r \in c} f_r P_r`.

    Parameters
    ----------
    rack_power_w : array_like
        Rack input power, shape ``(T, R)`` (or ``(R,)``). [W]
    fraction : array_like
        Liquid capture fraction per rack, shape ``(R,)``. [1]
    rack_cdu_index : array_like
        CDU of each rack, index into the CDU axis; -1 for a rack on no CDU (air only). [1]
    n_cdus : int, optional
        Number of CDUs; default ``max(rack_cdu_index) + 1``.

    Returns
    -------
    numpy.ndarray
        Heat to liquid per CDU, shape ``(T, C)``. [kW]

    References
    ----------
    docs/physics.md §3.7 and §9.4 (capture fraction).

    Examples
    --------
    >>> cdu_heat_kw([[10_000.0, 20_000.0, 5_000.0]], [0.75, 0.9, 0.0], [0, 0, -1])
    array([[25.5]])
    """
    p = np.asarray(rack_power_w, dtype=float)
    idx = np.asarray(rack_cdu_index, dtype=np.int64)
    n = int(idx.max()) + 1 if n_cdus is None else int(n_cdus)
    onehot = np.zeros((idx.size, n))
    on = idx >= 0
    onehot[np.flatnonzero(on), idx[on]] = np.asarray(fraction, dtype=float)[on]
    return p @ onehot / 1000.0


def predict_return_temp_c(
    supply_c: ArrayLike,
    rack_power_w: ArrayLike,
    fraction: ArrayLike,
    rack_cdu_index: ArrayLike,
    flow_lpm: ArrayLike,
    fluid: str | Sequence[str] = "pg25",
    *,
    lag_tau_s: ArrayLike = 0.0,
    dt_s: float = 1.0,
    return0_c: ArrayLike | None = None,
) -> NDArray[np.float64]:
    r"""TCS return temperature of each CDU from its supply, flow and racks' power.

    Parameters
    ----------
    supply_c : array_like
        TCS supply temperature per CDU, shape ``(T, C)``. [°C]
    rack_power_w : array_like
        Rack input power, shape ``(T, R)``. [W]
    fraction : array_like
        Liquid capture fraction per rack (:func:`fit_capture_fraction`), shape ``(R,)``. [1]
    rack_cdu_index : array_like
        CDU of each rack; -1 for none. [1]
    flow_lpm : array_like
        TCS flow per CDU, shape ``(T, C)`` or broadcastable. [L/min]
    fluid : str or sequence of str, default "pg25"
        Coolant of all CDUs, or one per CDU (``"water"`` or ``"pg25"``).
    lag_tau_s : array_like, default 0.0
        Loop lag per CDU (:attr:`CaptureFit.lag_tau_s`). [s]
    dt_s : float, default 1.0
        Sample interval. [s]
    return0_c : array_like, optional
        Return temperature at the first sample (e.g. the latest measurement); default the
        steady-state value. [°C]

    Returns
    -------
    numpy.ndarray
        Predicted return temperature, shape ``(T, C)``. [°C]

    Notes
    -----
    .. math::

        Q_c = \sum_{r \in c} f_r P_r, \qquad
        T_{return}^{target} = T_{supply} + \frac{Q_c}{\rho\,\dot V\,c_p}

    (:func:`models.coolant.return_temp_c`), followed through the first-order loop lag
    (:func:`first_order_lag`). For the flow needed per kW use
    :func:`models.coolant.flow_for_heat_lpm`; for the flow after losing a pump,
    :func:`parallel_pump_flow_lpm`.

    References
    ----------
    docs/physics.md §3.1 (heat balance), §3.2 (properties), §3.7 and §9.4 (capture fraction),
    §2.3 (loop lag).

    Examples
    --------
    >>> predict_return_temp_c([[30.0]], [[40_000.0]], [0.75], [0], [[450.0]], "pg25").round(2)
    array([[31.]])
    """
    sup = np.asarray(supply_c, dtype=float)
    if sup.ndim == 1:
        sup = sup[:, None]
    n_c = sup.shape[1]
    heat = cdu_heat_kw(rack_power_w, fraction, rack_cdu_index, n_c)
    flow = np.broadcast_to(np.asarray(flow_lpm, dtype=float), heat.shape)
    fluids = [fluid] * n_c if isinstance(fluid, str) else list(fluid)
    target = np.empty(heat.shape)
    for name in set(fluids):
        m = np.array([f == name for f in fluids])
        target[:, m] = coolant.return_temp_c(sup[:, m], heat[:, m], flow[:, m], name)
    tau = np.broadcast_to(np.asarray(lag_tau_s, dtype=float), (n_c,))
    if not np.any(tau > 0) and return0_c is None:
        return target
    return first_order_lag(target, tau, dt_s, return0_c)


@dataclass(frozen=True)
class CaptureFit:
    """Result of :func:`fit_capture_fraction`.

    Per rack (shape ``(R,)``):

    Attributes
    ----------
    fraction : numpy.ndarray
        Liquid capture fraction; 0 for a rack on no CDU, NaN where unusable. [1]
    stderr : numpy.ndarray
        Its standard error (for a fallback share: the error of the CDU-level multiplier
        times the prior). [1]
    identifiable : numpy.ndarray
        False where the rack's power history cannot be told apart from its neighbours' on
        the same CDU; its fraction is then a prior-weighted share. [bool]
    usable : numpy.ndarray
        False where the data cannot support any value. [bool]
    reason : list of (str or None)
        Why a rack is unusable or not identifiable, None otherwise.

    Per CDU (shape ``(C,)``):

    cdu_fraction, cdu_fraction_stderr : numpy.ndarray
        Heat to liquid over rack power of the whole CDU, and its standard error. [1]
    lag_tau_s : numpy.ndarray
        Loop lag of the metered heat behind the rack power. [s]
    mae_kw, cv_rmse, nmbe : numpy.ndarray
        Fit quality of the heat balance over the fit window. [kW], [1], [1]
    n_samples : numpy.ndarray
        Samples used. [1]
    cdu_usable : numpy.ndarray
        False where the CDU's data could not be fitted. [bool]
    cdu_reason : list of (str or None)
        Why.
    """

    fraction: F64
    stderr: F64
    identifiable: NDArray[np.bool_]
    usable: NDArray[np.bool_]
    reason: list[str | None]
    cdu_fraction: F64
    cdu_fraction_stderr: F64
    lag_tau_s: F64
    mae_kw: F64
    cv_rmse: F64
    nmbe: F64
    n_samples: NDArray[np.int64]
    cdu_usable: NDArray[np.bool_]
    cdu_reason: list[str | None]


def _ls_stderr(a: F64, y: F64, coef: F64) -> tuple[F64, float]:
    """OLS standard errors of ``coef`` for ``y ≈ a @ coef``, inflated for lag-1 correlation."""
    res = y - a @ coef
    n, p = a.shape
    sse = float(res @ res)
    rho = float(np.clip((res[1:] @ res[:-1]) / sse, 0.0, 0.99)) if sse > 0 else 0.0
    sigma2 = sse / max(n - p, 1) * (1.0 + rho) / (1.0 - rho)
    cov = np.linalg.pinv(a.T @ a) * sigma2
    return np.sqrt(np.maximum(np.diag(cov), 0.0)), sse


def fit_capture_fraction(
    rack_power_w: ArrayLike,
    cdu_heat_kw: ArrayLike,
    rack_cdu_index: ArrayLike,
    prior: ArrayLike,
    prior_weight: float = 1e-3,
    *,
    dt_s: float = 1.0,
    lag_tau_s: ArrayLike | None = None,
    max_stderr: float = 0.02,
    min_samples: int = 300,
    max_gap_frac: float = 0.2,
    max_stuck_s: float | None = 600.0,
) -> CaptureFit:
    r"""Fit the liquid capture fraction of every rack from its CDU's metered heat.

    Parameters
    ----------
    rack_power_w : array_like
        Rack input power (PDU), shape ``(T, R)``. [W]
    cdu_heat_kw : array_like
        Heat metered by each CDU, :math:`\rho \dot V c_p (T_{return} - T_{supply})` (the
        CDU's ``heat_kw``), shape ``(T, C)``. [kW]
    rack_cdu_index : array_like
        CDU of each rack, an index into the CDU axis; -1 for a rack on no CDU. [1]
    prior : array_like
        Prior capture fraction per rack (catalog, docs/physics.md §9.4), shape ``(R,)``. [1]
    prior_weight : float, default 1e-3
        Weight of the ridge toward the prior, relative to the mean diagonal of the normal
        equations: weak, it only decides among collinear racks. [1]
    dt_s : float, default 1.0
        Sample interval. [s]
    lag_tau_s : array_like, optional
        Loop lag of the metered heat per CDU; default: estimated per CDU over
        :data:`LAG_GRID_S` and refined by a parabola. [s]
    max_stderr : float, default 0.02
        Largest standard error of a rack's fraction for it to count as identifiable. [1]
    min_samples, max_gap_frac, max_stuck_s
        Data checks on the heat and power series (:func:`models.fit_quality.data_problems`).

    Returns
    -------
    CaptureFit

    Notes
    -----
    Per CDU :math:`c` with racks :math:`r \in c`:

    .. math::

        Q_c(t) = \sum_{r \in c} f_r\, L_\tau[P_r](t), \qquad 0 \le f_r \le 1

    where :math:`L_\tau` is the first-order loop lag (:func:`first_order_lag`; the meter
    reads the return temperature, which lags the heat). Solved by bounded least squares
    (:func:`scipy.optimize.lsq_linear`) with a weak ridge
    :math:`\lambda \sum (f_r - f_r^{prior})^2`. A rack whose standard error exceeds
    ``max_stderr`` (racks running the same job move together, so their histories are
    collinear) is not identifiable: such racks are pooled into one term
    :math:`k \sum f_r^{prior} L_\tau[P_r]` and each gets :math:`k\,f_r^{prior}`, a
    prior-weighted share of what the CDU's heat balance says; ``reason`` names its
    neighbours. The CDU-level fraction :math:`Q_c / \sum P_r` is always reported.

    References
    ----------
    docs/physics.md §3.1 (heat balance), §3.7 and §9.4 (capture fraction; calibrate per rack
    :math:`f = \rho \dot V c_p \Delta T / P_{rack}`), §2.3 (loop lag).
    """
    p_all = np.asarray(rack_power_w, dtype=float)
    q_all = np.asarray(cdu_heat_kw, dtype=float)
    if q_all.ndim == 1:
        q_all = q_all[:, None]
    if p_all.ndim == 1:
        p_all = p_all[:, None]
    idx = np.asarray(rack_cdu_index, dtype=np.int64)
    pri = np.broadcast_to(np.asarray(prior, dtype=float), idx.shape)
    n_r, n_c = idx.size, q_all.shape[1]
    frac = np.where(idx < 0, 0.0, np.nan)
    se = np.where(idx < 0, 0.0, np.nan)
    ident = idx < 0
    usable = idx < 0
    reason: list[str | None] = [None] * n_r
    out = {k: np.full(n_c, np.nan) for k in ("cf", "cfse", "tau", "mae", "cv", "nmbe")}
    n_used = np.zeros(n_c, dtype=np.int64)
    cdu_ok = np.zeros(n_c, dtype=bool)
    cdu_reason: list[str | None] = [None] * n_c
    checks = {"min_samples": min_samples, "max_gap_frac": max_gap_frac, "dt_s": dt_s}
    heat_problems = data_problems(q_all, flat_std=1e-6, max_stuck_s=max_stuck_s, **checks)
    power_problems = data_problems(p_all, flat_std=0.0, max_stuck_s=max_stuck_s, **checks)
    taus = None if lag_tau_s is None else np.broadcast_to(np.asarray(lag_tau_s, float), (n_c,))
    for c in range(n_c):
        racks = np.flatnonzero(idx == c)
        if racks.size == 0:
            cdu_reason[c] = "no racks on this CDU"
            continue
        why = [f"heat: {heat_problems[c]}"] if heat_problems[c] else []
        why += [f"rack {r} power: {power_problems[r]}" for r in racks if power_problems[r]]
        if why:
            cdu_reason[c] = "; ".join(why)
            for r in racks:
                reason[r] = f"CDU {c}: {cdu_reason[c]}"
            continue
        y = q_all[:, c]
        x = hold_gaps(p_all[:, racks]) / 1000.0  # kW
        rows = np.isfinite(y) & np.isfinite(p_all[:, racks]).all(axis=1)
        tau = _best_lag_s(x, y, rows, dt_s) if taus is None else float(taus[c])
        a_mat = first_order_lag(x, tau, dt_s)[rows]
        yv = y[rows]
        n_used[c] = int(rows.sum())
        out["tau"][c] = tau
        # CDU level: Q = f_cdu * sum P
        tot = a_mat.sum(axis=1, keepdims=True)
        f_cdu = float(np.linalg.lstsq(tot, yv, rcond=None)[0][0])
        se_cdu, _ = _ls_stderr(tot, yv, np.array([f_cdu]))
        out["cf"][c], out["cfse"][c] = f_cdu, float(se_cdu[0])
        # per rack, pooling racks that cannot be separated
        free, pooled, sol, ses, alone, design = _pooled_rack_fit(
            a_mat, yv, pri[racks], prior_weight, max_stderr
        )
        pred = design @ sol
        q = fit_quality(yv, pred)
        out["mae"][c], out["cv"][c], out["nmbe"][c] = q.mae, q.cv_rmse, q.nmbe
        cdu_ok[c] = True
        for i, j in enumerate(free):
            r = racks[j]
            frac[r], se[r], ident[r], usable[r] = sol[i], ses[i], True, True
        k_mult, k_se = sol[-1], ses[-1]
        for j in pooled:
            r = racks[j]
            frac[r], se[r], ident[r], usable[r] = k_mult * pri[r], k_se * pri[r], False, True
            reason[r] = _pooled_reason(c, racks[pooled], float(alone[j]), max_stderr, k_mult)
    return CaptureFit(
        fraction=frac,
        stderr=se,
        identifiable=ident,
        usable=usable,
        reason=reason,
        cdu_fraction=out["cf"],
        cdu_fraction_stderr=out["cfse"],
        lag_tau_s=out["tau"],
        mae_kw=out["mae"],
        cv_rmse=out["cv"],
        nmbe=out["nmbe"],
        n_samples=n_used,
        cdu_usable=cdu_ok,
        cdu_reason=cdu_reason,
    )


def _best_lag_s(x: F64, y: F64, rows: NDArray[np.bool_], dt_s: float) -> float:
    """The loop lag [s] over :data:`LAG_GRID_S` under which the lagged rack powers ``x``
    (``(T, racks)``, kW) explain the metered heat ``y`` best, refined by a parabola through
    the three best points."""
    n_racks = x.shape[1]
    grid = np.asarray(LAG_GRID_S)
    xf = first_order_lag(x[:, None, :], grid[:, None], dt_s)  # (T, n_tau, n_racks)
    sse = np.array(
        [
            np.linalg.lstsq(xf[rows, i], y[rows], rcond=None)[1].sum()
            if rows.sum() > n_racks
            else np.inf
            for i in range(grid.size)
        ]
    )
    k = int(np.argmin(sse))
    tau = float(grid[k])
    if 0 < k < grid.size - 1:  # parabola through the three best points
        x0, x1, x2 = grid[k - 1 : k + 2]
        y0, y1, y2 = sse[k - 1 : k + 2]
        d0, d1 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
        curv = (d1 - d0) / (x2 - x0)
        if curv > 0:
            tau = float(np.clip(0.5 * (x0 + x1) - d0 / (2 * curv), x0, x2))
    return tau


def _pooled_rack_fit(
    a_mat: F64, yv: F64, pri: F64, prior_weight: float, max_stderr: float
) -> tuple[list[int], list[int], F64, F64, F64, F64]:
    """The per-rack fractions of one CDU by bounded ridge least squares, pooling the racks
    whose standard error exceeds ``max_stderr`` into one prior-weighted term until every
    free rack is identifiable. Returns the free and the pooled racks (indices into the
    columns of ``a_mat``), the solution (free racks, then the pool's multiplier), its
    standard errors, each rack's standard error before pooling, and the design matrix."""
    n_racks = a_mat.shape[1]
    pooled: list[int] = []
    alone = np.full(n_racks, np.nan)  # each rack's standard error before pooling
    for _ in range(n_racks + 1):
        free = [j for j in range(n_racks) if j not in pooled]
        cols = [a_mat[:, j] for j in free]
        lo, hi, prior_c = [0.0] * len(free), [1.0] * len(free), [pri[j] for j in free]
        if pooled:
            cols.append(a_mat[:, pooled] @ pri[pooled])
            lo.append(0.0)
            hi.append(1.0 / max(float(pri[pooled].max()), 1e-9))
            prior_c.append(1.0)
        design = np.column_stack(cols)
        gram_diag = float(np.mean(np.sum(design * design, axis=0)))
        lam = np.sqrt(prior_weight * gram_diag)
        aug = np.vstack([design, lam * np.eye(design.shape[1])])
        rhs = np.concatenate([yv, lam * np.asarray(prior_c)])
        from scipy.optimize import lsq_linear  # imported when a fit needs it (~0.5 s)

        sol = lsq_linear(aug, rhs, bounds=(np.asarray(lo), np.asarray(hi))).x
        ses, _ = _ls_stderr(design, yv, sol)
        if not pooled:
            alone[:] = ses
        bad = [free[i] for i in range(len(free)) if ses[i] > max_stderr]
        if not bad or len(free) == 0:
            break
        pooled += bad
    return free, pooled, sol, ses, alone, design


def _pooled_reason(
    c: int, pool: NDArray[np.int64], se_alone: float, max_stderr: float, k: float
) -> str:
    """Why a rack of CDU ``c`` got a share of its pool ``pool`` instead of its own fraction."""
    names = ", ".join(str(r) for r in pool)
    return (
        f"not separable on CDU {c}: standard error {se_alone:.3f} > {max_stderr:g} "
        "(its power history is too collinear with its neighbours' or too flat); "
        f"value is a prior-weighted share of the heat of racks {names} "
        f"(multiplier {k:.3f} on the prior)"
    )
