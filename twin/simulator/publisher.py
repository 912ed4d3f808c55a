"""Run a SiteSimulator in (scaled) real time and publish its messages over MQTT and/or JSONL."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import orjson

from collectors.mqtt import AckedPublisher, BrokerConfig, connect
from twin.simulator.engine import SiteSimulator

log = logging.getLogger(__name__)

#: On a requested stop, wait at most this long for the broker's last acknowledgements [s].
STOP_FLUSH_S = 5.0


def run_simulation(
    sim: SiteSimulator,
    *,
    broker: BrokerConfig | None,
    jsonl: Path | None = None,
    speed: float = 1.0,
    duration_s: float | None = None,
    stop: threading.Event | None = None,
    on_tick: Callable[[int], None] | None = None,
    client_id: str | None = None,
) -> dict[str, object]:
    """Step ``sim`` until ``duration_s`` simulated seconds (None: until ``stop``).

    ``speed`` is simulated seconds per wall second; 0 runs as fast as possible. Every message
    goes out at QoS 1 with at most ``broker.max_inflight`` unacknowledged (the simulator waits
    for the broker's PUBACKs: backpressure); the function returns once the broker has
    acknowledged all of them (after ``stop``: within :data:`STOP_FLUSH_S`). A lost broker is a
    :class:`collectors.mqtt.BrokerError`; a file that cannot be written an ``OSError``.
    """
    dt = 1.0 / sim.rate_hz
    n_ticks = None if duration_s is None else round(duration_s * sim.rate_hz)
    stop = stop or threading.Event()
    pub: AckedPublisher | None = None
    out: IO[bytes] | None = jsonl.open("wb") if jsonl else None
    if broker is not None:
        try:
            client = connect(broker, client_id or f"dctwin-sim-{sim.site.name}-{id(sim):x}")
        except BaseException:
            if out is not None:
                out.close()
            raise
        pub = AckedPublisher(client, broker)
    t0 = time.monotonic()
    tick = 0
    unacked = 0
    try:
        while not stop.is_set() and (n_ticks is None or tick < n_ticks):
            if speed > 0:
                wait = t0 + tick * dt / speed - time.monotonic()
                if wait > 0 and stop.wait(wait):
                    break
            for topic, payload in sim.step():
                if pub is not None:
                    pub.publish(topic, payload)
                if out is not None:
                    out.write(orjson.dumps({"topic": topic, "payload": orjson.Fragment(payload)}))
                    out.write(b"\n")
            tick += 1
            if on_tick:
                on_tick(tick)
        if pub is not None:
            # a finished run waits for every acknowledgement; a stopped one a few seconds
            unacked = pub.flush(STOP_FLUSH_S if stop.is_set() else pub.ack_timeout_s * 10)
            if unacked:
                log.error("%d messages not acknowledged by the broker", unacked)
    finally:
        if out is not None:
            out.close()
        if pub is not None:
            pub.close()
    stats: dict[str, object] = {
        "ticks": tick,
        "sim_seconds": tick * dt,
        "wall_seconds": round(time.monotonic() - t0, 3),
        "messages": dict(sim.messages),
        "samples": dict(sim.published),
        "published_mqtt": 0,
        "stopped": stop.is_set(),
    }
    if pub is not None:
        stats.update(pub.stats(), unacknowledged=unacked, max_inflight=pub.max_inflight)
    return stats
