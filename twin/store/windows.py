"""Read windows of telemetry from the store onto a time grid: the one store reader of DESIGN.md
"One data plane" (calibration, headroom, hot spots, fleets, forecasts and the drain detector
all read through it; :func:`grid_step_sql` is the one gridding expression).

The fitters in ``models`` and the chain take arrays shaped (T, N): time along axis 0, one
column per device, NaN where a device reported nothing in a step. :func:`load_window` does the
one query per kind that builds them from raw samples: DuckDB hashes the ids, numpy maps the
hashes to columns, so no string is handled per sample in Python, and the result is scattered
into the arrays one record batch at a time. The aggregate reads (per-minute means with the
first and last values a slope needs, means over the 1-minute rollup, per-fleet activity)
return one row per device (or group) and step. :class:`WindowReader` shares the windows of one
pass between its stages; :func:`count_reads` counts the reads (tests).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from collectors.contract import QUANTITIES
from twin.store.store import Store


def grid_step_sql(ts: str, start: str, step_us: str) -> str:
    """The gridding expression, written once for every gridded read: the index of the step
    of ``step_us`` microseconds, counted from ``start``, that the timestamp ``ts`` falls in
    (``ts``, ``start`` and ``step_us`` are SQL expressions: a column and two parameters)."""
    return f"(epoch_us({ts}) - epoch_us({start}::TIMESTAMPTZ)) // {step_us}"


@dataclass(frozen=True)
class Window:
    """Telemetry of one kind on a regular time grid."""

    kind: str
    start: datetime
    step_s: float
    ids: list[str]
    values: dict[str, np.ndarray]  # quantity -> (T, N) float64, NaN where missing

    @property
    def n_steps(self) -> int:
        return next(iter(self.values.values())).shape[0] if self.values else 0

    def column(self, quantity: str, sample_id: str) -> np.ndarray:
        return self.values[quantity][:, self.ids.index(sample_id)]

    def select(self, ids: list[str]) -> Window:
        """The same window restricted to (and ordered as) ``ids``; unknown ids are all NaN."""
        pos = {sid: i for i, sid in enumerate(self.ids)}
        idx = np.array([pos.get(s, -1) for s in ids], dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        for q, arr in self.values.items():
            if not self.ids:  # no device of the kind reported: every column is unknown
                out[q] = np.full((arr.shape[0], len(ids)), np.nan)
                continue
            sel = arr[:, np.maximum(idx, 0)] if len(ids) else arr[:, :0]
            if (idx < 0).any():
                sel = sel.copy()
                sel[:, idx < 0] = np.nan
            out[q] = sel
        return Window(self.kind, self.start, self.step_s, list(ids), out)


def load_max(
    store: Store, kind: str, start: datetime, end: datetime, quantity: str, ids: list[str]
) -> np.ndarray:
    """Largest reading of ``quantity`` per id of ``ids`` in [start, end), NaN where an id has
    none: one aggregate query, for a per-device setting such as the enforced power limit that
    a dense (T, N) array would only be reduced again."""
    if kind not in QUANTITIES:
        raise ValueError(f"unknown kind {kind!r}")
    if quantity not in QUANTITIES[kind]:
        raise ValueError(f"{kind} has no quantity {quantity!r}")
    _count(kind, [quantity], start, end, 0.0)
    rows = store.con.execute(
        f"SELECT id, max({quantity}) FROM {kind} WHERE ts >= ? AND ts < ? GROUP BY id",
        [start, end],
    ).fetchall()
    best = {sid: v for sid, v in rows if v is not None}
    return np.array([best.get(sid, np.nan) for sid in ids], dtype=float)


#: The sampling steps calibration accepts: finer data (e.g. a 0.02 s NVML poll) is put on a
#: 0.1 s grid, a step above a minute resolves no GPU thermal transient (time constants of
#: tens of seconds, docs/physics.md §2.3). [s]
MIN_STEP_S = 0.1
MAX_STEP_S = 60.0
#: How many ids per kind the step is inferred from (the median interval of their timestamps):
#: enough to outvote a device that reports slower, few enough that the window query is cheap.
STEP_SAMPLE_IDS = 64


def infer_step_s(
    store: Store, kind: str, start: datetime, end: datetime, ids: list[str] | None = None
) -> float | None:
    """The sampling step of ``kind`` in [start, end): the median interval between consecutive
    timestamps of one device, over up to :data:`STEP_SAMPLE_IDS` of ``ids`` (default: the
    first ids seen), rounded to the millisecond. None when no device has two samples.

    The median is the step the data was taken at, not the mean: gaps (a collector down for
    a minute) leave it alone and are counted as gaps against it.
    """
    if kind not in QUANTITIES:
        raise ValueError(f"unknown kind {kind!r}")
    con = store.con
    if ids is None:
        ids = [
            r[0]
            for r in con.execute(
                f"SELECT DISTINCT id FROM {kind} WHERE ts >= ? AND ts < ? LIMIT ?",
                [start, end, STEP_SAMPLE_IDS],
            ).fetchall()
        ]
    ids = list(ids)[:STEP_SAMPLE_IDS]
    if not ids:
        return None
    row = con.execute(
        "SELECT median(d) FROM (SELECT epoch_us(ts) - lag(epoch_us(ts)) OVER"
        f" (PARTITION BY id ORDER BY ts) AS d FROM {kind}"
        " WHERE ts >= ? AND ts < ? AND id IN (SELECT unnest(?))) WHERE d > 0",
        [start, end, ids],
    ).fetchall()
    med_us = row[0][0] if row else None
    if med_us is None:
        return None
    return round(float(med_us) / 1e3) / 1e3


def mean_intervals_s(
    store: Store, kind: str, start: datetime, end: datetime, ids: list[str]
) -> np.ndarray:
    """Per id of ``ids``, the mean interval between its samples in [start, end): the span
    from its first to its last timestamp over one less than its count of samples (a count of
    distinct timestamps costs 20x more); NaN for an id with fewer than two. One aggregate
    query (no sort: 0.15 s for 7.2 M rows, bench/README.md), to tell
    devices scraped at different rates apart (two exporters); gaps lengthen the mean, so the
    step itself is then the median interval (:func:`infer_step_s`) of each rate's devices."""
    if kind not in QUANTITIES:
        raise ValueError(f"unknown kind {kind!r}")
    out = np.full(len(ids), np.nan)
    if not ids:
        return out
    rows = store.con.execute(
        "SELECT id, (epoch_us(max(ts)) - epoch_us(min(ts))) / (count(*) - 1)"
        f" FROM {kind} WHERE ts >= ? AND ts < ? GROUP BY id HAVING count(*) > 1",
        [start, end],
    ).fetchall()
    pos = {sid: i for i, sid in enumerate(ids)}
    for sid, mean_us in rows:
        i = pos.get(sid)
        if i is not None:
            out[i] = float(mean_us) / 1e6
    return out


