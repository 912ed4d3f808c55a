"""The site model: what exists in the datacenter, validated by pydantic.

site -> halls -> rows -> racks -> nodes -> GPUs; PDUs feeding racks; CDUs serving racks;
switches and network links; fleets of nodes. Telemetry identities resolve through it:

========  ==========================================================================
kind      sample ``id``
========  ==========================================================================
gpu       ``<node>:<index>`` (for example ``trn-a01-n1:3``), or a UUID listed in the
          node's ``gpu_uuids``
node      the node name
pdu       ``<pdu>`` (whole unit), ``<pdu>/L1`` .. ``<pdu>/L3`` (phases),
          ``<pdu>/<breaker>`` (branch circuits), ``<pdu>/outlet<n>``
cdu       ``<cdu>`` (the loop), ``<cdu>/<pump>`` (one pump)
link      the link name
========  ==========================================================================
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from collectors.contract import (
    cdu_sample_ids,
    gpu_id,
    is_outlet_label,
    pdu_sample_ids,
    split_leg_id,
    split_sub_id,
)
from twin.site.catalog import CDU_MODELS, GPU_MODELS, NODE_MODELS, GpuModel, NodeModel

Name = str
Loc = tuple[str | int, ...]
_SLUG = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


def _dotted(loc: Loc) -> str:
    """``("halls", 0, "rows")`` -> ``halls[0].rows``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Node(_Strict):
    name: Name = Field(pattern=_SLUG, description="hostname; the MQTT source of its collector")
    model: str = Field(description="a key of the hardware catalog's node models")
    gpu_model: str | None = Field(
        default=None, description="a key of the catalog's GPU models; default: the node model's"
    )
    gpu_uuids: list[str] | None = Field(
        default=None, description="NVML UUIDs by GPU index, when known"
    )
    phase: Literal["L1", "L2", "L3"] | None = Field(
        default=None, description="PDU phase its PSUs draw from (default: spread by position)"
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str) -> str:
        if model not in NODE_MODELS:
            raise ValueError(f"unknown node model {model!r}; catalog has {sorted(NODE_MODELS)}")
        return model

    @field_validator("gpu_model")
    @classmethod
    def _known_gpu_model(cls, gpu_model: str | None) -> str | None:
        if gpu_model is not None and gpu_model not in GPU_MODELS:
            raise ValueError(f"unknown GPU model {gpu_model!r}; catalog has {sorted(GPU_MODELS)}")
        return gpu_model

    @model_validator(mode="after")
    def _gpu_count(self) -> Node:
        if self.gpu_uuids is not None and len(self.gpu_uuids) != NODE_MODELS[self.model].gpus:
            raise ValueError(
                f"gpu_uuids lists {len(self.gpu_uuids)} GPUs but {self.model} has "
                f"{NODE_MODELS[self.model].gpus}"
            )
        return self

    @property
    def spec(self) -> NodeModel:
        return NODE_MODELS[self.model]

    @property
    def gpu_spec(self) -> GpuModel:
        return GPU_MODELS[self.gpu_model or self.spec.gpu]

    def gpu_ids(self) -> list[str]:
        return [gpu_id(self.name, i) for i in range(self.spec.gpus)]


class Rack(_Strict):
    name: Name = Field(pattern=_SLUG)
    grid: tuple[int, int] = Field(description="(column, row) position on the hall's floor grid")
    pdus: list[Name] = Field(min_length=1, description="PDUs feeding this rack (A and B feeds)")
    cdu: Name | None = Field(default=None, description="CDU whose loop serves this rack")
    capture_fraction: float | None = Field(
        default=None, ge=0, le=1, description="share of rack heat to liquid; default from catalog"
    )
    nodes: list[Node] = Field(default_factory=list)


class Row(_Strict):
    name: Name = Field(pattern=_SLUG)
    racks: list[Rack] = Field(min_length=1)


class Hall(_Strict):
    name: Name = Field(pattern=_SLUG)
    rows: list[Row] = Field(min_length=1)


