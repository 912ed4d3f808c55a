"""Node power, power conversion and PDU phase currents.

Wiring names follow the site file's ``Pdu.wiring``: ``"wye"`` (e.g. 415/240 V, outlets
line-to-neutral, each phase on its own) and ``"delta"`` (North American 208 V, outlets
line-to-line on branches L1-L2, L2-L3, L3-L1). ``"single"`` is a single-phase feed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from models.fit_quality import FitQuality, data_problems, fit_quality, join_reasons

__all__ = [
    "DELTA_BRANCHES",
    "LineFitQuality",
    "RackPowerFit",
    "delta_line_currents_a",
    "derated_limit_a",
    "fit_affine",
    "fit_rack_power",
    "imbalance",
    "node_power_w",
    "phase_current_a",
    "phase_voltage_v",
    "psu_input_w",
    "rack_input_power_w",
]

F64 = NDArray[np.float64]

#: Branch (line-to-line) circuits of a delta PDU, in the order :func:`delta_line_currents_a`
#: expects them on its last axis.
DELTA_BRANCHES: tuple[str, str, str] = ("L1-L2", "L2-L3", "L3-L1")

_SQRT3 = float(np.sqrt(3.0))


def node_power_w(
    sum_gpu_w: ArrayLike, base_w: ArrayLike, overhead_frac: ArrayLike
) -> NDArray[np.float64]:
    r"""DC load of a node (its PSUs' output) from the sum of its GPUs' power.

    Parameters
    ----------
    sum_gpu_w : array_like
        Sum of the node's GPU board powers. [W]
    base_w : array_like
        Non-GPU load at idle: CPUs, DRAM, NICs, NVMe, fans at minimum (``a``). [W]
    overhead_frac : array_like
        Non-GPU load that scales with GPU power (NVSwitch, fans, VRMs) per watt of GPU power;
        the slope is ``b = 1 + overhead_frac``. [1]

    Returns
    -------
    numpy.ndarray
        Node DC load (PSU output). [W]

    Notes
    -----
    .. math:: P_{node,DC} = a + b \sum P_{gpu}, \qquad a = P_{base}, \quad b = 1 + f_{oh}

    The catalog's ``gpu_overhead_frac`` is :math:`f_{oh}`. PSU losses are added by
    :func:`psu_input_w`.

    References
    ----------
    docs/physics.md §1.4 (non-GPU overhead of a DGX H100), §7.1 (RAPS node model) and §9.1.

    Examples
    --------
    >>> float(node_power_w(8 * 700.0, 1200.0, 0.25))
    8200.0
    """
    return np.asarray(base_w, dtype=float) + (
        1.0 + np.asarray(overhead_frac, dtype=float)
    ) * np.asarray(sum_gpu_w, dtype=float)


def psu_input_w(
    p_out_w: ArrayLike, loss_const_w: ArrayLike = 17.0, efficiency: ArrayLike = 0.96
) -> NDArray[np.float64]:
    r"""AC input power of a power supply (rectifier) from its DC output.

    Parameters
    ----------
    p_out_w : array_like
        DC output power. [W]
    loss_const_w : array_like, default 17.0
        Constant loss. [W]
    efficiency : array_like, default 0.96
        Proportional efficiency. [1]

    Returns
    -------
    numpy.ndarray
        AC input power. [W]

    Notes
    -----
    Affine-efficiency loss model:

    .. math:: P_{in} = (P_{out} + L) / \eta

    Defaults are the RAPS Frontier rectifier (L = 17 W, η = 0.96), applied per node here.

    References
    ----------
    docs/physics.md §4.2 (conversion losses) and §9.5; ExaDigiT/RAPS ``raps/power.py``.

    Examples
    --------
    >>> round(float(psu_input_w(8200.0)), 1)
    8559.4
    """
    return (np.asarray(p_out_w, dtype=float) + np.asarray(loss_const_w, dtype=float)) / np.asarray(
        efficiency, dtype=float
    )


def phase_voltage_v(voltage_ll_v: ArrayLike, wiring: str = "wye") -> NDArray[np.float64]:
    r"""Voltage across one load: :math:`V_{LL}/\sqrt{3}` for wye, :math:`V_{LL}` otherwise. [V]

    Parameters
    ----------
    voltage_ll_v : array_like
        Line-to-line voltage (the outlet voltage for ``"single"``). [V]
    wiring : {"wye", "delta", "single"}
        How loads are connected.

    References
    ----------
    docs/physics.md §4.1.
    """
    v = np.asarray(voltage_ll_v, dtype=float)
    if wiring == "wye":
        return v / _SQRT3
    if wiring in ("delta", "single"):
        return v
    raise ValueError(f"unknown wiring {wiring!r}; expected 'wye', 'delta' or 'single'")


def phase_current_a(
    power_w: ArrayLike, voltage_ll_v: ArrayLike, power_factor: ArrayLike, wiring: str = "wye"
) -> NDArray[np.float64]:
    r"""RMS current of the load(s) on one phase or branch.

    Parameters
    ----------
    power_w : array_like
        Real power of the loads on that phase (wye) or branch (delta). [W]
    voltage_ll_v : array_like
        Line-to-line voltage of the feed (the outlet voltage for ``"single"``). [V]
    power_factor : array_like
        Power factor of the loads, 0..1. [1]
    wiring : {"wye", "delta", "single"}, default "wye"
        ``"wye"``: loads line-to-neutral, the result is that line's current.
        ``"delta"``: loads line-to-line, the result is the *branch* current; combine branches
        into line currents with :func:`delta_line_currents_a`. ``"single"``: one phase.

    Returns
    -------
    numpy.ndarray
        RMS current. [A]

    Notes
    -----
    .. math::

        I_{wye} = \frac{P_{phase}}{(V_{LL}/\sqrt{3})\,PF}, \qquad
        I_{branch} = \frac{P_{branch}}{V_{LL}\,PF}

    For a balanced wye load the three phases sum to :math:`P = \sqrt{3}\,V_{LL}\,I\,PF`.

    References
    ----------
    docs/physics.md §4.1 (three-phase identity; 208 V line-to-line outlets) and §9.5 (PF 0.97).

    Examples
    --------
    >>> round(float(phase_current_a(10_000.0, 415.0, 1.0)), 3)
    41.736
    """
    v = phase_voltage_v(voltage_ll_v, wiring)
    return np.asarray(power_w, dtype=float) / (v * np.asarray(power_factor, dtype=float))


def delta_line_currents_a(
    branch_currents_a: ArrayLike, pairs: Sequence[str] | None = None
) -> NDArray[np.float64]:
    r"""Line currents of a delta (line-to-line) PDU from its branch currents.

    Parameters
    ----------
    branch_currents_a : array_like
        RMS branch currents. Without ``pairs`` the last axis has length 3 and holds the
        branches L1-L2, L2-L3, L3-L1 (:data:`DELTA_BRANCHES`). With ``pairs`` the last axis
        holds any number of branches, ``pairs[i]`` naming the lines of branch ``i``; branches
        on the same pair are summed first. [A]
    pairs : sequence of str, optional
        Line pair of each branch: ``"L1-L2"``, ``"L2-L3"`` or ``"L3-L1"`` (``"L2-L1"`` etc.
        are accepted for the same pair).

    Returns
    -------
    numpy.ndarray
        Line currents L1, L2, L3 on the last axis. [A]

    Notes
    -----
    Each line current is the phasor difference of the two branches on that line,
    :math:`\vec I_1 = \vec I_{12} - \vec I_{31}` etc. With every branch at the same power
    factor the branch phasors sit 120° apart and the magnitudes are (Raritan's method)

    .. math::

        I_{L1} = \sqrt{I_{12}^2 + I_{31}^2 + I_{12} I_{31}}, \quad
        I_{L2} = \sqrt{I_{12}^2 + I_{23}^2 + I_{12} I_{23}}, \quad
        I_{L3} = \sqrt{I_{23}^2 + I_{31}^2 + I_{23} I_{31}}

    A balanced load gives :math:`\sqrt{3}` times the branch current on every line.

    References
    ----------
    docs/physics.md §4.1 (Raritan, "How to calculate current on a 3-phase 208 V rack PDU").

    Examples
    --------
    >>> delta_line_currents_a([10.0, 10.0, 10.0]).round(3)
    array([17.321, 17.321, 17.321])
    """
    i = np.asarray(branch_currents_a, dtype=float)
    if pairs is not None:
        if len(pairs) != i.shape[-1]:
            raise ValueError(f"{len(pairs)} pairs for {i.shape[-1]} branch currents")
        index = [_branch_index(p) for p in pairs]
        summed = np.zeros((*i.shape[:-1], 3))
        for k, b in enumerate(index):
            summed[..., b] += i[..., k]
        i = summed
    if i.shape[-1] != 3:
        raise ValueError(f"expected 3 branch currents (L1-L2, L2-L3, L3-L1), got {i.shape[-1]}")
    i12, i23, i31 = i[..., 0], i[..., 1], i[..., 2]
    return np.stack(
        [
            np.sqrt(i12**2 + i31**2 + i12 * i31),
            np.sqrt(i12**2 + i23**2 + i12 * i23),
            np.sqrt(i23**2 + i31**2 + i23 * i31),
        ],
        axis=-1,
    )


def _branch_index(pair: str) -> int:
    lines = frozenset(pair.upper().split("-"))
    for k, name in enumerate(DELTA_BRANCHES):
        if lines == frozenset(name.split("-")):
            return k
    raise ValueError(f"unknown branch {pair!r}; expected one of {DELTA_BRANCHES}")


def derated_limit_a(rated_a: ArrayLike, factor: ArrayLike = 0.8) -> NDArray[np.float64]:
    r"""Continuous-load current limit of a breaker or PDU phase.

    Parameters
    ----------
    rated_a : array_like
        Breaker or PDU rating. [A]
    factor : array_like, default 0.8
        Continuous-load derating (NEC/UL 80 % rule; × 0.87 more above 40 °C ambient). [1]

    Returns
    -------
    numpy.ndarray
        Usable continuous current :math:`I = f \cdot I_{rated}`. [A]

    References
    ----------
    docs/physics.md §4.2 and §9.5.

    Examples
    --------
    >>> float(derated_limit_a(60.0))
    48.0
    """
    return np.asarray(rated_a, dtype=float) * np.asarray(factor, dtype=float)


def imbalance(currents: ArrayLike, axis: int = -1) -> NDArray[np.float64]:
    r"""Phase imbalance :math:`(I_{max} - I_{min}) / I_{mean}` along ``axis``.

    Parameters
    ----------
    currents : array_like
        Phase currents, phases along ``axis``. [A]
    axis : int, default -1
        The phase axis.

    Returns
    -------
    numpy.ndarray
        Imbalance; 0 when every phase carries no current. [1]

    Notes
    -----
    An operator target is < 0.10 (docs/physics.md §4.1, §9.5: assumption).

    Examples
    --------
    >>> round(float(imbalance([10.0, 11.0, 9.0])), 3)
    0.2
    """
    i = np.asarray(currents, dtype=float)
    mean = i.mean(axis=axis)
    spread = i.max(axis=axis) - i.min(axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, spread / np.where(mean > 0, mean, 1.0), 0.0)


# ---- fitting ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LineFitQuality:
    """Quality of :func:`fit_affine` per device; arrays of shape ``(N,)``.

    Attributes
    ----------
    intercept_stderr, slope_stderr : numpy.ndarray
        Standard errors (ordinary least squares, inflated for lag-1 residual autocorrelation).
        [unit of y], [unit of y / unit of x]
    fit : models.fit_quality.FitQuality
        MAE, RMSE, CV(RMSE), NMBE, MAPE of the fitted line over the fit window.
    usable : numpy.ndarray
        False where the data cannot identify the line. [bool]
    reason : list of (str or None)
        Why a fit is unusable, None where it is usable.
    """

    intercept_stderr: F64
    slope_stderr: F64
    fit: FitQuality
    usable: NDArray[np.bool_]
    reason: list[str | None]


def fit_affine(
    x: ArrayLike,
    y: ArrayLike,
    *,
    min_samples: int = 30,
    max_gap_frac: float = 0.2,
    max_rel_stderr: float = 0.02,
    max_stuck_s: float | None = None,
    dt_s: float = 1.0,
) -> tuple[F64, F64, LineFitQuality]:
    r"""Per-device straight line :math:`y = \alpha + \beta x` by least squares, NaN-aware.

    Parameters
    ----------
    x : array_like
        Regressor, time on axis 0, devices on axis 1, shape ``(T, N)``. [any unit]
    y : array_like
        Response, same shape. [any unit]
    min_samples : int, default 30
        Fewest valid (x, y) pairs. [1]
    max_gap_frac : float, default 0.2
        Largest share of missing x or y readings. [1]
    max_rel_stderr : float, default 0.02
        Largest relative standard error of the slope: above it x does not vary enough to tell
        the slope from the intercept. [1]
    max_stuck_s : float or None, default None
        Stuck-sensor check on x and y (see :func:`models.fit_quality.data_problems`). [s]
    dt_s : float, default 1.0
        Sample interval, for the stuck-sensor check. [s]

    Returns
    -------
    intercept : numpy.ndarray
        :math:`\alpha` per device; NaN where unusable. [unit of y]
    slope : numpy.ndarray
        :math:`\beta` per device; NaN where unusable. [unit of y / unit of x]
    quality : LineFitQuality
        Standard errors, goodness of fit, ``usable`` and ``reason``.

    Notes
    -----
    Closed form on centered sums: :math:`\beta = S_{xy}/S_{xx}`,
    :math:`\alpha = \bar y - \beta \bar x`; standard errors
    :math:`\sigma^2/S_{xx}` and :math:`\sigma^2(1/n + \bar x^2/S_{xx})`, multiplied by
    :math:`(1+\rho_1)/(1-\rho_1)` for the lag-1 autocorrelation of the residuals.

    Examples
    --------
    >>> b, m, q = fit_affine([[0.0], [1.0], [2.0], [3.0]], [[1.0], [3.0], [5.0], [7.0]],
    ...                      min_samples=3)
    >>> float(b[0]), float(m[0]), bool(q.usable[0])
    (1.0, 2.0, True)
    """
    xa = np.asarray(x, dtype=float)
    if xa.ndim == 1:
        xa = xa[:, None]
    ya = np.broadcast_to(np.asarray(y, dtype=float).reshape(xa.shape[0], -1), xa.shape)
    xa = np.broadcast_to(xa, ya.shape)

    def prefix(what: str, reasons: list[str | None]) -> list[str | None]:
        return [f"{what}: {r}" if r else None for r in reasons]

    reasons = join_reasons(
        *(
            prefix(
                name,
                data_problems(
                    v,
                    min_samples=min_samples,
                    max_gap_frac=max_gap_frac,
                    max_stuck_s=max_stuck_s,
                    dt_s=dt_s,
                ),
            )
            for name, v in (("x", xa), ("y", ya))
        )
    )
    ok = np.isfinite(xa) & np.isfinite(ya)
    n = ok.sum(axis=0).astype(float)
    cnt = np.maximum(n, 1.0)
    x0, y0 = np.where(ok, xa, 0.0), np.where(ok, ya, 0.0)
    mx, my = x0.sum(axis=0) / cnt, y0.sum(axis=0) / cnt
    dx, dy = np.where(ok, xa - mx, 0.0), np.where(ok, ya - my, 0.0)
    sxx = (dx * dx).sum(axis=0)
    sxy = (dx * dy).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(sxx > 0, sxy / sxx, np.nan)
        intercept = my - slope * mx
        res = np.where(ok, ya - intercept - slope * xa, 0.0)
        sse = (res * res).sum(axis=0)
        lag = (res[1:] * res[:-1]).sum(axis=0)
        rho = np.clip(np.where(sse > 0, lag / sse, 0.0), 0.0, 0.99)
        sigma2 = sse / np.maximum(n - 2.0, 1.0) * (1.0 + rho) / (1.0 - rho)
        se_slope = np.sqrt(sigma2 / sxx)
        se_icpt = np.sqrt(sigma2 * (1.0 / cnt + mx * mx / sxx))
    clean = np.array([r is None for r in reasons])
    for j in np.flatnonzero(clean & ~(se_slope <= max_rel_stderr * np.abs(slope))):
        if not sxx[j] > 0:
            reasons[j] = "x does not vary: slope not identifiable"
        else:
            reasons[j] = (
                f"slope not identifiable (standard error "
                f"{100 * se_slope[j] / max(abs(slope[j]), 1e-300):.1f} % > "
                f"{100 * max_rel_stderr:g} %): x does not vary enough"
            )
    usable = np.array([r is None for r in reasons])
    quality = LineFitQuality(
        intercept_stderr=se_icpt,
        slope_stderr=se_slope,
        fit=fit_quality(ya, intercept + slope * xa),
        usable=usable,
        reason=reasons,
    )
    return np.where(usable, intercept, np.nan), np.where(usable, slope, np.nan), quality


@dataclass(frozen=True)
class RackPowerFit:
    """Per-rack result of :func:`fit_rack_power`; arrays of shape ``(R,)``.

    Attributes
    ----------
    alpha_w : numpy.ndarray
        Rack input power at zero GPU power, :math:`\\alpha`. [W]
    beta : numpy.ndarray
        Input watts per watt of GPU power, :math:`\\beta`. [1]
    alpha_stderr_w, beta_stderr : numpy.ndarray
        Standard errors. [W], [1]
    mae_w : numpy.ndarray
        Mean absolute error over the fit window. [W]
    mape, cv_rmse, nmbe : numpy.ndarray
        Relative errors over the fit window, fractions. [1]
    n_samples : numpy.ndarray
        Samples used. [1]
    usable : numpy.ndarray
        False where the data cannot identify the line. [bool]
    reason : list of (str or None)
        Why a fit is unusable, None where it is usable.
    """

    alpha_w: F64
    beta: F64
    alpha_stderr_w: F64
    beta_stderr: F64
    mae_w: F64
    mape: F64
    cv_rmse: F64
    nmbe: F64
    n_samples: NDArray[np.int64]
    usable: NDArray[np.bool_]
    reason: list[str | None]


def fit_rack_power(
    sum_gpu_w: ArrayLike,
    pdu_power_w: ArrayLike,
    *,
    min_samples: int = 30,
    max_gap_frac: float = 0.2,
    max_rel_stderr: float = 0.02,
    max_stuck_s: float | None = 300.0,
    dt_s: float = 1.0,
) -> RackPowerFit:
    r"""Fit rack input power against the sum of its GPUs' power, per rack.

    Parameters
    ----------
    sum_gpu_w : array_like
        Sum of the board power of every GPU in the rack, shape ``(T, R)``. [W]
    pdu_power_w : array_like
        Rack input power metered at its PDUs (summed over the rack's PDUs), shape ``(T, R)``.
        [W]
    min_samples, max_gap_frac, max_rel_stderr, max_stuck_s, dt_s
        As in :func:`fit_affine`; a PDU meter repeating one reading for more than
        ``max_stuck_s`` (default 300 s) counts as stuck.

    Returns
    -------
    RackPowerFit

    Notes
    -----
    Per node the DC load is :math:`a + b\sum P_{gpu}` (:func:`node_power_w`) and the input
    :math:`(P_{DC} + c)/\eta` (:func:`psu_input_w`), so a rack whose nodes share ``b`` and
    :math:`\eta` draws

    .. math::

        P_{in} = \alpha + \beta \sum P_{gpu}, \qquad
        \alpha = \sum_{nodes} \frac{a + c}{\eta}, \qquad \beta = \frac{b}{\eta}

    Only :math:`\alpha` and :math:`\beta` are identifiable from rack power and GPU power:
    the four constants :math:`a, b, c, \eta` map onto two numbers, so a larger non-GPU load
    and a worse PSU efficiency fit the same data. Separating them needs another measurement
    (node DC power, PSU output, a vendor efficiency curve). Use :func:`rack_input_power_w`
    to predict.

    References
    ----------
    docs/physics.md §1.4 (non-GPU overhead), §4.2 (conversion losses, RAPS
    :math:`P_{in} = (P_{out} + L)/\eta`), §7.1 and §9.5.
    """
    alpha, beta, q = fit_affine(
        sum_gpu_w,
        pdu_power_w,
        min_samples=min_samples,
        max_gap_frac=max_gap_frac,
        max_rel_stderr=max_rel_stderr,
        max_stuck_s=max_stuck_s,
        dt_s=dt_s,
    )
    reason = [
        r.replace("x:", "GPU power:").replace("y:", "PDU power:") if r else r for r in q.reason
    ]
    return RackPowerFit(
        alpha_w=alpha,
        beta=beta,
        alpha_stderr_w=q.intercept_stderr,
        beta_stderr=q.slope_stderr,
        mae_w=q.fit.mae,
        mape=q.fit.mape,
        cv_rmse=q.fit.cv_rmse,
        nmbe=q.fit.nmbe,
        n_samples=q.fit.n_samples,
        usable=q.usable,
        reason=reason,
    )


def rack_input_power_w(
    sum_gpu_w: ArrayLike, alpha_w: ArrayLike, beta: ArrayLike
) -> NDArray[np.float64]:
    r"""Rack input power from the sum of its GPUs' power, with :func:`fit_rack_power`'s line.

    Parameters
    ----------
    sum_gpu_w : array_like
        Sum of the rack's GPU board powers. [W]
    alpha_w : array_like
        :math:`\alpha`, input power at zero GPU power. [W]
    beta : array_like
        :math:`\beta`, input watts per GPU watt. [1]

    Returns
    -------
    numpy.ndarray
        :math:`P_{in} = \alpha + \beta \sum P_{gpu}`. [W]

    References
    ----------
    docs/physics.md §1.4, §4.2.

    Examples
    --------
    >>> float(rack_input_power_w(44_800.0, 5_100.0, 1.3))
    63340.0
    """
    return np.asarray(alpha_w, dtype=float) + np.asarray(beta, dtype=float) * np.asarray(
        sum_gpu_w, dtype=float
    )
