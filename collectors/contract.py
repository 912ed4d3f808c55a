"""The dctwin wire contract, version 1: what a collector publishes and what the twin accepts.

Every side imports this module (collectors build messages with it, the ingest validates with
it), so the collector that writes a quantity and the ingest that reads it cannot disagree.

Topic
    ``dctwin/v1/<site>/<kind>/<source>``; ``kind`` is one of :data:`KINDS`; ``source`` is the
    publishing host or device. QoS 1.

Payload (JSON, UTF-8)::

    {"v": 1, "collector": "nvml", "source": "gpu-node-017", "seq": 42,
     "ts": "2026-11-29T14:00:00.250Z",
     "samples": [{"id": "GPU-…", "power_w": 612.5, "temp_c": 61.0, "util_pct": 97}]}

- ``ts`` is RFC 3339 with an offset (``Z`` or ``+00:00``) or a number of Unix seconds; it is
  stored as UTC. A sample may carry its own ``ts``; otherwise it takes the message's.
- ``seq`` increases by one per message of a (kind, source) stream, so that gaps and duplicates
  are visible; a repeated (kind, source, seq, ts) is a duplicate and is stored once.
- A sample is an ``id`` plus named quantities; each name carries its unit (:data:`QUANTITIES`).
  Names the contract does not know are kept (they must still be finite numbers).
- Sample ids (the grammar is the "sample ids" section below): a PDU ``<pdu>``, its lines
  ``<pdu>/L1``.., breakers and outlets; a delta unit's line-to-line legs ``<pdu>/L1-L2``..
  (line current stays on ``<pdu>/L1``; the leg's voltage and power go on the leg id).

Validation (every rule has a dead-letter reason in :data:`DEAD_LETTER_REASONS`): ``v`` is exactly
the integer 1; ``seq`` and integer quantities are JSON integers within int64; floats are finite
and within their unit's bound (:data:`UNIT_BOUNDS`; quantities the contract does not name:
:data:`EXTRA_BOUND`); a timestamp is strict RFC 3339 (``2026-11-29T14:00:00.25Z``, ``T``/``Z`` in
either case, offset ``±hh:mm``) or Unix seconds, between :data:`TS_MIN` and :data:`TS_MAX`; no
object repeats a key; the topic's site is the receiving service's site. Bounds, checked before
anything recursive or expensive runs and the same on every path: nesting at most
:data:`MAX_DEPTH` (``too_deep``, on the raw bytes), at most :data:`MAX_SAMPLES` samples
(``too_many_samples``), :data:`MAX_SAMPLE_KEYS` keys a sample (``too_many_quantities``) and
:data:`MAX_EXTRA_VALUES` values of names outside the kind's columns a message
(``too_many_extras``); ``source`` and ids of at most 256 characters, ``collector`` 64
(``wrong_type``, the topic's source included). :func:`decode` checks one
message (pydantic, and names the reason); the twin's ingest checks whole batches column-wise
(:class:`twin.ingest.batch_decode.BatchDecoder`) and replay's columns
(:mod:`twin.ingest.columns`) by the same rules, taken from here (the value rules:
:func:`value_breaks`), and accepts exactly what :func:`decode` accepts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)
from pydantic_core import from_json

CONTRACT_VERSION = 1
TOPIC_PREFIX = f"dctwin/v{CONTRACT_VERSION}"
KINDS: tuple[str, ...] = ("gpu", "node", "pdu", "cdu", "link")
#: Largest payload the ingest accepts; a real poll of a 72-GPU rack is ~10 KiB.
MAX_PAYLOAD_BYTES = 1 << 20
#: Largest value of an integer field (``seq``, counters, bitmasks): the store's BIGINT (int64).
INT64_MAX = (1 << 63) - 1
#: Timestamps the contract accepts, whatever the ingest's own window: from the Unix epoch to
#: before 2262-01-01, the last full year that pandas' datetime64[ns] (used by the analysis
#: code downstream of the store) can hold.
TS_MIN = datetime(1970, 1, 1, tzinfo=UTC)
TS_MAX = datetime(2262, 1, 1, tzinfo=UTC)
#: Largest magnitude of a quantity the contract does not name.
EXTRA_BOUND = 1e15
#: Longest name of a quantity the contract does not name.
MAX_EXTRA_NAME = 128
#: Longest ``source`` (header) and sample ``id`` [characters]; longer is ``wrong_type``.
MAX_SOURCE_CHARS = 256
MAX_ID_CHARS = 256
#: Longest ``collector`` name [characters]; longer is ``wrong_type``.
MAX_COLLECTOR_CHARS = 64
#: Deepest nesting of arrays and objects in a payload (the contract's own messages nest 3
#: deep: message, samples, sample). Checked on the raw bytes before anything parses them;
#: deeper is ``too_deep``. Far below orjson's re-encoding limit (254) and Python's recursion
#: limit (1000), which a deeper payload would otherwise hit.
MAX_DEPTH = 32
#: Most samples in one message (``too_many_samples``): a 72-GPU rack's poll is 72 samples, a
#: 48-outlet PDU's about 60; a 1 MiB message of bare ids would otherwise be 90,000 rows.
MAX_SAMPLES = 4096
#: Most keys in one sample, id and ts included (``too_many_quantities``): the widest kind
#: names 14 quantities.
MAX_SAMPLE_KEYS = 64
#: Most values of quantities the contract does not name in one message (``too_many_extras``):
#: each becomes a row of ``extra_readings``.
MAX_EXTRA_VALUES = 1024


# ---- value rules ------------------------------------------------------------------------------
#
# What a value of a quantity may be is defined here once: finite, at least 0 where the quantity
# cannot be negative, within lower..bound of its Quantity (UNIT_BOUNDS per unit, int64 for
# integers, EXTRA_BOUND for a name the contract does not know). The message models below take
# their constraints from it, and the twin's batch decoder and table path
# (twin/ingest/batch_decode.py, twin/ingest/columns.py) test values with value_breaks(), so
# every path refuses the same values for the same reason (tests/test_value_rules.py).


@dataclass(frozen=True, slots=True)
class Quantity:
    """One quantity of the contract and the rule its values keep (:func:`value_breaks`)."""

    unit: str
    description: str
    integer: bool = False
    nonnegative: bool = False
    #: Largest magnitude accepted when it is not the unit's (:data:`UNIT_BOUNDS`) [unit].
    limit: float | None = None

    @property
    def bound(self) -> float:
        """Largest value accepted [unit]; integers: int64's largest."""
        if self.integer:
            return INT64_MAX
        return self.limit if self.limit is not None else UNIT_BOUNDS[self.unit]

    @property
    def lower(self) -> float:
        """Smallest value accepted [unit]: 0 when it cannot be negative; integers: int64's
        smallest; temperatures: absolute zero."""
        if self.nonnegative:
            return 0 if self.integer else 0.0
        if self.integer:
            return -INT64_MAX - 1
        return ABSOLUTE_ZERO_C if self.unit == "°C" else -self.bound


