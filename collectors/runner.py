"""The collector runner: poll on a schedule, spool to disk, publish at QoS 1, drain in order.

Every message a collector returns is first appended to an on-disk spool
(:mod:`collectors.spool`, write-ahead), then published from the spool, oldest first, with at
most ``max_inflight`` messages unacknowledged. A message leaves the spool only when the broker's
PUBACK for it arrives (paho's ``on_publish`` with its ``mid``), so:

- while the broker is away (down, unreachable, refusing us), messages wait on disk; when it
  returns they go out in order, before any newer message;
- a message the broker acknowledged is never sent again by this process. Messages sent but not
  acknowledged when the connection dropped are sent again (QoS 1 is at-least-once; the ingest
  stores a repeated (kind, source, seq, ts) once). After a crash or power loss the saved cursor
  may be a little behind, and those messages go out again too;
- the spool survives a restart: the next runner on the same directory sends what is left;
- the spool is bounded (``spool_max_bytes``); when full, new messages are dropped
  (drop-newest), counted in ``dropped`` and logged as an error once per full spell.

Connection: :func:`collectors.mqtt.connect` (MQTT v5 with a 3.1.1 fallback, clean session: the
spool, not the broker, keeps what is unsent). After a failed attempt or a lost connection the
runner waits ``reconnect_min_s``, doubling up to ``reconnect_max_s`` (4 s: back within 5 s of the
broker's return), each wait jittered to [0.5, 1] of it, before the next attempt; the back-off
starts again from the minimum once connected.

Counters (:class:`RunnerStats`): ``produced`` messages the collector gave and the spool took,
``published`` acknowledged by the broker, ``spooled`` produced while the broker was not
connected (waited on disk), ``dropped`` refused by a full spool, ``rejected`` acknowledged with
an MQTT v5 failure reason (not retried), ``pending`` in the spool now, ``polls`` and
``poll_errors``, ``connects``, ``connect_attempts``, ``connect_failures`` and ``disconnects``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import re
import socket
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from pydantic import BaseModel, ConfigDict, Field

from collectors.base import Collector, CollectorError
from collectors.mqtt import (
    RECONNECT_MAX_S,
    RECONNECT_MIN_S,
    BrokerConfig,
    BrokerError,
    connect,
    jittered,
)
from collectors.spool import Position, Record, Spool

log = logging.getLogger(__name__)

__all__ = ["Runner", "RunnerConfig", "RunnerStats"]


class RunnerConfig(BaseModel):
    """How a collector runs: poll interval, spool and connection policy."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=1.0, gt=0, description="seconds between polls")
    spool_dir: Path = Field(description="spool directory (one runner per directory)")
    spool_max_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="bound on unsent messages [bytes]"
    )
    spool_segment_bytes: int | None = Field(default=None, gt=0)
    fsync: bool = Field(default=True, description="fsync the spool once per poll")
    max_inflight: int = Field(default=100, ge=1, description="unacknowledged messages at most")
    reconnect_min_s: float = Field(default=RECONNECT_MIN_S / 2, gt=0)
    reconnect_max_s: float = Field(default=RECONNECT_MAX_S, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    drain_on_stop_s: float = Field(
        default=5.0, ge=0, description="on stop, wait this long for the spool to empty"
    )
    client_id: str | None = Field(default=None, description="MQTT client id (default: unique)")


@dataclass
class RunnerStats:
    """Counters of one runner (see the module docstring)."""

    polls: int = 0
    poll_errors: int = 0
    produced: int = 0
    published: int = 0
    spooled: int = 0
    dropped: int = 0
    rejected: int = 0
    pending: int = 0
    connected: bool = False
    connects: int = 0
    connect_attempts: int = 0
    connect_failures: int = 0
    disconnects: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Inflight:
    record: Record
    mid: int = -1
    acked: bool = False
    rejected: bool = False


@dataclass
class _Conn:
    client: mqtt.Client
    gen: int
    lost: threading.Event = field(default_factory=threading.Event)


def _default_client_id(collector: Collector) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", getattr(collector, "name", "collector"))[:40]
    return f"dctwin-{base}-{socket.gethostname()[:24]}-{os.getpid()}"


class Runner:
    """Runs one collector: a poll thread feeding the spool and a send thread draining it.

    Use :meth:`start` / :meth:`stop` (or the context manager), or :meth:`run` until an event.
    The runner does not close the collector; its owner does.
    """

    def __init__(self, collector: Collector, broker: BrokerConfig, config: RunnerConfig):
        self.collector = collector
        self.broker = broker
        self.config = config
        self.client_id = config.client_id or _default_client_id(collector)
        self.spool = Spool(
            config.spool_dir,
            max_bytes=config.spool_max_bytes,
            segment_bytes=config.spool_segment_bytes,
            fsync=config.fsync,
        )
        self._stats = RunnerStats(pending=self.spool.pending)
        self._stats_lock = threading.Lock()
        self._wake = threading.Event()
        self._poll_stop = threading.Event()
        self._send_stop = threading.Event()
        self._acks: queue.SimpleQueue[tuple[int, int, Any]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._full_since_dropped: int | None = None
        self._last_poll_error: str | None = None
        self._conn: _Conn | None = None

    # -- public ---------------------------------------------------------------------------------

    @property
    def stats(self) -> RunnerStats:
        """A snapshot of the counters."""
        with self._stats_lock:
            s = RunnerStats(**asdict(self._stats))
        s.pending = self.spool.pending
        return s

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return bool(self._threads)

    def start(self, *, poll: bool = True) -> None:
        """Start the send thread and (``poll``) the poll thread."""
        if self._threads:
            raise RuntimeError("runner already started")
        sender = threading.Thread(target=self._send_loop, name="dctwin-send", daemon=True)
        self._threads.append(sender)
        sender.start()
        if poll:
            poller = threading.Thread(target=self._poll_loop, name="dctwin-poll", daemon=True)
            self._threads.append(poller)
            poller.start()

    def stop(self, drain_s: float | None = None) -> RunnerStats:
        """Stop polling, give the sender ``drain_s`` (default ``drain_on_stop_s``) to empty the
        spool while connected, then disconnect and close the spool. Returns the counters."""
        self._poll_stop.set()
        for t in self._threads:
            if t.name == "dctwin-poll":
                t.join()
        drain = self.config.drain_on_stop_s if drain_s is None else drain_s
        deadline = time.monotonic() + drain
        while self._threads and self.spool.pending and time.monotonic() < deadline:
            if not self.stats.connected:
                break  # the broker is away: what is left waits on disk for the next run
            time.sleep(0.02)
        self._send_stop.set()
        self._wake.set()
        for t in self._threads:
            t.join()
        self._threads.clear()
        stats = self.stats
        self.spool.close()
        return stats

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until the spool is empty (all acknowledged); True if it is."""
        deadline = time.monotonic() + timeout_s
        while self.spool.pending and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.spool.pending == 0

    def run(self, stop: threading.Event) -> RunnerStats:
        """Start, run until ``stop`` is set, then stop."""
        self.start()
        try:
            stop.wait()
        finally:
            stats = self.stop()
        return stats

    def __enter__(self) -> Runner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._threads:
            self.stop()
        else:
            self.spool.close()

    # -- polling --------------------------------------------------------------------------------

    def poll_once(self) -> int:
        """Poll the collector once and spool its messages; how many the spool took."""
        with self._stats_lock:
            self._stats.polls += 1
        try:
            messages = self.collector.poll()
        except CollectorError as e:
            with self._stats_lock:
                self._stats.poll_errors += 1
            text = str(e)
            level = logging.DEBUG if text == self._last_poll_error else logging.WARNING
            log.log(level, "%s: poll failed: %s", self.collector.name, text)
            self._last_poll_error = text
            return 0
        except Exception:
            with self._stats_lock:
                self._stats.poll_errors += 1
            log.exception("%s: poll raised", self.collector.name)
            return 0
        if self._last_poll_error is not None:
            log.info("%s: polls again", self.collector.name)
            self._last_poll_error = None
        return self.submit(messages)

    def submit(self, messages: list[tuple[str, bytes]]) -> int:
        """Spool ``messages`` for publishing (one fsync for all); how many the spool took."""
        taken = dropped = 0
        for topic, payload in messages:
            if self.spool.append(topic, payload):
                taken += 1
            else:
                dropped += 1
        self.spool.flush()
        with self._stats_lock:
            self._stats.produced += taken
            self._stats.dropped += dropped
            if not self._stats.connected:
                self._stats.spooled += taken
            total_dropped = self._stats.dropped
        if dropped:
            if self._full_since_dropped is None:
                self._full_since_dropped = total_dropped - dropped
                log.error(
                    "spool %s is full (%.1f MiB of unsent messages, limit %.1f MiB): dropping "
                    "NEW messages (drop-newest) until the broker takes the backlog",
                    self.spool.directory,
                    self.spool.used_bytes / 2**20,
                    self.config.spool_max_bytes / 2**20,
                )
        elif self._full_since_dropped is not None and taken:
            log.warning(
                "spool %s has room again; %d message(s) were dropped while it was full",
                self.spool.directory,
                total_dropped - self._full_since_dropped,
            )
            self._full_since_dropped = None
        self._wake.set()
        return taken

    def _poll_loop(self) -> None:
        interval = self.config.interval_s
        t0 = time.monotonic()
        k = 0
        while not self._poll_stop.is_set():
            self.poll_once()
            k += 1
            now = time.monotonic()
            due = t0 + k * interval
            if due < now:  # the poll overran: skip the missed ticks, keep the phase
                skipped = math.ceil((now - due) / interval)
                log.debug("%s: poll overran; skipping %d tick(s)", self.collector.name, skipped)
                k += skipped
                due = t0 + k * interval
            self._poll_stop.wait(max(0.0, due - now))

    # -- sending --------------------------------------------------------------------------------

    def _connect(self, gen: int) -> _Conn:
        client = connect(self.broker, self.client_id, timeout_s=self.config.connect_timeout_s)
        conn = _Conn(client, gen)
        # The runner reconnects itself (with its spool); keep paho's own retry out of the way.
        client.reconnect_delay_set(min_delay=3600, max_delay=3600)

        def on_publish(c, userdata, mid, reason_code, properties, _g=gen):
            self._acks.put((_g, mid, reason_code))
            self._wake.set()

        def on_disconnect(c, userdata, flags, reason_code, properties, _conn=conn):
            _conn.lost.set()
            self._wake.set()

        client.on_publish = on_publish
        client.on_disconnect = on_disconnect
        if not client.is_connected():
            conn.lost.set()
        return conn

    @staticmethod
    def _teardown(conn: _Conn) -> None:
        with contextlib.suppress(Exception):  # the socket may already be gone
            conn.client.disconnect()
        conn.client.loop_stop()

    def _send_loop(self) -> None:
        cfg = self.config
        gen = 0
        conn: _Conn | None = None
        inflight: deque[_Inflight] = deque()
        by_mid: dict[int, _Inflight] = {}
        read_pos: Position | None = None
        backoff = cfg.reconnect_min_s
        next_attempt = 0.0
        failures = 0
        try:
            while not self._send_stop.is_set():
                if conn is None:
                    now = time.monotonic()
                    if now < next_attempt:
                        self._send_stop.wait(min(next_attempt - now, 0.5))
                        continue
                    with self._stats_lock:
                        self._stats.connect_attempts += 1
                    try:
                        conn = self._connect(gen + 1)
                    except BrokerError as e:
                        failures += 1
                        with self._stats_lock:
                            self._stats.connect_failures += 1
                        if failures == 1:
                            log.warning(
                                "%s; spooling to %s and retrying (backoff %.1f..%.0f s)",
                                e,
                                self.spool.directory,
                                cfg.reconnect_min_s,
                                cfg.reconnect_max_s,
                            )
                        else:
                            log.debug("reconnect attempt %d failed: %s", failures, e)
                        next_attempt = time.monotonic() + jittered(backoff)
                        backoff = min(backoff * 2, cfg.reconnect_max_s)
                        continue
                    gen += 1
                    self._conn = conn
                    backoff = cfg.reconnect_min_s
                    by_mid.clear()
                    with self._stats_lock:
                        self._stats.connected = True
                        self._stats.connects += 1
                    waiting = self.spool.pending
                    if failures or self._stats.connects > 1:
                        log.info(
                            "broker %s back after %d failed attempt(s); draining %d message(s)",
                            self.broker.describe(),
                            failures,
                            waiting,
                        )
                    failures = 0
                    # Resend, in order, what was sent but not acknowledged on the last connection.
                    for e in inflight:
                        if e.acked:
                            continue
                        info = conn.client.publish(e.record.topic, e.record.payload, qos=1)
                        if info.rc != mqtt.MQTT_ERR_SUCCESS:
                            conn.lost.set()
                            break
                        e.mid = info.mid
                        by_mid[info.mid] = e

                self._wake.clear()
                self._take_acks(gen, by_mid)
                self._commit(inflight)

                if conn.lost.is_set() or not conn.client.is_connected():
                    self._teardown(conn)
                    conn = None
                    self._conn = None
                    with self._stats_lock:
                        self._stats.connected = False
                        self._stats.disconnects += 1
                    log.warning(
                        "lost the broker %s; spooling to %s (%d unacknowledged will be resent)",
                        self.broker.describe(),
                        self.spool.directory,
                        sum(1 for e in inflight if not e.acked),
                    )
                    next_attempt = time.monotonic() + jittered(backoff)
                    backoff = min(backoff * 2, cfg.reconnect_max_s)
                    continue

                room = cfg.max_inflight - len(inflight)
                if room > 0:
                    for rec in self.spool.read(read_pos, limit=room):
                        info = conn.client.publish(rec.topic, rec.payload, qos=1)
                        if info.rc != mqtt.MQTT_ERR_SUCCESS:
                            conn.lost.set()
                            break
                        e = _Inflight(rec, info.mid)
                        inflight.append(e)
                        by_mid[info.mid] = e
                        read_pos = rec.end
                self._wake.wait(0.5)
        finally:
            if conn is not None:
                self._take_acks(gen, by_mid)
                self._commit(inflight)
                self._teardown(conn)
                self._conn = None
            with self._stats_lock:
                self._stats.connected = False

    def _take_acks(self, gen: int, by_mid: dict[int, _Inflight]) -> None:
        while True:
            try:
                g, mid, reason = self._acks.get_nowait()
            except queue.Empty:
                return
            if g != gen:
                continue  # an acknowledgement from an earlier connection
            e = by_mid.pop(mid, None)
            if e is None:
                continue
            e.acked = True
            if getattr(reason, "is_failure", False):
                e.rejected = True
                with self._stats_lock:
                    self._stats.rejected += 1
                log.error(
                    "broker rejected a message on %s: %s (not retried)", e.record.topic, reason
                )

    def _commit(self, inflight: deque[_Inflight]) -> None:
        n = ok = 0
        end: Position | None = None
        while inflight and inflight[0].acked:
            e = inflight.popleft()
            end = e.record.end
            n += 1
            ok += not e.rejected
        if end is not None:
            self.spool.commit(end, n)
            with self._stats_lock:
                self._stats.published += ok
