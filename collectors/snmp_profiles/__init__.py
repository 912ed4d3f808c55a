"""SNMP PDU profiles: one YAML file per vendor MIB, validated by pydantic on load.

A profile (``<name>.yaml`` in this folder, shipped in the wheel) names its source (the MIB, its
revision, where the MIB text is published and what of it was verified) and lists the tables the
collector walks. Each column names its MIB object, OID, contract quantity and scaling::

    value = raw / 10**decimals * scale, in ``unit``, then converted to the contract's unit

so the scaling of every value is explicit and reviewable in the data file. ``decimals`` is read
from the agent where the MIB says so (Raritan ``...SensorDecimalDigits``); where the agent states
the unit (``units``) it is checked against ``units_map``; where it states a sensor state
(``state``) a state listed in ``unavailable`` leaves the value out. ``labels`` read a
DisplayString column that names a line, a line-to-line leg or the neutral and turn it into the
contract's element (``L1`` or ``L1-L2``), so that a delta unit's leg readings never land on a
line id. How a vendor writes such a label is data: the profile's ``grammars`` (regular
expressions whose groups ``a``/``b``/``neutral`` say what the label names: ``Phase A``,
``AA:L1-L2``, ``TowerA_Neutral``; see :class:`Grammar`), named in the label's ``accept`` (none:
the contract's ``L1`` / ``L1-N`` / ``L1-L2``, :func:`collectors.contract.line_element`);
``alternates`` are further columns read when the first has no text for the row. A label may
not share a name with an index part, so a row without its label is refused, never published
under its row number. A label's ``neutral`` says where a neutral row goes (the unit or cord,
``current_a`` as ``neutral_current_a``). ``scalars`` read one instance of another table for
every row (Geist ``pduMeterType``), and a label's ``leg_when`` / ``line_when`` refuse a label
that contradicts that wiring (a line on a delta unit). A column's ``magnitude`` publishes a
signed power factor's magnitude (Eaton); a power factor outside 0..1 is refused.

This module needs only pydantic and PyYAML (not pysnmp): the CLI lists the profiles from it.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from collectors.contract import unit_of

__all__ = [
    "PROFILE_DIR",
    "UNITS",
    "Column",
    "Grammar",
    "Label",
    "Neutral",
    "Profile",
    "ProfileError",
    "Source",
    "Table",
    "contract_unit",
    "load_profile",
    "profile_names",
    "profiles",
    "resolve",
]

#: Where the shipped profiles live.
PROFILE_DIR = Path(__file__).parent

#: Unit after scaling -> (contract unit, factor, offset).
UNITS: dict[str, tuple[str, float, float]] = {
    "A": ("A", 1.0, 0.0),
    "mA": ("A", 1e-3, 0.0),
    "V": ("V", 1.0, 0.0),
    "mV": ("V", 1e-3, 0.0),
    "W": ("W", 1.0, 0.0),
    "kW": ("W", 1e3, 0.0),
    "VA": ("VA", 1.0, 0.0),
    "kVA": ("VA", 1e3, 0.0),
    "kWh": ("kWh", 1.0, 0.0),
    "Wh": ("kWh", 1e-3, 0.0),
    "Hz": ("Hz", 1.0, 0.0),
    "1": ("1", 1.0, 0.0),
    "Cel": ("°C", 1.0, 0.0),
    "degF": ("°C", 5.0 / 9.0, -32.0 * 5.0 / 9.0),  # (F - 32) * 5/9
    "%": ("%", 1.0, 0.0),
}

_OID = re.compile(r"[0-9]+(?:\.[0-9]+)+")


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the field."""


def contract_unit(quantity: str) -> str:
    """The unit a quantity is stored in: the contract's, or the one its name ends with."""
    if quantity.startswith("power_factor"):
        return "1"
    unit = unit_of(quantity, "pdu")
    if unit is None:
        raise ValueError(f"quantity {quantity!r} names no unit")
    return unit


def _check_oid(value: str | None) -> str | None:
    if value is not None and not _OID.fullmatch(value):
        raise ValueError(f"{value!r} is not a numeric OID (e.g. 1.3.6.1.4.1.318.1.1.26.6.3.1.5)")
    return value