def value_breaks(q: Quantity, value: Any) -> tuple[Any, Any, Any]:
    """Which parts of ``q``'s rule ``value`` breaks: (non-finite, negative where ``q`` cannot
    be, outside ``q.lower..q.bound``). ``value`` is one number (each answer a bool) or a numpy
    array (each a bool array: the same comparisons, element-wise; callers that read a null as
    NaN mask it out). A negative value of a quantity that cannot be negative is also outside
    its range; :func:`value_reason` names the first part broken."""
    non_finite = (value != value) | (value == math.inf) | (value == -math.inf)
    below = value < q.lower
    negative = below & (value < 0) if q.nonnegative else below & False
    return non_finite, negative, below | (value > q.bound)


def value_reason(q: Quantity, value: float) -> str | None:
    """The dead-letter reason a number breaks ``q``'s rule with (``non_finite``,
    ``negative_value``, ``out_of_range``), None when it keeps it."""
    non_finite, negative, out_of_range = value_breaks(q, value)
    if non_finite:
        return "non_finite"
    if negative:
        return "negative_value"
    return "out_of_range" if out_of_range else None


#: Largest magnitude of a float quantity per unit: far beyond any real device (so a real
#: reading is never refused), far below what turns a sum or mean of readings into infinity.
#: Temperatures are also above absolute zero.
UNIT_BOUNDS: dict[str, float] = {
    "W": 1e9,  # a 1 GW campus; one GPU is < 2 kW, one rack < 200 kW
    "VA": 1e9,
    "kW": 1e6,
    "°C": 1e4,
    "%": 1e3,  # 0..100 by definition; some devices overshoot, none by 10x
    "1": 1e6,  # fractions and power factors are within ±1; counters are integers
    "J": 1e18,  # an energy counter of a 2 kW GPU after 15,000 years
    "kWh": 1e12,
    "MHz": 1e6,
    "MiB": 1e12,
    "A": 1e6,
    "V": 1e6,
    "Hz": 1e6,
    "L/min": 1e7,
    "kPa": 1e5,
    "bit/s": 1e16,  # 10 Pbit/s
}
#: Absolute zero [°C] (the SI definition of the kelvin).
ABSOLUTE_ZERO_C = -273.15
#: The rule of a quantity the contract does not name: a finite number within EXTRA_BOUND (its
#: name at most MAX_EXTRA_NAME characters).
UNNAMED = Quantity("", "a quantity the contract does not name", limit=EXTRA_BOUND)

#: The unit a quantity's name ends with: every name carries its unit (``power_w``, ``heat_kw``,
#: ``flow_lpm``), the contract's and derived ones alike (``headroom_k``, ``traffic_gbps``).
#: The contract's own quantities agree with it (tests/test_contract.py checks).
SUFFIX_UNITS: dict[str, str] = {
    "_w": "W",
    "_kw": "kW",
    "_va": "VA",
    "_c": "°C",
    "_k": "K",
    "_pct": "%",
    "_j": "J",
    "_kwh": "kWh",
    "_mhz": "MHz",
    "_mib": "MiB",
    "_a": "A",
    "_v": "V",
    "_hz": "Hz",
    "_lpm": "L/min",
    "_kpa": "kPa",
    "_bps": "bit/s",
    "_gbps": "Gb/s",
    "_s": "s",
}
_SUFFIXES_LONGEST_FIRST = sorted(SUFFIX_UNITS, key=len, reverse=True)


