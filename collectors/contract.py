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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)

CONTRACT_VERSION = 1
TOPIC_PREFIX = f"dctwin/v{CONTRACT_VERSION}"
KINDS: tuple[str, ...] = ("gpu", "node", "pdu", "cdu", "link")
#: Largest payload the ingest accepts; a real poll of a 72-GPU rack is ~10 KiB.
MAX_PAYLOAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Quantity:
    """One named quantity of the contract."""

    unit: str
    description: str
    integer: bool = False
    nonnegative: bool = False


def _q(unit: str, description: str, *, integer: bool = False, nonneg: bool = False) -> Quantity:
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

#: Dead-letter reasons, each with what it means.
DEAD_LETTER_REASONS: dict[str, str] = {
    "oversized": f"payload larger than {MAX_PAYLOAD_BYTES} bytes",
    "bad_topic": f"topic is not {TOPIC_PREFIX}/<site>/<kind>/<source>",
    "unknown_kind": f"topic kind is not one of {', '.join(KINDS)}",
    "malformed_json": "payload is not a JSON object",
    "non_finite": "a number is NaN or infinite",
    "bad_version": f"'v' is not {CONTRACT_VERSION}",
    "missing_field": "a required field is absent",
    "wrong_type": "a field has the wrong type",
    "negative_value": "a quantity that cannot be negative is negative",
    "ts_future": "timestamp too far in the future",
    "ts_past": "timestamp too far in the past",
    "source_mismatch": "payload 'source' differs from the topic's source",
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


def parse_topic(topic: str) -> tuple[str, str, str]:
    """Split a contract topic into (site, kind, source) or raise ContractError."""
    parts = topic.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != TOPIC_PREFIX or not all(parts[2:]):
        raise ContractError(
            "bad_topic", f"topic {topic!r} is not {TOPIC_PREFIX}/<site>/<kind>/<source>"
        )
    _, _, site, kind, source = parts
    if kind not in KINDS:
        raise ContractError(
            "unknown_kind", f"kind {kind!r} in topic {topic!r}; expected one of {KINDS}"
        )
    return site, kind, source


def _to_utc(value: Any) -> Any:
    """Accept RFC 3339 with an offset, or Unix seconds; return an aware UTC datetime."""
    if isinstance(value, bool):
        raise ValueError("a timestamp cannot be a boolean")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError("timestamp is not finite")
        return datetime.fromtimestamp(value, tz=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as e:
            raise ValueError(f"timestamp {value!r} is not RFC 3339") from e
        if parsed.tzinfo is None:
            raise ValueError(
                f"timestamp {value!r} has no UTC offset (RFC 3339 needs 'Z' or ±hh:mm)"
            )
        return parsed.astimezone(UTC)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("timestamp has no timezone")
        return value.astimezone(UTC)
    raise ValueError(
        f"timestamp must be an RFC 3339 string or Unix seconds, got {type(value).__name__}"
    )


Timestamp = Annotated[datetime, BeforeValidator(_to_utc)]
_Number = Annotated[float, Field(allow_inf_nan=False, strict=True)]


class _SampleBase(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, ser_json_inf_nan="null")
    __pydantic_extra__: dict[str, _Number]  # quantities the contract does not name

    id: Annotated[str, Field(min_length=1, max_length=256, strict=True)]
    ts: Timestamp | None = None


def _sample_model(kind: str) -> type[_SampleBase]:
    fields: dict[str, Any] = {}
    for name, q in QUANTITIES[kind].items():
        ann: Any
        if q.integer:
            ann = Annotated[int, Field(ge=0 if q.nonnegative else None, strict=True)]
        else:
            ann = Annotated[
                float, Field(ge=0 if q.nonnegative else None, allow_inf_nan=False, strict=True)
            ]
        fields[name] = (ann | None, None)
    return create_model(f"{kind.capitalize()}Sample", __base__=_SampleBase, **fields)


#: One pydantic model per kind; use it to build samples in collectors.
SAMPLE_MODELS: dict[str, type[_SampleBase]] = {k: _sample_model(k) for k in KINDS}


class MessageHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    v: Literal[1]
    collector: Annotated[str, Field(min_length=1, max_length=64, strict=True)]
    source: Annotated[str, Field(min_length=1, max_length=256, strict=True)]
    seq: Annotated[int, Field(ge=0, strict=True)]
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
    "greater_than_equal": "negative_value",
    "literal_error": "bad_version",
    "too_short": "missing_field",
}


def _reason_for(err: ValidationError) -> tuple[str, str]:
    first = err.errors(include_url=False, include_input=False)[0]
    loc = ".".join(str(p) for p in first["loc"])
    reason = _ERROR_REASON.get(first["type"], "wrong_type")
    if first["type"] == "greater_than_equal" and not loc.startswith("samples"):
        reason = "wrong_type"  # seq < 0 is a wrong header, not a negative quantity
    where = f"{loc}: " if loc else ""
    return reason, f"{where}{first['msg']}" + (
        f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    )


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


def decode(topic: str, payload: bytes) -> Decoded:
    """Validate one message against the contract; raise ContractError naming what was wrong."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ContractError("oversized", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    site, kind, source = parse_topic(topic)
    try:
        msg = MESSAGE_MODELS[kind].model_validate_json(payload)
    except ValidationError as e:
        raise ContractError(*_reason_for(e)) from None
    if msg.source != source:
        raise ContractError(
            "source_mismatch", f"payload source {msg.source!r} != topic source {source!r}"
        )
    samples = []
    for s in msg.samples:  # type: ignore[attr-defined]
        d = s.__dict__.copy()
        if s.__pydantic_extra__:
            d.update(s.__pydantic_extra__)
        samples.append(d)
    return Decoded(site, kind, source, msg.collector, msg.seq, msg.ts, samples)


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
