"""Read windows of telemetry from the store as dense (time x device) numpy arrays.

The fitters in ``models`` take arrays shaped (T, N): time along axis 0, one column per device,
NaN where a device reported nothing in a step. This module does the one query per kind that
builds them: DuckDB hashes the ids, numpy maps the hashes to columns, so no string is handled
per sample in Python, and the result is scattered into the arrays one record batch at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from collectors.contract import QUANTITIES
from twin.store.store import Store


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
        "SELECT hash(id) AS h, (epoch_us(ts) - epoch_us($1::TIMESTAMPTZ)) // $2 AS step, "
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
