"""Shared fixtures: a real MQTT broker on a free port, the alert hooks' recording servers,
a webhook receiver, and a running twin service (:func:`start_service`). Only fixtures (and the
hooks pytest needs) live here; the plain functions, classes and constants the tests share are in
tests/helpers.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from twin.broker import LocalBroker, start_broker
from twin.calibrate.calibrate import calibrate, save_run
from twin.service import Service, ServiceConfig
from twin.simulator import SiteSimulator, parse_fault
from twin.site import load_site

from .helpers import (
    API_TOKEN,
    REPO,
    RULES,
    SCENARIOS,
    SMALL_SITE,
    TEST_BROKER,
    HookHandler,
    Recorder,
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A fresh broker for one test: mosquitto when on PATH, else the embedded Python broker."""
    b = start_broker(TEST_BROKER, log_path=tmp_path / "broker.log")  # type: ignore[arg-type]
    yield b
    b.stop()


@pytest.fixture
def embedded_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """The embedded Python broker (MQTT 3.1.1 only), whatever else is installed."""
    b = start_broker("embedded", log_path=tmp_path / "broker.log")
    yield b
    b.stop()


@pytest.fixture(autouse=True)
def _keep_main_module() -> Iterator[None]:
    """Streamlit's AppTest runs page scripts as ``__main__``; a receiver child started later
    with multiprocessing's spawn would re-run that script. Put the real ``__main__`` back."""
    import sys

    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture
def servers() -> Iterator[dict[str, Recorder]]:
    recs = {s: Recorder(s) for s in ("webhook", "slack", "pagerduty", "alertmanager")}
    for r in recs.values():
        r.start()
    yield recs
    for r in recs.values():
        r.stop()


@pytest.fixture(scope="session")
def hook_url() -> Iterator[str]:
    """The URL of a webhook receiver on 127.0.0.1 (a real HTTP server answering 200)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), HookHandler)
    thread = threading.Thread(target=server.serve_forever, name="test-hook", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alerts"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def start_service(hook_url: str) -> Callable[..., Service]:
    """A factory of running twin services (:class:`twin.service.Service`), built as `dctwin
    serve` builds one but without a broker, and fast: ``minutes`` simulated minutes of a site
    (the small site by default) with a CDU pump failing at minute 10 are fed through the
    service's ingester, calibrated, and passed through two detection passes with the alert
    rules of ``deploy/alert_rules.yaml`` (so ``cdu_pump_lost`` fires; notifications go to a
    webhook receiver); then the service starts (the API on a free port, what-if jobs on the
    shipped bundles). The caller stops it (``service.stop()``)."""

    def start(
        db: Path,
        *,
        site_path: Path = SMALL_SITE,
        minutes: int = 20,
        faults: tuple[str, ...] = ("pump_failure:cdu-1/pump1@10m",),
        token: str | None = API_TOKEN,
        seed: int = 3,
        rules: Path = RULES,
    ) -> Service:
        site = load_site(site_path)
        hooks = db.with_name(db.name + ".hooks.yaml")
        hooks.write_text(f"hooks:\n  - {{type: webhook, name: ops, url: '{hook_url}'}}\n")
        service = Service(
            ServiceConfig(
                db=db,
                site=site,
                max_past_s=0,
                calibrate_every_s=0,
                detect_every_s=3600.0,
                rules=rules,
                hooks=hooks,
                api_port=0,
                api_token=token,
                whatif_bundles=REPO / "sample_telemetry",
                whatif_scenarios=SCENARIOS,
            )
        )
        try:
            start = (datetime.now(UTC) - timedelta(minutes=minutes)).replace(microsecond=0)
            sim = SiteSimulator(
                site, seed=seed, start=start, faults=[parse_fault(f) for f in faults]
            )
            for _ in range(minutes):
                batch: list[tuple[str, bytes]] = []
                for _ in range(60):
                    batch.extend(sim.step())
                service.ingester.ingest(batch)
            service.store.rollup()
            result = calibrate(service.store, site, window_s=minutes * 60.0, holdout_s=300.0)
            save_run(service.store, result)
            assert service.detector is not None
            service.detector.run_once()
            service.detector.run_once()
            return service.start()
        except BaseException:
            service.stop()
            raise

    return start
