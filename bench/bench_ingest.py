#!/usr/bin/env python
"""End-to-end ingest benchmark: simulator-format GPU messages through Mosquitto into DuckDB.

One run starts one local broker (mosquitto with raised queue limits, via
``twin.broker.start_broker``; the embedded amqtt broker if mosquitto is missing, which the output
says) and pre-generates simulator-format GPU messages: one message per node per poll, ``--gpus``
samples of the 10 quantities the simulator sends for a GPU, built with
``collectors.contract.encode``; seq is the poll number, ts the time of the poll. Publisher
processes send them at QoS 1 as fast as the broker takes them, but never more than
``--backlog`` messages ahead of the consumer (or at ``--rate``). Under that load, one after the
other and for the same duration:

1. ``bare``: a bare paho-mqtt 2.x subscriber (QoS 1, auto-ack) in its own process that only
   counts messages: the reference delivery rate.
2. ``dctwin``: the real ingest path of ``dctwin serve`` (MqttIngestService + Ingester + Store,
   persistent session, manual acks after commit) in its own process, on a DuckDB file.

Rates are measured over ``--seconds`` starting ``--warmup`` seconds after the publishers start.
When the publishers stop, the consumer drains the broker's backlog; the dctwin phase then checks
that everything published was stored exactly once (stored == published, no dead letters, no
duplicates, no seq gaps) and measures the file's bytes per million readings after CHECKPOINT.

``--stages`` first times each ingest stage offline (no MQTT, one process): JSON parse, contract
validation, batch building, Arrow conversion and the DuckDB insert. ``--profile DIR`` runs the
dctwin process under cProfile (one profile per thread); profiling slows it down, so use a
separate run for the recorded figures.

Exit status: 0 when every message was delivered and stored once (whether or not the throughput
targets were met), 1 on loss, dead letters, duplicates or a failed phase.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import cProfile
import gc
import io
import json
import multiprocessing as mp
import os
import platform
import pstats
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from collectors.contract import QUANTITIES, TOPIC_PREFIX, decode, encode, gpu_id, topic_for

#: The quantities the simulator sends for a GPU (a subset of the contract's gpu quantities).
GPU_QUANTITIES: tuple[str, ...] = (
    "power_w",
    "temp_c",
    "mem_temp_c",
    "util_pct",
    "sm_active",
    "energy_j",
    "power_limit_w",
    "clock_sm_mhz",
    "clock_mem_mhz",
    "throttle_reasons",
)
assert set(GPU_QUANTITIES) <= set(QUANTITIES["gpu"])
SITE = "bench"
COLLECTOR = "sim"
TARGET_READINGS_S = 1_000_000
TARGET_RATIO = 0.9  # issue 12: with the strict validation, >= 90 % of the bare subscriber
SAMPLE_INTERVAL_S = 0.2
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# ---- payloads ------------------------------------------------------------------------------


def _fmt_ts(ts: datetime) -> bytes:
    """The RFC 3339 form ``encode`` writes for a datetime (milliseconds, ``Z``)."""
    return ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z").encode()


def _gpu_sample(rng: random.Random, gpu_id: str, energy_j: float) -> dict[str, Any]:
    busy = rng.random() < 0.85
    util = rng.uniform(88.0, 100.0) if busy else rng.uniform(0.0, 4.0)
    sm = util / 100.0 * rng.uniform(0.55, 0.95)
    limit = 700.0
    power = min(limit, 90.0 + (limit - 90.0) * sm**0.8 + rng.gauss(0.0, 6.0))
    temp = 30.0 + 0.055 * power + rng.gauss(0.0, 1.0)
    return {
        "id": gpu_id,
        "power_w": round(power, 3),
        "temp_c": float(round(temp)),
        "mem_temp_c": float(round(temp + rng.uniform(3.0, 9.0))),
        "util_pct": float(round(util)),
        "sm_active": round(sm, 4),
        "energy_j": round(energy_j, 3),
        "power_limit_w": limit,
        "clock_sm_mhz": float(rng.choice((1980, 1980, 1980, 1755, 1410))) if busy else 345.0,
        "clock_mem_mhz": 2619.0,
        "throttle_reasons": rng.choice((0, 0, 0, 0, 4, 1)),
    }


@dataclass
class NodeTemplate:
    """Pre-encoded messages of one node: ``head + seq + ',"ts":"' + ts + '"' + tails[v]``."""

    topic: str
    head: bytes
    tails: list[bytes]

    def payload(self, seq: int, ts: bytes, variant: int) -> bytes:
        return b"".join((self.head, b"%d" % seq, b',"ts":"', ts, b'"', self.tails[variant]))


def node_names(n: int) -> list[str]:
    return [f"gpu-node-{i:05d}" for i in range(n)]


def build_templates(nodes: list[str], gpus: int, variants: int, seed: int) -> list[NodeTemplate]:
    """Encode ``variants`` polls per node with ``encode`` and cut out seq and ts."""
    rng = random.Random(seed)
    ts0 = datetime(2026, 11, 29, 14, 0, 0, 250000, tzinfo=UTC)
    marker = b'"seq":0,"ts":"' + _fmt_ts(ts0) + b'"'
    out = []
    for node in nodes:
        energy = [rng.uniform(1e8, 1e9) for _ in range(gpus)]
        head = b""
        tails = []
        for _ in range(variants):
            samples = []
            for g in range(gpus):
                samples.append(_gpu_sample(rng, gpu_id(node, g), energy[g]))
                energy[g] += samples[-1]["power_w"]
            full = encode(collector=COLLECTOR, source=node, seq=0, ts=ts0, samples=samples)
            i = full.index(marker)
            head = full[:i] + b'"seq":'
            tails.append(full[i + len(marker) :])
        out.append(NodeTemplate(topic_for(SITE, "gpu", node), head, tails))
    # The spliced bytes must be exactly what encode() writes for that seq and ts.
    t = out[0]
    now = datetime.now(UTC).replace(microsecond=123000)
    rng2 = random.Random(seed)
    energy = [rng2.uniform(1e8, 1e9) for _ in range(gpus)]
    samples = [_gpu_sample(rng2, gpu_id(nodes[0], g), energy[g]) for g in range(gpus)]
    want = encode(collector=COLLECTOR, source=nodes[0], seq=12345, ts=now, samples=samples)
    if t.payload(12345, _fmt_ts(now), 0) != want:
        raise AssertionError("spliced payload differs from collectors.contract.encode output")
    decode(t.topic, want)  # and it passes the contract
    return out


def generate(
    templates: list[NodeTemplate], n: int, variants: int, start: datetime | None = None
) -> list[tuple[str, bytes]]:
    """``n`` messages, poll by poll (seq = poll number), timestamps 1 s apart from ``start``."""
    start = start or datetime.now(UTC) - timedelta(seconds=n // max(len(templates), 1) + 1)
    items = []
    seq = 0
    while len(items) < n:
        ts = _fmt_ts(start + timedelta(seconds=seq))
        for k, t in enumerate(templates):
            items.append((t.topic, t.payload(seq, ts, (seq + k) % variants)))
            if len(items) == n:
                break
        seq += 1
    return items


# ---- child processes -----------------------------------------------------------------------


def _cpu_of(pid: int | str) -> float:
    """utime + stime of a process or task [s], from /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_GC = {"s": 0.0, "t": 0.0}


