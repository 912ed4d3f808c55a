"""Turn raw (topic, payload) pairs into store batches: validate, dedup, route, dead-letter.

Transport-free: the MQTT service, the JSONL file loader and replay all feed this class, so
every path applies the same rules. Nothing is silently dropped: a message is stored, counted as
a duplicate of one already stored, or written to the dead-letter table with its reason.

Validation is the contract's, column-wise over the whole batch
(:class:`collectors.contract.BatchDecoder`). A batch the database still refuses is split in
halves until the refused message is alone; that message is dead-lettered as ``store_rejected``
with the database's error, and every other message is stored: one bad message never blocks the
rest, and no message is tried more than ``1 + log2(batch size)`` times. A store failure that is
not the data's fault (disk full, a lock, a lost database: :func:`twin.store.store.is_transient`)
raises :class:`StoreUnavailable` and dead-letters nothing; the caller keeps the messages and
retries. A message counts as seen (for dedup) only once the transaction that stored it committed.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collectors.contract import BatchDecoder
from twin.site import Site
from twin.store.schema import DEAD_PAYLOAD_KEEP_BYTES, DEAD_TOPIC_KEEP_CHARS
from twin.store.store import Batch, Store, is_transient

log = logging.getLogger(__name__)

#: Duplicate detection remembers the messages received in this window [s] ...
DEDUP_WINDOW_S = 900.0
#: ... but never more than this many (the oldest are forgotten first; about 100 bytes each).
DEDUP_MAX_KEYS = 2_000_000
#: Identical dead letters (same topic and payload hash) are stored once among this many.
DEAD_REPEAT_MEMORY = 10_000


class StoreUnavailable(RuntimeError):
    """The store failed for a reason that is not the data's (retry later; nothing was lost)."""


class OversizedPayload(bytes):
    """The kept start of a payload too large to forward whole, with its real size and hash.

    The MQTT receiver cuts such payloads before they cross to the service, so that a hostile
    publisher's megabytes are never copied; the ingest dead-letters it as ``oversized``.
    """

    size: int
    sha256: str

    def __new__(cls, head: bytes, size: int, sha256: str) -> OversizedPayload:
        obj = super().__new__(cls, head)
        obj.size = size
        obj.sha256 = sha256
        return obj


@dataclass(frozen=True)
class IngestLimits:
    """Timestamp sanity limits relative to the time of receipt; 0 disables a check."""

    max_future_s: float = 300.0
    max_past_s: float = 30 * 86400.0


@dataclass
class IngestCounters:
    """What the ingest did since it started; every count is of committed work."""

    received: int = 0
    stored_messages: int = 0
    duplicates: int = 0
    samples: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    #: identical dead letters seen again (a retained bad message at every restart): not stored
    dead_letter_repeats: int = 0
    #: batches the store refused that were split to find the refused message
    store_splits: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "stored_messages": self.stored_messages,
            "duplicates": self.duplicates,
            "samples": dict(self.samples),
            "dead_letters": dict(self.dead_letters),
            "dead_letter_repeats": self.dead_letter_repeats,
            "store_splits": self.store_splits,
        }


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is decoded.

    A batch of 20,000 messages makes about half a million short-lived containers (the parsed
    JSON) and no reference cycles: they are freed by reference counting, and the collector's
    passes over them cost about a third of the decode (measured: 65 against 45 us per 8-GPU
    message). It runs again right after, so other threads' cycles are only collected later.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _epoch_us(ts: datetime) -> int:
    """Microseconds since the Unix epoch (what the store's Arrow batches carry)."""
    return (ts - _EPOCH) // _US


@dataclass
class _Pending:
    """What a built batch will change once committed."""

    keys: list[int] = field(default_factory=list)
    dead_hashes: dict[tuple[str, str], None] = field(default_factory=dict)
    duplicates: int = 0
    repeats: int = 0
    received: int = 0


