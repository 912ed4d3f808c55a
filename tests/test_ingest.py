"""Ingest without a broker: validation, dead letters, dedup, unknown ids, rollups, export."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from collectors.contract import MAX_PAYLOAD_BYTES, encode, topic_for
from twin.ingest import Ingester, IngestLimits
from twin.ingest.files import ingest_path
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE

NOW = datetime.now(UTC).replace(microsecond=0)


def gpu_msg(seq: int, *, source: str = "trn-r01-n1", ts: float | None = None, **sample) -> tuple:
    s = {"id": f"{source}:0", "power_w": 500.0, "temp_c": 55.0, "util_pct": 90.0}
    s.update(sample)
    payload = encode(
        collector="test",
        source=source,
        seq=seq,
        ts=NOW.timestamp() if ts is None else ts,
        samples=[s],
    )
    return topic_for("small", "gpu", source), payload


def raw(source: str = "trn-r01-n1", kind: str = "gpu", drop: str = "", **fields) -> tuple:
    body = {
        "v": 1,
        "collector": "t",
        "source": source,
        "seq": 1,
        "ts": NOW.timestamp(),
        "samples": [{"id": f"{source}:0", "power_w": 1.0}],
    }
    body.update(fields)
    body.pop(drop, None)
    return f"dctwin/v1/small/{kind}/{source}", orjson.dumps(body)


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "t.duckdb") as s:
        yield s


@pytest.fixture
def small_site():
    return load_site(SMALL_SITE)


MALFORMED = {
    "malformed_json": ("dctwin/v1/small/gpu/trn-r01-n1", b'{"v": 1, "samples": [}'),
    "wrong_type": raw(samples=[{"id": "trn-r01-n1:0", "power_w": "612 W"}]),
    "non_finite": (
        "dctwin/v1/small/gpu/trn-r01-n1",
        b'{"v":1,"collector":"t","source":"trn-r01-n1","seq":1,"ts":1,'
        b'"samples":[{"id":"a","temp_c":NaN}]}',
    ),
    "negative_value": raw(samples=[{"id": "trn-r01-n1:0", "power_w": -5.0}]),
    "ts_future": raw(ts=(NOW + timedelta(hours=2)).timestamp()),
    "ts_past": raw(ts=(NOW - timedelta(days=90)).timestamp()),
    "unknown_kind": raw(kind="fan"),
    "oversized": ("dctwin/v1/small/gpu/trn-r01-n1", b" " * (MAX_PAYLOAD_BYTES + 1)),
    "missing_field": raw(drop="seq"),
    "bad_version": raw(v=2),
    "bad_topic": ("dctwin/v1/small/gpu", raw()[1]),
    "source_mismatch": ("dctwin/v1/small/gpu/trn-r01-n1", raw(source="other")[1]),
    # the shapes that once passed validation and then failed in the store (issue 12)
    "out_of_range": raw(seq=2**63),
    "bad_timestamp": raw(ts="9999-12-31T23:59:59-01:00"),
    "duplicate_key": (
        "dctwin/v1/small/gpu/trn-r01-n1",
        raw()[1].replace(b'"v":1,', b'"v":2,"v":1,'),
    ),
    "wrong_site": ("dctwin/v1/othersite/gpu/trn-r01-n1", raw()[1]),
}


@pytest.mark.parametrize("reason", sorted(MALFORMED))
def test_each_malformed_case_is_dead_lettered_and_neighbours_stored(store, small_site, reason):
    ing = Ingester(store, small_site)
    items = [gpu_msg(1), MALFORMED[reason], gpu_msg(2)]
    ing.ingest(items)
    rows = store.con.execute(
        "SELECT topic, payload, reason, detail, payload_bytes, sha256 FROM dead_letters"
    ).fetchall()
    topic, payload = MALFORMED[reason]
    # a dead letter keeps the first 4 KiB of its payload, the payload's size and its SHA-256
    assert [(r[0], bytes(r[1]), r[2], r[4], r[5]) for r in rows] == [
        (topic, payload[:4096], reason, len(payload), hashlib.sha256(payload).hexdigest())
    ]
    assert rows[0][3]  # a human-readable detail
    assert store.sample_counts()["gpu"] == 2
    assert store.status()["dead_letters"] == {reason: 1}


def test_inf_and_nan_in_unknown_quantities_are_refused(store):
    ing = Ingester(store)
    topic = "dctwin/v1/small/gpu/n1"
    ing.ingest(
        [
            (
                topic,
                b'{"v":1,"collector":"t","source":"n1","seq":1,"ts":1e9,'
                b'"samples":[{"id":"a","fan_rpm":Infinity}]}',
            )
        ]
    )
    assert store.status()["dead_letters"] == {"non_finite": 1}


def test_duplicate_source_seq_is_stored_once_even_across_ingesters(store):
    Ingester(store).ingest([gpu_msg(1), gpu_msg(1), gpu_msg(2)])
    ing2 = Ingester(store)  # a restarted service reloads recent keys from the store
    ing2.ingest([gpu_msg(2), gpu_msg(3)])
    assert store.sample_counts()["gpu"] == 3
    assert ing2.counters.duplicates == 1
    # a collector restart resets seq but the timestamp differs: that is new data
    ing2.ingest([gpu_msg(1, ts=NOW.timestamp() + 5)])
    assert store.sample_counts()["gpu"] == 4


def test_unknown_ids_are_kept_and_listed(store, small_site):
    ing = Ingester(store, small_site)
    ing.ingest([gpu_msg(1), gpu_msg(2, source="ghost-node"), gpu_msg(3, source="ghost-node")])
    assert store.sample_counts()["gpu"] == 3
    unknown = store.status()["unknown_ids"]
    assert [(u["kind"], u["id"], u["samples"]) for u in unknown] == [("gpu", "ghost-node:0", 2)]
    Ingester(store, small_site).ingest([gpu_msg(4, source="ghost-node")])
    assert store.status()["unknown_ids"][0]["samples"] == 3


def test_unnamed_quantities_go_to_the_extra_table_and_sample_ts_is_used(store):
    own_ts = NOW - timedelta(seconds=30)
    topic, _ = gpu_msg(1)
    payload = encode(
        collector="t",
        source="trn-r01-n1",
        seq=1,
        ts=NOW,
        samples=[
            {
                "id": "trn-r01-n1:0",
                "power_w": 400.0,
                "nvlink_tx_bps": 1e9,
                "ts": own_ts.isoformat(),
            },
        ],
    )
    Ingester(store).ingest([(topic, payload)])
    assert store.con.execute("SELECT quantity, value FROM extra_readings").fetchall() == [
        ("nvlink_tx_bps", 1e9)
    ]
    assert store.con.execute("SELECT ts, power_w FROM gpu").fetchall()[0] == (own_ts, 400.0)


def test_limits_can_be_disabled_for_old_recordings(store):
    old = (NOW - timedelta(days=400)).timestamp()
    Ingester(store, limits=IngestLimits(max_past_s=0)).ingest([gpu_msg(1, ts=old)])
    assert store.sample_counts()["gpu"] == 1


def test_rollups_retention_and_parquet_export(store, tmp_path):
    start = NOW.replace(minute=0, second=0) - timedelta(hours=2)
    items = [
        gpu_msg(i, ts=(start + timedelta(seconds=10 * i)).timestamp(), power_w=float(i))
        for i in range(720)
    ]  # 2 h at 10 s
    Ingester(store).ingest(items)
    store.rollup()
    minutes = store.con.execute("SELECT count(*), sum(n) FROM gpu_1m").fetchone()
    assert minutes == (119, 714)  # the bucket holding the newest sample is not complete yet
    row = store.con.execute(
        "SELECT n, power_w_avg, power_w_min, power_w_max FROM gpu_1m ORDER BY bucket LIMIT 1"
    ).fetchone()
    assert row == (6, 2.5, 0.0, 5.0)
    store.rollup()  # idempotent: nothing rolled twice
    assert store.con.execute("SELECT sum(n) FROM gpu_1m").fetchone()[0] == 714
    assert store.con.execute("SELECT sum(n) FROM gpu_1h").fetchone()[0] == 360

    out = tmp_path / "export"
    exported = store.export_parquet(out, start, start + timedelta(hours=1))
    assert exported == {"gpu": 360}
    files = list(out.glob("kind=gpu/day=*/*.parquet"))
    assert files
    # the bundle loads back through the ingest path
    with Store(tmp_path / "copy.duckdb") as copy:
        ing = Ingester(copy, limits=IngestLimits(max_past_s=0))
        ingest_path(ing, out, "small")
        assert copy.sample_counts()["gpu"] == 360
        assert copy.con.execute("SELECT sum(power_w) FROM gpu").fetchone()[0] == sum(range(360))

    deleted = store.apply_retention(raw_days=1 / 24, now=start + timedelta(hours=2))
    assert deleted["gpu"] == 360
    assert store.con.execute("SELECT sum(n) FROM gpu_1m").fetchone()[0] == 714  # rollups stay


def test_jsonl_file_with_bad_lines(store, tmp_path):
    topic, payload = gpu_msg(1)
    path = tmp_path / "msgs.jsonl"
    path.write_bytes(
        orjson.dumps({"topic": topic, "payload": orjson.loads(payload)})
        + b"\n"
        + b"this is not json\n"
        + orjson.dumps({"topic": gpu_msg(2)[0], "payload": gpu_msg(2)[1].decode()})
        + b"\n"
    )
    n = ingest_path(Ingester(store), path, "small")
    assert n == 3
    assert store.sample_counts()["gpu"] == 2
    dead = store.con.execute("SELECT topic, reason FROM dead_letters").fetchall()
    assert dead == [(f"file:{path}:2", "bad_topic")]


def test_status_counts_every_unknown_id_though_it_lists_the_recent_ones(tmp_path, small_site):
    """`dctwin status` with 150 unknown ids: the store lists 100, the command says 150."""
    import subprocess
    import sys

    db = tmp_path / "u.duckdb"
    with Store(db) as store:
        Ingester(store, small_site).ingest(
            [gpu_msg(i, source=f"ghost-{i:03d}") for i in range(150)]
        )
        assert store.status()["unknown_ids_total"] == 150
        assert len(store.status()["unknown_ids"]) == 100
    r = subprocess.run(
        [sys.executable, "-m", "twin.cli", "status", "--db", str(db), "--format", "table"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "unknown ids: 150" in r.stdout
    assert "... and 130 more (--json lists 100)" in r.stdout
