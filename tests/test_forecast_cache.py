"""The live loop's load forecast (``twin.forecast.ForecastCache``): made once per forecast
step; in the background (``dctwin serve``) no pass waits for it, a forecast more than
``max_age_steps`` old is not used, and one that fails is logged once and not retried within
its step. The forecast itself is replaced by a recorder here: what is tested is when the cache
makes one and what it answers with (the real forecast through the live pass:
tests/test_detect_reads.py)."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from twin.forecast import ForecastCache
from twin.forecast import forecast as fmod
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE

T0 = datetime(2026, 11, 24, 0, 0, 30, tzinfo=UTC)


class Recorder:
    """Stands for forecast_site: returns the ``now`` it was asked for (or raises ``fail``),
    after ``release`` is set."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[datetime] = []
        self.fail = fail
        self.release = threading.Event()
        self.release.set()

    def __call__(self, store, site, now, horizon_s, step_s):  # type: ignore[no-untyped-def]
        self.calls.append(now)
        self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        return now


SITE = load_site(SMALL_SITE)


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    with Store(tmp_path / "s.duckdb") as s:
        yield s


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(fmod, "forecast_site", rec)
    return rec


def test_in_the_background_no_pass_waits_and_a_stale_forecast_is_not_used(
    store: Store, fake: Recorder
) -> None:
    cache = ForecastCache(background=True, max_age_steps=2)

    def at(minutes: float):  # type: ignore[no-untyped-def]
        return cache.get(store, SITE, T0 + timedelta(minutes=minutes), 4200.0, 300.0)

    fake.release.clear()  # the first forecast is slow: the pass does not wait for it
    with pytest.raises(ValueError, match="still being made"):
        at(0)
    with pytest.raises(ValueError, match="still being made"):
        at(1)  # the same step: no second job while the first runs
    fake.release.set()
    cache.wait()
    assert at(2) == T0 and at(4) == T0 and len(fake.calls) == 1
    assert at(5) == T0  # a new step: the last step's forecast while this one's is made
    cache.wait()
    assert at(6) == T0 + timedelta(minutes=5) and len(fake.calls) == 2
    fake.release.clear()
    # three steps later (the loop stalled): too old to use, and the new one is not made yet
    with pytest.raises(ValueError, match="still being made"):
        at(20)
    fake.release.set()
    cache.wait()
    assert at(21) == T0 + timedelta(minutes=20) and cache.made == 3
    fake.release.clear()  # another forecast step is another forecast, whatever its age
    with pytest.raises(ValueError, match="still being made"):
        cache.get(store, SITE, T0 + timedelta(minutes=21), 4200.0, 600.0)
    fake.release.set()
    cache.wait()


def test_a_failing_forecast_is_logged_once_and_not_retried_within_its_step(
    store: Store, fake: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail = RuntimeError("no memory for the scoring origins")
    cache = ForecastCache(background=True)
    caplog.set_level(logging.WARNING, logger="twin.forecast.forecast")
    said = []
    for minutes in (0, 1, 2, 5, 6):
        with pytest.raises(ValueError) as e:
            cache.get(store, SITE, T0 + timedelta(minutes=minutes), 4200.0, 300.0)
        said.append(str(e.value))
        cache.wait()
    assert len(fake.calls) == 2  # once in each step
    # the later calls of a step say it failed, and why (the first, which starts it, may
    # find it still being made or failed already)
    failed = "the load forecast of this step failed (RuntimeError: no memory for the scoring"
    assert all(said[i].startswith(failed) for i in (1, 2, 4)), said
    assert all(("still being made" in said[i]) != said[i].startswith(failed) for i in (0, 3))
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        "load forecast failed (headroom on persistence): RuntimeError: no memory for the"
        " scoring origins"
    ]


def test_without_the_background_each_step_is_made_once_in_the_call(
    store: Store, fake: Recorder
) -> None:
    cache = ForecastCache()
    got = [cache.get(store, SITE, T0 + timedelta(minutes=m), 4200.0, 300.0) for m in (0, 3, 5, 9)]
    assert got == [T0, T0, T0 + timedelta(minutes=5), T0 + timedelta(minutes=5)]
    assert cache.made == 2


def test_closing_interrupts_a_forecast_query_so_the_service_can_close_its_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DuckDB refuses to close a connection whose cursor is running a query (the forecast's
    read of node power, seconds at a big site): the detection loop's ``stop()`` closes the
    cache first, which interrupts that query, then its own connection and the service's."""
    started = threading.Event()

    def slow_read(store, site, now, horizon_s, step_s):  # type: ignore[no-untyped-def]
        started.set()
        return store.con.execute(
            "SELECT sum(i * j) FROM range(3000000000) t(i), range(3) u(j)"
        ).fetchall()

    monkeypatch.setattr(fmod, "forecast_site", slow_read)
    root = Store(tmp_path / "s.duckdb")
    loop_store = root.cursor()  # as DetectionScheduler holds it
    cache = ForecastCache(background=True)
    with pytest.raises(ValueError, match="still being made"):
        cache.get(loop_store, SITE, T0, 4200.0, 300.0)
    assert started.wait(10)
    time.sleep(0.2)  # inside the query
    cache.close()  # warns when its query does not stop within its 10 s
    loop_store.close()
    root.close()
    cache.wait(10)  # the query (minutes of work) was interrupted: the job has ended
    assert not cache._job.is_alive()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with pytest.raises(ValueError):  # closed: no new forecast is started
        cache.get(Store(tmp_path / "t.duckdb"), SITE, T0 + timedelta(minutes=5), 4200.0, 300.0)
    assert cache._job is not None and not cache._job.is_alive()
