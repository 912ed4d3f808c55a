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
message (pydantic, and names the reason); :class:`BatchDecoder` checks whole batches column-wise
for the ingest and accepts exactly what :func:`decode` accepts.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
from collections import Counter
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


@dataclass(frozen=True, slots=True)
class Quantity:
    """One named quantity of the contract."""

    unit: str
    description: str
    integer: bool = False
    nonnegative: bool = False

    @property
    def bound(self) -> float:
        """Largest magnitude accepted [unit]; integers: int64."""
        return float(INT64_MAX) if self.integer else UNIT_BOUNDS[self.unit]

    @property
    def lower(self) -> float:
        """Smallest value accepted [unit]."""
        if self.nonnegative:
            return 0.0
        return ABSOLUTE_ZERO_C if self.unit == "°C" else -self.bound


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


def _long_quantity_error(kind: str, name: str, value: Any) -> ContractError | None:
    """Why a value of a long quantity breaks the contract (None when it does not)."""
    q = LONG_QUANTITIES.get(kind, {}).get(name)
    if q is None or type(value) not in (int, float):
        return None
    if value < q.lower:
        reason = "negative_value" if q.nonnegative and value < 0 else "out_of_range"
        return ContractError(reason, f"{name} = {value} is below {q.lower} {q.unit}")
    if value > q.bound:
        return ContractError("out_of_range", f"{name} = {value} is beyond {q.bound} {q.unit}")
    return None


def _extra_refusal(kind: str, name: str, value: Any) -> str | None:
    """``"<reason>: <detail>"`` when a quantity outside the kind's columns breaks the contract
    (not a finite number within EXTRA_BOUND, a name too long, a long quantity out of range)."""
    if (
        type(value) not in (float, int)
        or not -EXTRA_BOUND <= value <= EXTRA_BOUND
        or len(name) > MAX_EXTRA_NAME
    ):
        return f"out_of_range: {name[:40]}"
    err = _long_quantity_error(kind, name, value)
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
_TS_MIN_S = (TS_MIN - _EPOCH).total_seconds()
_TS_MAX_S = (TS_MAX - _EPOCH).total_seconds()


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
        if value < _TS_MIN_S:
            raise TimestampError("ts_past", f"timestamp {value!r} s is before {TS_MIN.date()}")
        if value >= _TS_MAX_S:
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
_Extra = Annotated[float, Field(allow_inf_nan=False, strict=True, ge=-EXTRA_BOUND, le=EXTRA_BOUND)]


class _SampleBase(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, ser_json_inf_nan="null")
    __pydantic_extra__: dict[str, _Extra]  # quantities the contract does not name

    id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, strict=True)]
    ts: Timestamp | None = None


def _sample_model(kind: str) -> type[_SampleBase]:
    fields: dict[str, Any] = {}
    for name, q in QUANTITIES[kind].items():
        ann: Any
        if q.integer:
            ann = Annotated[
                int, Field(ge=0 if q.nonnegative else -INT64_MAX - 1, le=INT64_MAX, strict=True)
            ]
        else:
            ann = Annotated[float, Field(ge=q.lower, le=q.bound, allow_inf_nan=False, strict=True)]
        fields[name] = (ann | None, None)
    return create_model(f"{kind.capitalize()}Sample", __base__=_SampleBase, **fields)


#: One pydantic model per kind; use it to build samples in collectors.
SAMPLE_MODELS: dict[str, type[_SampleBase]] = {k: _sample_model(k) for k in KINDS}
#: The keys a sample of each kind may carry that are not extra quantities.
_ALLOWED_KEYS: dict[str, frozenset[str]] = {
    k: frozenset(("id", "ts", *QUANTITIES[k])) for k in KINDS
}


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
        name = str(loc_parts[-1])
        q = QUANTITIES[kind].get(name)
        if (
            loc.startswith("samples")
            and q is not None
            and q.nonnegative
            and isinstance(value, int | float)
            and value < 0
        ):
            reason = "negative_value"
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