def _gc_callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _GC["t"] = time.perf_counter()
    else:
        _GC["s"] += time.perf_counter() - _GC["t"]


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process, by Python thread name ('native' for others).

    ``gc-pauses`` is the wall time spent in the cyclic garbage collector (all threads).
    """
    names = {th.native_id: th.name for th in threading.enumerate()}
    out: dict[str, float] = {"gc-pauses": _GC["s"]}
    for tid in os.listdir("/proc/self/task"):
        name = names.get(int(tid), "native")
        if name.startswith("paho-mqtt-client-"):
            name = "paho-network"
        out[name] = out.get(name, 0.0) + _cpu_of(f"self/task/{tid}")
    return out


def _child(q: Any, role: str, fn: Any, *args: Any) -> None:
    try:
        fn(q, role, *args)
    except BaseException:
        q.put(("error", role, traceback.format_exc()))
        raise


def _sampler(
    stop: threading.Event, handled: Any, read: Any, timeline: list[tuple[Any, ...]]
) -> None:
    while True:
        counts = read()
        handled.value = counts[0]
        timeline.append((time.monotonic(), *counts, _thread_cpu()))
        if stop.wait(SAMPLE_INTERVAL_S):
            counts = read()
            handled.value = counts[0]
            timeline.append((time.monotonic(), *counts, _thread_cpu()))
            return


class RawPublisher:
    """A minimal MQTT 3.1.1 QoS 1 publisher on a plain socket (CONNECT, PUBLISH, PUBACK).

    Same packets on the wire as any QoS 1 client, at a few microseconds per message; paho's
    publish() costs 70-200 us per message here and would be the bottleneck (see README).
    """

    BATCH = 64

    def __init__(self, broker: dict[str, Any], client_id: str):
        import socket

        self.sock = socket.create_connection((broker["host"], broker["port"]), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cid = client_id.encode()
        flags, tail = 0x02, b""  # clean session
        if broker.get("username"):
            flags |= 0x80
            user = broker["username"].encode()
            tail = len(user).to_bytes(2, "big") + user
        body = b"\x00\x04MQTT\x04" + bytes([flags]) + b"\x00\x00" + len(cid).to_bytes(2, "big")
        body += cid + tail
        self.sock.sendall(b"\x10" + _varint(len(body)) + body)
        ack = self._recv_exact(4)
        if ack[0] != 0x20 or ack[3] != 0:
            raise RuntimeError(f"broker refused the raw publisher: CONNACK {ack.hex()}")
        self.sock.settimeout(None)  # blocking; MSG_DONTWAIT makes single reads non-blocking
        self.sent = 0
        self.acked = 0
        self._mid = 0
        self._buf: list[bytes] = []
        self._rbuf = b""
        self._topics: dict[str, bytes] = {}

    def _recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            data += chunk
        return data

    def publish(self, topic: str, payload: bytes) -> None:
        head = self._topics.get(topic)
        if head is None:
            t = topic.encode()
            head = self._topics[topic] = len(t).to_bytes(2, "big") + t
        self._mid = self._mid % 65535 + 1
        n = len(head) + 2 + len(payload)
        mid = self._mid.to_bytes(2, "big")
        self._buf.append(b"".join((b"\x32", _varint(n), head, mid, payload)))
        self.sent += 1
        if len(self._buf) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self.sock.sendall(b"".join(self._buf))
            self._buf.clear()
        self._read(block=False)

    def _read(self, block: bool) -> None:
        import socket

        try:
            data = self.sock.recv(1 << 16, 0 if block else socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            raise ConnectionError("broker closed the connection")
        buf = self._rbuf + data
        n = len(buf) // 4
        if buf[: n * 4 : 4].count(0x40) != n:  # every packet from the broker must be a PUBACK
            raise RuntimeError(f"unexpected packet from the broker: {buf[:16].hex()}")
        self.acked += n
        self._rbuf = buf[n * 4 :]

    def outstanding(self) -> int:
        return self.sent - self.acked

    def wait_below(self, n: int) -> None:
        self.flush()
        while self.sent - self.acked > n:
            self._read(block=True)

    def finish(self, timeout_s: float) -> int:
        """Wait for every PUBACK; returns how many never came."""
        self.flush()
        self.sock.settimeout(timeout_s)
        with contextlib.suppress(TimeoutError, OSError):
            while self.acked < self.sent:
                self._read(block=True)
        self.sock.sendall(b"\xe0\x00")  # DISCONNECT
        self.sock.close()
        return self.sent - self.acked


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        d, n = n % 128, n // 128
        out.append(d | 0x80 if n else d)
        if not n:
            return bytes(out)


class PahoPublisher:
    """paho-mqtt 2.x with its network thread, the way the simulator publishes."""

    def __init__(self, broker: dict[str, Any], client_id: str):
        from collectors.mqtt import BrokerConfig, connect

        # connect() keeps 1000 QoS 1 messages in flight and queues the rest.
        self.client = connect(BrokerConfig(**broker), client_id)
        self.infos: deque[Any] = deque()
        self.sent = 0

    def publish(self, topic: str, payload: bytes) -> None:
        self.infos.append(self.client.publish(topic, payload, qos=1))
        self.sent += 1

    def flush(self) -> None:
        infos = self.infos
        while infos and infos[0].is_published():
            infos.popleft()

    def outstanding(self) -> int:
        return len(self.infos)

    def wait_below(self, n: int) -> None:
        while len(self.infos) > n:
            self.infos.popleft().wait_for_publish(60)

    def finish(self, timeout_s: float) -> int:
        for info in self.infos:
            info.wait_for_publish(timeout_s)
        unacked = sum(1 for i in self.infos if not i.is_published())
        self.client.disconnect()
        self.client.loop_stop()
        return unacked


def publisher_main(
    q: Any,
    role: str,
    broker: dict[str, Any],
    client_kind: str,
    nodes: list[str],
    gpus: int,
    variants: int,
    window: int,
    rate: float,
    backlog: int,
    n_publishers: int,
    consumed: Any,
    go: Any,
    t_end: Any,
) -> None:
    """Publish polls of ``nodes`` until ``t_end``: seq = poll number, ts = time of the poll."""
    templates = build_templates(nodes, gpus, variants, seed=int(role.removeprefix("publisher")) + 1)
    cls = RawPublisher if client_kind == "raw" else PahoPublisher
    pub = cls(broker, f"bench-{role}-{os.getpid()}")
    q.put(("ready", role, os.getpid()))
    go.wait()
    end = t_end.value
    published = 0
    seq = 0
    t0 = time.monotonic()
    timeline = [(t0, 0)]
    backlog_waits = 0.0
    now = t0
    last_ms = 0
    while now < end:
        # One timestamp per poll, near now, strictly increasing (a poll can take < 1 ms).
        last_ms = max(time.time_ns() // 1_000_000, last_ms + 1)
        ts = _fmt_ts(_EPOCH + timedelta(milliseconds=last_ms))
        for k, t in enumerate(templates):
            pub.publish(t.topic, t.payload(seq, ts, (seq + k) % variants))
            published += 1
            if pub.outstanding() >= window:
                pub.wait_below(window // 2)
            if not published & 63:
                pub.flush()
                now = time.monotonic()
                if rate > 0 and (ahead := t0 + published / rate - now) > 0:
                    time.sleep(ahead)
                    now = time.monotonic()
                # Keep the broker's queue for the consumer bounded (--backlog).
                while backlog and published * n_publishers - consumed.value > backlog and now < end:
                    time.sleep(0.002)
                    backlog_waits += 0.002
                    now = time.monotonic()
                if now - timeline[-1][0] >= SAMPLE_INTERVAL_S:
                    timeline.append((now, published))
                if now >= end:
                    break
        seq += 1
        now = time.monotonic()
    t_stop = time.monotonic()
    unacked = pub.finish(120)
    q.put(
        (
            "result",
            role,
            {
                "published": published,
                "unacked": unacked,
                "polls": seq,
                "t_start": t0,
                "t_stop": t_stop,
                "backlog_wait_s": round(backlog_waits, 2),
                "cpu_s": sum(os.times()[:2]),
                "timeline": [*timeline, (t_stop, published)],
            },
        )
    )


def bare_main(q: Any, role: str, broker: dict[str, Any], stop: Any, handled: Any) -> None:
    """Reference: a bare paho subscriber, QoS 1, auto-ack, that only counts messages."""
    from collectors.mqtt import BrokerConfig, connect

    gc.callbacks.append(_gc_callback)

    count = 0

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        nonlocal count
        count += 1

    client = connect(
        BrokerConfig(**broker),
        f"bench-bare-{os.getpid()}",
        on_message=on_message,
        subscriptions=[f"{TOPIC_PREFIX}/#"],
    )
    timeline: list[tuple[Any, ...]] = []
    done = threading.Event()
    th = threading.Thread(
        target=_sampler, args=(done, handled, lambda: (count, count), timeline), name="sampler"
    )
    th.start()
    q.put(("ready", role, os.getpid()))
    stop.wait()
    done.set()
    th.join()
    client.disconnect()
    client.loop_stop()
    q.put(("result", role, {"messages": count, "timeline": timeline}))


_PROFILES: list[tuple[str, cProfile.Profile]] = []


def _profile_threads() -> None:
    """Run every thread started from now on under its own cProfile.Profile."""
    run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()
            _PROFILES.append((self.name, prof))

    threading.Thread.run = profiled_run  # type: ignore[method-assign]


#: Functions whose cumulative time the profile summary reports: label -> (file part, name).
#: The name must match exactly, except for C functions (file "~"), where it is a substring.
KEY_FUNCTIONS: dict[str, tuple[str, str]] = {
    "MqttIngestService.flush": ("mqtt_service.py", "flush"),
    "Ingester.ingest": ("ingester.py", "ingest"),
    "Ingester.build_batch (incl. decode)": ("ingester.py", "build_batch"),
    "contract.decode": ("contract.py", "decode"),
    "pydantic validate_json": ("~", "validate_json"),
    "contract._to_utc (ts validator)": ("contract.py", "_to_utc"),
    "Store.write (Arrow + DuckDB, one transaction)": ("store.py", "write"),
    "Store._insert (register + INSERT, per table)": ("store.py", "_insert"),
    "Store.rollup": ("store.py", "rollup"),
    "paho Client.ack (queues a PUBACK)": ("client.py", "ack"),
    "MqttIngestService._on_message": ("mqtt_service.py", "_on_message"),
    "paho _packet_read": ("client.py", "_packet_read"),
    "paho _handle_publish": ("client.py", "_handle_publish"),
    "paho Properties.__init__ (MQTT v5)": ("properties.py", "__init__"),
    "paho _packet_write": ("client.py", "_packet_write"),
    "socket recv": ("~", "'recv' of '_socket.socket'"),
    "socket send": ("~", "'send' of '_socket.socket'"),
    "select.select": ("~", "select.select"),
}


def _profile_report(prof: cProfile.Profile, top: int) -> dict[str, Any]:
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]

    def label(k: tuple[str, int, str]) -> str:
        f, line, name = k
        return name if f == "~" else f"{'/'.join(Path(f).parts[-2:])}:{line}({name})"

    tops = [
        {"function": label(k), "ncalls": v[1], "tottime_s": v[2], "cumtime_s": v[3]}
        for k, v in rows[:top]
    ]
    key = {}
    for lab, (fpart, npart) in KEY_FUNCTIONS.items():
        cum = [
            (v[3], v[1])
            for (f, _, name), v in st.stats.items()  # type: ignore[attr-defined]
            if fpart in f and (npart in name if fpart == "~" else npart == name)
        ]
        if cum:
            key[lab] = {"cumtime_s": sum(c for c, _ in cum), "ncalls": sum(n for _, n in cum)}
    return {"total_tottime_s": total, "top_by_tottime": tops, "key_functions": key}


def dctwin_main(
    q: Any,
    role: str,
    broker: dict[str, Any],
    db: str,
    flush_interval_s: float,
    max_batch: int,
    profile_dir: str | None,
    window_wall: Any,
    stop: Any,
    handled: Any,
) -> None:
    """The real ingest path: MqttIngestService + Ingester + Store on a DuckDB file."""
    from collectors.mqtt import BrokerConfig
    from twin.ingest.ingester import Ingester, IngestLimits
    from twin.ingest.mqtt_service import MqttIngestService, ServiceOptions
    from twin.store.schema import quantity_columns
    from twin.store.store import Store

    gc.callbacks.append(_gc_callback)
    store = Store(db)
    ingester = Ingester(store, None, IngestLimits())
    c = ingester.counters
    timeline: list[tuple[Any, ...]] = []
    done = threading.Event()
    th = threading.Thread(
        target=_sampler,
        args=(done, handled, lambda: (c.received, c.samples["gpu"]), timeline),
        name="sampler",
    )
    th.start()
    if profile_dir:
        _profile_threads()
    service = MqttIngestService(
        BrokerConfig(**broker),
        ingester,
        ServiceOptions(
            client_id=f"bench-dctwin-{os.getpid()}",
            flush_interval_s=flush_interval_s,
            max_batch_messages=max_batch,
        ),
    )
    service.start()
    q.put(("ready", role, os.getpid()))
    stop.wait()
    t0 = time.monotonic()
    service.stop()
    stop_s = time.monotonic() - t0
    done.set()
    th.join()
    con = store.con
    readings_expr = " + ".join(f"count({col})" for col in quantity_columns("gpu"))
    gpu_rows, readings = con.execute(f"SELECT count(*), {readings_expr} FROM gpu").fetchone()
    dup_rows = con.execute(
        "SELECT coalesce(sum(n - 1), 0) FROM"
        " (SELECT count(*) AS n FROM gpu GROUP BY ts, source, id HAVING count(*) > 1)"
    ).fetchone()[0]
    log_msgs, log_samples, sources = con.execute(
        "SELECT count(*), coalesce(sum(n_samples), 0), count(DISTINCT source) FROM ingest_log"
    ).fetchone()
    seq_missing = con.execute(
        "SELECT coalesce(sum(max_seq - min_seq + 1 - n), 0) FROM (SELECT source,"
        " min(seq) AS min_seq, max(seq) AS max_seq, count(DISTINCT seq) AS n"
        " FROM ingest_log GROUP BY source)"
    ).fetchone()[0]
    batches = con.execute("SELECT count(DISTINCT received_at) FROM ingest_log").fetchone()[0]
    a, b = window_wall[0], window_wall[1]
    win_msgs, win_samples, win_batches = con.execute(
        "SELECT count(*), coalesce(sum(n_samples), 0), count(DISTINCT received_at) FROM ingest_log"
        " WHERE received_at >= to_timestamp(?) AND received_at < to_timestamp(?)",
        [a, b],
    ).fetchone()
    dead = dict(con.execute("SELECT reason, count(*) FROM dead_letters GROUP BY reason").fetchall())
    t0 = time.monotonic()
    con.execute("CHECKPOINT")
    checkpoint_s = time.monotonic() - t0
    db_size = con.execute("SELECT * FROM pragma_database_size()").fetchdf().to_dict("records")[0]
    tables = {}
    for table in ("gpu", "ingest_log", "gpu_1m"):
        blocks = con.execute(
            f"SELECT count(DISTINCT block_id) FROM pragma_storage_info('{table}')"
            " WHERE block_id >= 0"
        ).fetchone()[0]
        tables[table] = int(blocks)
    store.close()
    files = {p.name: p.stat().st_size for p in Path(db).parent.glob(Path(db).name + "*")}
    profiles = {}
    if profile_dir:
        out = Path(profile_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, prof in _PROFILES:
            safe = name.replace("/", "_")
            prof.dump_stats(str(out / f"ingest-{safe}.pstats"))
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
            (out / f"ingest-{safe}.txt").write_text(text.getvalue())
            profiles[name] = _profile_report(prof, 25)
    q.put(
        (
            "result",
            role,
            {
                "counters": c.as_dict(),
                "timeline": timeline,
                "write_errors": service.write_errors,
                "last_error": service.last_error,
                "stop_s": stop_s,
                "gpu_rows": int(gpu_rows),
                "readings": int(readings),
                "duplicate_rows": int(dup_rows),
                "log_messages": int(log_msgs),
                "log_samples": int(log_samples),
                "sources": int(sources),
                "seq_missing": int(seq_missing),
                "window_log_messages": int(win_msgs),
                "window_log_samples": int(win_samples),
                "batches": int(batches),
                "window_batches": int(win_batches),
                "dead_letters": {k: int(v) for k, v in dead.items()},
                "checkpoint_s": checkpoint_s,
                "database_size": {k: str(v) for k, v in db_size.items()},
                "table_blocks": tables,
                "files": files,
                "profiles": profiles,
            },
        )
    )


# ---- orchestration -------------------------------------------------------------------------


class Inbox:
    """Messages from child processes, fetched by (kind, role)."""

    def __init__(self, q: Any):
        self.q = q
        self.held: dict[tuple[str, str], Any] = {}

    def get(self, kind: str, role: str, timeout_s: float, procs: list[Any]) -> Any:
        deadline = time.monotonic() + timeout_s
        while (kind, role) not in self.held:
            try:
                k, r, payload = self.q.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"child process failed: {', '.join(dead)}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {kind} from {role} in {timeout_s:.0f} s") from None
                continue
            if k == "error":
                raise RuntimeError(f"{r} failed:\n{payload}")
            self.held[(k, r)] = payload
        return self.held.pop((kind, role))


def _count_at(timeline: list[tuple[Any, ...]], t: float, col: int) -> float:
    """Linear interpolation of column ``col`` of a (t, ...) timeline at time ``t``."""
    times = [row[0] for row in timeline]
    i = bisect.bisect_left(times, t)
    if i <= 0:
        return float(timeline[0][col])
    if i >= len(timeline):
        return float(timeline[-1][col])
    (t1, *r1), (t2, *r2) = timeline[i - 1], timeline[i]
    v1, v2 = r1[col - 1], r2[col - 1]
    return v1 + (v2 - v1) * (t - t1) / (t2 - t1) if t2 > t1 else float(v2)


def _rate(timeline: list[tuple[Any, ...]], a: float, b: float, col: int = 1) -> float:
    return (_count_at(timeline, b, col) - _count_at(timeline, a, col)) / (b - a)


def _steadiness(timeline: list[tuple[Any, ...]], a: float, b: float, col: int) -> dict[str, float]:
    """Min / max rate over 5-second slices of the window."""
    rates = []
    t = a
    while t + 5.0 <= b + 1e-9:
        rates.append(_rate(timeline, t, t + 5.0, col))
        t += 5.0
    return {"min_5s": min(rates), "max_5s": max(rates)} if rates else {}


def _thread_cores(timeline: list[tuple[Any, ...]], a: float, b: float) -> dict[str, float]:
    """Cores used per thread over [a, b], from the nearest samples."""
    times = [row[0] for row in timeline]
    ia = min(bisect.bisect_left(times, a), len(times) - 1)
    ib = min(bisect.bisect_left(times, b), len(times) - 1)
    (ta, *ra), (tb, *rb) = timeline[ia], timeline[ib]
    if tb <= ta:
        return {}
    ca, cb = ra[-1], rb[-1]
    return {k: round((cb[k] - ca.get(k, 0.0)) / (tb - ta), 3) for k in cb}


def run_phase(
    name: str,
    args: argparse.Namespace,
    ctx: Any,
    broker_cfg: dict[str, Any],
    broker_pid: int,
    db: str,
) -> dict[str, Any]:
    q = ctx.Queue()
    inbox = Inbox(q)
    stop, go = ctx.Event(), ctx.Event()
    handled = ctx.RawValue("q", 0)
    t_end = ctx.RawValue("d", 0.0)
    window_wall = ctx.RawArray("d", 2)
    sub_cfg = {**broker_cfg, "protocol": args.protocol}
    if name == "bare":
        cargs: tuple[Any, ...] = (q, name, bare_main, sub_cfg, stop, handled)
    else:
        cargs = (
            q,
            name,
            dctwin_main,
            sub_cfg,
            db,
            args.flush_interval,
            args.max_batch,
            str(args.profile) if args.profile else None,
            window_wall,
            stop,
            handled,
        )
    consumer = ctx.Process(target=_child, args=cargs, name=f"consumer-{name}")
    procs = [consumer]
    try:
        consumer.start()
        inbox.get("ready", name, 60, procs)
        nodes = node_names(args.nodes)
        pubs = []
        for i in range(args.publishers):
            role = f"publisher{i}"
            p = ctx.Process(
                target=_child,
                args=(
                    q,
                    role,
                    publisher_main,
                    broker_cfg,
                    args.client,
                    nodes[i :: args.publishers],
                    args.gpus,
                    args.variants,
                    args.window,
                    args.rate / args.publishers,
                    args.backlog,
                    args.publishers,
                    handled,
                    go,
                    t_end,
                ),
                name=role,
            )
            p.start()
            pubs.append((role, p))
            procs.append(p)
        for role, _ in pubs:
            inbox.get("ready", role, 120, procs)
        time.sleep(1.0)  # let the consumer's SUBSCRIBE settle before the first publish
        pids = {"broker": broker_pid, "consumer": consumer.pid}
        pids.update({role: p.pid for role, p in pubs})
        t0, wall0 = time.monotonic(), time.time()
        ta, tb = t0 + args.warmup, t0 + args.warmup + args.seconds
        window_wall[0], window_wall[1] = wall0 + args.warmup, wall0 + args.warmup + args.seconds
        t_end.value = tb + 0.5
        go.set()
        print(f"[{name}] publishing for {args.warmup + args.seconds:.0f} s ...", flush=True)
        time.sleep(max(0.0, ta - time.monotonic()))
        cpu_a = {k: _cpu_of(pid) for k, pid in pids.items()}
        cpu_ta = time.monotonic()
        time.sleep(max(0.0, tb - time.monotonic()))
        cpu_b = {k: _cpu_of(pid) for k, pid in pids.items()}
        cpu_tb = time.monotonic()
        at_end = handled.value
        pub_results = {role: inbox.get("result", role, 300, procs) for role, _ in pubs}
        published = sum(r["published"] for r in pub_results.values())
        unacked = sum(r["unacked"] for r in pub_results.values())
        for _, p in pubs:
            p.join(30)
        # Drain: wait until the consumer has everything the broker acknowledged.
        t_pub_end = time.monotonic()
        last, last_t = handled.value, t_pub_end
        print(
            f"[{name}] published {published:,} messages; consumer had {at_end:,} at the end of"
            " the window; draining ...",
            flush=True,
        )
        next_note = t_pub_end + 10
        while handled.value < published - unacked:
            time.sleep(0.1)
            now = time.monotonic()
            if handled.value != last:
                last, last_t = handled.value, now
            if now - last_t > args.drain_stall or now - t_pub_end > args.drain_timeout:
                print(f"[{name}] DRAIN GAVE UP at {handled.value:,} messages", flush=True)
                break
            if now >= next_note:
                left = published - unacked - handled.value
                print(f"[{name}]   {left:,} messages still to drain", flush=True)
                next_note = now + 10
        drain_s = time.monotonic() - t_pub_end
        stop.set()
        res = inbox.get("result", name, 600, procs)
        consumer.join(60)
    finally:
        stop.set()
        go.set()
        for p in procs:
            if p.is_alive():
                p.join(5)
            if p.is_alive():
                p.terminate()
    timeline = res.pop("timeline")
    msgs_s = _rate(timeline, ta, tb, 1)
    samples_s = _rate(timeline, ta, tb, 2) if name == "dctwin" else msgs_s * args.gpus
    pub_s = sum(_rate(r["timeline"], ta, tb, 1) for r in pub_results.values())
    cores = {k: round((cpu_b[k] - cpu_a[k]) / (cpu_tb - cpu_ta), 3) for k in cpu_a if k in cpu_b}
    out = {
        "published": published,
        "unacked_by_broker": unacked,
        "published_msgs_s": pub_s,
        "consumed_at_window_end": at_end,
        "msgs_s": msgs_s,
        "samples_s": samples_s,
        "steadiness_samples_s": _steadiness(timeline, ta, tb, 2 if name == "dctwin" else 1),
        "drain_s": drain_s,
        "cores": cores,
        "consumer_threads_cores": _thread_cores(timeline, ta, tb),
        "publishers": {
            r: {k: v for k, v in d.items() if k != "timeline"} for r, d in pub_results.items()
        },
        **res,
    }
    if name == "bare":
        out["steadiness_samples_s"] = {
            k: v * args.gpus for k, v in out["steadiness_samples_s"].items()
        }
    return out


def stage_costs(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Time each ingest stage offline on the same kind of payloads, in this process."""
    import pyarrow as pa

    from twin.ingest.ingester import Ingester
    from twin.store.schema import arrow_schema
    from twin.store.store import Store

    n = args.stages
    templates = build_templates(node_names(min(args.nodes, n)), args.gpus, args.variants, 7)
    items = generate(templates, n, args.variants)
    res: dict[str, float] = {}

    def timed(label: str, fn: Any) -> None:
        t0 = time.perf_counter()
        fn()
        res[label] = (time.perf_counter() - t0) / n * 1e6

    with Store(tmp / "warmup.duckdb") as store:  # first calls import and initialise things
        warm = items[:500]
        [orjson.loads(p) for _, p in warm]
        batch = Ingester(store).build_batch(warm)
        for kind, cols in batch.samples.items():
            pa.table(cols, schema=arrow_schema(kind))
        store.write(batch)

    def parse_all() -> None:
        for _, p in items:
            orjson.loads(p)

    def decode_all() -> None:
        for t, p in items:
            decode(t, p)

    timed("orjson.loads (parse only)", parse_all)
    timed("contract.decode (pydantic)", decode_all)
    db = tmp / "stages.duckdb"
    chunk = args.max_batch
    with Store(db) as store:
        ing = Ingester(store)
        build = arrow = write = 0.0
        for i in range(0, n, chunk):
            t0 = time.perf_counter()
            batch = ing.build_batch(items[i : i + chunk])
            t1 = time.perf_counter()
            for kind, cols in batch.samples.items():
                pa.table(cols, schema=arrow_schema(kind))
            t2 = time.perf_counter()
            store.write(batch)
            t3 = time.perf_counter()
            build, arrow, write = build + t1 - t0, arrow + t2 - t1, write + t3 - t2
    res["Ingester.build_batch (incl. decode)"] = build / n * 1e6
    with Store(tmp / "cpu.duckdb") as store:  # CPU time is less load-sensitive than wall time
        ing = Ingester(store)
        ing.build_batch(items[:chunk])
        best = float("inf")
        for _ in range(5):
            c0 = time.thread_time()
            for i in range(0, n, chunk):
                ing.build_batch(items[i : i + chunk])
            best = min(best, time.thread_time() - c0)
    res["Ingester.build_batch, thread CPU, best of 5"] = best / n * 1e6
    res["pa.table for the gpu columns"] = arrow / n * 1e6
    res["Store.write (Arrow + DuckDB insert, all tables)"] = write / n * 1e6
    per_msg = (
        res["Ingester.build_batch (incl. decode)"]
        + res["Store.write (Arrow + DuckDB insert, all tables)"]
    )
    readings = args.gpus * len(GPU_QUANTITIES)
    return {
        "messages": n,
        "us_per_message": {k: round(v, 2) for k, v in res.items()},
        "us_per_message_total": round(per_msg, 2),
        "readings_s_one_core_no_mqtt": readings / per_msg * 1e6,
    }


