"""Small reads and writes of the store that are not windows on a grid (those are
:mod:`twin.store.windows`): the span of a kind's samples, the newest reading per device, the
store's meta rows, the stored headroom reports, a recording's rows and session settings.

Every SQL statement of the twin outside the API's query module lives in ``twin/store``
(DESIGN.md "One data plane"); the callers hand in names and values, never SQL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from collectors.contract import KINDS, QUANTITIES
from twin.store.schema import HEADROOM_SCHEMA
from twin.store.store import Store


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    return kind


def _quantity(kind: str, quantity: str) -> str:
    if quantity not in QUANTITIES[_kind(kind)]:
        raise ValueError(f"{kind} has no quantity {quantity!r}")
    return quantity


# ---- the span of the samples -------------------------------------------------------------------


def sample_span(
    store: Store, kind: str, since: datetime | None = None
) -> tuple[datetime | None, datetime | None]:
    """Oldest and newest timestamp of ``kind`` (at or after ``since`` when given); (None, None)
    when there is none."""
    sql = f"SELECT min(ts), max(ts) FROM {_kind(kind)}"
    if since is None:
        row = store.con.execute(sql).fetchall()[0]
    else:
        row = store.con.execute(sql + " WHERE ts >= ?", [since]).fetchall()[0]
    return row[0], row[1]


def newest_ts(store: Store, kind: str) -> datetime | None:
    """Timestamp of the newest sample of ``kind``; None when the store has none."""
    return store.con.execute(f"SELECT max(ts) FROM {_kind(kind)}").fetchall()[0][0]


def has_samples(store: Store, kind: str, after: datetime, until: datetime) -> bool:
    """True when ``kind`` has a sample in ``(after, until]``."""
    rows = store.con.execute(
        f"SELECT 1 FROM {_kind(kind)} WHERE ts > ? AND ts <= ? LIMIT 1", [after, until]
    ).fetchall()
    return bool(rows)


def newest_values(
    store: Store, kind: str, quantity: str, after: datetime, until: datetime
) -> dict[str, Any]:
    """Per id of ``kind``, its newest non-null ``quantity`` in ``(after, until]``."""
    q = _quantity(kind, quantity)
    rows = store.con.execute(
        f"SELECT id, arg_max({q}, ts) FROM {kind} WHERE ts > ? AND ts <= ? AND"
        f" {q} IS NOT NULL GROUP BY id",
        [after, until],
    ).fetchall()
    return dict(rows)


# ---- meta, settings ----------------------------------------------------------------------------


def meta_value(store: Store, key: str) -> str | None:
    """The store's ``meta`` value of ``key`` (None when unset)."""
    rows = store.con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchall()
    return rows[0][0] if rows else None


def set_meta_value(store: Store, key: str, value: str) -> None:
    """Write ``meta`` row ``key`` (it must not exist yet)."""
    store.con.execute("INSERT INTO meta VALUES (?, ?)", [key, value])


def set_memory_limit(store: Store, limit: str) -> None:
    """Bound DuckDB's memory on this connection (``limit`` such as ``"2GB"``)."""
    if not limit.replace(".", "").replace(" ", "").isalnum():
        raise ValueError(f"not a memory size: {limit!r}")
    store.con.execute(f"SET memory_limit = '{limit}'")


# ---- headroom reports --------------------------------------------------------------------------


def save_headroom(store: Store, report: Any, keep: int = 1440) -> int:
    """Store a headroom report (``twin.analysis.headroom.HeadroomReport``: one row per limit) and
    keep only the newest ``keep`` reports; returns the rows stored."""
    cols: dict[str, list[Any]] = {f.name: [] for f in HEADROOM_SCHEMA}
    for r in report.rows:
        cols["computed_at"].append(report.computed_at)
        cols["data_until"].append(report.data_until)
        d = r.model_dump()
        d["limit_value"] = d.pop("limit")
        for k in HEADROOM_SCHEMA.names[2:]:
            cols[k].append(d[k])
    table = pa.Table.from_pydict(cols, schema=HEADROOM_SCHEMA)
    with store.transaction():
        store.insert_arrow("headroom", table)
        prune_headroom(store, keep)
    return len(report.rows)


def prune_headroom(store: Store, keep: int) -> None:
    """Keep the newest ``keep`` headroom reports (by ``computed_at``)."""
    store.con.execute(
        "DELETE FROM headroom WHERE computed_at NOT IN (SELECT DISTINCT computed_at FROM"
        " headroom ORDER BY computed_at DESC LIMIT ?)",
        [keep],
    )


def latest_headroom_rows(store: Store) -> list[dict[str, Any]]:
    """The newest stored headroom report's rows, by kind, id and quantity."""
    res = store.con.sql(
        "SELECT * FROM headroom WHERE computed_at = (SELECT max(computed_at) FROM headroom)"
        " ORDER BY kind, id, quantity"
    )
    return res.to_arrow_table().to_pylist()


# ---- recordings --------------------------------------------------------------------------------


def read_rows(
    store: Store,
    kind: str,
    columns: Sequence[str],
    start: datetime,
    end: datetime,
    res_s: float,
    aggregate: dict[str, str] | None = None,
) -> pa.Table:
    """Rows of ``kind`` in [start, end) with ``ts, source, id`` and ``columns``, by id and time:
    the raw samples when ``res_s`` <= 0, else one row per id and ``res_s`` bucket (aligned on
    ``start``, its start as ``ts``), each column reduced by its ``aggregate`` function
    (``avg``, ``max`` or ``bit_or``; default ``avg``)."""
    cols = [_quantity(kind, c) for c in columns]
    if res_s <= 0:
        sql = (
            f"SELECT ts, source, id, {', '.join(cols)} FROM {kind} WHERE ts >= $1 AND ts < $2"
            " ORDER BY id, ts"
        )
        return store.con.sql(sql, params=[start, end]).to_arrow_table()
    aggs = []
    for c in cols:
        fn = (aggregate or {}).get(c, "avg")
        if fn not in {"avg", "max", "bit_or"}:
            raise ValueError(f"unknown aggregate {fn!r}")
        aggs.append(f"{fn}({c}) AS {c}")
    sql = (
        "SELECT time_bucket(to_microseconds(CAST($3 * 1e6 AS BIGINT)), ts, $1::TIMESTAMPTZ)"
        f" AS bucket, any_value(source) AS source, id, {', '.join(aggs)} FROM {kind}"
        " WHERE ts >= $1 AND ts < $2 GROUP BY bucket, id ORDER BY id, bucket"
    )
    t = store.con.sql(sql, params=[start, end, res_s]).to_arrow_table()
    return t.rename_columns(["ts", *t.column_names[1:]])


def bundle_rows(
    files: Sequence[Path], columns: Sequence[str], batch: int = 10_000
) -> Iterator[list[tuple]]:
    """The rows of a recording's Parquet ``files`` of one kind as ``(ts_us, source, id,
    *columns)``, by source, time and id, ``batch`` rows at a time (an in-memory DuckDB reads
    them; the store itself is not opened)."""
    for c in columns:
        if not c.isidentifier():
            raise ValueError(f"not a column name: {c!r}")
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        rel = con.execute(
            "SELECT epoch_us(ts) AS ts_us, source, id, "
            + ", ".join(columns)
            + " FROM read_parquet(?, hive_partitioning = false) ORDER BY source, ts, id",
            [[str(f) for f in files]],
        )
        while rows := rel.fetchmany(batch):
            yield rows
    finally:
        con.close()
