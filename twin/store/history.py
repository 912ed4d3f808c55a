"""History off the box: closed hours of raw samples as hive-partitioned Parquet.

Layout (docs/history.md): ``ROOT/kind=<kind>/day=YYYY-MM-DD/hour=HH/shard=<name>/part-0.parquet``,
one file per kind, hour and shard. An hour is *closed* when the newest sample of the store is past
the hour's end plus a grace period. A file is written whole to a temporary name and renamed (a
local directory) or uploaded under its final key (an object store, through pyarrow.fs), so
an hour is complete or absent; rows are ordered by ``ts, source, id`` and written with fixed
options, so exporting an hour again gives the same bytes. Exported hours are recorded in the
store's ``history_exports`` table; raw retention then deletes exported hours only.

:func:`query_series` reads the tree of every shard with DuckDB's ``read_parquet`` (hive
partitions, pruned by day and hour), without a store or a service.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.contract import KINDS, QUANTITIES
from twin.store.schema import HISTORY_DDL, arrow_schema

#: Default grace after an hour's end before it is exported: late samples within the ingest's
#: accepted lateness land first (5 min, the brief's choice; ``--grace-s`` changes it).
DEFAULT_GRACE_S = 300.0
DEFAULT_SHARD = "main"
PART_NAME = "part-0.parquet"
_SHARD_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: Fixed writer options: no timestamps or random ids go into a file, so equal rows give equal
#: bytes with the same pyarrow version.
_WRITE_OPTS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": True,
    "row_group_size": 1_000_000,
    "data_page_version": "1.0",
}


class HistoryError(ValueError):
    """Bad input to an export or a query (a shard name, a kind, a destination)."""


def check_shard(name: str) -> str:
    if not _SHARD_RE.match(name):
        raise HistoryError(f"shard name {name!r} must be 1-64 of [A-Za-z0-9_.-]")
    return name


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise HistoryError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    return kind


def is_url(dest: str) -> bool:
    return "://" in dest and not dest.startswith("file://")


def hour_dir(kind: str, hour: datetime, shard: str) -> str:
    h = hour.astimezone(UTC)
    return f"kind={kind}/day={h:%Y-%m-%d}/hour={h:%H}/shard={shard}"


class _Dest:
    """A local directory or a URL pyarrow.fs opens (``s3://bucket/prefix``, ``gs://...``);
    writes are whole-file-or-nothing."""

    def __init__(self, dest: str):
        self.dest = dest
        if is_url(dest):
            from pyarrow import fs as pafs

            try:
                self.fs, self.root = pafs.FileSystem.from_uri(dest)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
                raise HistoryError(f"{dest}: not a destination pyarrow can open: {e}") from None
        else:
            self.fs = None
            self.root = str(Path(dest.removeprefix("file://")))

    def exists(self, rel: str) -> bool:
        if self.fs is None:
            return os.path.exists(os.path.join(self.root, rel))
        from pyarrow import fs as pafs

        info = self.fs.get_file_info(f"{self.root.rstrip('/')}/{rel}")
        return info.type != pafs.FileType.NotFound

    def put(self, rel: str, data: bytes) -> None:
        if self.fs is None:
            final = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            tmp = os.path.join(os.path.dirname(final), f".{PART_NAME}.tmp-{os.getpid()}")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # atomic on one filesystem: the hour appears whole
        else:
            # an object store makes the key visible only when the upload completes
            with self.fs.open_output_stream(f"{self.root.rstrip('/')}/{rel}") as f:
                f.write(data)


@dataclass
class ExportResult:
    hours: int = 0
    rows: int = 0
    bytes: int = 0
    skipped: int = 0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **_WRITE_OPTS)
    return buf.getvalue()


def closed_before(con: duckdb.DuckDBPyConnection, grace_s: float) -> datetime | None:
    """The end of the last closed hour: hours ending at or before it are closed."""
    newest = None
    for kind in KINDS:
        t = con.execute(f"SELECT max(ts) FROM {kind}").fetchone()[0]
        if t is not None and (newest is None or t > newest):
            newest = t
    if newest is None:
        return None
    limit = newest - timedelta(seconds=grace_s)
    return limit.replace(minute=0, second=0, microsecond=0)


def export_closed_hours(
    con: duckdb.DuckDBPyConnection,
    dest: str,
    *,
    shard: str = DEFAULT_SHARD,
    grace_s: float = DEFAULT_GRACE_S,
) -> ExportResult:
    """Export every closed hour of every kind not yet exported to ``dest`` (idempotent)."""
    check_shard(shard)
    if grace_s < 0:
        raise HistoryError(f"grace {grace_s} s must be >= 0")
    out = _Dest(dest)
    for ddl in HISTORY_DDL:
        con.execute(ddl)
    result = ExportResult()
    until = closed_before(con, grace_s)
    if until is None:
        return result
    for kind in KINDS:
        hours = [
            r[0]
            for r in con.execute(
                f"SELECT DISTINCT date_trunc('hour', ts) AS h FROM {kind} WHERE ts < ? ORDER BY h",
                [until],
            ).fetchall()
        ]
        done = {
            r[0]
            for r in con.execute(
                "SELECT hour FROM history_exports WHERE kind = ? AND shard = ? AND dest = ?",
                [kind, shard, dest],
            ).fetchall()
        }
        cols = ", ".join(arrow_schema(kind).names)
        for hour in hours:
            rel = f"{hour_dir(kind, hour, shard)}/{PART_NAME}"
            if hour in done and out.exists(rel):
                result.skipped += 1
                continue
            table = con.sql(
                f"SELECT {cols} FROM {kind} WHERE ts >= ? AND ts < ? ORDER BY ts, source, id",
                params=[hour, hour + timedelta(hours=1)],
            ).to_arrow_table()
            data = parquet_bytes(table.cast(arrow_schema(kind)))
            out.put(rel, data)
            con.execute(
                "INSERT INTO history_exports VALUES (?, ?, ?, ?, ?, ?, ?, now())"
                " ON CONFLICT (kind, hour, shard, dest) DO UPDATE SET rows = excluded.rows,"
                " bytes = excluded.bytes, sha256 = excluded.sha256,"
                " exported_at = excluded.exported_at",
                [kind, hour, shard, dest, table.num_rows, len(data), _sha256(data)],
            )
            result.hours += 1
            result.rows += table.num_rows
            result.bytes += len(data)
    return result


def query_series(
    source: str,
    kind: str,
    component_id: str | None,
    start: datetime,
    end: datetime,
    step_s: float | None = None,
) -> list[dict[str, Any]]:
    """A kind's rows in [start, end) over every shard's Parquet under ``source``: raw rows, or
    per-``step_s`` bucket means when a step is given (the API's series at a step)."""
    check_kind(kind)
    if end <= start:
        raise HistoryError(f"end {end.isoformat()} is not after start {start.isoformat()}")
    if step_s is not None and step_s <= 0:
        raise HistoryError(f"step {step_s} s must be > 0")
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    if is_url(source):
        root = source  # DuckDB reads s3:// etc. itself (its httpfs extension)
    else:
        root = str(Path(source.removeprefix("file://")))
        if not Path(root).is_dir():
            raise HistoryError(f"{source}: no such directory")
    days = [
        (start.astimezone(UTC) + timedelta(days=i)).strftime("%Y-%m-%d")
        for i in range((end - start).days + 2)
    ]
    # partition pruning by day: only the day folders of the range are listed (paths built from
    # the validated kind and formatted dates only), and the hour filter prunes within them
    dest = _Dest(source) if is_url(source) else None
    globs = [
        f"{root.rstrip('/')}/kind={kind}/day={d}/hour=*/shard=*/{PART_NAME}"
        for d in days
        if (
            dest.exists(f"kind={kind}/day={d}")
            if dest
            else Path(root, f"kind={kind}/day={d}").is_dir()
        )
    ]
    if not globs:
        return []
    hours_lo = start.astimezone(UTC).strftime("%Y-%m-%d %H")
    hours_hi = (end.astimezone(UTC) - timedelta(microseconds=1)).strftime("%Y-%m-%d %H")
    quantities = list(QUANTITIES[kind])
    where = "day || ' ' || hour BETWEEN ? AND ? AND ts >= ? AND ts < ? AND (? IS NULL OR id = ?)"
    params: list[Any] = [globs, hours_lo, hours_hi, start, end, component_id, component_id]
    if step_s is None:
        sel = ", ".join(["ts", "shard", "source", "id", *quantities])
        sql = (
            f"SELECT {sel} FROM read_parquet(?, hive_partitioning = 1, hive_types_autocast = 0)"
            f" WHERE {where} ORDER BY ts, source, id"
        )
    else:
        aggs = ", ".join(f"avg({q}) AS {q}" for q in quantities)
        sql = (
            "SELECT time_bucket(to_microseconds(?::BIGINT), ts) AS ts, id, count(*) AS n, "
            f"{aggs} FROM read_parquet(?, hive_partitioning = 1, hive_types_autocast = 0)"
            f" WHERE {where} GROUP BY ALL ORDER BY ts, id"
        )
        params = [round(step_s * 1e6), *params]
    try:
        cur = con.execute(sql, params)
    except duckdb.IOException as e:
        if "No files found" in str(e):
            return []
        raise HistoryError(f"{source}: {e}") from None
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
