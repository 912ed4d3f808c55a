"""The alerts of the live path, as `dctwin serve` and `dctwin demo` run them (issue 26).

The service's own ingest, calibration scheduler, detection pass (with its breached-now pass)
and alert engine run over simulated time through :mod:`harness.live_path`: the demo site, the
shipped rules, a calibration seeded from the demo bundle and its first fits on the simulated
data, as the demo starts. What an operator reads comes back over HTTP (``GET /api/v1/alerts``)
and through a real webhook receiver.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.live_path import drive
from twin.alerts import Observation, load_rules, parse_rules
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator
from twin.simulator.faults import parse_fault
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE, Recorder

REPO = Path(__file__).resolve().parents[1]
DEMO_SITE = REPO / "sample_telemetry" / "demo_site.yaml"
DEMO_BUNDLE = REPO / "sample_telemetry" / "demo_bundle"
RULES = REPO / "deploy" / "alert_rules.yaml"
START = datetime(2026, 12, 1, 13, 0, tzinfo=UTC)  # the inference fleets near their daily peak


def _one_pump_page_and_its_resolve(receiver: Recorder) -> dict[str, Any]:
    """What the webhook received is one page and one resolve for cdu-2's pump, nothing else;
    returns the page's notification."""
    got = [r.body for r in receiver.requests]
    events = [(b["event"], b["notification"]["rule"], b["notification"]["group"]) for b in got]
    assert events == [
        ("firing", "cdu_pump_lost", {"kind": "cdu", "id": "cdu-2"}),
        ("resolved", "cdu_pump_lost", {"kind": "cdu", "id": "cdu-2"}),
    ], [(e, b["notification"]["summary"]) for e, b in zip(events, got, strict=True)]
    return got[0]["notification"]


def _texts(a: dict[str, Any]) -> list[str]:
    return [str(a.get(k) or "") for k in ("summary", "paged_summary", "description")]


#: The rules that page on a forecast (the load paths of the headroom), not on a present value.
FORECAST_RULES = {
    "gpu_slowdown_forecast",
    "cdu_heat_breach_1h",
    "cdu_flow_breach_1h",
    "loop_return_breach_1h",
    "pdu_phase_breach_1h",
    "rack_feed_breach_1h",
    "link_breach_1h",
}


@pytest.mark.slow  # a day of 5-min node power, then 2 simulated hours live: about 30-60 s
def test_a_healthy_site_on_its_second_day_is_quiet_under_the_forecast_basis(
    tmp_path: Path,
) -> None:
    """After a day of node power the headroom takes its load paths from the forecast
    (``twin.forecast.rack_ratio_paths``) instead of persistence; no replay or benchmark runs
    that basis. Its ratios were over the forecast's last 5-min mean while the headroom
    multiplies them by the last minute's load: at a training rack's checkpoint dip the two
    differ, and a fault-free small site on its second day paged ``pdu_phase_breach_1h`` and
    ``rack_feed_breach_1h`` "in 0 s" at its dips (the rack's 15.7 kW level over a 4.4 kW
    5-min mean, times a 10.2 kW minute: 36.6 kW against a 36.1 kW feed)."""
    db = tmp_path / "s.duckdb"
    start = datetime(2026, 11, 24, 0, 0, tzinfo=UTC)
    site = load_site(SMALL_SITE)
    sim = SiteSimulator(site, seed=11, start=start - timedelta(hours=25), rate_hz=1 / 300)
    store = Store(db)
    ingester = Ingester(store, site, IngestLimits(max_past_s=0))
    for _ in range(300):  # 25 h of node power at 5 min: the forecast's day of history
        ingester.ingest([m for m in sim.step() if m[0].split("/")[3] == "node"])
    store.close()
    seen: dict[str, Any] = {}

    def read_api(url: str) -> None:
        seen["headroom"] = httpx.get(f"{url}/api/v1/headroom", timeout=30).json()

    run = drive(SMALL_SITE, db, start=start, duration_s=2 * 3600, rules=RULES, on_end=read_api)
    bases = {r["basis"] for r in seen["headroom"]["rows"] if r["kind"] == "rack"}
    assert bases == {"forecast (2 of 2 racks; persistence for the rest)"}, bases
    forecast_pages = [
        (n["at"], n["rule"], n["summary"])
        for n in run.notifications
        if n["status"] == "firing" and n["rule"] in FORECAST_RULES
    ]
    assert forecast_pages == []


