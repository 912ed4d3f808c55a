"""Replay a bundle through the ingest path: over MQTT to a running service, or straight into a
separate store, at any speed.

The bundle's samples become contract messages again (one per source and timestamp, as the
collectors sent them; collector ``replay``), numbered by a fresh :class:`MessageBuilder`, and
go through the same validation and store as live telemetry. ``shift_to_now`` moves the
recording so that it ends now (what a console watching a live service expects); otherwise the
original timestamps are kept (the target store must then accept old timestamps).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa

from collectors.base import MessageBuilder
from collectors.contract import KINDS
from collectors.mqtt import AckedPublisher, BrokerConfig, connect
from twin.replay.bundle import Bundle

log = logging.getLogger(__name__)

Message = tuple[str, bytes]


def messages(
    bundle: Bundle, *, shift_s: float = 0.0, chunk_s: float = 600.0
) -> Iterator[tuple[datetime, list[Message]]]:
    """(timestamp, messages) per recorded timestamp, in time order, every kind interleaved.

    Works through the recording ``chunk_s`` at a time, so memory stays bounded.
    """
    builder = MessageBuilder(bundle.manifest.site, "replay", seq_start=0)
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
                pos[kind] = i
            yield now + shift, out


def replay(
    bundle: Bundle,
    *,
    sink: Callable[[list[Message]], None] | None = None,
    broker: BrokerConfig | None = None,
    speed: float = 0.0,
    shift_to_now: bool = False,
    stop: threading.Event | None = None,
    batch_messages: int = 20_000,
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, object]:
    """Feed a bundle to ``sink`` (e.g. ``Ingester.ingest``) or publish it to ``broker``.

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
    sent = 0
    t0 = time.monotonic()
    first: datetime | None = None
    try:
        for ts, msgs in messages(bundle, shift_s=shift_s):
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
            if on_progress:
                on_progress(sent)
        if sink is not None and pending:
            sink(pending)
        if pub is not None:
            pub.flush(5.0 if stop.is_set() else 300.0)
    finally:
        if pub is not None:
            pub.close()
    return {
        "messages": sent,
        "recorded_s": (m.end - m.start).total_seconds(),
        "wall_s": round(time.monotonic() - t0, 3),
        "shift_s": round(shift_s, 3),
    }
