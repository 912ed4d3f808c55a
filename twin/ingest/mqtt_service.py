"""The MQTT half of ``dctwin serve``: subscribe, batch, write, then acknowledge.

paho-mqtt 2.x with a persistent session and manual acknowledgement: a QoS 1 message is
PUBACKed only after the transaction that stored it (or dead-lettered it) has committed. If the
service dies between receipt and commit, the broker redelivers the message; the ingester's
(source, seq, ts) dedup stores it once. So nothing is lost across a restart and nothing is
stored twice.

By default the paho client runs in a child process (``twin.ingest.receiver``) that forwards
messages in batches and applies the acks this process sends back after each commit, so that
receiving and validating/writing use two cores instead of sharing one interpreter lock. If the
child dies, it is restarted and the broker redelivers what was not acknowledged; if this process
dies, the child sees the pipe close and exits. ``ServiceOptions(receiver_process=False)`` keeps
the client in this process.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import paho.mqtt.client as mqtt

from collectors.contract import TOPIC_PREFIX
from collectors.mqtt import BrokerConfig, BrokerError, connect
from twin.health import ServiceHealth
from twin.ingest import receiver as rcv
from twin.ingest.ingester import Ingester, StoreUnavailable

log = logging.getLogger(__name__)

#: How long ``start()`` waits for the receiver process to connect [s] (spawn + CONNACK).
RECEIVER_START_TIMEOUT_S = 60.0

_live_receivers: set[BaseProcess] = set()
_exit_hook: list[bool] = []


def _kill_receivers() -> None:
    """At exit without ``stop()``: kill receiver children (they ignore SIGTERM, and
    multiprocessing would terminate and then join them forever). Unacked: redelivered."""
    for proc in list(_live_receivers):
        if proc.is_alive():
            proc.kill()
            proc.join(5)


@dataclass(frozen=True)
class ServiceOptions:
    client_id: str = "dctwin-ingest"
    share_group: str | None = None
    flush_interval_s: float = 0.25
    max_batch_messages: int = 20_000
    rollup_interval_s: float = 60.0
    retention_days: float | None = None
    #: History off the box (twin/store/history.py): export closed hours as Parquet to this
    #: directory or URL (pyarrow.fs) every ``export_every_s``; retention then deletes exported
    #: hours only.
    export_to: str | None = None
    export_every_s: float = 300.0
    export_shard: str = "main"
    export_grace_s: float = 300.0
    stats_interval_s: float = 10.0
    #: Receive in a child process (default) or in a paho thread of this process.
    receiver_process: bool = True
    #: The child forwards what it has at least this often [s] ...
    forward_interval_s: float = 0.02
    #: ... in frames of at most this many messages ...
    forward_max_messages: int = 2000
    #: ... and about this many bytes.
    forward_max_bytes: int = 8 << 20
    #: MQTT v5 Receive Maximum: the broker sends at most this many unacknowledged QoS 1
    #: messages (they are acknowledged after their commit), which bounds what the receiver and
    #: this process hold when the store is slow or failing (MQTT 3.1.1: the broker's
    #: ``max_inflight_messages`` does the same).
    receive_maximum: int = 50_000
    #: The topic filters to subscribe to (a shard's, twin.site.shards); empty: every topic of
    #: the contract (``dctwin/v1/#``).
    topics: tuple[str, ...] = ()

    @property
    def topic(self) -> str:
        """What is subscribed, in words: the one filter, or how many a shard has."""
        subs = self.subscriptions
        return subs[0] if len(subs) == 1 else f"{len(subs)} topic filters ({subs[0]} ...)"

    @property
    def subscriptions(self) -> list[str]:
        """The topic filters subscribed to, each under ``$share/<group>/`` with a share group."""
        base = list(self.topics) or [f"{TOPIC_PREFIX}/#"]
        if self.share_group:
            return [f"$share/{self.share_group}/{t}" for t in base]
        return base


class _Receiver:
    """This process's handle on one receiver child; ``gen`` tags the messages it forwarded."""

    def __init__(self, gen: int, process: BaseProcess, conn: Connection):
        self.gen = gen
        self.process = process
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, frame: bytes) -> bool:
        """Send a frame; False when the child is gone (its acks no longer matter)."""
        with self.lock:
            try:
                self.conn.send_bytes(frame)
                return True
            except (OSError, ValueError):
                return False

    def close(self) -> None:
        with self.lock:
            self.conn.close()
        if not self.process.is_alive():
            _live_receivers.discard(self.process)


