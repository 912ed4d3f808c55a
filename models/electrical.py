"""Node power, power conversion and PDU phase currents.

Wiring names follow the site file's ``Pdu.wiring``: ``"wye"`` (e.g. 415/240 V, outlets
line-to-neutral, each phase on its own) and ``"delta"`` (North American 208 V, outlets
line-to-line on branches L1-L2, L2-L3, L3-L1). ``"single"`` is a single-phase feed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "DELTA_BRANCHES",
    "delta_line_currents_a",
    "derated_limit_a",
    "imbalance",
    "node_power_w",
    "phase_current_a",
    "phase_voltage_v",
    "psu_input_w",
]

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
    physics.md §1.4 (non-GPU overhead of a DGX H100), §7.1 (RAPS node model) and §9.1.

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
    physics.md §4.2 (conversion losses) and §9.5; ExaDigiT/RAPS ``raps/power.py``.

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
    physics.md §4.1.
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
    physics.md §4.1 (three-phase identity; 208 V line-to-line outlets) and §9.5 (PF 0.97).

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
    physics.md §4.1 (Raritan, "How to calculate current on a 3-phase 208 V rack PDU").

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
    physics.md §4.2 and §9.5.

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
    An operator target is < 0.10 (physics.md §4.1, §9.5: assumption).

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
