"""Every limit of the site, in one place: derating, feed capacity, the power-factor rule.

Built on ``models.electrical`` and the catalog's assumptions (``twin.site.catalog.ASSUMPTIONS``);
headroom, what-if, alerts and the API read limits here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from collectors.contract import phase_label, sub_id
from models import electrical
from twin.site import Site
from twin.site.catalog import ASSUMPTIONS


def derated_a(rated_a: Any) -> np.ndarray:
    """Continuous-load limit of a breaker or PDU phase (NEC 210.20(A), docs/physics.md §4.2)."""
    return electrical.derated_limit_a(rated_a, ASSUMPTIONS.continuous_load_factor)


def power_factor(measured: Any) -> np.ndarray:
    """The power factor to use: the measured one where it is a power factor, else the default.

    A reading outside (0, 1] (a meter that reports 0 when idle, or nothing) is not used.
    """
    pf = np.asarray(measured, dtype=float)
    ok = np.isfinite(pf) & (pf > 0) & (pf <= 1.0)
    return np.where(ok, pf, ASSUMPTIONS.power_factor)


def feed_capacity_kw(pdu: Any, pf: float) -> float:
    """Real power one PDU carries continuously: the derated current on every phase."""
    amps = float(derated_a(pdu.rated_current_a))
    if pdu.phases == 1:
        return pdu.voltage_v * amps * pf / 1000.0
    return math.sqrt(3.0) * pdu.voltage_v * amps * pf / 1000.0


def rack_capacity_kw(site: Site, racks: list[Any], pf_of_pdu: dict[str, float]) -> np.ndarray:
    """Per rack: what its feeds carry together (kW); NaN for a rack with no PDU in the site.

    ``pf_of_pdu`` holds measured power factors; a PDU missing from it (or with a value that is
    not a power factor) takes the default (:func:`power_factor`).
    """
    pdus = site.pdu_by_name
    out = np.full(len(racks), np.nan)
    for i, r in enumerate(racks):
        feeds: dict[str, float] = {}
        for name in r.pdus:
            p = pdus[name]
            pf = float(power_factor(pf_of_pdu.get(name, np.nan)))
            feeds[p.feed] = feeds.get(p.feed, 0.0) + feed_capacity_kw(p, pf)
        if feeds:
            out[i] = sum(feeds.values())
    return out


@dataclass(frozen=True)
class PhaseTable:
    """Every PDU phase and branch breaker of a site, with its limit and the racks it feeds."""

    ids: list[str]
    pdu: list[str]
    leg: list[str]  # "L1".. or the breaker's name
    limit_a: np.ndarray  # derated (continuous) limit
    racks: list[list[int]]  # indices into site.racks of the racks the PDU feeds
    rated_a: np.ndarray  # the breaker's or phase's rating


def pdu_leg_names(phases: int, breakers: list[str]) -> list[str]:
    """The elements of one PDU's current samples: its phases L1.., then its breakers (the id
    grammar is ``collectors.contract``'s)."""
    return [phase_label(k) for k in range(1, (3 if phases == 3 else 1) + 1)] + list(breakers)


def phase_table(site: Site) -> PhaseTable:
    feeds_of: dict[str, list[int]] = {}
    for i, r in enumerate(site.racks):
        for name in r.pdus:
            feeds_of.setdefault(name, []).append(i)
    ids, pdu, leg, lim, fed = [], [], [], [], []
    for p in site.pdus:
        feeds = feeds_of.get(p.name, [])
        for name in pdu_leg_names(p.phases, [b.name for b in p.breakers]):
            br = next((b for b in p.breakers if b.name == name), None)
            ids.append(sub_id(p.name, name))
            pdu.append(p.name)
            leg.append(name)
            lim.append(br.rated_current_a if br is not None else p.rated_current_a)
            fed.append(feeds)
    rated = np.array(lim, dtype=float)
    return PhaseTable(ids, pdu, leg, derated_a(rated), fed, rated)


def pumps_running(speed_pct: Any) -> np.ndarray:
    """Which pumps run: speed above ``ASSUMPTIONS.pump_running_min_pct``; NaN is not running."""
    s = np.asarray(speed_pct, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(s, nan=0.0) > ASSUMPTIONS.pump_running_min_pct
