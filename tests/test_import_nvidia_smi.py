"""`dctwin import nvidia-smi`: real and written nvidia-smi CSV logs through the CLI into a store
(and over MQTT to a running ingest), and `dctwin ingest --file` refusing such a log."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collectors.mqtt import wait_until
from twin.cli import app
from twin.store import Store

from .helpers import REPO, running_ingest

#: a real `nvidia-smi --query-gpu=timestamp,name,utilization.gpu,utilization.memory,memory.used,
#: power.draw --format=csv -l 1` log (no licence seen: read in place, never copied)
RTX4090_LOG = REPO.parent / "shared" / "reference" / "nvidia_smi" / "rtx4090_1hz_load_cycle.csv"
needs_log = pytest.mark.skipif(
    not RTX4090_LOG.is_file(), reason=f"the reference log {RTX4090_LOG} is not here"
)

COLUMNS = "epoch_us(ts), id, source, power_w, util_pct, mem_util_pct, fb_used_mib, temp_c"


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def stored(db: Path) -> list[tuple]:
    with Store(db, read_only=True) as store:
        return store.con.execute(f"SELECT {COLUMNS} FROM gpu ORDER BY ts, id").fetchall()


def _expected_row(line: str) -> tuple:
    """A line of the reference log read with plain string operations (not the importer's)."""
    ts, _name, util, mem_util, used, power = (p.strip() for p in line.split(","))
    t = datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC)
    us = (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    num = [float(v.split()[0]) for v in (power, util, mem_util, used)]
    return (us, "ws1:0", "ws1", *num, None)


@needs_log
def test_real_log_every_row_stored_with_its_values(tmp_path):
    db = tmp_path / "rtx.duckdb"
    res = invoke("import", "nvidia-smi", RTX4090_LOG, "--node", "ws1", "--db", db)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    lines = RTX4090_LOG.read_text().splitlines()[1:]
    assert out["rows"] == out["rows_kept"] == len(lines) == 2619
    assert out["rows_refused"] == {} and out["ingest"]["dead_letters"] == {}
    assert out["ingest"]["stored_messages"] == len(lines)
    assert out["max_past"] == "off (import)" and "max-past guard is off" in res.stderr
    rows = stored(db)
    assert len(rows) == len(lines)
    for i in (0, 3, 1000, len(lines) - 1):  # idle, the first load step, load, the last line
        assert rows[i] == pytest.approx(_expected_row(lines[i])), lines[i]
    assert rows[0][3] == 33.09 and rows[-1][3] == 34.15
    assert max(r[3] for r in rows) == max(_expected_row(li)[3] for li in lines)
    again = invoke("import", "nvidia-smi", RTX4090_LOG, "--node", "ws1", "--db", db)
    assert again.exit_code == 0, again.output  # already stored: duplicates, not a failure
    assert json.loads(again.stdout)["ingest"]["duplicates"] == len(lines)
    assert len(stored(db)) == len(lines)


WITH_UNITS = """\
index, timestamp, power.draw [W], temperature.gpu, utilization.gpu [%], memory.used [MiB], \
clocks.current.sm [MHz], temperature.memory, name
0, 2024/01/15 10:23:45.123, 245.12 W, 61, 97 %, 40511 MiB, 1980 MHz, 70, NVIDIA H100
1, 2024/01/15 10:23:45.125, 88.50 W, 44, 0 %, 1 MiB, 345 MHz, [N/A], NVIDIA H100
0, 2024/01/15 10:23:46.124, 250.00 W, 62, 100 %, 40511 MiB, 1980 MHz, [Not Supported], NVIDIA H100
1, 2024/01/15 10:23:46.126, [N/A], 44, 0 %, 1 MiB, 345 MHz, 52, NVIDIA H100
"""
QUERY = "index,timestamp,power.draw,temperature.gpu,utilization.gpu,memory.used,clocks.sm," + (
    "temperature.memory,name"
)


def _nounits_noheader(text: str) -> str:
    """The same log as ``--format=csv,noheader,nounits`` writes it: no header, "245.12 W" as
    "245.12" (the timestamp keeps its space)."""
    lines = text.splitlines()[1:]
    return "".join(re.sub(r"(\d) (W|%|MiB|MHz)(?=,|$)", r"\1", line) + "\n" for line in lines)


def test_noheader_nounits_stores_what_the_log_with_units_does(tmp_path):
    units = tmp_path / "units.csv"
    units.write_text(WITH_UNITS)
    bare = tmp_path / "bare.csv"
    bare.write_text(_nounits_noheader(WITH_UNITS))
    assert "W" not in bare.read_text() and "index" not in bare.read_text()
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    r1 = invoke("import", "nvidia-smi", units, "--node", "n7", "--db", a)
    assert r1.exit_code == 0, r1.output
    no_query = invoke("import", "nvidia-smi", bare, "--node", "n7", "--db", b)
    assert no_query.exit_code == 2 and "--query-gpu" in no_query.output
    r2 = invoke("import", "nvidia-smi", bare, "--node", "n7", "--db", b, "--query-gpu", QUERY)
    assert r2.exit_code == 0, r2.output
    sql = "SELECT epoch_us(ts), id, power_w, temp_c, util_pct, fb_used_mib, clock_sm_mhz,"
    sql += " mem_temp_c FROM gpu ORDER BY ts, id"
    with Store(a, read_only=True) as sa, Store(b, read_only=True) as sb:
        rows_a, rows_b = sa.con.execute(sql).fetchall(), sb.con.execute(sql).fetchall()
    assert rows_a == rows_b and len(rows_a) == 4
    t0 = datetime(2024, 1, 15, 10, 23, 45, 123000, tzinfo=UTC)
    us0 = (t0 - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert rows_a[0] == (us0, "n7:0", 245.12, 61.0, 97.0, 40511.0, 1980.0, 70.0)
    assert rows_a[1][1] == "n7:1" and rows_a[1][7] is None  # [N/A] is missing, not 0
    assert rows_a[2][7] is None and rows_a[3][2] is None  # [Not Supported], [N/A] power
    out = json.loads(r1.stdout)
    assert out["ignored_fields"] == ["name"] and out["gpus"] == ["n7:0", "n7:1"]
    assert out["quantities"]["clock_sm_mhz"] == "clocks.current.sm"


def test_tz_shifts_local_timestamps_to_utc(tmp_path):
    log = tmp_path / "berlin.csv"
    log.write_text("timestamp, index, power.draw [W]\n2024/07/01 12:00:00.000, 0, 100.0 W\n")
    db = tmp_path / "tz.duckdb"
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", db, "--tz", "Europe/Berlin")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["time_range"][0] == "2024-07-01T10:00:00Z"  # CEST = UTC+2


def test_nothing_valid_exits_nonzero_naming_the_reasons(tmp_path):
    log = tmp_path / "junk.csv"
    log.write_text(
        "timestamp, index, power.draw [W], utilization.gpu [%]\n"
        "yesterday, 0, 245 W, 97 %\n"  # bad_timestamp
        "2024/01/15 10:23:45.123, 0, lots, 97 %\n"  # bad_number
        "2024/01/15 10:23:46.123, 0, 245 kW, 97 %\n"  # wrong_unit
        "2024/01/15 10:23:47.123, 0, 245 W\n"  # wrong_field_count
        "2024/01/15 10:23:48.123, 0, [N/A], [N/A]\n"  # no_values
        "2024/01/15 10:23:49.123, x, 245 W, 97 %\n"  # bad_gpu
        "2024/01/15 10:23:50.123, 0, -5 W, 97 %\n"  # valid as a row; the contract refuses it
    )
    db = tmp_path / "junk.duckdb"
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", db)
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    want = ("bad_timestamp", "bad_number", "wrong_unit", "wrong_field_count", "no_values")
    assert out["rows_refused"] == dict.fromkeys((*want, "bad_gpu"), 1)
    assert out["ingest"]["dead_letters"] == {"negative_value": 1}
    assert "nothing of" in res.stderr and "was stored" in res.stderr
    for reason in (*want, "bad_gpu", "negative_value"):
        assert f"1 rows {reason}" in res.stderr or f"1 messages {reason}" in res.stderr, reason
    assert "line 2: yesterday" in out["refused_examples"]["bad_timestamp"]


def test_whole_file_errors_are_clear(tmp_path):
    log = tmp_path / "nots.csv"
    log.write_text("index, power.draw [W]\n0, 10 W\n")
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", tmp_path / "x.duckdb")
    assert res.exit_code == 2 and "no timestamp field" in res.output
    log.write_text("timestamp, power.draw [kW]\n2024/01/15 10:23:45.123, 1\n")
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", tmp_path / "x.duckdb")
    assert res.exit_code == 2 and "power.draw in kW, expected W" in res.output
    res = invoke("import", "nvidia-smi", log, "--node", "n")
    assert res.exit_code == 2 and "exactly one of --db" in res.output
    res = invoke("import", "nvidia-smi", log, "--node", "a/b", "--db", tmp_path / "x.duckdb")
    assert res.exit_code == 2 and "--node 'a/b'" in res.output
    row = "2024/01/15 10:23:45.123, 10 W\n"
    log.write_text("timestamp, power.draw [W]\n" + row + row)  # two GPUs, no index
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", tmp_path / "x.duckdb")
    assert res.exit_code == 2 and "no field tells the GPUs apart" in res.output


@needs_log
def test_ingest_file_on_an_nvidia_smi_log_exits_nonzero(tmp_path):
    res = invoke("ingest", "--file", RTX4090_LOG, "--db", tmp_path / "i.duckdb")
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["stored_messages"] == 0
    assert "nothing of" in res.stderr and "2620 bad_topic" in res.stderr
    assert "dctwin import nvidia-smi" in res.stderr


@pytest.mark.mqtt
def test_import_over_mqtt_reaches_a_running_ingest(broker, tmp_path):
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    log = tmp_path / "recent.csv"
    rows = [
        f"{(now + timedelta(seconds=i)).strftime('%Y/%m/%d %H:%M:%S')}.000, {g}, {100 + i} W"
        for i in range(5)
        for g in (0, 1)
    ]
    log.write_text("timestamp, index, power.draw [W]\n" + "\n".join(rows) + "\n")
    with running_ingest(broker, tmp_path / "svc.duckdb", "imp-test") as (_, ingester):
        env = broker.client_env()
        res = CliRunner(env=env).invoke(
            app, ["import", "nvidia-smi", str(log), "--node", "n", "--broker", broker.address]
        )
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["mqtt"]["acknowledged"] == 10 and out["mqtt"]["refused_by_contract"] == {}
        assert "--max-past guard" in res.stderr
        assert wait_until(lambda: ingester.counters.samples["gpu"] == 10, 20)


def test_import_has_help():
    for args in (["import", "--help"], ["import", "nvidia-smi", "--help"]):
        res = invoke(*args)
        assert res.exit_code == 0 and "Usage" in res.output, (args, res.output)
    assert "nvidia-smi" in invoke("import", "--help").output
