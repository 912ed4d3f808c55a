"""Read windows of telemetry from the store as dense (time x device) numpy arrays.

The fitters in ``models`` take arrays shaped (T, N): time along axis 0, one column per device,
NaN where a device reported nothing in a step. This module does the one query per kind that
builds them: DuckDB hashes the ids, numpy maps the hashes to columns, so no string is handled
per sample in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from collectors.contract import QUANTITIES
from twin.store import Store


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
            sel = arr[:, np.maximum(idx, 0)] if len(ids) else arr[:, :0]
            if (idx < 0).any():
                sel = sel.copy()
                sel[:, idx < 0] = np.nan
            out[q] = sel
        return Window(self.kind, self.start, self.step_s, list(ids), out)


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
    # of the wanted ids to columns (searchsorted), and NULLs arrive as NaN.
    known = con.sql("SELECT hash(id) AS h, id FROM (SELECT unnest($1) AS id)", params=[ids])
    hash_of = dict((i, h) for h, i in known.fetchall())
    wanted = np.array([hash_of[i] for i in ids], dtype=np.uint64)
    if len(np.unique(wanted)) != len(wanted):
        raise ValueError(f"64-bit hash collision among the {len(ids)} {kind} ids")
    # a direct lookup table indexed by the low bits of the hash, sized so that no two wanted
    # ids share a slot: one gather per sample instead of a search
    bits = max(10, int(np.ceil(np.log2(len(ids) * 64))))
    while len(np.unique(wanted & np.uint64((1 << bits) - 1))) != len(wanted):
        bits += 1
    mask = np.uint64((1 << bits) - 1)
    lut = np.full(1 << bits, -1, dtype=np.int64)
    lut[(wanted & mask).astype(np.int64)] = np.arange(len(ids))
    res = con.sql(
        "SELECT hash(id) AS h, (epoch_us(ts) - epoch_us($1::TIMESTAMPTZ)) // $2 AS step, "
        + ", ".join(f"coalesce({c}::DOUBLE, 'NaN'::DOUBLE) AS {c}" for c in cols)
        + f" FROM {kind} WHERE ts >= $1 AND ts < $3",
        params=[start, step_us, end],
    ).to_arrow_table()
    h = res.column("h").to_numpy()
    col = lut[(h & mask).astype(np.int64)]
    step = res.column("step").to_numpy()
    ok = (col >= 0) & (step >= 0) & (step < n_steps)
    ok[ok] = wanted[col[ok]] == h[ok]  # a slot holds one wanted id; others land here too
    if ok.all():
        flat = step * len(ids) + col
        sel = slice(None)
    else:
        flat = step[ok] * len(ids) + col[ok]
        sel = ok
    for c in cols:
        values[c].reshape(-1)[flat] = res.column(c).to_numpy()[sel]
    return Window(kind, start, step_s, list(ids), values)
