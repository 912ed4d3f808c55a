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
