"""load_window: dense (time x device) arrays from the store, checked against a plain pivot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from twin.store import Store
from twin.store.schema import arrow_schema
from twin.store.windows import load_window

from .helpers import samples_table


def test_streamed_read_matches_a_pivot_with_gaps_nulls_and_a_subset_of_ids(tmp_path) -> None:
    # 400 GPUs x 600 s = 240,000 rows: more than one record batch of the streamed read
    rng = np.random.default_rng(0)
    n_ids, n_t = 400, 600
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ids = [f"n{i // 8}:{i % 8}" for i in range(n_ids)]
    ts = np.repeat(np.arange(n_t), n_ids)
    who = np.tile(np.arange(n_ids), n_t)
    keep = ~((who == 7) & (ts >= 100) & (ts < 200))  # a gap for one GPU
    power = rng.uniform(50, 700, ts.size)
    temp = rng.uniform(30, 80, ts.size)
    temp_null = rng.random(ts.size) < 0.01  # NULL readings
    cols = {
        "ts": [t0 + timedelta(seconds=int(s)) for s in ts[keep]],
        "source": [ids[w].split(":")[0] for w in who[keep]],
        "id": [ids[w] for w in who[keep]],
    }
    schema = arrow_schema("gpu")
    for f in schema:
        if f.name in cols:
            continue
        if f.name == "power_w":
            cols[f.name] = power[keep].tolist()
        elif f.name == "temp_c":
            cols[f.name] = [
                None if z else v for v, z in zip(temp[keep], temp_null[keep], strict=True)
            ]
        else:
            cols[f.name] = [None] * int(keep.sum())
    with Store(tmp_path / "w.duckdb") as store:
        store.insert_arrow("gpu", pa.table(cols, schema=schema))
        subset = [*ids[::3], "not-there:0"]
        w = load_window(
            store,
            "gpu",
            t0,
            t0 + timedelta(seconds=n_t),
            ids=subset,
            quantities=["power_w", "temp_c"],
        )
    assert w.ids == subset and w.values["power_w"].shape == (n_t, len(subset))
    exp_p = np.full((n_t, n_ids), np.nan)
    exp_t = np.full((n_t, n_ids), np.nan)
    exp_p[ts[keep], who[keep]] = power[keep]
    exp_t[ts[keep], who[keep]] = np.where(temp_null[keep], np.nan, temp[keep])
    cols_idx = list(range(0, n_ids, 3))
    np.testing.assert_array_equal(w.values["power_w"][:, :-1], exp_p[:, cols_idx])
    np.testing.assert_array_equal(w.values["temp_c"][:, :-1], exp_t[:, cols_idx])
    assert np.isnan(w.values["power_w"][:, -1]).all()  # an id with no data: all NaN


def test_column_helpers_fill_and_pick_per_device() -> None:
    from twin.store.windows import first_valid, hold_fill, last_valid

    nan = np.nan
    a = np.array([[nan, 1.0, nan], [2.0, nan, nan], [nan, 3.0, nan], [4.0, nan, nan]])
    np.testing.assert_array_equal(first_valid(a), [2.0, 1.0, nan])
    np.testing.assert_array_equal(last_valid(a), [4.0, 3.0, nan])
    forward = hold_fill(a)
    np.testing.assert_array_equal(forward[:, 0], [nan, 2.0, 2.0, 4.0])
    np.testing.assert_array_equal(forward[:, 1], [1.0, 1.0, 3.0, 3.0])
    assert np.isnan(forward[:, 2]).all()  # a device with no reading stays unknown
    both = hold_fill(a, backfill=True)
    np.testing.assert_array_equal(both[:, 0], [2.0, 2.0, 2.0, 4.0])
    assert np.isnan(a[0, 0])  # the input is not changed


def test_load_max_is_the_largest_reading_per_id(tmp_path) -> None:
    from twin.store.windows import load_max

    with Store(tmp_path / "m.duckdb") as store:
        t0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
        rows = [(t0 + timedelta(seconds=k), "n1", f"n1:{g}", 700.0 - 100 * (k == 3) * g)
                for k in range(5) for g in range(2)]  # fmt: skip
        rows.append((t0 + timedelta(seconds=9), "n1", "n1:0", 900.0))  # after the window
        store.con.executemany(
            "INSERT INTO gpu (ts, source, id, power_limit_w) VALUES (?, ?, ?, ?)", rows
        )
        end = t0 + timedelta(seconds=5)
        got = load_max(store, "gpu", t0, end, "power_limit_w", ["n1:1", "n1:0", "n9:0"])
    assert got[:2].tolist() == [700.0, 700.0] and np.isnan(got[2])
    with pytest.raises(ValueError, match="no quantity"):
        load_max(store, "gpu", t0, end, "bogus", ["n1:0"])


def test_many_ids_whose_hashes_share_lookup_slots_land_in_their_own_columns(tmp_path) -> None:
    # 40,000 ids: the lookup table (2^22 slots) has ids sharing a slot, resolved by search;
    # a collision-free table would have needed ~2^31 slots (16 GiB)
    n_ids, n_t = 40_000, 3
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ids = [f"n{i // 8}:{i % 8}" for i in range(n_ids)]
    value = np.arange(n_t * n_ids, dtype=float)  # every reading tells where it belongs
    schema = arrow_schema("gpu")
    id_arr = pa.array(ids * n_t, pa.string())
    cols = {
        "ts": pa.array(
            np.repeat(
                np.arange(n_t, dtype=np.int64) * 1_000_000 + int(t0.timestamp() * 1e6), n_ids
            ),
            pa.timestamp("us", tz="UTC"),
        ),
        "source": id_arr,
        "id": id_arr,
    }
    for f in schema:
        if f.name not in cols:
            cols[f.name] = pa.array(value) if f.name == "power_w" else pa.nulls(value.size, f.type)
    with Store(tmp_path / "many.duckdb") as store:
        store.insert_arrow("gpu", pa.table(cols, schema=schema))
        hashes = store.con.sql(
            "SELECT hash(id) FROM (SELECT unnest($1) AS id)", params=[ids]
        ).fetchnumpy()
        w = load_window(
            store, "gpu", t0, t0 + timedelta(seconds=n_t), ids=ids[::-1], quantities=["power_w"]
        )
    low = next(iter(hashes.values())).astype(np.uint64) & np.uint64((1 << 22) - 1)
    assert len(np.unique(low)) < n_ids  # the case under test: shared slots exist
    np.testing.assert_array_equal(w.values["power_w"], value.reshape(n_t, n_ids)[:, ::-1])


def _gpu_rows(ids: list[str], times: list[datetime]) -> pa.Table:
    schema = arrow_schema("gpu")
    n = len(ids)
    cols: dict[str, list] = {"ts": times, "source": [i.split(":")[0] for i in ids], "id": ids}
    for f in schema:
        if f.name not in cols:
            cols[f.name] = [100.0] * n if f.name == "power_w" else [None] * n
    return pa.table(cols, schema=schema)


def test_the_step_is_the_median_interval_of_each_devices_timestamps(tmp_path) -> None:
    from twin.store.windows import infer_step_s

    rng = np.random.default_rng(1)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ids, times = [], []
    for dev, step, jitter in (("a:0", 10.0, 0.3), ("a:1", 10.0, 0.3), ("b:0", 0.27, 0.0)):
        t = np.arange(0, 3600, step) + rng.uniform(-jitter, jitter, int(np.ceil(3600 / step)))
        keep = ~((t > 600) & (t < 1800))  # a 20-minute outage: a gap, not a slower step
        for s in t[keep]:
            ids.append(dev)
            times.append(t0 + timedelta(seconds=float(s)))
    with Store(tmp_path / "s.duckdb") as store:
        store.insert_arrow("gpu", _gpu_rows(ids, times))
        end = t0 + timedelta(hours=1)
        assert infer_step_s(store, "gpu", t0, end, ["a:0", "a:1"]) == pytest.approx(10.0, abs=0.1)
        assert infer_step_s(store, "gpu", t0, end, ["b:0"]) == pytest.approx(0.27)
        assert infer_step_s(store, "gpu", t0, end, ["nobody:0"]) is None
        # the 10 s data on its own grid: one sample per step, the outage its only gap
        w = load_window(
            store, "gpu", t0 - timedelta(seconds=5), end - timedelta(seconds=5),
            step_s=10.0, ids=["a:0"], quantities=["power_w"],
        )  # fmt: skip
        missing = np.isnan(w.values["power_w"][:, 0]).mean()
        assert missing == pytest.approx(1200 / 3600, abs=0.01)


def test_mean_intervals_tell_two_exporters_apart_in_one_query(tmp_path) -> None:
    from twin.store.windows import mean_intervals_s

    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ids, times = [], []
    for dev, step in (("fast:0", 1.0), ("slow:0", 10.0), ("once:0", 3600.0)):
        for s in np.arange(0, 600, step):
            ids.append(dev)
            times.append(t0 + timedelta(seconds=float(s)))
    with Store(tmp_path / "s.duckdb") as store:
        store.insert_arrow("gpu", _gpu_rows(ids, times))
        got = mean_intervals_s(
            store, "gpu", t0, t0 + timedelta(hours=1), ["slow:0", "fast:0", "once:0", "none:0"]
        )
    np.testing.assert_allclose(got[:2], [10.0, 1.0])
    assert np.isnan(got[2:]).all()  # one sample, or none: no interval


def test_the_sort_median_is_numpys_nanmedian_on_columns_and_rolling_windows() -> None:
    from models.nanstats import nanmedian

    rng = np.random.default_rng(2)
    for n_t, n, dtype in ((720, 300, np.float32), (3601, 40, np.float64), (4, 5, np.float32)):
        a = rng.standard_normal((n_t, n)).astype(dtype)
        a[rng.random((n_t, n)) < 0.2] = np.nan
        a[:, 0] = np.nan  # an all-NaN column
        with pytest.warns(RuntimeWarning):
            want = np.nanmedian(a, axis=0)
        got = nanmedian(a, axis=0)
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, want)
    # the forecast's rolling median: (rows, series, window) along the window, short all-NaN
    # windows included (an entity's gap)
    r = rng.standard_normal((500, 7))
    r[rng.random(r.shape) < 0.3] = np.nan
    r[100:130, 3] = np.nan
    win = np.lib.stride_tricks.sliding_window_view(r, 12, axis=0)
    with pytest.warns(RuntimeWarning):
        want = np.nanmedian(win, axis=2)
    np.testing.assert_array_equal(nanmedian(win, axis=2), want)


def test_group_sums_are_the_sums_of_each_ids_step_means_across_rollup_and_chunks(
    tmp_path,
) -> None:
    """load_group_sums against pandas: per-id means of each 5-min step (samples every 20 s,
    one id silent for 40 min, 5 % NULL readings, one id never reporting), summed per group; the
    first hours read from the 1-minute rollup and the rest raw, in chunks of 3 steps that
    straddle the rollup's watermark."""
    import pandas as pd

    from twin.store.windows import load_group_sums

    rng = np.random.default_rng(3)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ids = [f"n{i}" for i in range(7)]  # n6 never reports
    groups = np.array([0, 0, 1, 2, 2, 2, 1])
    n_t = 6 * 180  # 6 h at 20 s
    rows = []
    for k in range(n_t):
        for i in range(6):
            if i == 4 and 300 <= k < 420:  # silent from 1:40 to 2:20
                continue
            # NULL readings on both sides of the watermark: a minute of the rollup weighs by
            # its readings of the quantity, not by its rows (2 of 3 where one is NULL)
            v = float(rng.uniform(500, 900)) if rng.random() > 0.05 else None
            rows.append((t0 + timedelta(seconds=20 * k), ids[i], v))
    df = pd.DataFrame(rows, columns=["ts", "id", "power_w"])
    table = samples_table("node", df["ts"].tolist(), df["id"].tolist(), power_w=df["power_w"])
    with Store(tmp_path / "g.duckdb") as store:
        store.insert_arrow("node", table)
        store.rollup(until=t0 + timedelta(hours=2, minutes=7))  # watermark 2:07, mid-step
        got = load_group_sums(
            store, "node", "power_w", ids, groups, 3, t0, t0 + timedelta(hours=6), 300.0,
            max_cells=3 * len(ids),
        )  # fmt: skip
    df["step"] = ((df["ts"] - t0).dt.total_seconds() // 300).astype(int)
    means = df.dropna().groupby(["step", "id"])["power_w"].mean().reset_index()
    means["grp"] = means["id"].map(dict(zip(ids, groups, strict=True)))
    want_sum = np.zeros((72, 3))
    want_n = np.zeros((72, 3), np.int64)
    for (step, grp), g in means.groupby(["step", "grp"]):
        want_sum[step, grp] = g["power_w"].sum()
        want_n[step, grp] = len(g)
    np.testing.assert_allclose(got.sum, want_sum, rtol=1e-12)
    np.testing.assert_array_equal(got.count, want_n)
    assert got.reported.tolist() == [True] * 6 + [False]
    assert (got.count[20:28, 2] == 2).all()  # n4's silent steps: two of group 2's three


def test_group_sums_are_the_same_to_the_bit_on_every_read(tmp_path) -> None:
    """DuckDB sums a group's members in parallel, in whatever order its threads finish; the
    read orders each group's members, so a forecast made twice from the same store is the
    same forecast (1.2 M rows: several row groups, 24 members a group, values of very
    different sizes, whose sum depends on its order)."""
    from twin.store.windows import load_group_sums

    rng = np.random.default_rng(5)
    n_ids, n_t = 240, 5000
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ids = [f"n{i}" for i in range(n_ids)]
    ts_us = int(t0.timestamp() * 1e6) + np.arange(n_t) * 10_000_000
    w = 10.0 ** rng.uniform(-3, 6, (n_t, n_ids))
    table = samples_table(
        "node", np.repeat(ts_us, n_ids), np.tile(ids, n_t).tolist(), power_w=w.reshape(-1)
    )
    groups = np.arange(n_ids) % 10
    with Store(tmp_path / "d.duckdb") as store:
        store.insert_arrow("node", table)
        end = t0 + timedelta(seconds=10 * n_t)
        reads = [
            load_group_sums(store, "node", "power_w", ids, groups, 10, t0, end, 60.0).sum
            for _ in range(4)
        ]
    assert all(np.array_equal(reads[0], r) for r in reads[1:])


def test_a_store_from_before_the_rollups_counted_each_quantity_still_reads(tmp_path) -> None:
    """A store whose 1-minute rollup has no per-quantity counts (made before them): opened
    read-only its minutes are weighted by their rows, as they were; opened to write, the counts'
    columns are added (NULL for the old minutes, weighted by rows) and new minutes get them."""
    from twin.store.schema import quantity_columns
    from twin.store.windows import load_group_sums

    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ts = [t0 + timedelta(seconds=20 * k) for k in range(90)]  # 30 min, no NULLs
    power = np.linspace(500.0, 900.0, len(ts))
    db = tmp_path / "old.duckdb"
    with Store(db) as store:
        store.insert_arrow("node", samples_table("node", ts, ["n0"] * len(ts), power_w=power))
        store.rollup(until=t0 + timedelta(minutes=20))
        for res in ("1m", "1h"):  # as a store made before the counts
            for c in quantity_columns("node"):
                store.con.execute(f"ALTER TABLE node_{res} DROP COLUMN {c}_n")
    want = power.reshape(6, 15).mean(axis=1)  # 5-min steps: 15 samples each

    def read(store: Store) -> np.ndarray:
        end = t0 + timedelta(minutes=30)
        sums = load_group_sums(store, "node", "power_w", ["n0"], np.array([0]), 1, t0, end, 300.0)
        return sums.sum[:, 0]

    with Store(db, read_only=True) as store:
        np.testing.assert_allclose(read(store), want, rtol=1e-12)
    with Store(db) as store:
        store.rollup(until=t0 + timedelta(minutes=30))
        np.testing.assert_allclose(read(store), want, rtol=1e-12)
        counts = store.con.execute("SELECT power_w_n FROM node_1m ORDER BY bucket").fetchall()
    assert [c for (c,) in counts] == [None] * 20 + [3] * 10
