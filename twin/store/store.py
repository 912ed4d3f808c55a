"""The DuckDB store: batched writes, status, rollups, retention and Parquet export.

One process owns the file (DuckDB allows one writer process). Every write is one transaction
of Arrow batches; no value from a message is ever pasted into SQL.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collectors.contract import KINDS
from twin.store.calibration import CalibrationTables
from twin.store.schema import (
    DEAD_SCHEMA,
    EXTRA_SCHEMA,
    HISTORY_DDL,
    LOG_SCHEMA,
    META,
    ROLLUPS,
    UNKNOWN_SCHEMA,
    arrow_schema,
    ddl,
    quantity_columns,
)

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """The store could not be opened or written."""


#: DuckDB errors that say the store (disk, memory, lock, a lost database), not the data, is at
#: fault: the write is retried later, and nothing is dead-lettered for it.
_TRANSIENT = (
    duckdb.IOException,
    duckdb.OutOfMemoryException,
    duckdb.TransactionException,
    duckdb.InterruptException,
    duckdb.FatalException,
    duckdb.InternalException,
    duckdb.ConnectionException,
    OSError,
    MemoryError,
)


def is_transient(exc: BaseException) -> bool:
    """True when a failed write should be retried rather than blamed on the data."""
    return isinstance(exc, _TRANSIENT)


#: Defaults of :meth:`Store.prune` (``dctwin serve`` runs it with every rollup).
DEAD_LETTER_MAX_AGE_DAYS = 7.0
DEAD_LETTER_MAX_ROWS = 100_000
UNKNOWN_ID_MAX_AGE_DAYS = 30.0
UNKNOWN_ID_MAX_ROWS = 100_000
#: How many unknown ids :meth:`Store.status` lists (the most recently seen; the total is given).
STATUS_UNKNOWN_LIMIT = 100


@dataclass
class Batch:
    """Rows for one transaction, column-wise: ``samples[kind][column] -> list``.

    Timestamp columns hold integer microseconds since the Unix epoch (UTC).
    """

    samples: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    extras: dict[str, list[Any]] = field(
        default_factory=lambda: {n: [] for n in EXTRA_SCHEMA.names}
    )
    log: dict[str, list[Any]] = field(default_factory=lambda: {n: [] for n in LOG_SCHEMA.names})
    dead: dict[str, list[Any]] = field(default_factory=lambda: {n: [] for n in DEAD_SCHEMA.names})
    unknown: dict[str, list[Any]] = field(
        default_factory=lambda: {n: [] for n in UNKNOWN_SCHEMA.names}
    )

    def kind_columns(self, kind: str) -> dict[str, list[Any]]:
        cols = self.samples.get(kind)
        if cols is None:
            cols = self.samples[kind] = {n: [] for n in arrow_schema(kind).names}
        return cols

    def sample_count(self) -> dict[str, int]:
        return {k: len(c["id"]) for k, c in self.samples.items()}

    def empty(self) -> bool:
        return not (
            any(len(c["id"]) for c in self.samples.values())
            or self.log["seq"]
            or self.dead["topic"]
            or self.extras["id"]
            or self.unknown["id"]
        )


def _iso(ts: datetime | None) -> str | None:
    return ts.astimezone(UTC).isoformat() if ts is not None else None


class Store(CalibrationTables):
    """A dctwin DuckDB file. Use as a context manager, or call ``close()``.

    The calibration tables are read and written through the methods of
    :class:`twin.store.calibration.CalibrationTables`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        memory_limit_mb: int | None = None,
        threads: int | None = None,
    ):
        """``memory_limit_mb``: DuckDB's buffer pool cap for this process (None: DuckDB's
        default, 80 % of the machine's RAM, which several services on one machine would each
        take); ``threads``: DuckDB's worker threads (None: one per core)."""
        self.path = str(path)
        try:
            if read_only and self.path != ":memory:" and not Path(self.path).exists():
                raise StoreError(f"no store at {self.path}")
            self.con = duckdb.connect(self.path, read_only=read_only)
        except duckdb.IOException as e:
            if "lock" in str(e).lower():
                raise StoreError(
                    f"{self.path} is open by another process (DuckDB allows one; is `dctwin serve`"
                    f" running on it?): {e}"
                ) from e
            raise StoreError(f"cannot open store {self.path}: {e}") from e
        self.con.execute("SET TimeZone = 'UTC'")
        try:
            self._settings(memory_limit_mb, threads)
        except BaseException:  # a refused setting leaves no open file behind
            self.con.close()
            raise
        if not read_only:
            for stmt in ddl():
                self.con.execute(stmt)
            for k, v in META.items():
                self.con.execute(
                    "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?",
                    [k, v, v],
                )

    def _settings(self, memory_limit_mb: int | None, threads: int | None) -> None:
        # integers checked here, never text from a message: SET takes no parameters
        if memory_limit_mb is not None:
            if not isinstance(memory_limit_mb, int) or memory_limit_mb < 64:
                raise StoreError(f"memory limit {memory_limit_mb!r} MB: expected 64 or more")
            self.con.execute(f"SET memory_limit = '{memory_limit_mb}MB'")
        if threads is not None:
            if not isinstance(threads, int) or threads < 1:
                raise StoreError(f"threads {threads!r}: expected 1 or more")
            self.con.execute(f"SET threads = {threads}")

    def settings(self) -> dict[str, str]:
        """DuckDB's memory limit and thread count as it reports them (e.g. '1.4 GiB', '2')."""
        rows = self.con.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('memory_limit', 'threads')"
        ).fetchall()
        return {str(k): str(v) for k, v in rows}

    def cursor(self) -> Store:
        """Another connection to the same open database, for a second thread of this process
        (DuckDB runs its transactions concurrently; a second process could not open the file)."""
        other = Store.__new__(Store)
        other.path = self.path
        other.con = self.con.cursor()
        other.con.execute("SET TimeZone = 'UTC'")
        return other

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes --------------------------------------------------------------------------

    def write(self, batch: Batch) -> None:
        """Insert one batch in one transaction; all of it lands or none of it does."""
        if batch.empty():
            return
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            for kind, cols in batch.samples.items():
                if len(cols["id"]):
                    self._insert(kind, pa.table(cols, schema=arrow_schema(kind)))
            if batch.extras["id"]:
                self._insert("extra_readings", pa.table(batch.extras, schema=EXTRA_SCHEMA))
            if batch.log["seq"]:
                self._insert("ingest_log", pa.table(batch.log, schema=LOG_SCHEMA))
            if batch.dead["topic"]:
                self._insert("dead_letters", pa.table(batch.dead, schema=DEAD_SCHEMA))
            if batch.unknown["id"]:
                con.register("_unknown_batch", pa.table(batch.unknown, schema=UNKNOWN_SCHEMA))
                con.execute(
                    "INSERT INTO unknown_ids"
                    " SELECT kind, id, source, first_seen, last_seen, samples FROM _unknown_batch"
                    " ON CONFLICT (kind, id) DO UPDATE SET"
                    " last_seen = greatest(unknown_ids.last_seen, excluded.last_seen),"
                    " first_seen = least(unknown_ids.first_seen, excluded.first_seen),"
                    " samples = unknown_ids.samples + excluded.samples, source = excluded.source"
                )
                con.unregister("_unknown_batch")
            con.execute("COMMIT")
        except Exception:
            # the original error, not one from cleaning up after it, is what the caller sees
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            for name in ("_batch", "_unknown_batch"):
                with contextlib.suppress(duckdb.Error, KeyError):
                    con.unregister(name)
            raise

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append an Arrow table whose columns match ``table``'s, in order."""
        known = {r[0] for r in self.con.execute("SHOW TABLES").fetchall()}
        if table not in known:
            raise StoreError(f"no table {table!r} in the store")
        self._insert(table, data)

    def _insert(self, table: str, data: pa.Table) -> None:
        self.con.register("_batch", data)
        self.con.execute(f"INSERT INTO {table} SELECT * FROM _batch")  # table: a schema name
        self.con.unregister("_batch")  # on an error, write() rolls back and unregisters

    # ---- reads ---------------------------------------------------------------------------

    def recent_message_keys(self, window: timedelta = timedelta(minutes=15)) -> list[tuple]:
        """(kind, source, seq, ts) of messages received in the ``window`` before the newest."""
        return self.con.execute(
            "SELECT kind, source, seq, ts FROM ingest_log WHERE received_at >="
            " (SELECT max(received_at) FROM ingest_log) - ?",
            [window],
        ).fetchall()

    def message_high_water(self) -> list[tuple[str, str, int, int]]:
        """(kind, source, highest seq, latest ts [us since the epoch]) of every stream in the
        ingest log: a message past either mark has not been stored (twin/ingest dedup)."""
        return self.con.execute(
            "SELECT kind, source, max(seq), epoch_us(max(ts)) FROM ingest_log GROUP BY kind, source"
        ).fetchall()

    def stored_messages(self, kind: str, keys: pa.Table) -> list[int]:
        """Which of ``keys`` (columns i, source, seq, ts: one candidate message of ``kind``
        each) the ingest log holds: their ``i``. One join, narrowed to the keys' time span."""
        lo, hi = pc.min_max(keys.column("ts")).values()
        self.con.register("_probe", keys)
        try:
            rows = self.con.execute(
                "SELECT DISTINCT p.i FROM _probe p JOIN ingest_log l ON l.source = p.source"
                " AND l.seq = p.seq AND l.ts = p.ts WHERE l.kind = ? AND l.ts BETWEEN ? AND ?",
                [kind, lo.as_py(), hi.as_py()],
            ).fetchall()
        finally:
            self.con.unregister("_probe")
        return [r[0] for r in rows]

    def sample_counts(self) -> dict[str, int]:
        return {k: self.con.execute(f"SELECT count(*) FROM {k}").fetchall()[0][0] for k in KINDS}

    def latest_readings(
        self, kind: str, quantity: str, start: datetime, end: datetime
    ) -> dict[str, float]:
        """id -> the newest non-null ``quantity`` of ``kind`` in ``(start, end]``: what a
        breached-now check reads (one row per device comes back, not one per sample)."""
        if kind not in KINDS or quantity not in quantity_columns(kind):
            raise ValueError(f"{kind} has no quantity {quantity!r}")
        rows = self.con.execute(
            f'SELECT id, arg_max("{quantity}", ts) FROM {kind} WHERE ts > ? AND ts <= ?'
            f' AND "{quantity}" IS NOT NULL GROUP BY id',
            [start, end],
        ).fetchall()
        return {i: float(v) for i, v in rows}

    def status(self, unknown_limit: int = STATUS_UNKNOWN_LIMIT) -> dict[str, Any]:
        """What the store holds: samples per kind, time range, dead letters, unknown ids (the
        ``unknown_limit`` most recently seen, and how many there are in all)."""
        con = self.con
        samples = self.sample_counts()
        ranges = {}
        for k in KINDS:
            lo, hi = con.execute(f"SELECT min(ts), max(ts) FROM {k}").fetchall()[0]
            if lo is not None:
                ranges[k] = {"start": _iso(lo), "end": _iso(hi)}
        starts = [r["start"] for r in ranges.values()]
        ends = [r["end"] for r in ranges.values()]
        readings = {}
        for k in KINDS:
            expr = " + ".join(f"count({c})" for c in quantity_columns(k))
            readings[k] = con.execute(f"SELECT {expr} FROM {k}").fetchall()[0][0]
        readings_extra = con.execute("SELECT count(*) FROM extra_readings").fetchall()[0][0]
        dead = dict(
            con.execute(
                "SELECT reason, count(*) FROM dead_letters GROUP BY reason ORDER BY reason"
            ).fetchall()
        )
        unknown = [
            {
                "kind": kind,
                "id": sid,
                "source": src,
                "first_seen": _iso(first),
                "last_seen": _iso(last),
                "samples": n,
            }
            for kind, sid, src, first, last, n in con.execute(
                "SELECT kind, id, source, first_seen, last_seen, samples FROM unknown_ids"
                " ORDER BY last_seen DESC, kind, id LIMIT ?",
                [max(0, int(unknown_limit))],
            ).fetchall()
        ]
        unknown_total = con.execute("SELECT count(*) FROM unknown_ids").fetchall()[0][0]
        messages, sources = con.execute(
            "SELECT count(*), count(DISTINCT source) FROM ingest_log"
        ).fetchall()[0]
        gaps = con.execute(
            "SELECT coalesce(sum(gap), 0) FROM (SELECT seq - lag(seq) OVER"
            " (PARTITION BY kind, source ORDER BY received_at, seq) - 1 AS gap FROM ingest_log)"
            " WHERE gap > 0"
        ).fetchall()[0][0]
        shard = con.execute("SELECT value FROM meta WHERE key = 'shard'").fetchall()
        return {
            "db": self.path,
            "shard": shard[0][0] if shard else None,
            "samples": samples,
            "readings": {**readings, "extra": readings_extra},
            "time_range": {"start": min(starts), "end": max(ends)} if starts else None,
            "time_range_by_kind": ranges,
            "messages": messages,
            "sources": sources,
            "seq_gaps": int(gaps),
            "dead_letters": dead,
            "unknown_ids": unknown,
            "unknown_ids_total": int(unknown_total),
        }

    # ---- maintenance ---------------------------------------------------------------------

    def rollup(self, until: datetime | None = None) -> dict[str, int]:
        """Aggregate complete buckets (avg, min, max per quantity) past each watermark.

        A bucket is complete once it ends before ``until`` (default: the newest sample of the
        kind). Samples that arrive later for an already rolled-up bucket stay in the raw table
        only. Returns rows written per rollup table.
        """
        written: dict[str, int] = {}
        for kind in KINDS:
            newest = self.con.execute(f"SELECT max(ts) FROM {kind}").fetchall()[0][0]
            if newest is None:
                continue
            limit = until or newest
            cols = quantity_columns(kind)
            aggs = ", ".join(f"avg({c}), min({c}), max({c})" for c in cols)
            counts = ", ".join(f"count({c})" for c in cols)
            named = ", ".join(
                ["bucket", "id", "n", *(f"{c}_{a}" for c in cols for a in ("avg", "min", "max"))]
                + [f"{c}_n" for c in cols]
            )
            for res, interval in ROLLUPS.items():
                table = f"{kind}_{res}"
                rows = self.con.execute(
                    "SELECT done_until FROM rollup_watermarks WHERE kind = ? AND resolution = ?",
                    [kind, res],
                ).fetchall()
                row = rows[0] if rows else None
                start = (
                    row[0]
                    if row
                    else self.con.execute(
                        f"SELECT time_bucket(INTERVAL '{interval}', min(ts)) FROM {kind}"
                    ).fetchall()[0][0]
                )
                end = self.con.execute(
                    f"SELECT time_bucket(INTERVAL '{interval}', ?::TIMESTAMPTZ)", [limit]
                ).fetchall()[0][0]
                if end <= start:
                    continue
                self.con.execute("BEGIN TRANSACTION")
                try:
                    n = self.con.execute(
                        f"INSERT INTO {table} ({named}) SELECT time_bucket(INTERVAL"
                        f" '{interval}', ts) AS b, id, count(*), {aggs}, {counts} FROM {kind}"
                        " WHERE ts >= ? AND ts < ? GROUP BY b, id",
                        [start, end],
                    ).fetchall()[0][0]
                    self.con.execute(
                        "INSERT INTO rollup_watermarks VALUES (?, ?, ?) ON CONFLICT"
                        " (kind, resolution) DO UPDATE SET done_until = excluded.done_until",
                        [kind, res, end],
                    )
                    self.con.execute("COMMIT")
                except Exception:
                    self.con.execute("ROLLBACK")
                    raise
                written[table] = written.get(table, 0) + int(n)
        return written

    def prune(
        self,
        now: datetime | None = None,
        *,
        dead_letter_max_age_days: float = DEAD_LETTER_MAX_AGE_DAYS,
        dead_letter_max_rows: int = DEAD_LETTER_MAX_ROWS,
        unknown_max_age_days: float = UNKNOWN_ID_MAX_AGE_DAYS,
        unknown_max_rows: int = UNKNOWN_ID_MAX_ROWS,
    ) -> dict[str, int]:
        """Delete dead letters and unknown ids older than their age, then the oldest past their
        count, so that neither grows without bound. Returns rows deleted per table."""
        now = now or datetime.now(UTC)
        con = self.con
        deleted = {}
        for table, col, age_days, max_rows in (
            ("dead_letters", "received_at", dead_letter_max_age_days, dead_letter_max_rows),
            ("unknown_ids", "last_seen", unknown_max_age_days, unknown_max_rows),
        ):
            n = con.execute(
                f"DELETE FROM {table} WHERE {col} < ?", [now - timedelta(days=age_days)]
            ).fetchall()[0][0]
            total = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
            if total > max_rows:
                cutoff = con.execute(
                    f"SELECT {col} FROM {table} ORDER BY {col} DESC LIMIT 1 OFFSET ?",
                    [int(max_rows)],
                ).fetchall()[0][0]
                n += con.execute(f"DELETE FROM {table} WHERE {col} <= ?", [cutoff]).fetchall()[0][0]
            deleted[table] = int(n)
        return deleted

    def recent_dead_letters(self, limit: int = 10_000) -> list[tuple[str, str]]:
        """(topic, sha256) of the most recent dead letters, to recognize a repeated one."""
        return self.con.execute(
            "SELECT topic, sha256 FROM dead_letters WHERE sha256 IS NOT NULL"
            " ORDER BY received_at DESC LIMIT ?",
            [limit],
        ).fetchall()

    def apply_retention(
        self, raw_days: float, now: datetime | None = None, *, exported_only: bool | None = None
    ) -> dict[str, int]:
        """Delete raw samples (and ingest-log rows) older than ``raw_days``; rollups stay.

        With ``exported_only`` (default: once the store has exported hours as Parquet, its
        ``history_exports`` table, twin/store/history.py), a kind's raw rows are deleted only in
        hours exported (to any destination)."""
        cutoff = (now or datetime.now(UTC)) - timedelta(days=raw_days)
        for stmt in HISTORY_DDL if exported_only else ():
            self.con.execute(stmt)
        exporting = exported_only
        if exporting is None:
            exporting = bool(
                self.con.execute(
                    "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'history_exports'"
                ).fetchone()[0]
            )
        deleted = {}
        for table in (*KINDS, "extra_readings"):
            if exporting and table in KINDS:
                sql = (
                    f"DELETE FROM {table} WHERE ts < ? AND date_trunc('hour', ts) IN"
                    " (SELECT hour FROM history_exports WHERE kind = ?)"
                )
                deleted[table] = self.con.execute(sql, [cutoff, table]).fetchall()[0][0]
                continue
            deleted[table] = self.con.execute(
                f"DELETE FROM {table} WHERE ts < ?", [cutoff]
            ).fetchall()[0][0]
        deleted["ingest_log"] = self.con.execute(
            "DELETE FROM ingest_log WHERE received_at < ?", [cutoff]
        ).fetchall()[0][0]
        return deleted

    def export_parquet(
        self, out_dir: str | Path, start: datetime, end: datetime, kinds: tuple[str, ...] = KINDS
    ) -> dict[str, int]:
        """Write raw samples in [start, end) to ``out_dir/kind=<kind>/day=<YYYY-MM-DD>/``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        exported: dict[str, int] = {}
        for kind in kinds:
            n = self.con.execute(
                f"SELECT count(*) FROM {kind} WHERE ts >= ? AND ts < ?", [start, end]
            ).fetchall()[0][0]
            if not n:
                continue
            target = str(out / f"kind={kind}").replace("'", "''")
            self.con.execute(
                f"COPY (SELECT *, strftime(ts, '%Y-%m-%d') AS day FROM {kind}"
                f" WHERE ts >= $1 AND ts < $2 ORDER BY ts, id) TO '{target}'"
                " (FORMAT PARQUET, PARTITION_BY (day), OVERWRITE_OR_IGNORE)",
                [start, end],
            )
            exported[kind] = int(n)
        return exported
