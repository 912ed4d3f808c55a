"""`dctwin import prometheus`: Prometheus API answers holding dcgm-exporter series, through the
CLI into a store (and over MQTT to a running ingest); the values stored are checked against the
fixture read with plain JSON, not with the importer."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from collectors.dcgm import DCGM_FP64_BLANK, DCGM_INT32_BLANK, DCGM_INT64_BLANK, is_blank
from collectors.mqtt import wait_until
from twin.cli import app
from twin.store import Store

from .helpers import REPO, running_ingest

#: 2 nodes x 2 GPUs x 11 metrics x 60 points at 15 s (see make_dcgm_query_range.py there)
FIXTURE = REPO / "tests" / "fixtures" / "prometheus" / "dcgm_query_range.json"
T0 = 1712345670

#: fixture metric -> (stored column, factor to the contract's unit)
COLUMNS = {
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),  # mJ
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("mem_temp_c", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("fb_used_mib", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("clock_sm_mhz", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", 1.0),
}
SQL = "SELECT epoch_us(ts), source, id, " + ", ".join(c for c, _ in COLUMNS.values())
SQL += " FROM gpu ORDER BY ts, id"


def invoke(*args: Any, env: dict[str, str] | None = None):
    return CliRunner(env=env).invoke(app, [str(a) for a in args])


def stored(db: Path) -> list[tuple]:
    with Store(db, read_only=True) as store:
        return store.con.execute(SQL).fetchall()


def answer(result: list[dict], rtype: str = "matrix") -> dict:
    return {"status": "success", "data": {"resultType": rtype, "result": result}}


def fixture_series() -> list[dict]:
    return json.loads(FIXTURE.read_text())["data"]["result"]


def expected_rows() -> list[tuple]:
    """The fixture as the store should hold it: NaN and +Inf left out, the L4s' 0 °C memory
    temperature left out, energy in J, one row per GPU and timestamp."""
    rows: dict[tuple[int, str], dict[str, float | None]] = {}
    for s in fixture_series():
        m = s["metric"]
        if m["__name__"] not in COLUMNS:
            continue
        col, factor = COLUMNS[m["__name__"]]
        for ts, text in s["values"]:
            value = float(text)
            if not math.isfinite(value) or (col == "mem_temp_c" and value == 0.0):
                value = None
            key = (int(ts * 1_000_000), f"{m['Hostname']}:{m['gpu']}")
            row = rows.setdefault(key, dict.fromkeys(c for c, _ in COLUMNS.values()))
            row[col] = None if value is None else value * factor
    return [
        (us, sid.split(":")[0], sid, *row.values())
        for (us, sid), row in sorted(rows.items(), key=lambda kv: kv[0])
    ]


def test_query_range_stored_with_its_values(tmp_path):
    db = tmp_path / "p.duckdb"
    res = invoke("import", "prometheus", FIXTURE, "--db", db)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert "max-past guard is off" in res.stderr and out["max_past"] == "off (import)"
    assert out["series"] == 44 and out["unknown_metrics"] == {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 4}
    # the 10 mapped metrics of 3 GPUs at 60 points and of node02 GPU 1, stale after 45
    assert out["points"] == 10 * (3 * 60 + 45)
    # NaN power and +Inf SM activity; the L4s' memory temperature (60 + 45 points); the
    # management power limit where the enforced one is there (225 GPU-timestamps)
    assert out["points_refused"] == {"non_finite": 2, "unmeasured_zero": 105, "superseded": 225}
    assert "'NaN'" in out["refused_examples"]["non_finite"]
    assert out["unmeasured_zero_fields"] == [
        "node02:0 DCGM_FI_DEV_MEMORY_TEMP",
        "node02:1 DCGM_FI_DEV_MEMORY_TEMP",
    ]
    assert out["nodes"] == ["node01", "node02"] and len(out["gpu_uuids"]) == 4
    assert out["samples"] == 225 and out["messages"] == 120  # one per node and timestamp
    assert out["time_range"] == ["2024-04-05T19:34:30Z", "2024-04-05T19:49:15Z"]
    assert out["ingest"]["stored_messages"] == 120 and out["ingest"]["dead_letters"] == {}
    rows = stored(db)
    want = expected_rows()
    assert len(rows) == len(want) == 225
    for got, exp in zip(rows, want, strict=True):
        assert got == pytest.approx(exp), exp
    by_id = {(r[0], r[2]): r for r in rows}
    # power "582.7" W; energy "9808740500" mJ is 9808740.5 J
    assert by_id[(T0 * 10**6, "node01:0")][3:5] == (582.7, 9808740.5)
    assert by_id[((T0 + 150) * 10**6, "node01:1")][3] is None  # the NaN: missing, not 0
    assert all(r[6] is None for r in rows if r[1] == "node02")  # unmeasured 0 °C
    assert max(r[0] for r in rows if r[2] == "node02:1") == (T0 + 44 * 15) * 10**6  # stale
    again = invoke("import", "prometheus", FIXTURE, "--db", db)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["ingest"]["duplicates"] == 120
    assert len(stored(db)) == 225


def test_concatenated_answers_store_what_one_answer_does(tmp_path):
    """The same series split into one answer per metric, as JSON lines with overlapping time
    windows and as a JSON array, and the bare list of series, store exactly what the single
    answer stores."""
    series = fixture_series()
    by_metric: dict[str, list[dict]] = {}
    for s in series:
        by_metric.setdefault(s["metric"]["__name__"], []).append(s)
    lines = []
    for part in by_metric.values():  # points 0-39 and 30-59: ten points twice
        lines.append(answer([{**s, "values": s["values"][:40]} for s in part]))
        lines.append(answer([{**s, "values": s["values"][30:]} for s in part]))
    jsonl = tmp_path / "queries.jsonl"
    jsonl.write_text("".join(json.dumps(a) + "\n" for a in lines))
    array = tmp_path / "queries.json"
    array.write_text(json.dumps([answer(p) for p in by_metric.values()], indent=1))
    one, a, b = tmp_path / "one.duckdb", tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    assert invoke("import", "prometheus", FIXTURE, "--db", one).exit_code == 0
    res = invoke("import", "prometheus", jsonl, "--db", a)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["responses"] == 2 * len(by_metric)
    # ten points twice in every series but the unknown metric's four and the L4s' memory
    # temperatures (left out as unmeasured before duplicates are looked for)
    assert out["points_refused"]["duplicate"] == 10 * (44 - 4 - 2)
    res = invoke("import", "prometheus", array, "--db", b)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["responses"] == len(by_metric)
    bare = tmp_path / "result.json"  # the data.result list alone
    bare.write_text(json.dumps(series))
    c = tmp_path / "c.duckdb"
    assert invoke("import", "prometheus", bare, "--db", c).exit_code == 0
    assert stored(a) == stored(b) == stored(c) == stored(one)


def _labels(name: str, gpu: str | None = "0", **extra: str) -> dict[str, str]:
    m = {"__name__": name, "UUID": f"GPU-{gpu}-uuid", "instance": "10.0.0.5:9400"}
    if gpu is not None:
        m["gpu"] = gpu
    return {**m, **extra}


def test_vector_answer_instance_host_and_mig(tmp_path):
    """An instant query (resultType vector, millisecond timestamps) from an exporter without a
    Hostname label: the node is the instance's host; under MIG, utilization goes to the GPU
    instance and power to its parent GPU; --node names the node instead."""
    ts = 1712345678.123
    result = [
        {"metric": _labels("DCGM_FI_DEV_POWER_USAGE"), "value": [ts, "612.345"]},
        {"metric": _labels("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), "value": [ts, "9876543210"]},
        {"metric": _labels("DCGM_FI_DEV_POWER_USAGE", "1", GPU_I_ID="2"), "value": [ts, "301.5"]},
        {"metric": _labels("DCGM_FI_DEV_GPU_UTIL", "1", GPU_I_ID="2"), "value": [ts, "40"]},
        {"metric": _labels("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "1"), "value": [ts, "4"]},
        {"metric": _labels("DCGM_FI_DEV_XID_ERRORS", "1"), "value": [ts, "79"]},
    ]
    f = tmp_path / "instant.json"
    f.write_text(json.dumps(answer(result, "vector")))
    db = tmp_path / "v.duckdb"
    res = invoke("import", "prometheus", f, "--db", db)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["nodes"] == ["10.0.0.5"] and out["messages"] == 1
    assert out["gpus"] == ["10.0.0.5:0", "10.0.0.5:1", "10.0.0.5:1/mig2"]
    sql = "SELECT epoch_us(ts), id, power_w, energy_j, util_pct, throttle_reasons FROM gpu"
    with Store(db, read_only=True) as store:
        rows = store.con.execute(sql + " ORDER BY id").fetchall()
        extra = store.con.execute("SELECT id, quantity, value FROM extra_readings").fetchall()
    assert extra == [("10.0.0.5:1", "xid_last", 79.0)]  # a name the contract does not know
    us = 1712345678123000
    assert rows == [
        (us, "10.0.0.5:0", 612.345, pytest.approx(9876543.21), None, None),
        (us, "10.0.0.5:1", 301.5, None, None, 4),
        (us, "10.0.0.5:1/mig2", None, None, 40.0, None),
    ]
    named = invoke("import", "prometheus", f, "--db", tmp_path / "n.duckdb", "--node", "gpu-7")
    assert named.exit_code == 0, named.output
    assert json.loads(named.stdout)["nodes"] == ["gpu-7"]


def test_dcgm_blanks_left_out_as_the_collector_does(tmp_path):
    """DCGM's blank sentinels are left out (the collector's rule, :func:`is_blank`); values next
    to them are numbers, which the contract then refuses as out of range."""
    values = [
        ("DCGM_FI_DEV_POWER_USAGE", DCGM_FP64_BLANK, True),
        ("DCGM_FI_DEV_POWER_USAGE", DCGM_FP64_BLANK - 1, False),
        ("DCGM_FI_DEV_GPU_TEMP", float(DCGM_INT64_BLANK + 2), True),
        ("DCGM_FI_DEV_GPU_TEMP", float(DCGM_INT32_BLANK + 15), True),
        ("DCGM_FI_DEV_GPU_TEMP", float(DCGM_INT32_BLANK + 16), False),
        ("DCGM_FI_DEV_GPU_TEMP", float(DCGM_INT32_BLANK - 1), False),
        ("DCGM_FI_DEV_GPU_TEMP", 61.0, False),
    ]
    assert [is_blank(v, name.endswith("USAGE")) for name, v, _ in values] == [
        blank for *_, blank in values
    ]
    result = [  # one timestamp each, so that each value is its own message
        {"metric": _labels(name, "0"), "values": [[T0 + 15 * i, repr(v)]]}
        for i, (name, v, _) in enumerate(values)
    ]
    f = tmp_path / "blanks.json"
    f.write_text(json.dumps(answer(result)))
    db = tmp_path / "b.duckdb"
    res = invoke("import", "prometheus", f, "--db", db)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["points_refused"] == {"dcgm_blank": 3} and out["messages"] == 4
    assert out["ingest"]["dead_letters"] == {"out_of_range": 3}
    with Store(db, read_only=True) as store:
        rows = store.con.execute("SELECT epoch_us(ts), power_w, temp_c FROM gpu").fetchall()
    assert rows == [((T0 + 15 * 6) * 10**6, None, 61.0)]


def test_nothing_valid_exits_1_naming_the_reasons(tmp_path):
    answers = [
        {"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'},
        answer([{"metric": _labels("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), "values": [[T0, "0"]]}]),
        answer([{"metric": _labels("DCGM_FI_DEV_POWER_USAGE", None, UUID=""), "values": []}]),
        answer([{"metric": _labels("DCGM_FI_DEV_POWER_USAGE"), "values": [[T0, "NaN"]]}]),
        answer(
            [
                {
                    "metric": _labels("DCGM_FI_DEV_POWER_USAGE", "1"),
                    "values": [["x", "1"], [1e12, "2"]],
                }
            ]
        ),
        answer([{"metric": _labels("DCGM_FI_DEV_MEMORY_TEMP", "2"), "values": [[T0, "0"]]}]),
        answer([{"metric": _labels("DCGM_FI_DEV_POWER_USAGE", "3"), "values": [[T0, "-5"]]}]),
        {"status": "success", "data": {"resultType": "scalar", "result": [T0, "1"]}},
    ]
    f = tmp_path / "junk.jsonl"
    f.write_text("\n".join(json.dumps(a) for a in answers) + "\n")
    res = invoke("import", "prometheus", f, "--db", tmp_path / "j.duckdb")
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["responses_refused"] == {"error_response": 1, "unsupported_result_type": 1}
    assert out["series_refused"] == {"no_gpu": 1}
    assert out["points_refused"] == {"bad_point": 2, "non_finite": 1, "unmeasured_zero": 1}
    assert out["ingest"]["dead_letters"] == {"negative_value": 1}  # the contract's own check
    for part in (
        "1 responses error_response",
        "1 responses unsupported_result_type",
        "1 series no_gpu",
        "1 series unknown_metric",
        "2 points bad_point",
        "1 points non_finite",
        "1 points unmeasured_zero",
        "1 messages negative_value",
    ):
        assert part in res.stderr, part
    assert 'answer 1: bad_data: parse error: unexpected "}"' in res.stderr
    assert "Traceback" not in res.output


def test_an_error_answer_alone(tmp_path):
    f = tmp_path / "error.json"
    f.write_text(
        json.dumps(
            {
                "status": "error",
                "errorType": "execution",
                "error": "query processing would load too many samples into memory",
            }
        )
    )
    res = invoke("import", "prometheus", f, "--db", tmp_path / "e.duckdb")
    assert res.exit_code == 1, res.output
    assert "execution: query processing would load too many samples" in res.stderr
    assert "1 responses error_response" in res.stderr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"status": "success", "data": {"resultType": "matrix", "result": [', "not JSON"),
        (json.dumps(answer([])) + "\n" + '{"status": "succ', "line 2:"),
        ("", "the file is empty"),
        ("[]", "no answer in it"),
    ],
)
def test_malformed_json_is_a_clear_error(tmp_path, text, says):
    f = tmp_path / "bad.json"
    f.write_text(text)
    res = invoke("import", "prometheus", f, "--db", tmp_path / "m.duckdb")
    assert res.exit_code == 2, res.output
    assert says in res.output and str(f.name) in res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_bad_arguments_are_clear(tmp_path):
    res = invoke("import", "prometheus", FIXTURE)
    assert res.exit_code == 2 and "exactly one of --db" in res.output
    res = invoke("import", "prometheus", tmp_path / "nope.json", "--db", tmp_path / "x.duckdb")
    assert res.exit_code == 2 and "no such file" in res.output
    res = invoke("import", "prometheus", FIXTURE, "--node", "a/b", "--db", tmp_path / "x.duckdb")
    assert res.exit_code == 2 and "--node 'a/b'" in res.output
    res = invoke("import", "prometheus", FIXTURE, "--node", "n1", "--db", tmp_path / "x.duckdb")
    assert res.exit_code == 2 and "come from 2 hosts" in res.output


@pytest.mark.mqtt
def test_import_over_mqtt_reaches_a_running_ingest(broker, tmp_path):
    """The fixture moved to the last quarter hour, published over MQTT at QoS 1."""
    shift = int((datetime.now(UTC) - timedelta(minutes=20)).timestamp()) - T0
    doc = json.loads(FIXTURE.read_text())
    for s in doc["data"]["result"]:
        s["values"] = [[ts + shift, v] for ts, v in s["values"]]
    f = tmp_path / "recent.json"
    f.write_text(json.dumps(doc))
    db = tmp_path / "svc.duckdb"
    with running_ingest(broker, db, "prom-test") as (_, ingester):
        res = invoke("import", "prometheus", f, "--broker", broker.address, env=broker.client_env())
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["mqtt"]["acknowledged"] == 120 and out["mqtt"]["refused_by_contract"] == {}
        assert "--max-past guard" in res.stderr
        assert wait_until(lambda: ingester.counters.samples["gpu"] == 225, 20)
    with Store(db, read_only=True) as store:
        rows = store.con.execute("SELECT count(*), count(power_w) FROM gpu").fetchall()
    assert rows == [(225, 224)]  # the NaN power left out


def test_import_prometheus_has_help():
    res = invoke("import", "prometheus", "--help")
    assert res.exit_code == 0 and "Usage" in res.output and "dcgm-exporter" in res.output
    assert "prometheus" in invoke("import", "--help").output
