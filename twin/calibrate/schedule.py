"""Refit on a schedule inside `dctwin serve`: a thread with its own connection to the store.

Progressive: the first fit comes as soon as the store holds :data:`FIRST_WINDOW_S` of GPU
telemetry (checked every :data:`PROBE_S`), on the data there is (the holdout shrunk in the
same ratio as the window), so a fresh service has model-based hot spots and drift within
15 minutes, not after ``--calibrate-every``. Until the window is full, the next fit comes when
the data has doubled; then every ``interval_s``. Each fit's standard errors are those of the
data it saw: a short window gives wide ones, and a parameter they leave unidentified is
stored unusable with that reason, never as a number.

With a :class:`twin.health.ServiceHealth`, each pass reports ``ok("calibration")`` (a pass
with no GPU samples to fit is skipped, not failed) or ``error("calibration", "<exception
type>: <message>")``; a failure is logged with its traceback once per distinct error.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from twin.calibrate.calibrate import calibrate, save_run
from twin.health import ServiceHealth
from twin.procs import lower_this_thread
from twin.site import Site
from twin.store import Store
from twin.store.reads import sample_span

log = logging.getLogger(__name__)

#: The name this loop reports under in :class:`twin.health.ServiceHealth`.
LOOP = "calibration"
#: Least GPU telemetry for a first fit: 10 minutes, of which 5/6 are fitted (500 s, over the
#: 300 s an RC model and a capture fraction need, twin.calibrate.calibrate.MIN_RC_S) and 1/6
#: held out, as the default 2 h window holds out 20 minutes. [s]
FIRST_WINDOW_S = 600.0
#: How often a service without a first fit looks whether enough data has arrived. [s]
PROBE_S = 60.0


class CalibrationScheduler:
    """Calibrate every ``interval_s`` on the last ``window_s`` of telemetry, and store the run."""

    def __init__(
        self,
        store: Store,
        site: Site,
        *,
        interval_s: float,
        window_s: float = 7200.0,
        holdout_s: float = 1200.0,
        health: ServiceHealth | None = None,
        probe_s: float = PROBE_S,
        nice: int = 0,
    ):
        """``nice``: how much lower than the process the loop's thread runs (Linux)."""
        self.store = store.cursor()
        self.nice = nice
        self.site = site
        self.interval_s = interval_s
        self.window_s = window_s
        self.holdout_s = holdout_s
        self.health = health
        self.probe_s = probe_s
        #: the window of the last successful run (0 before the first) [s]
        self.last_window_s = 0.0
        self.runs = 0
        self.failures = 0
        #: the error text of the last pass ("" when it succeeded): what was logged last
        self.last_error = ""
        #: when the loop's next pass is due (UTC; None before :meth:`start`)
        self.next_pass_at: datetime | None = None
        if health is not None:
            health.register(LOOP)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dctwin-calibrate", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        self.store.close()

    def plan(self) -> tuple[float, float] | None:
        """Window and holdout of a run now: the configured ones, or while the store holds less
        GPU telemetry than the window, its span with the holdout in the same ratio; None (and
        why, logged) while it holds less than :data:`FIRST_WINDOW_S`. A window configured at
        :data:`FIRST_WINDOW_S` or shorter is always used as it is."""
        oldest, newest = sample_span(self.store, "gpu")
        if newest is None:
            log.info("calibration skipped: the store holds no GPU samples yet")
            return None
        if self.window_s <= FIRST_WINDOW_S:
            return self.window_s, self.holdout_s
        span_s = (newest - oldest).total_seconds()
        if span_s < FIRST_WINDOW_S:
            log.info("calibration waits: %.0f s of GPU telemetry < %.0f s", span_s, FIRST_WINDOW_S)
            return None
        window_s = min(self.window_s, span_s)
        return window_s, self.holdout_s * window_s / self.window_s

    def run_once(self) -> int | None:
        """One calibration now; returns its run id, or None when there was nothing to fit.

        Raises what calibration raised; :meth:`_loop` reports it."""
        planned = self.plan()
        if planned is None:
            return None
        window_s, holdout_s = planned
        result = calibrate(self.store, self.site, window_s=window_s, holdout_s=holdout_s)
        run_id = save_run(self.store, result)
        self.last_window_s = window_s
        self.runs += 1
        usable = sum(p["usable"] for p in result["params"])
        log.info(
            "calibration run %d: %d of %d parameters usable, %d events, %.1f s",
            run_id,
            usable,
            len(result["params"]),
            len(result["events"]),
            result["run"]["seconds"],
        )
        for e in result["events"]:
            log.warning("calibration event: %s %s", e["id"], e["detail"])
        return run_id

    def run_and_report(self) -> int | None:
        """:meth:`run_once`, its outcome reported to health and the log (never raises)."""
        try:
            run_id = self.run_once()
        except Exception as e:  # never take the service down; say what failed, once
            self.failures += 1
            text = f"{type(e).__name__}: {e}"
            if text != self.last_error:
                log.error(
                    "calibration failed; the service goes on and retries next time: %s",
                    text,
                    exc_info=e,
                )
            self.last_error = text
            if self.health is not None:
                self.health.error(LOOP, text)
            return None
        if self.last_error:
            log.info("calibration recovered (was failing: %s)", self.last_error)
        self.last_error = ""
        if self.health is not None:
            self.health.ok(LOOP)
        return run_id

    def next_wait_s(self, failed: bool) -> float:
        """Seconds to the next pass: ``probe_s`` until a first fit, then the span of the last
        window (the data doubles) until the window is full, then ``interval_s``; after a
        failure, ``interval_s``."""
        if failed:
            return self.interval_s
        if self.runs == 0:
            return min(self.probe_s, self.interval_s)
        if self.last_window_s < self.window_s:
            return min(self.interval_s, max(self.probe_s, self.last_window_s))
        return self.interval_s

    def expected_first_fit_at(self, span_s: float, now: datetime | None = None) -> datetime:
        """When the first fit should come, given ``span_s`` of GPU telemetry in the store now:
        the first of the loop's passes (every ``probe_s`` from :attr:`next_pass_at`) at which
        the store holds :data:`FIRST_WINDOW_S`, telemetry arriving in real time."""
        now = now or datetime.now(UTC)
        short_s = 0.0 if self.window_s <= FIRST_WINDOW_S else max(0.0, FIRST_WINDOW_S - span_s)
        due = now + timedelta(seconds=short_s)
        first = self.next_pass_at or now + timedelta(seconds=self.next_wait_s(failed=False))
        step = timedelta(seconds=min(self.probe_s, self.interval_s))
        if first >= due:
            return first
        ticks = -(-(due - first) // step)  # passes after the next one, rounded up
        return first + ticks * step

    def _loop(self) -> None:
        lower_this_thread(self.nice)
        wait = self.next_wait_s(failed=False)
        self.next_pass_at = datetime.now(UTC) + timedelta(seconds=wait)
        while not self._stop.wait(wait):
            failures = self.failures
            self.run_and_report()
            wait = self.next_wait_s(failed=self.failures > failures)
            self.next_pass_at = datetime.now(UTC) + timedelta(seconds=wait)
