"""Refit on a schedule inside `dctwin serve`: a thread with its own connection to the store."""

from __future__ import annotations

import logging
import threading

from twin.calibrate.calibrate import calibrate, save_run
from twin.site import Site
from twin.store import Store

log = logging.getLogger(__name__)


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
    ):
        self.store = store.cursor()
        self.site = site
        self.interval_s = interval_s
        self.window_s = window_s
        self.holdout_s = holdout_s
        self.runs = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dctwin-calibrate", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.store.close()

    def run_once(self) -> int | None:
        """One calibration now; returns its run id, or None when there was nothing to fit."""
        try:
            result = calibrate(
                self.store, self.site, window_s=self.window_s, holdout_s=self.holdout_s
            )
        except ValueError as e:  # e.g. no GPU samples yet
            log.info("calibration skipped: %s", e)
            return None
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

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # never take the service down; say what failed
                self.failures += 1
                log.exception("calibration failed; the service goes on and retries next time")
