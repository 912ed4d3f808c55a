"""No message stops the ingest (issue 12): poison shapes, arbitrary JSON, store refusals, stalls.

Every message ends stored, a duplicate, or dead-lettered with a reason, through the real ingest
path (Mosquitto when on PATH, else the embedded broker; a DuckDB file), and a good message
published after a bad one is stored, also across a restart that redelivers what was unacked.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.contract import (
    DEAD_LETTER_REASONS,
    KINDS,
    QUANTITIES,
    ContractError,
    decode,
    encode,
    topic_for,
)
from collectors.mqtt import connect, wait_until
from twin.health import ServiceHealth
from twin.ingest import Ingester, IngestLimits
from twin.ingest.batch_decode import BatchDecoder
from twin.ingest.ingester import StoreUnavailable
from twin.ingest.mqtt_service import MqttIngestService, ServiceOptions
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE, broker_config

SITE = "small"
SOURCE = "trn-r01-n1"


def now_s() -> float:
    return datetime.now(UTC).timestamp()


def good(seq: int, kind: str = "gpu", ts: float | None = None) -> tuple[str, bytes]:
    sample: dict = {"id": f"{SOURCE}:0"}
    for name, q in QUANTITIES[kind].items():
        sample[name] = 1 if q.integer else 1.5
    return topic_for(SITE, kind, SOURCE), encode(
        collector="t", source=SOURCE, seq=seq, ts=now_s() if ts is None else ts, samples=[sample]
    )


def header(seq: int, **over) -> dict:
    body = {
        "v": 1,
        "collector": "t",
        "source": SOURCE,
        "seq": seq,
        "ts": now_s(),
        "samples": [{"id": f"{SOURCE}:0", "power_w": 1.0}],
    }
    body.update(over)
    return body


def gpu_topic(site: str = SITE) -> str:
    return f"dctwin/v1/{site}/gpu/{SOURCE}"


def poison(seq: int) -> dict[str, tuple[str, bytes, str]]:
    """Each shape that once passed validation (or was stored though the README said no), with
    the reason it is refused now. json.dumps: orjson cannot write integers past 64 bits."""
    t = gpu_topic()
    dup = json.dumps(header(seq)).replace('"v": 1,', '"v": 2, "v": 1,').encode()
    return {
        "seq_2_63": (t, json.dumps(header(seq=2**63)).encode(), "out_of_range"),
        "throttle_2_63": (
            t,
            json.dumps(
                header(seq, samples=[{"id": f"{SOURCE}:0", "throttle_reasons": 2**63}])
            ).encode(),
            "out_of_range",
        ),
        "link_errors_2_64": (
            topic_for(SITE, "link", SOURCE),
            json.dumps(header(seq, samples=[{"id": "l1", "errors": 2**64}])).encode(),
            "out_of_range",
        ),
        "ts_1e20": (t, json.dumps(header(seq, ts=1e20)).encode(), "ts_future"),
        "ts_9999": (
            t,
            json.dumps(header(seq, ts="9999-12-31T23:59:59-01:00")).encode(),
            "bad_timestamp",
        ),
        "sample_ts_0001": (
            t,
            json.dumps(
                header(
                    seq,
                    samples=[
                        {"id": f"{SOURCE}:0", "ts": "0001-01-01T00:00:00+01:00", "power_w": 1.0}
                    ],
                )
            ).encode(),
            "bad_timestamp",
        ),
        "v_true": (t, json.dumps(header(seq, v=True)).encode(), "bad_version"),
        "v_float": (t, json.dumps(header(seq, v=1.0)).encode(), "bad_version"),
        "duplicate_keys": (t, dup, "duplicate_key"),
        "iso_week": (
            t,
            json.dumps(header(seq, ts="2026-W48-2T10:00:00Z")).encode(),
            "bad_timestamp",
        ),
        "basic_format": (
            t,
            json.dumps(header(seq, ts="20261201T100000Z")).encode(),
            "bad_timestamp",
        ),
        "offset_seconds": (
            t,
            json.dumps(header(seq, ts="2026-12-01T10:00:00+01:00:30")).encode(),
            "bad_timestamp",
        ),
        "1e308": (
            t,
            json.dumps(header(seq, samples=[{"id": f"{SOURCE}:0", "power_w": 1e308}])).encode(),
            "out_of_range",
        ),
        "other_site": (gpu_topic("othersite"), orjson.dumps(header(seq)), "wrong_site"),
    }


@pytest.fixture
def site():
    return load_site(SMALL_SITE)


# ---- through MQTT, and across a restart -------------------------------------------------------


class Service:
    def __init__(self, b, db: Path, site, client_id: str = "poison-test"):
        self.store = Store(db)
        self.ingester = Ingester(self.store, site)
        self.health = ServiceHealth()
        self.svc = MqttIngestService(
            broker_config(b),
            self.ingester,
            ServiceOptions(client_id=client_id, flush_interval_s=0.05),
            health=self.health,
        )
        self.svc.start()

    def stop(self) -> None:
        self.svc.stop()
        self.store.close()


def publish(b, items: list[tuple[str, bytes]], retain: bool = False) -> None:
    client = connect(broker_config(b), f"pub-{time.monotonic_ns()}")
    infos = [client.publish(t, p, qos=1, retain=retain) for t, p in items]
    for info in infos:
        info.wait_for_publish(30)
    client.disconnect()
    client.loop_stop()


@pytest.mark.mqtt
@pytest.mark.slow
def test_poison_shapes_over_mqtt_never_block_ingest_also_after_restart(broker, tmp_path, site):
    db = tmp_path / "p.duckdb"
    shapes = poison(10_000)
    svc = Service(broker, db, site)
    try:
        items = [good(i) for i in range(30)]
        items += [(t, p) for t, p, _ in shapes.values()]
        items += [good(i) for i in range(30, 60)]
        publish(broker, items)
        done = wait_until(
            lambda: (
                svc.ingester.counters.stored_messages == 60
                and sum(svc.ingester.counters.dead_letters.values()) == len(shapes)
            ),
            30,
        )
        assert done, svc.ingester.counters.as_dict()
    finally:
        svc.stop()
    with Store(db, read_only=True) as s:
        reasons = dict(s.con.execute("SELECT sha256, reason FROM dead_letters").fetchall())
        rows = s.con.execute("SELECT count(*) FROM gpu").fetchall()[0][0]
    assert rows == 60
    expected = {hashlib.sha256(p).hexdigest(): r for _, p, r in shapes.values()}
    assert reasons == expected
    # restart on the same persistent session: nothing bad comes back, good keeps landing
    svc = Service(broker, db, site)
    try:
        publish(broker, [good(i) for i in range(60, 80)])
        assert wait_until(lambda: svc.ingester.counters.stored_messages == 20, 30)
        time.sleep(0.5)
        assert svc.ingester.counters.dead_letters == {}
        assert svc.health.snapshot()["loops"]["ingest"]["errors_total"] == 0
    finally:
        svc.stop()
    with Store(db, read_only=True) as s:
        assert s.con.execute("SELECT count(*) FROM gpu").fetchall()[0][0] == 80
        assert s.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == len(shapes)


@pytest.mark.mqtt
@pytest.mark.slow
def test_a_retained_bad_message_is_dead_lettered_once_across_restarts(broker, tmp_path, site):
    db = tmp_path / "r.duckdb"
    bad_topic, bad_payload, _ = poison(1)["ts_1e20"]
    publish(broker, [(bad_topic, bad_payload)], retain=True)
    for _ in range(2):
        svc = Service(broker, db, site, client_id=f"retained-{time.monotonic_ns()}")
        try:
            publish(broker, [good(int(time.monotonic_ns() % 1_000_000_000))])
            assert wait_until(lambda s=svc: s.ingester.counters.stored_messages == 1, 20)
            assert wait_until(lambda s=svc: s.ingester.counters.received == 2, 10), (
                svc.ingester.counters.as_dict()
            )
        finally:
            svc.stop()
    with Store(db, read_only=True) as s:
        assert s.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == 1
    assert svc.ingester.counters.dead_letter_repeats == 1
    publish(broker, [(bad_topic, b"")], retain=True)  # clear the retained message


# ---- arbitrary JSON into every field of every kind ----------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(
        [
            "2026-12-01T10:00:00Z",
            "2026-12-01t10:00:00z",
            "9999-12-31T23:59:59-01:00",
            "0001-01-01T00:00:00+01:00",
            "2026-W48-2T10:00:00Z",
            1e20,
            2**63,
            2**63 - 1,
            -1,
            0,
            1.0,
            1e308,
            "",
        ]
    ),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = [("header", f) for f in ("v", "collector", "source", "seq", "ts", "samples")] + [
    (kind, q) for kind in KINDS for q in [*QUANTITIES[kind], "id", "ts", "x_extra"]
]


def _encode(body: dict) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # integers past 64 bits
        return json.dumps(body).encode()


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("fuzz") / "f.duckdb") as store:
        yield store


@pytest.mark.slow
@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(field=st.sampled_from(FIELDS), value=json_values, seq=st.integers(0, 10**12))
def test_arbitrary_json_in_any_field_is_stored_or_dead_lettered(
    fuzz_store, site, field, value, seq
):
    where, name = field
    kind = "gpu" if where == "header" else where
    body = json.loads(good(seq, kind)[1])
    if where == "header":
        body[name] = value
    else:
        body["samples"][0][name] = value
    topic = topic_for(SITE, kind, SOURCE)
    bad = (topic, _encode(body))
    before, after = good(seq + 1, "gpu"), good(seq + 2, "gpu")
    store = fuzz_store
    ing = Ingester(store, site, IngestLimits(max_past_s=0, max_future_s=0))
    n_dead = store.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0]
    ing.ingest([before, bad, after])  # never raises
    c = ing.counters
    # the good neighbours landed (or were stored before by an earlier example)
    assert c.stored_messages + c.duplicates >= 2, c.as_dict()
    handled = c.stored_messages + c.duplicates + sum(c.dead_letters.values())
    handled += c.dead_letter_repeats
    assert handled == 3, c.as_dict()
    # the column-wise path and the reference decode() agree on the bad message
    try:
        decode(*bad, site=SITE)
        accepted = True
    except ContractError as e:
        accepted = False
        assert e.reason in DEAD_LETTER_REASONS
    refused = c.dead_letters.total() + c.dead_letter_repeats
    assert accepted == (refused == 0), (c.as_dict(), bad)
    if not accepted and c.dead_letters:
        (reason,) = c.dead_letters
        assert reason in DEAD_LETTER_REASONS
        assert store.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == (
            n_dead + 1
        )
    # a restart redelivers the bad message: still no exception, the next good one lands
    ing2 = Ingester(store, site, IngestLimits(max_past_s=0, max_future_s=0))
    ing2.ingest([bad, good(seq + 3, "gpu")])
    assert ing2.counters.stored_messages + ing2.counters.duplicates >= 1


def test_batch_decoder_and_decode_agree_on_the_values_they_store(site):
    items = [good(i, kind) for i, kind in enumerate(KINDS)]
    batch = BatchDecoder(SITE).decode_batch(items)
    assert not batch.refused and len(batch.messages) == len(KINDS)
    for (topic, payload), kind in zip(items, KINDS, strict=True):
        ref = decode(topic, payload, SITE).samples[0]
        cols = batch.columns[kind]
        for name in QUANTITIES[kind]:
            assert cols[name][0].as_py() == ref[name], (kind, name)


# ---- the database refuses a value the contract allows ------------------------------------------


def _refusing_store(db: Path) -> Store:
    """A real store whose link table refuses error counts of 1000 or more (a CHECK constraint),
    standing in for any value the database refuses that validation let through."""
    store = Store(db)
    cols = store.con.execute("DESCRIBE link").fetchall()
    store.con.execute("DROP TABLE link")
    defs = ", ".join(f"{c[0]} {c[1]}" for c in cols)
    store.con.execute(f"CREATE TABLE link ({defs}, CHECK (errors IS NULL OR errors < 1000))")
    return store


def link_msg(seq: int, errors: int) -> tuple[str, bytes]:
    return topic_for(SITE, "link", SOURCE), encode(
        collector="t",
        source=SOURCE,
        seq=seq,
        ts=now_s(),
        samples=[{"id": "l1", "tx_bps": 1e9, "errors": errors}],
    )


def test_a_message_the_store_refuses_is_isolated_and_the_rest_stored(tmp_path):
    store = _refusing_store(tmp_path / "c.duckdb")
    try:
        ing = Ingester(store)
        items = [link_msg(i, 5) for i in range(20)] + [link_msg(20, 5000)]
        items += [link_msg(i, 5) for i in range(21, 41)]
        ing.ingest(items)
        assert store.con.execute("SELECT count(*) FROM link").fetchall()[0][0] == 40
        rows = store.con.execute("SELECT reason, detail FROM dead_letters").fetchall()
        assert len(rows) == 1 and rows[0][0] == "store_rejected"
        assert "CHECK" in rows[0][1] or "Constraint" in rows[0][1], rows[0][1]
        c = ing.counters
        assert c.stored_messages == 40 and c.dead_letters == {"store_rejected": 1}
        assert 1 <= c.store_splits <= 2 * math.ceil(math.log2(len(items)))
        # redelivered: the good ones are duplicates, the refused one is not stored twice
        ing.ingest(items)
        assert ing.counters.duplicates == 40
        assert store.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == 1
    finally:
        store.close()


class _FailingWrites:
    """Makes the real store's writes fail as a full disk does (duckdb.IOException) while on."""

    def __init__(self, store: Store):
        self.store = store
        self.on = False
        self._write = store.write
        store.write = self.write  # type: ignore[method-assign]

    def write(self, batch) -> None:
        if self.on:
            raise duckdb.IOException('IO Error: Could not write file "x.duckdb.wal": No space')
        self._write(batch)