class Column(BaseModel):
    """One MIB column (or one sensor type of a Raritan measurements column)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mib: str = Field(description="MIB object, e.g. 'rPDU2PhaseStatusCurrent'")
    oid: str = Field(description="column OID; a row is <oid>.<index>")
    quantity: str
    scale: float = 1.0
    unit: str = Field(description="unit of raw * scale / 10**decimals; a key of UNITS")
    decimals: str | None = Field(None, description="OID of a decimal-digits column, same index")
    units: str | None = Field(
        None, description="OID of a units column (same index) or scalar (ends in .0)"
    )
    units_map: dict[int, str] = Field(
        default_factory=dict, description="agent's units enum -> a key of UNITS; others refused"
    )
    state: str | None = Field(None, description="OID of a sensor-state column, same index")
    unavailable: tuple[int, ...] = Field(
        (), description="state values meaning 'no reading': the value is left out"
    )
    when: dict[str, tuple[int, ...]] = Field(
        default_factory=dict, description="index part or key -> values the row must have"
    )
    unless: dict[str, tuple[int, ...]] = Field(
        default_factory=dict, description="index part or key -> values the row must not have"
    )
    sample: str | None = Field(None, description="sample-id pattern overriding the table's")
    invalid: tuple[int, ...] = Field((-1,), description="raw values meaning 'no reading'")
    magnitude: bool = Field(
        False,
        description="publish the value's magnitude: a power factor whose sign says leading or "
        "lagging (Eaton); a magnitude beyond 0..1 is still refused with the raw value",
    )

    _oids = field_validator("oid", "decimals", "units", "state")(_check_oid)

    @model_validator(mode="after")
    def _units_known(self) -> Column:
        for u in (self.unit, *self.units_map.values()):
            if u not in UNITS:
                raise ValueError(f"unit {u!r} is not one of {list(UNITS)}")
        want = contract_unit(self.quantity)
        for u in (self.unit, *self.units_map.values()):
            if UNITS[u][0] != want:
                raise ValueError(f"unit {u!r} does not convert to {self.quantity}'s {want}")
        if self.unavailable and self.state is None:
            raise ValueError("'unavailable' needs 'state' (the OID of the state column)")
        return self


class Grammar(BaseModel):
    """How a vendor writes a line, leg or neutral label, as a regular expression.

    ``match`` must match the whole label (surrounding blanks are stripped first; case is ignored
    unless ``ignore_case`` is false). Its named groups say what the label names: ``a`` a line
    (``1``..``9`` or a letter of ``letters``), ``b`` the second end (``N``: a wye phase, line to
    neutral, so the line ``a``; another line: the leg ``L<a>-L<b>``), ``neutral`` (matched at
    all) the neutral conductor. Anything else in the pattern (a tower or cord prefix such as
    ``AA:`` or ``TowerA_``) is read over and ignored.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    match: str
    letters: dict[str, int] = Field(
        default_factory=dict, description="a line written as a letter -> its number (A -> 1)"
    )
    ignore_case: bool = True

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            groups = re.compile(value).groupindex
        except re.error as e:
            raise ValueError(f"{value!r} is not a regular expression: {e}") from None
        if not {"a", "neutral"} & set(groups):
            raise ValueError(f"{value!r} has neither a group 'a' (a line) nor 'neutral'")
        return value

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.match, re.IGNORECASE if self.ignore_case else 0)

    def element(self, label: str) -> str | None:
        """The contract element the label names (``L1``, ``L1-L2``, ``N`` for the neutral);
        None when this grammar does not accept it."""
        m = self.pattern.fullmatch(label.strip())
        if m is None:
            return None
        groups = m.groupdict()
        if groups.get("neutral") is not None:
            return "N"
        a = self._line(groups.get("a"))
        if a is None:
            return None
        other = groups.get("b")
        if other is None or other.upper() == "N":
            return f"L{a}"
        b = self._line(other.upper().removeprefix("L") if other[:1] in "Ll" else other)
        return None if b is None or a == b else f"L{a}-L{b}"

    def _line(self, text: str | None) -> int | None:
        if text is None:
            return None
        if text.isdigit():
            return int(text) if int(text) >= 1 else None
        return next((n for k, n in self.letters.items() if k.upper() == text.upper()), None)


