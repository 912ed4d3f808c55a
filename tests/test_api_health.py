"""The API tells the truth and stays bounded (issue 12): /healthz and /metrics from the
service's ServiceHealth, the Host check, busy slots answering 429, the bounded forecast cache,
the ids limit, bounded status lists. Against the real server over HTTP, with a ServiceHealth
driven directly (the ingest service fills it in `dctwin serve`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import APIRouter
from prometheus_client.parser import text_string_to_metric_families

from collectors.contract import encode, topic_for
from twin.api import ApiContext, ApiServer
from twin.api.app import MAX_IDS
from twin.api.whatif import WhatifSettings
from twin.health import ServiceHealth
from twin.ingest import Ingester, IngestLimits
from twin.service import Service

from .helpers import API_TOKEN as TOKEN
from .helpers import REPO, SCENARIOS

#: When the tests' health records a commit and a calibration (its clock, fixed for the call).
COMMITTED_AT = datetime(2026, 5, 1, 12, 0, 0, 250000, tzinfo=UTC)
CALIBRATED_AT = datetime(2026, 5, 1, 12, 5, tzinfo=UTC)

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, start_service: Callable[..., Service]
) -> Iterator[Service]:
    s = start_service(tmp_path_factory.mktemp("apihealth") / "api.duckdb")
    yield s
    s.stop()


def serve(svc: Service, **kw: object) -> ApiServer:
    """Another API on the service's store, with its own context (health, limits, hosts); use
    it in a with statement (that starts and stops it)."""
    ctx = ApiContext(svc.store, site=svc.site, engine=svc.engine, detector=svc.detector, **kw)  # type: ignore[arg-type]
    return ApiServer(ctx, port=0)


def metrics(c: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = c.get("/metrics")
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
    }


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_healthz_answers_503_while_ingest_is_stalled_and_200_once_it_recovers(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    health = ServiceHealth(stall_after_s=60.0)
    with serve(svc, health=health) as server, httpx.Client(base_url=server.url) as c:
        r = c.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        assert r.json()["ingest"]["lag_s"] == 0 and r.json()["ingest"]["stall_after_s"] == 60
        # a message has waited 2 minutes and nothing was committed
        health.pending(time.monotonic() - 120.0)
        r = c.get("/healthz")
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["status"] == "stalled"
        assert body["reason"].startswith("ingest stalled: messages waiting 120 s")
        assert "last commit never" in body["reason"]
        assert body["ingest"]["lag_s"] >= 120 and body["ingest"]["last_commit_at"] is None
        got = metrics(c)
        assert got[("dctwin_ingest_stalled", ())] == 1
        assert got[("dctwin_ingest_lag_seconds", ())] >= 120
        assert ("dctwin_ingest_last_commit_timestamp_seconds", ()) not in got
        # the store catches up: committed (at a known instant: the health's clock is fixed for
        # the call), nothing waits
        with monkeypatch.context() as m:
            m.setattr("twin.health._now", lambda: COMMITTED_AT)
            health.committed()
        health.pending(None)
        r = c.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        assert r.json()["ingest"]["last_commit_at"] is not None
        got = metrics(c)
        assert got[("dctwin_ingest_stalled", ())] == 0
        assert got[("dctwin_ingest_lag_seconds", ())] == 0
        last_commit = got[("dctwin_ingest_last_commit_timestamp_seconds", ())]
        assert last_commit == COMMITTED_AT.timestamp()


def test_broker_fields_follow_broker_down_and_up(svc: Service) -> None:
    health = ServiceHealth()
    with serve(svc, health=health) as server, httpx.Client(base_url=server.url) as c:
        body = c.get("/healthz").json()
        assert body["broker_connected"] is None and body["broker"]["connected"] is None
        assert ("dctwin_broker_connected", ()) not in metrics(c)
        health.broker_up()
        body = c.get("/healthz").json()
        assert body["broker_connected"] is True and body["broker"]["reconnects"] == 0
        assert body["status"] == "ok" and body["broker"]["since"]
        assert c.get("/api/v1/overview").json()["ingest"]["broker_connected"] is True
        health.broker_down("connection refused")
        r = c.get("/healthz")
        assert r.status_code == 200  # degraded, still alive
        body = r.json()
        assert body["broker_connected"] is False and body["status"] == "degraded"
        assert "broker disconnected (connection refused)" in body["reason"]
        assert body["broker"]["disconnects"] == 1
        got = metrics(c)
        assert got[("dctwin_broker_connected", ())] == 0
        assert got[("dctwin_broker_disconnects_total", ())] == 1
        health.broker_up()
        body = c.get("/healthz").json()
        assert body["broker_connected"] is True and body["status"] == "ok"
        assert body["broker"]["reconnects"] == 1
        got = metrics(c)
        assert got[("dctwin_broker_connected", ())] == 1
        assert got[("dctwin_broker_reconnects_total", ())] == 1
        assert c.get("/api/v1/status").json()["service"]["health"]["broker"]["reconnects"] == 1


def test_loop_errors_and_the_apis_own_500s_show_in_metrics_and_healthz(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    health = ServiceHealth()
    broken = APIRouter()

    @broken.get("/broken")
    def fail() -> None:
        raise RuntimeError("disk on fire")

    with (
        serve(svc, health=health, routers=[broken]) as server,
        httpx.Client(base_url=server.url) as c,
    ):
        health.error("detection", "headroom: no pdu samples")
        health.error("detection", "headroom: no pdu samples")
        with monkeypatch.context() as m:  # at a known instant
            m.setattr("twin.health._now", lambda: CALIBRATED_AT)
            health.ok("calibration")
        body = c.get("/healthz").json()
        assert body["status"] == "degraded"
        assert "loop detection failing: headroom: no pdu samples" in body["reason"]
        det = body["loops"]["detection"]
        assert det["errors_total"] == 2 and det["failing"] and det["last_success"] is None
        got = metrics(c)
        assert got[("dctwin_loop_errors_total", (("loop", "detection"),))] == 2
        assert got[("dctwin_loop_failing", (("loop", "detection"),))] == 1
        assert got[("dctwin_loop_successes_total", (("loop", "calibration"),))] == 1
        last = got[("dctwin_loop_last_success_timestamp_seconds", (("loop", "calibration"),))]
        assert last == CALIBRATED_AT.timestamp()
        assert ("dctwin_loop_last_success_timestamp_seconds", (("loop", "detection"),)) not in got
        # the API reports itself as loop "api": served requests succeed, a 500 is an error
        assert got[("dctwin_loop_errors_total", (("loop", "api"),))] == 0
        assert got[("dctwin_loop_successes_total", (("loop", "api"),))] == 1  # the /healthz
        r = c.get("/broken")  # a 500 with a JSON body; the connection stays usable
        assert r.status_code == 500 and "traceback" in r.json()["detail"]
        api = c.get("/healthz").json()["loops"]["api"]
        assert api["errors_total"] == 1 and api["successes_total"] >= 2
        assert api["last_error"] == "GET /broken: RuntimeError: disk on fire"
        assert metrics(c)[("dctwin_loop_errors_total", (("loop", "api"),))] == 1
        health.ok("detection")
        assert c.get("/healthz").json()["status"] == "ok"


def test_expensive_requests_get_429_with_retry_after_when_every_slot_is_taken(
    svc: Service,
) -> None:
    with serve(svc, max_busy=1) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        busy = server.app.state.busy
        assert busy.try_acquire()  # a slow request holds the one slot
        try:
            week = {
                "kind": "gpu",
                "quantity": "temp_c",
                "start": str(time.time() - 7 * 86400),
                "end": str(time.time()),
            }
            for path, params in (
                ("/api/v1/forecast", {"horizon_s": 1800}),
                ("/api/v1/series", week),
                ("/api/v1/status", {}),
                ("/api/v1/hotspots", {"k_sigma": 4}),
                ("/api/v1/fleets", {"window_s": 900}),
            ):
                r = c.get(path, params=params)
                assert r.status_code == 429, (path, r.status_code, r.text)
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["detail"].startswith("busy: 1 expensive requests"), r.text
            # cheap requests are still answered
            assert c.get("/healthz").status_code == 200
            assert c.get("/api/v1/state/gpu").status_code == 200
            assert c.get("/api/v1/series", params={"kind": "cdu", "quantity": "heat_kw"}).is_success
            got = metrics(c)
            assert got[("dctwin_api_busy_rejected_total", ())] == 5
            assert got[("dctwin_api_busy_slots", (("state", "in_use"),))] == 1
        finally:
            busy.release()
        assert c.get("/api/v1/forecast", params={"horizon_s": 1800}).status_code == 200
        assert c.get("/api/v1/series", params=week).status_code == 200
        assert metrics(c)[("dctwin_api_busy_slots", (("state", "in_use"),))] == 0


@pytest.mark.slow
def test_concurrent_real_forecasts_beyond_the_limit_get_429(svc: Service) -> None:
    with serve(svc, max_busy=1) as server:
        n = 6
        barrier = threading.Barrier(n)
        codes: list[int] = []

        def ask(i: int) -> None:
            with httpx.Client(base_url=server.url, timeout=120) as c:
                c.get("/healthz")  # connected before the race
                barrier.wait()
                r = c.get("/api/v1/forecast", params={"horizon_s": 7200 + 60 * i})
                codes.append(r.status_code)
                if r.status_code == 429:
                    assert r.headers["retry-after"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(codes) == n and set(codes) == {200, 429}, codes


@pytest.mark.slow  # many forecasts through the API: out of the fast tier
def test_forecast_cache_never_holds_more_than_its_bound(svc: Service) -> None:
    with (
        serve(svc, forecast_cache_entries=3) as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
    ):
        bodies = {}
        for i in range(7):
            params = {"horizon_s": 900 + 300 * i, "step_s": 300}
            r = c.get("/api/v1/forecast", params=params)
            assert r.status_code == 200, r.text
            bodies[i] = r.content
            entries = metrics(c)[("dctwin_api_forecast_cache_entries", ())]
            assert entries == min(i + 1, 3)
        assert len(server.app.state.forecast_cache) == 3
        # the newest is still cached: the same bytes without recomputing
        again = c.get("/api/v1/forecast", params={"horizon_s": 900 + 300 * 6, "step_s": 300})
        assert again.content == bodies[6]


def test_ids_limit_is_reachable_by_post_and_answered_with_a_clear_4xx_beyond(
    svc: Service,
) -> None:
    gpus = [g for n in svc.site.nodes for g in n.gpu_ids()]
    at_limit = [gpus[i % len(gpus)] for i in range(MAX_IDS)]
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        r = c.post("/api/v1/state/gpu", json={"ids": at_limit})
        assert r.status_code == 200, r.text
        assert {d["id"] for d in r.json()["devices"]} == set(gpus)
        r = c.post("/api/v1/series", json={"kind": "gpu", "quantity": "temp_c", "ids": at_limit})
        assert r.status_code == 200 and len(r.json()["series"]) == len(gpus), r.text
        for path, body in (
            ("/api/v1/state/gpu", {"ids": [*at_limit, gpus[0]]}),
            ("/api/v1/series", {"kind": "gpu", "quantity": "temp_c", "ids": [*at_limit, "x"]}),
        ):
            r = c.post(path, json=body)
            assert r.status_code == 413, (path, r.status_code, r.text[:300])
            assert "ids names 20001 devices; at most 20000 per request" in r.json()["detail"]
        # a GET holds about 500 ids in its URL, as documented
        r = c.get("/api/v1/state/gpu", params={"ids": ",".join(at_limit[:500])})
        assert r.status_code == 200 and len(r.json()["devices"]) == len(gpus)
        # unknown ids in a POST are named as in a GET
        r = c.post("/api/v1/state/gpu", json={"ids": ["ghost:0", gpus[0]]})
        assert r.status_code == 404 and "unknown gpu id(s): ghost:0" in r.text


def test_host_header_must_name_an_allowed_host(svc: Service) -> None:
    port = httpx.URL(svc.url).port
    with httpx.Client(base_url=svc.url) as c:
        r = c.get("/healthz", headers={"Host": "evil.example"})
        assert r.status_code == 400
        detail = r.json()["detail"]
        assert "'evil.example'" in detail and "--api-allowed-hosts" in detail
        assert c.get("/api/v1/site", headers={"Host": f"evil.example:{port}"}).status_code == 400
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", f"[::1]:{port}"):
            assert c.get("/healthz", headers={"Host": host}).status_code == 200, host
    with (
        serve(svc, allowed_hosts=["twin", "*.dc.example"]) as server,
        httpx.Client(base_url=server.url) as c,
    ):
        assert c.get("/healthz", headers={"Host": "twin:8420"}).status_code == 200
        assert c.get("/healthz", headers={"Host": "a.dc.example"}).status_code == 200
        assert c.get("/healthz", headers={"Host": "dc.example.evil"}).status_code == 400
        assert c.get("/healthz", headers={"Host": "evil.example"}).status_code == 400


def test_status_lists_unknown_ids_up_to_a_limit_with_their_total(svc: Service) -> None:
    samples = [{"id": f"ghost-node:{i}", "power_w": 500.0} for i in range(30)]
    payload = encode(collector="test", source="ghost-node", seq=1, ts=time.time(), samples=samples)
    Ingester(svc.store, svc.site, IngestLimits(max_past_s=0)).ingest(
        [(topic_for("small", "gpu", "ghost-node"), payload)]
    )
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        st = c.get("/api/v1/status", params={"limit": 5}).json()
        assert st["unknown_ids_total"] == 30 and len(st["unknown_ids"]) == 5
        assert st["unknown_ids"][0]["id"] == "ghost-node:0"
        st = c.get("/api/v1/status").json()
        assert st["unknown_ids_total"] == 30 and len(st["unknown_ids"]) == 30
        r = c.get("/api/v1/status", params={"limit": 100_000})
        assert r.status_code == 422 and "less than or equal to 10000" in r.text


@pytest.mark.slow
def test_whatif_starts_beyond_the_pending_limit_get_429(svc: Service, tmp_path) -> None:
    whatif = WhatifSettings(REPO / "sample_telemetry", SCENARIOS, tmp_path, max_pending=1)
    ctx = ApiContext(svc.store, site=svc.site, token=TOKEN, whatif=whatif)
    body = {"bundle": "demo_bundle", "scenarios": ["four-more-b200-racks"]}
    with ApiServer(ctx, port=0) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/api/v1/whatif", json=body, headers=AUTH)
        assert r.status_code == 202, r.text
        job = r.json()["job"]
        r = c.post("/api/v1/whatif", json=body, headers=AUTH)
        assert r.status_code == 429 and r.headers["retry-after"] == "30", r.text
        assert "1 what-if jobs are queued or running (at most 1)" in r.json()["detail"]
        deadline = time.monotonic() + 120
        while c.get(f"/api/v1/whatif/{job}").json()["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, "the what-if job did not finish"
            time.sleep(0.5)
        # the slot is free again once the job is done
        assert c.post("/api/v1/whatif", json=body, headers=AUTH).status_code == 202


def test_healthz_counts_the_samples_stored_as_metrics_does(svc: Service) -> None:
    """/healthz carries the ingest's samples per kind: the progress a monitor reads without
    /metrics, whose headroom series are tens of thousands on a large shard."""
    assert svc.url is not None
    with httpx.Client(base_url=svc.url) as c:
        samples = c.get("/healthz").json()["ingest"]["samples"]
        got = metrics(c)
    exported = {
        dict(labels)["kind"]: v
        for (name, labels), v in got.items()
        if name == "dctwin_ingest_samples_total"
    }
    assert samples is not None and exported, (samples, exported)
    assert samples == {k: int(v) for k, v in exported.items()}
