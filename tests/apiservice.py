"""A twin service for the API, console and browser tests, built in-process and fast.

Twenty simulated minutes of a site (the small site by default) with a CDU pump failing at
minute 10 are ingested through the real ingest path, calibrated, passed through one detection
pass with the alert rules of ``deploy/alert_rules.yaml`` (so ``cdu_pump_lost`` fires), and
served by the real API server on a free port, with what-if jobs on the shipped demo bundle.
A webhook hook that nobody answers keeps the notifications in the outbox, as a hook that is
down would.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from twin.alerts import AlertEngine, Outbox, Topology, load_rules, parse_hooks
from twin.api import ApiContext, ApiServer
from twin.api.whatif import whatif_router
from twin.calibrate.calibrate import calibrate, save_run
from twin.detect import DetectionScheduler
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator, parse_fault
from twin.site import Site, load_site
from twin.store import Store

REPO = Path(__file__).resolve().parents[1]
SMALL_SITE = REPO / "sample_telemetry" / "small_site.yaml"
RULES = REPO / "deploy" / "alert_rules.yaml"
SCENARIOS = REPO / "sample_telemetry" / "scenarios"
TOKEN = "test-token-0123456789"
PUMP_KEY = "dctwin/small/cdu_pump_lost/cdu/cdu-1"


@dataclass
class RunningService:
    server: ApiServer
    store: Store
    site: Site
    engine: AlertEngine
    detector: DetectionScheduler

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()
        self.detector.store.close()
        self.store.close()


def start_service(
    db: Path,
    *,
    site_path: Path = SMALL_SITE,
    minutes: int = 20,
    faults: tuple[str, ...] = ("pump_failure:cdu-1/pump1@10m",),
    token: str | None = TOKEN,
    seed: int = 3,
) -> RunningService:
    site = load_site(site_path)
    start = (datetime.now(UTC) - timedelta(minutes=minutes)).replace(microsecond=0)
    sim = SiteSimulator(site, seed=seed, start=start, faults=[parse_fault(f) for f in faults])
    store = Store(db)
    ingester = Ingester(store, site, IngestLimits(max_past_s=0))
    for _ in range(minutes):
        batch: list[tuple[str, bytes]] = []
        for _ in range(60):
            batch.extend(sim.step())
        ingester.ingest(batch)
    store.rollup()
    save_run(store, calibrate(store, site, window_s=minutes * 60.0, holdout_s=300.0))
    hooks = parse_hooks(
        {"hooks": [{"type": "webhook", "name": "ops", "url": "http://127.0.0.1:9/"}]}
    )
    outbox = Outbox(store.cursor(), hooks)
    engine = AlertEngine(load_rules(RULES), Topology.from_site(site), outbox)
    detector = DetectionScheduler(store, site, interval_s=3600.0, engine=engine)
    detector.run_once()
    detector.run_once()
    ctx = ApiContext(
        store, site=site, ingester=ingester, detector=detector, engine=engine, token=token
    )
    ctx.routers.append(
        whatif_router(ctx, REPO / "sample_telemetry", SCENARIOS, db.with_name(db.name + ".whatif"))
    )
    server = ApiServer(ctx, port=0).start()
    return RunningService(server, store, site, engine, detector)