class Neutral(BaseModel):
    """Where a row whose label names the neutral goes: never to a line id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sample: str = Field(description="pattern of the id that carries the neutral (unit or cord)")
    quantities: dict[str, str] = Field(
        description="column quantity -> the neutral's quantity (current_a -> neutral_current_a); "
        "other columns of a neutral row are refused"
    )


class Label(BaseModel):
    """A column naming a line (``L1``, ``L1-N``, ``Phase A``), a leg (``L1-L2``) or the neutral.

    The text is read with the profile's ``grammars`` named in ``accept`` (in order; none named:
    the contract's own ``L1`` / ``L1-N`` / ``L1-L2``). ``alternates`` are further columns of the
    same row read the same way when ``oid`` has no text for the row (absent or empty). A row
    whose label names nothing is refused when a column's id needs the label, with the label
    quoted: the row's index never stands in for it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    oid: str
    map: dict[int, str] = Field(
        default_factory=dict,
        description="an integer enumeration column: value -> label (e.g. Eaton phase1to2 -> L1-L2)",
    )
    accept: tuple[str, ...] = Field(
        (), description="names of the profile's grammars the text is read with, in order"
    )
    alternates: tuple[str, ...] = Field(
        (), description="OIDs of further label columns of the row, read when oid has no text"
    )
    index: tuple[str, ...] = Field(
        (),
        description="the index parts that key the label's column when its table has fewer "
        "than the row's (Raritan inletPoleLine: pdu, inlet, pole); none: the row's index",
    )
    neutral: Neutral | None = Field(None, description="where a neutral row's readings go")
    leg_when: dict[str, tuple[int, ...]] = Field(
        default_factory=dict,
        description="key or scalar -> values for which the label must name a leg (delta unit)",
    )
    line_when: dict[str, tuple[int, ...]] = Field(
        default_factory=dict,
        description="key or scalar -> values for which the label must name a line (wye unit)",
    )

    @field_validator("oid")
    @classmethod
    def _oid_ok(cls, value: str) -> str:
        return _check_oid(value) or value

    @field_validator("alternates")
    @classmethod
    def _alternate_oids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for oid in value:
            _check_oid(oid)
        return value


class Table(BaseModel):
    """One conceptual table: how its index reads and where its rows land."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    index: tuple[str, ...] = Field(description="names of the index parts, in order")
    keys: dict[str, str] = Field(
        default_factory=dict, description="name -> OID of an integer column of the row (cached)"
    )
    labels: dict[str, Label] = Field(
        default_factory=dict, description="name -> line/leg label column of the row (cached)"
    )
    scalars: dict[str, str] = Field(
        default_factory=dict,
        description="name -> OID of one instance (<column>.<row>, e.g. the unit's wiring type "
        "in another table) read as an integer for every row (cached)",
    )
    sample: str = Field(description="pattern: {src}, {chain}, index parts, keys and labels")
    chain: tuple[str, ...] = Field(
        (), description="parts that prefix the id as /<name><value> when not their origin"
    )
    chain_origin: dict[str, int] = Field(
        default_factory=dict, description="chain part -> the value that adds no prefix (1)"
    )
    first: str | None = Field(None, description="pattern for the first row of each quantity")
    columns: tuple[Column, ...] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """``defaults:`` (a partial column) is merged under every column of the table."""
        if isinstance(data, dict) and "defaults" in data:
            data = dict(data)
            defaults = data.pop("defaults") or {}
            if not isinstance(defaults, dict):
                raise ValueError("'defaults' must be a mapping of column fields")
            cols = data.get("columns")
            if isinstance(cols, list):
                data["columns"] = [{**defaults, **c} if isinstance(c, dict) else c for c in cols]
        return data

    @field_validator("scalars")
    @classmethod
    def _scalar_oids(cls, value: dict[str, str]) -> dict[str, str]:
        for oid in value.values():
            _check_oid(oid)
        return value

    @model_validator(mode="after")
    def _names_known(self) -> Table:
        names = {"src", "chain", *self.index, *self.keys, *self.labels, *self.scalars}
        for label in self.labels:
            if label in {*self.index, *self.keys, *self.scalars}:
                raise ValueError(
                    f"label {label!r} has the name of an index part, key or scalar: a row "
                    "without the label would take that number as its id"
                )
        for label, lab in self.labels.items():
            if not set(lab.index) <= set(self.index):
                raise ValueError(f"label {label!r} index {lab.index} is not made of {self.index}")
            for k in (*lab.leg_when, *lab.line_when):
                if k not in {*self.index, *self.keys, *self.scalars}:
                    raise ValueError(
                        f"label {label!r} tests {k!r}: not an index part, key or scalar"
                    )
        neutrals = [lab.neutral.sample for lab in self.labels.values() if lab.neutral]
        for pattern in (self.sample, self.first, *(c.sample for c in self.columns), *neutrals):
            if pattern is None:
                continue
            for field in re.findall(r"{([^{}]*)}", pattern):
                if field not in names:
                    raise ValueError(
                        f"sample pattern {pattern!r} names {{{field}}}: not one of {sorted(names)}"
                    )
        return self


class Source(BaseModel):
    """Where a profile's OIDs and scales come from, and how far they were checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mib: str = Field(description="MIB module name, e.g. 'Sentry3-MIB'")
    revision: str = Field(description="the MIB's LAST-UPDATED / REVISION the profile was read from")
    published: str = Field(description="where the MIB text is published")
    verified: str = Field(description="what was checked in the MIB text, and what was not")


