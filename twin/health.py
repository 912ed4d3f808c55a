"""What the service knows about its own health: loops, broker connection, ingest progress.

One :class:`ServiceHealth` per ``dctwin serve``; every background loop (ingest, calibration,
detection, each hook's delivery worker, the API) reports into it with :meth:`ServiceHealth.ok`
and :meth:`ServiceHealth.error`, the MQTT service reports its broker connection and commits,
and ``/healthz`` and ``/metrics`` read one :meth:`ServiceHealth.snapshot`. So a loop that fails
on every pass shows up as failing instead of the service reporting "ok".

Thread-safe: loops run in their own threads and report concurrently.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: The loops a service may run; a component may report under another name too.
LOOPS: tuple[str, ...] = ("ingest", "calibration", "detection", "api")

#: Default for ``dctwin serve --stall-after`` [s]: messages waiting this long with no commit
#: make ``/healthz`` answer 503.
DEFAULT_STALL_AFTER_S = 60.0


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


@dataclass
class LoopState:
    """The record of one background loop."""

    name: str
    successes_total: int = 0
    errors_total: int = 0
    last_success: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    #: True while the most recent pass failed.
    failing: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "successes_total": self.successes_total,
            "errors_total": self.errors_total,
            "last_success": _iso(self.last_success),
            "last_error": self.last_error,
            "last_error_at": _iso(self.last_error_at),
            "failing": self.failing,
        }


@dataclass
class BrokerState:
    """The MQTT connection as the ingest sees it. ``connected`` is None before the first try."""

    connected: bool | None = None
    since: datetime | None = None
    reconnects: int = 0
    disconnects: int = 0
    last_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "connected": self.connected,
            "since": _iso(self.since),
            "reconnects": self.reconnects,
            "disconnects": self.disconnects,
            "last_reason": self.last_reason,
        }


@dataclass
class ServiceHealth:
    """Shared health state; see the module docstring."""

    stall_after_s: float = DEFAULT_STALL_AFTER_S
    loops: dict[str, LoopState] = field(default_factory=dict)
    broker: BrokerState = field(default_factory=BrokerState)
    #: Time of the last commit of received messages (UTC).
    last_commit_at: datetime | None = None
    #: Time the oldest received-but-not-yet-stored message arrived (monotonic), None if none.
    _oldest_pending_mono: float | None = None
    _last_commit_mono: float | None = None
    #: Store errors that are retried (disk full, lock); the text of the last one.
    store_retrying: str | None = None
    #: Telemetry kinds a loop found without data, with what that loop could not compute.
    missing: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ---- loops ---------------------------------------------------------------------------

    def _loop(self, name: str) -> LoopState:
        state = self.loops.get(name)
        if state is None:
            state = self.loops[name] = LoopState(name)
        return state

    def register(self, name: str) -> None:
        """Make a loop visible (with no passes yet) from the start."""
        with self._lock:
            self._loop(name)

    def ok(self, name: str) -> None:
        """A pass of loop ``name`` succeeded."""
        with self._lock:
            state = self._loop(name)
            state.successes_total += 1
            state.last_success = _now()
            state.failing = False

    def error(self, name: str, message: str) -> None:
        """A pass of loop ``name`` failed with ``message`` (never a secret: callers redact)."""
        with self._lock:
            state = self._loop(name)
            state.errors_total += 1
            state.last_error = message[:500]
            state.last_error_at = _now()
            state.failing = True

    # ---- broker and ingest -----------------------------------------------------------------

    def broker_up(self) -> None:
        with self._lock:
            b = self.broker
            if b.connected is False:
                b.reconnects += 1
            if b.connected is not True:
                b.since = _now()
            b.connected = True

    def broker_down(self, reason: str) -> None:
        with self._lock:
            b = self.broker
            if b.connected is not False:
                b.since = _now()
            if b.connected:
                b.disconnects += 1
            b.connected = False
            b.last_reason = reason

    def pending(self, oldest_mono: float | None) -> None:
        """The arrival time (``time.monotonic()``) of the oldest message not yet stored."""
        with self._lock:
            self._oldest_pending_mono = oldest_mono

    def committed(self) -> None:
        """Received messages were stored (or dead-lettered) and committed."""
        with self._lock:
            self.last_commit_at = _now()
            self._last_commit_mono = time.monotonic()
            self.store_retrying = None

    def store_error(self, message: str | None) -> None:
        """A transient store error is being retried (None: it cleared)."""
        with self._lock:
            self.store_retrying = message

    def set_missing(self, kind: str, what: str | None) -> None:
        """Record that telemetry ``kind`` has no data (``what``: what could not be computed);
        None clears it."""
        with self._lock:
            if what is None:
                self.missing.pop(kind, None)
            else:
                self.missing[kind] = what

    # ---- reading -----------------------------------------------------------------------------

    def ingest_lag_s(self, now_mono: float | None = None) -> float:
        """Age of the oldest received-but-unstored message [s]; 0 when nothing waits."""
        with self._lock:
            oldest = self._oldest_pending_mono
        if oldest is None:
            return 0.0
        return max(0.0, (now_mono if now_mono is not None else time.monotonic()) - oldest)

    def stalled(self, now_mono: float | None = None) -> str | None:
        """Why ingest counts as stalled, or None: messages have waited longer than
        ``stall_after_s`` without a commit."""
        if self.stall_after_s <= 0:
            return None
        now = now_mono if now_mono is not None else time.monotonic()
        lag = self.ingest_lag_s(now)
        if lag <= self.stall_after_s:
            return None
        with self._lock:
            last = self._last_commit_mono
            retrying = self.store_retrying
        since = "never" if last is None else f"{now - last:.0f} s ago"
        why = f"ingest stalled: messages waiting {lag:.0f} s, last commit {since}"
        return f"{why} ({retrying})" if retrying else why

    def snapshot(self) -> dict[str, Any]:
        """Everything, as plain JSON-able values."""
        stalled = self.stalled()
        lag = self.ingest_lag_s()
        with self._lock:
            return {
                "stalled": stalled,
                "ingest_lag_s": lag,
                "last_commit_at": _iso(self.last_commit_at),
                "store_retrying": self.store_retrying,
                "broker": self.broker.as_dict(),
                "loops": {name: s.as_dict() for name, s in sorted(self.loops.items())},
                "missing_telemetry": dict(sorted(self.missing.items())),
            }
