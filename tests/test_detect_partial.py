"""Detection and alerting on whatever telemetry exists (issue 12: "Nothing stops the twin").

Real sites lack a kind for days (no metered PDUs, no switch telemetry) or lose one for a while.
Fourteen simulated minutes of the small site, with pump 1 of cdu-1 stopped from minute 7 to
minute 11, are filtered as a site without a kind would send them, ingested through the real
ingest path, calibrated and passed through the service's detection loop
(:class:`twin.analysis.detect.DetectionScheduler`, one pass per minute as `dctwin serve` runs it)
with the shipped ``deploy/alert_rules.yaml``. What was paged is read from the alert history the
engine keeps in the store (``GET /api/v1/alerts?history=N``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from collectors.contract import KINDS
from twin.alerts import AlertEngine, Outbox, Topology, load_rules
from twin.analysis.detect import Detection, DetectionScheduler, observations
from twin.calibrate.schedule import CalibrationScheduler
from twin.health import ServiceHealth
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator, parse_fault
from twin.site import Site, load_site
from twin.store import Store

from .helpers import REPO, SMALL_SITE

START = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
MINUTES = 14
#: pump 1 of cdu-1 stops at minute 7 and is back at minute 11
FAULT = "pump_failure:cdu-1/pump1@7m+4m"
PUMP_KEY = "dctwin/small/cdu_pump_lost/cdu/cdu-1"
CALIBRATE_AFTER_MIN = 6

Minute = list[tuple[str, bytes]]
Keep = Callable[[int, str, bytes], bool]  # (minute, topic, payload) -> ingest it?


def _kind(topic: str) -> str:
    return topic.split("/")[3]  # dctwin/v1/<site>/<kind>/<source>


@pytest.fixture(scope="module")
def site() -> Site:
    return load_site(SMALL_SITE)


@pytest.fixture(scope="module")
def minutes(site: Site) -> list[Minute]:
    """The simulated messages, one list per minute, every kind present."""
    sim = SiteSimulator(site, seed=3, start=START, faults=[parse_fault(FAULT)])
    out = []
    for _ in range(MINUTES):
        batch: Minute = []
        for _ in range(60):
            batch.extend(sim.step())
        out.append(batch)
    return out


class Service:
    """Ingest, calibration and detection as `dctwin serve` wires them, on one store."""

    def __init__(self, site: Site, db: Path):
        self.site = site
        self.store = Store(db)
        self.health = ServiceHealth()
        self.ingester = Ingester(self.store, site, IngestLimits(max_past_s=0))
        rules = load_rules(REPO / "deploy" / "alert_rules.yaml")
        self.engine = AlertEngine(rules, Topology.from_site(site), Outbox(self.store.cursor(), []))
        self.detector = DetectionScheduler(
            self.store, site, interval_s=3600.0, engine=self.engine, health=self.health
        )
        self.calibrator = CalibrationScheduler(
            self.store, site, interval_s=3600.0, window_s=360.0, holdout_s=60.0, health=self.health
        )
        self.missing_seen: list[set[str]] = []
        self.passes: list[Detection] = []
        self.k_to_slowdown: list[float] = []

    def run(self, minutes: list[Minute], keep: Keep, after: Callable[[int], None] | None = None):
        for m, batch in enumerate(minutes):
            self.ingester.ingest([(t, p) for t, p in batch if keep(m, t, p)])
            if m + 1 == CALIBRATE_AFTER_MIN:
                self.calibrator.run_and_report()
            if after is not None:
                after(m)
            d = self.detector.run_once()
            assert d is not None
            self.missing_seen.append(set(d.missing))
            self.passes.append(d)
            self.k_to_slowdown += [
                o.value for o in observations(d) if o.metric == "headroom.gpu.k_to_slowdown"
            ]

    def paged(self) -> list[tuple[str, str]]:
        rows = self.store.con.execute(
            "SELECT status, dedup_key FROM alert_history ORDER BY created_at, status"
        ).fetchall()
        return [(s, k) for s, k in rows]

    def close(self) -> None:
        self.detector.store.close()
        self.calibrator.store.close()
        self.store.close()


@pytest.fixture
def service(site: Site, tmp_path: Path):
    made: list[Service] = []

    def make() -> Service:
        s = Service(site, tmp_path / f"twin{len(made)}.duckdb")
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _loops_healthy(health: ServiceHealth) -> None:
    loops = health.snapshot()["loops"]
    for name in ("detection", "calibration"):
        assert loops[name]["errors_total"] == 0, loops[name]
        assert not loops[name]["failing"], loops[name]
        assert loops[name]["successes_total"] >= 1, loops[name]


@pytest.mark.slow
@pytest.mark.parametrize("absent", [k for k in KINDS if k != "cdu"])  # cdu: the next test
def test_pump_failure_pages_once_and_resolves_without_a_kind(
    absent: str, minutes: list[Minute], service
) -> None:
    svc = service()
    svc.run(minutes, lambda m, topic, payload: _kind(topic) != absent)
    assert svc.paged() == [("firing", PUMP_KEY), ("resolved", PUMP_KEY)]
    _loops_healthy(svc.health)
    missing = svc.health.snapshot()["missing_telemetry"]
    assert list(missing) == [absent]
    assert missing[absent].startswith(f"no {absent} telemetry in the last 60 s: ")
    assert all(seen == {absent} for seen in svc.missing_seen)


@pytest.mark.slow
def test_pump_failure_without_cdu_telemetry_is_not_paged_and_health_says_why(
    minutes: list[Minute], service
) -> None:
    """Without CDU telemetry the pump rule has nothing to read. Losing one of two pumps
    (N+1) leaves the GPUs tens of kelvin from slowdown, so no other shipped rule catches it
    either: the honest outcome is no page, and health naming the missing kind and the rule
    that cannot fire."""
    svc = service()
    svc.run(minutes, lambda m, topic, payload: _kind(topic) != "cdu")
    assert svc.paged() == []
    assert min(svc.k_to_slowdown) > 8.0  # gpu_temp_high (<= 5 K, clears at 8 K) had no cause
    _loops_healthy(svc.health)
    missing = svc.health.snapshot()["missing_telemetry"]
    assert list(missing) == ["cdu"]
    assert missing["cdu"].startswith("no cdu telemetry in the last 60 s: ")
    assert "cdu_pump_lost cannot fire" in missing["cdu"]


def test_empty_store_names_every_kind_missing_until_telemetry_arrives(site: Site, service) -> None:
    svc = service()
    assert svc.detector.run_once() is None  # nothing to detect on: skipped, not failed
    snap = svc.health.snapshot()
    assert sorted(snap["missing_telemetry"]) == sorted(KINDS)
    assert snap["loops"]["detection"]["successes_total"] == 1
    assert snap["loops"]["detection"]["errors_total"] == 0
    assert svc.calibrator.run_and_report() is None  # no GPU samples: skipped
    assert not svc.health.snapshot()["loops"]["calibration"]["failing"]
    sim = SiteSimulator(site, seed=3, start=START)
    minute = [m for _ in range(60) for m in sim.step()]
    svc.ingester.ingest([(t, p) for t, p in minute if _kind(t) != "link"])
    assert svc.detector.run_once() is not None
    assert list(svc.health.snapshot()["missing_telemetry"]) == ["link"]


def _partial(m: int, topic: str, payload: bytes) -> bool:
    """PDUs stop from minute 2 to minute 9 (stale, then back); one PDU and one link never
    report."""
    kind = _kind(topic)
    if kind == "pdu" and (2 <= m < 9 or topic.endswith("/pdu-r02-b")):
        return False
    return not (kind == "link" and topic.endswith("/leaf-r02"))


def _thin(batch: Minute) -> Minute:
    """Every GPU message without its odd-numbered GPUs' samples, every CDU message without
    pump 2's record: devices of a kind that report while others of it do not."""
    out: Minute = []
    for topic, payload in batch:
        if _kind(topic) in ("gpu", "cdu"):
            msg = json.loads(payload)
            msg["samples"] = [
                s
                for s in msg["samples"]
                if not s["id"].endswith("/pump2")
                and not (":" in s["id"] and int(s["id"].rsplit(":", 1)[1]) % 2 == 1)
            ]
            payload = json.dumps(msg).encode()
        out.append((topic, payload))
    return out