def unit_of(name: str, kind: str | None = None) -> str | None:
    """The unit of a quantity: the contract's for ``kind`` (when it names one), else the one
    its name ends with (:data:`SUFFIX_UNITS`); None when the name carries none."""
    if kind is not None and (q := named_quantity(kind, name)) is not None:
        return q.unit
    for suffix in _SUFFIXES_LONGEST_FIRST:
        if name.endswith(suffix):
            return SUFFIX_UNITS[suffix]
    return None


def _q(unit: str, description: str, *, integer: bool = False, nonneg: bool = False) -> Quantity:
    if not integer and unit not in UNIT_BOUNDS:
        raise ValueError(f"unit {unit!r} has no bound in UNIT_BOUNDS")
    return Quantity(unit, description, integer, nonneg)


#: Every quantity the contract names, per kind. Order is the column order in the store.
QUANTITIES: dict[str, dict[str, Quantity]] = {
    "gpu": {
        "power_w": _q("W", "board power draw", nonneg=True),
        "temp_c": _q("°C", "GPU (core) temperature"),
        "mem_temp_c": _q("°C", "HBM temperature"),
        "util_pct": _q("%", "fraction of time a kernel ran (GPU-Util), 0..100", nonneg=True),
        "mem_util_pct": _q("%", "memory-controller busy, 0..100", nonneg=True),
        "sm_active": _q("1", "fraction of SMs busy, 0..1 (DCGM_FI_PROF_SM_ACTIVE)", nonneg=True),
        "energy_j": _q("J", "energy counter since driver load", nonneg=True),
        "power_limit_w": _q("W", "enforced power limit", nonneg=True),
        "clock_sm_mhz": _q("MHz", "SM clock", nonneg=True),
        "clock_mem_mhz": _q("MHz", "memory clock", nonneg=True),
        "throttle_reasons": _q("1", "NVML clock-event reasons bitmask", integer=True, nonneg=True),
        "fb_used_mib": _q("MiB", "frame buffer used", nonneg=True),
        "ecc_sbe_total": _q("1", "corrected ECC errors, volatile", integer=True, nonneg=True),
        "ecc_dbe_total": _q("1", "uncorrected ECC errors, volatile", integer=True, nonneg=True),
    },
    "node": {
        "power_w": _q("W", "node input power (BMC)", nonneg=True),
        "cpu_util_pct": _q("%", "host CPU utilization, 0..100", nonneg=True),
        "inlet_temp_c": _q("°C", "air inlet temperature"),
        "outlet_temp_c": _q("°C", "air outlet temperature"),
        "fan_speed_pct": _q("%", "mean fan duty", nonneg=True),
    },
    "pdu": {
        "current_a": _q("A", "RMS current of a phase, branch or outlet", nonneg=True),
        "voltage_v": _q("V", "RMS voltage", nonneg=True),
        "power_w": _q("W", "real power", nonneg=True),
        "apparent_power_va": _q("VA", "apparent power", nonneg=True),
        "energy_kwh": _q("kWh", "energy counter", nonneg=True),
        "power_factor": _q("1", "power factor, 0..1"),
        "frequency_hz": _q("Hz", "line frequency", nonneg=True),
        "inlet_temp_c": _q("°C", "rack inlet air temperature (PDU sensor)"),
        "humidity_pct": _q("%", "rack inlet relative humidity", nonneg=True),
    },
    "cdu": {
        "supply_temp_c": _q("°C", "TCS (secondary) supply temperature to the racks"),
        "return_temp_c": _q("°C", "TCS return temperature from the racks"),
        "flow_lpm": _q("L/min", "TCS flow", nonneg=True),
        "pump_speed_pct": _q("%", "pump speed, 0..100", nonneg=True),
        "pump_power_w": _q("W", "pump electrical power", nonneg=True),
        "dp_kpa": _q("kPa", "TCS differential pressure"),
        "fw_supply_temp_c": _q("°C", "facility water (FWS) supply temperature"),
        "fw_return_temp_c": _q("°C", "facility water return temperature"),
        "fw_flow_lpm": _q("L/min", "facility water flow", nonneg=True),
        "heat_kw": _q("kW", "heat removed by the CDU", nonneg=True),
    },
    "link": {
        "tx_bps": _q("bit/s", "transmit rate", nonneg=True),
        "rx_bps": _q("bit/s", "receive rate", nonneg=True),
        "errors": _q("1", "error counter", integer=True, nonneg=True),
    },
}

#: Quantities the contract names and checks (unit, bound, sign) whose values the store keeps in
#: its long table (``extra_readings``), not in a typed column of the kind's table: readings only
#: some devices have. Their names are not in :data:`QUANTITIES`.
LONG_QUANTITIES: dict[str, dict[str, Quantity]] = {
    "pdu": {
        # a 3-phase wye unit's measured neutral conductor: on the unit or the infeed's cord id,
        # never on a line id (a neutral is not a line)
        "neutral_current_a": _q("A", "RMS current of the neutral conductor", nonneg=True),
    },
}