def load_window(
    store: Store,
    kind: str,
    start: datetime,
    end: datetime,
    *,
    quantities: list[str] | None = None,
    step_s: float = 1.0,
    ids: list[str] | None = None,
) -> Window:
    """Samples of ``kind`` in [start, end) on a ``step_s`` grid (one sample per device and step;
    when a device reported twice within a step, either reading may be kept).

    ``ids`` fixes the columns (default: every id seen in the window, sorted).
    """
    if kind not in QUANTITIES:
        raise ValueError(f"unknown kind {kind!r}")
    cols = quantities or list(QUANTITIES[kind])
    for c in cols:
        if c not in QUANTITIES[kind]:
            raise ValueError(f"{kind} has no quantity {c!r}")
    con = store.con
    if ids is None:
        ids = [
            r[0]
            for r in con.execute(
                f"SELECT DISTINCT id FROM {kind} WHERE ts >= ? AND ts < ? ORDER BY id",
                [start, end],
            ).fetchall()
        ]
    step_us = round(step_s * 1e6)
    n_steps = max(0, int(np.ceil((end - start).total_seconds() / step_s)))
    values = {c: np.full((n_steps, len(ids)), np.nan) for c in cols}
    if not ids or not n_steps:
        return Window(kind, start, step_s, list(ids), values)
    _count(kind, cols, start, end, step_s)
    # No join and no string per sample in Python: DuckDB hashes each id, numpy maps the hashes
    # of the wanted ids to columns, and NULLs arrive as NaN. The result is streamed in record
    # batches (DuckDB's row groups, ~120 k rows) and scattered into the arrays batch by batch,
    # so no full-size Arrow table or concatenated column is ever made: at 36 M rows those
    # copies cost more than the query (fresh memory is slow to fault in).
    known = con.sql("SELECT hash(id) AS h, id FROM (SELECT unnest($1) AS id)", params=[ids])
    hash_of = dict((i, h) for h, i in known.fetchall())
    n_ids = len(ids)
    wanted = np.array([hash_of[i] for i in ids], dtype=np.uint64)
    if len(np.unique(wanted)) != n_ids:
        raise ValueError(f"64-bit hash collision among the {n_ids} {kind} ids")
    # a direct lookup table indexed by the low bits of the hash: one gather per sample instead
    # of a search. It is sized at ~64 slots per id (at most 2^24 slots, 64 MiB), so some wanted
    # ids share a slot (about n^2 / 2^(bits+1) pairs: none at 1,000 ids, ~300 at 100,000); such
    # a slot holds AMBIGUOUS and its samples are resolved by a binary search in the sorted
    # hashes. Empty slots hold n_ids (no column). (A collision-free table would need about
    # n^2 slots: 2^34 at 100,000 ids.)
    bits = min(24, max(10, int(np.ceil(np.log2(n_ids * 64)))))
    mask = np.uint64((1 << bits) - 1)
    slot = (wanted & mask).astype(np.int64)
    lut = np.full(1 << bits, n_ids, dtype=np.int64)
    lut[slot] = np.arange(n_ids)
    ambiguous = n_ids + 1
    shared = np.bincount(slot, minlength=1 << bits)[slot] > 1
    lut[slot[shared]] = ambiguous
    order = np.argsort(wanted)
    sorted_hashes = wanted[order]
    wanted_at = np.append(wanted, np.uint64(0))  # the hash a column holds; index n_ids: none
    query = con.sql(
        f"SELECT hash(id) AS h, {grid_step_sql('ts', '$1', '$2')} AS step, "
        + ", ".join(f"coalesce({c}::DOUBLE, 'NaN'::DOUBLE) AS {c}" for c in cols)
        + f" FROM {kind} WHERE ts >= $1 AND ts < $3",
        params=[start, step_us, end],
    )
    flat_values = [values[c].reshape(-1) for c in cols]
    with query.to_arrow_reader() as reader:  # holds the connection until it is read out
        for batch in reader:
            h = batch.column(0).to_numpy(zero_copy_only=False)
            col = lut[(h & mask).astype(np.int64)]
            amb = np.flatnonzero(col == ambiguous)
            if amb.size:
                pos = np.minimum(np.searchsorted(sorted_hashes, h[amb]), n_ids - 1)
                col[amb] = np.where(sorted_hashes[pos] == h[amb], order[pos], n_ids)
            step = batch.column(1).to_numpy(zero_copy_only=False)
            # a slot holds one wanted id, but other ids land on it too; steps are in range by the
            # WHERE clause, checked anyway (as unsigned, so negative ones fail as well)
            ok = (col < n_ids) & (wanted_at[col] == h) & (step.view(np.uint64) < n_steps)
            if ok.all():
                flat, sel = step * n_ids + col, slice(None)
            else:
                flat, sel = step[ok] * n_ids + col[ok], ok
            for i, dest in enumerate(flat_values):
                dest[flat] = batch.column(i + 2).to_numpy(zero_copy_only=False)[sel]
    return Window(kind, start, step_s, list(ids), values)