def _versions(broker_kind: str) -> dict[str, str]:
    import duckdb
    import paho.mqtt
    import pyarrow
    import pydantic

    out = {
        "python": platform.python_version(),
        "duckdb": duckdb.__version__,
        "paho-mqtt": paho.mqtt.__version__,
        "pyarrow": pyarrow.__version__,
        "pydantic": pydantic.__version__,
        "orjson": orjson.__version__,
        "broker": broker_kind,
    }
    exe = shutil.which("mosquitto")
    if exe:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            first = subprocess.run(
                [exe, "-h"], capture_output=True, text=True, timeout=5
            ).stdout.splitlines()
            out["mosquitto"] = first[0].removeprefix("mosquitto version ") if first else "?"
    return out


def _machine() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"nproc": os.cpu_count(), "cpu": model, "ram_gib": round(mem / 2**30, 1)}


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench_ingest.py",
        description=(
            "End-to-end ingest benchmark: simulator-format GPU messages at QoS 1 through a "
            "local mosquitto into (1) a bare paho subscriber that only counts them (reference) "
            "and (2) dctwin's real ingest path (MqttIngestService + Ingester + Store) on a "
            "DuckDB file; reports samples/s and readings/s over the measuring window, checks "
            "that everything published was stored, and reports bytes per million readings."
        ),
        formatter_class=_HelpFormatter,
        epilog=(
            "Rates are measured over --seconds, starting --warmup seconds after the publishers"
            " start; a reading is one quantity of one sample. Targets: >= 1,000,000 readings/s"
            " and >= 90 % of the bare subscriber (issue 12). Exit status 0 when everything"
            " published was stored exactly once (targets met or not), 1 on loss, dead letters,"
            " duplicates or"
            " a failed phase. Linux only (reads /proc for CPU use)."
        ),
    )
    ap.add_argument("--seconds", type=float, default=60.0, help="measuring window [s]")
    ap.add_argument("--warmup", type=float, default=5.0, help="load before the window starts [s]")
    ap.add_argument(
        "--publishers",
        type=int,
        default=1,
        help="publisher processes (each owns nodes/N of the sources)",
    )
    ap.add_argument("--nodes", type=int, default=1000, help="sources (one message per poll)")
    ap.add_argument("--gpus", type=int, default=8, help="GPU samples per message")
    ap.add_argument("--variants", type=int, default=16, help="pre-generated value sets per node")
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="total publish rate [messages/s]; 0 publishes as fast as the broker takes them"
        " (within --backlog)",
    )
    ap.add_argument(
        "--client",
        choices=("raw", "paho"),
        default="raw",
        help="publisher's MQTT client: raw = minimal MQTT 3.1.1 QoS 1 client on a socket (a"
        " few us per message), paho = paho-mqtt with its network thread, as the simulator"
        " publishes (~200 us per message here: it becomes the bottleneck)",
    )
    ap.add_argument(
        "--protocol",
        choices=("auto", "5", "3.1.1"),
        default="auto",
        help="MQTT version of both subscribers (BrokerConfig.protocol; auto = v5 with mosquitto,"
        " as dctwin serve does)",
    )
    ap.add_argument(
        "--backlog",
        type=int,
        default=50_000,
        help="publishers pause while more than this many messages wait in the broker for the"
        " consumer (bounds the broker's memory; 0 = no bound)",
    )
    ap.add_argument(
        "--window",
        type=int,
        default=2000,
        help="unacknowledged QoS 1 messages per publisher before it waits for PUBACKs (at most"
        " 65000; paho keeps 1000 of them in flight and queues the rest)",
    )
    ap.add_argument(
        "--phases",
        default="bare,dctwin",
        help="comma-separated phases to run: bare (reference subscriber), dctwin (ingest)",
    )
    ap.add_argument(
        "--broker",
        choices=("mosquitto", "embedded"),
        default="mosquitto",
        help="broker to start; falls back to embedded (amqtt) if mosquitto is not on PATH",
    )
    ap.add_argument(
        "--db",
        type=Path,
        default=None,
        help="DuckDB file for the dctwin phase, kept afterwards (must not exist); default: a"
        " temporary file, deleted",
    )
    ap.add_argument(
        "--flush-interval", type=float, default=0.25, help="ServiceOptions.flush_interval_s"
    )
    ap.add_argument(
        "--max-batch", type=int, default=20_000, help="ServiceOptions.max_batch_messages"
    )
    ap.add_argument(
        "--stages",
        type=int,
        default=20_000,
        help="messages for the offline per-stage timing, in batches of --max-batch (0 skips it)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="run the dctwin process under cProfile, one profile per thread (.pstats and"
        " .txt) into this dir; slows the ingest, so do not record figures from such a run",
    )
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=900.0,
        help="longest wait for the consumer to catch up after publishing stops [s]",
    )
    ap.add_argument(
        "--drain-stall", type=float, default=60.0, help="give up draining after no progress [s]"
    )
    ap.add_argument(
        "--broker-log", type=Path, default=None, help="keep the broker's log in this file"
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = ap.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or set(phases) - {"bare", "dctwin"}:
        ap.error("--phases takes bare, dctwin or both")
    if args.publishers < 1 or args.nodes < args.publishers or args.gpus < 1 or args.variants < 1:
        ap.error("need --publishers >= 1, --nodes >= --publishers, --gpus >= 1, --variants >= 1")
    if not 1 <= args.window <= 65000:
        ap.error("--window must be 1..65000 (MQTT packet ids are 16 bits)")
    if args.db is not None and args.db.exists():
        ap.error(f"--db {args.db} exists; give a new path")

    from twin.broker import start_broker

    notes = []
    try:
        broker = start_broker(args.broker, log_path=args.broker_log)
    except RuntimeError as e:
        notes.append(f"mosquitto unavailable ({e}); FELL BACK to the embedded amqtt broker")
        broker = start_broker("embedded", log_path=args.broker_log)
    broker_cfg: dict[str, Any] = {"host": broker.host, "port": broker.port}
    if broker.username:
        broker_cfg["username"] = broker.username
    versions = _versions(broker.kind)
    machine = _machine()
    readings_per_sample = len(GPU_QUANTITIES)
    sample_payload = build_templates(node_names(1), args.gpus, 1, 0)[0].payload(
        1, _fmt_ts(datetime.now(UTC)), 0
    )
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "versions": versions,
        "notes": notes,
        "config": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"
        },
        "payload_bytes": len(sample_payload),
        "readings_per_sample": readings_per_sample,
        "broker": broker.address,
    }
    for note in notes:
        print(f"NOTE: {note}", flush=True)
    print(
        f"broker {broker.kind} at {broker.address}; {machine['nproc']} cores ({machine['cpu']}),"
        f" {machine['ram_gib']} GiB; {args.nodes} nodes x {args.gpus} GPUs x"
        f" {readings_per_sample} quantities, payload {len(sample_payload)} B",
        flush=True,
    )
    ok = True
    tmp = Path(tempfile.mkdtemp(prefix="dctwin-bench-"))
    ctx = mp.get_context("spawn")
    try:
        if args.stages > 0:
            print(f"[stages] timing each stage offline on {args.stages:,} messages ...")
            results["stages"] = stage_costs(args, tmp)
        for name in phases:
            db = str(args.db or tmp / "bench.duckdb")
            results[name] = run_phase(name, args, ctx, broker_cfg, broker.process.pid, db)
    except Exception as e:
        traceback.print_exc()
        results["error"] = f"{type(e).__name__}: {e}"
        ok = False
    finally:
        broker.stop()
        if args.db is None:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            (tmp / "stages.duckdb").unlink(missing_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
    ok = _summarize(results, args) and ok
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {args.json}")
    return 0 if ok else 1


def _summarize(r: dict[str, Any], args: argparse.Namespace) -> bool:
    """Print the human-readable summary; add derived figures to ``r``; False on loss."""
    ok = True
    rps = r["readings_per_sample"]
    print()
    print(f"=== dctwin ingest benchmark, {r['date']} ===")
    print(
        f"load: {args.publishers} publisher process(es), "
        + ("as fast as the broker takes them" if not args.rate else f"{args.rate:,.0f} msg/s")
        + f", QoS 1; window {args.seconds:g} s after {args.warmup:g} s warm-up"
    )
    if "stages" in r:
        s = r["stages"]
        print(f"\noffline stage costs (one process, no MQTT, {s['messages']:,} messages):")
        for k, v in s["us_per_message"].items():
            print(f"  {k:<48} {v:8.1f} us/message")
        print(
            f"  => {s['us_per_message_total']:.1f} us/message: at most"
            f" {_fmt(s['readings_s_one_core_no_mqtt'])} readings/s on one core before MQTT"
        )
    rows = []
    for name, label in (("bare", "bare paho subscriber"), ("dctwin", "dctwin ingest")):
        if name in r:
            p = r[name]
            rows.append(
                (
                    label,
                    p["published_msgs_s"],
                    p["msgs_s"],
                    p["samples_s"],
                    p["samples_s"] * rps,
                )
            )
            p["readings_s"] = p["samples_s"] * rps
    if rows:
        print(f"\n{'':<22}{'published msg/s':>16}{'msg/s':>10}{'samples/s':>12}{'readings/s':>13}")
        for label, pub, m, s_, rd in rows:
            print(f"{label:<22}{_fmt(pub):>16}{_fmt(m):>10}{_fmt(s_):>12}{_fmt(rd):>13}")
    for name in ("bare", "dctwin"):
        if name in r:
            p = r[name]
            st = p.get("steadiness_samples_s") or {}
            cores = ", ".join(f"{k} {v:.2f}" for k, v in p["cores"].items())
            threads = ", ".join(f"{k} {v:.2f}" for k, v in p["consumer_threads_cores"].items())
            print(f"\n[{name}] cores over the window: {cores}")
            print(f"[{name}] consumer threads (cores): {threads}")
            if st:
                print(
                    f"[{name}] readings/s over 5 s slices: min {_fmt(st['min_5s'] * rps)},"
                    f" max {_fmt(st['max_5s'] * rps)}; drain after publishing"
                    f" {p['drain_s']:.1f} s"
                )
            if p["unacked_by_broker"]:
                print(f"[{name}] WARNING: {p['unacked_by_broker']} messages never PUBACKed")
    if "bare" in r:
        b = r["bare"]
        if b["messages"] != b["published"]:
            print(
                f"\n[bare] LOSS: published {b['published']:,}, the bare subscriber got"
                f" {b['messages']:,}"
            )
            ok = False
    if "dctwin" in r:
        d = r["dctwin"]
        gpus = args.gpus
        dead = sum(d["dead_letters"].values())
        problems = []
        if d["log_messages"] != d["published"]:
            problems.append(
                f"stored messages {d['log_messages']:,} != published {d['published']:,}"
                f" (difference {d['log_messages'] - d['published']:+,})"
            )
        if d["gpu_rows"] != d["published"] * gpus:
            problems.append(f"gpu rows {d['gpu_rows']:,} != published x {gpus}")
        if dead:
            problems.append(f"dead letters {d['dead_letters']}")
        if d["counters"]["duplicates"] or d["duplicate_rows"]:
            problems.append(
                f"duplicates: {d['counters']['duplicates']} messages, {d['duplicate_rows']} rows"
            )
        if d["seq_missing"]:
            problems.append(f"{d['seq_missing']} seq gaps in ingest_log")
        if d["write_errors"]:
            problems.append(f"{d['write_errors']} store write errors ({d['last_error']})")
        print(
            f"\n[dctwin] published {d['published']:,} messages; stored {d['log_messages']:,}"
            f" messages, {d['gpu_rows']:,} gpu rows, {d['readings']:,} readings; dead letters"
            f" {dead}; duplicates {d['counters']['duplicates']}; seq gaps {d['seq_missing']}"
        )
        win = d["window_log_samples"] / args.seconds
        print(
            f"[dctwin] cross-check from ingest_log.received_at: {_fmt(win)} samples/s,"
            f" {_fmt(win * rps)} readings/s in the window"
        )
        if d["window_batches"]:
            print(
                f"[dctwin] {d['window_batches']:,} store transactions in the window, mean"
                f" {d['window_log_messages'] / d['window_batches']:,.0f} messages each"
            )
        if problems:
            ok = False
            print("!" * 78)
            for prob in problems:
                print(f"!!! DATA PROBLEM: {prob}")
            print("!" * 78)
        else:
            print("[dctwin] no loss: stored == published, 0 dead letters, 0 duplicates")
        main_file = Path(str(args.db or "bench.duckdb")).name
        size = d["files"].get(main_file) or max(d["files"].values(), default=0)
        d["file_bytes"] = size
        d["bytes_per_million_readings"] = size / d["readings"] * 1e6 if d["readings"] else None
        used = int(d["database_size"].get("used_blocks", 0)) * int(
            d["database_size"].get("block_size", 262144)
        )
        d["used_bytes_per_million_readings"] = used / d["readings"] * 1e6 if d["readings"] else None
        gpu_bytes = d["table_blocks"]["gpu"] * 262144
        d["gpu_table_bytes_per_million_readings"] = (
            gpu_bytes / d["readings"] * 1e6 if d["readings"] else None
        )
        if d["readings"]:
            print(
                f"[storage] {size / 1e6:,.1f} MB file after CHECKPOINT for {d['readings']:,}"
                f" readings: {_fmt(d['bytes_per_million_readings'])} bytes per million readings"
                f" (used blocks only: {_fmt(d['used_bytes_per_million_readings'])};"
                f" gpu table alone ~{_fmt(d['gpu_table_bytes_per_million_readings'])}, from"
                f" {d['table_blocks']['gpu']} blocks of 256 KiB; ingest_log"
                f" {d['table_blocks']['ingest_log']} blocks)"
            )
        readings_s = d["readings_s"]
        r["targets"] = {"readings_s": readings_s, "readings_s_target": TARGET_READINGS_S}
        verdict = "MET" if readings_s >= TARGET_READINGS_S else "MISSED"
        print(
            f"\nTARGET >= {_fmt(TARGET_READINGS_S)} readings/s: {verdict}"
            f" ({readings_s / TARGET_READINGS_S:.0%} of target)"
        )
        if "bare" in r:
            ratio = d["samples_s"] / r["bare"]["samples_s"] if r["bare"]["samples_s"] else 0.0
            r["targets"]["ratio_to_bare"] = ratio
            verdict = "MET" if ratio >= TARGET_RATIO else "MISSED"
            print(f"TARGET >= {TARGET_RATIO:.0%} of the bare subscriber: {verdict} ({ratio:.0%})")
        for thread, prof in d.get("profiles", {}).items():
            print(f"\n[profile] thread {thread}: top functions by own time")
            for row in prof["top_by_tottime"][:15]:
                print(
                    f"  {row['tottime_s']:8.2f} s own {row['cumtime_s']:8.2f} s cum"
                    f" {row['ncalls']:>10}  {row['function']}"
                )
            if prof["key_functions"]:
                print(f"[profile] thread {thread}: cumulative time of key functions")
                for k, v in prof["key_functions"].items():
                    print(f"  {v['cumtime_s']:8.2f} s {v['ncalls']:>10} calls  {k}")
    if "error" in r:
        print(f"\nERROR: {r['error']}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
