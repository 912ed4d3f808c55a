"""Run a SiteSimulator in (scaled) real time and publish its messages over MQTT and/or JSONL."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

import orjson
import paho.mqtt.client as mqtt

from collectors.mqtt import BrokerConfig, connect
from collectors.simulator.engine import SiteSimulator

log = logging.getLogger(__name__)


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
    goes out at QoS 1; the function returns once the broker has acknowledged all of them.
    """
    dt = 1.0 / sim.rate_hz
    n_ticks = None if duration_s is None else round(duration_s * sim.rate_hz)
    stop = stop or threading.Event()
    client: mqtt.Client | None = None
    if broker is not None:
        client = connect(broker, client_id or f"dctwin-sim-{sim.site.name}-{id(sim):x}")
    out: IO[bytes] | None = jsonl.open("wb") if jsonl else None
    infos: deque[mqtt.MQTTMessageInfo] = deque()
    published = 0
    t0 = time.monotonic()
    tick = 0
    try:
        while not stop.is_set() and (n_ticks is None or tick < n_ticks):
            if speed > 0:
                wait = t0 + tick * dt / speed - time.monotonic()
                if wait > 0 and stop.wait(wait):
                    break
            for topic, payload in sim.step():
                if client is not None:
                    infos.append(client.publish(topic, payload, qos=1))
                    published += 1
                if out is not None:
                    out.write(orjson.dumps({"topic": topic, "payload": orjson.Fragment(payload)}))
                    out.write(b"\n")
            while infos and infos[0].is_published():
                infos.popleft()
            tick += 1
            if on_tick:
                on_tick(tick)
        for info in infos:
            info.wait_for_publish(timeout=60)
        unacked = sum(1 for i in infos if not i.is_published())
        if unacked:
            log.error("%d messages not acknowledged by the broker", unacked)
    finally:
        if out is not None:
            out.close()
        if client is not None:
            client.disconnect()
            client.loop_stop()
    return {
        "ticks": tick,
        "sim_seconds": tick * dt,
        "wall_seconds": round(time.monotonic() - t0, 3),
        "messages": dict(sim.messages),
        "samples": dict(sim.published),
        "published_mqtt": published,
    }