def _deep_lines(all_payloads: list[bytes]) -> list[bool] | None:
    """Per payload: whether it nests deeper than :data:`MAX_DEPTH` (None when none does).
    Only payloads with more brackets than that are scanned, together, in a few numpy passes
    over them joined (:func:`nesting_depth` per payload, each line counted from its own start,
    so a malformed line does not shift the next)."""
    import numpy as np

    many = [
        j
        for j, p in enumerate(all_payloads)
        if p.count(b"[") + p.count(b"{") > MAX_DEPTH  # at most that deep otherwise
    ]
    if not many:
        return None
    payloads = [all_payloads[j] for j in many]
    m = len(payloads)
    texts = [p.replace(b"\\\\", b"").replace(b'\\"', b"") for p in payloads]
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=m) + 1
    raw = np.frombuffer(b"\n".join(texts) + b"\n", dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    is_q = raw == ord('"')
    q = np.cumsum(is_q, dtype=np.int32)
    odd_before = ((q[starts] - is_q[starts]) & 1).astype(np.int8)  # quotes before each line
    inside = ((q & 1).astype(np.int8) ^ np.repeat(odd_before, lens)).astype(bool)
    step = ((raw == ord("[")) | (raw == ord("{"))).astype(np.int32)
    step -= (raw == ord("]")) | (raw == ord("}"))
    step[inside] = 0
    depth = np.cumsum(step, dtype=np.int32)
    # the deepest point of each line, from the depth where it starts
    deep = np.maximum.reduceat(depth, starts) - (depth[starts] - step[starts]) > MAX_DEPTH
    if not deep.any():
        return None
    out = [False] * len(all_payloads)
    for j in np.flatnonzero(deep).tolist():
        out[many[j]] = True
    return out


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
    allowed = _ALLOWED_KEYS[kind]
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
                err = _long_quantity_error(kind, name, s.__pydantic_extra__[name])
                if err is not None:
                    raise ContractError(err.reason, f"samples: {err.detail}")
            d.update(s.__pydantic_extra__)
        samples.append(d)
    return Decoded(topic_site, kind, source, msg.collector, msg.seq, msg.ts, samples)


# ---- column-wise validation of whole batches (the ingest's path) -------------------------------

_HEADER_KEYS = frozenset(("v", "collector", "source", "seq", "ts", "samples"))
_NONE = type(None)
_FLOAT_TYPES = frozenset((float, int, _NONE))
_INT_TYPES = frozenset((int, _NONE))


@dataclass(slots=True)
class BatchMessage:
    """One accepted message of a batch: its header; its samples are in the batch's columns."""

    index: int  # position in the items given to decode_batch
    kind: str
    source: str
    collector: str
    seq: int
    ts_us: int  # microseconds since the Unix epoch, UTC
    n_samples: int


@dataclass
class DecodedBatch:
    """What :meth:`BatchDecoder.decode_batch` made of a list of (topic, payload) items."""

    messages: list[BatchMessage]
    #: kind -> column -> Arrow array (``ts``, ``source``, ``id``, then the kind's quantities)
    columns: dict[str, dict[str, Any]]
    #: quantities the contract does not name: ts (us), kind, source, id, quantity, value
    extras: dict[str, list[Any]]
    #: (item index, why) for each refused message
    refused: list[tuple[int, ContractError]]
    #: item indices of duplicates (of a message already stored, or earlier in this batch)
    duplicates: list[int]


def _us(ts: datetime) -> int:
    return (ts - _EPOCH) // _ONE_US


_ONE_US = timedelta(microseconds=1)


class BatchDecoder:
    """Validates many messages at once, column by column, by the rules of :func:`decode`.

    Plain payloads (one ASCII line without escapes: what dctwin's collectors send) of one kind
    are parsed together by pyarrow.json against the kind's schema and checked as columns
    (:class:`_ArrowPart`: no Python object per value); the others have only their header
    checked in Python, and the samples of all of them of one kind are checked together (value
    types with one pass of ``map(type, ...)``, bounds with numpy). A message that fails any
    check is handed to :func:`decode`, which names the reason, so the paths share one set of
    rules (tests/test_batch_arrow.py holds them to it). ``window_us``: (earliest, latest)
    timestamp accepted [us since the epoch], for the ingest's max-past/max-future limits
    (``ts_past``/``ts_future``).
    """

    def __init__(self, site: str | None = None):
        self.site = site
        self._topics: dict[str, tuple[str, str, str] | ContractError] = {}
        self._str_ts: dict[str, int] = {}  # RFC 3339 text -> us, for timestamps seen before

    def _topic(self, topic: str) -> tuple[str, str, str]:
        """The topic's (site, kind, source), remembered; ContractError (also remembered)."""
        t = self._topics.get(topic)
        if t is None:
            try:
                t = parse_topic(topic, self.site)
            except ContractError as e:
                t = e
            if len(self._topics) >= 100_000:
                self._topics.clear()
            self._topics[topic] = t
        if isinstance(t, ContractError):
            raise ContractError(t.reason, t.detail)
        return t

    def _ts_us(self, value: Any) -> int:
        if type(value) is not str:  # numbers are not cached: 1 == 1.0 == True as dict keys
            return _us(parse_timestamp(value))  # TimestampError: the caller refuses it
        cache = self._str_ts
        us = cache.get(value)
        if us is None:
            us = _us(parse_timestamp(value))
            if len(cache) >= 8192:
                cache.clear()
            cache[value] = us
        return us

    def decode_batch(
        self,
        items: list[tuple[str, bytes]],
        *,
        is_new: Any = None,
        window_us: tuple[int, int] | None = None,
        dedup: Any = None,
    ) -> DecodedBatch:
        """Validate ``items``; ``is_new(kind, source, seq, ts_us)`` says whether a valid message
        is not a duplicate (it must also remember the keys of this batch); it is asked in the
        order of ``items`` within a kind, so the first of two copies is the one kept. ``dedup``
        instead answers for a whole kind at once: ``dedup(kind, keys)`` with keys (item index,
        source, seq, ts_us) in item order returns the item indices that are duplicates."""
        refused: list[tuple[int, ContractError]] = []
        duplicates: list[int] = []
        per_kind: dict[str, list[tuple[int, str, str, int, int, list]]] = {}
        lo, hi = window_us if window_us is not None else (None, None)
        lo_ = -(1 << 62) if lo is None else lo
        hi_ = 1 << 62 if hi is None else hi
        topics = self._topics
        ts_cache = self._str_ts
        loads, dumps = orjson.loads, orjson.dumps
        version = CONTRACT_VERSION
        # Plain payloads (see _plain) of a known topic are parsed and checked a whole kind at
        # a time in Arrow (_ArrowPart); what that cannot take goes through the loop below.
        fast_parts, slow = self._arrow_parts(items, lo_, hi_)
        for i in slow:
            topic, payload = items[i]
            # the common case, inline: a topic of a known shape, canonical JSON, a valid
            # header; anything else goes to decode(), which names the reason (or accepts it)
            t = topics.get(topic)
            if t is None:
                try:
                    t = self._topic(topic)
                except ContractError:
                    t = False
            if (
                type(t) is tuple
                and type(payload) is bytes
                and len(payload) <= MAX_PAYLOAD_BYTES
                and len(t[2]) <= MAX_SOURCE_CHARS
                and (
                    payload.count(b"[") + payload.count(b"{") <= MAX_DEPTH
                    or nesting_depth(payload) <= MAX_DEPTH
                )
            ):
                try:
                    obj = loads(payload)
                except orjson.JSONDecodeError:
                    obj = None
                if type(obj) is dict and obj.keys() == _HEADER_KEYS:
                    v, collector, seq = obj["v"], obj["collector"], obj["seq"]
                    samples = obj["samples"]
                    tsv = obj["ts"]
                    ts_type = type(tsv)
                    ts_us = None
                    if ts_type is str:
                        ts_us = ts_cache.get(tsv)
                        if ts_us is None:
                            with contextlib.suppress(TimestampError):
                                ts_us = self._ts_us(tsv)  # parses and remembers it
                    elif (ts_type is float or ts_type is int) and _TS_MIN_S <= tsv < _TS_MAX_S:
                        ts_us = timedelta(seconds=tsv) // _ONE_US  # as parse_timestamp rounds
                    if (
                        ts_us is not None
                        and type(v) is int
                        and v == version
                        and type(collector) is str
                        and 0 < len(collector) <= MAX_COLLECTOR_CHARS
                        and obj["source"] == t[2]
                        and type(seq) is int
                        and 0 <= seq <= INT64_MAX
                        and type(samples) is list
                        and 0 < len(samples) <= MAX_SAMPLES
                        and lo_ <= ts_us <= hi_
                        and dumps(obj) == payload
                    ):
                        kind = t[1]
                        per_kind.setdefault(kind, []).append(
                            (i, kind, t[2], collector, seq, ts_us, samples)
                        )
                        continue
            try:
                d = decode(topic, payload, self.site)  # names the reason, or accepts it
                kind, source, collector, seq = d.kind, d.source, d.collector, d.seq
                ts_us, samples = _us(d.ts), d.samples
                self._check_window(ts_us, lo, hi)
            except ContractError as e:
                refused.append((i, e))
                continue
            per_kind.setdefault(kind, []).append((i, kind, source, collector, seq, ts_us, samples))
        messages: list[BatchMessage] = []
        columns: dict[str, dict[str, Any]] = {}
        extras: dict[str, list[Any]] = {
            n: [] for n in ("ts", "kind", "source", "id", "quantity", "value")
        }
        for kind in {**per_kind, **fast_parts}:
            msgs = per_kind.get(kind, [])
            checked = None
            while msgs:
                result = self._kind_columns(kind, msgs, lo, hi)
                if isinstance(result, tuple):
                    checked = result
                    break
                # some messages failed a column check: refuse them, check the rest again
                for m in msgs:
                    if m[0] in result:
                        refused.append((m[0], self._why(items[m[0]], result[m[0]])))
                msgs = [m for m in msgs if m[0] not in result]
            parts = fast_parts.get(kind, [])
            dups: set[int] = set()
            if is_new is not None or dedup is not None:
                keys: Any = [(m[0], m[2], m[4], m[5]) for m in msgs]
                for part in parts:
                    keys = keys + part.keys() if keys else part.keys()
                if len(parts) + bool(msgs) > 1:
                    keys.sort()
                if dedup is not None:
                    dups = set(dedup(kind, keys))
                else:
                    dups = {k[0] for k in keys if not is_new(kind, k[1], k[2], k[3])}
            if dups:  # valid, but stored before (or earlier in this batch)
                duplicates.extend(sorted(dups))
            kind_cols = []
            if checked is not None:
                cols, ext, row_msg, ext_msg = checked
                if dups:
                    msgs = [m for m in msgs if m[0] not in dups]
                    cols, ext = _drop_rows(cols, ext, row_msg, ext_msg, dups)
                    row_msg = [r for r in row_msg if r not in dups]
                if msgs:
                    kind_cols.append((cols, row_msg))
                    for k, vals in ext.items():
                        extras[k].extend(vals)
                messages.extend(
                    BatchMessage(m[0], kind, m[2], m[3], m[4], m[5], len(m[6])) for m in msgs
                )
            for part in parts:
                if dups:
                    part = part.without(dups)
                if part.index:
                    kind_cols.append((part.cols, part.row_msg))
                    messages.extend(part.messages(kind))
            if kind_cols:
                columns[kind] = _concat_columns(kind_cols)
        messages.sort(key=lambda m: m.index)
        return DecodedBatch(messages, columns, extras, refused, duplicates)

    def _arrow_parts(
        self, items: list[tuple[str, bytes]], lo_: int, hi_: int
    ) -> tuple[dict[str, list[_ArrowPart]], list[int]]:
        """The Arrow-checked parts of ``items`` per kind, and the indices (sorted) of the
        messages left to the per-message path (unknown topic shapes, oversized or non-bytes
        payloads, and whatever the Arrow parts could not vouch for)."""
        topics = self._topics
        fast: dict[str, tuple[list[int], list[str]]] = {}
        slow: list[int] = []
        for i, (topic, payload) in enumerate(items):
            t = topics.get(topic)
            if t is None:
                try:
                    t = self._topic(topic)
                except ContractError:
                    t = False
            if (
                type(t) is tuple
                and type(payload) is bytes
                and len(payload) <= MAX_PAYLOAD_BYTES
                and len(t[2]) <= MAX_SOURCE_CHARS
            ):
                idx_src = fast.get(t[1])
                if idx_src is None:
                    idx_src = fast[t[1]] = ([], [])
                idx_src[0].append(i)
                idx_src[1].append(t[2])
            else:
                slow.append(i)
        fast_parts: dict[str, list[_ArrowPart]] = {}
        for kind, (idx, srcs) in fast.items():
            parts, rest = _ArrowPart.split(self, kind, items, idx, srcs, lo_, hi_)
            if parts:
                fast_parts[kind] = parts
            slow.extend(rest)
        slow.sort()
        return fast_parts, slow

    @staticmethod
    def _check_window(ts_us: int, lo: int | None, hi: int | None, where: str = "ts") -> None:
        if hi is not None and ts_us > hi:
            raise ContractError(
                "ts_future", f"{where} {_iso_us(ts_us)} is after the latest accepted {_iso_us(hi)}"
            )
        if lo is not None and ts_us < lo:
            raise ContractError(
                "ts_past", f"{where} {_iso_us(ts_us)} is before the earliest accepted {_iso_us(lo)}"
            )

    def _why(self, item: tuple[str, bytes], fast_detail: str) -> ContractError:
        """The reason for a message the column checks refused: decode()'s, else the checks'."""
        try:
            decode(item[0], item[1], self.site)
        except ContractError as e:
            return e
        # decode() accepts what the column checks refused: a sample timestamp outside the
        # ingest's window (decode() has no window), or a disagreement between the two paths.
        reason, _, detail = fast_detail.partition(": ")
        return ContractError(reason if reason in DEAD_LETTER_REASONS else "wrong_type", detail)

    def _kind_columns(
        self,
        kind: str,
        msgs: list[tuple[int, str, str, str, int, int, list]],
        lo: int | None,
        hi: int | None,
    ) -> Any:
        """Columns of one kind's samples; or {message index: detail} of the messages to refuse
        (then the caller drops them and calls again)."""
        import numpy as np
        import pyarrow as pa

        quantities = QUANTITIES[kind]
        rows: list[Any] = []
        row_msg: list[int] = []
        for m in msgs:
            rows.extend(m[6])
            row_msg.extend([m[0]] * len(m[6]))
        n = len(rows)
        bad: dict[int, str] = {}

        def refuse(row_indices: Any, detail: str) -> None:
            for r in row_indices:
                bad.setdefault(row_msg[r], detail)

        if set(map(type, rows)) != {dict}:
            refuse([r for r, s in enumerate(rows) if type(s) is not dict], "wrong_type: sample")
            return bad
        allowed = _ALLOWED_KEYS[kind]
        n_keys = np.fromiter(map(len, rows), dtype=np.int64, count=n)
        refuse(np.flatnonzero(n_keys > MAX_SAMPLE_KEYS), "too_many_quantities: sample keys")
        keys: set[str] = set().union(*rows)
        ids = list(map(dict.get, rows, itertools.repeat("id")))
        if set(map(type, ids)) != {str}:
            refuse([r for r, v in enumerate(ids) if type(v) is not str], "wrong_type: sample id")
        else:
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=n)
            refuse(
                np.flatnonzero((lengths < 1) | (lengths > MAX_ID_CHARS)),
                "wrong_type: sample id length",
            )
        # timestamps: the message's, or the sample's own
        counts = np.fromiter(map(len, (m[6] for m in msgs)), dtype=np.int64, count=len(msgs))
        ts = np.repeat(np.fromiter((m[5] for m in msgs), dtype=np.int64, count=len(msgs)), counts)
        if "ts" in keys:
            for r, s in enumerate(rows):
                v = s.get("ts")
                if v is None:
                    continue
                try:
                    us = self._ts_us(v)
                    self._check_window(us, lo, hi, "sample ts")
                except (TimestampError, TypeError):
                    refuse([r], "bad_timestamp: sample ts")
                    continue
                except ContractError as e:
                    refuse([r], f"{e.reason}: {e.detail}")
                    continue
                ts[r] = us
        cols: dict[str, Any] = {}
        if not bad and "ts" not in keys and keys <= allowed:
            fast = _uniform_columns(kind, rows, keys, n)
            if fast is not None:
                cols = fast
        for name, q in quantities.items():
            if name in cols:
                continue
            if name not in keys:
                cols[name] = pa.nulls(n, pa.int64() if q.integer else pa.float64())
                continue
            col = [s.get(name) for s in rows]
            types = set(map(type, col))
            if q.integer:
                if not types <= _INT_TYPES:
                    refuse(
                        [r for r, v in enumerate(col) if type(v) not in _INT_TYPES],
                        f"wrong_type: {name}",
                    )
                    continue
                try:
                    arr = pa.array(col, type=pa.int64())
                except (OverflowError, pa.ArrowInvalid):
                    refuse(
                        [r for r, v in enumerate(col) if v is not None and not _int64(v)],
                        f"out_of_range: {name}",
                    )
                    continue
                if q.nonnegative and arr.null_count < n:
                    vals = arr.to_numpy(zero_copy_only=False)
                    neg = np.flatnonzero(np.nan_to_num(vals.astype(np.float64), nan=0.0) < 0)
                    refuse(neg, f"negative_value: {name}")
                cols[name] = arr
            else:
                if not types <= _FLOAT_TYPES:
                    refuse(
                        [r for r, v in enumerate(col) if type(v) not in _FLOAT_TYPES],
                        f"wrong_type: {name}",
                    )
                    continue
                try:
                    vals = np.array(col, dtype=np.float64)
                except OverflowError:
                    refuse(
                        [r for r, v in enumerate(col) if type(v) is int and abs(v) > 1e300],
                        f"out_of_range: {name}",
                    )
                    continue
                missing = np.isnan(vals)  # JSON has no NaN: NaN here is a null
                with np.errstate(invalid="ignore"):
                    if q.nonnegative:
                        refuse(np.flatnonzero(vals < 0), f"negative_value: {name}")
                    refuse(
                        np.flatnonzero((vals < q.lower) | (vals > q.bound)), f"out_of_range: {name}"
                    )
                cols[name] = pa.array(vals, mask=missing if missing.any() else None)
        ext: dict[str, list[Any]] = {}
        ext_msg: list[int] = []
        if not keys <= allowed:  # some sample has quantities the contract does not name
            ext, ext_msg = _extra_rows(kind, msgs, rows, row_msg, ts, ids, refuse, bad)
        else:
            ext = {k: [] for k in ("ts", "kind", "source", "id", "quantity", "value")}
        if bad:
            return bad
        srcs = [m[2] for m in msgs]
        counts = [len(m[6]) for m in msgs]
        out = {
            "ts": pa.array(ts, type=pa.timestamp("us", tz="UTC")),
            "source": pa.array(srcs, type=pa.string()).take(
                pa.array(np.repeat(np.arange(len(msgs)), counts))
            ),
            "id": pa.array(ids, type=pa.string()),
            **cols,
        }
        return out, ext, row_msg, ext_msg


