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
    n_steps = max(0, int(np.ceil((end - start).total_seconds() / step_s)))
    out = np.full((n_steps, len(nodes)), np.nan)
    if not n_steps or not nodes:
        return out
    con = store.con
    step_us = round(step_s * 1e6)
    split = start  # raw samples from here on; the complete 1-minute rollup before it
    if step_s >= 60 and step_s % 60 == 0:
        rows = con.execute(
            "SELECT done_until FROM rollup_watermarks WHERE kind = 'node' AND resolution = '1m'"
        ).fetchall()
        if rows and rows[0][0] is not None:
            split = min(max(rows[0][0], start), end)
    res = con.sql(
        "WITH m AS (SELECT unnest($1::VARCHAR[]) AS id, unnest(range(len($1::VARCHAR[]))) AS col),"
        " parts AS ("
        " SELECT (epoch_us(r.bucket) - epoch_us($2::TIMESTAMPTZ)) // $3 AS step, r.id,"
        "   sum(r.power_w_avg * r.n) AS s, sum(r.n) AS c"
        " FROM node_1m r WHERE r.bucket >= $2 AND r.bucket < $4 AND r.power_w_avg IS NOT NULL"
        " GROUP BY ALL"
        " UNION ALL"
        " SELECT (epoch_us(x.ts) - epoch_us($2::TIMESTAMPTZ)) // $3 AS step, x.id,"
        "   sum(x.power_w) AS s, count(x.power_w) AS c"
        " FROM node x WHERE x.ts >= $4 AND x.ts < $5 GROUP BY ALL)"
        " SELECT p.step, m.col, sum(p.s) / sum(p.c) AS v FROM parts p JOIN m USING (id)"
        " GROUP BY ALL HAVING sum(p.c) > 0",
        params=[list(nodes), start, step_us, split, end],
    ).to_arrow_table()
    step = res.column("step").to_numpy().astype(np.int64)
    col = res.column("col").to_numpy().astype(np.int64)
    val = res.column("v").to_numpy(zero_copy_only=False).astype(float)
    ok = (step >= 0) & (step < n_steps)
    out[step[ok], col[ok]] = val[ok]
    return out


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