class MqttIngestService:
    """Run with ``start()``; ``stop()`` flushes, acknowledges and disconnects."""

    def __init__(
        self,
        broker: BrokerConfig,
        ingester: Ingester,
        options: ServiceOptions,
        health: ServiceHealth | None = None,
    ):
        self.broker = broker
        self.ingester = ingester
        self.options = options
        self.health = health if health is not None else ServiceHealth()
        self.health.register("ingest")
        # (topic, payload, mid, qos, receiver generation); generation 0 in in-process mode
        self._pending: deque[tuple[str, bytes, int, int, int]] = deque()
        # (arrival time [monotonic s], messages still pending of that arrival), oldest first
        self._arrivals: deque[list[float | int]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: mqtt.Client | None = None
        self._rx: _Receiver | None = None
        self._reader: threading.Thread | None = None
        self._closing = False
        self._life = threading.Lock()  # receiver restarts against stop()
        self._drained = threading.Event()
        self._gens = 0
        self.write_errors = 0
        self.disconnects = 0
        self.receiver_restarts = 0
        self.last_error: str | None = None

    @property
    def connected(self) -> bool | None:
        """Whether the broker connection is up (None before the first attempt)."""
        return self.health.broker.connected

    def _arrived(self, n: int) -> None:
        if n:
            self._arrivals.append([time.monotonic(), n])
            if len(self._arrivals) == 1:
                self.health.pending(self._arrivals[0][0])  # type: ignore[arg-type]

    def _taken(self, n: int) -> None:
        """``n`` of the oldest pending messages were handled (stored, dead-lettered or dup)."""
        arrivals = self._arrivals
        while n > 0 and arrivals:
            first = arrivals[0]
            k = min(n, int(first[1]))
            first[1] -= k
            n -= k
            if first[1] <= 0:
                arrivals.popleft()
        self.health.pending(arrivals[0][0] if arrivals else None)  # type: ignore[arg-type]

    @property
    def receiver_pid(self) -> int | None:
        """Process id of the receiver child (None in in-process mode or between restarts)."""
        rx = self._rx
        return rx.process.pid if rx is not None else None

    # ---- in-process receiving ------------------------------------------------------------

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self._pending.append((msg.topic, rcv.cut_oversized(msg.payload), msg.mid, msg.qos, 0))
        self._arrived(1)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        if not self._stop.is_set():
            self._lost_broker(str(reason_code))

    def _on_reconnect(self, client, userdata, flags, reason_code, properties) -> None:
        if not reason_code.is_failure:
            self._back()

    def _lost_broker(self, reason: str) -> None:
        self.disconnects += 1
        self.health.broker_down(reason)
        log.warning(
            "lost the broker at %s (%s); paho reconnects, and the broker redelivers"
            " unacknowledged messages (stored once)",
            self.broker.describe(),
            reason,
        )

    def _back(self) -> None:
        if self.health.broker.connected is False:
            log.warning("the broker connection to %s is back", self.broker.describe())
        self.health.broker_up()

    # ---- receiver child --------------------------------------------------------------------

    def _spawn(self) -> _Receiver:
        """Start a receiver child and wait until it is connected; BrokerError if it can't."""
        opts = self.options
        ctx = mp.get_context("spawn")
        here, there = ctx.Pipe(duplex=True)
        self._gens += 1
        ropts = rcv.ReceiverOptions(
            client_id=opts.client_id,
            topics=tuple(opts.subscriptions),
            forward_interval_s=opts.forward_interval_s,
            forward_max_messages=opts.forward_max_messages,
            forward_max_bytes=opts.forward_max_bytes,
            receive_maximum=opts.receive_maximum,
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        proc = ctx.Process(
            target=rcv.receiver_main,
            args=(there, self.broker, ropts),
            name="dctwin-mqtt-receiver",
            daemon=True,
        )
        proc.start()
        if not _exit_hook:  # registered after multiprocessing's own hook, so it runs first
            atexit.register(_kill_receivers)
            _exit_hook.append(True)
        _live_receivers.add(proc)
        there.close()  # so that this end sees EOF when the child dies
        rx = _Receiver(self._gens, proc, here)
        deadline = time.monotonic() + RECEIVER_START_TIMEOUT_S
        try:
            while True:
                if not here.poll(max(0.0, min(0.5, deadline - time.monotonic()))):
                    if time.monotonic() >= deadline:
                        raise BrokerError(
                            f"MQTT receiver for {self.broker.describe()} did not connect within"
                            f" {RECEIVER_START_TIMEOUT_S:.0f} s"
                        )
                    continue
                try:
                    frame = here.recv_bytes()
                except (EOFError, OSError):
                    proc.join(5)
                    raise BrokerError(
                        f"MQTT receiver for {self.broker.describe()} exited with code"
                        f" {proc.exitcode} before connecting"
                    ) from None
                kind = frame[:1]
                if kind == rcv.CONNECTED:
                    log.info("MQTT receiver process pid %d connected", proc.pid)
                    self._back()
                    return rx
                if kind == rcv.ERROR:
                    raise BrokerError(frame[1:].decode(errors="replace"))
                self._handle(frame, rx)
        except BaseException:
            proc.join(1)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            rx.close()
            raise

    def _handle(self, frame: bytes, rx: _Receiver) -> None:
        kind = frame[:1]
        if kind == rcv.MESSAGES:
            msgs = rcv.decode_messages(frame, rx.gen)
            self._pending.extend(msgs)
            self._arrived(len(msgs))
        elif kind == rcv.CONNECTED:  # the child's client reconnected
            self._back()
        elif kind == rcv.LOG:
            level, name, text = rcv.decode_log(frame)
            logging.getLogger(name).log(level, "%s", text)
        elif kind == rcv.DISCONNECTED:
            self._lost_broker(frame[1:].decode(errors="replace"))
        elif kind == rcv.DRAINED:
            self._drained.set()

    def _read_loop(self) -> None:
        """Take the child's frames; restart the child when it dies unexpectedly."""
        while True:
            rx = self._rx
            if rx is None:
                return
            try:
                frame = rx.conn.recv_bytes()
            except (EOFError, OSError):
                rx.process.join(5)
                rx.close()
                if not self._restart(rx):
                    return
                continue
            self._handle(frame, rx)

    def _restart(self, dead: _Receiver) -> bool:
        """Replace a dead receiver child; False when stopping instead."""
        with self._life:
            if self._closing:
                return False
            self.receiver_restarts += 1
            log.error(
                "MQTT receiver process pid %d died (exit code %s); restarting it: the broker"
                " redelivers what was not acknowledged (stored once)",
                dead.process.pid,
                dead.process.exitcode,
            )
        backoff = 1.0
        while True:
            with self._life:
                if self._closing:
                    return False
                try:
                    self._rx = self._spawn()
                    return True
                except BrokerError as e:
                    self._rx = None
                    self.last_error = str(e)
                    log.error("cannot restart the MQTT receiver (%s); retry in %.0f s", e, backoff)
            if self._stop.wait(backoff):
                return False
            backoff = min(backoff * 2, 30.0)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.options.receiver_process:
            self._rx = self._spawn()
            self._reader = threading.Thread(
                target=self._read_loop, name="dctwin-receiver-link", daemon=True
            )
            self._reader.start()
        else:
            self._client = connect(
                self.broker,
                self.options.client_id,
                persistent=True,
                manual_ack=True,
                on_message=self._on_message,
                subscriptions=self.options.subscriptions,
                receive_maximum=self.options.receive_maximum,
            )
            self._client.on_disconnect = self._on_disconnect
            reconnect = self._client.on_connect

            def on_connect(client, userdata, flags, reason_code, properties) -> None:
                if reconnect is not None:
                    reconnect(client, userdata, flags, reason_code, properties)
                self._on_reconnect(client, userdata, flags, reason_code, properties)

            self._client.on_connect = on_connect
            self._back()
        self._thread = threading.Thread(target=self._flush_loop, name="dctwin-flush", daemon=True)
        self._thread.start()
        log.info("ingesting %s from %s", self.options.topic, self.broker.describe())

    def stop(self) -> None:
        if self.options.receiver_process:
            self._stop_receiver_mode()
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            if self._client is not None:
                self._client.disconnect()
                self._client.loop_stop()
        log.info("ingest stopped: %s", self.ingester.counters.as_dict())

    def _stop_receiver_mode(self) -> None:
        with self._life:
            self._closing = True  # no restarts from here on
        rx = self._rx
        # 1. have the child send what it holds, so the final flush includes it
        if rx is not None and rx.process.is_alive():
            self._drained.clear()
            if rx.send(rcv.DRAIN):
                deadline = time.monotonic() + 10.0
                while not self._drained.wait(0.1):
                    if time.monotonic() > deadline or not rx.process.is_alive():
                        break
        # 2. final flush and acks (the flush loop's exit path)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        # 3. the child applies the acks (they are ahead of Q in the pipe), disconnects, exits
        if rx is not None:
            rx.send(rcv.QUIT)
            rx.process.join(15)
            if rx.process.is_alive():
                log.error("MQTT receiver pid %d did not exit; killing it", rx.process.pid)
                rx.process.kill()
                rx.process.join(5)
        if self._reader is not None:
            self._reader.join(10)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stopped (or the timeout); True when stopped."""
        return self._stop.wait(timeout_s)

    # ---- writing -----------------------------------------------------------------------------

    def flush(self) -> int:
        """Write and acknowledge what has arrived; returns the messages handled.

        Every message taken is stored, dead-lettered or a duplicate, then acknowledged. When
        the store is unavailable (disk full, a lock: nothing is the data's fault) the messages
        stay pending and unacknowledged, and the flush loop retries with backoff.
        """
        opts = self.options
        handled = 0
        # Take what is pending now, not what arrives meanwhile: otherwise each pass catches the
        # few messages that came in during the previous write, and transactions stay tiny.
        available = len(self._pending)
        while available > 0:
            n = min(available, opts.max_batch_messages)
            available -= n
            chunk = [self._pending.popleft() for _ in range(n)]
            items = [(t, p) for t, p, _, _, _ in chunk]
            try:
                # a message the ingest itself fails on (a bug) is dead-lettered ingest_error
                if failed := self.ingester.ingest_or_isolate(items):
                    self.health.error("ingest", f"the ingest failed on {failed} message(s)")
            except StoreUnavailable as e:
                self.write_errors += 1
                self.last_error = str(e)
                self.health.store_error(self.last_error)
                self.health.error("ingest", f"store unavailable: {e}")
                log.error("store write failed (%s); %d messages kept for retry", e, n)
                self._pending.extendleft(reversed(chunk))
                return handled
            self._ack(chunk)
            self._taken(n)
            self.health.committed()
            self.health.ok("ingest")
            handled += n
        return handled

    def _ack(self, chunk: list[tuple[str, bytes, int, int, int]]) -> None:
        """Acknowledge committed messages through whoever received them."""
        client = self._client
        if client is not None:
            for _, _, mid, qos, _ in chunk:
                if qos > 0:
                    client.ack(mid, qos)
            return
        rx = self._rx
        if rx is None:
            return
        # Only to the child that received them: a restarted child has a new connection, where
        # the broker redelivers those messages (and may reuse their mids for others).
        gen = rx.gen
        mids = [mid for _, _, mid, qos, g in chunk if qos > 0 and g == gen]
        if mids:
            qoses = [qos for _, _, _, qos, g in chunk if qos > 0 and g == gen]
            rx.send(rcv.encode_acks(mids, qoses))

    def _flush_loop(self) -> None:
        opts = self.options
        next_rollup = time.monotonic() + opts.rollup_interval_s
        next_stats = time.monotonic() + opts.stats_interval_s
        next_export = time.monotonic() + min(opts.export_every_s, 10.0)
        retry_backoff = opts.flush_interval_s
        while not self._stop.is_set():
            deadline = time.monotonic() + opts.flush_interval_s
            while time.monotonic() < deadline and len(self._pending) < opts.max_batch_messages:
                if self._stop.wait(0.01):
                    break
            errors_before = self.write_errors
            self.flush()
            if self.write_errors > errors_before:
                retry_backoff = min(retry_backoff * 2, 30.0)
                self._stop.wait(retry_backoff)
                continue
            retry_backoff = opts.flush_interval_s
            now = time.monotonic()
            if now >= next_rollup:
                next_rollup = now + opts.rollup_interval_s
                self._maintain()
            if opts.export_to and now >= next_export:
                next_export = now + opts.export_every_s
                self._export()
            if now >= next_stats:
                next_stats = now + opts.stats_interval_s
                log.info("ingest: %s", self.ingester.counters.as_dict())
        self.flush()
        self._maintain()

    def _export(self) -> None:
        """Export closed hours (in the writer thread, which owns the store's connection)."""
        from twin.store.history import export_closed_hours

        opts = self.options
        assert opts.export_to is not None
        try:
            r = export_closed_hours(
                self.ingester.store.con,
                opts.export_to,
                shard=opts.export_shard,
                grace_s=opts.export_grace_s,
            )
        except Exception as e:
            log.error("history export to %s failed: %s", opts.export_to, e)
            self.health.error("export", f"{type(e).__name__}: {e}")
        else:
            if r.hours:
                log.info("exported %d hours (%d rows, %d bytes)", r.hours, r.rows, r.bytes)
            self.health.ok("export")

    def _maintain(self) -> None:
        try:
            self.ingester.store.rollup()
            if self.options.retention_days:
                self.ingester.store.apply_retention(
                    self.options.retention_days,
                    exported_only=True if self.options.export_to else None,
                )
            pruned = self.ingester.store.prune()
            if any(pruned.values()):
                log.info("pruned %s", pruned)
        except Exception as e:
            log.error("rollup/retention failed: %s", e)
            self.health.error("maintenance", f"{type(e).__name__}: {e}")
        else:
            self.health.ok("maintenance")