def _extra_rows(
    kind: str,
    msgs: list[tuple[int, str, str, str, int, int, list]],
    rows: list[dict],
    row_msg: list[int],
    ts: Any,
    ids: list[Any],
    refuse: Any,
    bad: dict[int, str],
) -> tuple[dict[str, list[Any]], list[int]]:
    """The rows of ``extra_readings`` (quantities the contract does not name) of one kind's
    samples, and each row's message; a bad value or name is refused per row (``refuse``), a
    message past :data:`MAX_EXTRA_VALUES` marked in ``bad``."""
    allowed = _ALLOWED_KEYS[kind]
    ext: dict[str, list[Any]] = {k: [] for k in ("ts", "kind", "source", "id", "quantity", "value")}
    ext_msg: list[int] = []
    sources = None
    for r, s in enumerate(rows):
        if s.keys() <= allowed:
            continue
        if sources is None:
            sources = {m[0]: m[2] for m in msgs}
        for name, v in s.items():
            if name in allowed:
                continue
            why = _extra_refusal(kind, name, v)
            if why is not None:
                refuse([r], why)
                continue
            ext["ts"].append(int(ts[r]))
            ext["kind"].append(kind)
            ext["source"].append(sources[row_msg[r]])
            ext["id"].append(ids[r])
            ext["quantity"].append(name)
            ext["value"].append(float(v))
            ext_msg.append(row_msg[r])
    for m, count in Counter(ext_msg).items():
        if count > MAX_EXTRA_VALUES:
            bad.setdefault(m, f"too_many_extras: {count} values")
    return ext, ext_msg