class Breaker(_Strict):
    name: Name = Field(pattern=_SLUG)
    phase: Literal["L1", "L2", "L3", "L1-L2", "L2-L3", "L3-L1"]
    rated_current_a: float = Field(gt=0)


class Pdu(_Strict):
    name: Name = Field(pattern=_SLUG)
    feed: Literal["A", "B"]
    phases: Literal[1, 3] = 3
    wiring: Literal["wye", "delta"] = Field(
        default="wye", description="wye: outlets line-to-neutral; delta: 208 V line-to-line"
    )
    voltage_v: float = Field(gt=0, description="line-to-line voltage [V]")
    rated_current_a: float = Field(gt=0, description="input breaker rating per phase [A]")
    breakers: list[Breaker] = Field(default_factory=list)


class Cdu(_Strict):
    name: Name = Field(pattern=_SLUG)
    model: str | None = Field(default=None, description="a key of the catalog's CDU models")
    capacity_kw: float | None = Field(default=None, gt=0)
    approach_k: float | None = Field(default=None, gt=0)
    max_flow_lpm: float | None = Field(default=None, gt=0)
    pumps: list[Name] = Field(default_factory=lambda: ["pump1", "pump2"], min_length=1)
    coolant: Literal["water", "pg25"] = "pg25"
    supply_setpoint_c: float = Field(default=32.0, description="TCS supply setpoint [°C]")
    fw_supply_temp_c: float = Field(default=25.0, description="design facility water supply [°C]")
    return_limit_c: float = Field(default=50.0, description="TCS return temperature limit [°C]")
    loop: Name | None = Field(
        default=None,
        description="TCS loop shared with other CDUs (a failed CDU's racks move to its peers)",
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str | None) -> str | None:
        if model is not None and model not in CDU_MODELS:
            raise ValueError(f"unknown CDU model {model!r}; catalog has {sorted(CDU_MODELS)}")
        return model

    @model_validator(mode="after")
    def _fill_from_catalog(self) -> Cdu:
        if self.model is not None:
            spec = CDU_MODELS[self.model]
            for field in ("capacity_kw", "approach_k", "max_flow_lpm"):
                if getattr(self, field) is None:
                    setattr(self, field, getattr(spec, field))
        missing = [
            f for f in ("capacity_kw", "approach_k", "max_flow_lpm") if getattr(self, f) is None
        ]
        if missing:
            raise ValueError(f"{', '.join(missing)} required when no catalog model is given")
        return self


class Switch(_Strict):
    name: Name = Field(pattern=_SLUG)
    role: Literal["leaf", "spine"]
    rack: Name | None = None


class Link(_Strict):
    name: Name = Field(pattern=_SLUG)
    a: Name = Field(description="endpoint: a switch or node name")
    b: Name = Field(description="endpoint: a switch or node name")
    capacity_gbps: float = Field(gt=0)


class FleetUnderuse(_Strict):
    """How an inference fleet is judged underused (twin.analysis.fleets); absent fields take the
    report's defaults."""

    threshold: float | None = Field(
        default=None, gt=0, le=1, description="flag when mean activity is below this (0..1)"
    )
    target_util: float | None = Field(
        default=None, gt=0, le=1, description="utilization the remaining GPUs may run at (0..1)"
    )
    min_coverage_s: float | None = Field(
        default=None, gt=0, description="seconds of data in the window needed to judge [s]"
    )


class Fleet(_Strict):
    name: Name = Field(pattern=_SLUG)
    role: Literal["training", "inference"]
    members: list[Name] = Field(min_length=1, description="node or rack names")
    underuse: FleetUnderuse | None = Field(
        default=None, description="per-fleet underuse rule (inference fleets)"
    )