def test_a_transient_store_error_keeps_every_message_for_retry(tmp_path):
    with Store(tmp_path / "t.duckdb") as store:
        fail = _FailingWrites(store)
        ing = Ingester(store)
        items = [good(i) for i in range(10)]
        fail.on = True
        with pytest.raises(StoreUnavailable):
            ing.ingest(items)
        assert ing.counters.stored_messages == 0 and ing.counters.dead_letters == {}
        assert ing.dedup_keys == 0  # nothing counts as seen before it is stored
        fail.on = False
        ing.ingest(items)
        assert store.sample_counts()["gpu"] == 10
        assert store.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == 0


@pytest.mark.mqtt
@pytest.mark.slow
def test_a_stalled_store_shows_in_health_and_loses_nothing(broker, tmp_path, site):
    svc = Service(broker, tmp_path / "s.duckdb", site)
    svc.health.stall_after_s = 1.0
    fail = _FailingWrites(svc.store)
    try:
        publish(broker, [good(i) for i in range(10)])
        assert wait_until(lambda: svc.ingester.counters.stored_messages == 10, 20)
        assert svc.health.stalled() is None
        fail.on = True
        publish(broker, [good(i) for i in range(10, 30)])
        assert wait_until(lambda: svc.health.stalled() is not None, 20)
        snap = svc.health.snapshot()
        assert "No space" in (snap["store_retrying"] or "")
        assert snap["loops"]["ingest"]["failing"]
        assert snap["ingest_lag_s"] > 1.0
        fail.on = False
        assert wait_until(lambda: svc.ingester.counters.stored_messages == 30, 60)
        assert wait_until(lambda: svc.health.stalled() is None, 10)
        assert not svc.health.snapshot()["loops"]["ingest"]["failing"]
    finally:
        svc.stop()
    with Store(tmp_path / "s.duckdb", read_only=True) as s:
        assert s.sample_counts()["gpu"] == 30
        assert s.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == 0


