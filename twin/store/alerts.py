"""The alert engine's tables in the store, a thread-safe handle on them, and every statement
the engine, the silences and the delivery outbox run on them.

Tables (their DDL is the store's, :data:`twin.store.schema.ALERT_DDL`; a
:class:`twin.store.Store` creates them, and :func:`ensure_alert_tables` on a bare connection):

- ``alert_outbox``: one row per (event, hook): ``dedup_key``, ``status`` (firing, resolved,
  acknowledge), ``event_id``, ``payload`` (the notification as JSON: hooks render it when they
  send, so secrets never reach the store), ``attempts``, ``next_attempt_at``, ``last_error``,
  ``delivered_at``, ``state`` (pending, delivered, failed).
- ``alert_state``: the engine's pending and firing alerts and its groups, one JSON row each,
  so a restart neither re-pages a firing incident nor forgets to resolve it.
- ``alert_silences``: silences with their matchers and validity window.
- ``alert_history``: every notification the engine made, hooks or none.
- ``alert_acks``: acknowledgements recorded through the API.

DuckDB connections are not shared between threads: :class:`AlertDb` hands each thread its own
cursor of one connection, and serializes writes with a lock (one process owns the store).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import duckdb

from twin.store.schema import ALERT_DDL

Cursor = duckdb.DuckDBPyConnection


def ensure_alert_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the alert tables on ``con`` when missing (idempotent): the store's
    :data:`twin.store.schema.ALERT_DDL`, which every :class:`twin.store.Store` also runs."""
    for stmt in ALERT_DDL:
        con.execute(stmt).fetchall()


class AlertDb:
    """The alert tables on one DuckDB connection: per-thread cursors and one write lock.

    Pass a ``duckdb`` connection, or a :class:`twin.store.Store` (its ``con`` is used).
    """

    def __init__(self, con: Any) -> None:
        root = getattr(con, "con", con)
        self._root: duckdb.DuckDBPyConnection = root
        self._local = threading.local()
        self.lock = threading.RLock()
        with self.lock:
            ensure_alert_tables(self.cursor())

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor (created on first use, UTC session time zone)."""
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._root.cursor()
            cur.execute("SET TimeZone = 'UTC'").fetchall()
            self._local.cur = cur
        return cur

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement and fetch every row (never leaves a result open)."""
        with self.lock:
            return self.cursor().execute(sql, params or []).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Hold the write lock and one transaction on this thread's cursor; re-entrant."""
        with self.lock:
            depth = getattr(self._local, "depth", 0)
            cur = self.cursor()
            if depth == 0:
                cur.execute("BEGIN TRANSACTION").fetchall()
            self._local.depth = depth + 1
            try:
                yield cur
            except BaseException:
                self._local.depth = depth
                if depth == 0:
                    cur.execute("ROLLBACK").fetchall()
                raise
            self._local.depth = depth
            if depth == 0:
                cur.execute("COMMIT").fetchall()


# ---- silences ----------------------------------------------------------------------------------


def put_silence(cur: Cursor, row: Sequence[Any]) -> None:
    """Write silence ``row`` (id, matchers JSON, starts_at, ends_at, created_by, comment) in
    place of any silence of its id; ``cur`` holds the transaction."""
    cur.execute("DELETE FROM alert_silences WHERE id = ?", [row[0]]).fetchall()
    cur.execute("INSERT INTO alert_silences VALUES (?, ?, ?, ?, ?, ?)", list(row)).fetchall()


def end_silence(db: AlertDb, silence_id: str, now: datetime) -> None:
    """End silence ``silence_id`` at ``now`` (or earlier, where it ends earlier)."""
    db.query(
        "UPDATE alert_silences SET ends_at = least(ends_at, ?) WHERE id = ?", [now, silence_id]
    )


def silence_rows(db: AlertDb) -> list[tuple[Any, ...]]:
    """Every silence as (id, matchers JSON, starts_at, ends_at, created_by, comment)."""
    return db.query(
        "SELECT id, matchers, starts_at, ends_at, created_by, comment FROM alert_silences"
        " ORDER BY starts_at, id"
    )


# ---- the engine's state and history -----------------------------------------------------------


def state_rows(db: AlertDb) -> list[tuple[Any, ...]]:
    """The engine's saved state as (key, kind, state JSON)."""
    return db.query("SELECT key, kind, state FROM alert_state")


def put_state(cur: Cursor, key: str, state_json: str | None, now: datetime) -> None:
    """Replace the state row ``key`` with ``state_json`` (None: delete it); the row's kind is
    the key's first letter."""
    cur.execute("DELETE FROM alert_state WHERE key = ?", [key]).fetchall()
    if state_json is not None:
        cur.execute(
            "INSERT INTO alert_state VALUES (?, ?, ?, ?)", [key, key[0], state_json, now]
        ).fetchall()


def add_history(cur: Cursor, row: Sequence[Any]) -> None:
    """Append notification ``row`` (at, dedup_key, status, event_id, rule, severity, payload)."""
    cur.execute("INSERT INTO alert_history VALUES (?, ?, ?, ?, ?, ?, ?)", list(row)).fetchall()


# ---- the delivery outbox ----------------------------------------------------------------------


def outbox_hooks_of(cur: Cursor, dedup_key: str) -> set[str]:
    """The hooks an incident has outbox rows for."""
    rows = cur.execute(
        "SELECT DISTINCT hook FROM alert_outbox WHERE dedup_key = ?", [dedup_key]
    ).fetchall()
    return {r[0] for r in rows}


