"""The site flattened once into index arrays: the one site index of DESIGN.md "One data plane".

GPUs are node-major in the site's order (halls -> rows -> racks -> nodes -> GPUs), the order
of every (T x N) GPU array the store reader, the chain, headroom, hot spots and what-if use.
The other lookups are built from it rather than by walking the site model again: the API's
:class:`SiteLookups`, the alert topology (:meth:`twin.alerts.topology.Topology.from_site`),
the simulator's id arrays and the benchmarks' id lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from twin.site.model import Site

if TYPE_CHECKING:  # the store reader's window; twin.site imports nothing of the store at run time
    from twin.store.windows import Window


def _no_ints() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class SiteIndex:
    """The site flattened to index arrays the vectorized fits, the chain and the lookups need.

    The node and rack placement fields (``gpu_slot`` onwards) default to empty so that an
    index of a few GPUs can be written by hand (a benchmark's fit-only index)."""

    gpu_ids: list[str]
    gpu_node: list[str]
    gpu_rack: np.ndarray  # rack index per GPU
    gpu_cdu: np.ndarray  # CDU index per GPU, -1 for air-cooled
    gpu_class: list[str]  # catalog GPU model
    gpu_fleet: list[str]
    rack_names: list[str]
    rack_pdus: list[list[str]]
    rack_cdu: np.ndarray  # CDU index per rack, -1 for none
    rack_prior: np.ndarray  # catalog capture fraction per rack
    cdu_names: list[str]
    cdu_fluid: list[str]
    gpu_slot: np.ndarray = field(default_factory=_no_ints)  # the GPU's index in its node
    node_names: list[str] = field(default_factory=list)
    node_rack: np.ndarray = field(default_factory=_no_ints)  # rack index per node
    #: the GPUs of node i are ``gpu_ids[node_gpu_start[i]:node_gpu_start[i + 1]]``
    node_gpu_start: np.ndarray = field(default_factory=_no_ints)
    node_uuids: list[tuple[str, ...]] = field(default_factory=list)  # its GPUs' UUIDs, if listed
    node_phase: list[str | None] = field(default_factory=list)  # PDU phase it draws from, if set
    node_fleet: list[str] = field(default_factory=list)  # "" for none
    #: the nodes of rack i are ``node_names[rack_node_start[i]:rack_node_start[i + 1]]``
    rack_node_start: np.ndarray = field(default_factory=_no_ints)
    rack_hall: list[str] = field(default_factory=list)
    rack_row: list[str] = field(default_factory=list)
    rack_cdu_name: list[str | None] = field(default_factory=list)  # as the site file names it

    def node_gpus(self, node: int) -> list[str]:
        """The GPU ids of node ``node`` (its position in ``node_names``)."""
        return self.gpu_ids[self.node_gpu_start[node] : self.node_gpu_start[node + 1]]

    def rack_nodes(self, rack: int) -> range:
        """The positions in ``node_names`` of the nodes of rack ``rack``."""
        return range(int(self.rack_node_start[rack]), int(self.rack_node_start[rack + 1]))


def index_site(site: Site) -> SiteIndex:
    """Flatten ``site`` into a :class:`SiteIndex` (one walk of halls, rows, racks and nodes)."""
    cdu_names = [c.name for c in site.cdus]
    cdu_pos = {n: i for i, n in enumerate(cdu_names)}
    fleet_of = site.fleet_of_node
    gpu_ids, gpu_node, gpu_rack, gpu_cdu, gpu_class, gpu_fleet = [], [], [], [], [], []
    gpu_slot: list[int] = []
    node_names, node_rack, node_start, node_uuids, node_phase, node_fleet = [], [], [0], [], [], []
    rack_names, rack_pdus, rack_cdu, rack_prior = [], [], [], []
    rack_hall, rack_row, rack_cdu_name = [], [], []
    rack_node_start = [0]
    for hall in site.halls:
        for row in hall.rows:
            for r in row.racks:
                r_i = len(rack_names)
                rack_names.append(r.name)
                rack_pdus.append(list(r.pdus))
                rack_cdu.append(cdu_pos.get(r.cdu, -1) if r.cdu else -1)
                rack_prior.append(site.capture_fraction(r))
                rack_hall.append(hall.name)
                rack_row.append(row.name)
                rack_cdu_name.append(r.cdu)
                for n in r.nodes:
                    liquid = n.spec.cooling == "liquid" and r.cdu is not None
                    fleet = fleet_of.get(n.name)
                    fleet_name = fleet.name if fleet else ""
                    gpu_class_n = n.gpu_model or n.spec.gpu
                    cdu_i = cdu_pos[r.cdu] if liquid and r.cdu else -1
                    for slot, gid in enumerate(n.gpu_ids()):
                        gpu_ids.append(gid)
                        gpu_node.append(n.name)
                        gpu_rack.append(r_i)
                        gpu_cdu.append(cdu_i)
                        gpu_class.append(gpu_class_n)
                        gpu_fleet.append(fleet_name)
                        gpu_slot.append(slot)
                    node_names.append(n.name)
                    node_rack.append(r_i)
                    node_start.append(len(gpu_ids))
                    node_uuids.append(tuple(n.gpu_uuids or ()))
                    node_phase.append(n.phase)
                    node_fleet.append(fleet_name)
                rack_node_start.append(len(node_names))
    return SiteIndex(
        gpu_ids=gpu_ids,
        gpu_node=gpu_node,
        gpu_rack=np.array(gpu_rack, dtype=np.int64),
        gpu_cdu=np.array(gpu_cdu, dtype=np.int64),
        gpu_class=gpu_class,
        gpu_fleet=gpu_fleet,
        rack_names=rack_names,
        rack_pdus=rack_pdus,
        rack_cdu=np.array(rack_cdu, dtype=np.int64),
        rack_prior=np.array(rack_prior, dtype=float),
        cdu_names=cdu_names,
        cdu_fluid=[c.coolant for c in site.cdus],
        gpu_slot=np.array(gpu_slot, dtype=np.int64),
        node_names=node_names,
        node_rack=np.array(node_rack, dtype=np.int64),
        node_gpu_start=np.array(node_start, dtype=np.int64),
        node_uuids=node_uuids,
        node_phase=node_phase,
        node_fleet=node_fleet,
        rack_node_start=np.array(rack_node_start, dtype=np.int64),
        rack_hall=rack_hall,
        rack_row=rack_row,
        rack_cdu_name=rack_cdu_name,
    )


def gpu_reference(idx: SiteIndex, cdu: Window, node: Window, pdu: Window) -> np.ndarray:
    """Reference temperature per GPU: its CDU's supply (liquid) or its node's inlet air
    (:func:`node_inlet_c`: its rack's PDU inlet where the node has none)."""
    t = cdu.n_steps
    ref = np.full((t, len(idx.gpu_ids)), np.nan)
    liquid = idx.gpu_cdu >= 0
    if liquid.any():
        ref[:, liquid] = cdu.values["supply_temp_c"][:, idx.gpu_cdu[liquid]]
    air = ~liquid
    if air.any():
        # a node that did not report (or no node at all) gives all-NaN columns
        nodes = [idx.gpu_node[g] for g in np.flatnonzero(air)]
        inlet = node.select(nodes).values["inlet_temp_c"]
        ref[:, air] = node_inlet_c(idx, nodes, inlet, pdu.ids, pdu.values["inlet_temp_c"])
    return ref


def node_inlet_c(
    idx: SiteIndex, nodes: list[str], inlet_c: np.ndarray, pdu_ids: list[str], pdu_c: np.ndarray
) -> np.ndarray:
    """(T, N) the inlet air of ``nodes`` (columns of ``inlet_c``): a node without any inlet
    reading takes that of the first of its rack's PDUs (``pdu_c``, columns ``pdu_ids``) that
    has one. The live reference (:func:`gpu_reference`) and a replay's recording
    (``twin.replay.recording``) both take it from here."""
    out = np.array(inlet_c, dtype=float)
    pdu_pos = {p: i for i, p in enumerate(pdu_ids)}
    rack_of = dict(zip(idx.node_names, idx.node_rack.tolist(), strict=True))
    for j, name in enumerate(nodes):
        if not np.isnan(out[:, j]).all() or name not in rack_of:
            continue
        for p in idx.rack_pdus[rack_of[name]]:
            if p in pdu_pos and np.isfinite(pdu_c[:, pdu_pos[p]]).any():
                out[:, j] = pdu_c[:, pdu_pos[p]]
                break
    return out


def gpu_flow_ratio(
    idx: SiteIndex,
    flow_ref_lpm: dict[str, float] | np.ndarray,
    flow_lpm: np.ndarray,
    cols: slice = slice(None),
) -> np.ndarray:
    """Per GPU (of ``cols``): its loop's flow over the flow its R was fitted at; 1 for air, and
    where either flow is unknown (an R is taken as fitted). ``flow_ref_lpm``: per CDU, by name
    or in ``idx.cdu_names`` order (NaN: none); ``flow_lpm`` (C,) now, or (M, C) per row, which
    gives (M, G). The live headroom, the live hot spots and a replay's hot spots take it here."""
    if isinstance(flow_ref_lpm, dict):
        flow_ref_lpm = [flow_ref_lpm.get(name, np.nan) for name in idx.cdu_names]
    ref = np.asarray(flow_ref_lpm, dtype=float)
    flow = np.asarray(flow_lpm, dtype=float)
    own = np.asarray(idx.gpu_cdu)[cols]
    if not len(idx.cdu_names):
        return np.ones((*flow.shape[:-1], own.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(ref > 0, flow[..., : ref.size] / ref, np.nan)
    r = np.where(np.isfinite(r), r, 1.0)
    return np.where(own >= 0, r[..., np.maximum(own, 0)], 1.0)


@dataclass
class SiteLookups:
    """Lookups the API's endpoints need, built once from the site index."""

    site: Site
    gpu_node: dict[str, tuple[str, int]] = field(default_factory=dict)
    node_rack: dict[str, str] = field(default_factory=dict)
    rack_where: dict[str, tuple[str, str]] = field(default_factory=dict)
    pdu_racks: dict[str, list[str]] = field(default_factory=dict)
    cdu_racks: dict[str, list[str]] = field(default_factory=dict)
    fleet_of_rack: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, site: Site, idx: SiteIndex | None = None) -> SiteLookups:
        idx = idx if idx is not None else index_site(site)
        out = cls(site)
        for r_i, rack in enumerate(idx.rack_names):
            out.rack_where[rack] = (idx.rack_hall[r_i], idx.rack_row[r_i])
            for p in idx.rack_pdus[r_i]:
                out.pdu_racks.setdefault(p, []).append(rack)
            cdu = idx.rack_cdu_name[r_i]
            if cdu:
                out.cdu_racks.setdefault(cdu, []).append(rack)
            fleets = {idx.node_fleet[n] for n in idx.rack_nodes(r_i)} - {""}
            if fleets:
                out.fleet_of_rack[rack] = ",".join(sorted(fleets))
        for n_i, node in enumerate(idx.node_names):
            out.node_rack[node] = idx.rack_names[idx.node_rack[n_i]]
            for slot, gid in enumerate(idx.node_gpus(n_i)):
                out.gpu_node[gid] = (node, slot)
            for slot, uuid in enumerate(idx.node_uuids[n_i]):
                out.gpu_node[uuid] = (node, slot)
        return out

    def racks_of(self, entity: str) -> set[str]:
        """Racks an alert entity or group id lies in (a CDU or PDU: the racks it serves)."""
        if entity in self.rack_where:
            return {entity}
        if entity in self.node_rack:
            return {self.node_rack[entity]}
        if entity in self.gpu_node:
            return {self.node_rack[self.gpu_node[entity][0]]}
        head = entity.split("/", 1)[0]
        if head in self.pdu_racks:
            return set(self.pdu_racks[head])
        if head in self.cdu_racks:
            return set(self.cdu_racks[head])
        return set()
