"""Where an entity sits in the power and cooling trees, for grouping and inhibition.

Entities are ``(kind, id)`` pairs. Parents, from :meth:`Topology.from_site`:

======================  =================================================================
entity                  parents
======================  =================================================================
gpu ``node:i`` / UUID   node
node                    rack; the PDU phase it draws from on each of its rack's PDUs
                        (``<pdu>/L<n>``: the node's ``phase``, else spread by position in
                        the rack, as the simulator does); its fleet (grouping only)
rack                    its PDUs (power); its CDU (cooling)
pdu_phase ``pdu/Ln``    pdu
pdu ``pdu/<breaker>``   pdu (the whole unit)
pdu_phase ``pdu/<br>``  the breaker as headroom reports it: its phase(s) ``pdu/Ln``, pdu
cdu ``cdu/<pump>``      cdu (the loop)
loop ``<cdu>``          cdu
======================  =================================================================

``along="power"`` follows node -> rack -> PDU phase/PDU, ``along="cooling"`` follows
node -> rack -> CDU. An entity the site does not list has no ancestors: it is still
alertable, grouped as itself (links: each link is its own group).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote

from collectors.contract import phase_ids, phase_label, split_sub_id, sub_id
from twin.site.index import index_site
from twin.site.model import Site

Entity = tuple[str, str]
Tree = Literal["power", "cooling"]

_KIND_WORD = {
    "gpu": "GPU",
    "node": "node",
    "rack": "rack",
    "pdu": "PDU",
    "pdu_phase": "PDU phase",
    "cdu": "CDU",
    "loop": "loop",
    "link": "link",
    "fleet": "fleet",
    "site": "site",
}


def kind_word(kind: str) -> str:
    """``"cdu"`` -> ``"CDU"``: the kind as a person writes it."""
    return _KIND_WORD.get(kind, kind)


@dataclass
class Topology:
    """Parent links of a site along the power and cooling trees, and fleet membership."""

    site_name: str = "site"
    power: dict[Entity, list[Entity]] = field(default_factory=dict)
    cooling: dict[Entity, list[Entity]] = field(default_factory=dict)
    fleet: dict[Entity, Entity] = field(default_factory=dict)

    @classmethod
    def from_site(cls, site: Site) -> Topology:
        topo = cls(site_name=site.name)
        pw, cool = topo.power, topo.cooling

        def link(tree: dict[Entity, list[Entity]], child: Entity, parent: Entity) -> None:
            parents = tree.setdefault(child, [])
            if parent not in parents:
                parents.append(parent)

        idx = index_site(site)
        for r_i, rack in enumerate(idx.rack_names):
            r = ("rack", rack)
            for p in idx.rack_pdus[r_i]:
                link(pw, r, ("pdu", p))
            cdu = idx.rack_cdu_name[r_i]
            if cdu is not None:
                link(cool, r, ("cdu", cdu))
            for k, n_i in enumerate(idx.rack_nodes(r_i)):
                n = ("node", idx.node_names[n_i])
                link(pw, n, r)
                link(cool, n, r)
                phase = idx.node_phase[n_i] or phase_label(k % 3 + 1)
                for p in idx.rack_pdus[r_i]:
                    pdu = site.pdu_by_name.get(p)
                    ph = phase if pdu is None or pdu.phases == 3 else phase_label(1)
                    link(pw, n, ("pdu_phase", sub_id(p, ph)))
                for g in [*idx.node_gpus(n_i), *idx.node_uuids[n_i]]:
                    link(pw, ("gpu", g), n)
                    link(cool, ("gpu", g), n)
        for pdu in site.pdus:
            for ph_id in phase_ids(pdu.name, pdu.phases):
                link(pw, ("pdu_phase", ph_id), ("pdu", pdu.name))
            for b in pdu.breakers:
                link(pw, ("pdu", sub_id(pdu.name, b.name)), ("pdu", pdu.name))
                # headroom reports a breaker as a pdu_phase entity (twin.chain.phase_table):
                # under its phase (or phases) and its PDU, so it groups and is inhibited there
                br = ("pdu_phase", sub_id(pdu.name, b.name))
                for leg in b.phase.split("-"):
                    if sub_id(pdu.name, leg) in phase_ids(pdu.name, pdu.phases):
                        link(pw, br, ("pdu_phase", sub_id(pdu.name, leg)))
                link(pw, br, ("pdu", pdu.name))
        for cdu in site.cdus:
            link(cool, ("loop", cdu.name), ("cdu", cdu.name))
            for pump in cdu.pumps:
                link(cool, ("cdu", sub_id(cdu.name, pump)), ("cdu", cdu.name))
        for node_name, fleet in zip(idx.node_names, idx.node_fleet, strict=True):
            if fleet:
                topo.fleet[("node", node_name)] = ("fleet", fleet)
        return topo

    # ---- queries ---------------------------------------------------------------------------

    def _tree(self, along: Tree) -> dict[Entity, list[Entity]]:
        return self.power if along == "power" else self.cooling

    def ancestors(self, entity: Entity, along: Tree) -> list[Entity]:
        """Every ancestor of ``entity`` along one tree, nearest first (the entity excluded)."""
        tree = self._tree(along)
        out: list[Entity] = []
        frontier = list(tree.get(entity, ()))
        while frontier:
            nxt: list[Entity] = []
            for e in frontier:
                if e not in out and e != entity:
                    out.append(e)
                    nxt.extend(tree.get(e, ()))
            frontier = nxt
        return out

    def is_under(self, entity: Entity, ancestor: Entity, along: Tree) -> bool:
        """True when ``ancestor`` is ``entity`` itself or above it along the tree."""
        return entity == ancestor or ancestor in self.ancestors(entity, along)

    def group_of(self, entity: Entity, group_by: str) -> Entity:
        """The entity's nearest ancestor of kind ``group_by`` (itself when of that kind).

        ``group_by="none"``, or no such ancestor: the entity itself. ``"fleet"`` goes through
        the entity's node; ``"pdu"`` takes the first PDU of the rack (its A feed as listed).
        """
        if group_by in ("none", entity[0]):
            return entity
        if group_by == "fleet":
            node = entity if entity[0] == "node" else self._nearest(entity, "node")
            return self.fleet.get(node, entity) if node is not None else entity
        return self._nearest(entity, group_by) or entity

    def _nearest(self, entity: Entity, kind: str) -> Entity | None:
        for along in ("cooling", "power") if kind in ("cdu", "loop") else ("power", "cooling"):
            for e in self.ancestors(entity, along):  # type: ignore[arg-type]
                if e[0] == kind:
                    return e
        return None

    def children(self, entity: Entity) -> list[Entity]:
        """Direct children of ``entity`` in either tree, or in its fleet (sorted)."""
        out: set[Entity] = set()
        for tree in (self.power, self.cooling):
            for child, parents in tree.items():
                if entity in parents:
                    out.add(child)
        out.update(n for n, f in self.fleet.items() if f == entity)
        return sorted(out)

    def children_of_kind(self, entity: Entity, kinds: Iterable[str]) -> list[str]:
        wanted = set(kinds)
        return [c[1] for c in self.children(entity) if c[0] in wanted]

    def racks_of(self, entity: Entity) -> list[str]:
        """The racks an incident on ``entity`` concerns: those a CDU, loop or PDU (or one of
        its pumps, breakers or phases) serves, a fleet's racks, the rack itself, or the rack
        above a node or GPU. Empty for the site and for links."""
        kind, name = entity
        if kind == "rack":
            return [name]
        if kind in ("cdu", "loop"):
            return self.children_of_kind(("cdu", split_sub_id(name)[0]), ["rack"])
        if kind == "pdu":
            return self.children_of_kind(("pdu", split_sub_id(name)[0]), ["rack"])
        if kind in ("pdu_phase", "fleet"):
            nodes = self.children_of_kind(entity, ["node"])
            return sorted({r for n in nodes for r in self.racks_of(("node", n))})
        if kind in ("node", "gpu"):
            return [i for k, i in self.ancestors(entity, "power") if k == "rack"][:1]
        return []

    def cdus_of(self, entity: Entity) -> list[str]:
        """The CDUs that cool what an incident on ``entity`` concerns (a CDU, loop or pump:
        its CDU; otherwise the CDUs above its racks). Empty where nothing is liquid-cooled."""
        kind, name = entity
        if kind in ("cdu", "loop"):
            return [split_sub_id(name)[0]]
        racks = self.racks_of(entity)
        return sorted(
            {i for r in racks for k, i in self.cooling.get(("rack", r), []) if k == "cdu"}
        )

    def console_path(self, entity: Entity) -> str:
        """The console page (path and query) where an incident on ``entity`` is looked at: a
        rack's page for racks, nodes and GPUs; the cooling page of a CDU; the power page of a
        PDU; a fleet on the fleets page; links on the network page."""
        kind, name = entity
        if kind in ("rack", "node", "gpu"):
            racks = self.racks_of(entity)
            return f"/rack?rack={quote(racks[0])}" if racks else "/alerts"
        if kind in ("cdu", "loop"):
            return f"/cooling?cdu={quote(split_sub_id(name)[0])}"
        if kind in ("pdu", "pdu_phase"):
            return f"/power?pdu={quote(split_sub_id(name)[0])}"
        if kind == "fleet":
            return f"/fleets?fleet={quote(name)}"
        if kind == "link":
            return f"/network?link={quote(name)}"
        return "/alerts"

    def describe(self, entity: Entity) -> str:
        """One line naming the entity and what hangs below it, for a page's description."""
        kind, name = entity
        word = kind_word(kind)
        if kind in ("cdu", "loop"):
            racks = self.children_of_kind(("cdu", split_sub_id(name)[0]), ["rack"])
            nodes = sorted({n for r in racks for n in self.children_of_kind(("rack", r), ["node"])})
            if racks:
                return f"{word} {name} cools racks {', '.join(racks)} (nodes {', '.join(nodes)})"
        if kind == "pdu":
            racks = self.children_of_kind(("pdu", split_sub_id(name)[0]), ["rack"])
            if racks:
                return f"{word} {name} feeds racks {', '.join(racks)}"
        if kind == "pdu_phase":
            nodes = self.children_of_kind(entity, ["node"])
            if nodes:
                return f"{word} {name} feeds nodes {', '.join(nodes)}"
        if kind == "rack":
            nodes = self.children_of_kind(entity, ["node"])
            up = [f"{kind_word(k)} {i}" for k, i in self.cooling.get(entity, [])]
            up += [f"{kind_word(k)} {i}" for k, i in self.power.get(entity, [])]
            tail = f"; served by {', '.join(up)}" if up else ""
            if nodes:
                return f"{word} {name} holds nodes {', '.join(nodes)}{tail}"
        if kind == "node":
            parents = self.power.get(entity, [])
            rack = next((i for k, i in parents if k == "rack"), None)
            if rack is not None:
                return f"{word} {name} in rack {rack}"
        if kind == "fleet":
            nodes = self.children_of_kind(entity, ["node"])
            if nodes:
                return f"{word} {name} of nodes {', '.join(nodes)}"
        return f"{word} {name}"
