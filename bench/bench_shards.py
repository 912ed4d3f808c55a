"""What shards cost: the site file's ``shards:`` on a 100,000-GPU site, and a shard's exact
topic filters at the broker.

The site is ``bench_api.synthetic_site`` (racks of 4 HGX-H200-8-DLC nodes, 2 PDUs per rack,
40 racks per CDU) cut into ``--halls`` halls at CDU boundaries, one shard per hall. Measured:

- loading the site with ``shards:`` (pydantic and the shard validation) against without;
- ``shard_view`` of each shard (its sources, reads, topic filters and sub-site);
- against a local Mosquitto: a subscriber's CONNECT + SUBSCRIBE of one shard's exact filters
  until its SUBACK, and the rate at which it receives ``--messages`` QoS 1 messages of 1 KiB
  published to that shard's topics, against the same subscriber on ``dctwin/v1/#``.

Usage::

    python bench/bench_shards.py [--gpus 100000] [--halls 4] [--messages 50000]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paho.mqtt.client as mqtt

from bench.bench_api import synthetic_site
from twin.broker import start_broker
from twin.site import Site
from twin.site.shards import shard_view


def halls_site(n_gpus: int, n_halls: int) -> tuple[dict, dict]:
    """The synthetic site's data without and with ``shards:``, rows cut into halls between CDUs
    (40 racks = 5 rows of 8)."""
    data = synthetic_site(n_gpus).model_dump(mode="python", exclude={"shards"})
    rows = data["halls"][0]["rows"]
    per_hall = -(-len(rows) // n_halls)
    per_hall += -per_hall % 5  # a CDU's 5 rows stay in one hall
    halls = [
        {"name": f"hall-{i + 1}", "rows": rows[i * per_hall : (i + 1) * per_hall]}
        for i in range(n_halls)
        if rows[i * per_hall : (i + 1) * per_hall]
    ]
    plain = {**data, "halls": halls}
    sharded = {**plain, "shards": [{"name": h["name"], "halls": [h["name"]]} for h in halls]}
    return plain, sharded


def timed(fn, runs: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def subscribe_time(port: int, filters: list[str]) -> float:
    """Seconds from CONNECT to the SUBACK of ``filters`` (one SUBSCRIBE)."""
    done = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"sub-{time.monotonic_ns()}")
    c.on_subscribe = lambda *a: done.set()
    t0 = time.perf_counter()
    c.connect("127.0.0.1", port)
    c.loop_start()
    c.subscribe([(f, 1) for f in filters])
    assert done.wait(120), "no SUBACK"
    dt = time.perf_counter() - t0
    c.disconnect()
    c.loop_stop()
    return dt


def receive_rate(port: int, filters: list[str], topics: list[str], n: int) -> float:
    """Messages/s a subscriber on ``filters`` receives of ``n`` QoS 1 publishes to ``topics``."""
    got = threading.Event()
    count = [0]

    def on_message(client, userdata, msg) -> None:
        count[0] += 1
        if count[0] >= n:
            got.set()

    sub_done = threading.Event()
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"rx-{time.monotonic_ns()}")
    sub.on_message = on_message
    sub.on_subscribe = lambda *a: sub_done.set()
    sub.connect("127.0.0.1", port)
    sub.loop_start()
    sub.subscribe([(f, 1) for f in filters])
    assert sub_done.wait(120)
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"tx-{time.monotonic_ns()}")
    pub.max_inflight_messages_set(1000)
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    payload = b"x" * 1024
    t0 = time.perf_counter()
    infos = [pub.publish(topics[i % len(topics)], payload, qos=1) for i in range(n)]
    assert got.wait(300), f"received {count[0]} of {n}"
    dt = time.perf_counter() - t0
    for info in infos[-10:]:
        info.wait_for_publish(30)
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=100_000)
    ap.add_argument("--halls", type=int, default=4)
    ap.add_argument("--messages", type=int, default=50_000)
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {platform.node()} {cpu}, {os.cpu_count()} CPUs")
    plain, sharded = halls_site(args.gpus, args.halls)
    t_plain, _ = timed(lambda: Site.model_validate(plain))
    t_sharded, site = timed(lambda: Site.model_validate(sharded))
    print(
        f"site of {args.gpus} GPUs, {len(site.racks)} racks: validate {t_plain:.3f} s,"
        f" with shards: {t_sharded:.3f} s"
    )
    views = []
    for s in site.shards:
        t, v = timed(lambda s=s: shard_view(site, s.name), runs=1)
        views.append(v)
        print(
            f"  shard_view({s.name}): {t:.3f} s, {len(v.racks)} racks,"
            f" {sum(n.spec.gpus for n in v.site.nodes)} GPUs, {len(v.sources)} sources,"
            f" {len(v.reads)} reads, {len(v.topic_filters)} filters"
        )
    v = views[0]
    broker = start_broker("mosquitto")
    try:
        t_sub = subscribe_time(broker.port, v.topic_filters)
        print(f"SUBSCRIBE of {len(v.topic_filters)} exact filters to SUBACK: {t_sub * 1000:.0f} ms")
        exact = receive_rate(broker.port, v.topic_filters, v.topic_filters, args.messages)
        wild = receive_rate(broker.port, ["dctwin/v1/#"], v.topic_filters, args.messages)
        print(
            f"receive rate, {args.messages} QoS 1 messages of 1 KiB: exact filters"
            f" {exact:,.0f}/s, dctwin/v1/# {wild:,.0f}/s (ratio {exact / wild:.2f})"
        )
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
