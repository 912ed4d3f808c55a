"""Shards: which part of a site one ``dctwin serve --shard NAME`` subscribes to, stores and models.

A site file's ``shards:`` names groups of halls (or ``<hall>/<row>`` rows of one big hall). Without
it the site is one shard, :data:`DEFAULT_SHARD`, that owns everything. With it, every component
has a *home* shard:

- racks, their nodes and GPUs: the shard of their hall or row;
- a PDU or CDU: the shard of the racks it feeds or serves; one serving racks of several shards
  spans them and must be named in the ``owns`` of exactly one shard;
- a loop (``Cdu.loop``) whose CDUs' racks lie in several shards spans them; its owner is the home
  of all its CDUs;
- a leaf switch in a rack: that rack's shard; a switch without a rack (a spine): the shard of
  the racks and nodes it is linked to, or its owner when that is several;
- a link: the shard of its two ends, or its owner when they differ.

Telemetry sources follow (the wire contract's ``dctwin/v1/<site>/<kind>/<source>``): ``gpu`` and
``node`` are published by the node, ``pdu`` and ``cdu`` by the device, ``link`` by the switch at
the link's leaf end (else a switch end, else end ``a``: what the simulator and the SNMP collector
do). Each source has exactly one home shard (:attr:`ShardView.sources`). A shard also *reads*
the sources of other shards that the components it owns need (:attr:`ShardView.reads`): a
spanning CDU's heat is the power of every rack it serves, so its owner subscribes to those
racks' nodes and PDUs too, and stores them beside its own. Its detection and alerts still cover
only its own components (:meth:`ShardView.owns_entity`), so nothing is paged twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from collectors.contract import split_gpu_id, split_sub_id, topic_for

if TYPE_CHECKING:
    from twin.site.model import Site

__all__ = [
    "DEFAULT_SHARD",
    "ShardError",
    "ShardView",
    "shard_names",
    "shard_problems",
    "shard_view",
]

#: The one shard of a site file without ``shards:``.
DEFAULT_SHARD = "main"

Loc = tuple[str | int, ...]


class ShardError(ValueError):
    """A shard name the site file does not define."""


def shard_names(site: Site) -> list[str]:
    """The site's shard names, in file order (``["main"]`` without ``shards:``)."""
    return [s.name for s in site.shards] or [DEFAULT_SHARD]


def link_publisher(site: Site, a: str, b: str) -> str:
    """The MQTT source that publishes a link's counters: its leaf switch, else a switch end,
    else end ``a`` (the simulator's rule, twin/simulator/engine.py)."""
    roles = {s.name: s.role for s in site.switches}
    ends = (a, b)
    kinds = [roles.get(e) for e in ends]
    if "leaf" in kinds:
        return ends[kinds.index("leaf")]
    if kinds[0] is not None or kinds[1] is not None:
        return ends[0] if kinds[0] is not None else ends[1]
    return a


@dataclass
class _Plan:
    """Every component's home shard, and what the validation found wrong (with its loc)."""

    rack: dict[str, str] = field(default_factory=dict)
    row: dict[str, str] = field(default_factory=dict)  # "hall/row" -> shard
    pdu: dict[str, str] = field(default_factory=dict)
    cdu: dict[str, str] = field(default_factory=dict)
    loop: dict[str, str] = field(default_factory=dict)
    switch: dict[str, str] = field(default_factory=dict)
    link: dict[str, str] = field(default_factory=dict)
    #: shard -> names of the spanning components it owns
    owned: dict[str, list[str]] = field(default_factory=dict)
    problems: list[tuple[Loc, Any, str]] = field(default_factory=list)


def _names(shards: Iterable[str]) -> str:
    return ", ".join(sorted(shards))


def _plan(site: Site) -> _Plan:
    """Every component's home shard and the problems of the site's ``shards:``."""
    plan = _Plan()
    if not site.shards:
        for h in site.halls:
            for w in h.rows:
                plan.row[f"{h.name}/{w.name}"] = DEFAULT_SHARD
                for r in w.racks:
                    plan.rack[r.name] = DEFAULT_SHARD
        plan.pdu = dict.fromkeys((p.name for p in site.pdus), DEFAULT_SHARD)
        plan.cdu = dict.fromkeys((c.name for c in site.cdus), DEFAULT_SHARD)
        plan.loop = {c.loop: DEFAULT_SHARD for c in site.cdus if c.loop}
        plan.switch = dict.fromkeys((s.name for s in site.switches), DEFAULT_SHARD)
        plan.link = dict.fromkeys((lk.name for lk in site.links), DEFAULT_SHARD)
        plan.owned[DEFAULT_SHARD] = []
        return plan
    planner = _Planner(site, plan)
    planner.rows()
    planner.owns()
    if plan.problems:  # a row in no shard or two: what spans what is not known yet
        return plan
    planner.power_and_cooling()
    planner.network()
    return plan


