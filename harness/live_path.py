"""The service's own live path over simulated time: what `dctwin serve` runs, faster than real.

:func:`drive` builds a :class:`twin.service.Service` on a store (no broker, no API unless asked),
seeds it the way `dctwin demo` does (``--seed-calibration``), steps the site simulator and hands
each poll's messages to the service's own ingester, and runs the service's own calibration
scheduler (its first-fit probe, the doubling windows, then every ``calibrate_every_s``) and
detection pass (every ``detect_every_s``, and its breached-now pass every ``fast_every_s``)
at the simulated times `dctwin serve` would run them. Every notification the service's alert
engine sends lands in the store's ``alert_history`` (and, with ``hooks``, goes out through the
outbox's delivery workers), exactly as in production: nothing here evaluates a rule itself.

This is a harness for tests and benchmarks (bench/bench_alerts.py's live path); it is not
shipped in the wheel.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from twin.service import Service, ServiceConfig
from twin.simulator import SiteSimulator
from twin.simulator.faults import Fault
from twin.site import load_site

__all__ = ["LiveRun", "drive", "notifications"]

#: The ingest's acceptance window is against the wall clock; simulated days may lie anywhere.
_ANY_PAST_S = 10 * 365 * 86400.0


@dataclass
class LiveRun:
    """What one drive did: the service's notifications (alert_history, in order), and timings."""

    notifications: list[dict[str, Any]]
    passes: int = 0
    fast_passes: int = 0
    calibrations: list[int] = field(default_factory=list)
    timing_s: dict[str, float] = field(default_factory=dict)


def notifications(service: Service) -> list[dict[str, Any]]:
    """Every notification the service's engine sent, oldest first: the payload of each
    ``alert_history`` row (a :class:`twin.alerts.Notification` as JSON) with its time."""
    rows = service.store.con.execute(
        "SELECT created_at, payload FROM alert_history WHERE status IN ('firing', 'resolved')"
        " ORDER BY created_at, event_id"
    ).fetchall()
    out = []
    for at, payload in rows:
        note = json.loads(payload)
        note["at"] = at.isoformat()
        out.append(note)
    return out


def drive(
    site_path: Path,
    db: Path,
    *,
    start: datetime,
    duration_s: float,
    rules: Path | None,
    hooks: Path | None = None,
    seed: int = 0,
    faults: Sequence[Fault] = (),
    seed_calibration: Path | None = None,
    tick_s: float = 10.0,
    resolution_s: float | None = None,
    detect_every_s: float = 60.0,
    fast_every_s: float | None = 10.0,
    calibrate_every_s: float = 3600.0,
    calibrate_window_s: float = 7200.0,
    calibrate_holdout_s: float = 1200.0,
    on_tick: Callable[[float, SiteSimulator], None] | None = None,
    on_pass: Callable[[Service, datetime], None] | None = None,
    console_url: str | None = None,
    on_end: Callable[[str], None] | None = None,
) -> LiveRun:
    """Simulate ``duration_s`` from ``start`` and run the service's live path over it.

    ``tick_s``: the simulator's step; ``resolution_s`` (default ``tick_s``): how often a poll's
    messages reach the ingest. ``on_tick(t_s, sim)`` after every tick (ground truth);
    ``on_pass(service, now)`` after every detection pass. With ``hooks`` the outbox's delivery
    workers run (real HTTP) and are stopped, drained, at the end. ``on_end(url)``: at the end,
    with the service's HTTP API serving the store on a free port at ``url``.
    """
    site = load_site(site_path)
    every = max(1, round((resolution_s or tick_s) / tick_s))
    sim = SiteSimulator(site, seed=seed, start=start, rate_hz=1.0 / tick_s, faults=faults)
    config = ServiceConfig(
        db=db,
        site=site,
        broker=None,
        max_future_s=_ANY_PAST_S,
        max_past_s=_ANY_PAST_S,
        calibrate_every_s=calibrate_every_s,
        calibrate_window_s=calibrate_window_s,
        calibrate_holdout_s=calibrate_holdout_s,
        detect_every_s=detect_every_s,
        fast_every_s=fast_every_s or 0.0,
        rules=rules,
        hooks=hooks,
        console_url=console_url,
        api=on_end is not None,
        api_port=0,
        seed_calibration=seed_calibration,
        background_nice=0,
    )
    run = LiveRun([])
    timing = dict.fromkeys(("simulate_s", "ingest_s", "calibrate_s", "detect_s"), 0.0)
    svc = Service(config)  # built, not started: this loop runs its parts on simulated time
    try:
        if svc.delivery is not None and hooks is not None:
            svc.delivery.start()  # real HTTP to the hooks, as the service sends
            svc._started.append(svc.delivery)
        _loop(svc, sim, run, timing, duration_s, tick_s, every, on_tick, on_pass)
        if svc.delivery is not None and hooks is not None:
            _drain(svc, timeout_s=30.0)
        run.notifications = notifications(svc)
        if on_end is not None:
            from twin.api import ApiServer

            assert svc.ctx is not None
            svc.api_server = ApiServer(svc.ctx, host="127.0.0.1", port=0).start()
            svc._started.append(svc.api_server)
            assert svc.url is not None
            on_end(svc.url)
    finally:
        svc.stop()
    run.timing_s = {k: round(v, 1) for k, v in timing.items()}
    return run