class Shard(_Strict):
    """One `dctwin serve --shard NAME`: the halls (or rows of one big hall) it owns, and the
    spanning components (loops, CDUs, PDUs, spine switches, links between shards) it owns."""

    name: Name = Field(pattern=_SLUG)
    halls: list[Name] = Field(default_factory=list, description="halls this shard owns whole")
    rows: list[str] = Field(
        default_factory=list,
        description='"<hall>/<row>" names: rows of a hall split between shards',
    )
    owns: list[Name] = Field(
        default_factory=list,
        description="components that span shards (loop, CDU, PDU, switch, link) it owns",
    )
    api_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="the shard's API (http[s]://host:port), for `dctwin site-view --site`",
    )


class Site(_Strict):
    name: Name = Field(pattern=_SLUG, description="the <site> segment of MQTT topics")
    halls: list[Hall] = Field(min_length=1)
    pdus: list[Pdu] = Field(default_factory=list)
    cdus: list[Cdu] = Field(default_factory=list)
    switches: list[Switch] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)
    fleets: list[Fleet] = Field(default_factory=list)
    shards: list[Shard] = Field(
        default_factory=list,
        description="groups of halls, each one service (absent: one shard 'main' owns all)",
    )

    # ---- derived views -------------------------------------------------------------------

    @cached_property
    def racks(self) -> list[Rack]:
        return [r for h in self.halls for row in h.rows for r in row.racks]

    @cached_property
    def nodes(self) -> list[Node]:
        return [n for r in self.racks for n in r.nodes]

    @cached_property
    def rack_of_node(self) -> dict[str, Rack]:
        return {n.name: r for r in self.racks for n in r.nodes}

    @cached_property
    def pdu_by_name(self) -> dict[str, Pdu]:
        return {p.name: p for p in self.pdus}

    @cached_property
    def cdu_by_name(self) -> dict[str, Cdu]:
        return {c.name: c for c in self.cdus}

    @cached_property
    def fleet_of_node(self) -> dict[str, Fleet]:
        out: dict[str, Fleet] = {}
        racks = {r.name: r for r in self.racks}
        for f in self.fleets:
            for m in f.members:
                names = [n.name for n in racks[m].nodes] if m in racks else [m]
                for n in names:
                    out[n] = f
        return out

    @cached_property
    def known_ids(self) -> dict[str, frozenset[str]]:
        """Every sample id the site knows, per kind."""
        gpu: set[str] = set()
        for n in self.nodes:
            gpu.update(n.gpu_ids())
            gpu.update(n.gpu_uuids or ())
        pdu: set[str] = set()
        for p in self.pdus:
            pdu.update(pdu_sample_ids(p.name, p.phases, (b.name for b in p.breakers)))
        cdu: set[str] = set()
        for c in self.cdus:
            cdu.update(cdu_sample_ids(c.name, c.pumps))
        return {
            "gpu": frozenset(gpu),
            "node": frozenset(n.name for n in self.nodes),
            "pdu": frozenset(pdu),
            "cdu": frozenset(cdu),
            "link": frozenset(link.name for link in self.links),
        }

    def is_known(self, kind: str, sample_id: str) -> bool:
        """True when ``sample_id`` of ``kind`` names something in this site.

        PDU outlets (``<pdu>/outlet<n>``, :func:`collectors.contract.is_outlet_label`) are
        accepted for any PDU the site lists, and the
        line-to-line legs of a delta unit (``<pdu>/L1-L2``, two of its phases) for any PDU with
        more than one phase. A leg is not a phase: the phase tables never list it.
        """
        ids = self.known_ids.get(kind, frozenset())
        if sample_id in ids:
            return True
        if kind == "pdu":
            leg = split_leg_id(sample_id)
            if leg is not None:
                pdu = self.pdu_by_name.get(leg[0])
                return pdu is not None and max(leg[1], leg[2]) <= pdu.phases
            parent, element = split_sub_id(sample_id)
            return is_outlet_label(element or "") and parent in self.pdu_by_name
        return False

    # ---- cross-reference checks ----------------------------------------------------------

    @model_validator(mode="after")
    def _cross_references(self) -> Site:
        """Check names are unique and references resolve; report every problem with its loc.

        Raises a ValidationError with one ``site_reference`` error per problem, each located at
        the offending field (for example ``halls[0].rows[0].racks[6].pdus[1]``).
        """
        problems: list[InitErrorDetails] = []

        def problem(loc: Loc, value: object, message: str) -> None:
            error = PydanticCustomError("site_reference", "{detail}", {"detail": message})
            problems.append(InitErrorDetails(type=error, loc=loc, input=value))

        def unique(kind: str, named: list[tuple[Loc, str]]) -> None:
            first: dict[str, Loc] = {}
            for loc, name in named:
                if name in first:
                    problem(
                        (*loc, "name"),
                        name,
                        f"duplicate {kind} name {name!r} (first at {_dotted(first[name])})",
                    )
                else:
                    first[name] = loc

        racks: list[tuple[Loc, Rack]] = [
            (("halls", h, "rows", w, "racks", k), rack)
            for h, hall in enumerate(self.halls)
            for w, row in enumerate(hall.rows)
            for k, rack in enumerate(row.racks)
        ]
        nodes: list[tuple[Loc, Node]] = [
            ((*loc, "nodes", i), node) for loc, rack in racks for i, node in enumerate(rack.nodes)
        ]

        def listed(field: str, items: list[Any]) -> list[tuple[Loc, str]]:
            return [((field, i), item.name) for i, item in enumerate(items)]

        unique("rack", [(loc, r.name) for loc, r in racks])
        unique("node", [(loc, n.name) for loc, n in nodes])
        unique("pdu", listed("pdus", self.pdus))
        unique("cdu", listed("cdus", self.cdus))
        unique("switch", listed("switches", self.switches))
        unique("link", listed("links", self.links))
        unique("fleet", listed("fleets", self.fleets))
        pdus = {p.name for p in self.pdus}
        cdus = {c.name for c in self.cdus}
        rack_names = {r.name for _, r in racks}
        node_names = {n.name for _, n in nodes}
        endpoints = node_names | {s.name for s in self.switches}
        for loc, r in racks:
            for j, p in enumerate(r.pdus):
                if p not in pdus:
                    problem(
                        (*loc, "pdus", j),
                        p,
                        f"rack {r.name!r} is fed by PDU {p!r}, which does not exist",
                    )
            if r.cdu is not None and r.cdu not in cdus:
                problem(
                    (*loc, "cdu"),
                    r.cdu,
                    f"rack {r.name!r} is served by CDU {r.cdu!r}, which does not exist",
                )
            liquid = [n.name for n in r.nodes if n.spec.cooling == "liquid"]
            if liquid and r.cdu is None:
                problem(
                    loc, r.name, f"rack {r.name!r} holds liquid-cooled nodes {liquid} but no cdu"
                )
        for i, s in enumerate(self.switches):
            if s.rack is not None and s.rack not in rack_names:
                problem(
                    ("switches", i, "rack"),
                    s.rack,
                    f"switch {s.name!r} is in rack {s.rack!r}, which does not exist",
                )
        for i, link in enumerate(self.links):
            for end_field, end in (("a", link.a), ("b", link.b)):
                if end not in endpoints:
                    problem(
                        ("links", i, end_field),
                        end,
                        f"link {link.name!r} endpoint {end!r} is no switch or node",
                    )
        for i, f in enumerate(self.fleets):
            for j, m in enumerate(f.members):
                if m not in node_names and m not in rack_names:
                    problem(
                        ("fleets", i, "members", j),
                        m,
                        f"fleet {f.name!r} member {m!r} is no node or rack",
                    )
        if not problems and self.shards:  # shards are checked on a site whose names resolve
            from twin.site.shards import shard_problems

            for loc, value, message in shard_problems(self):
                problem(loc, value, message)
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    # ---- lookups -------------------------------------------------------------------------

    def capture_fraction(self, rack: Rack) -> float:
        """Share of a rack's heat that goes to liquid: the rack's own value, else the catalog's."""
        if rack.capture_fraction is not None:
            return rack.capture_fraction
        if not rack.nodes:
            return 0.0
        return sum(n.spec.capture_fraction for n in rack.nodes) / len(rack.nodes)
