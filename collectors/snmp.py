"""SNMP v2c collector for rack PDUs, driven by the data-file profiles in collectors/snmp_profiles.

:class:`SnmpPduCollector` walks the tables of one vendor *profile* (one YAML file per MIB:
Raritan PDU2-MIB, APC PowerNet rPDU2 and the older rPDU load tables, ServerTech Sentry4-MIB and
Sentry3-MIB, Eaton EATON-EPDU-MIB, Vertiv Geist GEIST-V5-MIB / VERTIV-V5-MIB, APC CPDU-MIB
of the cPDU tree; each file names its source and the scaling of every OID) with GETBULK and
returns one ``pdu`` contract message per poll. See :mod:`collectors.snmp_profiles` for the
scaling rule and the fields of a profile. A reading in
a unit the profile does not list is refused with a logged reason, never stored under a wrong
unit; a sensor whose state column says it has no reading (Raritan ``unavailable``, Sentry3
``notFound`` / ``lost``, Eaton probe ``disconnected`` ...) is left out. Each refusal is logged
once per sensor and reason at WARNING, later polls at DEBUG. Config columns (decimal digits,
units, labels, APC module/number) are read on the first poll and cached; value and state
columns are read every poll.

Sample ids follow the contract (collectors/contract.py): ``<pdu>`` for the unit (input cord /
inlet), ``<pdu>/L1..L3`` for lines (poles), ``<pdu>/L1-L2``.. for the line-to-line legs of a
delta unit (Sentry4 ``st4PhaseLabel``, Sentry3 ``infeedPhaseID``, Eaton
``inputVoltageMeasType``, Geist ``pduPhaseName``): line current stays on ``<pdu>/L1``, the
leg's voltage and power go to ``<pdu>/L1-L2``. ``<pdu>/cb<n>`` are branch breakers
(over-current protectors, APC banks,
Sentry4 branches, Eaton breaker groups; Sentry3 ``cb<infeed>-<branch>``; name the breakers so
in the site file), ``<pdu>/outlet<n>`` outlets. The first temperature/humidity probe fills
``<pdu>``'s ``inlet_temp_c`` / ``humidity_pct``, further ones ``<pdu>/sensor<n>`` (Geist:
``<pdu>/thd<n>``, ``<pdu>/temp<n>``, one table per probe type; a quantity the unit's id already
has from an earlier table goes to the probe's own id). A label checked against the unit's wiring
(``leg_when`` / ``line_when`` over a ``scalars`` value such as Geist's ``pduMeterType``) that
names a line on a delta unit, or a leg on a wye unit, is refused with the reason. Labels are
read with the profile's grammars (``Phase A``, ``AA:L1-L2``, ``TowerA_InfeedB``); a label no
grammar accepts is refused with the label quoted, and a row without the label its id needs is
refused and logged once for the row: a table index never stands in for it. A row whose label
names the neutral publishes its current as ``neutral_current_a`` on the unit or cord id, never
on a line. A power factor is published in 0..1 (a signed one as its magnitude where the profile
says so); one outside is refused with the raw value. A second
inlet, input cord or daisy-chained unit gets a prefix: ``<pdu>/inlet2/L1``,
``<pdu>/unit2/cord1/L1``, ``<pdu>/module2/L1``.

pysnmp is asyncio: each collector runs a private event loop inside :meth:`poll`, so the API is
synchronous (call it from a plain thread, not from inside a running event loop). :meth:`close`
closes the SNMP engine's dispatcher *on that loop* and lets its timer task and UDP transport
finish before the loop is closed: closing them outside the loop left a cancelled-but-pending
``AsyncioDispatcher.handle_timeout`` task behind, which asyncio reported at exit as
``Task was destroyed but it is pending!``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from typing import Any

from pysnmp.error import PySnmpError
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    bulk_cmd,
)
from pysnmp.proto.rfc1905 import EndOfMibView, NoSuchInstance, NoSuchObject

from collectors.base import CollectorError, Message, MessageBuilder
from collectors.contract import line_element, value_error
from collectors.snmp_profiles import (
    UNITS,
    Column,
    Label,
    Neutral,
    Profile,
    Table,
    contract_unit,
    resolve,
)

__all__ = ["SnmpPduCollector"]

log = logging.getLogger(__name__)

COLLECTOR = "snmp"

_OID = tuple[int, ...]


def _oid(text: str) -> _OID:
    return tuple(int(x) for x in text.strip(".").split("."))


class _Reject(Exception):
    """A reading that cannot be stored; the message says why."""


class SnmpPduCollector:
    """Polls one PDU's SNMP v2c agent with a vendor profile (see the module docstring).

    ``profile`` is a profile name or alias (:func:`collectors.snmp_profiles.resolve`) or a
    :class:`~collectors.snmp_profiles.Profile`. ``source`` defaults to the
    host with ``.``/``:`` turned into ``-``; pass the site file's PDU name (CLI ``--source
    pdu-r01-a``) so the twin resolves the readings.
    """

    def __init__(
        self,
        host: str,
        *,
        site: str,
        profile: str | Profile,
        community: str,
        port: int = 161,
        source: str | None = None,
        timeout_s: float = 2.0,
        retries: int = 1,
        max_repetitions: int = 25,
    ):
        # units and quantities are checked when the profile is validated (snmp_profiles)
        self.profile = profile if isinstance(profile, Profile) else resolve(profile)
        self.host = host
        self.port = port
        self.site = site
        self.source = source or host.replace(".", "-").replace(":", "-")
        self.name = f"snmp {self.profile.name} {host}:{port}"
        self._community = community
        self._timeout_s = timeout_s
        self._retries = retries
        self._max_rep = max_repetitions
        self._builder = MessageBuilder(site, COLLECTOR)
        self._loop = asyncio.new_event_loop()
        self._engine: SnmpEngine | None = None
        self._target: UdpTransportTarget | None = None
        self._cache: dict[str, dict[_OID, Any]] = {}  # config column -> rows
        self._cache_for: dict[str, set[_OID]] = {}  # config column -> value rows when read
        self._warned: set[tuple[str, str]] = set()

    # ---- SNMP --------------------------------------------------------------------------------

    async def _walk(self, oid: str) -> dict[_OID, Any]:
        """Every row under a column OID (GETBULK until the subtree ends), keyed by index."""
        assert self._engine is not None and self._target is not None
        base = _oid(oid)
        out: dict[_OID, Any] = {}
        cursor = base
        while True:
            err, status, index, vbs = await bulk_cmd(
                self._engine,
                CommunityData(self._community, mpModel=1),
                self._target,
                ContextData(),
                0,
                self._max_rep,
                ObjectType(ObjectIdentity(".".join(map(str, cursor)))),
                lookupMib=False,
            )
            if err:
                raise CollectorError(
                    f"{self.name}: no usable answer to GETBULK {oid} ({err}) within "
                    f"{self._timeout_s} s x {self._retries + 1} tries: agent down or "
                    "unreachable, or wrong community (a v2c agent ignores a wrong community)"
                )
            if status:
                raise CollectorError(
                    f"{self.name}: agent error {status} at index {index} for GETBULK {oid}"
                )
            if not vbs:
                return out
            for name, value in vbs:
                t = tuple(name)
                if (
                    t[: len(base)] != base
                    or t <= cursor
                    or isinstance(value, EndOfMibView | NoSuchObject | NoSuchInstance)
                ):
                    return out
                out[t[len(base) :]] = value
                cursor = t

    async def _poll(self) -> dict[str, dict[_OID, Any]]:
        if self._engine is None:
            self._engine = SnmpEngine()
            self._target = await UdpTransportTarget.create(
                (self.host, self.port), timeout=self._timeout_s, retries=self._retries
            )
        values: dict[str, dict[_OID, Any]] = {}
        for table in self.profile.tables:
            for col in table.columns:
                for oid in (col.oid, col.state):  # values and sensor states: every poll
                    if oid and oid not in values:
                        values[oid] = await self._walk(oid)
        # config columns: read for the rows seen, once; again when a row is new to them
        for table in self.profile.tables:
            rows = {i for c in table.columns for i in values[c.oid]}
            config = [*table.keys.values()]
            for lab in table.labels.values():
                config += [lab.oid, *lab.alternates]
            for col in table.columns:
                config += [o for o in (col.decimals, col.units) if o]
            for oid in table.scalars.values():  # one instance: its column, read once
                column = oid.rsplit(".", 1)[0]
                if column not in self._cache:
                    self._cache[column] = await self._walk(column)
                    self._cache_for[column] = set()
            for oid in config:
                scalar = oid.endswith(".0")
                key = oid.removesuffix(".0")
                if key not in self._cache or (not scalar and rows - self._cache_for[key]):
                    self._cache[key] = await self._walk(key)
                    self._cache_for[key] = self._cache_for.get(key, set()) | rows
        return values

    def poll(self) -> list[Message]:
        """One ``pdu`` message with every reading of the profile the agent answered."""
        try:
            values = self._loop.run_until_complete(self._poll())
        except (PySnmpError, OSError) as e:  # e.g. a host name that does not resolve
            raise CollectorError(f"{self.name}: {type(e).__name__}: {e}") from e
        if not any(values.values()):
            raise CollectorError(
                f"{self.name}: the agent answered but has none of the {self.profile.name} "
                "objects: wrong profile for this PDU?"
            )
        samples: dict[str, dict[str, Any]] = {}
        for table in self.profile.tables:
            self._table(table, values, samples)
        rows = [s for s in samples.values() if len(s) > 1]
        if not rows:
            raise CollectorError(f"{self.name}: no reading could be stored (see the log)")
        return [self._builder.message("pdu", self.source, rows)]

    async def _aclose(self) -> None:
        engine, self._engine, self._target = self._engine, None, None
        if engine is not None:
            engine.close_dispatcher()  # cancels the dispatcher's timer task, closes the socket
        # let the cancellations and the transport's connection_lost run on this loop
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.sleep(0)

    def close(self) -> None:
        """Release the SNMP engine's socket and the private event loop (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self._aclose())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    # ---- mapping -----------------------------------------------------------------------------

    def _refuse(self, what: str, reason: str) -> None:
        key = (what, reason)
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, "%s: %s skipped: %s", self.name, what, reason)

    def _table(
        self, table: Table, values: dict[str, dict[_OID, Any]], samples: dict[str, dict[str, Any]]
    ) -> None:
        firsts: set[str] = set()
        rows = sorted({i for c in table.columns for i in values[c.oid]})
        for index in rows:
            if len(index) != len(table.index):
                log.debug(
                    "%s: %s row %s does not match index %s",
                    self.name,
                    table.name,
                    index,
                    table.index,
                )
                continue
            fields: dict[str, Any] = dict(zip(table.index, index, strict=True))
            for name, oid in table.keys.items():
                raw = self._cache.get(oid, {}).get(index)
                if raw is not None:
                    fields[name] = _int(raw, raw)
            for name, oid in table.scalars.items():
                column, row = oid.rsplit(".", 1)
                raw = self._cache.get(column, {}).get((int(row),))
                if raw is not None:
                    fields[name] = _int(raw, raw)
            unlabelled = self._labels(table, index, fields)
            chain = "".join(
                f"/{p}{fields[p]}"
                for p in table.chain
                if fields.get(p, 1) != table.chain_origin.get(p, 1)
            )
            for col in table.columns:
                raw = values[col.oid].get(index)
                if raw is None or not _selected(col, fields):
                    continue
                what = f"{col.mib}.{'.'.join(map(str, index))}"
                try:
                    self._check_state(col, index, values)
                    value = self._convert(col, index, raw)
                except _Reject as e:
                    self._refuse(what, str(e))
                    continue
                if value is None:
                    continue
                pattern = col.sample or table.sample
                quantity = col.quantity
                neutral = _neutral_of(table, pattern, fields)
                if neutral is not None:
                    label, rule = neutral
                    if col.quantity not in rule.quantities:
                        self._refuse(what, f"{label} names the neutral: it has no {col.quantity}")
                        continue
                    quantity, pattern = rule.quantities[col.quantity], rule.sample
                elif table.first and col.quantity not in firsts:
                    firsts.add(col.quantity)
                    # the unit's own id, unless an earlier table's probe already filled it
                    # there (Geist THD and temperature-only probes): then the row's own id
                    try:
                        head = table.first.format(src=self.source, chain=chain, **fields)
                    except KeyError:
                        head = None  # refused below, with the reason
                    if head is None or col.quantity not in samples.get(head, {}):
                        pattern = table.first
                try:
                    sid = pattern.format(src=self.source, chain=chain, **fields)
                except KeyError as e:
                    reason = unlabelled.get(str(e.args[0]), f"no value for {e}")
                    # one row, one reason: logged once for the row, not once per column
                    row = f"{table.name} row {'.'.join(map(str, index))}"
                    self._refuse(row, f"sample pattern {pattern!r}: {reason}")
                    continue
                if col.magnitude:
                    value = abs(value)
                if quantity == "power_factor" and not 0.0 <= value <= 1.0:
                    self._refuse(what, f"power factor {value} (raw {raw}) is outside 0..1")
                    continue
                err = value_error("pdu", quantity, value)  # the contract's value rule
                if err is not None:
                    self._refuse(what, f"{err.reason}: {err.detail}")
                    continue
                samples.setdefault(sid, {"id": sid}).setdefault(quantity, value)

    def _labels(self, table: Table, index: _OID, fields: dict[str, Any]) -> dict[str, str]:
        """Fill ``fields`` with each label's contract element (``L1``, ``L1-L2``, ``N``); the
        reasons for labels that name none (logged only when a column's id needs them)."""
        why: dict[str, str] = {}
        for name, lab in table.labels.items():
            text, oid = None, lab.oid
            key = tuple(fields[p] for p in lab.index) if lab.index else index
            for oid in (lab.oid, *lab.alternates):
                raw = self._cache.get(oid, {}).get(key)
                if raw is not None and lab.map:
                    text = lab.map.get(_int(raw, None), "")
                else:
                    text = _text(raw)
                if text:
                    break
            if not text:
                where = ", ".join((lab.oid, *lab.alternates))
                why[name] = f"no label at {where} for this row (its index is not an id)"
                continue
            element = self._element(lab, text)
            wrong = _wiring_mismatch(lab, element, fields)
            if wrong:
                why[name] = f"label {text!r} at {oid} names {wrong}"
            elif element == "N" and lab.neutral is None:
                why[name] = f"label {text!r} at {oid} names the neutral, not a line or leg"
            elif element is not None:
                fields[name] = element
            else:
                why[name] = f"label {text!r} at {oid} names no line or leg"
        return why

    def _element(self, lab: Label, text: str) -> str | None:
        """The element a label's text names under its grammars (none: the contract's, and
        ``N`` the neutral)."""
        if not lab.accept:
            return "N" if text.strip().upper() == "N" else line_element(text)
        for g in lab.accept:
            element = self.profile.grammars[g].element(text)
            if element is not None:
                return element
        return None

    def _check_state(self, col: Column, index: _OID, values: dict[str, dict[_OID, Any]]) -> None:
        """_Reject when the row's sensor state says there is no reading."""
        if col.state is None:
            return
        state = _int(values.get(col.state, {}).get(index), None)
        if state is not None and state in col.unavailable:
            raise _Reject(f"sensor state {state} at {col.state} means no reading")

    def _convert(self, col: Column, index: _OID, raw: Any) -> float | None:
        """raw -> contract units, or None for a 'no reading' value; _Reject when unsure."""
        n = _int(raw, None)
        if n is None:
            raise _Reject(f"value {raw!r} is not an integer")
        if n in col.invalid:
            return None
        value = float(n) * col.scale
        if col.decimals:
            d = _int(self._cache.get(col.decimals, {}).get(index), None)
            if d is None or not 0 <= d <= 9:
                raise _Reject(f"no decimal digits at {col.decimals} for this row")
            value /= 10**d
        unit = col.unit
        if col.units:
            scalar = col.units.endswith(".0")
            rows = self._cache.get(col.units.removesuffix(".0"), {})
            u = _int(rows.get((0,) if scalar else index), None)
            if u is None:
                log.debug(
                    "%s: %s has no unit at %s; taking the MIB's %s",
                    self.name,
                    col.mib,
                    col.units,
                    unit,
                )
            elif u not in col.units_map:
                raise _Reject(f"unit code {u} at {col.units} is not one of {col.units_map}")
            else:
                unit = col.units_map[u]
        target, factor, offset = UNITS[unit]
        if target != contract_unit(col.quantity):
            raise _Reject(f"unit {unit} does not convert to {contract_unit(col.quantity)}")
        # 9 decimals: far below any PDU's resolution, and 95 x 0.01 reads 0.95, not ...0001
        value = round(value * factor + offset, 9)
        return value if math.isfinite(value) else None