class Ingester:
    """Validates messages into batches and writes them to a Store."""

    def __init__(
        self,
        store: Store,
        site: Site | None = None,
        limits: IngestLimits | None = None,
        *,
        dedup_window_s: float = DEDUP_WINDOW_S,
        dedup_max_keys: int = DEDUP_MAX_KEYS,
    ):
        self.store = store
        self.site = site
        self.limits = limits or IngestLimits()
        self.counters = IngestCounters()
        self.decoder = BatchDecoder(site.name if site is not None else None)
        self.dedup_window_s = dedup_window_s
        self.dedup_max_keys = dedup_max_keys
        # dedup: key -> None, and the keys in arrival buckets of 10 s for forgetting them
        self._seen: dict[int, None] = {}
        self._buckets: deque[tuple[float, list[int]]] = deque()
        self._known_cache: dict[tuple[str, str], bool] = {}
        self._dead_seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        now = time.monotonic()
        for kind, source, seq, ts in store.recent_message_keys():
            self._remember([hash((kind, source, seq, _epoch_us(ts.astimezone(UTC))))], now)
        for topic, sha in reversed(store.recent_dead_letters(DEAD_REPEAT_MEMORY)):
            self._dead_seen[(topic, sha)] = None

    # ---- dedup memory ----------------------------------------------------------------------

    def _remember(self, keys: list[int], now_mono: float) -> None:
        if not keys:
            return
        seen = self._seen
        buckets = self._buckets
        if not buckets or now_mono - buckets[-1][0] >= 10.0:
            buckets.append((now_mono, []))
        bucket = buckets[-1][1]
        for k in keys:
            seen[k] = None
        bucket.extend(keys)
        horizon = now_mono - self.dedup_window_s
        # forget whole buckets, oldest first, never the one being filled
        while len(buckets) > 1 and (buckets[0][0] < horizon or len(seen) > self.dedup_max_keys):
            _, old = buckets.popleft()
            for k in old:
                seen.pop(k, None)

    @property
    def dedup_keys(self) -> int:
        """How many message keys the dedup remembers now."""
        return len(self._seen)

    def _is_known(self, kind: str, sample_id: str) -> bool:
        key = (kind, sample_id)
        known = self._known_cache.get(key)
        if known is None:
            known = self.site.is_known(kind, sample_id) if self.site else True
            if len(self._known_cache) >= 1_000_000:
                self._known_cache.clear()
            self._known_cache[key] = known
        return known

    # ---- building -----------------------------------------------------------------------------

    def build_batch(
        self, items: list[tuple[str, bytes]], received_at: datetime | None = None
    ) -> Batch:
        """Validate ``items`` into one Batch (not yet written; nothing is remembered or counted
        until :meth:`ingest` commits it)."""
        batch, _ = self._build(items, received_at or datetime.now(UTC))
        return batch

    def _build(self, items: list[tuple[str, bytes]], now: datetime) -> tuple[Batch, _Pending]:
        lim = self.limits
        now_us = _epoch_us(now)
        hi = now_us + int(lim.max_future_s * 1e6) if lim.max_future_s else None
        lo = now_us - int(lim.max_past_s * 1e6) if lim.max_past_s else None
        window = (lo, hi) if lo is not None or hi is not None else None
        pending = _Pending(received=len(items))
        seen = self._seen
        batch_keys: set[int] = set()

        def is_new(kind: str, source: str, seq: int, ts_us: int) -> bool:
            key = hash((kind, source, seq, ts_us))
            if key in seen or key in batch_keys:
                return False
            batch_keys.add(key)
            pending.keys.append(key)
            return True

        with _gc_paused():
            decoded = self.decoder.decode_batch(items, is_new=is_new, window_us=window)
        pending.duplicates = len(decoded.duplicates)
        batch = Batch()
        for i, err in decoded.refused:
            self._dead(batch, pending, items[i], err.reason, err.detail, now_us)
        for kind, cols in decoded.columns.items():
            batch.samples[kind] = cols
        if decoded.extras["id"]:
            batch.extras = decoded.extras
        msgs = decoded.messages
        batch.log = {
            "source": [m.source for m in msgs],
            "kind": [m.kind for m in msgs],
            "seq": [m.seq for m in msgs],
            "ts": [m.ts_us for m in msgs],
            "received_at": [now_us] * len(msgs),
            "collector": [m.collector for m in msgs],
            "n_samples": [m.n_samples for m in msgs],
        }
        if self.site is not None:
            self._unknown(batch)
        return batch, pending

    def _dead(
        self,
        batch: Batch,
        pending: _Pending,
        item: tuple[str, bytes],
        reason: str,
        detail: str,
        now_us: int,
    ) -> None:
        topic, payload = item
        if isinstance(payload, OversizedPayload):
            size, sha = payload.size, payload.sha256
        else:
            size, sha = len(payload), hashlib.sha256(payload).hexdigest()
        topic = topic[:DEAD_TOPIC_KEEP_CHARS]
        if (topic, sha) in self._dead_seen or (topic, sha) in pending.dead_hashes:
            pending.repeats += 1
            return
        pending.dead_hashes[(topic, sha)] = None
        dead = batch.dead
        dead["received_at"].append(now_us)
        dead["topic"].append(topic)
        dead["payload"].append(bytes(payload[:DEAD_PAYLOAD_KEEP_BYTES]))
        dead["reason"].append(reason)
        dead["detail"].append(detail[:2000])
        dead["payload_bytes"].append(size)
        dead["sha256"].append(sha)

    def _unknown(self, batch: Batch) -> None:
        """Rows of ``unknown_ids`` for the batch's sample ids the site does not know."""
        for kind, cols in batch.samples.items():
            ids = cols["id"]
            uniq = pc.unique(ids).to_pylist()
            unknown = [sid for sid in uniq if not self._is_known(kind, sid)]
            if not unknown:
                continue
            mask = pc.is_in(ids, value_set=pa.array(unknown, pa.string()))
            sub_ids = pc.filter(ids, mask).to_pylist()
            sub_ts = pc.filter(cols["ts"], mask).cast("int64").to_pylist()
            sub_src = pc.filter(cols["source"], mask).to_pylist()
            agg: dict[str, list[Any]] = {}
            for sid, ts, src in zip(sub_ids, sub_ts, sub_src, strict=True):
                u = agg.get(sid)
                if u is None:
                    agg[sid] = [src, ts, ts, 1]
                else:
                    u[0], u[1], u[2], u[3] = src, min(u[1], ts), max(u[2], ts), u[3] + 1
            for sid, (src, first, last, n) in agg.items():
                for col, value in zip(
                    ("kind", "id", "source", "first_seen", "last_seen", "samples"),
                    (kind, sid, src, first, last, n),
                    strict=True,
                ):
                    batch.unknown[col].append(value)

    # ---- writing --------------------------------------------------------------------------------

    def ingest(self, items: list[tuple[str, bytes]], received_at: datetime | None = None) -> Batch:
        """Validate and write ``items``; returns the (first) batch written.

        Every message ends stored, counted as a duplicate, or dead-lettered. Raises
        :class:`StoreUnavailable` when the store fails for a reason that is not the data's: the
        parts committed before it are remembered, so handing the same items in again stores
        each message once.
        """
        now = received_at or datetime.now(UTC)
        return self._ingest(items, now)

    def _ingest(self, items: list[tuple[str, bytes]], now: datetime) -> Batch:
        batch, pending = self._build(items, now)
        try:
            self.store.write(batch)
        except Exception as e:
            if is_transient(e):
                raise StoreUnavailable(f"{type(e).__name__}: {e}") from e
            if len(items) > 1:
                self.counters.store_splits += 1
                half = len(items) // 2
                first = self._ingest(items[:half], now)
                self._ingest(items[half:], now)
                return first
            return self._store_rejected(items[0], e, now)
        self._commit(batch, pending)
        return batch

    def ingest_isolated(
        self, items: list[tuple[str, bytes]], received_at: datetime | None = None
    ) -> None:
        """Ingest ``items`` one by one; a message on which the ingest itself fails (a bug, never
        a bad message: those are dead-lettered by reason) is dead-lettered as ``ingest_error``
        instead of stopping the rest. Raises StoreUnavailable like :meth:`ingest`."""
        now = received_at or datetime.now(UTC)
        for item in items:
            try:
                self._ingest([item], now)
            except StoreUnavailable:
                raise
            except Exception as e:
                log.exception("the ingest failed on a message on %s", item[0][:200])
                batch = Batch()
                pending = _Pending(received=1)
                self._dead(
                    batch, pending, item, "ingest_error", f"{type(e).__name__}: {e}", _epoch_us(now)
                )
                try:
                    self.store.write(batch)
                except Exception as e2:
                    raise StoreUnavailable(f"{type(e2).__name__}: {e2}") from e2
                self._commit(batch, pending)

    def _store_rejected(self, item: tuple[str, bytes], error: Exception, now: datetime) -> Batch:
        """Dead-letter the one message the store refused, with the store's error."""
        log.error(
            "the store refused a message on %s that passed validation (%s: %s);"
            " dead-lettered as store_rejected",
            item[0][:200],
            type(error).__name__,
            str(error)[:300],
        )
        batch = Batch()
        pending = _Pending(received=1)
        self._dead(
            batch,
            pending,
            item,
            "store_rejected",
            f"{type(error).__name__}: {error}",
            _epoch_us(now),
        )
        try:
            self.store.write(batch)
        except Exception as e:  # the store cannot even take a dead letter: it is the store
            raise StoreUnavailable(f"{type(e).__name__}: {e}") from e
        self._commit(batch, pending)
        return batch

    def _commit(self, batch: Batch, pending: _Pending) -> None:
        """Count and remember a batch once it is committed."""
        c = self.counters
        c.received += pending.received
        c.duplicates += pending.duplicates
        c.dead_letter_repeats += pending.repeats
        c.stored_messages += len(batch.log["seq"])
        for kind, cols in batch.samples.items():
            c.samples[kind] += len(cols["id"])
        for reason in batch.dead["reason"]:
            c.dead_letters[reason] += 1
        self._remember(pending.keys, time.monotonic())
        dead_seen = self._dead_seen
        for h in pending.dead_hashes:
            dead_seen[h] = None
        while len(dead_seen) > DEAD_REPEAT_MEMORY:
            dead_seen.popitem(last=False)


__all__ = [
    "IngestCounters",
    "IngestLimits",
    "Ingester",
    "OversizedPayload",
    "StoreUnavailable",
]
