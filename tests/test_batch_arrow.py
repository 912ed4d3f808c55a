"""The batch decoder's Arrow path (pyarrow.json over whole batches) accepts exactly what the
per-message contract check accepts, and stores the same values.

Every payload here has an RFC 3339 ``ts`` (as dctwin's collectors send), so batches of them take
the Arrow path; each bad shape sits among good messages, in batches large enough that a parse
error is split down to the bad message.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from collectors.contract import QUANTITIES, ContractError, decode, topic_for
from twin.ingest import Ingester
from twin.ingest.batch_decode import BatchDecoder
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE

SITE = "small"
SOURCE = "trn-r01-n1"
TOPIC = topic_for(SITE, "gpu", SOURCE)
TS = (datetime.now(UTC) - timedelta(minutes=5)).isoformat(timespec="milliseconds")[:-6] + "Z"


def sample(g: int, **over: object) -> dict:
    s: dict = {"id": f"{SOURCE}:{g}"}
    for name, q in QUANTITIES["gpu"].items():
        s[name] = g + 1 if q.integer else 100.25 + g
    s.update(over)
    return s


def message(n: int, **over: object) -> dict:
    body = {"v": 1, "collector": "t", "source": SOURCE, "seq": n, "ts": TS}
    body["samples"] = [sample(g) for g in range(4)]
    body.update(over)
    return body


def raw(n: int, **over: object) -> bytes:
    return orjson.dumps(message(n, **over))


def good_text() -> bytes:
    return raw(7)


#: bad (or unusual) payloads: name -> payload (the topic is TOPIC unless the name says)
SHAPES: dict[str, bytes] = {
    "v_true": raw(7, v=True),
    "v_float": raw(7, v=1.0),
    "v_2": raw(7, v=2),
    "v_text": raw(7, v="1"),
    "dup_header": good_text().replace(b'"v":1,', b'"v":2,"v":1,'),
    "dup_sample": good_text().replace(b'"power_w":100.25,', b'"power_w":1.0,"power_w":100.25,', 1),
    "dup_null_first": good_text().replace(
        b'"power_w":100.25,', b'"power_w":null,"power_w":100.25,', 1
    ),
    "dup_spaced": good_text().replace(
        b'"power_w":100.25,', b'"power_w" : 1.0, "power_w":100.25,', 1
    ),
    "dup_samples": good_text()[:-1] + b',"samples":[]}',
    "dup_id": good_text().replace(b'{"id":', b'{"id":"x","id":', 1),
    "collector_spaced": raw(7, collector="nvml exporter"),
    "lower_z": raw(7, ts=TS[:-1] + "z"),
    "lower_t": raw(7, ts=TS.replace("T", "t")),
    "offset_seconds": raw(7, ts=TS[:-1] + "+00:00:00"),
    "iso_week": raw(7, ts="2026-W48-7T12:00:00Z"),
    "basic_format": raw(7, ts="20261129T120000Z"),
    "ts_year_9999": raw(7, ts="9999-12-31T23:59:59-01:00"),
    "ts_year_1": raw(7, ts="0001-01-01T00:00:00+01:00"),
    "seq_2_63": raw(7, seq=1 << 63),
    "seq_negative": raw(7, seq=-1),
    "seq_float": raw(7, seq=7.0),
    "throttle_2_63": orjson.dumps(message(7, samples=[sample(0, throttle_reasons=1 << 63)])),
    "throttle_float": raw(7, samples=[sample(0, throttle_reasons=4.0)]),
    "throttle_negative": raw(7, samples=[sample(0, throttle_reasons=-1)]),
    "power_1e308": raw(7, samples=[sample(0, power_w=1e308)]),
    "power_negative": raw(7, samples=[sample(0, power_w=-1.0)]),
    "power_null": raw(7, samples=[sample(0, power_w=None)]),
    "power_text": raw(7, samples=[sample(0, power_w="1")]),
    "power_bool": raw(7, samples=[sample(0, power_w=True)]),
    "power_int": raw(7, samples=[sample(0, power_w=612)]),
    "power_nan": good_text().replace(b'"power_w":100.25', b'"power_w":NaN', 1),
    "power_inf": good_text().replace(b'"power_w":100.25', b'"power_w":Infinity', 1),
    "power_big_int": good_text().replace(b'"power_w":100.25', b'"power_w":1' + b"0" * 30, 1),
    "temp_below_zero_k": raw(7, samples=[sample(0, temp_c=-300.0)]),
    "collector_empty": raw(7, collector=""),
    "collector_long": raw(7, collector="c" * 65),
    "collector_unicode": raw(7, collector="nvml-ü"),
    "source_mismatch": raw(7, source="other"),
    "id_empty": raw(7, samples=[sample(0, id="")]),
    "id_long": raw(7, samples=[sample(0, id="x" * 257)]),
    "id_escaped": raw(7, samples=[sample(0, id='a"b')]),
    "id_number": raw(7, samples=[sample(0, id=5)]),
    "extra_quantity": raw(7, samples=[sample(0, fan_rpm=1200.0)]),
    "extra_quantity_bad": raw(7, samples=[sample(0, fan_rpm=1e300)]),
    "sample_ts": raw(7, samples=[sample(0, ts=TS)]),
    "samples_empty": raw(7, samples=[]),
    "samples_null": raw(7, samples=None),
    "samples_null_item": raw(7, samples=[None]),
    "missing_seq": orjson.dumps({k: v for k, v in message(7).items() if k != "seq"}),
    "extra_header": raw(7, site="small"),
    "spaced": json.dumps(message(7)).encode(),
    "two_objects": good_text() + b" " + good_text(),
    "two_objects_tight": good_text() + good_text(),
    "trailing_garbage": good_text() + b"x",
    "trailing_nul": good_text() + b"\0",
    "array": b"[1]",
    "empty_object": b"{}",
    "empty": b"",
    "not_utf8": raw(7, collector="t").replace(b'"t"', b'"\xff"'),
    "surrogate": good_text().replace(b'"collector":"t"', b'"collector":"\\ud800"'),
}


def verdict(topic: str, payload: bytes) -> str | None:
    try:
        decode(topic, payload, SITE)
    except ContractError as e:
        return e.reason
    return None


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("position", [0, 150, 299])
def test_the_arrow_path_refuses_and_accepts_what_decode_does(name, position):
    bad = SHAPES[name]
    items = [(TOPIC, raw(1000 + i)) for i in range(300)]
    items[position] = (TOPIC, bad)
    batch = BatchDecoder(SITE).decode_batch(items)
    want = verdict(TOPIC, bad)
    refused = {i: e.reason for i, e in batch.refused}
    assert set(refused) <= {position}
    assert refused.get(position) == want, (name, refused, want)
    kept = {m.index for m in batch.messages}
    assert kept == set(range(300)) - set(refused)


def test_a_topic_of_another_site_is_refused_in_a_batch():
    other = topic_for("othersite", "gpu", SOURCE)
    items = [(TOPIC, raw(i)) for i in range(200)] + [(other, raw(999))]
    batch = BatchDecoder(SITE).decode_batch(items)
    assert [(i, e.reason) for i, e in batch.refused] == [(200, "wrong_site")]


def test_the_arrow_path_stores_the_values_decode_reads(tmp_path):
    """Through the ingest into a real store: every value as decode() reads it."""
    items = [(TOPIC, raw(i)) for i in range(150)]
    items.append((TOPIC, raw(150, samples=[sample(0, power_w=612, ecc_sbe_total=None)])))
    items.append((TOPIC, json.dumps(message(151)).encode()))  # the per-message path
    items.append((TOPIC, raw(0)))  # a duplicate of the first
    site = load_site(SMALL_SITE)
    with Store(tmp_path / "a.duckdb") as store:
        ing = Ingester(store, site)
        ing.ingest(items)
        assert ing.counters.stored_messages == 152 and ing.counters.duplicates == 1
        cur = store.con.execute("SELECT * EXCLUDE (ts, source) FROM gpu ORDER BY id, power_w")
        names = [d[0] for d in cur.description]
        got = cur.fetchall()
    want = []
    for topic, payload in items[:-1]:
        for s in decode(topic, payload, SITE).samples:
            want.append(tuple(s.get(n) for n in names))
    want.sort(key=lambda r: (r[names.index("id")], r[names.index("power_w")]))
    assert got == want