def _loop(
    svc: Service,
    sim: SiteSimulator,
    run: LiveRun,
    timing: dict[str, float],
    duration_s: float,
    tick_s: float,
    every: int,
    on_tick: Callable[[float, SiteSimulator], None] | None,
    on_pass: Callable[[Service, datetime], None] | None,
) -> None:
    """Tick the simulator; at each due time ingest what was polled, then calibrate, detect."""
    cal, det = svc.calibrator, svc.detector
    assert det is not None, "detect_every_s must be > 0"
    detect_s, fast_s = svc.config.detect_every_s, svc.config.fast_every_s
    next_cal = cal.next_wait_s(failed=False) if cal is not None else None
    next_det = detect_s
    next_fast = fast_s if fast_s > 0 else None
    batch: list[tuple[str, bytes]] = []
    for k in range(round(duration_s / tick_s)):
        c0 = time.perf_counter()
        if k % every == 0:
            batch.extend(sim.step())
        else:
            sim.advance()
        t_s = k * tick_s
        if on_tick is not None:
            on_tick(t_s, sim)
        timing["simulate_s"] += time.perf_counter() - c0
        due_fast = next_fast is not None and t_s >= next_fast
        due_det = t_s >= next_det
        due_cal = next_cal is not None and t_s >= next_cal
        if not (due_fast or due_det or due_cal):
            continue
        c1 = time.perf_counter()
        if batch:
            svc.ingester.ingest(batch)
            batch = []
        timing["ingest_s"] += time.perf_counter() - c1
        if due_cal:
            assert cal is not None
            c2 = time.perf_counter()
            failures = cal.failures
            run_id = cal.run_and_report()
            if run_id is not None:
                run.calibrations.append(run_id)
            next_cal = t_s + cal.next_wait_s(failed=cal.failures > failures)
            timing["calibrate_s"] += time.perf_counter() - c2
        c3 = time.perf_counter()
        if due_det:  # the full pass evaluates the breached-now metrics too
            det.run_once()
            # the load forecast the pass started (on its own thread, as served) is done
            # before the next pass: what a site whose forecast takes less than a pass sees
            det.forecasts.wait()
            run.passes += 1
            next_det = t_s + detect_s
            if on_pass is not None:
                on_pass(svc, sim.sim_time)
        elif due_fast:
            det.run_fast_once()
            run.fast_passes += 1
        if next_fast is not None and (due_fast or due_det):
            next_fast = t_s + fast_s
        timing["detect_s"] += time.perf_counter() - c3
    if batch:
        svc.ingester.ingest(batch)


def _drain(svc: Service, timeout_s: float) -> None:
    """Wait until the outbox has delivered (or given up on) everything it holds."""
    outbox = svc.delivery.outbox if svc.delivery is not None else None
    deadline = time.monotonic() + timeout_s
    while outbox is not None and outbox.pending() and time.monotonic() < deadline:
        time.sleep(0.2)
