"""The twin service as one object (twin/service.py): it starts and stops cleanly, says which
part failed to start and releases the store then, and its what-if jobs use its own rule file."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from twin.service import Service, ServiceConfig, ServiceError
from twin.site import load_site
from twin.store import Store

from .helpers import API_TOKEN, SMALL_SITE

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}

#: A rule no shipped file has, on a metric the what-if evaluates, that holds all the time.
DISTINCT_RULES = """\
rules:
  - name: pumps_counted_by_this_service_only
    type: threshold
    metric: cdu.pumps_running
    entity_kind: cdu
    op: ">="
    value: 0
    severity: warning
    group_by: cdu
    summary: "CDU {entity_id}: {value:g} pump(s) running"
"""


def test_a_service_starts_serves_and_stops_and_releases_its_store(tmp_path: Path) -> None:
    db = tmp_path / "twin.duckdb"
    config = ServiceConfig(db=db, site=load_site(SMALL_SITE), api_port=0, calibrate_every_s=0)
    with Service(config) as svc:
        assert svc.url is not None and svc.detector is not None and svc.mqtt is None
        r = httpx.get(f"{svc.url}/healthz", timeout=10)
        assert r.status_code == 200 and r.json()["site"] == "small", r.text
        loops = r.json()["loops"]
        assert "detection" in loops and "api" in loops, loops
    assert svc.stop() == []  # a second stop does nothing
    with Store(db) as store:  # the file is free again: DuckDB allows one writer process
        assert store.status()["messages"] == 0


def test_a_bad_rule_file_is_refused_naming_it_and_the_store_is_released(tmp_path: Path) -> None:
    db = tmp_path / "twin.duckdb"
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: broken\n    type: nonsense\n")
    with pytest.raises(ServiceError, match=r"rules\.yaml"):
        Service(ServiceConfig(db=db, site=load_site(SMALL_SITE), rules=rules, api_port=0))
    with Store(db):
        pass


def test_a_taken_api_port_fails_start_and_stops_what_started(tmp_path: Path) -> None:
    db = tmp_path / "twin.duckdb"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        svc = Service(ServiceConfig(db=db, site=load_site(SMALL_SITE), api_port=port))
        with pytest.raises(ServiceError, match=rf"cannot listen on 127\.0\.0\.1:{port}"):
            svc.start()
    with Store(db):
        pass


@pytest.mark.slow  # a what-if of the demo bundle: more than 3 s
def test_whatif_jobs_use_the_services_rule_file(
    tmp_path: Path, start_service: Callable[..., Service]
) -> None:
    rules = tmp_path / "service-rules.yaml"
    rules.write_text(DISTINCT_RULES)
    svc = start_service(tmp_path / "twin.duckdb", minutes=6, faults=(), rules=rules)
    try:
        with httpx.Client(base_url=svc.url or "", timeout=60) as c:
            body = {"bundle": "demo_bundle", "scenarios": ["cdu-2-loses-a-pump"]}
            r = c.post("/api/v1/whatif", json=body, headers=AUTH)
            assert r.status_code == 202, r.text
            assert r.json()["rules"] == str(rules)
            job = r.json()["job"]
            deadline = time.monotonic() + 180
            while (state := c.get(f"/api/v1/whatif/{job}").json())["state"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline, "the what-if job did not finish"
                time.sleep(0.5)
    finally:
        svc.stop()
    assert state["state"] == "done", state
    assert state["rules"] == str(rules)
    for result in state["results"]:
        fired = {a["rule"] for a in result["alerts"]}
        # the service's rule, and none of deploy/alert_rules.yaml's (gpu_temp_high, ...)
        assert fired == {"pumps_counted_by_this_service_only"}, (result["name"], fired)