def outbox_last(cur: Cursor, hook: str, dedup_key: str) -> tuple[Any, ...] | None:
    """The newest row of (hook, dedup_key) as (id, status, state, event_id); None if none."""
    rows = cur.execute(
        "SELECT id, status, state, event_id FROM alert_outbox WHERE hook = ?"
        " AND dedup_key = ? ORDER BY id DESC LIMIT 1",
        [hook, dedup_key],
    ).fetchall()
    return rows[0] if rows else None


def outbox_repayload(cur: Cursor, row_id: int, payload: str, event_id: str) -> None:
    """Give pending row ``row_id`` a newer payload and event id."""
    cur.execute(
        "UPDATE alert_outbox SET payload = ?, event_id = ? WHERE id = ?",
        [payload, event_id, row_id],
    ).fetchall()


def outbox_add(
    cur: Cursor,
    hook: str,
    dedup_key: str,
    status: str,
    event_id: str,
    payload: str,
    now: datetime,
) -> None:
    """Enqueue an event for ``hook``, due now, ending the re-sends of the incident's earlier
    rows on that hook (a resolve or ack ends Alertmanager's re-sends of the firing; a reminder
    takes them over once delivered)."""
    cur.execute(
        "UPDATE alert_outbox SET next_resend_at = NULL WHERE hook = ? AND dedup_key = ?"
        " AND next_resend_at IS NOT NULL",
        [hook, dedup_key],
    ).fetchall()
    cur.execute(
        "INSERT INTO alert_outbox (hook, dedup_key, status, event_id, payload, created_at,"
        " next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [hook, dedup_key, status, event_id, payload, now, now],
    ).fetchall()


def outbox_pending(db: AlertDb, hook: str) -> list[tuple[Any, ...]]:
    """``hook``'s pending rows by id: (id, dedup_key, status, event_id, payload, attempts,
    created_at, next_attempt_at)."""
    return db.query(
        "SELECT id, dedup_key, status, event_id, payload, attempts, created_at,"
        " next_attempt_at FROM alert_outbox WHERE state = 'pending' AND hook = ? ORDER BY id",
        [hook],
    )


def outbox_delivered(
    db: AlertDb,
    row_id: int,
    now: datetime,
    attempts: int,
    status_code: int | None,
    next_resend_at: datetime | None,
) -> None:
    db.query(
        "UPDATE alert_outbox SET state = 'delivered', delivered_at = ?, attempts = ?,"
        " last_status_code = ?, next_resend_at = ? WHERE id = ?",
        [now, attempts, status_code, next_resend_at, row_id],
    )


def outbox_retry(
    db: AlertDb,
    row_id: int,
    attempts: int,
    error: str | None,
    status_code: int | None,
    next_attempt_at: datetime,
) -> None:
    db.query(
        "UPDATE alert_outbox SET attempts = ?, last_error = ?, last_status_code = ?,"
        " next_attempt_at = ? WHERE id = ?",
        [attempts, error, status_code, next_attempt_at, row_id],
    )


def outbox_failed(
    db: AlertDb, row_id: int, attempts: int, error: str | None, status_code: int | None
) -> None:
    db.query(
        "UPDATE alert_outbox SET state = 'failed', attempts = ?, last_error = ?,"
        " last_status_code = ? WHERE id = ?",
        [attempts, error, status_code, row_id],
    )


def outbox_resends_due(db: AlertDb, hook: str, now: datetime) -> list[tuple[Any, ...]]:
    """``hook``'s delivered rows due a re-send at ``now``: (id, dedup_key, status, event_id,
    payload, created_at)."""
    return db.query(
        "SELECT id, dedup_key, status, event_id, payload, created_at FROM alert_outbox"
        " WHERE state = 'delivered' AND hook = ? AND next_resend_at IS NOT NULL"
        " AND next_resend_at <= ? ORDER BY id",
        [hook, now],
    )


def outbox_next_resend(db: AlertDb, row_id: int, at: datetime) -> None:
    """Move row ``row_id``'s next re-send to ``at`` (unless its re-sends were ended)."""
    db.query(
        "UPDATE alert_outbox SET next_resend_at = ? WHERE id = ? AND next_resend_at IS NOT NULL",
        [at, row_id],
    )


#: The outbox's columns (:func:`outbox_rows`).
OUTBOX_COLUMNS = (
    "id",
    "hook",
    "dedup_key",
    "status",
    "event_id",
    "payload",
    "attempts",
    "next_attempt_at",
    "last_error",
    "last_status_code",
    "delivered_at",
    "state",
    "created_at",
    "next_resend_at",
)


def outbox_rows(db: AlertDb, cols: Sequence[str]) -> list[tuple[Any, ...]]:
    """Every outbox row by id, the columns ``cols`` (of :data:`OUTBOX_COLUMNS`)."""
    bad = set(cols) - set(OUTBOX_COLUMNS)
    if bad:
        raise ValueError(f"not outbox columns: {sorted(bad)}")
    return db.query(f"SELECT {', '.join(cols)} FROM alert_outbox ORDER BY id")


def outbox_pending_count(db: AlertDb) -> int:
    return int(db.query("SELECT count(*) FROM alert_outbox WHERE state = 'pending'")[0][0])


def outbox_last_error(db: AlertDb, hook: str) -> str | None:
    """``hook``'s newest delivery error (None: none)."""
    rows = db.query(
        "SELECT last_error FROM alert_outbox WHERE hook = ? AND last_error IS NOT NULL"
        " ORDER BY id DESC LIMIT 1",
        [hook],
    )
    return rows[0][0] if rows else None