@pytest.mark.slow  # 30 simulated minutes of the 880-GPU demo site, about 40-70 s
def test_a_healthy_demo_site_is_quiet_for_30_minutes_through_its_first_fits(
    tmp_path: Path,
) -> None:
    seen: dict[str, Any] = {}

    def read_api(url: str) -> None:
        seen["alerts"] = httpx.get(f"{url}/api/v1/alerts", timeout=30).json()
        seen["calibration"] = httpx.get(f"{url}/api/v1/calibration", timeout=30).json()

    armed: list[bool] = []

    def on_pass(svc, now) -> None:  # the model-based rules wait for the first fit
        armed.append(svc.store.latest_fit_run_id() is not None)

    run = drive(
        DEMO_SITE,
        tmp_path / "demo.duckdb",
        start=START,
        duration_s=1800,
        rules=RULES,
        seed_calibration=DEMO_BUNDLE,
        on_pass=on_pass,
        on_end=read_api,
    )
    pages = [n for n in run.notifications if n["severity"] in ("warning", "critical")]
    assert pages == [], [n["summary"] for n in pages]
    alerts = seen["alerts"]
    assert [a for a in alerts["active"] if a["severity"] != "info"] == []
    for a in alerts["active"] + alerts["history"]:
        assert all("?" not in t for t in _texts(a)), a
    # the seeded start did not arm them; the first fit on the simulated data did, by minute 12
    assert armed[0] is False and armed[-1] is True
    assert len(run.calibrations) >= 2, run.calibrations
    mr = seen["calibration"]["model_rules"]
    assert mr["armed"] is True and mr["waiting"] == []
    assert set(mr["rules"]) == {"gpu_hotspot_residual", "gpu_r_drift", "gpu_slowdown_forecast"}
    assert run.passes == 29 and run.fast_passes > 100


@pytest.mark.slow  # 40 simulated minutes of the demo site with a pump failure, about 60-90 s
def test_a_pump_failure_sends_one_page_and_one_resolve_to_a_real_webhook(tmp_path: Path) -> None:
    receiver = Recorder("webhook")
    receiver.start()
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"hooks:\n  - {{type: webhook, name: ops, url: '{receiver.url}/alerts'}}\n")
    try:
        run = drive(
            DEMO_SITE,
            tmp_path / "demo.duckdb",
            start=START,
            duration_s=40 * 60,
            rules=RULES,
            hooks=hooks,
            faults=[parse_fault("pump_failure:cdu-2/pump1@5m+10m")],
            seed_calibration=DEMO_BUNDLE,
            console_url="http://127.0.0.1:8501",
        )
    finally:
        receiver.stop()
    page = _one_pump_page_and_its_resolve(receiver)
    assert page["severity"] == "critical" and page["unit"] == "pumps"
    assert page["url"] == "http://127.0.0.1:8501/cooling?cdu=cdu-2"
    assert page["summary"] == "CDU cdu-2: 1 pump(s) running"
    # paged from the breached-now pass: within 30 s of the sample that showed the pump stopped
    fired = datetime.fromisoformat(page["starts_at"])
    assert fired - (START + timedelta(minutes=5)) <= timedelta(seconds=30)
    assert [n["status"] for n in run.notifications] == ["firing", "resolved"]


def test_a_residual_rule_needs_its_excess_in_kelvin_as_well_as_k_sigma() -> None:
    rules = parse_rules(
        """
rules:
  - name: hot
    type: residual
    metric: hotspot.gpu.residual_sigma
    entity_kind: gpu
    op: ">="
    value: 4
    summary: "GPU {entity_id} {labels[excess_k]} K over ({value:.1f} sigma of {labels[sigma_k]} K)"
"""
    )
    rule = rules.by_name()["hot"]
    assert rule.min_excess_k == 3.0  # the default, docs/physics.md §2.7
    assert not rule.breached(9.0, excess=2.9)  # 9 sigma but 2.9 K: no
    assert rule.breached(6.0, excess=3.0)
    assert not rule.breached(3.9, excess=10.0)  # 10 K but under 4 sigma
    assert not rule.breached(9.0, excess=None)  # a residual without its excess is not judged