class _Planner:
    """The passes of :func:`_plan` over a site with ``shards:``, in order."""

    def __init__(self, site: Site, plan: _Plan):
        self.site = site
        self.plan = plan
        self.problem = plan.problems.append
        self.owner_of: dict[str, str] = {}

    def rows(self) -> None:
        """Names unique; every hall row in exactly one shard."""
        site, plan, problem = self.site, self.plan, self.problem
        first: dict[str, int] = {}
        for i, s in enumerate(site.shards):
            if s.name in first:
                problem((("shards", i, "name"), s.name, f"duplicate shard name {s.name!r}"))
            first.setdefault(s.name, i)
        halls = {h.name: h for h in site.halls}
        claims: dict[str, list[str]] = {}
        for i, s in enumerate(site.shards):
            if not s.halls and not s.rows:
                problem((("shards", i), s.name, f"shard {s.name!r} lists no halls and no rows"))
            for j, h in enumerate(s.halls):
                if h not in halls:
                    problem((("shards", i, "halls", j), h, f"shard {s.name!r}: no hall {h!r}"))
                    continue
                for w in halls[h].rows:
                    claims.setdefault(f"{h}/{w.name}", []).append(s.name)
            for j, hr in enumerate(s.rows):
                h, _, w = hr.partition("/")
                if h not in halls or w not in {x.name for x in halls[h].rows}:
                    problem(
                        (
                            ("shards", i, "rows", j),
                            hr,
                            f"shard {s.name!r}: no row {hr!r} (rows are named <hall>/<row>)",
                        )
                    )
                    continue
                claims.setdefault(hr, []).append(s.name)
        for h in site.halls:
            for w in h.rows:
                key = f"{h.name}/{w.name}"
                owners = claims.get(key, [])
                if len(owners) != 1:
                    why = (
                        f"hall {h.name!r} row {w.name!r} is in no shard"
                        if not owners
                        else f"hall {h.name!r} row {w.name!r} is in shards {_names(owners)}"
                    )
                    problem((("shards",), key, f"{why}: each row must be in exactly one shard"))
                if owners:
                    plan.row[key] = owners[0]
                    for r in w.racks:
                        plan.rack[r.name] = owners[0]

    def owns(self) -> None:
        """Every ``owns`` name resolves and is owned by one shard."""
        site, problem, owner_of = self.site, self.problem, self.owner_of
        kinds: dict[str, str] = {}
        for p in site.pdus:
            kinds.setdefault(p.name, "PDU")
        for c in site.cdus:
            kinds.setdefault(c.name, "CDU")
            if c.loop:
                kinds.setdefault(c.loop, "loop")
        for sw in site.switches:
            kinds.setdefault(sw.name, "switch")
        for lk in site.links:
            kinds.setdefault(lk.name, "link")
        for i, s in enumerate(site.shards):
            self.plan.owned.setdefault(s.name, [])
            for j, name in enumerate(s.owns):
                loc = ("shards", i, "owns", j)
                if name not in kinds:
                    problem(
                        (
                            loc,
                            name,
                            f"shard {s.name!r} owns {name!r}, which is no loop, CDU, PDU,"
                            " switch or link of the site",
                        )
                    )
                elif name in owner_of and owner_of[name] != s.name:
                    both = _names({owner_of[name], s.name})
                    problem(
                        (loc, name, f"{kinds[name]} {name!r} is owned by shards {both}: one only")
                    )
                else:
                    owner_of[name] = s.name

    def settle(
        self, kind: str, name: str, touched: set[str], home: dict[str, str], loc: Loc
    ) -> None:
        """Home of a component whose parts lie in the shards ``touched`` (``loc``: where the
        site file defines it)."""
        owner = self.owner_of.get(name)
        plan = self.plan
        if len(touched) == 1 and (owner is None or owner in touched):
            home[name] = next(iter(touched))
        elif owner is not None and touched and len(touched) == 1:
            self.problem(
                (
                    loc,
                    name,
                    f"shard {owner!r} owns {kind} {name!r}, which lies within shard"
                    f" {next(iter(touched))!r}: only components that span shards are owned",
                )
            )
        elif owner is not None:  # spans shards, or touches none: its owner's
            home[name] = owner
            plan.owned[owner].append(name)
        elif not touched and len(self.site.shards) == 1:
            home[name] = self.site.shards[0].name
        else:
            where = f"spans shards {_names(touched)}" if touched else "touches no shard's racks"
            self.problem(
                (
                    loc,
                    name,
                    f"{kind} {name!r} {where}: name it in the owns of exactly one shard",
                )
            )

    def power_and_cooling(self) -> None:
        """PDUs and CDUs by their racks; a loop by its CDUs' racks (its owner has its CDUs)."""
        site, plan = self.site, self.plan
        fed: dict[str, set[str]] = {p.name: set() for p in site.pdus}
        served: dict[str, set[str]] = {c.name: set() for c in site.cdus}
        for r in site.racks:
            shard = plan.rack.get(r.name)
            if shard is None:
                continue
            for p in r.pdus:
                fed[p].add(shard)
            if r.cdu is not None:
                served[r.cdu].add(shard)
        for i, p in enumerate(site.pdus):
            self.settle("PDU", p.name, fed[p.name], plan.pdu, ("pdus", i))
        loops: dict[str, set[str]] = {}
        first: dict[str, int] = {}
        for i, c in enumerate(site.cdus):
            if c.loop:
                loops.setdefault(c.loop, set()).update(served[c.name])
                first.setdefault(c.loop, i)
        for name, touched in loops.items():
            self.settle("loop", name, touched, plan.loop, ("cdus", first[name], "loop"))
        for i, c in enumerate(site.cdus):
            if not (c.loop and c.loop in plan.loop and len(loops[c.loop]) > 1):
                self.settle("CDU", c.name, served[c.name], plan.cdu, ("cdus", i))
                continue
            plan.cdu[c.name] = plan.loop[c.loop]
            other = self.owner_of.get(c.name)
            if other is not None and other != plan.loop[c.loop]:
                self.problem(
                    (
                        ("cdus", i),
                        c.name,
                        f"CDU {c.name!r} is owned by shard {other!r} but its loop {c.loop!r}"
                        f" by shard {plan.loop[c.loop]!r}: a loop's owner has its CDUs",
                    )
                )

    def network(self) -> None:
        """Switches in a rack: that rack's; others by what they link to; then the links."""
        site, plan = self.site, self.plan
        node_shard = {n.name: plan.rack.get(r.name) for r in site.racks for n in r.nodes}
        racked = {sw.name: plan.rack.get(sw.rack) for sw in site.switches if sw.rack is not None}
        near: dict[str, set[str]] = {sw.name: set() for sw in site.switches if sw.rack is None}
        for lk in site.links:
            for end, other in ((lk.a, lk.b), (lk.b, lk.a)):
                if end in near:
                    there = node_shard.get(other) or racked.get(other)
                    if there is not None:
                        near[end].add(there)
        for i, sw in enumerate(site.switches):
            shard = racked.get(sw.name)
            if sw.rack is None:
                self.settle("switch", sw.name, near[sw.name], plan.switch, ("switches", i))
            elif shard is not None:
                plan.switch[sw.name] = shard
        for i, lk in enumerate(site.links):
            ends = {node_shard.get(e) or plan.switch.get(e) for e in (lk.a, lk.b)}
            touched = {e for e in ends if e is not None}
            self.settle("link", lk.name, touched, plan.link, ("links", i))


