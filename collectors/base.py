"""What every collector shares: the collector interface and the contract message builder.

A collector reads one kind of device (NVML on a GPU node, a dcgm-exporter endpoint, a Redfish
PDU or CDU, an SNMP PDU) and returns, per poll, the contract messages that describe it.
Publishing, spooling while the broker is away and the poll loop live in the runner, so a
collector is a plain object that is easy to test against a fake or a local protocol peer.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from collectors.contract import encode, topic_for

__all__ = ["Collector", "CollectorError", "MessageBuilder", "parse_duration_s"]

Message = tuple[str, bytes]


class CollectorError(RuntimeError):
    """A device or endpoint a collector cannot read; the message names it and why."""


@runtime_checkable
class Collector(Protocol):
    """One device source. ``poll`` returns that poll's contract messages (topic, payload)."""

    name: str  # for logs, e.g. "nvml", "redfish https://pdu-r01-a"

    def poll(self) -> list[Message]: ...

    def close(self) -> None: ...


class MessageBuilder:
    """Builds contract messages for one collector, numbering ``seq`` per (kind, source).

    ``seq`` starts at ``seq_start`` (default: the current Unix time in ms, so a restarted
    collector's numbers keep growing and never repeat an earlier run's (source, seq, ts)).
    """

    def __init__(self, site: str, collector: str, seq_start: int | None = None):
        self.site = site
        self.collector = collector
        self._start = int(datetime.now(UTC).timestamp() * 1000) if seq_start is None else seq_start
        self._seq: dict[tuple[str, str], int] = {}

    def message(
        self, kind: str, source: str, samples: list[dict[str, Any]], ts: datetime | None = None
    ) -> Message:
        """One message of ``samples`` (each a dict with ``id`` and quantities, ``None`` left
        out) from ``source`` of ``kind``, stamped ``ts`` (default now, UTC)."""
        key = (kind, source)
        seq = self._seq.get(key, self._start)
        self._seq[key] = seq + 1
        clean = [{k: v for k, v in s.items() if v is not None} for s in samples]
        payload = encode(
            collector=self.collector,
            source=source,
            seq=seq,
            ts=ts if ts is not None else datetime.now(UTC),
            samples=clean,
        )
        return topic_for(self.site, kind, source), payload


_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)


def parse_duration_s(text: str, what: str = "duration") -> float:
    """Seconds from ``600``, ``600s``, ``10m``, ``1.5h`` or ``1d``; ValueError naming ``what``."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{what} {text!r} is not a time like 600, 600s, 10m, 1.5h or 1d")
    return float(m.group(1)) * _UNIT_S[m.group(2).lower()]
