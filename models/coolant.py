"""Coolant properties and the heat balance of a liquid loop.

Properties of water and PG25 (25 % propylene glycol) are interpolated linearly in the table of
docs/physics.md §3.2 (Airedale DeltaChill design data, 20-45 °C) and held constant outside it.
Fluids are named by the keys of :data:`COOLANT_TABLE` (``"water"``, ``"pg25"``), the same names
as the ``coolant`` field of a CDU in the site file.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "COOLANT_TABLE",
    "density_kg_m3",
    "flow_for_heat_lpm",
    "heat_kw",
    "lpm_to_m3s",
    "m3s_to_lpm",
    "return_temp_c",
    "specific_heat_j_kgk",
]

#: docs/physics.md §3.2: temperature [°C], specific heat [J/(kg K)] and density [kg/m³] per fluid.
COOLANT_TABLE: dict[str, dict[str, tuple[float, ...]]] = {
    "water": {
        "temp_c": (20.0, 25.0, 30.0, 40.0, 45.0),
        "cp_j_kgk": (4180.0, 4180.0, 4180.0, 4180.0, 4180.0),
        "rho_kg_m3": (998.2, 997.0, 995.6, 992.2, 990.2),
    },
    "pg25": {
        "temp_c": (20.0, 25.0, 30.0, 40.0, 45.0),
        "cp_j_kgk": (3910.0, 3920.0, 3940.0, 3960.0, 3970.0),
        "rho_kg_m3": (1023.7, 1021.5, 1019.2, 1014.3, 1011.6),
    },
}

_LPM_PER_M3S = 60_000.0
_RETURN_ITERATIONS = 6


def _table(fluid: str) -> dict[str, tuple[float, ...]]:
    try:
        return COOLANT_TABLE[fluid.lower()]
    except KeyError:
        raise ValueError(
            f"unknown coolant {fluid!r}; expected one of {sorted(COOLANT_TABLE)}"
        ) from None


def density_kg_m3(fluid: str, temp_c: ArrayLike) -> NDArray[np.float64]:
    """Density of a coolant.

    Parameters
    ----------
    fluid : str
        ``"water"`` or ``"pg25"``.
    temp_c : array_like
        Fluid temperature; the table covers 20-45 °C and is held flat outside. [°C]

    Returns
    -------
    numpy.ndarray
        Density. [kg/m³]

    Notes
    -----
    Linear interpolation in the docs/physics.md §3.2 table.

    References
    ----------
    docs/physics.md §3.2 (Airedale DeltaChill glycol design data).

    Examples
    --------
    >>> float(density_kg_m3("pg25", 25.0))
    1021.5
    """
    t = _table(fluid)
    return np.interp(np.asarray(temp_c, dtype=float), t["temp_c"], t["rho_kg_m3"])


def specific_heat_j_kgk(fluid: str, temp_c: ArrayLike) -> NDArray[np.float64]:
    """Specific heat capacity of a coolant.

    Parameters
    ----------
    fluid : str
        ``"water"`` or ``"pg25"``.
    temp_c : array_like
        Fluid temperature; the table covers 20-45 °C and is held flat outside. [°C]

    Returns
    -------
    numpy.ndarray
        Specific heat. [J/(kg K)]

    Notes
    -----
    Linear interpolation in the docs/physics.md §3.2 table.

    References
    ----------
    docs/physics.md §3.2.

    Examples
    --------
    >>> float(specific_heat_j_kgk("pg25", 35.0))
    3950.0
    """
    t = _table(fluid)
    return np.interp(np.asarray(temp_c, dtype=float), t["temp_c"], t["cp_j_kgk"])


def lpm_to_m3s(flow_lpm: ArrayLike) -> NDArray[np.float64]:
    """Convert a volume flow from L/min [L/min] to m³/s [m³/s] (1 m³/s = 60,000 L/min)."""
    return np.asarray(flow_lpm, dtype=float) / _LPM_PER_M3S


def m3s_to_lpm(flow_m3s: ArrayLike) -> NDArray[np.float64]:
    """Convert a volume flow from m³/s [m³/s] to L/min [L/min]."""
    return np.asarray(flow_m3s, dtype=float) * _LPM_PER_M3S


def heat_kw(
    flow_lpm: ArrayLike, supply_c: ArrayLike, return_c: ArrayLike, fluid: str = "pg25"
) -> NDArray[np.float64]:
    r"""Heat carried by a coolant stream.

    Parameters
    ----------
    flow_lpm : array_like
        Volume flow. [L/min]
    supply_c : array_like
        Supply (cold side) temperature. [°C]
    return_c : array_like
        Return (warm side) temperature. [°C]
    fluid : str, default "pg25"
        ``"water"`` or ``"pg25"``.

    Returns
    -------
    numpy.ndarray
        Heat flow, positive when the return is warmer than the supply. [kW]

    Notes
    -----
    .. math:: Q = \rho\,\dot V\,c_p\,(T_{return} - T_{supply})

    with :math:`\rho` and :math:`c_p` taken at the mean temperature
    :math:`(T_{supply} + T_{return})/2`.

    References
    ----------
    docs/physics.md §3.1 (heat balance) and §3.2 (properties).

    Examples
    --------
    >>> round(float(heat_kw(1.5, 20.0, 30.0, "pg25")), 3)
    1.001
    """
    ts = np.asarray(supply_c, dtype=float)
    tr = np.asarray(return_c, dtype=float)
    mean = 0.5 * (ts + tr)
    rho_cp = density_kg_m3(fluid, mean) * specific_heat_j_kgk(fluid, mean)
    return rho_cp * lpm_to_m3s(flow_lpm) * (tr - ts) / 1000.0


def return_temp_c(
    supply_c: ArrayLike, heat_kw: ArrayLike, flow_lpm: ArrayLike, fluid: str = "pg25"
) -> NDArray[np.float64]:
    r"""Return temperature of a loop that picks up ``heat_kw`` at ``flow_lpm``.

    Parameters
    ----------
    supply_c : array_like
        Supply temperature. [°C]
    heat_kw : array_like
        Heat picked up by the stream. [kW]
    flow_lpm : array_like
        Volume flow; must be positive (zero flow gives an infinite rise). [L/min]
    fluid : str, default "pg25"
        ``"water"`` or ``"pg25"``.

    Returns
    -------
    numpy.ndarray
        Return temperature. [°C]

    Notes
    -----
    Inverts :func:`heat_kw`:
    :math:`T_{return} = T_{supply} + Q / (\rho\,\dot V\,c_p)`, with the properties at the mean
    temperature found by a few fixed-point iterations (the properties vary by < 0.1 %/K, so
    the iteration contracts fast and ``heat_kw(flow, supply, return_temp_c(...))`` gives back
    ``heat_kw`` to ~1e-9 relative).

    References
    ----------
    docs/physics.md §3.1 and §3.2.

    Examples
    --------
    >>> round(float(return_temp_c(20.0, 1.0, 1.5, "pg25")), 2)
    29.99
    """
    ts = np.asarray(supply_c, dtype=float)
    q_w = np.asarray(heat_kw, dtype=float) * 1000.0
    v = lpm_to_m3s(flow_lpm)
    tr = ts
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(_RETURN_ITERATIONS):
            mean = 0.5 * (ts + tr)
            tr = ts + q_w / (density_kg_m3(fluid, mean) * specific_heat_j_kgk(fluid, mean) * v)
    return tr


def flow_for_heat_lpm(
    heat_kw: ArrayLike, delta_t_k: ArrayLike, fluid: str = "pg25", temp_c: ArrayLike = 25.0
) -> NDArray[np.float64]:
    r"""Volume flow that carries ``heat_kw`` with a rise of ``delta_t_k``.

    Parameters
    ----------
    heat_kw : array_like
        Heat to carry. [kW]
    delta_t_k : array_like
        Return minus supply temperature. [K]
    fluid : str, default "pg25"
        ``"water"`` or ``"pg25"``.
    temp_c : array_like, default 25.0
        Mean fluid temperature at which the properties are taken. [°C]

    Returns
    -------
    numpy.ndarray
        Volume flow. [L/min]

    Notes
    -----
    .. math:: \dot V = Q / (\rho\,c_p\,\Delta T)

    PG25 at 25 °C needs 1.50 L/min per kW for a 10 K rise (OCP guideline, docs/physics.md §3.3).

    References
    ----------
    docs/physics.md §3.1-§3.3 and §9.3.

    Examples
    --------
    >>> round(float(flow_for_heat_lpm(1.0, 10.0, "pg25")), 3)
    1.498
    """
    rho_cp = density_kg_m3(fluid, temp_c) * specific_heat_j_kgk(fluid, temp_c)
    q_w = np.asarray(heat_kw, dtype=float) * 1000.0
    return m3s_to_lpm(q_w / (rho_cp * np.asarray(delta_t_k, dtype=float)))
