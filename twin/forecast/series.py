"""Per-fleet and per-rack power series from the store, on a regular grid.

Rack power is the sum of its nodes' input power (``node.power_w``, the BMC's AC reading) and
fleet power the sum over the fleet's nodes. Each node is first averaged per grid step (not
sampled), from the ``node_1m`` rollup where it is complete (steps that are whole minutes) and
from the raw ``node`` table after the rollup watermark, and summed in the store
(``twin.store.windows.load_group_sums``). A sum is NaN at a step where a node that reports in
the window has no reading, so a gap is a gap, not a dip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from twin.site import Site
from twin.store import Store
from twin.store.windows import load_group_sums

__all__ = [
    "Entity",
    "PowerSeries",
    "entities",
    "grid_window",
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


def load_power_series(
    store: Store, site: Site, start: datetime, end: datetime, step_s: float = 300.0
) -> PowerSeries:
    """Fleet and rack power [W] in [start, end) on a ``step_s`` grid.

    The nodes are summed in the store per set of entities they belong to (a rack and its fleet:
    a few thousand sets at 100,000 GPUs, not 12,500 node columns), and the sets into the
    entities here. A set's sum is complete at a step where every node of it that reports in
    the window has a mean there."""
    ents = entities(site)
    nodes = [n.name for n in site.nodes]
    pos = {n: i for i, n in enumerate(nodes)}
    of_node: list[list[int]] = [[] for _ in nodes]
    for e_i, e in enumerate(ents):
        for n in e.nodes:
            of_node[pos[n]].append(e_i)
    sets: dict[tuple[int, ...], int] = {}
    group = np.array([sets.setdefault(tuple(es), len(sets)) for es in of_node], np.int64)
    g = load_group_sums(store, "node", "power_w", nodes, group, len(sets), start, end, step_s)
    member = np.zeros((len(sets), len(ents)))  # (sets, entities) 0/1
    for es, k in sets.items():
        member[k, list(es)] = 1.0
    reporting = np.bincount(group[g.reported], minlength=len(sets))  # per set, over the window
    total = g.sum @ member
    incomplete = (g.count < reporting[None, :]).astype(float) @ member > 0
    total[incomplete] = np.nan
    total[:, (reporting > 0) @ member == 0] = np.nan  # no node of the entity reports
    return PowerSeries(
        start=start,
        step_s=float(step_s),
        entities=ents,
        power_w=total,
        nodes_without_data=[n for n, h in zip(nodes, g.reported, strict=True) if not h],
    )


def grid_window(now: datetime, history_s: float, step_s: float) -> tuple[datetime, datetime]:
    """[start, end) of a history window ending at ``now`` floored to the step grid."""
    ts = now.timestamp()
    end_s = np.floor(ts / step_s) * step_s
    end = now - timedelta(seconds=ts - end_s)
    n = int(np.ceil(history_s / step_s))
    return end - timedelta(seconds=n * step_s), end
