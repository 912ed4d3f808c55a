"""Store-and-forward: the runner against a real broker that goes away and comes back on the same
port, a full spool, a spool handed from one runner to the next, and the spool file format."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from collectors.base import MessageBuilder
from collectors.contract import TOPIC_PREFIX, decode
from collectors.mqtt import BrokerConfig, connect, prepare_session, wait_until
from collectors.runner import Runner, RunnerConfig
from collectors.spool import MAGIC, Spool, SpoolError
from twin.broker import LocalBroker, free_port, start_broker

from .helpers import TEST_BROKER

SITE = "runner-test"
OUTAGE_S = 30.0


class CountingCollector:
    """A collector whose every poll is one gpu message; it remembers what it produced."""

    def __init__(self, source: str = "node-a", pad: int = 0, seq_start: int = 0):
        self.name = f"counting {source}"
        self.source = source
        self.pad = pad
        self.builder = MessageBuilder(SITE, "test", seq_start=seq_start)
        self.produced: list[tuple[str, int]] = []
        self.paused = threading.Event()
        self._lock = threading.Lock()

    def poll(self) -> list[tuple[str, bytes]]:
        if self.paused.is_set():
            return []
        with self._lock:
            sample = {"id": f"{self.source}:0", "power_w": 100.0 + len(self.produced)}
            if self.pad:
                sample.update({f"pad_{i}": float(i) for i in range(self.pad)})
            topic, payload = self.builder.message("gpu", self.source, [sample])
            self.produced.append((self.source, orjson.loads(payload)["seq"]))
        return [(topic, payload)]

    def close(self) -> None:
        pass


class Subscriber:
    """A persistent-session QoS 1 subscriber recording (source, seq) in arrival order."""

    def __init__(self, cfg: BrokerConfig, client_id: str = "runner-test-sub"):
        self.got: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        topic = f"{TOPIC_PREFIX}/{SITE}/#"
        prepare_session(cfg, client_id, topic)  # the broker queues for us from here on
        self.client = connect(
            cfg, client_id, persistent=True, on_message=self._on, subscriptions=[topic]
        )

    def _on(self, client, userdata, msg) -> None:
        m = decode(msg.topic, msg.payload)
        with self._lock:
            self.got.append((m.source, m.seq))

    def received(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self.got)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def runner_config(spool: Path, **kw) -> RunnerConfig:
    base = {
        "interval_s": 0.25,
        "spool_dir": spool,
        "reconnect_min_s": 0.5,
        "reconnect_max_s": 8.0,
        "drain_on_stop_s": 5.0,
    }
    return RunnerConfig(**{**base, **kw})


def dead_broker() -> BrokerConfig:
    """A broker address where nothing listens."""
    return BrokerConfig(host="127.0.0.1", port=free_port(), protocol="3.1.1")


@pytest.mark.mqtt
@pytest.mark.slow
def test_broker_outage_every_message_arrives_once_in_order(broker: LocalBroker, tmp_path):
    """Publish through the runner, lose the broker for 30 s mid-stream (with messages in
    flight), restart it on the same port: every message arrives, in order, none twice."""
    cfg = broker.client_config()
    col = CountingCollector()
    sub = Subscriber(cfg)
    runner = Runner(col, cfg, runner_config(tmp_path / "spool"))
    runner.start()
    restarted: LocalBroker | None = None
    try:
        assert wait_until(lambda: len(sub.received()) >= 8, 30)

        # What the broker acknowledged so far has reached the subscriber (the broker keeps
        # no messages across its restart). Then it freezes mid-stream: messages keep going out
        # but no PUBACK comes back, and it dies with them in flight, never having forwarded
        # them. The runner must send them again, and only them, when the broker returns.
        col.paused.set()
        assert wait_until(lambda: runner.stats.pending == 0, 30)
        assert wait_until(lambda: len(sub.received()) == len(col.produced), 30)
        before = len(col.produced)
        os.kill(broker.process.pid, signal.SIGSTOP)
        col.paused.clear()
        assert wait_until(lambda: runner.stats.pending >= 3, 30)  # sent, not acknowledged
        os.kill(broker.process.pid, signal.SIGKILL)
        broker.process.wait(10)
        sub.stop()

        outage_end = time.monotonic() + OUTAGE_S
        assert wait_until(lambda: not runner.stats.connected, 30)
        while time.monotonic() < outage_end:
            time.sleep(0.5)
        s = runner.stats
        assert s.spooled > 0 and s.pending > 0 and s.connect_failures > 0
        assert len(col.produced) > before + 10  # kept polling through the outage

        # Restart on the SAME port just after a failed reconnect attempt, so that the test's
        # subscriber session exists before the runner's next attempt (backoff is at 8 s now).
        failures = runner.stats.connect_failures
        assert wait_until(lambda: runner.stats.connect_failures > failures, 30)
        restarted = start_broker(
            TEST_BROKER,  # type: ignore[arg-type]
            port=broker.port,
            log_path=tmp_path / "broker2.log",
        )
        sub = Subscriber(cfg)
        assert wait_until(lambda: runner.stats.connected, 60)

        assert wait_until(lambda: len(sub.received()) >= before + 5, 60)
        col.paused.set()
        assert wait_until(lambda: runner.stats.pending == 0, 60)
        assert wait_until(lambda: set(col.produced[before:]) <= set(sub.received()), 30)
        time.sleep(0.5)  # anything sent twice would arrive by now
        received = sub.received()
        assert received == col.produced[before:], "not every message once, in order"
        stats = runner.stop()
        assert stats.published == len(col.produced)
        assert stats.dropped == 0 and stats.rejected == 0 and stats.pending == 0
        assert stats.disconnects >= 1 and stats.connects >= 2
    finally:
        if runner.running:
            runner.stop(drain_s=0)
        sub.stop()
        if restarted is not None:
            restarted.stop()


@pytest.mark.mqtt
def test_full_spool_drops_newest_with_a_clear_error_then_drains_the_rest(
    broker: LocalBroker, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="collectors.runner")
    spool = tmp_path / "spool"
    col = CountingCollector(pad=40)  # about 1 KB a message
    r1 = Runner(
        col,
        dead_broker(),
        runner_config(spool, spool_max_bytes=16 * 1024, spool_segment_bytes=4096),
    )
    r1.start(poll=False)
    for _ in range(40):
        r1.poll_once()
    s = r1.stats
    assert s.dropped > 0 and s.produced + s.dropped == 40
    assert s.pending == s.produced and s.spooled == s.produced and s.published == 0
    full = [r for r in caplog.records if "is full" in r.getMessage()]
    assert len(full) == 1 and full[0].levelno == logging.ERROR  # once per full spell
    assert "drop-newest" in full[0].getMessage()
    assert r1.spool.used_bytes <= 16 * 1024
    kept = col.produced[: s.produced]  # the oldest are kept, the newest dropped
    r1.stop(drain_s=0)

    sub = Subscriber(broker.client_config())
    r2 = Runner(col, broker.client_config(), runner_config(spool, spool_max_bytes=16 * 1024))
    r2.start(poll=False)
    try:
        assert wait_until(lambda: r2.stats.pending == 0, 60)
        assert wait_until(lambda: len(sub.received()) >= len(kept), 30)
        caplog.clear()
        r2.poll_once()  # room again: the next message is taken and published
        assert wait_until(lambda: len(sub.received()) == len(kept) + 1, 30)
        assert sub.received() == [*kept, col.produced[-1]]
        assert r2.stats.dropped == 0
    finally:
        r2.stop(drain_s=0)
        sub.stop()


@pytest.mark.mqtt
def test_spool_survives_a_collector_restart(broker: LocalBroker, tmp_path):
    spool = tmp_path / "spool"
    col = CountingCollector()
    r1 = Runner(col, dead_broker(), runner_config(spool))
    r1.start(poll=False)
    for _ in range(25):
        r1.poll_once()
    assert r1.stats.pending == 25
    with pytest.raises(SpoolError, match="in use"):
        Runner(col, dead_broker(), runner_config(spool))  # one runner per spool
    r1.stop(drain_s=0)

    sub = Subscriber(broker.client_config())
    # The next run, with a new collector process (a seq range of its own), on the same spool.
    col2 = CountingCollector(seq_start=10_000)
    r2 = Runner(col2, broker.client_config(), runner_config(spool, interval_s=0.05))
    assert r2.stats.pending == 25
    r2.start()
    try:
        assert wait_until(lambda: len(col2.produced) >= 10, 30)
        col2.paused.set()
        assert wait_until(lambda: r2.stats.pending == 0, 60)
        expected = col.produced + col2.produced
        assert wait_until(lambda: len(sub.received()) >= len(expected), 30)
        time.sleep(0.3)
        assert sub.received() == expected  # the earlier run's first, in order, once
    finally:
        r2.stop(drain_s=0)
    # Nothing acknowledged is sent again by a third run.
    r3 = Runner(col2, broker.client_config(), runner_config(spool))
    assert r3.stats.pending == 0 and r3.spool.read() == []
    r3.spool.close()
    sub.stop()


# -- the spool itself (no broker) ---------------------------------------------------------


def test_spool_order_rotation_commit_and_reopen(tmp_path):
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100, fsync=False) as sp:
        for i in range(20):
            assert sp.append(f"t/{i}", f"payload-{i}".encode())
        sp.flush()
        recs = sp.read(limit=100)
        assert [r.topic for r in recs] == [f"t/{i}" for i in range(20)]
        assert len(list(tmp_path.glob("*.seg"))) > 2  # rotated
        sp.commit(recs[9].end, 10)
        assert sp.pending == 10
        assert [r.payload for r in sp.read(limit=3)] == [
            b"payload-10",
            b"payload-11",
            b"payload-12",
        ]
        # read after a position: continues from there, never before the cursor
        assert sp.read(recs[14].end, limit=1)[0].topic == "t/15"
        assert sp.read(recs[2].end, limit=1)[0].topic == "t/10"
    segments_before = len(list(tmp_path.glob("*.seg")))
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100, fsync=False) as sp:
        assert sp.pending == 10
        assert [r.topic for r in sp.read(limit=100)] == [f"t/{i}" for i in range(10, 20)]
        assert len(list(tmp_path.glob("*.seg"))) <= segments_before
        last = sp.read(limit=100)[-1]
        sp.commit(last.end, 10)
        assert sp.pending == 0 and sp.read() == []
    with Spool(tmp_path, max_bytes=1 << 20, fsync=False) as sp:
        assert sp.pending == 0 and sp.read() == []


def test_spool_cuts_a_torn_tail_record(tmp_path, caplog):
    with Spool(tmp_path, max_bytes=1 << 20, fsync=True) as sp:
        for i in range(3):
            sp.append("t", f"m{i}".encode())
    [seg] = tmp_path.glob("*.seg")
    assert seg.read_bytes().startswith(MAGIC)
    with seg.open("ab") as f:
        f.write(b"\x00\x00\x01\x00\xde\xad")  # a crash mid-record: header, no body
    with Spool(tmp_path, max_bytes=1 << 20) as sp:
        assert sp.pending == 3
        assert [r.payload for r in sp.read()] == [b"m0", b"m1", b"m2"]
        assert sp.append("t", b"m3")
        assert [r.payload for r in sp.read()][-1] == b"m3"
    assert "torn record" in caplog.text


def test_spool_bound_counts_unsent_bytes_only(tmp_path):
    with Spool(tmp_path, max_bytes=1000, segment_bytes=400, fsync=False) as sp:
        n = 0
        while sp.append("t", b"x" * 90):
            n += 1
        assert 0 < n < 11 and sp.used_bytes <= 1000
        recs = sp.read(limit=100)
        sp.commit(recs[-1].end, len(recs))  # all sent: room again
        assert sp.used_bytes == 0
        assert sp.append("t", b"x" * 90)
