"""Nothing stops the twin, round two (issue 28): the contract's bounds on nesting, string
lengths and counts give one dead-letter reason per limit on every path (decode(), the batch
decoder's Python and Arrow paths, the table path); a bad message costs its batch no extra
transaction, a bug one at most; `dctwin ingest --file` stores every valid line; a message is
stored once whenever it comes back (re-published hours later, a retained message redelivered
after a restart, a second import), through `dctwin serve` with a real broker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest

from collectors.contract import (
    DEAD_LETTER_REASONS,
    MAX_DEPTH,
    MAX_EXTRA_VALUES,
    MAX_SAMPLE_KEYS,
    MAX_SAMPLES,
    ContractError,
    decode,
    encode,
    topic_for,
)
from collectors.mqtt import connect, wait_until
from twin.health import ServiceHealth
from twin.ingest import Ingester, IngestLimits
from twin.ingest.batch_decode import BatchDecoder
from twin.ingest.mqtt_service import MqttIngestService, ServiceOptions
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE, broker_config

SITE = "small"
SOURCE = "trn-r01-n1"
TOPIC = topic_for(SITE, "gpu", SOURCE)


def now_s() -> float:
    return datetime.now(UTC).timestamp()


def good(seq: int, ts: float | None = None, source: str = SOURCE) -> tuple[str, bytes]:
    sample = {"id": f"{source}:0", "power_w": 300.0 + seq % 100, "temp_c": 55.0}
    return topic_for(SITE, "gpu", source), encode(
        collector="t", source=source, seq=seq, ts=now_s() if ts is None else ts, samples=[sample]
    )


def body(seq: int = 1, **over) -> dict:
    b = {
        "v": 1,
        "collector": "t",
        "source": SOURCE,
        "seq": seq,
        "ts": round(now_s(), 3),
        "samples": [{"id": f"{SOURCE}:0", "power_w": 1.0}],
    }
    b.update(over)
    return b


def deep(seq: int, depth: int = 300) -> tuple[str, bytes]:
    """A gpu message with a sample quantity nested ``depth`` arrays deep (~600 bytes)."""
    head = orjson.dumps(body(seq, samples=[]))[:-3]  # ... "samples":
    nest = b"[" * depth + b"]" * depth
    return TOPIC, head + b'[{"id":"%s:0","power_w":' % SOURCE.encode() + nest + b"}]}"


LONG_SOURCE = "s" * 60_000


def shapes(seq: int) -> dict[str, tuple[str, bytes, str]]:
    """One message per limit (and the smaller findings of issue 28), with its reason."""
    many_extras = [
        {"id": f"{SOURCE}:{j}", **{f"x{i}_w": 1.0 for i in range(50)}}
        for j in range(MAX_EXTRA_VALUES // 50 + 1)
    ]
    return {
        "nested_300": (*deep(seq), "too_deep"),
        "nested_top": (TOPIC, b"[" * 400 + b"]" * 400, "too_deep"),
        "long_source": (
            topic_for(SITE, "gpu", LONG_SOURCE),
            orjson.dumps(body(seq, source=LONG_SOURCE)),
            "wrong_type",
        ),
        "seq_4401_digits": (
            TOPIC,
            orjson.dumps(body(seq)).replace(b'"seq":%d' % seq, b'"seq":' + b"9" * 4401),
            "out_of_range",
        ),
        "sample_is_list": (TOPIC, orjson.dumps(body(seq, samples=[[1, 2, 3]])), "wrong_type"),
        "too_many_samples": (
            TOPIC,
            orjson.dumps(body(seq, samples=[{"id": f"{SOURCE}:0"}] * (MAX_SAMPLES + 1))),
            "too_many_samples",
        ),
        "too_many_keys": (
            TOPIC,
            orjson.dumps(
                body(
                    seq,
                    samples=[
                        {"id": f"{SOURCE}:0", **{f"x{i}_w": 1.0 for i in range(MAX_SAMPLE_KEYS)}}
                    ],
                )
            ),
            "too_many_quantities",
        ),
        "too_many_extras": (TOPIC, orjson.dumps(body(seq, samples=many_extras)), "too_many_extras"),
    }


def test_every_limit_is_documented_with_its_reason():
    for reason in ("too_deep", "too_many_samples", "too_many_quantities", "too_many_extras"):
        assert reason in DEAD_LETTER_REASONS
    assert str(MAX_DEPTH) in DEAD_LETTER_REASONS["too_deep"]
    readme = (Path(__file__).resolve().parents[1] / "docs" / "wire-contract.md").read_text()
    for reason in ("too_deep", "too_many_samples", "too_many_quantities", "too_many_extras"):
        assert f"`{reason}`" in readme, reason


@pytest.mark.parametrize("name", list(shapes(1)))
def test_each_limit_gives_one_reason_on_every_path(name):
    topic, payload, reason = shapes(7)[name]
    with pytest.raises(ContractError) as e:
        decode(topic, payload, SITE)
    assert e.value.reason == reason, e.value
    # alone (the Python path) and among 200 good messages (the Arrow path takes those)
    for items in ([(topic, payload)], [good(i) for i in range(200)] + [(topic, payload)]):
        batch = BatchDecoder(SITE).decode_batch(items)
        assert [(i, err.reason) for i, err in batch.refused] == [(len(items) - 1, reason)]
        assert len(batch.messages) == len(items) - 1


def _table(rows: list[dict], seq: int) -> tuple[pa.Table, np.ndarray]:
    table = pa.Table.from_pylist(rows)
    return table, np.full(table.num_rows, seq, dtype=np.int64)


def test_the_table_path_dead_letters_with_the_same_reasons(tmp_path):
    """ingest_table (replay's columns): a message past a bound goes to the message path and
    is dead-lettered with the reason decode() gives."""
    ts = datetime.now(UTC).replace(microsecond=0)
    cases = {
        "too_many_samples": [
            {"ts": ts, "source": SOURCE, "id": f"{SOURCE}:{i}", "power_w": 1.0}
            for i in range(MAX_SAMPLES + 1)
        ],
        "too_many_extras": [
            {"ts": ts, "source": SOURCE, "id": f"{SOURCE}:{j}"}
            | {f"x{i}_w": 1.0 for i in range(50)}
            for j in range(MAX_EXTRA_VALUES // 50 + 1)
        ],
        "wrong_type": [{"ts": ts, "source": LONG_SOURCE, "id": "a", "power_w": 1.0}],
    }
    with Store(tmp_path / "t.duckdb") as store:
        ing = Ingester(store, None, IngestLimits(max_past_s=0))
        for seq, (reason, rows) in enumerate(cases.items()):
            table, seqs = _table(rows, seq)
            ing.ingest_table("gpu", table, seqs, "t", site=SITE)
            assert ing.counters.dead_letters[reason] == 1, ing.counters.as_dict()
        table, seqs = _table([{"ts": ts, "source": SOURCE, "id": "a", "power_w": 2.0}], 99)
        ing.ingest_table("gpu", table, seqs, "t", site=SITE)
        assert store.sample_counts()["gpu"] == 1
        assert store.con.execute("SELECT count(*) FROM extra_readings").fetchall()[0][0] == 0


def test_an_outlet_id_must_follow_the_grammar():
    site = load_site(SMALL_SITE)
    assert site.is_known("pdu", "pdu-r01-a/outlet7")
    assert site.is_known("pdu", "pdu-r01-a/outletA1")
    assert site.is_known("pdu", "pdu-r01-a/outlet1-1")
    for bad in ("pdu-r01-a/outlet<img src=x>", "pdu-r01-a/outlet", "pdu-r01-a/outlet/../x"):
        assert not site.is_known("pdu", bad), bad
    assert not site.is_known("pdu", "nope/outlet1")


class _CountingStore:
    """Counts the transactions (Store.write calls) of a real store."""

    def __init__(self, store: Store):
        self.writes = 0
        self._write = store.write
        store.write = self.write  # type: ignore[method-assign]

    def write(self, batch) -> None:
        self.writes += 1
        self._write(batch)


def test_bad_messages_cost_no_extra_transaction_and_a_bug_one(tmp_path, monkeypatch):
    with Store(tmp_path / "b.duckdb") as store:
        counting = _CountingStore(store)
        ing = Ingester(store, None)
        items = [good(i) for i in range(300)]
        for j, (t, p, _) in enumerate(shapes(1000).values()):
            items.insert(10 + 30 * j, (t, p))
        assert ing.ingest_or_isolate(items) == 0
        assert counting.writes == 1 and ing.counters.store_splits == 0
        assert ing.counters.stored_messages == 300
        assert sum(ing.counters.dead_letters.values()) == len(shapes(1))
        assert "ingest_error" not in ing.counters.dead_letters
        # a bug the ingest hits on one message (here: on the payload holding seq 1005)
        real = ing.decoder.decode_batch
        marker = b'"seq":1005,'

        def buggy(batch_items, **kw):
            if any(marker in p for _, p in batch_items):
                raise KeyError("a bug")
            return real(batch_items, **kw)

        monkeypatch.setattr(ing.decoder, "decode_batch", buggy)
        counting.writes = 0
        assert ing.ingest_or_isolate([good(i) for i in range(1000, 1100)]) == 1
        assert counting.writes == 1  # the 99 others and the dead letter in one transaction
        assert ing.counters.stored_messages == 399
        assert ing.counters.dead_letters["ingest_error"] == 1
        (detail,) = store.con.execute(
            "SELECT detail FROM dead_letters WHERE reason = 'ingest_error'"
        ).fetchall()[0]
        assert "KeyError" in detail


def _jsonl(path: Path, items: list[tuple[str, bytes]]) -> None:
    """One ``{"topic": ..., "payload": {...}}`` line per item: the payload as JSON in the line
    (as it is, when orjson cannot write it: nested too deep), or as a string when it is not
    JSON orjson reads."""
    with path.open("wb") as f:
        for t, p in items:
            try:
                line = orjson.dumps({"topic": t, "payload": orjson.loads(p)})
            except TypeError:  # nested past orjson's writer: the payload's own bytes
                line = b'{"topic":"%s","payload":%s}' % (t.encode(), p)
            except orjson.JSONDecodeError:
                line = orjson.dumps({"topic": t, "payload": p.decode()})
            if p.startswith(b"[" * 1100):  # past orjson's reader too: as it is
                line = b'{"topic":"%s","payload":%s}' % (t.encode(), p)
            f.write(line + b"\n")


def _dctwin(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "twin.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_dctwin_ingest_file_stores_every_valid_line_and_reports_the_rest(tmp_path):
    items = [good(i) for i in range(100)]
    bad = shapes(500)
    for j, (t, p, _) in enumerate(bad.values()):
        items.insert(5 + 10 * j, (t, p))
    items.insert(50, deep(600, depth=300))
    items.insert(60, (TOPIC, b"[" * 2000 + b"]" * 2000))  # past orjson's own parse limit
    jsonl = tmp_path / "m.jsonl"
    _jsonl(jsonl, items)
    db = tmp_path / "f.duckdb"
    r = _dctwin("ingest", "--file", str(jsonl), "--db", str(db), "--site", str(SMALL_SITE))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    counters = json.loads(r.stdout.strip().splitlines()[-1])
    assert counters["stored_messages"] == 100, counters
    dead = counters["dead_letters"]
    assert "ingest_error" not in dead
    assert sum(dead.values()) == len(bad) + 2, dead
    with Store(db, read_only=True) as s:
        assert s.sample_counts()["gpu"] == 100
        reasons = [r[0] for r in s.con.execute("SELECT reason FROM dead_letters").fetchall()]
    assert reasons.count("too_deep") >= 3
    for _, _, reason in bad.values():
        assert reason in reasons


# ---- exactly once, whenever a message comes back -------------------------------------------


def test_a_message_is_a_duplicate_hours_later_without_a_time_window(tmp_path, monkeypatch):
    """A simulated clock moves the ingest's memory of recent keys 2 h on (they are forgotten
    after 15 min); the high-water marks and the ingest log still know the message."""
    import types

    import twin.ingest.ingester as ingester_module

    clock = [time.monotonic()]
    monkeypatch.setattr(ingester_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    db = tmp_path / "d.duckdb"
    old = now_s() - 7200
    with Store(db) as store:
        ing = Ingester(store, None)
        ing.ingest([good(i, ts=old + i) for i in range(10)])
        for minute in range(120):  # the stream moves on, a message a minute for 2 h
            clock[0] += 60
            ing.ingest([good(10 + minute, ts=old + 60 * (minute + 1))])
        assert ing.dedup_keys < 30  # the first ten are forgotten
        ing.ingest([good(3, ts=old + 3), good(200)])  # re-published: a lookup finds it
        assert ing.counters.duplicates == 1 and ing.counters.dedup_lookups == 1
        assert store.sample_counts()["gpu"] == 131
    with Store(db) as store:  # a restart: marks from the store, the old keys looked up
        ing = Ingester(store, None)
        ing.ingest([good(i, ts=old + i) for i in range(10)] + [good(201)])
        assert ing.counters.duplicates == 10 and ing.counters.stored_messages == 1
        # a collector restart (seq from 0 again, later ts) is new traffic, not a lookup
        lookups = ing.counters.dedup_lookups
        ing.ingest([good(i, ts=now_s() + 1) for i in range(3)])
        assert ing.counters.stored_messages == 4 and ing.counters.dedup_lookups == lookups
        assert store.sample_counts()["gpu"] == 135


def _prepare(db: Path, items: list[tuple[str, bytes]], hours_ago: float) -> None:
    """A store that received ``items`` ``hours_ago`` hours ago (outside any memory window)."""
    with Store(db) as store:
        ing = Ingester(store, load_site(SMALL_SITE), IngestLimits(max_past_s=0))
        ing.ingest(items, received_at=datetime.now(UTC) - timedelta(hours=hours_ago))
        assert ing.counters.stored_messages == len(items)


@pytest.mark.slow
def test_a_second_import_an_hour_later_stores_nothing_twice(tmp_path):
    items = [good(i, ts=now_s() - 3600 + i) for i in range(50)]
    db = tmp_path / "i.duckdb"
    _prepare(db, items, hours_ago=1.0)
    _prepare(db, [good(100, ts=now_s() - 60)], hours_ago=1 / 60)  # the service ran on since
    jsonl = tmp_path / "m.jsonl"
    _jsonl(jsonl, items)
    r = _dctwin("ingest", "--file", str(jsonl), "--db", str(db), "--site", str(SMALL_SITE))
    assert r.returncode == 0, r.stderr[-3000:]
    counters = json.loads(r.stdout.strip().splitlines()[-1])
    assert counters["duplicates"] == 50 and counters["stored_messages"] == 0, counters
    assert counters["dedup_lookups"] >= 1  # not from the memory of recent keys
    with Store(db, read_only=True) as s:
        assert s.sample_counts()["gpu"] == 51


def publish(b, items: list[tuple[str, bytes]], retain: bool = False) -> None:
    client = connect(broker_config(b), f"pub-{time.monotonic_ns()}")
    infos = [client.publish(t, p, qos=1, retain=retain) for t, p in items]
    for info in infos:
        info.wait_for_publish(60)
    client.disconnect()
    client.loop_stop()


@contextmanager
def serving(b, db: Path, log: Path) -> Iterator[tuple[subprocess.Popen, httpx.Client]]:
    """`dctwin serve` on broker ``b`` and store ``db`` with its API, stopped with SIGTERM."""
    env = {**os.environ, **b.client_env()}
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "twin.cli", "serve", "--broker", b.address),
            *("--db", str(db), "--site", str(SMALL_SITE), "--api-port", "0"),
            *("--calibrate-every", "0", "--detect-every", "0"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
    )
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or serve.poll() is not None, 60)
        text = log.read_text()
        m = re.search(r"api: (http://127\.0\.0\.1:\d+)", text)
        assert m is not None, text[-3000:]
        with httpx.Client(base_url=m.group(1), timeout=10) as client:
            yield serve, client
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.mqtt
@pytest.mark.slow
def test_serve_stores_a_republished_and_a_retained_message_once_hours_later(broker, tmp_path):
    """A store that received messages 2 h ago (prepared: the service's memory of recent keys
    is 15 min); `dctwin serve` gets one of them again as a retained message when it
    subscribes, and another re-published while it runs: both are duplicates."""
    db = tmp_path / "s.duckdb"
    old = now_s() - 7200
    first = [good(i, ts=old + i) for i in range(10)]
    _prepare(db, first, hours_ago=2.0)
    _prepare(db, [good(100, ts=now_s() - 60)], hours_ago=1 / 60)  # the stream since
    retained = first[4]
    publish(broker, [retained], retain=True)
    try:
        with serving(broker, db, tmp_path / "serve.log") as (_, api):
            publish(broker, [first[7], good(101)])

            def counts() -> tuple[float, float]:
                m = api.get("/metrics").text
                return (
                    _metric(m, "dctwin_ingest_duplicates_total"),
                    _metric(m, "dctwin_ingest_messages_stored_total"),
                )

            assert wait_until(lambda: counts() == (2.0, 1.0), 30), counts()
            assert _metric(api.get("/metrics").text, "dctwin_ingest_dedup_lookups_total") >= 1
    finally:
        publish(broker, [(retained[0], b"")], retain=True)
    with Store(db, read_only=True) as s:
        assert s.sample_counts()["gpu"] == 12
        assert s.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == 0


# ---- through MQTT: nesting interleaved with good messages ----------------------------------


@pytest.mark.mqtt
@pytest.mark.slow
def test_nesting_1_in_100_over_mqtt_is_dead_lettered_without_extra_transactions(broker, tmp_path):
    """6,000 good messages with 60 nested 300 deep (1:100) and a 60,000-character source,
    through mosquitto into the service's ingest: every good one stored once, every bad one
    dead-lettered with its reason, one transaction per ingest batch (no isolation pass, no
    split), no loop error. (The time it adds is measured by bench/bench_poison.py.)"""
    db = tmp_path / "n.duckdb"
    store = Store(db)
    counting = _CountingStore(store)
    ingester = Ingester(store, load_site(SMALL_SITE))
    batches = [0]
    real_ingest = ingester.ingest

    def ingest(items, received_at=None):
        batches[0] += 1
        return real_ingest(items, received_at)

    ingester.ingest = ingest  # type: ignore[method-assign]
    health = ServiceHealth()
    svc = MqttIngestService(
        broker_config(broker),
        ingester,
        ServiceOptions(client_id="nesting-test", flush_interval_s=0.2),
        health=health,
    )
    svc.start()
    try:
        items: list[tuple[str, bytes]] = []
        t0 = now_s()
        for i in range(6000):
            items.append(good(i, ts=t0 + i * 1e-3))
            if i % 100 == 99:
                items.append(deep(100_000 + i))
        items.append(shapes(1)["long_source"][:2])
        publish(broker, items)
        c = ingester.counters
        assert wait_until(lambda: c.stored_messages == 6000 and c.dead_letters.total() == 61, 90)
        time.sleep(0.5)
    finally:
        svc.stop()
        store.close()
    assert c.dead_letters == {"too_deep": 60, "wrong_type": 1}, c.as_dict()
    assert c.duplicates == 0 and c.store_splits == 0
    assert counting.writes == batches[0]  # one transaction per batch: nothing re-ingested
    assert health.snapshot()["loops"]["ingest"]["errors_total"] == 0
    with Store(db, read_only=True) as s:
        assert s.sample_counts()["gpu"] == 6000
        assert s.con.execute("SELECT max(length(source)) FROM gpu").fetchall()[0][0] < 256
        assert s.con.execute("SELECT max(length(source)) FROM ingest_log").fetchall()[0][0] < 256


def test_nested_payloads_among_plain_ones_cost_the_arrow_path_one_more_parse(monkeypatch):
    """6,000 good messages as collectors write them (the Arrow path) with 60 nested 300 deep
    interleaved: the nested ones are found in one pass and left out, so the good ones are
    parsed as columns in two parses, not split around each bad one (bench/bench_poison.py
    measures what that costs)."""
    from twin.ingest import batch_decode

    calls = []
    real = batch_decode._ArrowPart.build.__func__

    def build(cls, decoder, kind, items, idx, *rest):
        calls.append(len(idx))
        return real(cls, decoder, kind, items, idx, *rest)

    monkeypatch.setattr(batch_decode._ArrowPart, "build", classmethod(build))
    start = datetime.now(UTC)
    items = []
    for i in range(6000):
        src = f"node-{i % 125}"
        items.append(
            (
                topic_for(SITE, "gpu", src),
                encode(
                    collector="t",
                    source=src,
                    seq=i // 125,
                    ts=start + timedelta(seconds=i // 125),
                    samples=[{"id": f"{src}:{g}", "power_w": 300.0} for g in range(8)],
                ),
            )
        )
        if i % 100 == 99:
            items.append(deep(100_000 + i))
    batch = BatchDecoder(SITE).decode_batch(items)
    assert len(batch.messages) == 6000
    assert {e.reason for _, e in batch.refused} == {"too_deep"} and len(batch.refused) == 60
    assert calls == [6060, 6000], calls


@pytest.mark.mqtt
@pytest.mark.slow
def test_a_bug_on_one_message_shows_in_health_and_the_rest_is_stored(broker, tmp_path, monkeypatch):
    """The service's ingest meets a message it fails on (a bug, simulated by a decoder that
    raises on it): that message is dead-lettered ``ingest_error``, counted as an error of
    loop ``ingest`` (what /healthz and ``dctwin_loop_errors_total`` report), and every other
    message of the batch is stored."""
    store = Store(tmp_path / "bug.duckdb")
    ingester = Ingester(store, None)
    real = ingester.decoder.decode_batch
    marker = b'"seq":25,'

    def buggy(batch_items, **kw):
        if any(marker in p for _, p in batch_items):
            raise KeyError("a bug")
        return real(batch_items, **kw)

    monkeypatch.setattr(ingester.decoder, "decode_batch", buggy)
    health = ServiceHealth()
    svc = MqttIngestService(
        broker_config(broker),
        ingester,
        ServiceOptions(client_id="bug-test", flush_interval_s=0.2),
        health=health,
    )
    svc.start()
    try:
        publish(broker, [good(i) for i in range(50)])
        c = ingester.counters
        assert wait_until(lambda: c.stored_messages == 49 and c.dead_letters.total() == 1, 30)
        assert c.dead_letters == {"ingest_error": 1}
        assert health.snapshot()["loops"]["ingest"]["errors_total"] >= 1
    finally:
        svc.stop()
        store.close()
