"""`dctwin site-view` over two real `dctwin serve` shards, each fed by its own broker and
simulator (the small site, different seeds, a CDU pump failing in both so that the same
incident fires on both), as a user meets it: over HTTP, and through the console's own client
and pages (Streamlit AppTest). The last test kills one shard with SIGKILL."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import streamlit as st
from prometheus_client.parser import text_string_to_metric_families
from streamlit.testing.v1 import AppTest

from collectors.mqtt import wait_until
from dashboards.client import Api
from twin.broker import LocalBroker, start_broker
from twin.siteview.merge import tightness

from .helpers import PUMP_KEY, REPO, RULES, SMALL_SITE, TEST_BROKER, page_figures

pytestmark = [pytest.mark.slow, pytest.mark.mqtt]

TOKEN = "siteview-test-token-0123456789"
SIM_S = 240  # simulated seconds per shard
GPUS = 24  # GPUs of the small site
PAGES = sorted((REPO / "dashboards" / "pages").glob("*.py"))


@dataclass
class Proc:
    p: subprocess.Popen[bytes]
    log: Path
    url: str = ""


def _cli(*args: str, log: Path, env: dict[str, str]) -> Proc:
    p = subprocess.Popen(
        [sys.executable, "-m", "twin.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
    )
    return Proc(p, log)


def _url(proc: Proc, pattern: str) -> str:
    assert wait_until(lambda: b"serving:" in proc.log.read_bytes() or proc.p.poll() is not None, 60)
    assert proc.p.poll() is None, proc.log.read_text()
    return re.search(pattern, proc.log.read_text()).group(1)  # type: ignore[union-attr]


def _stop(proc: Proc) -> None:
    if proc.p.poll() is None:
        proc.p.send_signal(signal.SIGTERM)
        try:
            proc.p.wait(30)
        except subprocess.TimeoutExpired:
            proc.p.kill()
            proc.p.wait(10)


@dataclass
class SiteView:
    url: str
    shards: dict[str, str]  # name -> API URL
    procs: dict[str, Proc]


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteView]:
    tmp = tmp_path_factory.mktemp("siteview")
    brokers: list[LocalBroker] = []
    procs: dict[str, Proc] = {}
    try:
        shards: dict[str, str] = {}
        for i, name in enumerate(("hall-a", "hall-b")):
            b = start_broker(TEST_BROKER, log_path=tmp / f"{name}.broker.log")  # type: ignore[arg-type]
            brokers.append(b)
            env = {**os.environ, **b.client_env(), "DCTWIN_API_TOKEN": TOKEN}
            procs[name] = _cli(
                *("serve", "--broker", b.address, "--db", str(tmp / f"{name}.duckdb")),
                *("--site", str(SMALL_SITE), "--api-port", "0", "--client-id", f"twin-{name}"),
                *("--calibrate-every", "0", "--detect-every", "2", "--rules", str(RULES)),
                log=tmp / f"{name}.serve.log",
                env=env,
            )
            shards[name] = _url(procs[name], r"api: (http://127\.0\.0\.1:\d+)")
            start = (datetime.now(UTC) - timedelta(seconds=SIM_S)).replace(microsecond=0)
            sim = subprocess.run(
                [
                    *(sys.executable, "-m", "twin.cli", "sim", "--site", str(SMALL_SITE)),
                    *("--broker", b.address, "--duration", str(SIM_S), "--speed", "0"),
                    *("--start", start.isoformat(), "--seed", str(i + 1)),
                    *("--fault", "pump_failure:cdu-1/pump1@1m"),
                ],
                capture_output=True,
                text=True,
                timeout=180,
                env=env,
            )
            assert sim.returncode == 0, sim.stderr
        for url in shards.values():
            with httpx.Client(base_url=url, timeout=30) as c:

                def ready(c: httpx.Client = c) -> bool:
                    st_ = c.get("/api/v1/status").json()
                    if st_["samples"].get("gpu", 0) < GPUS * SIM_S:
                        return False
                    keys = [a["dedup_key"] for a in c.get("/api/v1/alerts").json()["active"]]
                    if PUMP_KEY not in keys or not c.get("/api/v1/headroom").json()["rows"]:
                        return False
                    q = {"kind": "node", "quantity": "power_w", "agg": "sum", "resolution": "1m"}
                    q["start"] = (datetime.now(UTC) - timedelta(seconds=2 * SIM_S)).isoformat()
                    return len(c.get("/api/v1/series", params=q).json()["series"]) > 0

                assert wait_until(ready, 90)
        spec = ",".join(f"{n}={u}" for n, u in shards.items())
        # 30 s per shard: two shards detecting every 2 s on a loaded 2-vCPU CI machine took
        # over 2 s for a first forecast read (a 503); the killed shard below is refused at once
        procs["view"] = _cli(
            *("site-view", "--shards", spec, "--port", "0", "--timeout-s", "30"),
            log=tmp / "view.log",
            env=dict(os.environ),
        )
        url = _url(procs["view"], r"site view on (http://127\.0\.0\.1:\d+)")
        assert wait_until(lambda: httpx.get(url + "/api/v1", timeout=5).status_code == 200, 30)
        yield SiteView(url, shards, procs)
    finally:
        for proc in procs.values():
            _stop(proc)
        for b in brokers:
            b.stop()


def _get(url: str, path: str, **params: object) -> dict:
    r = httpx.get(url + path, params=params, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_overview_is_the_sum_of_the_shards(view: SiteView) -> None:
    parts = [_get(u, "/api/v1/overview") for u in view.shards.values()]
    site = _get(view.url, "/api/v1/overview")
    assert site["site"] == "small"
    for key in ("it_power_kw", "gpu_power_kw", "cooling_load_kw", "cooling_capacity_kw"):
        assert site[key] == pytest.approx(sum(p[key] for p in parts), rel=1e-9), key
    assert parts[0]["it_power_kw"] != pytest.approx(parts[1]["it_power_kw"])  # own data each
    assert site["gpus_reporting"] == 2 * GPUS
    assert site["nodes_reporting"] == sum(p["nodes_reporting"] for p in parts)
    assert site["ingest"]["stored_messages"] == sum(p["ingest"]["stored_messages"] for p in parts)
    by_kind = {h["kind"]: h for h in site["headroom"]}
    for kind, h in by_kind.items():
        mine = [x for p in parts for x in p["headroom"] if x["kind"] == kind]
        assert h["count"] == sum(x["count"] for x in mine)
        assert h["min_headroom"] == min(x["min_headroom"] for x in mine)
    assert [t for t in site["tightest"]] == sorted(site["tightest"], key=tightness)
    assert [s["status"] for s in site["shards"]] == ["ok", "ok"]
    assert all(s["age_s"] < 5 for s in site["shards"])


def test_lists_are_concatenated_and_headroom_sorted_tightest_first(view: SiteView) -> None:
    parts = [_get(u, "/api/v1/racks")["racks"] for u in view.shards.values()]
    racks = _get(view.url, "/api/v1/racks")["racks"]
    assert racks == parts[0] + parts[1]
    rows = _get(view.url, "/api/v1/headroom")["rows"]
    n = sum(len(_get(u, "/api/v1/headroom")["rows"]) for u in view.shards.values())
    assert len(rows) == n and rows == sorted(rows, key=tightness)
    assert rows[0]["headroom_now"] / abs(rows[0]["limit"]) <= min(
        r["headroom_now"] / abs(r["limit"]) for r in rows if r["headroom_now"] is not None
    )
    # a series summed across devices is summed across shards, per timestamp
    end = datetime.now(UTC).isoformat()
    q = {"kind": "node", "quantity": "power_w", "agg": "sum", "resolution": "1m", "end": end}
    q["start"] = (datetime.now(UTC) - timedelta(seconds=SIM_S + 60)).isoformat()
    part = [_get(u, "/api/v1/series", **q)["series"][0] for u in view.shards.values()]
    whole = _get(view.url, "/api/v1/series", **q)["series"][0]
    common = sorted(set(part[0]["t"]) & set(part[1]["t"]))
    assert len(common) >= 2
    at = {t: v for t, v in zip(whole["t"], whole["value"], strict=True)}
    for t in common:
        a = part[0]["value"][part[0]["t"].index(t)]
        b = part[1]["value"][part[1]["t"].index(t)]
        assert at[t] == pytest.approx(a + b)
    r = httpx.get(view.url + "/api/v1/series", params={**q, "agg": "mean"}, timeout=30)
    assert r.status_code == 400 and "agg=sum" in r.json()["detail"]


def test_alerts_are_merged_by_dedup_key(view: SiteView) -> None:
    for u in view.shards.values():  # the same incident on both shards
        assert PUMP_KEY in [a["dedup_key"] for a in _get(u, "/api/v1/alerts")["active"]]
    alerts = _get(view.url, "/api/v1/alerts")
    keys = [a["dedup_key"] for a in alerts["active"]]
    assert keys.count(PUMP_KEY) == 1 and len(keys) == len(set(keys))
    hist = alerts["history"]
    assert hist == sorted(hist, key=lambda e: e["at"], reverse=True)
    assert len({(e["at"], e["dedup_key"], e["status"]) for e in hist}) == len(hist)
    ov = _get(view.url, "/api/v1/overview")
    assert ov["alerts"]["active"] == len(keys)


def test_metrics_carry_the_shard_label(view: SiteView) -> None:
    r = httpx.get(view.url + "/metrics", timeout=30)
    assert r.status_code == 200
    fams = list(text_string_to_metric_families(r.text))
    seen: dict[str, set[str]] = {}
    for f in fams:
        for s in f.samples:
            assert "shard" in s.labels, s
            seen.setdefault(f.name, set()).add(s.labels["shard"])
    assert seen["dctwin_ingest_messages_received"] == {"hall-a", "hall-b"}
    up = {s.labels["shard"]: s.value for f in fams for s in f.samples if f.name.endswith("up")}
    assert up == {"hall-a": 1.0, "hall-b": 1.0}


def test_the_console_runs_against_the_site_view(
    view: SiteView, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the console's own client, every read it makes ...
    api = Api(view.url, token=TOKEN)
    rack = api.get("/api/v1/racks")["racks"][0]["name"]
    for path, params in [
        ("/api/v1", {}),
        ("/api/v1/overview", {}),
        ("/api/v1/racks", {}),
        (f"/api/v1/racks/{rack}", {}),
        ("/api/v1/power", {}),
        ("/api/v1/cooling", {}),
        ("/api/v1/network", {}),
        ("/api/v1/fleets", {}),
        ("/api/v1/forecast", {}),
        ("/api/v1/calibration", {}),
        ("/api/v1/hotspots", {}),
        ("/api/v1/alerts", {"history": 300}),
        ("/api/v1/silences", {}),
        ("/api/v1/series", {"kind": "cdu", "quantity": "heat_kw", "ids": "cdu-1"}),
    ]:
        assert isinstance(api.get(path, **params), dict), path
    # ... and its writes: a silence reaches every shard, the acknowledgement its shards
    body = {"matchers": {"rule": "nothing_here"}, "duration_s": 60, "created_by": "test"}
    assert api.post("/api/v1/silences", json=body)["applied_on"] == ["hall-a", "hall-b"]
    ack = api.post(f"/api/v1/alerts/{PUMP_KEY}/ack", json={"by": "test", "comment": ""})
    assert ack["dedup_key"] == PUMP_KEY and ack["applied_on"] == ["hall-a", "hall-b"]
    [pump] = [a for a in api.get("/api/v1/alerts")["active"] if a["dedup_key"] == PUMP_KEY]
    assert pump["acknowledged"]["acked_by"] == "test"
    # every page of the console, unchanged, with no exception and no error box
    monkeypatch.setenv("DCTWIN_API_URL", view.url)
    monkeypatch.setenv("DCTWIN_CONSOLE_TOKEN", TOKEN)
    st.cache_data.clear()
    for page in PAGES:
        at = AppTest.from_file(str(page), default_timeout=60)
        at.run()
        assert not at.exception, (page.name, [e.message for e in at.exception])
        assert not at.error, (page.name, [e.value for e in at.error])
    at = AppTest.from_file(str(REPO / "dashboards" / "pages" / "overview.py"), default_timeout=60)
    at.run()
    assert page_figures(at)["IT power"][0].endswith("kW")


def test_a_killed_shard_is_stale_with_its_age_and_the_rest_is_served(
    view: SiteView, monkeypatch: pytest.MonkeyPatch
) -> None:
    # runs last: it kills hall-b
    alive = _get(view.shards["hall-a"], "/api/v1/overview")
    view.procs["hall-b"].p.send_signal(signal.SIGKILL)
    view.procs["hall-b"].p.wait(10)
    killed = time.monotonic()
    time.sleep(1.0)
    ov = _get(view.url, "/api/v1/overview")
    shards = {s["name"]: s for s in ov["shards"]}
    assert shards["hall-a"]["status"] == "ok"
    b = shards["hall-b"]
    assert b["status"] == "stale" and "cannot reach" in b["error"]
    assert b["age_s"] >= time.monotonic() - killed - 0.5 and b["last_ok_at"] is not None
    assert ov["it_power_kw"] == pytest.approx(alive["it_power_kw"], rel=1e-9)
    assert ov["gpus_reporting"] == GPUS
    time.sleep(1.0)
    later = {s["name"]: s for s in _get(view.url, "/api/v1/racks")["shards"]}
    assert later["hall-b"]["age_s"] >= b["age_s"] + 0.9  # the age grows while it is down
    health = httpx.get(view.url + "/healthz", timeout=30)
    assert health.status_code == 200
    h = health.json()
    assert h["status"] == "degraded" and "shard hall-b stale" in h["reason"]
    fams = list(text_string_to_metric_families(httpx.get(view.url + "/metrics").text))
    up = {s.labels["shard"]: s.value for f in fams for s in f.samples if f.name.endswith("up")}
    assert up == {"hall-a": 1.0, "hall-b": 0.0}
    age = [s.value for f in fams for s in f.samples if f.name.endswith("age_seconds")]
    assert not any(math.isnan(a) for a in age)
    received = {
        s.labels["shard"]
        for f in fams
        for s in f.samples
        if f.name == "dctwin_ingest_messages_received"
    }
    assert received == {"hall-a"}
    # the console says so, on every page, and still shows the shard that answers
    monkeypatch.setenv("DCTWIN_API_URL", view.url)
    st.cache_data.clear()
    for page in ("overview.py", "floor.py"):
        at = AppTest.from_file(str(REPO / "dashboards" / "pages" / page), default_timeout=60)
        at.run()
        assert not at.exception and not at.error, page
        [warning] = [w.value for w in at.warning if "hall-b" in w.value]
        assert "Shard **hall-b** is stale (no answer for" in warning and "cannot reach" in warning
        if page == "overview.py":  # hall-a's figures, still there
            assert page_figures(at)["IT power"][0].endswith("kW")
