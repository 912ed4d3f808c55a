"""Turn raw (topic, payload) pairs into store batches: validate, dedup, route, dead-letter.

Transport-free: the MQTT service, the JSONL file loader and replay all feed this class, so
every path applies the same rules. Nothing is silently dropped: a message is stored, counted as
a duplicate of one already stored, or written to the dead-letter table with its reason.

Validation is the contract's, column-wise over the whole batch
(:class:`twin.ingest.batch_decode.BatchDecoder`). A batch the database still refuses is split in
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
import itertools
import json
import logging
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from collectors.contract import KINDS, TOPIC_PREFIX, encode, topic_for
from twin.ingest.batch_decode import BatchDecoder
from twin.ingest.columns import KEY_COLUMNS, suspect_rows
from twin.site import Site
from twin.store.schema import DEAD_PAYLOAD_KEEP_BYTES, DEAD_TOPIC_KEEP_CHARS, arrow_schema
from twin.store.store import Batch, Store, is_transient

log = logging.getLogger(__name__)

#: Duplicate detection keeps the keys of the messages received in this window [s] in memory ...
DEDUP_WINDOW_S = 900.0
#: ... but never more than this many (the oldest are forgotten first; about 100 bytes each).
#: Past them, a message is looked up in the store's ingest log (see :class:`Ingester`).
DEDUP_MAX_KEYS = 2_000_000
#: Streams (kind, source) whose high-water marks are kept (about 200 bytes each); past this
#: many, a message of a stream without a mark is looked up in the store too.
DEDUP_MAX_STREAMS = 1_000_000
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
    #: messages of another shard's sources (a shard's ``accept``): acknowledged, not stored
    foreign: int = 0
    #: lookups of the store's ingest log for messages behind their stream's high-water mark
    #: and not among the recent keys (a re-publish, a redelivery, a second import)
    dedup_lookups: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "stored_messages": self.stored_messages,
            "duplicates": self.duplicates,
            "samples": dict(self.samples),
            "dead_letters": dict(self.dead_letters),
            "dead_letter_repeats": self.dead_letter_repeats,
            "store_splits": self.store_splits,
            "foreign": self.foreign,
            "dedup_lookups": self.dedup_lookups,
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
    #: kind -> source -> [highest seq, latest ts us] of the messages stored by this batch
    high: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    #: keys of the messages of this batch so far (duplicates within one batch)
    batch_keys: set[int] = field(default_factory=set)
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
        accept: frozenset[tuple[str, str]] | None = None,
    ):
        self.store = store
        #: a shard's (kind, source) pairs (twin.site.shards.ShardView.accepted): a well-formed
        #: topic of this site naming another pair is counted as ``foreign`` and not stored
        self.accept = accept
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
        # per stream: the highest seq and latest ts stored; a message past either is new
        # (kind -> source -> (seq, ts us))
        self._high: dict[str, dict[str, tuple[int, int]]] = {k: {} for k in KINDS}
        self._streams = 0
        for kind, source, seq, ts_us in store.message_high_water():
            self._high.setdefault(kind, {})[source] = (seq, ts_us)
            self._streams += 1
        #: whether every stream stored has its mark (else one without a mark is looked up)
        self._high_complete = self._streams <= DEDUP_MAX_STREAMS
        if not self._high_complete:
            self._forget_marks()
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
        seen.update(dict.fromkeys(keys))
        bucket.extend(keys)
        horizon = now_mono - self.dedup_window_s
        # forget whole buckets, oldest first, never the one being filled
        while len(buckets) > 1 and (buckets[0][0] < horizon or len(seen) > self.dedup_max_keys):
            _, old = buckets.popleft()
            for k in old:
                seen.pop(k, None)

    def _dedup(
        self, kind: str, keys: list[tuple[int, str, int, int]], pending: _Pending
    ) -> set[int]:
        """The duplicates among ``keys`` (index, source, seq, ts_us) of ``kind``, in order, over
        everything the store holds: a key among the recent ones in memory or earlier in this
        batch is one; a key past its stream's high-water mark (a higher seq or a later ts:
        live traffic) is new; the others (a re-publish, a redelivery after a restart, a second
        import) are looked up in the store's ingest log, all of the batch in one query.
        The new keys go to ``pending`` (remembered once committed)."""
        seen, batch_keys = self._seen, pending.batch_keys
        high = self._high.setdefault(kind, {})
        marks = pending.high.setdefault(kind, {})
        complete = self._high_complete
        dups: set[int] = set()
        add_key = pending.keys.append
        lookup: list[tuple[int, str, int, int]] = []
        later: list[tuple[int, int, str, int, int]] = []
        for key in keys:
            i, source, seq, ts = key
            h = hash((kind, source, seq, ts))
            if h in seen or h in batch_keys:
                dups.add(i)
                continue
            batch_keys.add(h)
            mark = high.get(source)
            if (mark is None and not complete) or (
                mark is not None and seq <= mark[0] and ts <= mark[1]
            ):  # behind both marks: ask the store (after the loop, all at once)
                lookup.append(key)
                later.append((i, h, source, seq, ts))
                continue
            add_key(h)
            m = marks.get(source)
            if m is None:
                marks[source] = [seq, ts]
            else:
                if seq > m[0]:
                    m[0] = seq
                if ts > m[1]:
                    m[1] = ts
        if lookup:
            self.counters.dedup_lookups += 1
            cols = list(zip(*lookup, strict=True))
            table = pa.table(
                {
                    "i": pa.array(cols[0], pa.int64()),
                    "source": pa.array(cols[1], pa.string()),
                    "seq": pa.array(cols[2], pa.int64()),
                    "ts": pa.array(cols[3], pa.timestamp("us", tz="UTC")),
                }
            )
            dups.update(self.store.stored_messages(kind, table))
            for i, h, source, seq, ts in later:
                if i in dups:
                    continue
                add_key(h)
                m = marks.get(source)
                if m is None:
                    marks[source] = [seq, ts]
                else:
                    m[0], m[1] = max(m[0], seq), max(m[1], ts)
        return dups

    def _forget_marks(self) -> None:
        """Drop every high-water mark (past DEDUP_MAX_STREAMS): from now on a stream without
        one is looked up in the store, never taken as new."""
        for marks in self._high.values():
            marks.clear()
        self._streams = 0
        self._high_complete = False

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

        def dedup(kind: str, keys: list[tuple[int, str, int, int]]) -> set[int]:
            return self._dedup(kind, keys, pending)

        with _gc_paused():
            decoded = self.decoder.decode_batch(items, dedup=dedup, window_us=window)
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
        return self._ingest(self._own(items), now)

    def _own(self, items: list[tuple[str, bytes]], count: bool = True) -> list[tuple[str, bytes]]:
        """``items`` less the messages of sources outside :attr:`accept` (counted ``foreign``
        when ``count``).

        Only a topic that is this site's ``dctwin/v1/<site>/<kind>/<source>`` with a contract
        kind can be foreign; any other topic goes on to validation (and its dead letter)."""
        accept = self.accept
        if accept is None:
            return items
        site = self.decoder.site
        kept = []
        for item in items:
            parts = item[0].split("/")
            if (
                len(parts) == 5
                and f"{parts[0]}/{parts[1]}" == TOPIC_PREFIX
                and parts[2] == site
                and parts[3] in KINDS
                and (parts[3], parts[4]) not in accept
            ):
                self.counters.foreign += count
                continue
            kept.append(item)
        return kept

    def _ingest(
        self,
        items: list[tuple[str, bytes]],
        now: datetime,
        dead: list[tuple[tuple[str, bytes], str]] | None = None,
    ) -> Batch:
        """Write ``items`` (and the ``ingest_error`` dead letters ``dead``: item, detail) in
        one transaction; a batch the store refuses is split in halves."""
        batch, pending = self._build(items, now)
        for item, detail in dead or ():
            self._dead(batch, pending, item, "ingest_error", detail, _epoch_us(now))
        pending.received += len(dead or ())
        try:
            self.store.write(batch)
        except Exception as e:
            if is_transient(e):
                raise StoreUnavailable(f"{type(e).__name__}: {e}") from e
            if dead and items:  # the dead letters on their own, then the messages as usual
                self._ingest([], now, dead)
                return self._ingest(items, now)
            if len(items) > 1:
                self.counters.store_splits += 1
                half = len(items) // 2
                first = self._ingest(items[:half], now)
                self._ingest(items[half:], now)
                return first
            if not items:
                raise StoreUnavailable(f"{type(e).__name__}: {e}") from e
            return self._store_rejected(items[0], e, now)
        self._commit(batch, pending)
        return batch

    def ingest_or_isolate(
        self, items: list[tuple[str, bytes]], received_at: datetime | None = None
    ) -> int:
        """:meth:`ingest`, falling back to :meth:`ingest_isolated` when the ingest itself fails
        (a bug): every valid message is stored whatever one message holds. Returns how many
        messages hit such a failure (dead-lettered ``ingest_error``); raises StoreUnavailable
        like :meth:`ingest`."""
        now = received_at or datetime.now(UTC)
        try:
            self.ingest(items, now)
        except StoreUnavailable:
            raise
        except Exception as e:
            log.error("the ingest failed on a batch (%s: %s); isolating", type(e).__name__, e)
            return self.ingest_isolated(items, now)
        return 0

    def ingest_isolated(
        self, items: list[tuple[str, bytes]], received_at: datetime | None = None
    ) -> int:
        """Ingest ``items`` after :meth:`ingest` failed on them for a reason that is neither the
        store's nor a bad message's (those are dead-lettered by reason): a bug. Each message is
        validated alone (nothing written) to find the ones the ingest fails on; those are
        dead-lettered as ``ingest_error`` with the error, and the others are written together
        with them in one transaction (split only if the store refuses it, as :meth:`ingest`
        does), so a bug costs one extra transaction, not one per message. Returns how many
        messages hit the bug. Raises StoreUnavailable like :meth:`ingest`. Messages of other
        shards are left out uncounted: :meth:`ingest` counted them."""
        now = received_at or datetime.now(UTC)
        ok: list[tuple[str, bytes]] = []
        failed: list[tuple[tuple[str, bytes], Exception]] = []
        for item in self._own(items, count=False):
            try:
                self._build([item], now)
            except Exception as e:
                failed.append((item, e))
            else:
                ok.append(item)
        if failed:
            item, e = failed[0]
            log.error(
                "the ingest failed on %d message(s), dead-lettered as ingest_error; the first,"
                " on %s:",
                len(failed),
                item[0][:200],
                exc_info=e,
            )
        dead = [(item, f"{type(e).__name__}: {e}") for item, e in failed]
        self._ingest(ok, now, dead=dead)
        return len(failed)

    def ingest_table(
        self,
        kind: str,
        table: pa.Table,
        seq: np.ndarray,
        collector: str,
        received_at: datetime | None = None,
        *,
        site: str | None = None,
    ) -> int:
        """Validate and write samples that are already columns, without a JSON round trip.

        ``table`` holds ts, source, id and quantities in contract units, one message per run of
        rows with the same (source, ``seq``, ts); ``seq`` is per row. The result is what
        :meth:`ingest` stores for the same messages: contract checks (:mod:`twin.ingest.columns`;
        a message with a suspect row goes through :meth:`ingest`, which names the reason and
        dead-letters it), dedup on (kind, source, seq, ts), unknown ids, the ingest log, one
        transaction; a batch the store refuses goes through :meth:`ingest` too (which splits
        it). ``site``: the site named in the topics of messages built for the message path
        (default: the ingest's site). Returns how many messages the table held.
        """
        site = site or self.decoder.site
        if site is None:
            raise ValueError("ingest_table needs a site: the Ingester's, or the site argument")
        now = received_at or datetime.now(UTC)
        n = table.num_rows
        if n == 0:
            return 0
        ts_us = table.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
        source = table.column("source").combine_chunks()
        change = np.ones(n, dtype=bool)
        change[1:] = (ts_us[1:] != ts_us[:-1]) | (seq[1:] != seq[:-1])
        if n > 1:
            change[1:] |= pc.not_equal(source[1:], source[:-1]).to_numpy(zero_copy_only=False)
        starts = np.flatnonzero(change)
        counts = np.diff(np.append(starts, n))
        flags = suspect_rows(kind, table, starts)
        lim, now_us = self.limits, _epoch_us(now)
        if lim.max_future_s:
            flags |= ts_us > now_us + int(lim.max_future_s * 1e6)
        if lim.max_past_s:
            flags |= ts_us < now_us - int(lim.max_past_s * 1e6)
        msg_bad = np.add.reduceat(flags.astype(np.int64), starts) > 0
        msg_src = source.take(pa.array(starts)).to_pylist()
        msg_seq = seq[starts].tolist()
        msg_ts = ts_us[starts].tolist()
        pending = _Pending()
        keep = ~msg_bad
        keys = list(zip(itertools.count(), msg_src, msg_seq, msg_ts))
        if not keep.all():
            keys = list(itertools.compress(keys, keep))
        dups = self._dedup(kind, keys, pending)
        if dups:
            pending.duplicates += len(dups)
            keep[np.fromiter(dups, dtype=np.int64, count=len(dups))] = False
        pending.received = int(keep.sum()) + pending.duplicates
        batch = self._table_batch(kind, table, keep, counts, msg_src, msg_seq, msg_ts, collector)
        batch.log["received_at"] = pa.array(
            np.full(len(batch.log["seq"]), now_us, dtype=np.int64), pa.timestamp("us", tz="UTC")
        )
        if self.site is not None:
            self._unknown(batch)
        try:
            self.store.write(batch)
        except Exception as e:
            if is_transient(e):
                raise StoreUnavailable(f"{type(e).__name__}: {e}") from e
            # the database refused it: the message path finds the message it refused
            msg_bad |= keep
            keep[:] = False
            pending = _Pending(duplicates=pending.duplicates, received=pending.duplicates)
            batch = Batch()
        self._commit(batch, pending)
        if msg_bad.any():
            items = _messages_of(kind, table, starts, counts, msg_bad, msg_seq, collector, site)
            self._ingest(items, now)
        return len(starts)

    @staticmethod
    def _table_batch(
        kind: str,
        table: pa.Table,
        keep: np.ndarray,
        counts: np.ndarray,
        msg_src: list[str],
        msg_seq: list[int],
        msg_ts: list[int],
        collector: str,
    ) -> Batch:
        """The batch of the kept messages' rows: samples, quantities the contract does not name
        (extras) and the ingest log (without received_at)."""
        rows = pa.array(np.repeat(keep, counts))
        sub = table.filter(rows) if not keep.all() else table
        schema = arrow_schema(kind)
        cols: dict[str, Any] = {}
        for f in schema:
            if f.name in sub.column_names:
                cols[f.name] = sub.column(f.name).combine_chunks().cast(f.type)
            else:
                cols[f.name] = pa.nulls(sub.num_rows, f.type)
        batch = Batch()
        batch.samples[kind] = cols
        for name in sub.column_names:
            if name in KEY_COLUMNS or name in schema.names:
                continue
            col = sub.column(name).combine_chunks()
            valid = col.is_valid()
            if not pc.any(valid).as_py():
                continue
            part = {k: cols[k].filter(valid) for k in KEY_COLUMNS}
            ex = batch.extras
            ex["ts"].extend(part["ts"].cast(pa.int64()).to_pylist())
            ex["source"].extend(part["source"].to_pylist())
            ex["id"].extend(part["id"].to_pylist())
            ex["value"].extend(col.filter(valid).cast(pa.float64()).to_pylist())
            ex["kind"].extend([kind] * len(part["id"]))
            ex["quantity"].extend([name] * len(part["id"]))
        idx = np.flatnonzero(keep)
        n_kept = len(idx)
        sources = pa.array(msg_src, pa.string())
        batch.log = {  # columns, as Store.write takes them
            "source": sources if n_kept == len(msg_src) else sources.take(pa.array(idx)),
            "kind": pa.array(np.full(n_kept, kind, dtype=object), pa.string()),
            "seq": pa.array(np.asarray(msg_seq, dtype=np.int64)[idx]),
            "ts": pa.array(np.asarray(msg_ts, dtype=np.int64)[idx], pa.timestamp("us", tz="UTC")),
            "received_at": [],
            "collector": pa.array(np.full(n_kept, collector, dtype=object), pa.string()),
            "n_samples": pa.array(counts[idx].astype(np.int32)),
        }
        return batch

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
        for kind, marks in pending.high.items():
            high = self._high.setdefault(kind, {})
            for source, (seq, ts) in marks.items():
                mark = high.get(source)
                if mark is None:
                    if self._streams >= DEDUP_MAX_STREAMS:  # forget them: look streams up
                        self._forget_marks()
                    self._streams += 1
                    high[source] = (seq, ts)
                elif seq > mark[0] or ts > mark[1]:
                    high[source] = (max(seq, mark[0]), max(ts, mark[1]))
        dead_seen = self._dead_seen
        for h in pending.dead_hashes:
            dead_seen[h] = None
        while len(dead_seen) > DEAD_REPEAT_MEMORY:
            dead_seen.popitem(last=False)


def _messages_of(
    kind: str,
    table: pa.Table,
    starts: np.ndarray,
    counts: np.ndarray,
    which: np.ndarray,
    msg_seq: list[int],
    collector: str,
    site: str,
) -> list[tuple[str, bytes]]:
    """The contract messages (topic, payload) of the runs ``which`` of ``table``, as
    :class:`collectors.base.MessageBuilder` builds them (a quantity that is None or NaN, a
    column's null, left out). An infinite value is written as JSON's ``Infinity`` token, which
    the message path refuses as ``non_finite`` (orjson would write a null: a value lost)."""
    items = []
    for j in np.flatnonzero(which):
        part = table.slice(int(starts[j]), int(counts[j])).to_pylist()
        first = part[0]
        samples = [
            {k: v for k, v in row.items() if k not in ("ts", "source") and v is not None and v == v}
            for row in part
        ]
        payload = encode(
            collector=collector,
            source=first["source"],
            seq=msg_seq[j],
            ts=first["ts"],
            samples=samples,
        )
        if any(type(v) is float and not math.isfinite(v) for s in samples for v in s.values()):
            body = orjson.loads(payload) | {"samples": samples}
            payload = json.dumps(body, separators=(",", ":"), allow_nan=True).encode()
        items.append((topic_for(site, kind, first["source"]), payload))
    return items


__all__ = [
    "IngestCounters",
    "IngestLimits",
    "Ingester",
    "OversizedPayload",
    "StoreUnavailable",
]