def named_quantity(kind: str, name: str) -> Quantity | None:
    """The contract's quantity ``name`` of ``kind``: typed (:data:`QUANTITIES`) or long
    (:data:`LONG_QUANTITIES`); None for a name the contract does not know."""
    return QUANTITIES.get(kind, {}).get(name) or LONG_QUANTITIES.get(kind, {}).get(name)


def value_rule(kind: str, name: str) -> Quantity:
    """The rule a value of quantity ``name`` of ``kind`` keeps: the contract's quantity (typed
    or long), else :data:`UNNAMED`'s."""
    return named_quantity(kind, name) or UNNAMED


def value_error(kind: str, name: str, value: Any) -> ContractError | None:
    """Why a number of quantity ``name`` of ``kind`` breaks its rule (:func:`value_rule`);
    None when it keeps it (or is not a number: that is a type error, not a value's)."""
    if type(value) not in (int, float):
        return None
    q = value_rule(kind, name)
    reason = value_reason(q, value)
    if reason is None:
        return None
    if reason == "non_finite":
        return ContractError(reason, f"{name} is not finite")
    where = "below" if value < q.lower else "beyond"
    limit = q.lower if value < q.lower else q.bound
    return ContractError(reason, f"{name} = {value} is {where} {limit} {q.unit}".rstrip())


def extra_refusal(kind: str, name: str, value: Any) -> str | None:
    """``"<reason>: <detail>"`` when a quantity outside the kind's columns breaks the contract
    (not a number, a name longer than MAX_EXTRA_NAME, a value its rule refuses)."""
    if type(value) not in (float, int) or len(name) > MAX_EXTRA_NAME:
        return f"out_of_range: {name[:40]}"
    err = value_error(kind, name, value)
    return None if err is None else f"{err.reason}: {err.detail}"


#: Dead-letter reasons, each with what it means.
DEAD_LETTER_REASONS: dict[str, str] = {
    "oversized": f"payload larger than {MAX_PAYLOAD_BYTES} bytes",
    "bad_topic": f"topic is not {TOPIC_PREFIX}/<site>/<kind>/<source>",
    "unknown_kind": f"topic kind is not one of {', '.join(KINDS)}",
    "wrong_site": "the topic's site is not the site this service runs",
    "malformed_json": "payload is not a JSON object",
    "duplicate_key": "a JSON object repeats a key",
    "non_finite": "a number is NaN or infinite",
    "bad_version": f"'v' is not the integer {CONTRACT_VERSION}",
    "missing_field": "a required field is absent",
    "wrong_type": "a field has the wrong type",
    "negative_value": "a quantity that cannot be negative is negative",
    "out_of_range": "a number is beyond its unit's bound, or an integer beyond int64",
    "bad_timestamp": "a timestamp is not strict RFC 3339 or Unix seconds",
    "ts_future": "timestamp too far in the future",
    "ts_past": "timestamp too far in the past",
    "source_mismatch": "payload 'source' differs from the topic's source",
    "too_deep": f"arrays and objects nest deeper than {MAX_DEPTH} levels",
    "too_many_samples": f"more than {MAX_SAMPLES} samples in one message",
    "too_many_quantities": f"a sample has more than {MAX_SAMPLE_KEYS} keys",
    "too_many_extras": f"more than {MAX_EXTRA_VALUES} quantities the contract does not name"
    " in one message",
    "store_rejected": "valid by the contract, but the database refused it (detail: its error)",
    "ingest_error": "the ingest itself failed on this message (a bug: the detail has the error)",
}


class ContractError(ValueError):
    """A message that breaks the contract; ``reason`` is a key of DEAD_LETTER_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def topic_for(site: str, kind: str, source: str) -> str:
    """The topic a source of ``kind`` publishes on."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    for part, name in ((site, "site"), (source, "source")):
        if not part or any(c in part for c in "/+#"):
            raise ValueError(f"{name} {part!r} must be non-empty and contain no '/', '+' or '#'")
    return f"{TOPIC_PREFIX}/{site}/{kind}/{source}"


def parse_topic(topic: str, site: str | None = None) -> tuple[str, str, str]:
    """Split a contract topic into (site, kind, source) or raise ContractError; with ``site``,
    a topic of another site is ``wrong_site``."""
    parts = topic.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != TOPIC_PREFIX or not all(parts[2:]):
        raise ContractError(
            "bad_topic", f"topic {topic!r} is not {TOPIC_PREFIX}/<site>/<kind>/<source>"
        )
    _, _, topic_site, kind, source = parts
    if kind not in KINDS:
        raise ContractError(
            "unknown_kind", f"kind {kind!r} in topic {topic!r}; expected one of {KINDS}"
        )
    if site is not None and topic_site != site:
        raise ContractError(
            "wrong_site", f"topic {topic!r} is for site {topic_site!r}; this service is {site!r}"
        )
    return topic_site, kind, source