def shard_problems(site: Site) -> list[tuple[Loc, Any, str]]:
    """(loc, value, message) of every problem with the site's ``shards:`` (empty when none);
    the site model's validation reports them with the file's line."""
    return _plan(site).problems


@dataclass(frozen=True)
class ShardView:
    """One shard of a site: what it owns, the telemetry sources it subscribes to, and the
    sub-site its calibration, forecast and detection run on.

    ``sources``: (kind, source) pairs whose home is this shard (every source of the site is the
    home of exactly one shard). ``reads``: sources of other shards that its owned spanning
    components need (stored here too). ``topic_filters``: the exact MQTT topics of both.
    ``site``: a valid Site of this shard's racks, nodes, PDUs, CDUs, switches, links and fleets
    (members within the shard), plus the racks it reads, and no ``shards:``: what calibration,
    forecast and detection model. ``own_site``: the same without the racks it reads (and the
    links to their nodes): what its API shows.
    """

    name: str
    site_name: str
    halls: list[str]
    rows: list[str]
    racks: list[str]
    nodes: list[str]
    pdus: list[str]
    cdus: list[str]
    switches: list[str]
    links: list[str]
    fleets: dict[str, list[str]]
    owns: list[str]
    sources: list[tuple[str, str]]
    reads: list[tuple[str, str]]
    topic_filters: list[str]
    site: Site
    #: the sub-site without the racks it reads: what its API shows (floor map, hot spots)
    own_site: Site
    api_url: str | None = None

    @cached_property
    def accepted(self) -> frozenset[tuple[str, str]]:
        """The (kind, source) pairs this shard stores: its own and those it reads."""
        return frozenset(self.sources) | frozenset(self.reads)

    @cached_property
    def _own(self) -> dict[str, frozenset[str]]:
        uuids = {u: n.name for n in self.site.nodes for u in (n.gpu_uuids or ())}
        return {
            "node": frozenset(self.nodes),
            "rack": frozenset(self.racks),
            "pdu": frozenset(self.pdus),
            "cdu": frozenset(self.cdus),
            "link": frozenset(self.links),
            "fleet": frozenset(self.fleets),
            "uuid": frozenset(u for u, n in uuids.items() if n in set(self.nodes)),
        }

    def owns_entity(self, kind: str, entity_id: str) -> bool:
        """Whether a headroom row or alert entity (``gpu`` ``node:idx`` or UUID, ``node``,
        ``rack``, ``pdu``, ``pdu_phase``, ``cdu``, ``loop``, ``link``, ``fleet``, ``site``) is
        this shard's to report; a shard's reads are not."""
        own = self._own
        if kind == "gpu":
            split = split_gpu_id(entity_id)
            return split[0] in own["node"] if split else entity_id in own["uuid"]
        if kind in ("pdu", "pdu_phase"):
            return split_sub_id(entity_id)[0] in own["pdu"]
        if kind in ("cdu", "loop"):
            return split_sub_id(entity_id)[0] in own["cdu"]
        if kind in own:
            return entity_id in own[kind]
        return True  # the site as a whole: each shard reports its part