def test_the_shipped_r_drift_rule_needs_its_excess_in_kelvin_as_well_as_the_drift() -> None:
    """An R drift at low heat is an offset error as much as a plate (docs/physics.md §2.6):
    the shipped gpu_r_drift pages +35 % only where it also runs 3 K hotter for it."""
    from twin.alerts import RuleFileError

    rule = load_rules(RULES).by_name()["gpu_r_drift"]
    assert rule.min_excess_k == 3.0
    assert not rule.breached(0.351, excess=1.9)  # seed 1 day 3's drained GPU: +35 %, ~2 K
    assert rule.breached(0.36, excess=7.4)  # a fouled 0.03 K/W plate at 700 W
    assert not rule.breached(0.30, excess=10.0)  # under the band
    assert not rule.breached(0.5, excess=None)  # a drift without its excess is not judged
    with pytest.raises(RuleFileError, match=r"min_excess_k: only for a metric whose .*not"):
        parse_rules(
            """
rules:
  - name: hot
    metric: headroom.gpu.k_to_slowdown
    entity_kind: gpu
    op: "<="
    value: 5
    min_excess_k: 3
"""
        )


def test_a_summary_quoting_a_label_its_metric_does_not_carry_is_refused() -> None:
    from twin.alerts import RuleFileError

    with pytest.raises(RuleFileError, match=r"quotes label\(s\) reason that drift.gpu.r_k_per_w"):
        parse_rules(
            """
rules:
  - name: r
    type: drift
    metric: drift.gpu.r_k_per_w
    entity_kind: gpu
    summary: "GPU {entity_id}: {labels[reason]}"
"""
        )


def test_an_open_incident_is_rendered_again_at_each_evaluation() -> None:
    """The API's summary of an open incident is the current value, not the page's."""
    from twin.alerts import AlertEngine, Topology
    from twin.site import load_site

    rules = parse_rules(
        """
rules:
  - name: gpu_temp_high
    metric: headroom.gpu.k_to_slowdown
    entity_kind: gpu
    op: "<="
    value: 5
    group_by: rack
    summary: "GPU {entity_id} {value:.1f} K from thermal slowdown"
"""
    )
    site = load_site(DEMO_SITE)
    engine = AlertEngine(rules, Topology.from_site(site), console_url="http://console:8501/")

    def obs(k: float, minute: int) -> Observation:
        return Observation(
            metric="headroom.gpu.k_to_slowdown",
            entity_kind="gpu",
            entity_id="trn-a01-n1:0",
            value=k,
            ts=START + timedelta(minutes=minute),
        )

    [page] = engine.evaluate([obs(4.0, 0)], START)
    assert page.summary == "GPU trn-a01-n1:0 4.0 K from thermal slowdown"
    assert page.url == "http://console:8501/rack?rack=a01" and page.unit == "K"
    assert page.labels["cdu"] == "cdu-1"  # a rack's page names the CDU that cools it
    assert engine.evaluate([obs(2.5, 30)], START + timedelta(minutes=30)) == []
    [a] = engine.active()
    assert a["summary"] == "GPU trn-a01-n1:0 2.5 K from thermal slowdown"
    assert a["paged_summary"] == page.summary and a["value"] == 2.5 and a["unit"] == "K"
    assert a["firing_for_s"] == 1800.0 and a["cdus"] == ["cdu-1"]
    assert not re.search(r"\?", a["summary"])


