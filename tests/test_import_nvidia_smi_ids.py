"""`dctwin import nvidia-smi` (issue 29, item 6): timestamps with ISO-8601 offsets are read at
their offset and stored in UTC; a GPU number in a column other than ``index`` gives one id per
GPU, and a log whose rows cannot be told apart is refused naming its columns."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from twin.cli import app
from twin.store import Store

from .helpers import REPO

#: a real `nvidia-smi ... --format=csv -l 1` log (no licence seen: read in place, never copied)
RTX4090_LOG = REPO.parent / "shared" / "reference" / "nvidia_smi" / "rtx4090_1hz_load_cycle.csv"
needs_log = pytest.mark.skipif(
    not RTX4090_LOG.is_file(), reason=f"the reference log {RTX4090_LOG} is not here"
)


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


@needs_log
def test_the_real_log_with_plus_0800_offsets_imports_in_utc(tmp_path):
    lines = RTX4090_LOG.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        ts, rest = line.split(",", 1)
        t = datetime.strptime(ts.strip(), "%Y/%m/%d %H:%M:%S.%f")
        out.append(f"{(t + timedelta(hours=8)).isoformat(timespec='milliseconds')}+08:00,{rest}")
    log = tmp_path / "shanghai.csv"
    log.write_text("\n".join(out) + "\n")
    db = tmp_path / "o.duckdb"
    res = invoke("import", "nvidia-smi", log, "--node", "ws1", "--db", db)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["rows_refused"] == {} and summary["rows_kept"] == len(lines) - 1
    first = datetime.strptime(lines[1].split(",")[0], "%Y/%m/%d %H:%M:%S.%f")
    assert summary["time_range"][0] == first.replace(tzinfo=UTC).isoformat(
        timespec="microseconds"
    ).replace("+00:00", "Z")
    with Store(db, read_only=True) as store:
        (n, t0) = store.con.execute("SELECT count(*), min(ts) FROM gpu").fetchall()[0]
    assert n == len(lines) - 1 and t0 == first.replace(tzinfo=UTC)


def test_offsets_and_z_are_normalised_whatever_tz_says(tmp_path):
    log = tmp_path / "mixed.csv"
    log.write_text(
        "timestamp, index, power.draw [W]\n"
        "2024-07-01T20:00:00.000+08:00, 0, 100.0 W\n"
        "2024-07-01T07:30:01.000-0430, 0, 101.0 W\n"
        "2024-07-01T12:00:02.000Z, 0, 102.0 W\n"
    )
    db = tmp_path / "m.duckdb"
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", db, "--tz", "Europe/Berlin")
    assert res.exit_code == 0, res.output
    with Store(db, read_only=True) as store:
        ts = [r[0] for r in store.con.execute("SELECT ts FROM gpu ORDER BY ts").fetchall()]
    base = datetime(2024, 7, 1, 12, tzinfo=UTC)
    assert ts == [base, base + timedelta(seconds=1), base + timedelta(seconds=2)]


def _gpu_column_log(path, index_values):
    rows = ["timestamp, gpu, index, utilization.gpu [%], power.draw [W]"]
    for k in range(3):
        for g in range(8):
            rows.append(
                f"2024/07/01 12:00:0{k}.000, {g}, {index_values(g)}, {10 * g} %, {100 + g}.0 W"
            )
    path.write_text("\n".join(rows) + "\n")


def test_gpu_column_header_gives_8_ids(tmp_path):
    log = tmp_path / "gpu_col.csv"
    _gpu_column_log(log, lambda g: 0)  # index 0 on every row: one log per visible GPU
    db = tmp_path / "g.duckdb"
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", db)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["gpus"] == [f"n:{g}" for g in range(8)]
    assert summary["gpu_ids_from"].startswith("gpu")
    with Store(db, read_only=True) as store:
        rows = store.con.execute("SELECT id, max(power_w) FROM gpu GROUP BY id ORDER BY id")
        assert rows.fetchall() == [(f"n:{g}", 100.0 + g) for g in range(8)]


def test_rows_that_cannot_be_told_apart_are_refused_naming_the_columns(tmp_path):
    log = tmp_path / "clash.csv"
    _gpu_column_log(log, lambda g: g % 2)  # index varies but does not tell 8 GPUs apart
    db = tmp_path / "c.duckdb"
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", db)
    assert res.exit_code != 0
    assert "share a timestamp and a GPU id" in res.output and "'gpu'" in res.output, res.output
    assert (
        not db.exists()
        or Store(db, read_only=True).con.execute("SELECT count(*) FROM gpu").fetchall()[0][0] == 0
    )


@pytest.mark.parametrize("bad", ["2024-07-01T20:00:00+08", "2024-07-01T25:00:00+08:00"])
def test_a_bad_offset_timestamp_is_refused_by_row(tmp_path, bad):
    log = tmp_path / "bad.csv"
    log.write_text(
        f"timestamp, index, power.draw [W]\n{bad}, 0, 100.0 W\n2024-07-01T20:00:01+08:00, 0, 1 W\n"
    )
    res = invoke("import", "nvidia-smi", log, "--node", "n", "--db", tmp_path / "b.duckdb")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows_refused"] == {"bad_timestamp": 1}