@pytest.mark.slow
def test_partial_and_stale_telemetry_keeps_detecting_and_clears_the_missing_entry(
    minutes: list[Minute], service
) -> None:
    svc = service()
    svc.run([_thin(b) for b in minutes], _partial)
    assert svc.paged() == [("firing", PUMP_KEY), ("resolved", PUMP_KEY)]
    _loops_healthy(svc.health)
    # no PDU sample in the last 60 s from the pass of minute 2 on, back at minute 9
    assert [("pdu" in seen) for seen in svc.missing_seen] == [m in range(2, 9) for m in range(14)]
    assert svc.health.snapshot()["missing_telemetry"] == {}  # cleared when PDUs returned
    for m, d in enumerate(svc.passes):  # stale PDUs give no rack or phase headroom "now"
        kinds = {r.kind for r in d.headroom.rows}
        assert ("rack" in kinds) == ("pdu_phase" in kinds) == (m not in range(2, 9)), (m, kinds)
        assert {"gpu", "cdu", "loop", "link"} <= kinds, (m, kinds)
    last = svc.detector.last
    assert last is not None
    gpus = {r.id for r in last.headroom.rows if r.kind == "gpu"}
    assert gpus and all(int(g.rsplit(":", 1)[1]) % 2 == 0 for g in gpus)
    racks = {r.id for r in last.headroom.rows if r.kind == "rack"}
    assert racks == {"r01"}  # r02's B feed never reports: its A feed alone is not its load
    assert any("racks ['r02']" in p for p in last.headroom.problems), last.headroom.problems
    phases = {r.id.split("/")[0] for r in last.headroom.rows if r.kind == "pdu_phase"}
    assert phases == {"pdu-r01-a", "pdu-r01-b", "pdu-r02-a"}
    links = {r.id for r in last.headroom.rows if r.kind == "link"}
    assert links == {"lnk-r01-s1"}


