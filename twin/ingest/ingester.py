"""Turn raw (topic, payload) pairs into store batches: validate, dedup, route, dead-letter.

Transport-free: the MQTT service, the JSONL file loader and replay all feed this class, so
every path applies the same rules. Nothing is silently dropped: a message is stored, counted as
a duplicate of one already stored, or written to the dead-letter table with its reason.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from collectors.contract import KINDS, QUANTITIES, ContractError, decode
from twin.site import Site
from twin.store.store import Batch, Store

log = logging.getLogger(__name__)

#: How many recent message keys to remember per source for duplicate detection.
DEDUP_WINDOW = 4096


@dataclass(frozen=True)
class IngestLimits:
    """Timestamp sanity limits relative to the time of receipt; 0 disables a check."""

    max_future_s: float = 300.0
    max_past_s: float = 30 * 86400.0


@dataclass
class IngestCounters:
    received: int = 0
    stored_messages: int = 0
    duplicates: int = 0
    samples: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "stored_messages": self.stored_messages,
            "duplicates": self.duplicates,
            "samples": dict(self.samples),
            "dead_letters": dict(self.dead_letters),
        }


def _epoch_us(ts: datetime) -> int:
    """Microseconds since the Unix epoch (what the store's Arrow batches carry)."""
    return (ts - _EPOCH) // _US


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


class Ingester:
    """Validates messages into batches and writes them to a Store."""

    def __init__(self, store: Store, site: Site | None = None, limits: IngestLimits | None = None):
        self.store = store
        self.site = site
        self.limits = limits or IngestLimits()
        self.counters = IngestCounters()
        self._seen: dict[tuple[str, str], OrderedDict[tuple[int, datetime], None]] = {}
        self._known_cache: dict[tuple[str, str], bool] = {}
        self._columns = {k: list(QUANTITIES[k]) for k in KINDS}
        self._pending: list[tuple[tuple[str, str], tuple[int, datetime]]] = []
        for kind, source, seq, ts in store.recent_message_keys():
            self._remember((kind, source), (seq, ts.astimezone(UTC)))

    def _remember(self, stream: tuple[str, str], key: tuple[int, datetime]) -> bool:
        """Record a message key of a (kind, source) stream; False when already seen."""
        seen = self._seen.get(stream)
        if seen is None:
            seen = self._seen[stream] = OrderedDict()
        if key in seen:
            return False
        seen[key] = None
        if len(seen) > DEDUP_WINDOW:
            seen.popitem(last=False)
        return True

    def _is_known(self, kind: str, sample_id: str) -> bool:
        key = (kind, sample_id)
        known = self._known_cache.get(key)
        if known is None:
            known = self.site.is_known(kind, sample_id) if self.site else True
            if len(self._known_cache) < 1_000_000:
                self._known_cache[key] = known
        return known

    def build_batch(
        self, items: list[tuple[str, bytes]], received_at: datetime | None = None
    ) -> Batch:
        """Validate ``items`` into one Batch (not yet written)."""
        now = received_at or datetime.now(UTC)
        future = (
            now + timedelta(seconds=self.limits.max_future_s) if self.limits.max_future_s else None
        )
        past = now - timedelta(seconds=self.limits.max_past_s) if self.limits.max_past_s else None
        now_us = _epoch_us(now)
        batch = Batch()
        unknown: dict[tuple[str, str], list[Any]] = {}
        lg, dead, extras = batch.log, batch.dead, batch.extras
        for topic, payload in items:
            self.counters.received += 1
            try:
                msg = decode(topic, payload)
                for ts in [msg.ts, *(s["ts"] for s in msg.samples if s["ts"] is not None)]:
                    if future is not None and ts > future:
                        raise ContractError(
                            "ts_future",
                            f"timestamp {ts.isoformat()} is more than "
                            f"{self.limits.max_future_s:.0f} s after receipt {now.isoformat()}",
                        )
                    if past is not None and ts < past:
                        raise ContractError(
                            "ts_past",
                            f"timestamp {ts.isoformat()} is more than "
                            f"{self.limits.max_past_s:.0f} s before receipt {now.isoformat()}",
                        )
            except ContractError as e:
                self.counters.dead_letters[e.reason] += 1
                dead["received_at"].append(now_us)
                dead["topic"].append(topic)
                dead["payload"].append(bytes(payload))
                dead["reason"].append(e.reason)
                dead["detail"].append(e.detail)
                continue
            stream = (msg.kind, msg.source)
            if not self._remember(stream, (msg.seq, msg.ts)):
                self.counters.duplicates += 1
                continue
            self._pending.append((stream, (msg.seq, msg.ts)))
            kind, source = msg.kind, msg.source
            cols = batch.kind_columns(kind)
            samples = msg.samples
            msg_us = _epoch_us(msg.ts)
            ts_us = [msg_us if s["ts"] is None else _epoch_us(s["ts"]) for s in samples]
            cols["ts"].extend(ts_us)
            cols["source"].extend([source] * len(samples))
            cols["id"].extend([s["id"] for s in samples])
            for name in self._columns[kind]:
                cols[name].extend([s[name] for s in samples])
            n_declared = len(self._columns[kind]) + 2  # id and ts
            for s, ts in zip(samples, ts_us, strict=True):
                sid = s["id"]
                if len(s) > n_declared:
                    for name, value in s.items():
                        if name not in cols and name != "ts":
                            extras["ts"].append(ts)
                            extras["kind"].append(kind)
                            extras["source"].append(source)
                            extras["id"].append(sid)
                            extras["quantity"].append(name)
                            extras["value"].append(value)
                if not self._is_known(kind, sid):
                    u = unknown.get((kind, sid))
                    if u is None:
                        unknown[(kind, sid)] = [source, ts, ts, 1]
                    else:
                        u[0], u[1], u[2], u[3] = source, min(u[1], ts), max(u[2], ts), u[3] + 1
            lg["source"].append(source)
            lg["kind"].append(kind)
            lg["seq"].append(msg.seq)
            lg["ts"].append(msg_us)
            lg["received_at"].append(now_us)
            lg["collector"].append(msg.collector)
            lg["n_samples"].append(len(msg.samples))
            self.counters.stored_messages += 1
            self.counters.samples[kind] += len(msg.samples)
        for (kind, sid), (source, first, last, n) in unknown.items():
            for col, value in zip(
                ("kind", "id", "source", "first_seen", "last_seen", "samples"),
                (kind, sid, source, first, last, n),
                strict=True,
            ):
                batch.unknown[col].append(value)
        return batch

    def ingest(self, items: list[tuple[str, bytes]], received_at: datetime | None = None) -> Batch:
        """Validate and write ``items`` in one transaction; returns the batch written."""
        self._pending.clear()
        batch = self.build_batch(items, received_at)
        try:
            self.store.write(batch)
        except Exception:
            for stream, key in self._pending:  # not stored: a redelivery must not count as a dup
                self._seen[stream].pop(key, None)
            raise
        finally:
            self._pending.clear()
        return batch