def test_a_recurring_near_limit_state_pages_once_then_tickets_once_a_day() -> None:
    from twin.alerts import AlertEngine, Topology
    from twin.site import load_site

    rules = parse_rules(
        """
rules:
  - name: cdu_capacity_low
    metric: headroom.cdu.capacity_free_fraction
    entity_kind: cdu
    op: "<"
    value: 0.10
    severity: warning
    recur_as_ticket_s: 86400
    summary: "CDU {entity_id}: {value:.0%} of heat capacity left"
"""
    )
    engine = AlertEngine(rules, Topology.from_site(load_site(DEMO_SITE)))

    def peak(hours: float) -> list[tuple[str, str]]:
        """The CDU near capacity for an hour from ``hours``: what the engine sends."""
        t = START + timedelta(hours=hours)
        sent = []
        for minute, free in ((0, 0.05), (60, 0.30)):
            at = t + timedelta(minutes=minute)
            o = Observation(
                metric="headroom.cdu.capacity_free_fraction",
                entity_kind="cdu",
                entity_id="cdu-3",
                value=free,
                ts=at,
            )
            sent += [(n.status, n.severity) for n in engine.evaluate([o], at)]
        return sent

    assert peak(0) == [("firing", "warning"), ("resolved", "warning")]  # the first pages
    assert peak(6) == [("firing", "info"), ("resolved", "info")]  # then a ticket
    # at most one ticket a day: the next one is kept, not sent, and listed as info meanwhile
    at = START + timedelta(hours=12)
    o = Observation(
        metric="headroom.cdu.capacity_free_fraction",
        entity_kind="cdu",
        entity_id="cdu-3",
        value=0.05,
        ts=at,
    )
    assert engine.evaluate([o], at) == []
    assert [(a["severity"], a["group"]["id"]) for a in engine.active()] == [("info", "cdu-3")]
    done = at + timedelta(hours=1)
    gone = o.model_copy(update={"value": 0.30, "ts": done})
    assert engine.evaluate([gone], done) == []  # nor its resolve
    assert engine.active() == []
    assert peak(31) == [("firing", "info"), ("resolved", "info")]  # a day after the ticket
    assert peak(31 + 48) == [("firing", "warning"), ("resolved", "warning")]  # gone 2 days


def test_every_hook_carries_the_console_link_the_runbook_and_the_unit() -> None:
    """Webhook, Slack, PagerDuty and Alertmanager bodies of one page (issue 26 item 8)."""
    from twin.alerts import AlertEngine, Topology
    from twin.alerts.hooks import OutboxEvent, parse_hooks
    from twin.site import load_site

    rules = parse_rules(
        """
rules:
  - name: cdu_pump_lost
    metric: cdu.pumps_running
    entity_kind: cdu
    op: "<"
    value: 2
    severity: critical
    group_by: cdu
    runbook_url: https://wiki.example.com/runbooks/cdu_pump_lost
    summary: "CDU {entity_id}: {value:g} pump(s) running"
"""
    )
    engine = AlertEngine(
        rules, Topology.from_site(load_site(DEMO_SITE)), console_url="https://twin.example:8501"
    )
    o = Observation(
        metric="cdu.pumps_running", entity_kind="cdu", entity_id="cdu-2", value=1.0, ts=START
    )
    [note] = engine.evaluate([o], START)
    hooks = {
        h.name: h
        for h in parse_hooks(
            {
                "hooks": [
                    {"type": "webhook", "name": "w", "url": "http://127.0.0.1:1/w"},
                    {"type": "slack", "name": "s", "url": "https://hooks.slack.com/services/x"},
                    {"type": "pagerduty", "name": "p", "routing_key": "k" * 32},
                    {"type": "alertmanager", "name": "a", "url": "http://127.0.0.1:1"},
                ]
            }
        )
    }
    ev = OutboxEvent("firing", note.dedup_key, note.event_id, note, START)
    console = "https://twin.example:8501/cooling?cdu=cdu-2"
    runbook = "https://wiki.example.com/runbooks/cdu_pump_lost"
    _, web = hooks["w"].render(ev, START)
    assert web["notification"]["url"] == console and web["notification"]["unit"] == "pumps"
    assert web["notification"]["runbook_url"] == runbook
    _, slack = hooks["s"].render(ev, START)
    context = slack["blocks"][-1]["elements"][0]["text"]
    assert f"<{console}|console>" in context and f"<{runbook}|runbook>" in context
    assert "values in pumps" in context
    _, pd = hooks["p"].render(ev, START)
    assert pd["client_url"] == console
    assert pd["links"] == [
        {"href": console, "text": "console"},
        {"href": runbook, "text": "runbook"},
    ]
    assert pd["payload"]["custom_details"]["unit"] == "pumps"
    _, [am] = hooks["a"].render(ev, START)
    assert am["generatorURL"] == console
    assert am["annotations"]["runbook_url"] == runbook and am["annotations"]["unit"] == "pumps"
    assert am["annotations"]["members"] == "cdu-2=1 pumps"


