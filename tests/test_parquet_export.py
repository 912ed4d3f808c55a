"""History off the box (issue 17, item 4): closed hours exported as hive-partitioned Parquet by
``dctwin export --to``, idempotently; ``dctwin query series`` over two shards' trees equals the
union of their stores; raw retention deletes exported hours only."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collectors.contract import encode, topic_for
from twin.cli import app
from twin.ingest import Ingester, IngestLimits
from twin.store import Store

T0 = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)  # crosses midnight: two day partitions
STEP_S = 60


def _msgs(source: str, n: int, offset_w: float) -> list[tuple]:
    out = []
    for i in range(n):
        ts = (T0 + timedelta(seconds=STEP_S * i)).timestamp()
        samples = [
            {"id": f"{source}:{g}", "power_w": offset_w + i + g, "temp_c": 40.0 + g}
            for g in range(2)
        ]
        payload = encode(collector="t", source=source, seq=i + 1, ts=ts, samples=samples)
        out.append((topic_for("small", "gpu", source), payload))
    return out


def _store(path: Path, source: str, offset_w: float) -> Path:
    # 3 h 10 min at 60 s: hours 22, 23 and 00 are closed, 01 (10 min old) is open
    with Store(path) as s:
        Ingester(s, limits=IngestLimits(max_past_s=0)).ingest(_msgs(source, 190, offset_w))
    return path


def _cli(*args: str) -> str:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _rows(db: Path, start: datetime, end: datetime) -> list[tuple]:
    with Store(db, read_only=True) as s:
        return s.con.execute(
            "SELECT ts, source, id, power_w, temp_c FROM gpu WHERE ts >= ? AND ts < ?"
            " ORDER BY ts, source, id",
            [start, end],
        ).fetchall()


@pytest.mark.slow
def test_export_closed_hours_idempotent_and_query_over_two_shards(tmp_path):
    a = _store(tmp_path / "a.duckdb", "trn-r01-n1", 100.0)
    b = _store(tmp_path / "b.duckdb", "trn-r01-n2", 500.0)
    hist = tmp_path / "hist"
    ra = json.loads(_cli("export", "--db", str(a), "--to", str(hist), "--shard", "hall-a"))
    _cli("export", "--db", str(b), "--to", str(hist), "--shard", "hall-b")
    assert ra["hours"] == 3 and ra["rows"] == 3 * 60 * 2

    files = _files(hist)
    hours = [("2026-11-30", "22"), ("2026-11-30", "23"), ("2026-12-01", "00")]
    expected = {
        f"kind=gpu/day={d}/hour={h}/shard={sh}/part-0.parquet"
        for d, h in hours
        for sh in ("hall-a", "hall-b")
    }
    assert set(files) == expected  # closed hours only: hour 01 is not exported
    # each file holds exactly the store's rows of its hour, in (ts, source, id) order
    for i, (d, h) in enumerate(hours):
        start = T0 + timedelta(hours=i)
        got = pq.read_table(hist / f"kind=gpu/day={d}/hour={h}/shard=hall-a/part-0.parquet")
        cols = got.select(["ts", "source", "id", "power_w", "temp_c"]).to_pylist()
        assert [tuple(r.values()) for r in cols] == _rows(a, start, start + timedelta(hours=1))

    # again: nothing new, the same bytes; a fresh export elsewhere: the same bytes too
    again = json.loads(_cli("export", "--db", str(a), "--to", str(hist), "--shard", "hall-a"))
    assert again["hours"] == 0 and again["skipped"] == 3
    assert _files(hist) == files
    other = tmp_path / "other"
    _cli("export", "--db", str(a), "--to", str(other), "--shard", "hall-a")
    assert {k: v for k, v in files.items() if "hall-a" in k} == _files(other)

    # a crash mid-write: the hour's file is gone, a temp file is left; query does not see it,
    # the next export redoes the hour with the same bytes
    victim = "kind=gpu/day=2026-11-30/hour=23/shard=hall-a/part-0.parquet"
    (hist / victim).unlink()
    (hist / victim).with_name(".part-0.parquet.tmp-999").write_bytes(b"PAR1 half")
    q = ["query", "series", "gpu", "--from", str(hist), "--format", "json"]
    rng = ["--start", "2026-11-30T23:00:00Z", "--end", "2026-12-01T00:00:00Z"]
    seen = json.loads(_cli(*q, *rng))
    assert {r["shard"] for r in seen} == {"hall-b"}
    redo = json.loads(_cli("export", "--db", str(a), "--to", str(hist), "--shard", "hall-a"))
    assert redo["hours"] == 1
    assert _files(hist)[victim] == files[victim]

    # the query over both shards equals the union of the two stores (raw rows and at a step)
    full = ["--start", "2026-11-30T22:00:00Z", "--end", "2026-12-01T01:00:00Z"]
    got = json.loads(_cli(*q, *full))
    want = sorted(_rows(a, T0, T0 + timedelta(hours=3)) + _rows(b, T0, T0 + timedelta(hours=3)))
    assert [
        (datetime.fromisoformat(r["ts"]), r["source"], r["id"], r["power_w"], r["temp_c"])
        for r in got
    ] == want
    one = json.loads(_cli(*q[:3], "trn-r01-n2:1", *q[3:], *full, "--step", "1800"))
    assert len(one) == 6 and all(r["n"] == 30 for r in one)
    first = [w[3] for w in want if w[2] == "trn-r01-n2:1"][:30]
    assert one[0]["power_w"] == pytest.approx(sum(first) / 30)

    # retention: everything is older than the cutoff, but only exported hours go
    with Store(a) as s:
        s.apply_retention(raw_days=1, now=T0 + timedelta(days=30))
        left = s.con.execute("SELECT min(ts), count(*) FROM gpu").fetchone()
    assert left == (T0 + timedelta(hours=3), 10 * 2)


def test_bad_kind_shard_and_range_are_one_clear_error(tmp_path):
    a = _store(tmp_path / "a.duckdb", "trn-r01-n1", 1.0)
    r = CliRunner().invoke(app, ["export", "--db", str(a), "--to", str(tmp_path), "--shard", "a/b"])
    assert r.exit_code == 2 and "shard name" in r.output
    r = CliRunner().invoke(
        app,
        [
            "query",
            "series",
            "nope",
            "--from",
            str(tmp_path),
            "--start",
            "2026-01-01",
            "--end",
            "2026-01-02",
        ],
    )
    assert r.exit_code == 2 and "kind 'nope'" in r.output


def test_service_retention_with_export_configured_keeps_unexported_hours(tmp_path):
    # `dctwin serve --export-to` passes exported_only=True: before any export, nothing goes
    a = _store(tmp_path / "a.duckdb", "trn-r01-n1", 1.0)
    with Store(a) as s:
        s.apply_retention(raw_days=1, now=T0 + timedelta(days=30), exported_only=True)
        assert s.con.execute("SELECT count(*) FROM gpu").fetchone()[0] == 190 * 2
        s.apply_retention(raw_days=1, now=T0 + timedelta(days=30), exported_only=False)
        assert s.con.execute("SELECT count(*) FROM gpu").fetchone()[0] == 0
