"""One detection pass reads each quantity's window from the store once (DESIGN.md "One data
plane"): headroom, hot spots, fleets and the alert observations share what was read rather
than each reading the same GPU temperatures again. The store reader counts its reads
(``twin.store.windows.count_reads``); the pass runs on a small simulated, calibrated store."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from twin.analysis.detect import detect, observations
from twin.calibrate.calibrate import calibrate, save_run
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator
from twin.site import load_site
from twin.store import Store
from twin.store.windows import count_reads, load_window

from .helpers import SMALL_SITE

START = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
SECONDS = 1800


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = load_site(SMALL_SITE)
    path = tmp_path_factory.mktemp("reads") / "reads.duckdb"
    sim = SiteSimulator(site, seed=3, start=START)
    with Store(path) as store:
        ing = Ingester(store, site, IngestLimits(max_past_s=0))
        batch: list[tuple[str, bytes]] = []
        for _ in range(SECONDS):
            batch.extend(sim.step())
        ing.ingest(batch)
        save_run(store, calibrate(store, site, window_s=SECONDS, holdout_s=300.0))
    return path


def by_window(reads: Counter) -> Counter:
    """Reads per (kind, quantity, start, end), whatever grid they were read on."""
    out: Counter = Counter()
    for (kind, q, start, end, _step), n in reads.items():
        out[(kind, q, start, end)] += n
    return out


def test_the_counter_counts_each_quantity_of_each_read(db: Path) -> None:
    with Store(db, read_only=True) as store, count_reads() as reads:
        end = START.replace(minute=20)
        start = START.replace(minute=10)
        load_window(store, "gpu", start, end, quantities=["temp_c", "power_w"])
        load_window(store, "gpu", start, end, quantities=["temp_c"], step_s=10.0)
    assert by_window(reads) == {
        ("gpu", "temp_c", start, end): 2,
        ("gpu", "power_w", start, end): 1,
    }


def test_one_detection_pass_reads_each_quantity_window_once(db: Path) -> None:
    site = load_site(SMALL_SITE)
    with Store(db, read_only=True) as store, count_reads() as reads:
        d = detect(store, site)
        obs = observations(d)
    assert not d.failures, d.failures
    assert d.headroom.rows and obs  # a full pass: every stage ran and had data
    windows = by_window(reads)
    kinds = {k for k, *_ in windows}
    assert {"gpu", "node", "pdu", "cdu"} <= kinds, kinds
    twice = {w: n for w, n in windows.items() if n > 1}
    assert not twice, f"windows read more than once in one pass: {twice}"


class _CountingConnection:
    """The store's connection, with the SQL it is given kept in ``sql``."""

    def __init__(self, con) -> None:  # type: ignore[no-untyped-def]
        self._con = con
        self.sql: list[str] = []

    def execute(self, sql: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.sql.append(sql)
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._con, name)


RESIDUAL_PARAMS = ("r_k_per_w", "c_j_per_k", "offset_k", "flow_ref_lpm")


def test_the_fits_a_pass_judges_by_are_read_once_per_run(db: Path, tmp_path: Path) -> None:
    """Every minute a pass asks for the residual's fits and for the fit standing (which asks
    for the fits with other parameters): both are answered from what was read for the run,
    and a newer run is read afresh."""
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(db.read_bytes())
    site = load_site(SMALL_SITE)
    with Store(copy) as store:
        run = store.latest_fit_run_id()
        assert run is not None
        fits = store.gpu_thermal_fits(run, RESIDUAL_PARAMS)
        standing = store.gpu_fit_standing(run)
        assert fits and all(f["run_id"] == run for f in fits.values())
        counting = _CountingConnection(store.con)
        store.con = counting  # type: ignore[assignment]
        for _ in range(3):  # three passes' worth, the two callers alternating
            assert store.gpu_thermal_fits(run, RESIDUAL_PARAMS) == fits
            assert store.gpu_fit_standing(run) == standing
        assert counting.sql == [], counting.sql
        store.con = counting._con
        run2 = save_run(store, calibrate(store, site, window_s=SECONDS, holdout_s=300.0))
        fits2 = store.gpu_thermal_fits(run2, RESIDUAL_PARAMS)
        assert set(fits2) == set(fits)
        assert all(f["run_id"] == run2 for f in fits2.values())
        assert store.gpu_fit_standing(run2) == ({}, {})


def test_the_live_pass_forecasts_the_load_once_per_forecast_step(tmp_path: Path) -> None:
    """After a day of node power the headroom's load paths come from the forecast, whose model
    selection costs 25 s at 313 racks over 14 days (bench_detect ``--history-days``): the live
    loop (``DetectionScheduler.run_once``, one pass a minute) makes it once per 5-min forecast
    step on a thread of its own and answers the passes from it, with the rows a forecast made
    in the pass would give; the first pass, with no forecast made yet, takes persistence and
    the first pass of the next step the previous step's forecast."""
    from datetime import timedelta

    from twin.analysis.detect import DetectionScheduler
    from twin.analysis.headroom import compute_headroom

    site = load_site(SMALL_SITE)
    start = datetime(2026, 11, 24, 0, 0, tzinfo=UTC)
    seed = SiteSimulator(site, seed=11, start=start - timedelta(hours=25), rate_hz=1 / 300)
    live = SiteSimulator(site, seed=11, start=start, rate_hz=0.1)
    with Store(tmp_path / "s.duckdb") as store:
        ing = Ingester(store, site, IngestLimits(max_past_s=0))
        for _ in range(300):  # 25 h of node power at 5 min: a day for the forecast
            ing.ingest([m for m in seed.step() if m[0].split("/")[3] == "node"])
        loop = DetectionScheduler(store, site)
        made: list[int] = []
        bases: list[set[str]] = []
        for minute in range(7):  # passes at 00:00:50, 00:01:50, ..., 00:06:50
            ing.ingest([m for _ in range(6) for m in live.step()])
            d = loop.run_once()
            assert d is not None and not d.failures, d and d.failures
            loop.forecasts.wait()  # as the loop's next pass, a minute later, finds it
            made.append(loop.forecasts.made)
            bases.append({r.basis for r in d.headroom.rows if r.kind == "rack"})
            if minute in (3, 6):  # served from the cache: what a forecast made now gives
                fresh = compute_headroom(store, site, now=d.now)
                assert [r.model_dump() for r in fresh.rows] == [
                    r.model_dump() for r in d.headroom.rows
                ]
        loop.store.close()
    forecast = {"forecast (2 of 2 racks; persistence for the rest)"}
    # the first pass finds the forecast still being made, and its rows say so
    assert len(bases[0]) == 1 and next(iter(bases[0])).startswith("persistence (the load")
    assert "is still being made" in next(iter(bases[0]))
    assert bases[1:] == [forecast] * 6
    assert made == [1, 1, 1, 1, 1, 2, 2]  # the step [00:05, 00:10) begins at the 6th pass
