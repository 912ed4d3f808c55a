"""The MQTT half of ``dctwin serve``: subscribe, batch, write, then acknowledge.

paho-mqtt 2.x with a persistent session and manual acknowledgement: a QoS 1 message is
PUBACKed only after the transaction that stored it (or dead-lettered it) has committed. If the
service dies between receipt and commit, the broker redelivers the message; the ingester's
(source, seq, ts) dedup stores it once. So nothing is lost across a restart and nothing is
stored twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt

from collectors.contract import TOPIC_PREFIX
from collectors.mqtt import BrokerConfig, connect
from twin.ingest.ingester import Ingester

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceOptions:
    client_id: str = "dctwin-ingest"
    share_group: str | None = None
    flush_interval_s: float = 0.25
    max_batch_messages: int = 20_000
    rollup_interval_s: float = 60.0
    retention_days: float | None = None
    stats_interval_s: float = 10.0

    @property
    def topic(self) -> str:
        base = f"{TOPIC_PREFIX}/#"
        return f"$share/{self.share_group}/{base}" if self.share_group else base


class MqttIngestService:
    """Run with ``start()``; ``stop()`` flushes, acknowledges and disconnects."""

    def __init__(self, broker: BrokerConfig, ingester: Ingester, options: ServiceOptions):
        self.broker = broker
        self.ingester = ingester
        self.options = options
        self._pending: deque[tuple[str, bytes, int, int]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: mqtt.Client | None = None
        self.write_errors = 0
        self.disconnects = 0
        self.last_error: str | None = None

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self._pending.append((msg.topic, msg.payload, msg.mid, msg.qos))

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        if not self._stop.is_set():
            self.disconnects += 1
            log.warning(
                "lost the broker at %s (%s); paho reconnects, and the broker redelivers"
                " unacknowledged messages (stored once)",
                self.broker.describe(),
                reason_code,
            )

    def start(self) -> None:
        self._client = connect(
            self.broker,
            self.options.client_id,
            persistent=True,
            manual_ack=True,
            on_message=self._on_message,
            subscriptions=[self.options.topic],
        )
        self._client.on_disconnect = self._on_disconnect
        self._thread = threading.Thread(target=self._flush_loop, name="dctwin-flush", daemon=True)
        self._thread.start()
        log.info("ingesting %s from %s", self.options.topic, self.broker.describe())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._client is not None:
            self._client.disconnect()
            self._client.loop_stop()
        log.info("ingest stopped: %s", self.ingester.counters.as_dict())

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stopped (or the timeout); True when stopped."""
        return self._stop.wait(timeout_s)

    def flush(self) -> int:
        """Write and acknowledge what has arrived; returns the messages handled."""
        opts = self.options
        handled = 0
        # Take what is pending now, not what arrives meanwhile: otherwise each pass catches the
        # few messages that came in during the previous write, and transactions stay tiny.
        available = len(self._pending)
        while available > 0:
            n = min(available, opts.max_batch_messages)
            available -= n
            chunk = [self._pending.popleft() for _ in range(n)]
            try:
                self.ingester.ingest([(t, p) for t, p, _, _ in chunk])
            except Exception as e:  # the store failed: keep the messages, unacked, and retry
                self.write_errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                log.error("store write failed (%s); %d messages kept for retry", e, n)
                self._pending.extendleft(reversed(chunk))
                return handled
            client = self._client
            if client is not None:
                for _, _, mid, qos in chunk:
                    if qos > 0:
                        client.ack(mid, qos)
            handled += n
        return handled

    def _flush_loop(self) -> None:
        opts = self.options
        next_rollup = time.monotonic() + opts.rollup_interval_s
        next_stats = time.monotonic() + opts.stats_interval_s
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
            if now >= next_stats:
                next_stats = now + opts.stats_interval_s
                log.info("ingest: %s", self.ingester.counters.as_dict())
        self.flush()
        self._maintain()

    def _maintain(self) -> None:
        try:
            self.ingester.store.rollup()
            if self.options.retention_days:
                self.ingester.store.apply_retention(self.options.retention_days)
        except Exception as e:
            log.error("rollup/retention failed: %s", e)