def test_the_demo_refuses_a_hook_file_it_cannot_use_before_starting_anything(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    missing = tmp_path / "nope.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("hooks:\n  - {type: webhook, name: w}\n")  # no url
    for path, says in ((missing, "no such file"), (bad, "url")):
        p = subprocess.run(
            [sys.executable, "-m", "twin.cli", "demo", "--no-console", "--hooks", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        assert f"--hooks {path}" in p.stderr and says in p.stderr, p.stderr


@pytest.mark.slow  # a service's detection thread for a few seconds
def test_the_service_runs_the_breached_now_pass_between_full_passes(tmp_path: Path) -> None:
    """`dctwin serve`'s detection loop: between full passes (every 60 s here) the breached-now
    pass runs every ``fast_every_s`` on the newest samples, and pages a stopped pump."""
    from collectors.mqtt import wait_until
    from twin.service import Service, ServiceConfig
    from twin.simulator import SiteSimulator
    from twin.site import load_site

    small = REPO / "sample_telemetry" / "small_site.yaml"
    site = load_site(small)
    start = datetime.now(UTC) - timedelta(minutes=3)
    sim = SiteSimulator(
        site, seed=1, start=start, faults=[parse_fault("pump_failure:cdu-1/pump1@60s")]
    )
    config = ServiceConfig(
        db=tmp_path / "s.duckdb",
        site=site,
        api=False,
        rules=RULES,
        detect_every_s=60.0,
        fast_every_s=0.5,
        calibrate_every_s=0,
        background_nice=0,
    )
    with Service(config) as svc:
        for _ in range(150):  # 150 s of 1 Hz telemetry, the pump stopped from 60 s
            svc.ingester.ingest(sim.step())
        det = svc.detector
        assert det is not None and det.fast_every_s == 0.5
        assert wait_until(lambda: det.fast_runs >= 3, 30), det.fast_runs
        assert det.runs == 0  # no full pass yet: the fast pass judged the pump on its own
        pages = [a for a in svc.engine.active() if a["rule"] == "cdu_pump_lost"]
        assert [(a["severity"], a["group"]["id"]) for a in pages] == [("critical", "cdu-1")]


@pytest.mark.mqtt
@pytest.mark.slow  # the demo on its 880-GPU site in real time for about four minutes
def test_dctwin_demo_with_a_pump_failure_sends_one_page_and_one_resolve_to_its_hooks(
    tmp_path: Path,
) -> None:
    """`dctwin demo --fault ... --hooks FILE`, as a user runs it (in real time, the pump lost
    for two minutes instead of ten so that the test ends in minutes): a real webhook receiver
    gets exactly one page and one resolve for the pump, and nothing else."""
    import signal
    import subprocess
    import sys

    from collectors.mqtt import wait_until

    receiver = Recorder("webhook")
    receiver.start()
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"hooks:\n  - {{type: webhook, name: ops, url: '{receiver.url}/alerts'}}\n")
    log = tmp_path / "demo.log"
    args = [sys.executable, "-m", "twin.cli", "demo", "--no-console"]
    args += ["--data-dir", str(tmp_path / "data"), "--hooks", str(hooks)]
    args += ["--fault", "pump_failure:cdu-2/pump1@1m+2m"]
    try:
        with log.open("w") as out:
            p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:

            def resolved() -> bool:
                return any(r.body.get("event") == "resolved" for r in receiver.requests)

            assert wait_until(resolved, 420), (log.read_text(), receiver.requests)
            # a minute more: a late second page or an unrelated one would show here
            wait_until(lambda: p.poll() is not None, 60)
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(90) == 0, log.read_text()
    finally:
        receiver.stop()
    page = _one_pump_page_and_its_resolve(receiver)
    assert page["severity"] == "critical" and page["summary"] == "CDU cdu-2: 1 pump(s) running"
    assert page["unit"] == "pumps" and "?" not in page["summary"]
    assert page["url"] is None  # --no-console: no link to a page nobody serves
