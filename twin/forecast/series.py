"""Per-fleet and per-rack power series from the store, on a regular grid.

Rack power is the sum of its nodes' input power (``node.power_w``, the BMC's AC reading) and
fleet power the sum over the fleet's nodes. Each node is first averaged per grid step (not
sampled), from the ``node_1m`` rollup where it is complete (steps that are whole minutes) and
from the raw ``node`` table after the rollup watermark, in one query. A sum is NaN at a step
where a node that reports in the window has no reading, so a gap is a gap, not a dip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from twin.site import Site
from twin.store import Store
from twin.store.windows import load_mean_grid

__all__ = [
    "Entity",
    "PowerSeries",
    "entities",
    "grid_window",
    "load_node_power",
    "load_power_series",
]


@dataclass(frozen=True)
class Entity:
    """A fleet or a rack whose power is forecast."""

    entity: str  # "fleet" | "rack"
    id: str
    role: str  # fleet role: "training" | "inference" | "none" (a rack in no fleet)
    nodes: tuple[str, ...]

    @property
    def model_kind(self) -> str:
        """The forecast model: inference has daily/weekly cycles; the rest is a level."""
        return "inference" if self.role == "inference" else "training"


@dataclass(frozen=True)
class PowerSeries:
    """Power [W] of each entity, shape (T, E), row ``i`` at ``start + i * step_s``."""

    start: datetime
    step_s: float
    entities: list[Entity]
    power_w: np.ndarray
    nodes_without_data: list[str]

    @property
    def start_s(self) -> float:
        return self.start.timestamp()


def entities(site: Site) -> list[Entity]:
    """Every fleet, then every rack, with its role (a rack takes the role most of its nodes
    have; ``none`` when none of them is in a fleet)."""
    fleet_of = site.fleet_of_node
    out: list[Entity] = []
    for f in site.fleets:
        nodes = tuple(n for n, fl in fleet_of.items() if fl.name == f.name)
        out.append(Entity("fleet", f.name, f.role, nodes))
    for r in site.racks:
        nodes = tuple(n.name for n in r.nodes)
        roles = [fleet_of[n].role for n in nodes if n in fleet_of]
        role = max(set(roles), key=roles.count) if roles else "none"
        out.append(Entity("rack", r.name, role, nodes))
    return out


def load_node_power(
    store: Store, nodes: list[str], start: datetime, end: datetime, step_s: float
) -> np.ndarray:
    """Mean ``power_w`` per node per step in [start, end): (T, len(nodes)), NaN where none."""
    return load_mean_grid(store, "node", "power_w", list(nodes), start, end, step_s)


def load_power_series(
    store: Store, site: Site, start: datetime, end: datetime, step_s: float = 300.0
) -> PowerSeries:
    """Fleet and rack power [W] in [start, end) on a ``step_s`` grid."""
    ents = entities(site)
    nodes = [n.name for n in site.nodes]
    x = load_node_power(store, nodes, start, end, step_s)
    has = np.isfinite(x).any(axis=0)
    pos = {n: i for i, n in enumerate(nodes)}
    member = np.zeros((len(nodes), len(ents)))
    for e_i, e in enumerate(ents):
        for n in e.nodes:
            if has[pos[n]]:
                member[pos[n], e_i] = 1.0
    total = np.where(np.isfinite(x), x, 0.0) @ member
    missing = (~np.isfinite(x)).astype(float) @ member > 0
    total[missing] = np.nan
    total[:, member.sum(axis=0) == 0] = np.nan  # no node of the entity reports
    return PowerSeries(
        start=start,
        step_s=float(step_s),
        entities=ents,
        power_w=total,
        nodes_without_data=[n for n, h in zip(nodes, has, strict=True) if not h],
    )


def grid_window(now: datetime, history_s: float, step_s: float) -> tuple[datetime, datetime]:
    """[start, end) of a history window ending at ``now`` floored to the step grid."""
    ts = now.timestamp()
    end_s = np.floor(ts / step_s) * step_s
    end = now - timedelta(seconds=ts - end_s)
    n = int(np.ceil(history_s / step_s))
    return end - timedelta(seconds=n * step_s), end