def _drop_rows(
    cols: dict[str, Any],
    ext: dict[str, list[Any]],
    row_msg: list[int],
    ext_msg: list[int],
    drop: set[int],
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The columns and extras without the rows of the messages in ``drop``."""
    import numpy as np
    import pyarrow as pa

    keep = pa.array(~np.isin(np.asarray(row_msg), np.fromiter(drop, dtype=np.int64)))
    cols = {name: arr.filter(keep) for name, arr in cols.items()}
    if ext_msg:
        idx = [j for j, m in enumerate(ext_msg) if m not in drop]
        ext = {k: [vals[j] for j in idx] for k, vals in ext.items()}
    return cols, ext


def _plain(payload: bytes) -> bool:
    """Whether the Arrow path may parse ``payload``: one JSON object on one line, ASCII (Arrow's
    parser does not check UTF-8), no backslash and no NUL. Without a backslash every quote
    delimits a string, so the payload holds two quotes per key and per string value, which
    _ArrowPart compares with the keys and strings that Arrow parsed (a repeated key, or a key
    whose value is null, sends the message to the other path)."""
    return (
        payload[:1] == b"{"
        and payload[-1:] == b"}"
        and payload.isascii()
        and b"\n" not in payload
        and b"\\" not in payload
        and b"\r" not in payload
        and b"\0" not in payload
    )


def _plain_joined(buf: bytes, payloads: list[bytes]) -> bool:
    """``all(map(_plain, payloads))`` for ``buf``, the payloads joined by newlines (a few
    single-byte scans of the whole buffer, and the first and last byte of each payload)."""
    import numpy as np

    if not (
        buf.isascii()
        and b"\\" not in buf
        and b"\r" not in buf
        and b"\0" not in buf
        and buf.count(b"\n") == len(payloads) - 1
    ):
        return False
    lens = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    if not (lens > 0).all():
        return False
    ends = np.cumsum(lens + 1) - 1  # where each payload's newline is (or would be)
    raw = np.frombuffer(buf, dtype=np.uint8)
    return bool((raw[ends - lens] == ord("{")).all() and (raw[ends - 1] == ord("}")).all())


_ARROW_SCHEMAS: dict[str, Any] = {}


def _arrow_parse_options(kind: str) -> Any:
    """pyarrow.json options that take exactly the contract's fields of ``kind`` and fail on any
    other field, on a value of another JSON type, or on an integer field written as a float."""
    opts = _ARROW_SCHEMAS.get(kind)
    if opts is None:
        import pyarrow as pa
        import pyarrow.json as pj

        fields = [pa.field("id", pa.string())] + [
            pa.field(name, pa.int64() if q.integer else pa.float64())
            for name, q in QUANTITIES[kind].items()
        ]
        schema = pa.schema(
            [
                ("v", pa.int64()),
                ("collector", pa.string()),
                ("source", pa.string()),
                ("seq", pa.int64()),
                ("ts", pa.string()),
                ("samples", pa.list_(pa.struct(fields))),
            ]
        )
        opts = _ARROW_SCHEMAS[kind] = pj.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="error"
        )
    return opts


class _ArrowPart:
    """The messages of one kind that pyarrow.json parsed and the contract's checks accepted,
    as columns: no Python object per value. :meth:`build` sends every message it cannot vouch
    for (a parse error anywhere in the kind: all of them) to the per-message path, which names
    the reason or accepts it; so this path only ever accepts what that path accepts."""

    __slots__ = ("collector", "cols", "index", "n", "row_msg", "seq", "source", "ts_us")

    def __init__(self, **kw: Any):
        for k, v in kw.items():
            setattr(self, k, v)

    #: A run of messages that Arrow cannot parse is split in halves down to this size (one
    #: bad message costs about two parses of the rest), then left to the per-message path.
    SPLIT_MIN = 64

    @classmethod
    def split(
        cls,
        decoder: BatchDecoder,
        kind: str,
        items: list[tuple[str, bytes]],
        idx: list[int],
        srcs: list[str],
        lo: int,
        hi: int,
        deep_checked: bool = False,
    ) -> tuple[list[_ArrowPart], list[int]]:
        """The accepted parts of the messages ``idx`` (topic sources ``srcs``), in item order,
        and the item indices left to the per-message path. When Arrow cannot parse them, the
        payloads nested deeper than MAX_DEPTH (found in one numpy pass) are left out first:
        those alone then cost one more parse, not a split down to SPLIT_MIN around each."""
        part, rest, parsed = cls.build(decoder, kind, items, idx, srcs, lo, hi)
        if parsed or len(idx) < 2 * cls.SPLIT_MIN:
            return ([part] if part is not None else []), rest
        if not deep_checked:
            deep = _deep_lines([items[i][1] for i in idx])
            if deep is not None:
                keep = [j for j, d in enumerate(deep) if not d]
                parts, rest = cls.split(
                    decoder,
                    kind,
                    items,
                    [idx[j] for j in keep],
                    [srcs[j] for j in keep],
                    lo,
                    hi,
                    deep_checked=True,
                )
                return parts, rest + [i for i, d in zip(idx, deep, strict=True) if d]
        h = len(idx) // 2
        a, rest_a = cls.split(decoder, kind, items, idx[:h], srcs[:h], lo, hi, True)
        b, rest_b = cls.split(decoder, kind, items, idx[h:], srcs[h:], lo, hi, True)
        return a + b, rest_a + rest_b

    @classmethod
    def build(
        cls,
        decoder: BatchDecoder,
        kind: str,
        items: list[tuple[str, bytes]],
        idx: list[int],
        srcs: list[str],
        lo: int,
        hi: int,
    ) -> tuple[_ArrowPart | None, list[int], bool]:
        """(the accepted part or None, the item indices left to the per-message path, whether
        Arrow parsed the messages at all)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        payloads = [items[i][1] for i in idx]
        buf = b"\n".join(payloads)
        rest: list[int] = []
        if not _plain_joined(buf, payloads):  # some are not: take the others
            plain = [_plain(p) for p in payloads]
            rest = list(itertools.compress(idx, (not x for x in plain)))
            idx = list(itertools.compress(idx, plain))
            srcs = list(itertools.compress(srcs, plain))
            payloads = list(itertools.compress(payloads, plain))
            if not idx:
                return None, rest, True
            buf = b"\n".join(payloads)
        try:
            table = pj.read_json(
                pa.BufferReader(buf),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(buf) + 1),
                parse_options=_arrow_parse_options(kind),
            )
        except (pa.ArrowException, ValueError, OverflowError):
            return None, rest + idx, False
        m = len(idx)
        if table.num_rows != m:  # cannot be (one object per line), but if it were
            return None, rest + idx, False

        def col(name: str) -> Any:
            return table.column(name).combine_chunks()

        def true(arr: Any) -> Any:
            return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)

        ok = true(pc.equal(col("v"), CONTRACT_VERSION))
        n_coll = pc.utf8_length(col("collector")).fill_null(0).to_numpy(zero_copy_only=False)
        ok &= (n_coll >= 1) & (n_coll <= MAX_COLLECTOR_CHARS)
        want_src = pa.array(srcs, pa.string())
        source = col("source")
        ok &= true(pc.equal(source, want_src))
        seq = col("seq")
        ok &= true(pc.greater_equal(seq, 0))
        # message timestamps: each distinct text parsed once (and remembered by the decoder)
        ts_text = col("ts").dictionary_encode()
        words = ts_text.dictionary.to_pylist()
        us = np.zeros(len(words) + 1, dtype=np.int64)
        good = np.zeros(len(words) + 1, dtype=bool)
        for j, w in enumerate(words):
            with contextlib.suppress(TimestampError):
                us[j] = decoder._ts_us(w)
                good[j] = lo <= us[j] <= hi
        codes = ts_text.indices.fill_null(len(words)).to_numpy(zero_copy_only=False)
        ts_us = us[codes]
        ok &= good[codes]
        samples = col("samples")
        lengths = pc.list_value_length(samples).fill_null(0).to_numpy(zero_copy_only=False)
        ok &= (lengths >= 1) & (lengths <= MAX_SAMPLES)
        rows = samples.flatten()
        n = len(rows)
        if n != int(lengths.sum()):
            return None, rest + idx, True
        row_pos = np.repeat(np.arange(m), lengths)
        row_bad = ~np.asarray(rows.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        ids = rows.field("id")
        n_id = pc.utf8_length(ids).fill_null(0).to_numpy(zero_copy_only=False)
        row_bad |= (n_id < 1) | (n_id > MAX_ID_CHARS)
        keys = np.zeros(n, dtype=np.int64)  # keys with a value in each sample
        cols: dict[str, Any] = {}
        for name, q in QUANTITIES[kind].items():
            arr = rows.field(name)
            if arr.null_count == n:
                cols[name] = arr
                continue
            valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            keys += valid
            vals = arr.to_numpy(zero_copy_only=False)
            if q.integer:
                if q.nonnegative:
                    row_bad |= valid & (vals < 0)
            else:
                with np.errstate(invalid="ignore"):  # NaN: a null, or a NaN token
                    row_bad |= (valid & np.isnan(vals)) | (vals < q.lower) | (vals > q.bound)
            cols[name] = arr
        keys += 2 * (n_id > 0)  # the id: a key and a string
        # strings (keys and string values) that Arrow parsed with a value, per message
        per_msg = np.bincount(row_pos, weights=keys, minlength=m).astype(np.int64)
        for name in _HEADER_KEYS:
            valid = np.asarray(col(name).is_valid().to_numpy(zero_copy_only=False), bool)
            per_msg += valid * (2 if name in ("collector", "source", "ts") else 1)
        # each payload has at least 2 * per_msg quotes (see _plain): equal sums, equal counts
        if buf.count(b'"') != 2 * int(per_msg.sum()):
            found = np.fromiter((p.count(b'"') for p in payloads), dtype=np.int64, count=m)
            ok &= 2 * per_msg == found
        if row_bad.any():
            ok &= np.bincount(row_pos, weights=row_bad, minlength=m) == 0
        idx_arr = np.asarray(idx, dtype=np.int64)
        rest += idx_arr[~ok].tolist()
        if not ok.any():
            return None, rest, True
        row_msg = idx_arr[row_pos]
        if not ok.all():
            keep_rows = ok[row_pos]
            mask = pa.array(keep_rows)
            cols = {k: v.filter(mask) for k, v in cols.items()}
            ids = ids.filter(mask)
            row_msg = row_msg[keep_rows]
            row_pos = row_pos[keep_rows]
        sources = want_src if ok.all() else want_src.filter(pa.array(ok))
        keep = np.flatnonzero(ok)
        part = cls(
            index=idx_arr[keep].tolist(),
            source=sources.to_pylist(),
            collector=col("collector").take(pa.array(keep)).to_pylist(),
            seq=seq.take(pa.array(keep)).to_pylist(),
            ts_us=ts_us[keep].tolist(),
            n=lengths[keep].tolist(),
            row_msg=row_msg,
            cols={
                "ts": pa.array(ts_us[row_pos], type=pa.timestamp("us", tz="UTC")),
                "source": want_src.take(pa.array(row_pos)),
                "id": ids,
                **cols,
            },
        )
        return part, rest, True

    def keys(self) -> list[tuple[int, str, int, int]]:
        """(item index, source, seq, ts [us]) of each message, for the dedup."""
        return list(zip(self.index, self.source, self.seq, self.ts_us, strict=True))

    def messages(self, kind: str) -> list[BatchMessage]:
        return list(
            map(
                BatchMessage,
                self.index,
                itertools.repeat(kind),
                self.source,
                self.collector,
                self.seq,
                self.ts_us,
                self.n,
            )
        )

    def without(self, drop: set[int]) -> _ArrowPart:
        """This part less the messages of the item indices ``drop``."""
        import numpy as np
        import pyarrow as pa

        keep = [j for j, i in enumerate(self.index) if i not in drop]
        keep_rows = ~np.isin(self.row_msg, np.fromiter(drop, dtype=np.int64))
        mask = pa.array(keep_rows)
        return _ArrowPart(
            index=[self.index[j] for j in keep],
            source=[self.source[j] for j in keep],
            collector=[self.collector[j] for j in keep],
            seq=[self.seq[j] for j in keep],
            ts_us=[self.ts_us[j] for j in keep],
            n=[self.n[j] for j in keep],
            row_msg=self.row_msg[keep_rows],
            cols={k: v.filter(mask) for k, v in self.cols.items()},
        )


def _concat_columns(parts: list[tuple[dict[str, Any], Any]]) -> dict[str, Any]:
    """The columns of one kind from both paths, rows in the order of their messages' items."""
    if len(parts) == 1:
        return parts[0][0]
    import numpy as np
    import pyarrow as pa

    names = list(parts[0][0])
    cols = {k: pa.concat_arrays([p[0][k].cast(parts[0][0][k].type) for p in parts]) for k in names}
    order = np.argsort(
        np.concatenate([np.asarray(p[1], dtype=np.int64) for p in parts]), kind="stable"
    )
    take = pa.array(order)
    return {k: v.take(take) for k, v in cols.items()}


def _uniform_columns(kind: str, rows: list[dict], keys: set[str], n: int) -> dict[str, Any] | None:
    """The quantity columns of samples that all carry the same keys, in a few C-level passes
    (one to take the values, one to check their types, one numpy conversion); None when any
    value needs the per-column checks, which then name the offender."""
    import operator

    import numpy as np
    import pyarrow as pa

    if set(map(len, rows)) != {len(keys)}:  # some sample lacks a key: per column
        return None
    quantities = QUANTITIES[kind]
    floats = [q for q in quantities if q in keys and not quantities[q].integer]
    ints = [q for q in quantities if q in keys and quantities[q].integer]
    out: dict[str, Any] = {}
    if floats:
        if len(floats) > 1:
            values: list[Any] = list(map(operator.itemgetter(*floats), rows))
            types = set(map(type, itertools.chain.from_iterable(values)))
        else:
            values = [s[floats[0]] for s in rows]
            types = set(map(type, values))
        if not types <= _FLOAT_TYPES:
            return None
        try:
            block = np.array(values, dtype=np.float64).reshape(n, len(floats)).T
        except (OverflowError, TypeError, ValueError):
            return None
        lower = np.array([quantities[q].lower for q in floats])[:, None]
        upper = np.array([quantities[q].bound for q in floats])[:, None]
        with np.errstate(invalid="ignore"):
            if ((block < lower) | (block > upper)).any():
                return None
        missing = np.isnan(block)
        any_missing = missing.any(axis=1)
        for j, q in enumerate(floats):
            col = np.ascontiguousarray(block[j])
            out[q] = pa.array(col, mask=missing[j] if any_missing[j] else None)
    for q in ints:
        col = [s[q] for s in rows]
        if not set(map(type, col)) <= _INT_TYPES:
            return None
        try:
            arr = pa.array(col, type=pa.int64())
        except (OverflowError, pa.ArrowInvalid):
            return None
        if quantities[q].nonnegative and arr.null_count < n:
            low = _pc_min(arr)
            if low is not None and low < 0:
                return None
        out[q] = arr
    return out


def _pc_min(arr: Any) -> Any:
    import pyarrow.compute as pc

    return pc.min(arr).as_py()


def _int64(v: int) -> bool:
    return type(v) is int and -INT64_MAX - 1 <= v <= INT64_MAX


def _iso_us(us: int) -> str:
    try:
        return (_EPOCH + timedelta(microseconds=us)).isoformat().replace("+00:00", "Z")
    except OverflowError:
        return f"{us} us"


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