@pytest.mark.slow
def test_a_failing_stage_is_reported_once_and_the_rules_still_run(
    minutes: list[Minute], service, caplog: pytest.LogCaptureFixture
) -> None:
    """A store without the calibration quality table (only the hot-spot stage reads it: the
    residual's sigma) breaks the hot-spot stage only: headroom, pumps and fleets are still
    computed, the pump page still goes out, health names the stage and its error, the error
    is logged once, and health recovers once the table is back."""
    svc = service()

    def break_and_mend(m: int) -> None:
        if m == CALIBRATE_AFTER_MIN - 1:  # just after the calibration run
            svc.store.con.execute("ALTER TABLE calibration_quality RENAME TO calibration_quality_x")
        if m == 12:
            svc.store.con.execute("ALTER TABLE calibration_quality_x RENAME TO calibration_quality")

    with caplog.at_level(logging.INFO, logger="twin.analysis.detect"):
        svc.run(minutes, lambda m, topic, payload: True, after=break_and_mend)
    assert svc.paged() == [("firing", PUMP_KEY), ("resolved", PUMP_KEY)]
    det = svc.health.snapshot()["loops"]["detection"]
    assert det["errors_total"] == 12 - (CALIBRATE_AFTER_MIN - 1)  # the passes without it
    assert det["last_error"].startswith("hotspots: CatalogException: ")
    assert "calibration_quality" in det["last_error"]
    assert not det["failing"]  # the last passes, with the table back, succeeded
    failed_logs = [r for r in caplog.records if "stage hotspots failed" in r.getMessage()]
    assert len(failed_logs) == 1 and failed_logs[0].exc_info is not None
    assert any("detection recovered" in r.getMessage() for r in caplog.records)
    rows = {r.kind for r in svc.detector.last.headroom.rows}
    assert {"gpu", "pdu_phase", "rack", "cdu", "loop", "link"} <= rows