# RFC 3339 section 5.6 date-time; "T" and "Z" may be lowercase (section 5.6, NOTE).
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})", re.ASCII
)
# ---- sample ids ------------------------------------------------------------------------------
#
# A sample's ``id`` names the device it measures, in the site file's names:
#
# - a GPU: ``<node>:<index>`` (or its UUID), a MIG instance ``<node>:<index>/mig<n>``;
# - a PDU ``<pdu>``, its phases ``<pdu>/L<n>`` (n from 1), breakers ``<pdu>/<breaker>`` and
#   outlets ``<pdu>/outlet<n>``; on a delta (or wye-and-delta) unit the line-to-line legs are
#   ``<pdu>/L<a>-L<b>`` (``<pdu>/L1-L2``): ``<pdu>/L1`` carries line L1's current, the leg id
#   carries the leg's voltage, current and power. A leg id is never a phase id
#   (:func:`split_phase_id` answers None for it; :func:`split_leg_id` takes it apart);
#   (``<n>``: the device's outlet name, letters, digits, ``.``, ``_`` or ``-``, up to 32:
#   ``outlet7``, ``outletA1``, ``outlet1-1``; :func:`is_outlet_label`);
# - a CDU ``<cdu>`` and its pumps ``<cdu>/<pump>``;
# - a node or a link by its name.
#
# Collectors, the simulator and the twin build and take apart ids with these functions only.

