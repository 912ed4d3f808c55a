"""`dctwin replay --db`: column-wise from the bundle's Parquet, storing exactly what the
message path (contract JSON messages through Ingester.ingest) stores, bad values and unknown
ids included."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collectors.contract import KINDS
from twin.cli import app
from twin.ingest import Ingester, IngestLimits
from twin.replay.bundle import Bundle, record
from twin.replay.replay import replay, replay_into
from twin.simulator import SiteSimulator
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE

runner = CliRunner()
START = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
UNKNOWN_ID = "ghost-node:7"
EXTRA = "psu_temp_c"  # a quantity the contract does not name


@pytest.fixture(scope="module")
def clean_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten minutes of the small site, simulated at 1 s and recorded at 10 s."""
    tmp = tmp_path_factory.mktemp("fast")
    site = load_site(SMALL_SITE)
    sim = SiteSimulator(site, seed=5, start=START)
    with Store(tmp / "src.duckdb") as src:
        ing = Ingester(src, site, IngestLimits(max_past_s=0))
        batch = []
        for _ in range(600):
            batch.extend(sim.step())
        ing.ingest(batch)
        record(src, SMALL_SITE, tmp / "b", START, START + timedelta(minutes=10))
    return tmp / "b"


@pytest.fixture(scope="module")
def bad_bundle(clean_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same with what live data brings: a GPU temperature beyond the contract's bound, a
    negative power, a GPU the site does not know, and a quantity the contract does not name
    (with a null, and a value beyond its bound)."""
    out = tmp_path_factory.mktemp("bad") / "b"
    shutil.copytree(clean_bundle, out)
    gpu = pq.read_table(out / "gpu.parquet")
    temp = gpu.column("temp_c").to_numpy().copy()
    temp[5] = 20_000  # 20,000 degC: beyond the contract's 1e4 bound -> out_of_range
    power = gpu.column("power_w").to_numpy().copy()
    power[300] = -4  # -20 W -> negative_value
    ids = gpu.column("id").cast(pa.string())
    first = ids[0].as_py()
    ids = pc.if_else(pc.equal(ids, first), UNKNOWN_ID, ids)
    gpu = gpu.set_column(gpu.schema.get_field_index("temp_c"), "temp_c", pa.array(temp))
    gpu = gpu.set_column(gpu.schema.get_field_index("power_w"), "power_w", pa.array(power))
    gpu = gpu.set_column(gpu.schema.get_field_index("id"), "id", ids)
    pq.write_table(gpu, out / "gpu.parquet")
    node = pq.read_table(out / "node.parquet")
    extra = np.linspace(30.0, 40.0, node.num_rows)
    extra[7] = 1e16  # beyond EXTRA_BOUND -> out_of_range
    mask = np.zeros(node.num_rows, dtype=bool)
    mask[3] = True  # a null: the message leaves the quantity out
    node = node.append_column(EXTRA, pa.array(extra, mask=mask))
    pq.write_table(node, out / "node.parquet")
    return out


def _message_path(bundle: Path, db: Path) -> dict:
    b = Bundle.load(bundle)
    with Store(db) as store:
        ing = Ingester(store, b.site, IngestLimits(max_future_s=0, max_past_s=0))
        replay(b, sink=ing.ingest)
        store.rollup()
    return ing.counters.as_dict()


def _cli(bundle: Path, db: Path, *more: str) -> tuple[dict, str]:
    import json

    res = runner.invoke(app, ["replay", str(bundle), "--db", str(db), *more])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


def _contents(db: Path) -> dict[str, list]:
    """Every table replay writes, rows sorted, received_at (the wall clock) left out."""
    queries = {k: f"SELECT * FROM {k}" for k in KINDS}
    queries |= {
        "extra_readings": "SELECT * FROM extra_readings",
        "ingest_log": "SELECT source, kind, seq, ts, collector, n_samples FROM ingest_log",
        "dead_letters": "SELECT topic, payload, reason, detail, payload_bytes, sha256"
        " FROM dead_letters",
        "unknown_ids": "SELECT * FROM unknown_ids",
    }
    with Store(db, read_only=True) as store:
        tables = [r[0] for r in store.con.execute("SHOW TABLES").fetchall()]
        for t in tables:
            if t.startswith(tuple(f"{k}_" for k in KINDS)):  # the rollups
                queries[t] = f"SELECT * FROM {t}"
        return {
            name: sorted(store.con.execute(q).fetchall(), key=repr) for name, q in queries.items()
        }


@pytest.mark.slow
@pytest.mark.parametrize("speed", ["0", "600"])
def test_column_replay_stores_what_the_message_path_stores(
    bad_bundle: Path, tmp_path: Path, speed: str
) -> None:
    slow = _message_path(bad_bundle, tmp_path / "messages.duckdb")
    stats, _ = _cli(bad_bundle, tmp_path / "columns.duckdb", "--speed", speed)
    fast = stats["ingest"]
    assert fast == slow
    # live data's handling, both ways: the bad messages dead-lettered by reason, the rest kept
    assert fast["dead_letters"] == {"out_of_range": 2, "negative_value": 1}, fast
    assert fast["duplicates"] == 0
    assert stats["messages"] == fast["received"]
    want, got = _contents(tmp_path / "messages.duckdb"), _contents(tmp_path / "columns.duckdb")
    assert set(got) == set(want)
    for name in want:
        assert got[name] == want[name], name
    assert len(got["gpu"]) > 0 and len(got["dead_letters"]) == 3
    assert [r[1] for r in got["unknown_ids"]] == [UNKNOWN_ID]
    extras = got["extra_readings"]
    assert extras and {r[4] for r in extras} == {EXTRA}


@pytest.mark.slow
def test_replaying_twice_stores_once(clean_bundle: Path, tmp_path: Path) -> None:
    db = tmp_path / "twice.duckdb"
    first, _ = _cli(clean_bundle, db)
    before = _contents(db)
    second, _ = _cli(clean_bundle, db)
    assert second["ingest"]["duplicates"] == second["messages"] == first["messages"]
    assert second["ingest"]["stored_messages"] == 0
    after = _contents(db)
    for kind in KINDS:
        assert after[kind] == before[kind], kind


def test_progress_on_stderr_and_counts_on_stdout(clean_bundle: Path, tmp_path: Path) -> None:
    stats, err = _cli(clean_bundle, tmp_path / "p.duckdb")
    rows = sum(Bundle.load(clean_bundle).manifest.rows.values())
    assert stats["rows"] == rows
    lines = [ln for ln in err.splitlines() if ln.startswith("replay: ")]
    assert lines, err
    assert lines[-1].startswith(f"replay: {rows:,}/{rows:,} rows, recorded time ")
    assert lines[-1].endswith(" of 00:10:00")


def test_help_states_the_default_speed() -> None:
    res = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0
    assert "the default, 0, is as fast as possible" in " ".join(res.stdout.split())


def test_a_stopped_replay_keeps_what_it_stored(clean_bundle: Path, tmp_path: Path) -> None:
    import threading

    b = Bundle.load(clean_bundle)
    stop = threading.Event()
    with Store(tmp_path / "s.duckdb") as store:
        ing = Ingester(store, b.site, IngestLimits(max_future_s=0, max_past_s=0))

        def halt(rows: int, ts: datetime) -> None:
            stop.set()  # after the first chunk

        stats = replay_into(b, ing, stop=stop, chunk_s=60.0, on_progress=halt)
        n = store.con.execute("SELECT count(*) FROM gpu").fetchall()[0][0]
    assert 0 < stats["rows"] < sum(b.manifest.rows.values())
    assert n == stats["rows"] == ing.counters.samples["gpu"]


def _grid_reference(table: pa.Table, ids, q, scale, t0, dt, n):
    """Row by row in file order, a later sample of a cell winning: (n, ids) and each id's
    largest sample that lands on the grid."""
    want = np.full((n, len(ids)), np.nan, np.float32)
    top = np.full(len(ids), np.nan)
    pos = {s: i for i, s in enumerate(ids)}
    start_us = int(t0.timestamp() * 1e6)
    ts = table.column("ts").cast(pa.int64()).to_pylist()
    for s, at, v in zip(
        table.column("id").to_pylist(), ts, table.column(q).to_pylist(), strict=True
    ):
        row = round((at - start_us) / (dt * 1e6))
        if s in pos and 0 <= row < n:
            x = np.float32(np.nan if v is None else v * scale)
            want[row, pos[s]] = x
            top[pos[s]] = np.fmax(top[pos[s]], x)
    return want, top


@pytest.mark.parametrize("regular", [True, False])
def test_the_what_if_grid_equals_a_row_by_row_placement(tmp_path: Path, regular: bool) -> None:
    """``grid`` writes runs of consecutive steps as slices and anything else by index: either
    way each cell holds the file's last sample of it, a sample before the start, after the end
    or of an id off the grid is dropped, a null is NaN, and ``per_id_max`` is each id's
    largest sample on the grid. Regular: whole-grid runs of neighbouring ids (one block),
    one clipped at both ends. Irregular: gaps, repeated and off-step timestamps, nulls."""
    from twin.replay.bundle import Manifest
    from twin.replay.recording import grid

    rng = np.random.default_rng(7 if regular else 8)
    t0, dt, n = datetime(2026, 1, 1, tzinfo=UTC), 10.0, 300
    start_us = int(t0.timestamp() * 1e6)
    rows_id, rows_ts = [], []
    for name in ["a", "b", "c", "d", "e"]:
        if regular:
            steps = np.arange(-20, n + 20) if name == "e" else np.arange(n)  # e: past both ends
            at = start_us + steps * 10_000_000
        else:
            steps = np.sort(rng.choice(np.arange(-5, n + 5), size=n // 2))  # repeats, gaps
            at = start_us + steps * 10_000_000 + rng.integers(-4_000_000, 4_000_000, steps.size)
        rows_id += [name] * len(at)
        rows_ts += list(np.sort(at))
    k = len(rows_id)
    power = rng.integers(100, 700, k).astype(object)
    limit = rng.integers(300, 700, k).astype(object)
    if not regular:
        power[rng.choice(k, 30, replace=False)] = None
    table = pa.table(
        {
            "ts": pa.array(rows_ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "id": pa.array(rows_id).dictionary_encode(),
            "power_w": pa.array(list(power), pa.int32()),
            "power_limit_w": pa.array(list(limit), pa.int32()),
        }
    )
    pq.write_table(table, tmp_path / "gpu.parquet", row_group_size=1000 if regular else 211)
    manifest = Manifest(
        site="t",
        start=t0,
        end=t0 + timedelta(seconds=n * dt),
        resolution_s=dt,
        rows={"gpu": k},
        resolutions={"gpu": {"power_w": 5.0, "power_limit_w": 1.0}},
        calibration_run=None,
        created_at=t0,
    )
    b = Bundle(tmp_path, manifest, load_site(SMALL_SITE), None)
    for ids in (["a", "b", "c", "e"], ["c", "a", "zz", "b"]):  # neighbours; an order of its own
        g = grid(b, "gpu", ids, ["power_w", "temp_c"], t0, dt, n, per_id_max=("power_limit_w",))
        want, _ = _grid_reference(table, ids, "power_w", 5.0, t0, dt, n)
        _, top = _grid_reference(table, ids, "power_limit_w", 1.0, t0, dt, n)
        np.testing.assert_array_equal(g["power_w"], want)
        assert np.isnan(g["temp_c"]).all() and g["temp_c"].shape == (n, len(ids))
        np.testing.assert_array_equal(g["power_limit_w"], top)
        assert np.isfinite(want).sum() > (0.9 * n * 3 if regular else 0.25 * n * 3)


def test_the_what_if_grid_places_each_sample_on_its_step_and_leaves_the_rest_nan() -> None:
    """``twin.replay.recording.grid``: a window that starts inside the recording, ids in an
    order of its own and one the bundle lacks: each sample on its row and column, the rest NaN."""
    from twin.replay.recording import grid

    b = Bundle.load(Path(__file__).resolve().parents[1] / "sample_telemetry" / "demo_bundle")
    m = b.manifest
    dt = m.resolution_s
    t0 = m.start + timedelta(hours=3)
    n = 40
    first = pq.ParquetFile(b.path / "gpu.parquet").read_row_group(0, columns=["id"])
    some = sorted(set(pc.unique(first.column("id")).to_pylist()))[:3][::-1]
    ids = [*some, "no-such-gpu"]
    t = pq.read_table(
        b.path / "gpu.parquet", columns=["ts", "id", "power_w"], filters=[("id", "in", some)]
    )
    g = grid(b, "gpu", ids, ["power_w", "temp_c"], t0, dt, n)
    assert g["power_w"].shape == (n, 4) and g["power_w"].dtype == np.float32
    scale = m.resolutions["gpu"]["power_w"]
    want = np.full((n, 4), np.nan, dtype=np.float32)
    start_us = int(t0.timestamp() * 1e6)
    ts = t.column("ts").to_numpy().astype("datetime64[us]").astype(np.int64)
    row = np.rint((ts - start_us) / (dt * 1e6)).astype(np.int64)
    sid = np.array(t.column("id").to_pylist())
    v = t.column("power_w").to_numpy(zero_copy_only=False)
    for j, name in enumerate(ids):
        at = (sid == name) & (row >= 0) & (row < n)
        vals = v[at] if scale is None else v[at] * scale
        want[row[at], j] = vals.astype(np.float32)
    np.testing.assert_array_equal(g["power_w"], want)
    assert np.isfinite(want[:, :3]).sum() > 0.9 * 3 * n  # the window is inside the recording
    assert np.isnan(g["power_w"][:, 3]).all() and np.isnan(g["temp_c"][:, 3]).all()
