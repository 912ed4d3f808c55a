"""One detection pass reads each quantity's window from the store once (DESIGN.md "One data
plane"): headroom, hot spots, fleets and the alert observations share what was read rather
than each reading the same GPU temperatures again. The store reader counts its reads
(``twin.store.windows.count_reads``); the pass runs on a small simulated, calibrated store."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from twin.calibrate.calibrate import calibrate, save_run
from twin.detect import detect, observations
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
