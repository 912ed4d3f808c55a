"""Replay a bundle through the ingest path: over MQTT to a running service, or straight into a
separate store, at any speed.

Over MQTT the bundle's samples become contract messages again (one per source and timestamp,
as the collectors sent them; collector ``replay``), numbered by a fresh :class:`MessageBuilder`.
Into a store (:func:`replay_into`) the same messages stay columns: a time range of each kind at
a time goes to :meth:`twin.ingest.Ingester.ingest_table`, which applies the contract's rules
column-wise, dedups, records unknown ids and the ingest log, and sends any message it doubts
through the message path; what lands is what :func:`replay` with ``sink=Ingester.ingest``
stores, without a JSON round trip per message. ``shift_to_now`` moves the recording so that it
ends now (what a console watching a live service expects); otherwise the original timestamps
are kept (the target store must then accept old timestamps).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from collectors.base import MessageBuilder
from collectors.contract import KINDS
from collectors.mqtt import AckedPublisher, BrokerConfig, connect
from twin.replay.bundle import Bundle, TimeOrdered

if TYPE_CHECKING:
    from twin.ingest import Ingester

log = logging.getLogger(__name__)

Message = tuple[str, bytes]
#: progress callback: (rows done, recorded time reached)
Progress = Callable[[int, datetime], None]
#: The collector name replayed messages carry.
COLLECTOR = "replay"
_US = timedelta(microseconds=1)


def messages(
    bundle: Bundle, *, shift_s: float = 0.0, chunk_s: float = 600.0
) -> Iterator[tuple[datetime, list[Message], int]]:
    """(timestamp, messages, samples in them) per recorded timestamp, in time order, every kind
    interleaved.

    Works through the recording ``chunk_s`` at a time, so memory stays bounded.
    """
    builder = MessageBuilder(bundle.manifest.site, COLLECTOR, seq_start=0)
    tables: dict[str, pa.Table] = {}
    ts_us: dict[str, np.ndarray] = {}
    for kind in KINDS:
        if kind in bundle.manifest.rows:
            t = bundle.table(kind)
            us = t.column("ts").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
            src = t.column("source").to_numpy(zero_copy_only=False)
            order = np.lexsort((src, us))
            tables[kind] = t.take(pa.array(order))
            ts_us[kind] = us[order]
    if not tables:
        return
    lo_us = min(int(a[0]) for a in ts_us.values() if len(a))
    hi_us = max(int(a[-1]) for a in ts_us.values() if len(a))
    shift = timedelta(seconds=shift_s)
    step = int(chunk_s * 1e6)
    for c0 in range(lo_us, hi_us + 1, step):
        cols = {}
        for kind, us in ts_us.items():
            a, b = np.searchsorted(us, [c0, c0 + step])
            if b > a:
                cols[kind] = tables[kind].slice(a, b - a).to_pydict()
        pos = dict.fromkeys(cols, 0)
        while True:
            nxt = [cols[k]["ts"][pos[k]] for k in cols if pos[k] < len(cols[k]["ts"])]
            if not nxt:
                break
            now = min(nxt)
            out: list[Message] = []
            rows = 0
            for kind, c in cols.items():
                names = [q for q in c if q not in ("ts", "source", "id")]
                i, n = pos[kind], len(c["ts"])
                while i < n and c["ts"][i] == now:
                    source = c["source"][i]
                    samples = []
                    while i < n and c["ts"][i] == now and c["source"][i] == source:
                        samples.append({"id": c["id"][i], **{q: c[q][i] for q in names}})
                        i += 1
                    out.append(builder.message(kind, source, samples, now + shift))
                    rows += len(samples)
                pos[kind] = i
            yield now + shift, out, rows


def replay(
    bundle: Bundle,
    *,
    sink: Callable[[list[Message]], None] | None = None,
    broker: BrokerConfig | None = None,
    speed: float = 0.0,
    shift_to_now: bool = False,
    stop: threading.Event | None = None,
    batch_messages: int = 20_000,
    on_progress: Progress | None = None,
) -> dict[str, object]:
    """Feed a bundle as contract messages to ``sink`` (e.g. ``Ingester.ingest``) or publish it
    to ``broker``.

    ``speed``: recorded seconds per wall second (600: ten minutes a second); 0 as fast as
    possible. Returns counts and timings.
    """
    if (sink is None) == (broker is None):
        raise ValueError("replay needs exactly one of sink or broker")
    stop = stop or threading.Event()
    m = bundle.manifest
    shift_s = (datetime.now(UTC) - m.end).total_seconds() if shift_to_now else 0.0
    pub: AckedPublisher | None = None
    if broker is not None:
        pub = AckedPublisher(connect(broker, f"dctwin-replay-{m.site}-{id(bundle):x}"), broker)
    pending: list[Message] = []
    sent = rows_done = 0
    t0 = time.monotonic()
    first: datetime | None = None
    try:
        for ts, msgs, rows in messages(bundle, shift_s=shift_s):
            if stop.is_set():
                break
            first = first or ts
            if speed > 0:
                wait = t0 + (ts - first).total_seconds() / speed - time.monotonic()
                if wait > 0:
                    if sink is not None and pending:
                        sink(pending)
                        pending = []
                    if stop.wait(wait):
                        break
            if pub is not None:
                for topic, payload in msgs:
                    pub.publish(topic, payload)  # waits for PUBACKs past the in-flight bound
            else:
                pending.extend(msgs)
                if len(pending) >= batch_messages:
                    sink(pending)  # type: ignore[misc]
                    pending = []
            sent += len(msgs)
            rows_done += rows
            if on_progress:  # in recorded time
                on_progress(rows_done, ts - timedelta(seconds=shift_s))
        if sink is not None and pending:
            sink(pending)
        if pub is not None:
            pub.flush(5.0 if stop.is_set() else 300.0)
    finally:
        if pub is not None:
            pub.close()
    return {
        "messages": sent,
        "rows": rows_done,
        "recorded_s": (m.end - m.start).total_seconds(),
        "wall_s": round(time.monotonic() - t0, 3),
        "shift_s": round(shift_s, 3),
    }


def replay_into(
    bundle: Bundle,
    ingester: Ingester,
    *,
    speed: float = 0.0,
    shift_to_now: bool = False,
    stop: threading.Event | None = None,
    chunk_s: float = 3600.0,
    on_progress: Progress | None = None,
) -> dict[str, object]:
    """Ingest a bundle into ``ingester``'s store column-wise, ``chunk_s`` of recording at a time.

    Stores what :func:`replay` with ``sink=ingester.ingest`` stores: the same messages (one per
    kind, source and timestamp, ``seq`` from 0 per (kind, source), collector ``replay``, the
    timestamp at the message's millisecond precision) under the same rules. As fast as possible
    (``speed`` 0), one kind after another, so that one kind's table is in memory at a time; at
    ``speed`` > 0 every kind in step, each chunk (at most ``speed`` recorded seconds, one wall
    second) written once the wall clock reaches its last timestamp.
    """
    stop = stop or threading.Event()
    m = bundle.manifest
    shift_s = (datetime.now(UTC) - m.end).total_seconds() if shift_to_now else 0.0
    shift_us = timedelta(seconds=shift_s) // _US
    kinds = [k for k in KINDS if k in m.rows]
    site = m.site
    totals = {"messages": 0, "rows": 0}
    t0 = time.monotonic()

    def feed(tab: TimeOrdered, base: np.ndarray, lo: int, hi: int) -> None:
        a, b = tab.span(lo, hi)
        if b <= a:
            return
        table, seq = _chunk(tab, base, a, b, shift_us)
        totals["messages"] += ingester.ingest_table(tab.kind, table, seq, COLLECTOR, site=site)
        totals["rows"] += b - a
        if on_progress:
            on_progress(totals["rows"], _EPOCH + timedelta(microseconds=int(tab.ts_us[b - 1])))

    if speed > 0:
        tabs = [t for t in (bundle.time_ordered(k) for k in kinds) if len(t.ts_us)]
        bases = [np.zeros(t.sources, dtype=np.int64) for t in tabs]
        lo_us = min((int(t.ts_us[0]) for t in tabs), default=0)
        hi_us = max((int(t.ts_us[-1]) + 1 for t in tabs), default=0)
        step = max(1, int(min(chunk_s, speed) * 1e6))  # at most one wall second a chunk
        for c0 in range(lo_us, hi_us, step):
            last = max(_last_before(t, c0 + step) for t in tabs)
            if stop.wait(max(0.0, t0 + (last - lo_us) / 1e6 / speed - time.monotonic())):
                break
            for tab, base in zip(tabs, bases, strict=True):
                feed(tab, base, c0, c0 + step)
    else:
        for kind in kinds:
            if stop.is_set():
                break
            tab = bundle.time_ordered(kind)
            if not len(tab.ts_us):
                continue
            base = np.zeros(tab.sources, dtype=np.int64)
            step = max(1, int(chunk_s * 1e6))
            for c0 in range(int(tab.ts_us[0]), int(tab.ts_us[-1]) + 1, step):
                if stop.is_set():
                    break
                feed(tab, base, c0, c0 + step)
            del tab
    return {
        **totals,
        "recorded_s": (m.end - m.start).total_seconds(),
        "wall_s": round(time.monotonic() - t0, 3),
        "shift_s": round(shift_s, 3),
    }


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _last_before(tab: TimeOrdered, hi_us: int) -> int:
    """The last timestamp before ``hi_us`` of ``tab`` (its first when there is none)."""
    i = int(np.searchsorted(tab.ts_us, hi_us)) - 1
    return int(tab.ts_us[max(i, 0)]) if len(tab.ts_us) else 0


def _chunk(
    tab: TimeOrdered, base: np.ndarray, a: int, b: int, shift_us: int
) -> tuple[pa.Table, np.ndarray]:
    """Rows [a, b) of ``tab`` as the messages :func:`messages` builds: the table (timestamps
    shifted and cut to milliseconds, as a message carries them) and each row's ``seq``, counted
    from 0 per source on from ``base`` (updated)."""
    us = tab.ts_us[a:b]
    code = tab.source_code[a:b]
    n = b - a
    change = np.ones(n, dtype=bool)
    change[1:] = (us[1:] != us[:-1]) | (code[1:] != code[:-1])
    starts = np.flatnonzero(change)
    msg_code = code[starts]
    order = np.argsort(msg_code, kind="stable")
    sorted_code = msg_code[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_code[1:] != sorted_code[:-1]
    group_start = np.flatnonzero(first)
    within = np.arange(len(order)) - np.repeat(
        group_start, np.diff(np.append(group_start, len(order)))
    )
    msg_seq = np.empty(len(order), dtype=np.int64)
    msg_seq[order] = base[sorted_code] + within
    base += np.bincount(msg_code, minlength=len(base))
    seq = np.repeat(msg_seq, np.diff(np.append(starts, n)))
    table = tab.rows(a, b)
    ts = ((us + shift_us) // 1000) * 1000  # a message's ts has millisecond precision
    table = table.set_column(0, "ts", pa.array(ts, type=pa.timestamp("us", tz="UTC")))
    return table, seq
