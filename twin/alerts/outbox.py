"""The durable outbox: every notification reaches every hook at least once, in order.

:meth:`Outbox.enqueue` writes one row per (notification, hook that takes its status) into the
store's ``alert_outbox`` table, in one transaction (the engine's, so state and outbox commit
together). :meth:`Outbox.deliver` sends the rows that are due:

- per (hook, dedup key) in enqueue order: a resolve never overtakes its firing;
- success: ``state = 'delivered'``, ``delivered_at``;
- transport error, 408, 425, 429, 5xx: ``attempts + 1``, ``last_error``, and the next attempt
  after ``min(base_backoff_s * 2**(attempts - 1), max_backoff_s)`` (or ``Retry-After`` when
  longer), with optional jitter; the hook's other *retries* wait until then too, so a hook that
  is down gets one retry per backoff step, not one per row, while another incident's *first*
  delivery is tried at once (one incident's retries never delay another's first page);
- any other status (400 ...), or retrying past ``give_up_after_s``: ``state = 'failed'`` with
  its error, never retried.

Idempotent by dedup key: while a row for (hook, dedup key, status) is pending and is the newest
row of that (hook, dedup key), a new notification of the same status updates that row instead of
adding one; receivers see (dedup key, status) pairs that PagerDuty and Alertmanager dedupe
natively and that webhook receivers dedupe by ``event_id``. Alertmanager hooks re-send a
delivered firing row every ``resend_interval_s`` until its resolve is enqueued.

:class:`Delivery` runs one worker thread per hook (:meth:`Outbox.deliver_hook`), so a hook
that is down, slow or trickling its answers never delays another: each request ends at its
hook's ``timeout_s`` (a total deadline), and only that hook's rows wait for it.
:meth:`Delivery.reload` swaps in a new hook list (``dctwin serve`` on SIGHUP): workers of
unchanged hooks keep running, changed hooks get a new worker, removed hooks stop (their pending
rows stay in the store and go out if a hook of that name comes back).

``last_error`` holds the hook's error text with every URL cut to ``scheme://host[:port]`` and
its secrets blanked (:meth:`twin.alerts.hooks.Hook.redact`).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from twin.alerts.db import AlertDb
from twin.alerts.hooks import Hook, OutboxEvent, Router
from twin.alerts.model import Notification, event_id
from twin.store import alerts as store_alerts

if TYPE_CHECKING:
    from twin.health import ServiceHealth

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
        router: Router | None = None,
    ) -> None:
        self.db = db if isinstance(db, AlertDb) else AlertDb(db)
        self.hooks = {h.name: h for h in hooks}
        #: which hooks get which notification (the hook file's ``route``); default: every hook
        self.router = router or Router()
        self.clock = clock
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.jitter = jitter
        self.give_up_after_s = give_up_after_s
        self._locks: dict[str, threading.Lock] = {}  # one delivery round per hook at a time
        self._locks_lock = threading.Lock()
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
            hooks, router = list(self.hooks.values()), self.router
            for note in notifications:
                payload = note.model_dump_json()
                routed = router.hooks_for(note)  # None: every hook
                for hook in hooks:
                    if hook.supports(note.status) and (routed is None or hook.name in routed):
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
            routed: set[str] | None = None
            if self.router.route is not None:  # to the hooks the incident was routed to
                routed = store_alerts.outbox_hooks_of(cur, dedup_key)
            for hook in list(self.hooks.values()):
                if hook.supports("acknowledge") and (routed is None or hook.name in routed):
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
        last = store_alerts.outbox_last(cur, hook.name, key)
        if last and last[1] == status and last[3] == eid and last[2] != "pending":
            return 0  # this very event is already delivered (or given up): nothing new
        if last and last[1] == status and last[2] == "pending":
            store_alerts.outbox_repayload(cur, last[0], payload, eid)
            return 1
        # a resolve (or ack) ends Alertmanager's re-sends of the firing; a reminder (a new
        # firing event of the same incident) takes them over once delivered
        store_alerts.outbox_add(cur, hook.name, key, status, eid, payload, now)
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
        """Send what is due to every hook, one hook after the other; returns what happened."""
        now = now or self.clock()
        report = DeliveryReport()
        for name in list(self.hooks):
            part = self.deliver_hook(name, now)
            for f in ("delivered", "retried", "failed", "resent"):
                getattr(report, f).extend(getattr(part, f))
        return report

    def deliver_hook(self, name: str, now: datetime | None = None) -> DeliveryReport:
        """Send what is due to hook ``name``; one round per hook at a time (a lock per hook)."""
        with self._locks_lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            hook = self.hooks.get(name)
            if hook is None:
                return DeliveryReport()
            return self._deliver(hook, now or self.clock(), live=now is None)

    def backing_off(self, name: str, now: datetime | None = None) -> bool:
        """Hook ``name`` failed and waits for its next attempt."""
        until = self._hook_down_until.get(name)
        return until is not None and until > (now or self.clock())

    def set_hooks(self, hooks: Sequence[Hook], router: Router | None = None) -> list[Hook]:
        """Swap in a new hook list (and router; None: every hook gets every notification); a
        hook equal to a running one (:meth:`Hook.same_as`) keeps the running object. Returns
        the hooks that are no longer used (close them once their worker has stopped)."""
        self.router = router or Router()
        old = self.hooks
        new: dict[str, Hook] = {}
        for h in hooks:
            cur = old.get(h.name)
            if cur is not None and cur.same_as(h):
                new[h.name] = cur
                if h is not cur:
                    h.close()
            else:
                new[h.name] = h
        self.hooks = new  # one assignment: readers see the old or the new dict
        for name in set(old) - set(new) | {n for n in new if new[n] is not old.get(n)}:
            self._hook_down_until.pop(name, None)
        return [h for name, h in old.items() if new.get(name) is not h]

    def _event(self, status: str, key: str, eid: str, payload: str, at: datetime) -> OutboxEvent:
        note = None if status == "acknowledge" else Notification.model_validate_json(payload)
        return OutboxEvent(status, key, eid, note, at)  # type: ignore[arg-type]

    def _deliver(self, hook: Hook, now: datetime, live: bool = False) -> DeliveryReport:
        report = DeliveryReport()
        hook_name = hook.name
        rows = store_alerts.outbox_pending(self.db, hook_name)
        blocked: set[str] = set()  # dedup keys with an earlier row waiting
        down = {h for h, until in self._hook_down_until.items() if until > now}
        for rid, key, status, eid, payload, attempts, created, due in rows:
            if self.hooks.get(hook_name) is not hook:
                break  # reloaded: the new hook's worker takes over
            # a row retried before waits for its time and for the hook's; a first delivery of
            # another incident goes out now, whatever this hook's other rows are waiting for
            if key in blocked or due > now or (attempts and hook_name in down):
                blocked.add(key)
                continue
            result = hook.send(self._event(status, key, eid, payload, created), now)
            if live:  # a send may take up to the hook's timeout: time what follows from its end
                now = self.clock()
            attempts += 1
            if result.ok:
                resend = hook.resend_interval_s if status == "firing" else None
                store_alerts.outbox_delivered(
                    self.db,
                    rid,
                    now,
                    attempts,
                    result.status_code,
                    now + timedelta(seconds=resend) if resend else None,
                )
                report.delivered.append(rid)
                self._hook_down_until.pop(hook_name, None)
                continue
            blocked.add(key)
            expired = (now - created).total_seconds() >= self.give_up_after_s
            if result.retry and not expired:
                nxt = now + timedelta(seconds=self._backoff_s(attempts, result.retry_after_s))
                store_alerts.outbox_retry(
                    self.db, rid, attempts, result.error, result.status_code, nxt
                )
                down.add(hook_name)
                self._hook_down_until[hook_name] = nxt
                report.retried.append(rid)
                log.warning("hook %s: %s (retry at %s)", hook_name, result.error, nxt)
            else:
                store_alerts.outbox_failed(self.db, rid, attempts, result.error, result.status_code)
                report.failed.append(rid)
                log.error("hook %s: %s (given up)", hook_name, result.error)
        if hook.resend_interval_s is not None:
            self._resend(hook, now, down, report, live)
        return report

    def _resend(
        self, hook: Hook, now: datetime, down: set[str], report: DeliveryReport, live: bool
    ) -> None:
        rows = store_alerts.outbox_resends_due(self.db, hook.name, now)
        for rid, key, status, eid, payload, created in rows:
            hook_name = hook.name
            if hook_name in down or hook.resend_interval_s is None:
                continue
            if self.hooks.get(hook_name) is not hook:
                break
            result = hook.send(self._event(status, key, eid, payload, created), now)
            if live:
                now = self.clock()
            wait = hook.resend_interval_s if result.ok else self._backoff_s(1, None)
            store_alerts.outbox_next_resend(self.db, rid, now + timedelta(seconds=wait))
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
        rows = store_alerts.outbox_rows(self.db, cols)
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def pending(self) -> int:
        return store_alerts.outbox_pending_count(self.db)

    def close(self) -> None:
        for h in self.hooks.values():
            h.close()


class _Worker:
    """The delivery thread of one hook."""

    def __init__(self, delivery: Delivery, hook: Hook) -> None:
        self.delivery = delivery
        self.hook = hook
        self.loop = f"outbox:{hook.name}"
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"alert-{self.loop}", daemon=True)

    def _run(self) -> None:
        outbox, health = self.delivery.outbox, self.delivery.health
        while not self.stop_event.is_set():
            if outbox.hooks.get(self.hook.name) is not self.hook:
                return  # replaced or removed by a reload
            try:
                report = outbox.deliver_hook(self.hook.name)
            except Exception as exc:  # keep delivering; the rows stay in the store
                msg = self.hook.redact(f"delivery round failed: {type(exc).__name__}: {exc}")
                log.exception("hook %s: %s", self.hook.name, msg)
                if health is not None:
                    health.error(self.loop, msg)
            else:
                if health is not None:
                    if report.retried or report.failed:
                        health.error(self.loop, self._last_error() or "delivery failed")
                    elif (
                        report.delivered or report.resent or not outbox.backing_off(self.hook.name)
                    ):
                        health.ok(self.loop)
            self.stop_event.wait(self.delivery.interval_s)

    def _last_error(self) -> str | None:
        return store_alerts.outbox_last_error(self.delivery.outbox.db, self.hook.name)


class Delivery:
    """One delivery worker (a daemon thread) per hook, each calling
    :meth:`Outbox.deliver_hook` every ``interval_s`` until stopped; a hook that hangs holds
    only its own worker. With ``health``, each worker reports as loop ``outbox:<hook name>``
    (a failed send is an error, a delivery or an idle pass while not backing off is ok)."""

    def __init__(
        self, outbox: Outbox, interval_s: float = 1.0, health: ServiceHealth | None = None
    ) -> None:
        self.outbox = outbox
        self.interval_s = interval_s
        self.health = health
        self._workers: dict[str, _Worker] = {}
        self._lock = threading.Lock()
        self._running = False

    def start(self) -> Delivery:
        with self._lock:
            self._running = True
            self._sync()
        return self

    def _sync(self) -> list[_Worker]:
        """Stop workers whose hook is gone or replaced, start one for each hook without one;
        returns the stopped workers (not yet joined)."""
        hooks = self.outbox.hooks
        stopped = []
        for name, w in list(self._workers.items()):
            if hooks.get(name) is not w.hook:
                w.stop_event.set()
                stopped.append(self._workers.pop(name))
        for name, hook in hooks.items():
            w = self._workers.get(name)
            if w is None or not w.thread.is_alive():
                w = self._workers[name] = _Worker(self, hook)
                if self.health is not None:
                    self.health.register(w.loop)
                w.thread.start()
        return stopped

    def workers(self) -> list[str]:
        """Names of the hooks that have a running worker."""
        with self._lock:
            return sorted(n for n, w in self._workers.items() if w.thread.is_alive())

    def reload(
        self, hooks: Sequence[Hook], timeout_s: float = 30.0, router: Router | None = None
    ) -> dict[str, list[str]]:
        """Swap in ``hooks`` and ``router`` (see :meth:`Outbox.set_hooks`) and restart the
        workers of the hooks that changed; returns the hook names ``added``, ``changed``,
        ``removed``, ``kept``."""
        with self._lock:
            before = dict(self.outbox.hooks)
            retired = self.outbox.set_hooks(hooks, router)
            after = self.outbox.hooks
            stopped = self._sync() if self._running else []
        for w in stopped:
            w.thread.join(timeout_s)
        for h in retired:
            h.close()
        return {
            "added": sorted(set(after) - set(before)),
            "changed": sorted(n for n in after if n in before and after[n] is not before[n]),
            "removed": sorted(set(before) - set(after)),
            "kept": sorted(n for n in after if after[n] is before.get(n)),
        }

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every worker; one in the middle of a request ends it first (at the latest at
        its hook's ``timeout_s``)."""
        with self._lock:
            self._running = False
            workers, self._workers = list(self._workers.values()), {}
        for w in workers:
            w.stop_event.set()
        for w in workers:
            w.thread.join(timeout_s)

    def __enter__(self) -> Delivery:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