_PHASE_LABEL = re.compile(r"L([1-9][0-9]*)")
_OUTLET_LABEL = re.compile(r"outlet[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
_LEG_LABEL = re.compile(r"L([1-9][0-9]*)-L([1-9][0-9]*)")
# a vendor's line / leg label: "L1", "L1-N", "L1-L2" (spaces around the dash tolerated)
_LINE_TEXT = re.compile(r"L([1-9][0-9]*)(?:\s*-\s*(N|L[1-9][0-9]*))?", re.IGNORECASE)


def gpu_id(node: str, index: int | str) -> str:
    """``<node>:<index>``: a GPU by its node and its index on the node (as the exporter gives
    it, when that is a string)."""
    return f"{node}:{index}"


def split_gpu_id(sample_id: str) -> tuple[str, int] | None:
    """``(node, index)`` of a ``<node>:<index>`` id; None for a UUID or anything else."""
    node, sep, index = sample_id.rpartition(":")
    if not sep or not node or not index.isdigit():
        return None
    return node, int(index)


def sub_id(parent: str, element: str) -> str:
    """``<parent>/<element>``: a phase, breaker or outlet of a PDU, a pump of a CDU."""
    return f"{parent}/{element}"


def split_sub_id(sample_id: str) -> tuple[str, str | None]:
    """``(parent, element)`` of a ``<parent>/<element>`` id; ``(id, None)`` for a device."""
    parent, sep, element = sample_id.partition("/")
    return (parent, element) if sep else (sample_id, None)


def is_outlet_label(element: str) -> bool:
    """Whether ``element`` (of ``<pdu>/<element>``) names an outlet: ``outlet`` then the
    outlet's name (``outlet7``, ``outletA1``, ``outlet1-1``)."""
    return _OUTLET_LABEL.fullmatch(element) is not None


def phase_label(leg: int) -> str:
    """``L<leg>``, legs counted from 1."""
    if leg < 1:
        raise ValueError(f"phase leg {leg}: legs are counted from 1")
    return f"L{leg}"


def phase_leg(label: str) -> int | None:
    """The leg of an ``L<n>`` label (``"L2"`` -> 2); None when it is not one."""
    m = _PHASE_LABEL.fullmatch(label)
    return int(m.group(1)) if m else None


def phase_id(pdu: str, leg: int) -> str:
    """``<pdu>/L<leg>``: one phase (line) of a PDU."""
    return sub_id(pdu, phase_label(leg))


def phase_ids(pdu: str, phases: int) -> list[str]:
    """The ids of a PDU's ``phases`` phases: ``<pdu>/L1`` ... ``<pdu>/L<phases>``."""
    return [phase_id(pdu, k) for k in range(1, phases + 1)]


def split_phase_id(sample_id: str) -> tuple[str, int] | None:
    """``(pdu, leg)`` of a ``<pdu>/L<n>`` id; None for any other id."""
    parent, element = split_sub_id(sample_id)
    leg = None if element is None else phase_leg(element)
    return None if leg is None else (parent, leg)


def leg_label(a: int, b: int) -> str:
    """``L<a>-L<b>``: the line-to-line leg between lines ``a`` and ``b`` of a delta unit."""
    if a < 1 or b < 1 or a == b:
        raise ValueError(f"leg L{a}-L{b}: two different lines, counted from 1")
    return f"L{a}-L{b}"


def leg_id(pdu: str, a: int, b: int) -> str:
    """``<pdu>/L<a>-L<b>``: one line-to-line leg of a PDU (delta)."""
    return sub_id(pdu, leg_label(a, b))


def split_leg_id(sample_id: str) -> tuple[str, int, int] | None:
    """``(pdu, a, b)`` of a ``<pdu>/L<a>-L<b>`` id; None for any other id."""
    parent, element = split_sub_id(sample_id)
    m = None if element is None else _LEG_LABEL.fullmatch(element)
    if m is None or m.group(1) == m.group(2):
        return None
    return parent, int(m.group(1)), int(m.group(2))


def line_element(label: str) -> str | None:
    """The contract element a vendor's line/leg label names: ``"L1"`` and ``"L1-N"`` -> ``"L1"``
    (a line, or a wye phase: line to neutral), ``"L1-L2"`` -> ``"L1-L2"`` (a delta leg); None
    for anything else (an empty label, ``"AA"``, ``"L1-L1"``)."""
    m = _LINE_TEXT.fullmatch(label.strip())
    if m is None:
        return None
    a, other = int(m.group(1)), m.group(2)
    if other is None or other.upper() == "N":
        return phase_label(a)
    b = int(other[1:])
    return None if a == b else leg_label(a, b)


def pdu_sample_ids(pdu: str, phases: int, breakers: Iterable[str]) -> list[str]:
    """Every id a PDU reports under: itself, its phases, its breakers (outlets aside)."""
    return [pdu, *phase_ids(pdu, phases), *(sub_id(pdu, b) for b in breakers)]


def cdu_sample_ids(cdu: str, pumps: Iterable[str]) -> list[str]:
    """Every id a CDU reports under: itself and its pumps."""
    return [cdu, *(sub_id(cdu, p) for p in pumps)]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TS_MIN_S = (TS_MIN - _EPOCH).total_seconds()
TS_MAX_S = (TS_MAX - _EPOCH).total_seconds()


class TimestampError(ValueError):
    """A timestamp that is not strict RFC 3339 / Unix seconds, or outside TS_MIN..TS_MAX."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def parse_timestamp(value: Any) -> datetime:
    """A contract timestamp (RFC 3339 string or Unix seconds) as an aware UTC datetime.

    Raises :class:`TimestampError` (``bad_timestamp``, ``ts_past`` or ``ts_future``) otherwise.
    """
    if isinstance(value, str):
        if len(value) > 40 or not _RFC3339.fullmatch(value):
            raise TimestampError(
                "bad_timestamp",
                f"timestamp {value[:40]!r} is not RFC 3339 (e.g. 2026-11-29T14:00:00.25Z)",
            )
        text = value.upper()
        frac = text.find(".")
        if frac > 0:  # datetime takes at most 6 digits; RFC 3339 allows more: truncate
            end = frac + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            if end - frac > 7:
                text = text[: frac + 7] + text[end:]
        try:
            parsed = datetime.fromisoformat(text)
            ts = parsed.astimezone(UTC)
        except (ValueError, OverflowError) as e:
            raise TimestampError("bad_timestamp", f"timestamp {value!r}: {e}") from None
    elif type(value) is int or type(value) is float:
        if not math.isfinite(value):
            raise TimestampError("bad_timestamp", "timestamp is not finite")
        if value < TS_MIN_S:
            raise TimestampError("ts_past", f"timestamp {value!r} s is before {TS_MIN.date()}")
        if value >= TS_MAX_S:
            raise TimestampError("ts_future", f"timestamp {value!r} s is after {TS_MAX.date()}")
        ts = _EPOCH + timedelta(seconds=value)
    elif isinstance(value, datetime):  # Python callers (collectors building messages)
        if value.tzinfo is None:
            raise TimestampError("bad_timestamp", "timestamp has no timezone")
        ts = value.astimezone(UTC)
    else:
        raise TimestampError(
            "bad_timestamp",
            f"timestamp must be an RFC 3339 string or Unix seconds, got {type(value).__name__}",
        )
    if ts < TS_MIN:
        raise TimestampError("ts_past", f"timestamp {ts.isoformat()} is before {TS_MIN.date()}")
    if ts >= TS_MAX:
        raise TimestampError("ts_future", f"timestamp {ts.isoformat()} is after {TS_MAX.date()}")
    return ts


def _to_utc(value: Any) -> Any:
    try:
        return parse_timestamp(value)
    except TimestampError as e:
        # pydantic reports ValueErrors as 'value_error'; the reason travels in the message
        raise ValueError(f"[{e.reason}] {e}") from None


Timestamp = Annotated[datetime, BeforeValidator(_to_utc)]
_Extra = Annotated[
    float, Field(allow_inf_nan=False, strict=True, ge=UNNAMED.lower, le=UNNAMED.bound)
]


class _SampleBase(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, ser_json_inf_nan="null")
    __pydantic_extra__: dict[str, _Extra]  # quantities the contract does not name

    id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, strict=True)]
    ts: Timestamp | None = None


def _sample_model(kind: str) -> type[_SampleBase]:
    fields: dict[str, Any] = {}
    for name, q in QUANTITIES[kind].items():
        # the value rule (value_breaks): finite, within q.lower..q.bound
        ann: Any
        if q.integer:
            ann = Annotated[int, Field(ge=q.lower, le=q.bound, strict=True)]
        else:
            ann = Annotated[float, Field(ge=q.lower, le=q.bound, allow_inf_nan=False, strict=True)]
        fields[name] = (ann | None, None)
    return create_model(f"{kind.capitalize()}Sample", __base__=_SampleBase, **fields)


#: One pydantic model per kind; use it to build samples in collectors.
SAMPLE_MODELS: dict[str, type[_SampleBase]] = {k: _sample_model(k) for k in KINDS}
#: The keys a sample of each kind may carry that are not extra quantities.
SAMPLE_KEYS: dict[str, frozenset[str]] = {k: frozenset(("id", "ts", *QUANTITIES[k])) for k in KINDS}


class MessageHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    v: Annotated[int, Field(strict=True, ge=CONTRACT_VERSION, le=CONTRACT_VERSION)]
    collector: Annotated[str, Field(min_length=1, max_length=MAX_COLLECTOR_CHARS, strict=True)]
    source: Annotated[str, Field(min_length=1, max_length=MAX_SOURCE_CHARS, strict=True)]
    seq: Annotated[int, Field(ge=0, le=INT64_MAX, strict=True)]
    ts: Timestamp


def _message_model(kind: str) -> type[MessageHeader]:
    return create_model(
        f"{kind.capitalize()}Message",
        __base__=MessageHeader,
        samples=(Annotated[list[SAMPLE_MODELS[kind]], Field(min_length=1)], ...),
    )


#: One pydantic model per kind for a whole message.
MESSAGE_MODELS: dict[str, type[MessageHeader]] = {k: _message_model(k) for k in KINDS}

_ERROR_REASON = {
    "json_invalid": "malformed_json",
    "json_type": "malformed_json",
    "model_type": "malformed_json",
    "missing": "missing_field",
    "finite_number": "non_finite",
    "too_short": "missing_field",
}
_TS_REASON = re.compile(r"\[(bad_timestamp|ts_past|ts_future)\] ")


def _reason_for(err: ValidationError, kind: str) -> tuple[str, str]:
    first = err.errors(include_url=False)[0]
    loc_parts = first["loc"]
    loc = ".".join(str(p) for p in loc_parts)
    etype = first["type"]
    msg = first["msg"]
    reason = _ERROR_REASON.get(etype, "wrong_type")
    if etype == "model_type" and loc_parts:  # a sample that is not an object
        reason = "wrong_type"
    value = first.get("input")
    if loc_parts == ("v",):
        reason = "bad_version"
    elif (
        etype == "int_type"
        and type(value) is float
        and math.isfinite(value)
        and value == int(value)
        and abs(value) > INT64_MAX
    ):  # an integer past 64 bits, which the JSON parser could only read as a float
        reason = "out_of_range"
        msg = f"integer {value:.0f} is beyond int64"
    elif etype == "value_error" and (m := _TS_REASON.search(msg)):
        reason = m.group(1)
        msg = msg[m.end() :]
    elif etype in ("greater_than_equal", "less_than_equal"):
        reason = "out_of_range"
        if loc.startswith("samples") and type(value) in (int, float):
            # the sample models' bounds are the value rules': name the part broken
            reason = value_reason(value_rule(kind, str(loc_parts[-1])), value) or reason
        elif loc_parts == ("seq",) and isinstance(value, int) and value < 0:
            reason = "wrong_type"  # a negative seq is a wrong header
    where = f"{loc}: " if loc else ""
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return reason, f"{where}{msg}{more}"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ContractError("duplicate_key", f"key {key[:64]!r} appears twice in one object")
        out[key] = value
    return out


def check_duplicate_keys(payload: bytes, parsed: Any) -> None:
    """Raise ContractError(``duplicate_key``) if any JSON object of ``payload`` repeats a key.

    Fast when ``payload`` is canonical orjson (what every dctwin collector sends): it then equals
    the re-encoding of what it parsed to, which has unique keys. Otherwise the payload is parsed
    again with a hook that sees every key.
    """
    if orjson.dumps(parsed) == payload:
        return
    try:
        json.loads(payload, object_pairs_hook=_no_duplicates)
    except ContractError:
        raise
    except (ValueError, RecursionError):
        pass  # orjson took it; the stdlib's stricter limits are not the contract's concern


def nesting_depth(payload: bytes) -> int:
    """How deep the arrays and objects of ``payload`` nest (brackets inside strings aside), in
    a few passes of numpy over the bytes: nothing recursive, whatever the payload holds."""
    import numpy as np

    # an escaped backslash, then an escaped quote, can only be inside a string: without them
    # every remaining quote opens or closes one
    text = bytes(payload).replace(b"\\\\", b"").replace(b'\\"', b"")
    raw = np.frombuffer(text, dtype=np.uint8)
    outside = (np.cumsum(raw == ord('"'), dtype=np.int64) & 1) == 0
    step = ((raw == ord("[")) | (raw == ord("{"))).astype(np.int32)
    step -= (raw == ord("]")) | (raw == ord("}"))
    step[~outside] = 0
    return int(np.cumsum(step).max(initial=0))


def check_depth(payload: bytes) -> None:
    """Raise ContractError(``too_deep``) when ``payload`` nests deeper than :data:`MAX_DEPTH`
    (a payload with no more brackets than that is not scanned)."""
    if payload.count(b"[") + payload.count(b"{") <= MAX_DEPTH:
        return
    depth = nesting_depth(payload)
    if depth > MAX_DEPTH:
        raise ContractError("too_deep", f"arrays and objects nest {depth} deep > {MAX_DEPTH}")


def check_counts(kind: str, parsed: dict[str, Any]) -> None:
    """Raise ContractError when a parsed message carries more samples, keys in a sample, or
    quantities the contract does not name than the contract's bounds (:data:`MAX_SAMPLES`,
    :data:`MAX_SAMPLE_KEYS`, :data:`MAX_EXTRA_VALUES`)."""
    samples = parsed.get("samples")
    if type(samples) is not list:
        return
    if len(samples) > MAX_SAMPLES:
        raise ContractError("too_many_samples", f"samples: {len(samples)} samples > {MAX_SAMPLES}")
    allowed = SAMPLE_KEYS[kind]
    extras = 0
    for j, sample in enumerate(samples):
        if type(sample) is not dict:
            continue
        if len(sample) > MAX_SAMPLE_KEYS:
            raise ContractError(
                "too_many_quantities", f"samples.{j}: {len(sample)} keys > {MAX_SAMPLE_KEYS}"
            )
        extras += len(sample.keys() - allowed)
    if extras > MAX_EXTRA_VALUES:
        raise ContractError(
            "too_many_extras",
            f"samples: {extras} quantities the contract does not name > {MAX_EXTRA_VALUES}",
        )


_BIG_INTEGER = re.compile(r"-?[0-9]+(?![0-9.eE])")


def _json_error_reason(payload: bytes, err: orjson.JSONDecodeError) -> str:
    """The dead-letter reason for a payload orjson refused: an integer too large for a double
    is ``out_of_range``, a NaN/Infinity token or a float past a double ``non_finite``."""
    text = str(err)
    if "infinity" in text:
        m = re.search(r"\(char (\d+)\)", text)
        if m is not None:
            at = int(m.group(1))
            token = (
                payload[at : at + 64]
                if payload.isascii()
                else payload.decode("utf-8", "replace")[at : at + 64].encode()
            )
            if _BIG_INTEGER.match(token.decode("ascii", "replace")):
                return "out_of_range"
        return "non_finite"
    return "non_finite" if _has_nan_token(payload) else "malformed_json"


def _has_nan_token(payload: bytes) -> bool:
    """Whether a payload that is not strict JSON is JSON with NaN or Infinity in it."""
    try:
        from_json(payload, allow_inf_nan=True)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class Decoded:
    """A validated message: its header and its samples as plain dicts (None = not reported)."""

    site: str
    kind: str
    source: str
    collector: str
    seq: int
    ts: datetime
    samples: list[dict[str, Any]]


def decode(topic: str, payload: bytes, site: str | None = None) -> Decoded:
    """Validate one message against the contract; raise ContractError naming what was wrong.

    ``site``: the receiving service's site; a topic of another site is ``wrong_site``.
    """
    size = getattr(payload, "size", len(payload))  # a receiver may pass on only the start
    if size > MAX_PAYLOAD_BYTES:
        raise ContractError("oversized", f"{size} bytes > {MAX_PAYLOAD_BYTES}")
    topic_site, kind, source = parse_topic(topic, site)
    check_depth(payload)  # before anything recursive parses or re-encodes it
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise ContractError(_json_error_reason(payload, e), f"payload is not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ContractError("malformed_json", f"payload is a JSON {type(parsed).__name__}")
    check_counts(kind, parsed)
    check_duplicate_keys(payload, parsed)
    try:
        msg = MESSAGE_MODELS[kind].model_validate(parsed)
    except ValidationError as e:
        raise ContractError(*_reason_for(e, kind)) from None
    if msg.source != source:
        raise ContractError(
            "source_mismatch", f"payload source {msg.source!r} != topic source {source!r}"
        )
    samples = []
    for s in msg.samples:  # type: ignore[attr-defined]
        d = s.__dict__.copy()
        if s.__pydantic_extra__:
            for name in s.__pydantic_extra__:
                if len(name) > MAX_EXTRA_NAME:
                    raise ContractError(
                        "wrong_type",
                        f"quantity name {name[:40]!r}... longer than {MAX_EXTRA_NAME} characters",
                    )
                err = value_error(kind, name, s.__pydantic_extra__[name])
                if err is not None:
                    raise ContractError(err.reason, f"samples: {err.detail}")
            d.update(s.__pydantic_extra__)
        samples.append(d)
    return Decoded(topic_site, kind, source, msg.collector, msg.seq, msg.ts, samples)


def encode(
    *,
    collector: str,
    source: str,
    seq: int,
    ts: datetime | float,
    samples: list[dict[str, Any]],
) -> bytes:
    """Build the JSON payload of one message (no validation; collectors should send floats)."""
    if isinstance(ts, datetime):
        ts_out: str | float = (
            ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        )
    else:
        ts_out = ts
    return orjson.dumps(
        {
            "v": CONTRACT_VERSION,
            "collector": collector,
            "source": source,
            "seq": seq,
            "ts": ts_out,
            "samples": samples,
        }
    )