def shard_view(site: Site, name: str) -> ShardView:
    """The shard ``name`` of ``site``; :class:`ShardError` naming the shards when it has none."""
    names = shard_names(site)
    if name not in names:
        raise ShardError(f"no shard {name!r} in site {site.name!r}; its shards: {', '.join(names)}")
    plan = _plan(site)
    spec = next((s for s in site.shards if s.name == name), None)
    racks = [r for r in site.racks if plan.rack.get(r.name) == name]
    rack_names = {r.name for r in racks}
    nodes = [n.name for r in racks for n in r.nodes]
    pdus = [p.name for p in site.pdus if plan.pdu.get(p.name) == name]
    cdus = [c.name for c in site.cdus if plan.cdu.get(c.name) == name]
    switches = [s.name for s in site.switches if plan.switch.get(s.name) == name]
    links = [lk.name for lk in site.links if plan.link.get(lk.name) == name]
    node_rack = {n.name: r.name for r in site.racks for n in r.nodes}

    # reads: the racks other shards own that this shard's PDUs, CDUs and links need
    read_racks: set[str] = set()
    own_pdus, own_cdus = set(pdus), set(cdus)
    for r in site.racks:
        if r.name not in rack_names and (
            own_pdus.intersection(r.pdus) or (r.cdu is not None and r.cdu in own_cdus)
        ):
            read_racks.add(r.name)
    for lk in site.links:
        if lk.name in links:
            for end in (lk.a, lk.b):
                if end in node_rack and node_rack[end] not in rack_names:
                    read_racks.add(node_rack[end])

    def rack_sources(r: Any) -> list[tuple[str, str]]:
        out = [(k, n.name) for n in r.nodes for k in ("gpu", "node")]
        return out + [("pdu", p) for p in r.pdus]

    def link_source(lk: Any) -> tuple[str, str]:
        return ("link", link_publisher(site, lk.a, lk.b))

    sources: dict[tuple[str, str], None] = {}
    for n in nodes:
        sources[("gpu", n)] = None
        sources[("node", n)] = None
    for p in pdus:
        sources[("pdu", p)] = None
    for c in cdus:
        sources[("cdu", c)] = None
    publisher_home = {**{n: plan.rack.get(r) for n, r in node_rack.items()}, **plan.switch}
    for lk in site.links:
        src = link_source(lk)
        if publisher_home.get(src[1]) == name:
            sources[src] = None
    reads: dict[tuple[str, str], None] = {}
    for r in site.racks:
        if r.name in read_racks:
            for src in rack_sources(r):
                if src not in sources:
                    reads[src] = None
    for lk in site.links:
        if lk.name in links and link_source(lk) not in sources:
            reads[link_source(lk)] = None

    sub = _sub_site(site, rack_names | read_racks, own_pdus, own_cdus, set(links), set(nodes))
    own = (
        sub
        if not read_racks
        else _sub_site(site, rack_names, own_pdus, own_cdus, set(links), set(nodes))
    )
    fleets = {f.name: list(f.members) for f in sub.fleets}
    halls = [
        h.name for h in site.halls if any(r.name in rack_names for w in h.rows for r in w.racks)
    ]
    rows = [k for k, v in plan.row.items() if v == name]
    every = list(sources) + list(reads)
    return ShardView(
        name=name,
        site_name=site.name,
        halls=halls,
        rows=rows,
        racks=[r.name for r in racks],
        nodes=nodes,
        pdus=pdus,
        cdus=cdus,
        switches=switches,
        links=links,
        fleets=fleets,
        owns=list(plan.owned.get(name, [])),
        sources=list(sources),
        reads=list(reads),
        topic_filters=[topic_for(site.name, k, s) for k, s in every],
        site=sub,
        own_site=own,
        api_url=spec.api_url if spec is not None else None,
    )


