"""What-if scenarios in YAML: what changes, checked against the site before anything runs.

A scenario file::

    name: plus-4-gb200
    description: four more GB200 NVL72 racks on cdu-4
    changes:
      - {op: add_racks, count: 4, node_model: GB200-NVL72-TRAY, nodes_per_rack: 18,
         cdu: cdu-4, fleet: infer-chat, like_rack: d07}
      - {op: scale_fleet, fleet: infer-chat, factor: 1.2}
      - {op: cap_gpu_power, limit_w: 600, fleet: train-llm}
      - {op: facility_water, delta_k: 3}
      - {op: cdu_setpoint, cdu: cdu-2, supply_setpoint_c: 35}
      - {op: fail_pump, cdu: cdu-2, pump: pump1, at: 10h, for: 30m}
      - {op: fail_cdu, cdu: cdu-2}
      - {op: fail_feed, pdu: pdu-a01-a}
      - {op: fail_link, link: lnk-a01-s1}

``at`` and ``for`` (failures only) are offsets into the recording, as ``600``, ``10m``,
``1.5h``; without them a failure lasts the whole recording. A name that is not in the site
(rack, CDU, pump, PDU, link, fleet, catalog model) is refused with the name and what exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from collectors.base import parse_duration_s
from twin.redact import parse_error_text
from twin.site import Site
from twin.site.catalog import NODE_MODELS


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the change and the name."""


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Timed(_Op):
    at: float = Field(default=0.0, ge=0, description="start, seconds into the recording")
    for_s: float | None = Field(default=None, gt=0, alias="for", description="duration [s]")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("at", "for_s", mode="before")
    @classmethod
    def _duration(cls, v: object) -> object:
        return parse_duration_s(v) if isinstance(v, str) else v


class AddRacks(_Op):
    op: Literal["add_racks"]
    count: int = Field(gt=0, le=1000)
    node_model: str
    nodes_per_rack: int = Field(gt=0, le=72)
    cdu: str | None = Field(default=None, description="CDU whose loop cools them (liquid)")
    fleet: str = Field(description="the fleet whose recorded workload they run")
    like_rack: str = Field(description="their PDUs are like this rack's (rating, wiring)")


class ScaleFleet(_Op):
    op: Literal["scale_fleet"]
    fleet: str
    factor: float = Field(gt=0, le=10, description="multiplier on SM activity, capped at 1")


class CapGpuPower(_Op):
    op: Literal["cap_gpu_power"]
    limit_w: float = Field(gt=0)
    fleet: str | None = None
    racks: list[str] | None = None


class FacilityWater(_Op):
    op: Literal["facility_water"]
    delta_k: float = Field(ge=-20, le=20)
    cdus: list[str] | None = None


class CduSetpoint(_Op):
    op: Literal["cdu_setpoint"]
    cdu: str
    supply_setpoint_c: float = Field(ge=5, le=70)


class FailPump(_Timed):
    op: Literal["fail_pump"]
    cdu: str
    pump: str


class FailCdu(_Timed):
    op: Literal["fail_cdu"]
    cdu: str


class FailFeed(_Timed):
    op: Literal["fail_feed"]
    pdu: str


class FailLink(_Timed):
    op: Literal["fail_link"]
    link: str


Change = Annotated[
    AddRacks
    | ScaleFleet
    | CapGpuPower
    | FacilityWater
    | CduSetpoint
    | FailPump
    | FailCdu
    | FailFeed
    | FailLink,
    Field(discriminator="op"),
]


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
    description: str = ""
    changes: list[Change] = Field(min_length=1)

    def check(self, site: Site, source: str = "<scenario>") -> None:
        """Raise ScenarioError naming every change that refers to something not in ``site``."""
        racks = {r.name for r in site.racks}
        cdus = {c.name: c for c in site.cdus}
        pdus = {p.name for p in site.pdus}
        links = {lk.name for lk in site.links}
        fleets = {f.name for f in site.fleets}
        problems: list[str] = []

        def need(i: int, c: _Op, what: str, name: str, known: set[str] | dict) -> None:
            if name not in known:
                some = ", ".join(sorted(known)[:12]) + (" ..." if len(known) > 12 else "")
                problems.append(
                    f"{source}: changes[{i}] ({c.op}): no {what} {name!r} in site "  # type: ignore[attr-defined]
                    f"{site.name!r}; it has {some}"
                )

        for i, c in enumerate(self.changes):
            if isinstance(c, AddRacks):
                if c.node_model not in NODE_MODELS:
                    need(i, c, "node model", c.node_model, set(NODE_MODELS))
                need(i, c, "fleet", c.fleet, fleets)
                need(i, c, "rack", c.like_rack, racks)
                if c.cdu is not None:
                    need(i, c, "CDU", c.cdu, cdus)
                elif c.node_model in NODE_MODELS and NODE_MODELS[c.node_model].cooling == "liquid":
                    problems.append(
                        f"{source}: changes[{i}] (add_racks): {c.node_model} is liquid-cooled;"
                        " name the cdu that cools the new racks"
                    )
            elif isinstance(c, ScaleFleet):
                need(i, c, "fleet", c.fleet, fleets)
            elif isinstance(c, CapGpuPower):
                if c.fleet is not None:
                    need(i, c, "fleet", c.fleet, fleets)
                for r in c.racks or []:
                    need(i, c, "rack", r, racks)
            elif isinstance(c, FacilityWater):
                for name in c.cdus or []:
                    need(i, c, "CDU", name, cdus)
            elif isinstance(c, CduSetpoint | FailCdu):
                need(i, c, "CDU", c.cdu, cdus)
            elif isinstance(c, FailPump):
                need(i, c, "CDU", c.cdu, cdus)
                if c.cdu in cdus and c.pump not in cdus[c.cdu].pumps:
                    need(i, c, f"pump of {c.cdu}", c.pump, set(cdus[c.cdu].pumps))
            elif isinstance(c, FailFeed):
                need(i, c, "PDU", c.pdu, pdus)
            elif isinstance(c, FailLink):
                need(i, c, "link", c.link, links)
        if problems:
            raise ScenarioError("\n".join(problems))


def load_scenario(path: str | Path, site: Site | None = None) -> Scenario:
    """Read and validate a scenario file (and check its names against ``site`` if given)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{p}: not YAML: {parse_error_text(e)}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{p}: a scenario is a mapping with name and changes")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            lines.append(f"{p}: {loc}: {err['msg']}")
        raise ScenarioError("\n".join(lines)) from None
    except ValueError as e:  # a bad duration in at/for
        raise ScenarioError(f"{p}: {e}") from None
    if site is not None:
        scenario.check(site, str(p))
    return scenario
