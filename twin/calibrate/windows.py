"""Read windows of telemetry from the store as dense (time x device) numpy arrays.

The fitters in ``models`` take arrays shaped (T, N): time along axis 0, one column per device,
NaN where a device reported nothing in a step. This module does the one query per kind that
builds them: the rows come back as Arrow and ids map to column indices with Arrow's C++ lookup,
so no string is handled per sample in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
    # No join and no string work in Python: fetch Arrow, map ids to columns with a C++ lookup.
    table = con.sql(
        "SELECT id, (epoch_us(ts) - epoch_us($1::TIMESTAMPTZ)) // $2 AS step, "
        + ", ".join(cols)
        + f" FROM {kind} WHERE ts >= $1 AND ts < $3",
        params=[start, step_us, end],
    ).to_arrow_table()
    col = pc.index_in(table.column("id"), value_set=pa.array(ids, pa.string()))
    keep = pc.is_valid(col)
    if not pc.all(keep).as_py():
        table = table.filter(keep)
        col = col.filter(keep)
    step = table.column("step").to_numpy()
    col_np = col.to_numpy(zero_copy_only=False).astype(np.int64)
    ok = (step >= 0) & (step < n_steps)
    step, col_np = step[ok], col_np[ok]
    for c in cols:
        arr = pc.fill_null(pc.cast(table.column(c), pa.float64()), np.nan)
        values[c][step, col_np] = arr.to_numpy()[ok]
    return Window(kind, start, step_s, list(ids), values)
