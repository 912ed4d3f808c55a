"""One value rule, every path: a value beyond its quantity's rule (collectors.contract's
Quantity, value_breaks) is refused for the same reason by the message models (decode), the
ingest's batch decoder (its Python and its Arrow column checks) and the table path (replay's
Ingester.ingest_table), and the value at the rule's own limit is accepted by all of them."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from collectors.contract import (
    QUANTITIES,
    ContractError,
    decode,
    encode,
    topic_for,
    value_breaks,
    value_reason,
    value_rule,
)
from twin.ingest import Ingester, IngestLimits
from twin.ingest.batch_decode import BatchDecoder
from twin.store import Store

SITE = "small"
SOURCE = "trn-r01-n1"
PATHS = ("decode", "batch_python", "batch_arrow", "table")

#: name -> (kind, quantity, refused value, its reason, the accepted value at the rule's limit)
CASES: dict[str, tuple[str, str, float, str, float]] = {
    "gpu_temp_beyond_bound": ("gpu", "temp_c", 2e4, "out_of_range", 1e4),
    "gpu_temp_below_absolute_zero": ("gpu", "temp_c", -300.0, "out_of_range", -273.15),
    "gpu_power_negative": ("gpu", "power_w", -4.0, "negative_value", 0.0),
    "gpu_power_infinite": ("gpu", "power_w", math.inf, "non_finite", 1e9),
    "gpu_integer_negative": ("gpu", "throttle_reasons", -1, "negative_value", 0),
    "unnamed_beyond_extra_bound": ("gpu", "psu_temp_c", 1e16, "out_of_range", 1e15),
    "long_quantity_negative": ("pdu", "neutral_current_a", -1.0, "negative_value", 0.0),
}


def _ts() -> datetime:
    return (datetime.now(UTC) - timedelta(minutes=1)).replace(microsecond=0)


def _sample(kind: str, name: str, value: float) -> dict:
    sid = f"{SOURCE}:0" if kind == "gpu" else SOURCE
    base = {"power_w": 300.0} if name != "power_w" else {}
    return {"id": sid, **base, name: value}


def _payload(seq: int, ts: datetime, samples: list[dict]) -> bytes:
    if all(math.isfinite(v) for s in samples for v in s.values() if type(v) is float):
        return encode(collector="t", source=SOURCE, seq=seq, ts=ts, samples=samples)
    # orjson writes a non-finite float as null: what a sender of Infinity puts on the wire
    body = {"v": 1, "collector": "t", "source": SOURCE, "seq": seq}
    body |= {"ts": ts.isoformat().replace("+00:00", "Z"), "samples": samples}
    return json.dumps(body, separators=(",", ":")).encode()


def _verdict(path: str, kind: str, name: str, value: float, tmp_path) -> str | None:
    """The dead-letter reason ``path`` gives a message whose one sample carries ``value``
    (None: stored)."""
    ts = _ts()
    topic = topic_for(SITE, kind, SOURCE)
    payload = _payload(7, ts, [_sample(kind, name, value)])
    if path == "decode":
        try:
            decode(topic, payload, SITE)
        except ContractError as e:
            return e.reason
        return None
    if path.startswith("batch"):
        # alone: the Python column checks; among 200 good messages of its kind: the Arrow path
        good = [
            (topic, _payload(100 + i, ts, [_sample(kind, "power_w", 1.0)]))
            for i in range(0 if path == "batch_python" else 200)
        ]
        batch = BatchDecoder(SITE).decode_batch([*good, (topic, payload)])
        assert len(batch.messages) + len(batch.refused) == len(good) + 1
        assert all(i == len(good) for i, _ in batch.refused), batch.refused
        return batch.refused[0][1].reason if batch.refused else None
    typ = pa.int64() if isinstance(value, int) else pa.float64()
    table = pa.table(
        {
            "ts": pa.array([ts], pa.timestamp("us", tz="UTC")),
            "source": [SOURCE],
            "id": [_sample(kind, name, value)["id"]],
            name: pa.array([value], typ),
        }
    )
    tmp_path.mkdir()
    with Store(tmp_path / "t.duckdb") as store:
        ing = Ingester(store, None, IngestLimits(max_past_s=0))
        ing.ingest_table(kind, table, np.array([7]), "t", site=SITE)
        dead = {k: v for k, v in ing.counters.dead_letters.items() if v}
        stored = store.sample_counts()[kind]
        extra = store.con.execute("SELECT count(*) FROM extra_readings").fetchall()[0][0]
    assert sum(dead.values()) + stored == 1, (dead, stored)
    if name not in QUANTITIES[kind]:  # a long or unnamed quantity: kept in extra_readings
        assert extra == stored
    return next(iter(dead)) if dead else None


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_path_refuses_a_value_by_the_one_rule(case, path, tmp_path):
    kind, name, bad, reason, limit = CASES[case]
    q = value_rule(kind, name)
    # the one definition says so ...
    assert value_reason(q, bad) == reason
    assert value_reason(q, limit) is None and limit in (q.lower, q.bound)
    assert any(bool(b) for b in value_breaks(q, np.array([bad]))) and not any(
        bool(b.any()) for b in value_breaks(q, np.array([limit]))
    )
    # ... and the path agrees: the value past the limit refused for that reason, the limit kept
    assert _verdict(path, kind, name, bad, tmp_path / "bad") == reason
    assert _verdict(path, kind, name, limit, tmp_path / "limit") is None


def test_a_nan_in_a_table_is_stored_as_the_message_paths_null(tmp_path):
    """A NaN in a float column is a null (JSON has no NaN): the table path stores NULL, as the
    message path does for the same message with the quantity left out, never a NaN."""
    ts = _ts()
    table = pa.table(
        {
            "ts": pa.array([ts, ts], pa.timestamp("us", tz="UTC")),
            "source": [SOURCE, SOURCE],
            "id": [f"{SOURCE}:0", f"{SOURCE}:1"],
            "power_w": pa.array([float("nan"), 300.0]),
            "temp_c": pa.array([55.0, 56.0]),
        }
    )
    with Store(tmp_path / "t.duckdb") as store:
        ing = Ingester(store, None, IngestLimits(max_past_s=0))
        ing.ingest_table("gpu", table, np.array([7, 7]), "t", site=SITE)
        rows = store.con.execute(
            "SELECT id, power_w, isnan(power_w), temp_c FROM gpu ORDER BY id"
        ).fetchall()
    assert rows == [(f"{SOURCE}:0", None, None, 55.0), (f"{SOURCE}:1", 300.0, False, 56.0)]


def test_the_redfish_collector_skips_at_the_edge_what_the_rule_refuses(caplog):
    """A collector applies the same rule before it publishes: a reading the twin would refuse
    is skipped with the rule's reason (the poll's other readings still go out), not sent to
    dead-letter the whole message."""
    from collectors.redfish import _Samples

    samples = _Samples("pdu")
    with caplog.at_level("WARNING", logger="collectors.redfish"):
        samples.put("pdu-a/L1", "current_a", -1.0, "L1 current")
        samples.put("pdu-a/L2", "current_a", 2e6, "L2 current")
        samples.put("pdu-a/L3", "current_a", 1e6, "L3 current")  # the rule's own limit
    assert samples.list() == [{"id": "pdu-a/L3", "current_a": 1e6}]
    said = [r.getMessage() for r in caplog.records]
    assert any("L1 current skipped: negative_value" in m for m in said), said
    assert any("L2 current skipped: out_of_range" in m for m in said), said
    with pytest.raises(ContractError) as e:  # what the twin says of the same reading
        decode(
            topic_for(SITE, "pdu", SOURCE),
            encode(
                collector="t",
                source=SOURCE,
                seq=1,
                ts=_ts(),
                samples=[{"id": "pdu-a/L2", "current_a": 2e6}],
            ),
            SITE,
        )
    assert e.value.reason == "out_of_range"
