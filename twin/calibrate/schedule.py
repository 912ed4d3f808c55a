"""Refit on a schedule inside `dctwin serve`: a thread with its own connection to the store.

With a :class:`twin.health.ServiceHealth`, each pass reports ``ok("calibration")`` (a pass
with no GPU samples to fit is skipped, not failed) or ``error("calibration", "<exception
type>: <message>")``; a failure is logged with its traceback once per distinct error.
"""

from __future__ import annotations

import logging
import threading

from twin.calibrate.calibrate import calibrate, save_run
from twin.health import ServiceHealth
from twin.site import Site
from twin.store import Store

log = logging.getLogger(__name__)

#: The name this loop reports under in :class:`twin.health.ServiceHealth`.
LOOP = "calibration"


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
    ):
        self.store = store.cursor()
        self.site = site
        self.interval_s = interval_s
        self.window_s = window_s
        self.holdout_s = holdout_s
        self.health = health
        self.runs = 0
        self.failures = 0
        #: the error text of the last pass ("" when it succeeded): what was logged last
        self.last_error = ""
        if health is not None:
            health.register(LOOP)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dctwin-calibrate", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.store.close()

    def run_once(self) -> int | None:
        """One calibration now; returns its run id, or None when there was nothing to fit.

        Raises what calibration raised; :meth:`_loop` reports it."""
        if self.store.con.execute("SELECT max(ts) FROM gpu").fetchall()[0][0] is None:
            log.info("calibration skipped: the store holds no GPU samples yet")
            return None
        result = calibrate(self.store, self.site, window_s=self.window_s, holdout_s=self.holdout_s)
        run_id = save_run(self.store, result)
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

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.run_and_report()
