"""The alert engine's tables in the store, and a thread-safe handle on them.

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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb

from twin.store.schema import ALERT_DDL

__all__ = ["AlertDb", "ensure_alert_tables"]


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