class WindowReader:
    """The windows one pass reads, each quantity of each window read from the store once:
    headroom and hot spots read the same last minute of GPU and node telemetry, so the pass
    hands them one reader and the second asks the store only for what the first did not read
    (the arrays are shared: callers must not write into them).

    :meth:`load` takes :func:`load_window`'s arguments; a window is the same when its kind,
    start, end, step and ``ids`` are."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._read: dict[tuple, Window] = {}

    def load(
        self,
        kind: str,
        start: datetime,
        end: datetime,
        *,
        quantities: list[str] | None = None,
        step_s: float = 1.0,
        ids: list[str] | None = None,
    ) -> Window:
        if kind not in QUANTITIES:
            raise ValueError(f"unknown kind {kind!r}")
        cols = quantities or list(QUANTITIES[kind])
        key = (kind, start, end, step_s, None if ids is None else tuple(ids))
        have = self._read.get(key)
        missing = [c for c in cols if have is None or c not in have.values]
        if missing:
            got = load_window(
                self.store,
                kind,
                start,
                end,
                quantities=missing,
                step_s=step_s,
                ids=ids if have is None else have.ids,
            )
            have = got if have is None else replace(have, values={**have.values, **got.values})
            self._read[key] = have
        assert have is not None
        return Window(kind, start, step_s, list(have.ids), {c: have.values[c] for c in cols})

    def minute_means(
        self, kind: str, ids: list[str], start: datetime, n_min: int, quantities: list[str]
    ) -> Window:
        """Each quantity's mean per id of ``ids`` and minute of ``[start, start + n_min min)``
        (:func:`load_minute_stats`, no slope) as a window at a 60 s step: minute ``k`` holds
        the samples of ``[start + k min, start + (k + 1) min)``, so a window that ends at the
        newest second has the live "now" minute as its last row, as a replay's minute means
        (``twin.chain.breach.minute_means``) have theirs."""
        key = ("minute-means", kind, start, n_min, tuple(ids))
        have = self._read.get(key)
        missing = [q for q in quantities if have is None or q not in have.values]
        if missing:
            m = load_minute_stats(self.store, kind, ids, start, n_min, missing, with_slope=False)
            values = {**(have.values if have is not None else {}), **m.means}
            have = Window(kind, start, 60.0, list(ids), values)
            self._read[key] = have
        assert have is not None
        return Window(kind, start, 60.0, list(ids), {q: have.values[q] for q in quantities})


def grid_end(
    store: Store,
    kind: str,
    ids: list[str],
    step_s: float,
    window_s: float,
    newest: datetime | None = None,
) -> datetime:
    """The end of the ``step_s`` grid for the devices ``ids`` of ``kind`` (which have samples):
    after their newest sample, half a step past the usual phase of their timestamps, so that
    samples that jitter by up to half a step about their nominal times land one per step. The
    phase is the median, over up to :data:`STEP_SAMPLE_IDS` of ``ids``, of each timestamp's
    offset from the newest modulo the step (centred on 0); without jitter the end is the
    newest sample plus half a step. ``newest``: their newest sample, when known."""
    if kind not in QUANTITIES:
        raise ValueError(f"unknown kind {kind!r}")
    if newest is None:
        newest = store.con.execute(
            f"SELECT max(ts) FROM {kind} WHERE id IN (SELECT unnest(?))", [ids]
        ).fetchall()[0][0]
    step_us = max(1, round(step_s * 1e6))
    row = store.con.execute(
        "SELECT median(((epoch_us($1::TIMESTAMPTZ) - epoch_us(ts) + $2 // 2) % $2) - $2 // 2)"
        f" FROM {kind} WHERE ts > $1::TIMESTAMPTZ - to_microseconds($3) AND ts <= $1"
        " AND id IN (SELECT unnest($4))",
        [newest, step_us, round(window_s * 1e6), ids[:STEP_SAMPLE_IDS]],
    ).fetchall()
    lag_us = float(row[0][0] or 0.0)
    return newest + timedelta(microseconds=round(step_us / 2 - lag_us))


@dataclass(frozen=True)
class MinuteStats:
    """Per device and minute of a window, ``(n_min, N)``: the mean of each quantity (NaN where
    none) and the first quantity's slope from the minute's first to its last sample [unit/s]
    (0 where under two samples)."""

    start: datetime
    ids: list[str]
    means: dict[str, np.ndarray]
    slope: np.ndarray


def load_minute_stats(
    store: Store,
    kind: str,
    ids: list[str],
    start: datetime,
    n_min: int,
    quantities: list[str],
    *,
    with_slope: bool = True,
) -> MinuteStats:
    """Per id of ``ids`` and minute of ``[start, start + n_min min)``: the mean of each of
    ``quantities`` and the slope of the first of them (the first and last values a slope
    needs), over the samples where the first is not null, aggregated in DuckDB (one row per
    device and minute comes back, not one per sample). ``with_slope=False``: each quantity's mean
    over its own samples, no slope (zeros), a cheaper query."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind not in QUANTITIES:
        raise ValueError(f"unknown kind {kind!r}")
    for q in quantities:
        if q not in QUANTITIES[kind]:
            raise ValueError(f"{kind} has no quantity {q!r}")
    end = start + timedelta(minutes=n_min)
    _count(kind, quantities, start, end, 60.0)
    lead = quantities[0]
    means = ", ".join(f"avg({q}) AS m{i}" for i, q in enumerate(quantities))
    first_last = (
        f", arg_min({lead}, ts) AS v0, arg_max({lead}, ts) AS v1,"
        " (epoch_us(max(ts)) - epoch_us(min(ts))) / 1e6 AS span"
    )
    tab = store.con.sql(
        f"SELECT id, {grid_step_sql('ts', '$1', '60000000')} AS m, {means}"
        + (first_last if with_slope else "")
        + f" FROM {kind} WHERE ts >= $1 AND ts < $2"
        + (f" AND {lead} IS NOT NULL" if with_slope else "")
        + " GROUP BY ALL",
        params=[start, end],
    ).to_arrow_table()
    shape = (n_min, len(ids))
    out = {q: np.full(shape, np.nan) for q in quantities}
    slope = np.zeros(shape)
    if tab.num_rows == 0:
        return MinuteStats(start, list(ids), out, slope)
    col = pc.index_in(tab.column("id"), value_set=pa.array(ids)).to_numpy(zero_copy_only=False)
    col = np.nan_to_num(np.asarray(col, dtype=float), nan=-1).astype(np.int64)
    row = tab.column("m").to_numpy().astype(np.int64)
    ok = (col >= 0) & (row >= 0) & (row < n_min)
    r, c = row[ok], col[ok]

    def get(name: str) -> np.ndarray:
        return tab.column(name).to_numpy(zero_copy_only=False).astype(float)[ok]

    for i, q in enumerate(quantities):
        out[q][r, c] = get(f"m{i}")
    if not with_slope:
        return MinuteStats(start, list(ids), out, slope)
    span = get("span")
    with np.errstate(all="ignore"):
        sl = np.where(span > 0, (get("v1") - get("v0")) / span, 0.0)
    slope[r, c] = np.where(np.isfinite(sl), sl, 0.0)
    return MinuteStats(start, list(ids), out, slope)


