"""The durable outbox: every notification reaches every hook at least once, in order.

:meth:`Outbox.enqueue` writes one row per (notification, hook that takes its status) into the
store's ``alert_outbox`` table, in one transaction (the engine's, so state and outbox commit
together). :meth:`Outbox.deliver` sends the rows that are due:

- per (hook, dedup key) in enqueue order: a resolve never overtakes its firing;
- success: ``state = 'delivered'``, ``delivered_at``;
- transport error, 408, 425, 429, 5xx: ``attempts + 1``, ``last_error``, and the next attempt
  after ``min(base_backoff_s * 2**(attempts - 1), max_backoff_s)`` (or ``Retry-After`` when
  longer), with optional jitter; the hook's other rows wait until then too, so a hook that is
  down gets one request per backoff step, not one per row;
- any other status (400 ...), or retrying past ``give_up_after_s``: ``state = 'failed'`` with
  its error, never retried.

Idempotent by dedup key: while a row for (hook, dedup key, status) is pending and is the newest
row of that (hook, dedup key), a new notification of the same status updates that row instead of
adding one; receivers see (dedup key, status) pairs that PagerDuty and Alertmanager dedupe
natively and that webhook receivers dedupe by ``event_id``. Alertmanager hooks re-send a
delivered firing row every ``resend_interval_s`` until its resolve is enqueued.

:class:`Delivery` runs :meth:`Outbox.deliver` in a thread.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from twin.alerts.db import AlertDb
from twin.alerts.hooks import Hook, OutboxEvent
from twin.alerts.model import Notification, event_id

__all__ = ["Delivery", "DeliveryReport", "Outbox"]

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class DeliveryReport:
    """What one :meth:`Outbox.deliver` round did (row ids)."""

    delivered: list[int] = field(default_factory=list)
    retried: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    resent: list[int] = field(default_factory=list)


class Outbox:
    """Rows to deliver, kept in the store; see the module docstring."""

    def __init__(
        self,
        db: Any,
        hooks: Sequence[Hook],
        clock: Clock = _now,
        *,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        jitter: float = 0.0,
        give_up_after_s: float = 86_400.0,
    ) -> None:
        self.db = db if isinstance(db, AlertDb) else AlertDb(db)
        self.hooks = {h.name: h for h in hooks}
        self.clock = clock
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.jitter = jitter
        self.give_up_after_s = give_up_after_s
        self._deliver_lock = threading.Lock()
        self._hook_down_until: dict[str, datetime] = {}  # a failing hook waits as its row does

    # ---- enqueue -------------------------------------------------------------------------

    def enqueue(self, notification: Notification, now: datetime | None = None) -> int:
        """Write rows for every hook that takes this status; returns rows written or updated."""
        return self.enqueue_many([notification], now)

    def enqueue_many(
        self, notifications: Iterable[Notification], now: datetime | None = None
    ) -> int:
        now = now or self.clock()
        n = 0
        with self.db.transaction() as cur:
            for note in notifications:
                payload = note.model_dump_json()
                for hook in self.hooks.values():
                    if hook.supports(note.status):
                        n += self._put(
                            cur, hook, note.dedup_key, note.status, note.event_id, payload, now
                        )
        return n

    def acknowledge(self, dedup_key: str, now: datetime | None = None) -> int:
        """Enqueue an acknowledge event for ``dedup_key`` to every hook that takes one."""
        now = now or self.clock()
        payload = json.dumps({"dedup_key": dedup_key})
        eid = event_id(dedup_key, "acknowledge", now)
        n = 0
        with self.db.transaction() as cur:
            for hook in self.hooks.values():
                if hook.supports("acknowledge"):
                    n += self._put(cur, hook, dedup_key, "acknowledge", eid, payload, now)
        return n

    def _put(
        self,
        cur: Any,
        hook: Hook,
        key: str,
        status: str,
        eid: str,
        payload: str,
        now: datetime,
    ) -> int:
        rows = cur.execute(
            "SELECT id, status, state, event_id FROM alert_outbox WHERE hook = ?"
            " AND dedup_key = ? ORDER BY id DESC LIMIT 1",
            [hook.name, key],
        ).fetchall()
        if rows and rows[0][1] == status and rows[0][3] == eid and rows[0][2] != "pending":
            return 0  # this very event is already delivered (or given up): nothing new
        if rows and rows[0][1] == status and rows[0][2] == "pending":
            cur.execute(
                "UPDATE alert_outbox SET payload = ?, event_id = ? WHERE id = ?",
                [payload, eid, rows[0][0]],
            ).fetchall()
            return 1
        if status != "firing":  # a resolve (or ack) ends Alertmanager's re-sends of the firing
            cur.execute(
                "UPDATE alert_outbox SET next_resend_at = NULL WHERE hook = ? AND dedup_key = ?"
                " AND next_resend_at IS NOT NULL",
                [hook.name, key],
            ).fetchall()
        cur.execute(
            "INSERT INTO alert_outbox (hook, dedup_key, status, event_id, payload, created_at,"
            " next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [hook.name, key, status, eid, payload, now, now],
        ).fetchall()
        return 1

    # ---- deliver -------------------------------------------------------------------------

    def _backoff_s(self, attempts: int, retry_after_s: float | None) -> float:
        delay = min(self.base_backoff_s * 2 ** max(attempts - 1, 0), self.max_backoff_s)
        if self.jitter:
            delay *= 1 + random.uniform(-self.jitter, self.jitter)
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        return delay

    def deliver(self, now: datetime | None = None) -> DeliveryReport:
        """Send what is due; returns what happened. One round at a time (a lock)."""
        with self._deliver_lock:
            return self._deliver(now or self.clock())

    def _event(self, status: str, key: str, eid: str, payload: str, at: datetime) -> OutboxEvent:
        note = None if status == "acknowledge" else Notification.model_validate_json(payload)
        return OutboxEvent(status, key, eid, note, at)  # type: ignore[arg-type]

    def _deliver(self, now: datetime) -> DeliveryReport:
        report = DeliveryReport()
        rows = self.db.query(
            "SELECT id, hook, dedup_key, status, event_id, payload, attempts, created_at,"
            " next_attempt_at FROM alert_outbox WHERE state = 'pending' ORDER BY id"
        )
        blocked: set[tuple[str, str]] = set()  # (hook, dedup key) with an earlier row waiting
        down = {h for h, until in self._hook_down_until.items() if until > now}
        for rid, hook_name, key, status, eid, payload, attempts, created, due in rows:
            hook = self.hooks.get(hook_name)
            if hook is None or (hook_name, key) in blocked or hook_name in down or due > now:
                blocked.add((hook_name, key))
                continue
            result = hook.send(self._event(status, key, eid, payload, created), now)
            attempts += 1
            if result.ok:
                resend = hook.resend_interval_s if status == "firing" else None
                self.db.query(
                    "UPDATE alert_outbox SET state = 'delivered', delivered_at = ?, attempts = ?,"
                    " last_status_code = ?, next_resend_at = ? WHERE id = ?",
                    [
                        now,
                        attempts,
                        result.status_code,
                        now + timedelta(seconds=resend) if resend else None,
                        rid,
                    ],
                )
                report.delivered.append(rid)
                self._hook_down_until.pop(hook_name, None)
                continue
            blocked.add((hook_name, key))
            expired = (now - created).total_seconds() >= self.give_up_after_s
            if result.retry and not expired:
                nxt = now + timedelta(seconds=self._backoff_s(attempts, result.retry_after_s))
                self.db.query(
                    "UPDATE alert_outbox SET attempts = ?, last_error = ?, last_status_code = ?,"
                    " next_attempt_at = ? WHERE id = ?",
                    [attempts, result.error, result.status_code, nxt, rid],
                )
                down.add(hook_name)
                self._hook_down_until[hook_name] = nxt
                report.retried.append(rid)
                log.warning("hook %s: %s (retry at %s)", hook_name, result.error, nxt)
            else:
                self.db.query(
                    "UPDATE alert_outbox SET state = 'failed', attempts = ?, last_error = ?,"
                    " last_status_code = ? WHERE id = ?",
                    [attempts, result.error, result.status_code, rid],
                )
                report.failed.append(rid)
                log.error("hook %s: %s (given up)", hook_name, result.error)
        self._resend(now, down, report)
        return report

    def _resend(self, now: datetime, down: set[str], report: DeliveryReport) -> None:
        rows = self.db.query(
            "SELECT id, hook, dedup_key, status, event_id, payload, created_at FROM alert_outbox"
            " WHERE state = 'delivered' AND next_resend_at IS NOT NULL AND next_resend_at <= ?"
            " ORDER BY id",
            [now],
        )
        for rid, hook_name, key, status, eid, payload, created in rows:
            hook = self.hooks.get(hook_name)
            if hook is None or hook_name in down or hook.resend_interval_s is None:
                continue
            result = hook.send(self._event(status, key, eid, payload, created), now)
            wait = hook.resend_interval_s if result.ok else self._backoff_s(1, None)
            self.db.query(
                "UPDATE alert_outbox SET next_resend_at = ? WHERE id = ? AND next_resend_at"
                " IS NOT NULL",
                [now + timedelta(seconds=wait), rid],
            )
            if result.ok:
                report.resent.append(rid)
            else:
                down.add(hook_name)

    # ---- inspection ----------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """Every outbox row, oldest first, as dicts (for the API, the CLI and tests)."""
        cols = [
            "id",
            "hook",
            "dedup_key",
            "status",
            "event_id",
            "attempts",
            "next_attempt_at",
            "last_error",
            "last_status_code",
            "delivered_at",
            "state",
        ]
        rows = self.db.query(f"SELECT {', '.join(cols)} FROM alert_outbox ORDER BY id")
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def pending(self) -> int:
        return int(self.db.query("SELECT count(*) FROM alert_outbox WHERE state = 'pending'")[0][0])

    def close(self) -> None:
        for h in self.hooks.values():
            h.close()


class Delivery:
    """Calls :meth:`Outbox.deliver` every ``interval_s`` in a daemon thread until stopped."""

    def __init__(self, outbox: Outbox, interval_s: float = 1.0) -> None:
        self.outbox = outbox
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Delivery:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="alert-delivery", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.outbox.deliver()
            except Exception:  # keep delivering; the rows stay in the store
                log.exception("alert delivery round failed")
            self._stop.wait(self.interval_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> Delivery:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