def _wiring_mismatch(lab: Label, element: str | None, fields: dict[str, Any]) -> str | None:
    """Why a line/leg label contradicts the unit's wiring (``leg_when`` / ``line_when``: e.g.
    a delta unit's phase named as a line), or None when it does not."""
    if element is None or element == "N":
        return None
    is_leg = "-" in element
    for want_leg, rule in ((True, lab.leg_when), (False, lab.line_when)):
        hit = next(((k, fields[k]) for k, v in rule.items() if fields.get(k) in v), None)
        if hit is not None and is_leg != want_leg:
            have, want = ("a leg", "a line") if is_leg else ("a line", "a leg")
            return f"{have} ({element}) where {hit[0]} = {hit[1]} calls for {want}"
    return None


def _neutral_of(table: Table, pattern: str, fields: dict[str, Any]) -> tuple[str, Neutral] | None:
    """(label, rule) when a label the id pattern uses names the neutral on this row."""
    for name in re.findall(r"{([^{}]*)}", pattern):
        lab = table.labels.get(name)
        if lab is not None and lab.neutral is not None and fields.get(name) == "N":
            return name, lab.neutral
    return None


def _selected(col: Column, fields: dict[str, Any]) -> bool:
    """The row has the values ``when`` asks for and none that ``unless`` excludes (a row
    without a key either names cannot be told apart: not selected)."""
    if any(fields.get(k) not in v for k, v in col.when.items()):
        return False
    return not any(fields.get(k) is None or fields[k] in v for k, v in col.unless.items())


def _text(value: Any) -> str | None:
    """A DisplayString as text; None when absent."""
    if value is None:
        return None
    octets = getattr(value, "asOctets", None)
    if octets is not None:
        return octets().decode("ascii", "replace").strip()
    return str(value).strip()


def _int(value: Any, default: Any) -> Any:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