#: Grid cells (ids x steps) one query of :func:`load_group_sums` aggregates: the node-power
#: history of 12,500 nodes over 14 days at 5 min is 50 million per-node means, which one query
#: held as a hash table and a result of 6.7 GB; chunks of this many bound both (the ordered
#: sums buffer their chunk's rows: 12,500 nodes read in 27.5 s and 1.2 GB peak with chunks of
#: 0.5 M cells, 30.6 s and 2.2 GB with 4 M). [1]
GROUP_SUM_CELLS = 500_000


@dataclass(frozen=True)
class GroupSums:
    """Per group and step of a grid: the sum of the members' step means (``sum``, ``(T, G)``,
    0 where none) and how many members had one (``count``); ``reported[i]``: whether id ``i``
    had a reading anywhere in the window."""

    sum: np.ndarray
    count: np.ndarray
    reported: np.ndarray


def load_group_sums(
    store: Store,
    kind: str,
    quantity: str,
    ids: list[str],
    groups: np.ndarray,
    n_groups: int,
    start: datetime,
    end: datetime,
    step_s: float,
    *,
    max_cells: int = GROUP_SUM_CELLS,
) -> GroupSums:
    """Each id's mean ``quantity`` of ``kind`` per step of ``[start, end)``, summed over the ids
    of each group (``groups[i]`` in ``[0, n_groups)``: the group of ``ids[i]``) in DuckDB, so no
    (T, ids) array is built. A step of whole minutes reads the complete 1-minute rollup
    (``<kind>_1m``, each minute's mean weighted by its readings of ``quantity``) up to its
    watermark and raw samples after it. The
    window is read in chunks of at most ``max_cells`` (ids x steps) per-id means."""
    if kind not in QUANTITIES:
        raise ValueError(f"unknown kind {kind!r}")
    if quantity not in QUANTITIES[kind]:
        raise ValueError(f"{kind} has no quantity {quantity!r}")
    groups = np.asarray(groups, dtype=np.int64)
    bad = len(groups) and not 0 <= groups.min() <= groups.max() < n_groups
    if len(groups) != len(ids) or bad:
        raise ValueError(f"groups: one index in [0, {n_groups}) per id ({len(ids)} ids)")
    n_steps = max(0, int(np.ceil((end - start).total_seconds() / step_s)))
    out = GroupSums(
        np.zeros((n_steps, n_groups)), np.zeros((n_steps, n_groups), np.int64),
        np.zeros(len(ids), bool),
    )  # fmt: skip
    if not n_steps or not ids:
        return out
    _count(kind, [quantity], start, end, step_s)
    con = store.con
    split = start  # raw samples from here on; the complete 1-minute rollup before it
    if step_s >= 60 and step_s % 60 == 0:
        rows = con.execute(
            "SELECT done_until FROM rollup_watermarks WHERE kind = ? AND resolution = '1m'",
            [kind],
        ).fetchall()
        if rows and rows[0][0] is not None:
            split = min(max(rows[0][0], start), end)
    # a minute's weight: its readings of the quantity (its rows in a store opened read-only
    # from before the rollups counted each quantity, where the column is missing)
    has_n = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE table_name = ? AND column_name = ?",
        [f"{kind}_1m", f"{quantity}_n"],
    ).fetchall()[0][0]
    weight = f"coalesce(r.{quantity}_n, r.n)" if has_n else "r.n"
    # per-id step means, then their sum per (step, group), and (a grouping set of its own)
    # the ids that had any; the steps count from ``start`` in every chunk. Every sum of
    # doubles is ordered (by time, then value; by id): DuckDB's threads would otherwise add
    # them in the order they finish, and a read would differ from the last in its last digit
    sql = (
        "WITH m AS (SELECT unnest($1::VARCHAR[]) AS id, unnest($2::BIGINT[]) AS grp,"
        " unnest(range(len($1::VARCHAR[]))) AS col),"
        " parts AS ("
        f" SELECT {grid_step_sql('r.bucket', '$3', '$4')} AS step, r.id,"
        f"   sum(r.{quantity}_avg * {weight} ORDER BY r.bucket) AS s, sum({weight}) AS c"
        f" FROM {kind}_1m r WHERE r.bucket >= $5 AND r.bucket < $6"
        f"   AND r.{quantity}_avg IS NOT NULL"
        " GROUP BY ALL"
        " UNION ALL"
        f" SELECT {grid_step_sql('x.ts', '$3', '$4')} AS step, x.id,"
        f"   sum(x.{quantity} ORDER BY x.ts, x.{quantity}) AS s, count(x.{quantity}) AS c"
        f" FROM {kind} x WHERE x.ts >= $7 AND x.ts < $8 GROUP BY ALL),"
        " means AS (SELECT step, id, sum(s) / sum(c) AS v FROM parts GROUP BY ALL"
        "   HAVING sum(c) > 0)"
        " SELECT means.step, m.grp, m.col, sum(means.v ORDER BY m.col) AS v, count(*) AS k"
        " FROM means JOIN m USING (id) GROUP BY GROUPING SETS ((means.step, m.grp), (m.col))"
    )
    step_us = round(step_s * 1e6)
    chunk = max(1, max_cells // len(ids))
    for lo in range(0, n_steps, chunk):
        hi = min(n_steps, lo + chunk)
        t_lo = start + timedelta(microseconds=lo * step_us)
        t_hi = min(end, start + timedelta(microseconds=hi * step_us))
        rollup_span = [t_lo, min(t_hi, max(split, t_lo))]
        raw_span = [max(t_lo, split), t_hi]
        params = [list(ids), groups.tolist(), start, step_us, *rollup_span, *raw_span]
        res = con.sql(sql, params=params).to_arrow_table()
        col = res.column("col").to_numpy(zero_copy_only=False)
        by_id = ~np.isnan(np.asarray(col, dtype=float))  # the (col) grouping set's rows
        out.reported[np.asarray(col[by_id], dtype=np.int64)] = True
        step = np.asarray(res.column("step").to_numpy(zero_copy_only=False)[~by_id], np.int64)
        grp = np.asarray(res.column("grp").to_numpy(zero_copy_only=False)[~by_id], np.int64)
        val = np.asarray(res.column("v").to_numpy(zero_copy_only=False)[~by_id], float)
        cnt = np.asarray(res.column("k").to_numpy(zero_copy_only=False)[~by_id], np.int64)
        ok = (step >= lo) & (step < hi)
        out.sum[step[ok], grp[ok]] = val[ok]
        out.count[step[ok], grp[ok]] = cnt[ok]
    return out


#: The GPU activity a fleet's figures use: SM activity, else utilization as a fraction.
_ACTIVITY_SQL = "coalesce(x.sm_active, x.util_pct / 100.0)"


def load_group_activity(
    store: Store,
    ids: list[str],
    groups: list[str],
    start: datetime,
    end: datetime,
    step_s: float,
    keep: list[tuple[datetime, datetime]] | None = None,
) -> list[tuple[str, int, float | None]]:
    """Mean GPU activity (SM activity, else utilization / 100) per group and step of
    ``[start, end)`` over the GPUs ``ids`` (``groups[i]``: the group of ``ids[i]``), as
    ``(group, step, mean)`` rows; with ``keep``, only the samples within one of those
    ``[lo, hi)`` ranges are read."""
    _count("gpu", ["sm_active", "util_pct"], start, end, step_s)
    params: list[Any] = [ids, groups, start, end, round(step_s * 1e6)]
    where = ""
    if keep:
        ors = []
        for lo, hi in keep:
            ors.append(f"(x.ts >= ${len(params) + 1} AND x.ts < ${len(params) + 2})")
            params += [lo, hi]
        where = " AND (" + " OR ".join(ors) + ")"
    rows = store.con.execute(
        "WITH m AS (SELECT unnest($1::VARCHAR[]) AS id, unnest($2::VARCHAR[]) AS grp)"
        f" SELECT m.grp, {grid_step_sql('x.ts', '$3', '$5')} AS b, avg({_ACTIVITY_SQL})"
        " FROM gpu x JOIN m USING (id)"
        f" WHERE x.ts >= $3 AND x.ts < $4{where}"
        " GROUP BY ALL",
        params,
    ).fetchall()
    return [(g, int(b), v) for g, b, v in rows]


def load_fleet_activity_stats(
    store: Store,
    ids: list[str],
    fleets: list[str],
    start: datetime,
    end: datetime,
    step_s: float,
    coverage_bucket_s: float,
) -> dict[str, tuple]:
    """Per fleet of the GPUs ``ids`` (``fleets[i]``: the fleet of ``ids[i]``), over the fleet's
    mean activity per ``step_s`` step of ``[start, end)``: (steps, mean, p50, p95 activity,
    GPUs reporting, sm_active and util_pct sample counts, span of the samples in s,
    ``coverage_bucket_s`` buckets with data)."""
    _count("gpu", ["sm_active", "util_pct"], start, end, step_s)
    rows = store.con.execute(
        "WITH m AS (SELECT unnest($1::VARCHAR[]) AS id, unnest($2::VARCHAR[]) AS fleet),"
        " g AS (SELECT m.fleet, x.id,"
        f"   {grid_step_sql('x.ts', '$3', '$5')} AS b,"
        f"   avg({_ACTIVITY_SQL}) AS a,"
        "   count(x.sm_active) AS n_sm,"
        "   count(x.util_pct) FILTER (WHERE x.sm_active IS NULL) AS n_util,"
        "   min(x.ts) AS t0, max(x.ts) AS t1"
        "   FROM gpu x JOIN m USING (id) WHERE x.ts >= $3 AND x.ts < $4 GROUP BY ALL),"
        " f AS (SELECT fleet, b, avg(a) AS a FROM g WHERE a IS NOT NULL GROUP BY ALL)"
        " SELECT f.fleet, count(*), avg(f.a), quantile_cont(f.a, 0.5), quantile_cont(f.a, 0.95),"
        "   (SELECT count(DISTINCT id) FROM g WHERE g.fleet = f.fleet AND g.a IS NOT NULL),"
        "   (SELECT sum(n_sm) FROM g WHERE g.fleet = f.fleet),"
        "   (SELECT sum(n_util) FROM g WHERE g.fleet = f.fleet),"
        "   (SELECT epoch(max(t1)) - epoch(min(t0)) FROM g WHERE g.fleet = f.fleet),"
        "   (SELECT count(DISTINCT (g.b * $5) // $6) FROM g WHERE g.fleet = f.fleet)"
        " FROM f GROUP BY f.fleet",
        [ids, fleets, start, end, round(step_s * 1e6), round(coverage_bucket_s * 1e6)],
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def load_fleet_power_stats(
    store: Store,
    ids: list[str],
    fleets: list[str],
    nodes: list[str],
    start: datetime,
    end: datetime,
) -> dict[str, tuple]:
    """Per fleet of the GPUs ``ids`` (``fleets[i]``, ``nodes[i]``: the fleet and node of
    ``ids[i]``) over ``[start, end)``: (mean board power per GPU, node input power beyond its
    GPUs' boards per GPU, over the nodes that reported) [W]."""
    _count("gpu", ["power_w"], start, end, 0.0)
    _count("node", ["power_w"], start, end, 0.0)
    rows = store.con.execute(
        "WITH m AS (SELECT unnest($1::VARCHAR[]) AS id, unnest($2::VARCHAR[]) AS fleet,"
        "   unnest($3::VARCHAR[]) AS node),"
        " gp AS (SELECT m.fleet, m.node, x.id, avg(x.power_w) AS p FROM gpu x JOIN m USING (id)"
        "   WHERE x.ts >= $4 AND x.ts < $5 GROUP BY ALL),"
        " np AS (SELECT id AS node, avg(power_w) AS p FROM node"
        "   WHERE ts >= $4 AND ts < $5 AND id IN (SELECT DISTINCT node FROM m) GROUP BY ALL),"
        " per_node AS (SELECT gp.fleet, gp.node, sum(gp.p) AS gpu_w, count(gp.p) AS n,"
        "   any_value(np.p) AS node_w FROM gp LEFT JOIN np USING (node) GROUP BY ALL)"
        " SELECT fleet, sum(gpu_w) / sum(n), sum(node_w - gpu_w) FILTER (WHERE node_w IS NOT NULL)"
        "   / sum(n) FILTER (WHERE node_w IS NOT NULL) FROM per_node GROUP BY fleet",
        [ids, fleets, nodes, start, end],
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


# ---- counting the reads (tests) ----------------------------------------------------------------

_counters: list[Counter] = []


def _count(
    kind: str, quantities: Iterable[str], start: datetime, end: datetime, step_s: float
) -> None:
    """Record one read of each of ``quantities`` over [start, end) for :func:`count_reads`."""
    if _counters:
        for q in quantities:
            for c in _counters:
                c[(kind, q, start, end, step_s)] += 1


@contextmanager
def count_reads() -> Iterator[Counter]:
    """Count the window reads made inside the block, per ``(kind, quantity, start, end,
    step_s)`` (``step_s`` 0: an aggregate over the whole window): how a test tells that a pass
    reads each quantity's window once."""
    counter: Counter = Counter()
    _counters.append(counter)
    try:
        yield counter
    finally:
        _counters.remove(counter)


# ---- per-column helpers on (time x device) arrays ----------------------------------------------


def first_valid(a: np.ndarray) -> np.ndarray:
    """Per column, the first non-NaN value (NaN if none)."""
    ok = ~np.isnan(a)
    out = a[np.argmax(ok, axis=0), np.arange(a.shape[1])]
    out[~ok.any(axis=0)] = np.nan
    return out


def last_valid(a: np.ndarray) -> np.ndarray:
    """Per column, the last non-NaN value (NaN if none)."""
    ok = ~np.isnan(a)
    out = a[a.shape[0] - 1 - np.argmax(ok[::-1], axis=0), np.arange(a.shape[1])]
    out[~ok.any(axis=0)] = np.nan
    return out


def hold_fill(a: np.ndarray, *, backfill: bool = False) -> np.ndarray:
    """Carry the last valid value forward along time (a reading missing for a step); with
    ``backfill``, leading NaNs take the first valid value. All-NaN columns stay NaN."""
    ok = ~np.isnan(a)
    if ok.all():
        return a.copy()
    idx = np.where(ok, np.arange(a.shape[0])[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    out = np.take_along_axis(a, idx, axis=0)
    if backfill:
        first = np.argmax(ok, axis=0)
        head = np.arange(a.shape[0])[:, None] < first[None, :]
        out = np.where(head, a[first, np.arange(a.shape[1])][None, :], out)
    return out