def _sub_site(
    site: Site,
    racks: set[str],
    pdus: set[str],
    cdus: set[str],
    links: set[str],
    own_nodes: set[str],
) -> Site:
    """A valid Site of ``racks`` (with the PDUs and CDUs they reference), ``pdus``, ``cdus``,
    ``links`` (with their switches) and the fleets' members among ``own_nodes``' racks."""
    from twin.site.model import Site

    data = site.model_dump(mode="python", exclude={"shards"})
    halls = []
    for h in data["halls"]:
        rows = []
        for w in h["rows"]:
            kept = [r for r in w["racks"] if r["name"] in racks]
            if kept:
                rows.append({**w, "racks": kept})
        if rows:
            halls.append({**h, "rows": rows})
    kept_racks = [r for h in halls for w in h["rows"] for r in w["racks"]]
    pdus = pdus | {p for r in kept_racks for p in r["pdus"]}
    cdus = cdus | {r["cdu"] for r in kept_racks if r["cdu"] is not None}
    node_names = {n["name"] for r in kept_racks for n in r["nodes"]}
    switch_names = {sw["name"] for sw in data["switches"]}
    kept_links = [
        lk
        for lk in data["links"]
        if lk["name"] in links
        and all(e in node_names or e in switch_names for e in (lk["a"], lk["b"]))
    ]
    ends = {e for lk in kept_links for e in (lk["a"], lk["b"])}
    switches = []
    for sw in data["switches"]:
        if sw["name"] in ends or (sw["rack"] in racks):
            switches.append({**sw, "rack": sw["rack"] if sw["rack"] in racks else None})
    own_racks = {r["name"] for r in kept_racks if any(n["name"] in own_nodes for n in r["nodes"])}
    fleets = []
    for f in data["fleets"]:
        members = [m for m in f["members"] if m in own_nodes or m in own_racks]
        if members:
            fleets.append({**f, "members": members})
    data.update(
        halls=halls,
        pdus=[p for p in data["pdus"] if p["name"] in pdus],
        cdus=[c for c in data["cdus"] if c["name"] in cdus],
        switches=switches,
        links=kept_links,
        fleets=fleets,
    )
    if not halls:
        raise ShardError(f"shard of site {site.name!r} holds no rack")
    return Site.model_validate(data)