@pytest.mark.mqtt
@pytest.mark.slow
def test_broker_connected_follows_a_broker_stop_and_start(tmp_path, site):
    from twin.broker import free_port, start_broker

    port = free_port()
    b = start_broker("auto", port=port, log_path=tmp_path / "b1.log")
    svc = Service(b, tmp_path / "b.duckdb", site)
    try:
        assert svc.health.broker.connected is True
        b.stop()
        assert wait_until(lambda: svc.health.broker.connected is False, 20)
        b = start_broker("auto", port=port, log_path=tmp_path / "b2.log")
        assert wait_until(lambda: svc.health.broker.connected is True, 60)
        assert svc.health.broker.reconnects >= 1
        publish(b, [good(1)])
        assert wait_until(lambda: svc.ingester.counters.stored_messages == 1, 20)
    finally:
        svc.stop()
        b.stop()


@pytest.mark.mqtt
@pytest.mark.slow
def test_serve_healthz_is_503_while_its_disk_refuses_writes_and_200_after(broker, tmp_path):
    """`dctwin serve` as users run it; its file-size limit (RLIMIT_FSIZE, what a full disk looks
    like to DuckDB: "File too large") is dropped while it ingests, then restored."""
    import os
    import resource
    import signal
    import subprocess
    import sys
    import threading

    import httpx

    db = tmp_path / "serve.duckdb"
    env = {**os.environ, **broker.client_env()}
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "twin.cli", "serve", "--broker", broker.address),
            *("--db", str(db), "--site", str(SMALL_SITE), "--api-port", "0"),
            *("--stall-after", "2", "--calibrate-every", "0", "--detect-every", "0"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # a pipe: the file-size limit must not hit the service's log
        env=env,
    )
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend(iter(serve.stderr.readline, b"")))
    reader.start()
    try:
        assert wait_until(lambda: b"serving:" in b"".join(out) or serve.poll() is not None, 60)
        text = b"".join(out).decode()
        url = re.search(r"api: (http://127\.0\.0\.1:\d+)", text).group(1)  # type: ignore[union-attr]
        with httpx.Client(base_url=url, timeout=10) as c:
            publish(broker, [good(i) for i in range(5)])
            assert wait_until(
                lambda: c.get("/healthz").json()["ingest"]["last_commit_at"] is not None, 20
            )
            assert c.get("/healthz").status_code == 200
            resource.prlimit(serve.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
            publish(broker, [good(i) for i in range(5, 25)])
            assert wait_until(lambda: c.get("/healthz").status_code == 503, 30), b"".join(out)
            body = c.get("/healthz").json()
            assert "stalled" in str(body), body
            metrics = c.get("/metrics").text
            assert "dctwin_ingest_stalled 1" in metrics
            resource.prlimit(
                serve.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
            assert wait_until(lambda: c.get("/healthz").status_code == 200, 60), b"".join(out)
            assert "dctwin_ingest_stalled 0" in c.get("/metrics").text
        assert b"store write failed" in b"".join(out)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
        reader.join(10)
    with Store(db, read_only=True) as s:
        assert s.sample_counts()["gpu"] == 25  # nothing lost, nothing stored twice
        assert s.con.execute("SELECT count(*) FROM dead_letters").fetchall()[0][0] == 0


@pytest.mark.mqtt
@pytest.mark.slow
def test_a_flood_of_oversized_payloads_stays_bounded_and_good_ones_flow(broker, tmp_path):
    """300 payloads of 1.9 MB (past the contract's 1 MiB) into `dctwin serve`: the service and
    its receiver stay under 1 GB of RSS, the store grows by under 10 MB, good messages land."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    import psutil

    db = tmp_path / "big.duckdb"
    log = tmp_path / "serve.log"
    env = {**os.environ, **broker.client_env()}
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "twin.cli", "serve", "--broker", broker.address),
            *("--db", str(db), "--site", str(SMALL_SITE), "--no-api"),
            *("--calibrate-every", "0", "--detect-every", "0"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
    )
    peak = [0]
    done = threading.Event()

    def sample_rss() -> None:
        while not done.is_set():
            try:
                p = psutil.Process(serve.pid)
                rss = p.memory_info().rss + sum(
                    c.memory_info().rss for c in p.children(recursive=True)
                )
                peak[0] = max(peak[0], rss)
            except psutil.Error:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample_rss)
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or serve.poll() is not None, 60)
        time.sleep(1.0)
        size_before = db.stat().st_size + sum(
            f.stat().st_size for f in tmp_path.glob("big.duckdb.wal")
        )
        sampler.start()
        blob = b'"' + b"x" * 1_900_000 + b'"}'
        client = connect(broker_config(broker), f"flood-{time.monotonic_ns()}")
        infos = []
        for i in range(300):  # each one different: identical dead letters are kept once
            infos.append(client.publish(gpu_topic(), b'{"v":1,"n":%05d,"junk":' % i + blob, qos=1))
            if i % 30 == 0:  # good messages keep flowing between the floods
                t, p = good(i)
                infos.append(client.publish(t, p, qos=1))
        for info in infos:
            info.wait_for_publish(60)
        client.disconnect()
        client.loop_stop()
    finally:
        time.sleep(3.0)
        done.set()
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        if sampler.is_alive():
            sampler.join(5)
    with Store(db, read_only=True) as s:
        assert s.sample_counts()["gpu"] == 10
        dead = s.con.execute(
            "SELECT count(*), max(octet_length(payload)), min(payload_bytes) FROM dead_letters"
            " WHERE reason = 'oversized'"
        ).fetchall()[0]
    assert dead == (300, 4096, len(blob) + len(b'{"v":1,"n":00000,"junk":'))
    size_after = db.stat().st_size + sum(f.stat().st_size for f in tmp_path.glob("big.duckdb.wal"))
    assert size_after - size_before < 10 * 2**20, (size_before, size_after)
    assert 0 < peak[0] < 2**30, f"peak RSS {peak[0] / 2**20:.0f} MiB"


@pytest.mark.slow  # a dctwin subprocess: out of the fast tier
def test_dctwin_ingest_on_a_full_disk_says_so_in_one_line(tmp_path):
    """`dctwin ingest` whose store cannot grow (RLIMIT_FSIZE of 2 MB, as a full disk looks to
    DuckDB) exits 2 with one line naming the store, not a traceback."""
    import resource
    import subprocess
    import sys

    jsonl = tmp_path / "msgs.jsonl"
    with jsonl.open("wb") as f:
        for i in range(20_000):
            t, p = good(i)
            f.write(orjson.dumps({"topic": t, "payload": p.decode()}) + b"\n")
    db = tmp_path / "full.duckdb"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, resource.RLIM_INFINITY))

    r = subprocess.run(
        [sys.executable, "-m", "twin.cli", "ingest", "--file", str(jsonl), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"the store {db} failed" in r.stderr and "File too large" in r.stderr, r.stderr