class Profile(BaseModel):
    """A vendor MIB: the tables to walk."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    aliases: tuple[str, ...] = ()
    description: str
    source: Source
    grammars: dict[str, Grammar] = Field(
        default_factory=dict, description="name -> how this vendor writes line/leg labels"
    )
    tables: tuple[Table, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _grammars_known(self) -> Profile:
        for table in self.tables:
            for name, lab in table.labels.items():
                for g in lab.accept:
                    if g not in self.grammars:
                        raise ValueError(
                            f"table {table.name!r} label {name!r} accepts grammar {g!r}: not "
                            f"one of the profile's grammars {sorted(self.grammars)}"
                        )
        return self


def _loc(loc: tuple[Any, ...], data: Any) -> str:
    """``tables[1] (rPDU2PhaseStatusTable).columns[0] (rPDU2PhaseStatusCurrent).unit``."""
    out: list[str] = []
    node = data
    for part in loc:
        if isinstance(part, int):
            out[-1:] = [f"{out[-1] if out else ''}[{part}]"]
            node = node[part] if isinstance(node, list) and part < len(node) else None
            name = (
                (node or {}).get("name") or (node or {}).get("mib")
                if isinstance(node, dict)
                else None
            )
            if name:
                out[-1] += f" ({name})"
        else:
            out.append(str(part))
            node = node.get(part) if isinstance(node, dict) else None
    return ".".join(out) or "(top level)"


def load_profile(path: Path) -> Profile:
    """Read and validate one profile file; :class:`ProfileError` names the file and field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"{path}:{where} not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping (name, description, source, tables)")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ProfileError(
            f"{path}: {_loc(tuple(first['loc']), data)}: {first['msg']}{more}"
        ) from None
    if profile.name != path.stem:
        raise ProfileError(f"{path}: name {profile.name!r} must be the file name {path.stem!r}")
    return profile


def profile_names(directory: Path = PROFILE_DIR) -> list[str]:
    """The profile names shipped in ``directory`` (file names; nothing is parsed)."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


@functools.cache
def profiles(directory: Path = PROFILE_DIR) -> dict[str, Profile]:
    """Every profile in ``directory`` by name (validated; cached)."""
    out = {p.stem: load_profile(p) for p in sorted(directory.glob("*.yaml"))}
    seen: dict[str, str] = {}
    for p in out.values():
        for a in p.aliases:
            if a in out or a in seen:
                raise ProfileError(
                    f"{directory / (p.name + '.yaml')}: alias {a!r} is already taken by "
                    f"{seen.get(a, a)!r}"
                )
            seen[a] = p.name
    return out


def resolve(name: str, directory: Path = PROFILE_DIR) -> Profile:
    """The profile called ``name`` or aliased so; ValueError listing the names otherwise."""
    known = profiles(directory)
    if name in known:
        return known[name]
    for p in known.values():
        if name in p.aliases:
            return p
    raise ValueError(f"unknown SNMP profile {name!r}; known: {', '.join(known)}")
