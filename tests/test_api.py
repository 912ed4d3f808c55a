"""The HTTP API against a running service: every endpoint, bad requests, the token, /metrics,
Arrow IPC series; and `dctwin serve` end to end with the API in its process."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.ipc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import twin.api.routes.telemetry as telemetry_routes
from collectors.mqtt import wait_until
from twin.api import ARROW_STREAM, ApiContext, ApiServer
from twin.service import Service

from .helpers import API_TOKEN as TOKEN
from .helpers import PUMP_KEY, SMALL_SITE

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, start_service: Callable[..., Service]
) -> Iterator[Service]:
    s = start_service(tmp_path_factory.mktemp("api") / "api.duckdb")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(svc: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        yield c


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, (r.request.url, r.status_code, r.text)
    return r.json()


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_health_index_and_openapi_document_every_endpoint(client: httpx.Client) -> None:
    assert ok(client.get("/healthz"))["status"] == "ok"
    index = ok(client.get("/api/v1"))
    assert index["site"] == "small" and index["features"] == {"whatif": True}
    doc = ok(client.get("/openapi.json"))
    paths = set(doc["paths"])
    for p in (
        "/healthz",
        "/metrics",
        "/api/v1/site",
        "/api/v1/state/{kind}",
        "/api/v1/series",
        "/api/v1/overview",
        "/api/v1/racks",
        "/api/v1/racks/{name}",
        "/api/v1/power",
        "/api/v1/cooling",
        "/api/v1/network",
        "/api/v1/headroom",
        "/api/v1/headroom/history",
        "/api/v1/forecast",
        "/api/v1/hotspots",
        "/api/v1/fleets",
        "/api/v1/calibration",
        "/api/v1/status",
        "/api/v1/alerts",
        "/api/v1/alerts/{dedup_key}/ack",
        "/api/v1/silences",
        "/api/v1/silences/{silence_id}",
    ):
        assert p in paths, p
    assert doc["components"]["schemas"]["SeriesResponse"]["properties"]["unit"]
    assert client.get("/docs").status_code == 200


def test_site_and_latest_state(client: httpx.Client, svc: Service) -> None:
    site = ok(client.get("/api/v1/site"))
    assert site["counts"] == {
        "halls": 1,
        "rows": 1,
        "racks": 2,
        "nodes": 3,
        "gpus": 24,
        "pdus": 4,
        "cdus": 1,
        "links": 2,
        "fleets": 2,
    }
    assert site["site"]["halls"][0]["rows"][0]["racks"][0]["grid"] == [0, 0]
    gpu = ok(client.get("/api/v1/state/gpu"))
    assert gpu["units"]["temp_c"] == "°C" and gpu["units"]["power_w"] == "W"
    assert {d["id"] for d in gpu["devices"]} == {g for n in svc.site.nodes for g in n.gpu_ids()}
    assert all(d["ts"] == gpu["devices"][0]["ts"] for d in gpu["devices"])
    two = ok(client.get("/api/v1/state/gpu", params={"ids": "trn-r01-n1:0,inf-r02-n1:7"}))
    assert [d["id"] for d in two["devices"]] == ["inf-r02-n1:7", "trn-r01-n1:0"]
    assert 20 < two["devices"][0]["values"]["temp_c"] < 95
    cdu = ok(client.get("/api/v1/state/cdu"))
    assert {d["id"] for d in cdu["devices"]} == {"cdu-1", "cdu-1/pump1", "cdu-1/pump2"}


@pytest.mark.parametrize(
    ("path", "params", "code", "says"),
    [
        ("/api/v1/state/fridge", {}, 404, "unknown kind 'fridge'"),
        ("/api/v1/state/gpu", {"ids": "nope:0"}, 404, "unknown gpu id(s): nope:0"),
        ("/api/v1/state/gpu", {"ids": ","}, 400, "ids= is empty"),
        ("/api/v1/state/gpu", {"max_age_s": "-1"}, 422, "greater than 0"),
        ("/api/v1/series", {"kind": "fridge", "quantity": "temp_c"}, 400, "unknown kind"),
        ("/api/v1/series", {"kind": "gpu", "quantity": "temp_k"}, 400, "unknown quantity 'temp_k'"),
        ("/api/v1/series", {"kind": "gpu"}, 422, "quantity"),
        (
            "/api/v1/series",
            {"kind": "gpu", "quantity": "temp_c", "ids": "trn-r01-n1:0,ghost"},
            404,
            "unknown gpu id(s): ghost",
        ),
        (
            "/api/v1/series",
            {"kind": "gpu", "quantity": "temp_c", "start": "2026-01-02", "end": "2026-01-01"},
            400,
            "is not after start",
        ),
        (
            "/api/v1/series",
            {"kind": "gpu", "quantity": "temp_c", "start": "yesterday"},
            400,
            "is not a time",
        ),
        ("/api/v1/series", {"kind": "gpu", "quantity": "temp_c", "resolution": "5m"}, 422, "raw"),
        ("/api/v1/series", {"kind": "gpu", "quantity": "temp_c", "format": "csv"}, 400, "arrow"),
        ("/api/v1/series", {"kind": "gpu", "quantity": "temp_c", "agg": "median"}, 400, "sum"),
        (
            "/api/v1/series",
            {"kind": "gpu", "quantity": "temp_c", "agg": "sum", "resolution": "raw"},
            400,
            "agg= needs resolution 1m or 1h",
        ),
        ("/api/v1/headroom", {"kind": "fridge"}, 400, "unknown kind 'fridge'"),
        ("/api/v1/headroom", {"rack": "a99"}, 404, "no rack 'a99' in site"),
        ("/api/v1/headroom", {"cdu": "cdu-9"}, 404, "no CDU 'cdu-9' in site"),
        ("/api/v1/racks/r99", {}, 404, "no rack 'r99'"),
        ("/api/v1/forecast", {"horizon_s": "0"}, 422, "greater than 0"),
        ("/api/v1/fleets", {"target_util": "2"}, 422, "less than or equal to 1"),
        ("/api/v1/alerts", {"history": "-3"}, 422, "greater than or equal to 0"),
    ],
)
def test_bad_requests_get_a_4xx_with_the_reason(
    client: httpx.Client, path: str, params: dict, code: int, says: str
) -> None:
    r = client.get(path, params=params)
    assert r.status_code == code, (r.status_code, r.text)
    assert says in r.text, r.text


def test_series_json_picks_the_resolution_by_range(client: httpx.Client) -> None:
    ids = "trn-r01-n1:0,trn-r01-n2:5"
    raw = ok(client.get("/api/v1/series", params={"kind": "gpu", "quantity": "temp_c", "ids": ids}))
    assert raw["resolution"] == "raw" and raw["unit"] == "°C"
    assert [s["id"] for s in raw["series"]] == ["trn-r01-n1:0", "trn-r01-n2:5"]
    s0 = raw["series"][0]
    assert len(s0["t"]) == len(s0["value"]) == 20 * 60 and raw["points"] == 2 * 20 * 60
    assert s0["t"] == sorted(s0["t"]) and s0.get("min") is None
    end = datetime.fromisoformat(raw["end"])
    day = ok(
        client.get(
            "/api/v1/series",
            params={
                "kind": "gpu",
                "quantity": "temp_c",
                "ids": ids,
                "start": (end - timedelta(days=1)).isoformat(),
                "end": end.isoformat(),
            },
        )
    )
    assert day["resolution"] == "1m"
    m = day["series"][0]
    assert 15 <= len(m["t"]) <= 20  # complete minutes only
    assert all(lo <= v <= hi for lo, v, hi in zip(m["min"], m["value"], m["max"], strict=True))
    week = ok(
        client.get(
            "/api/v1/series",
            params={
                "kind": "cdu",
                "quantity": "heat_kw",
                "start": str((end - timedelta(days=7)).timestamp()),
                "end": str(end.timestamp()),
            },
        )
    )
    assert week["resolution"] == "1h"
    forced = ok(
        client.get(
            "/api/v1/series",
            params={"kind": "node", "quantity": "power_w", "resolution": "1m"},
        )
    )
    assert forced["resolution"] == "1m" and len(forced["series"]) == 3
    total = ok(
        client.get("/api/v1/series", params={"kind": "node", "quantity": "power_w", "agg": "sum"})
    )
    assert total["resolution"] == "1m" and [s["id"] for s in total["series"]] == ["sum"]
    per_node = {s["id"]: s for s in forced["series"]}
    t_last = total["series"][0]["t"][-1]
    summed = sum(s["value"][s["t"].index(t_last)] for s in per_node.values())
    assert total["series"][0]["value"][-1] == pytest.approx(summed)
    # each bucket says how many devices it sums: all three nodes in a complete minute
    devices = total["series"][0]["devices"]
    assert len(devices) == len(total["series"][0]["t"]) and max(devices) == 3
    assert forced["series"][0].get("devices") is None  # per device: no count


def test_headroom_history_is_the_tightest_limit_per_kind(client: httpx.Client) -> None:
    """GET /api/v1/headroom/history: per kind, each stored report's tightest limit as the share
    of its limit used, the same ranking as the overview's ten tightest (as twin.bands counts
    it: a temperature above the bands' reference, never a share of a Celsius value)."""
    from twin.bands import bands

    hist = ok(client.get("/api/v1/headroom/history", params={"hours": 24}))
    kinds = {k["kind"]: k for k in hist["kinds"]}
    assert {"gpu", "pdu_phase", "rack", "cdu", "loop", "link"} <= set(kinds)
    rows = ok(client.get("/api/v1/headroom"))["rows"]
    for kind, k in kinds.items():
        assert len(k["t"]) == len(k["used_pct"]) >= 1 and k["t"] == sorted(k["t"])
        mine = [r for r in rows if r["kind"] == kind and r["headroom_now"] is not None]
        used = max(
            bands().used_pct(r["limit"] - r["headroom_now"], r["limit"], r["unit"])
            for r in mine
            if r["limit"]
        )
        assert k["used_pct"][-1] == pytest.approx(used), kind
    assert client.get("/api/v1/headroom/history", params={"hours": 0}).status_code == 422
    assert ok(client.get("/api/v1/headroom/history", params={"hours": 1e-6}))["kinds"] == []


def test_series_arrow_ipc_decodes_and_matches_json(client: httpx.Client) -> None:
    params = {"kind": "gpu", "quantity": "power_w"}
    js = ok(client.get("/api/v1/series", params=params))
    r = client.get("/api/v1/series", params=params, headers={"Accept": ARROW_STREAM})
    assert r.status_code == 200 and r.headers["content-type"] == ARROW_STREAM
    table = pa.ipc.open_stream(io.BytesIO(r.content)).read_all()
    assert table.column_names == ["ts", "id", "value"]
    assert pa.types.is_dictionary(table.schema.field("id").type)
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta["unit"] == "W" and meta["resolution"] == "raw" and meta["quantity"] == "power_w"
    assert table.num_rows == js["points"] == 24 * 20 * 60
    assert len(set(table.column("id").to_pylist())) == 24
    r2 = client.get("/api/v1/series", params={**params, "format": "arrow", "resolution": "1m"})
    t2 = pa.ipc.open_stream(io.BytesIO(r2.content)).read_all()
    assert t2.column_names == ["ts", "id", "value", "min", "max"]


def test_series_too_large_for_json_says_how_to_get_it(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry_routes, "MAX_JSON_POINTS", 100)
    r = client.get("/api/v1/series", params={"kind": "gpu", "quantity": "temp_c"})
    assert r.status_code == 413 and ARROW_STREAM in r.json()["detail"]
    r = client.get(
        "/api/v1/series",
        params={"kind": "gpu", "quantity": "temp_c"},
        headers={"Accept": ARROW_STREAM},
    )
    assert r.status_code == 200


def test_overview_racks_power_cooling_network(client: httpx.Client) -> None:
    ov = ok(client.get("/api/v1/overview"))
    assert ov["site"] == "small" and ov["nodes_reporting"] == 3 and ov["gpus_reporting"] == 24
    assert 5 < ov["it_power_kw"] < 30 and 0 < ov["cooling_load_kw"] <= 20
    assert ov["cooling_capacity_kw"] == 20
    kinds = {h["kind"] for h in ov["headroom"]}
    assert {"gpu", "pdu_phase", "rack", "cdu", "loop", "link"} <= kinds
    assert len(ov["tightest"]) == 10
    assert ov["alerts"]["enabled"] and ov["alerts"]["by_severity"].get("critical", 0) >= 1
    assert ov["ingest"]["received"] > 0 and ov["ingest"]["dead_letters_stored"] == {}
    racks = ok(client.get("/api/v1/racks"))["racks"]
    assert [(r["name"], r["grid_col"], r["grid_row"]) for r in racks] == [
        ("r01", 0, 0),
        ("r02", 1, 0),
    ]
    r01 = racks[0]
    assert r01["cdu"] == "cdu-1" and r01["gpus"] == 16 and r01["power_kw"] > 1
    assert r01["alerts"] >= 1  # the CDU's pump alert names the racks it serves
    detail = ok(client.get("/api/v1/racks/r01"))
    # one rack's summary is read for its own devices and rows: the same as in the listing
    assert detail["rack"] == r01 and ok(client.get("/api/v1/racks/r02"))["rack"] == racks[1]
    assert [n["name"] for n in detail["nodes"]] == ["trn-r01-n1", "trn-r01-n2"]
    assert len(detail["nodes"][0]["gpus"]) == 8
    assert all(g["temp_c"] is not None for n in detail["nodes"] for g in n["gpus"])
    phases = {p["id"]: p for p in detail["phases"]}
    assert phases["pdu-r01-a/L1"]["limit_a"] == pytest.approx(25.6)
    assert phases["pdu-r01-a/L1"]["current_a"] > 0
    pumps = {p["name"]: p for p in detail["cdu"]["pumps"]}
    assert pumps["pump1"]["running"] is False and pumps["pump2"]["running"] is True
    assert detail["cdu"]["racks"] == ["r01"]
    assert ok(client.get("/api/v1/racks/r02"))["cdu"] is None
    power = ok(client.get("/api/v1/power"))["phases"]
    assert len(power) == 4 * 6  # 3 phases + 3 breakers per PDU
    cdus = ok(client.get("/api/v1/cooling"))["cdus"]
    assert cdus[0]["name"] == "cdu-1" and 0 < cdus[0]["capacity_used_pct"] <= 100
    links = ok(client.get("/api/v1/network"))["links"]
    assert {lk["name"] for lk in links} == {"lnk-r01-s1", "lnk-r02-s1"}
    assert all(lk["utilization_pct"] is not None for lk in links)


def test_headroom_forecast_hotspots_fleets_calibration_status(client: httpx.Client) -> None:
    hr = ok(client.get("/api/v1/headroom"))
    assert hr["computed_at"] and len(hr["rows"]) > 24
    gpus = ok(client.get("/api/v1/headroom", params={"kind": "gpu"}))["rows"]
    assert len(gpus) == 24 and all(r["unit"] == "K" for r in gpus)
    r01 = ok(client.get("/api/v1/headroom", params={"rack": "r01", "kind": "gpu"}))["rows"]
    assert len(r01) == 16
    fc = ok(client.get("/api/v1/forecast", params={"horizon_s": 3600}))
    assert {e["id"] for e in fc["entities"]} >= {"train-small", "r01"}
    for e in fc["entities"]:  # the model, its skill and the origins it was scored on
        assert e["model"] and e["note"] and e["skill"] and e["origins_scored"] >= 0, e
        assert e["interval"]["basis"] and min(x for x in e["p05_w"] if x is not None) >= 0
    assert ok(client.get("/api/v1/hotspots"))["k_sigma"] == 3.0
    assert ok(client.get("/api/v1/hotspots", params={"k_sigma": 5}))["k_sigma"] == 5.0
    fleets = ok(client.get("/api/v1/fleets"))
    assert [f["fleet"] for f in fleets["fleets"]] == ["infer-small"]
    # the window the figures had (20 simulated minutes), not the 24 h asked for
    [fleet] = fleets["fleets"]
    assert fleet["covered_s"] == pytest.approx(1200, abs=90)  # + one bucket step
    assert fleet["covered"] in ("20 min", "21 min")
    assert fleet["reason"].startswith(f"not judged: {fleet['covered']} of data in a 24 h window")
    assert not fleet["judged"] and not fleet["flagged"]
    assert ok(client.get("/api/v1/fleets", params={"window_s": 600}))["window_s"] == 600
    cal = ok(client.get("/api/v1/calibration"))
    assert cal["run"]["run_id"] == 1 and cal["runs"] == 1
    assert cal["run"]["source"] == "fit" and cal["fits"] == 1 and cal["run"]["seeded_from"] is None
    assert re.fullmatch(
        r"fitted on live data at (?:\d{4}-\d\d-\d\d )?\d\d:\d\d UTC", cal["note"]
    ), cal["note"]
    assert cal["first_fit_expected_at"] is None  # fitted already (and no scheduler here)
    classes = {c["device_class"]: c for c in cal["classes"]}
    assert any(c.startswith("gpu:") for c in classes)
    gpu_cls = next(c for k, c in classes.items() if k.startswith("gpu:"))
    assert gpu_cls["devices"] > 0 and 0 <= gpu_cls["usable_fraction"] <= 1
    st = ok(client.get("/api/v1/status"))
    assert st["samples"]["gpu"] == 24 * 20 * 60 and st["dead_letters"] == {}
    assert st["service"]["ingest"]["stored_messages"] > 0
    assert st["service"]["detection"]["runs"] == 2


def test_metrics_parse_as_prometheus_text(client: httpx.Client) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    # headroom: one family per unit, named with it (no unit label anywhere)
    units = ("celsius", "amperes", "watts", "liters_per_second", "bytes_per_second")
    heads = {u: fams[f"dctwin_headroom_{u}"] for u in units}
    kinds = {u: {s.labels["kind"] for s in f.samples} for u, f in heads.items()}
    assert kinds == {
        "celsius": {"gpu", "loop"},
        "amperes": {"pdu_phase"},
        "watts": {"rack", "cdu"},
        "liters_per_second": {"cdu"},
        "bytes_per_second": {"link"},
    }
    assert all(
        set(s.labels) == {"kind", "id", "quantity"}
        for f in fams.values()
        for s in f.samples
        if f.name.startswith("dctwin_headroom_") and "timestamp" not in f.name
    )
    assert not any("unit" in s.labels for f in fams.values() for s in f.samples)
    gpu = next(s for s in heads["celsius"].samples if s.labels["id"] == "trn-r01-n1:0")
    assert gpu.labels["quantity"] == "temp_c"
    rows = ok(client.get("/api/v1/headroom"))["rows"]
    api = {(r["kind"], r["id"], r["quantity"]): r for r in rows}
    for s in heads["watts"].samples:  # the API's kW as W
        r = api[(s.labels["kind"], s.labels["id"], s.labels["quantity"])]
        assert s.value == pytest.approx(1000 * r["headroom_now"], rel=1e-9)
    for s in fams["dctwin_headroom_limit_celsius"].samples:  # an absolute limit in °C
        assert s.value == api[(s.labels["kind"], s.labels["id"], s.labels["quantity"])]["limit"]
    n_limits = sum(len(f.samples) for f in heads.values())
    assert n_limits == len(fams["dctwin_headroom_ratio"].samples) == len(rows)
    received = fams["dctwin_ingest_messages_received"]
    assert received.type == "counter" and received.samples[0].value > 0
    assert {s.labels["kind"] for s in fams["dctwin_ingest_samples"].samples} >= {"gpu", "cdu"}
    assert "dctwin_dead_letters" in fams
    assert any(
        s.labels["device_class"].startswith("gpu:") for s in fams["dctwin_calibration_mae"].samples
    )
    crit = [s for s in fams["dctwin_alerts_active"].samples if s.labels["severity"] == "critical"]
    assert crit[0].value >= 1
    assert fams["dctwin_newest_sample_timestamp_seconds"].samples


def test_metrics_name_and_match_filters(client: httpx.Client) -> None:
    """``name[]`` and ``match[]`` keep only the families they name (a large shard's scraper
    takes what it graphs); a selector /metrics cannot apply is a 400 naming it."""

    def names(params: list[tuple[str, str]]) -> set[str]:
        r = client.get("/metrics", params=params)
        assert r.status_code == 200, r.text
        return {f.name for f in text_string_to_metric_families(r.text)}

    everything = names([])
    assert names([("name[]", "dctwin_headroom_celsius")]) == {"dctwin_headroom_celsius"}
    assert names(
        [("name[]", "dctwin_headroom_ratio"), ("name[]", "dctwin_ingest_messages_received_total")]
    ) == {"dctwin_headroom_ratio", "dctwin_ingest_messages_received"}
    headroom = {n for n in everything if n.startswith("dctwin_headroom_")}
    assert len(headroom) == 3 * 5 + 2  # now, min p90 and limit per unit; ratio; report time
    assert names([("match[]", '{__name__=~"dctwin_headroom_.*"}')]) == headroom
    assert names([("match[]", "dctwin_alerts_active")]) == {"dctwin_alerts_active"}
    assert names([("match[]", '{__name__="dctwin_headroom_amperes"}')]) == {
        "dctwin_headroom_amperes"
    }
    r = client.get("/metrics", params={"match[]": 'up{job="x"}'})
    assert r.status_code == 400 and "match[]='up{job=" in r.json()["detail"]
    r = client.get("/metrics", params={"match[]": '{__name__=~"("}'})
    assert r.status_code == 400 and "not a regular expression" in r.json()["detail"]


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian: apt-get install prometheus; .ci/run installs it)",
)
def test_metrics_pass_promtool_check_metrics(client: httpx.Client) -> None:
    """`promtool check metrics` (Prometheus' own linter: names, units, counters, help) finds
    nothing in /metrics."""
    text = client.get("/metrics").text
    assert "dctwin_headroom_celsius{" in text
    r = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_alerts_ack_needs_the_token(client: httpx.Client, svc: Service) -> None:
    alerts = ok(client.get("/api/v1/alerts"))
    assert alerts["enabled"] and "cdu_pump_lost" in alerts["rules"]
    active = {a["dedup_key"]: a for a in alerts["active"]}
    assert PUMP_KEY in active and active[PUMP_KEY]["severity"] == "critical"
    assert active[PUMP_KEY]["acknowledged"] is None
    assert active[PUMP_KEY]["flapping"] is False and active[PUMP_KEY]["repeat"] == 0
    # the incident names the racks its CDU cools (r02 is air-cooled) and the page's summary
    assert active[PUMP_KEY]["racks"] == ["r01"] and "pump" in active[PUMP_KEY]["summary"]
    # what the console's triage list orders and shows by: each member's current value and
    # the rule's metric, comparison and threshold (one pump of two running, fires below 2)
    pump = active[PUMP_KEY]
    assert pump["values"] == {"cdu-1": 1.0}
    assert (pump["metric"], pump["op"], pump["threshold"]) == ("cdu.pumps_running", "<", 2.0)
    fired = [e for e in alerts["history"] if e["dedup_key"] == PUMP_KEY]
    assert fired and fired[0]["status"] == "firing" and "pump" in fired[0]["summary"]
    url = f"/api/v1/alerts/{PUMP_KEY}/ack"
    r = client.post(url)
    assert r.status_code == 401 and "Bearer" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    r = client.post(url, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and "wrong bearer token" in r.text
    r = client.post("/api/v1/alerts/dctwin/small/nope/cdu/x/ack", headers=AUTH)
    assert r.status_code == 404 and "no open incident" in r.text
    r = client.post(url, headers=AUTH, json={"by": "alice", "comment": "on it", "x": 1})
    assert r.status_code == 422  # unknown field
    r = client.post(url, headers=AUTH, json={"by": "alice", "comment": "on it"})
    assert r.status_code == 200, r.text
    assert r.json()["acknowledged"]["acked_by"] == "alice" and r.json()["outbox_rows"] == 1
    encoded = client.post(url.replace(PUMP_KEY, PUMP_KEY.replace("/", "%2F")), headers=AUTH)
    assert encoded.status_code == 200
    after = ok(client.get("/api/v1/alerts"))
    acked = next(a for a in after["active"] if a["dedup_key"] == PUMP_KEY)["acknowledged"]
    assert acked["acked_by"] in ("alice", "api")
    assert any(e["status"] == "acknowledge" and e["by"] == "alice" for e in after["history"])
    assert (
        ok(client.get("/api/v1/overview"))["alerts"]["unacknowledged"] == len(after["active"]) - 1
    )


def test_silences_add_list_end(client: httpx.Client) -> None:
    body = {"matchers": {"rule": "gpu_temp_high"}, "duration_s": 3600, "created_by": "bob"}
    assert client.post("/api/v1/silences", json=body).status_code == 401
    r = client.post("/api/v1/silences", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    sil = r.json()
    assert sil["active"] and sil["matchers"] == {"rule": "gpu_temp_high"}
    ends = datetime.fromisoformat(sil["ends_at"]) - datetime.fromisoformat(sil["starts_at"])
    assert ends == timedelta(hours=1)
    listed = ok(client.get("/api/v1/silences", params={"active_only": True}))["silences"]
    assert sil["id"] in {s["id"] for s in listed}
    one = ok(client.get("/api/v1/silences", params={"limit": 1}))
    assert [s["id"] for s in one["silences"]] == [sil["id"]]  # the newest
    assert one["total"] >= 1 and one["total"] == len(ok(client.get("/api/v1/silences"))["silences"])
    for bad, says in (
        ({**body, "ends_at": "2030-01-01T00:00:00Z"}, "exactly one of ends_at and duration_s"),
        ({"matchers": {}, "duration_s": 60, "created_by": "x"}, "matchers"),
        ({"matchers": {"rule": "x"}, "duration_s": 60}, "created_by"),
    ):
        r = client.post("/api/v1/silences", json=bad, headers=AUTH)
        assert r.status_code == 422 and says in r.text, r.text
    past = {"matchers": {"rule": "x"}, "ends_at": "2020-01-01T00:00:00Z", "created_by": "x"}
    r = client.post("/api/v1/silences", json=past, headers=AUTH)
    assert r.status_code == 400 and "must be after" in r.text
    assert client.delete(f"/api/v1/silences/{sil['id']}").status_code == 401
    r = client.delete(f"/api/v1/silences/{sil['id']}", headers=AUTH)
    assert r.status_code == 200 and r.json()["active"] is False
    assert client.delete("/api/v1/silences/nope", headers=AUTH).status_code == 404


def test_without_a_token_writes_are_refused_with_how_to_set_one(svc: Service) -> None:
    ctx = ApiContext(svc.store, site=svc.site, token=None)
    with ApiServer(ctx, port=0) as server, httpx.Client(base_url=server.url) as c:
        r = c.post(
            "/api/v1/silences",
            json={"matchers": {"rule": "x"}, "duration_s": 60, "created_by": "x"},
            headers=AUTH,
        )
        assert r.status_code == 403
        assert "--api-token" in r.json()["detail"] and "DCTWIN_API_TOKEN" in r.text
        assert c.delete("/api/v1/silences/x").status_code == 403
        # no alert engine in this context: alerts are off, said so, not an error
        assert c.get("/api/v1/alerts").json()["enabled"] is False
        assert c.get("/api/v1/overview").status_code == 200


def test_without_a_site_the_site_endpoints_say_so(svc: Service) -> None:
    ctx = ApiContext(svc.store)
    with ApiServer(ctx, port=0) as server, httpx.Client(base_url=server.url) as c:
        for path in ("/api/v1/site", "/api/v1/racks", "/api/v1/cooling", "/api/v1/fleets"):
            r = c.get(path)
            assert r.status_code == 404 and "--site" in r.text, path
        assert c.get("/api/v1/state/gpu", params={"ids": "ghost"}).status_code == 404
        assert c.get("/api/v1/state/gpu", params={"ids": "trn-r01-n1:0"}).status_code == 200


@pytest.mark.mqtt
@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_serve_runs_the_api_in_its_process(broker, tmp_path: Path) -> None:
    db = tmp_path / "serve.duckdb"
    log = tmp_path / "serve.log"
    env = {**os.environ, **broker.client_env(), "DCTWIN_API_TOKEN": "s3cret-token-0123"}
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "twin.cli",
            "serve",
            "--broker",
            broker.address,
            "--db",
            str(db),
            "--site",
            str(SMALL_SITE),
            "--api-port",
            "0",
            "--detect-every",
            "2",
            "--calibrate-every",
            "0",
            "--api-allowed-hosts",
            "twin, twin.example.com",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
    )
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or serve.poll() is not None, 60)
        text = log.read_text()
        assert "s3cret-token-0123" not in text  # the token never reaches the log
        url = re.search(r"api: (http://127\.0\.0\.1:\d+)", text).group(1)  # type: ignore[union-attr]
        start = (datetime.now(UTC) - timedelta(seconds=120)).replace(microsecond=0)
        sim = subprocess.run(
            [
                sys.executable,
                "-m",
                "twin.cli",
                "sim",
                "--site",
                str(SMALL_SITE),
                "--broker",
                broker.address,
                "--duration",
                "120",
                "--speed",
                "0",
                "--start",
                start.isoformat(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert sim.returncode == 0, sim.stderr
        with httpx.Client(base_url=url, timeout=30) as c:

            def landed() -> bool:
                st = c.get("/api/v1/status").json()
                return st["samples"]["gpu"] == 24 * 120

            assert wait_until(landed, 30)
            assert wait_until(lambda: c.get("/api/v1/headroom").json()["computed_at"], 30)
            gpu = c.get("/api/v1/state/gpu").json()
            assert len(gpu["devices"]) == 24
            racks = c.get("/api/v1/racks").json()["racks"]
            assert all(r["power_kw"] for r in racks)
            body = {"matchers": {"rule": "x"}, "duration_s": 60, "created_by": "t"}
            assert c.post("/api/v1/silences", json=body).status_code == 401
            r = c.post(
                "/api/v1/silences", json=body, headers={"Authorization": "Bearer s3cret-token-0123"}
            )
            assert r.status_code == 201
            # the service's own counters
            fams = {f.name for f in text_string_to_metric_families(c.get("/metrics").text)}
            assert "dctwin_ingest_messages_received" in fams
            # the service's health, with the API as one of its loops
            health = c.get("/healthz").json()
            assert health["loops"]["api"]["successes_total"] > 0
            assert "dctwin_loop_errors" in fams and "dctwin_ingest_stalled" in fams
            # the Host check: the address, localhost and --api-allowed-hosts; nothing else
            port = httpx.URL(url).port
            for host, code in (
                (f"twin:{port}", 200),
                ("twin.example.com", 200),
                (f"localhost:{port}", 200),
                ("evil.example", 400),
            ):
                assert c.get("/healthz", headers={"Host": host}).status_code == code, host
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
    assert serve.returncode == 0, log.read_text()


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_whatif_jobs_run_scenarios_on_a_bundle(client: httpx.Client) -> None:
    listing = ok(client.get("/api/v1/whatif"))
    assert "demo_bundle" in listing["bundles"]
    assert "four-more-b200-racks" in listing["scenarios"]
    body = {"bundle": "demo_bundle", "scenarios": ["four-more-b200-racks"]}
    assert client.post("/api/v1/whatif", json=body).status_code == 401  # the token guards it
    r = client.post("/api/v1/whatif", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    bad = client.post("/api/v1/whatif", json={"bundle": "nope", "scenarios": ["x"]}, headers=AUTH)
    assert bad.status_code == 404 and "nope" in bad.json()["detail"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = ok(client.get(f"/api/v1/whatif/{job}"))
        if state["state"] in ("done", "failed"):
            break
        time.sleep(0.5)
    assert state["state"] == "done", state
    assert state["verdicts"] == {"four-more-b200-racks": "does not fit"}
    names = [r["name"] for r in state["results"]]
    assert names == ["baseline", "four-more-b200-racks"]
    html = client.get(f"/api/v1/whatif/{job}/report.html")
    assert html.status_code == 200 and "four-more-b200-racks" in html.text
    assert client.get("/api/v1/whatif/nojob").status_code == 404


GRAFANA = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "dctwin.json"
_PROMQL_WORDS = {
    "sum", "min", "max", "count", "avg", "by", "on", "and", "or", "unless", "without",
    "bottomk", "topk", "rate", "increase", "time", "group_left", "label_replace",
}  # fmt: skip


def test_grafana_dashboard_queries_only_exported_metrics(
    client: httpx.Client, svc: Service
) -> None:
    """Every metric and grouping label deploy/grafana/dctwin.json queries is in /metrics."""
    import json

    dash = json.loads(GRAFANA.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    fams = list(text_string_to_metric_families(client.get("/metrics").text))
    labels: dict[str, set[str]] = {}  # every exported name (a family may have no sample yet)
    for f in fams:
        labels.setdefault(f.name + ("_total" if f.type == "counter" else ""), set())
        for s in f.samples:
            labels.setdefault(s.name, set()).update(s.labels)
    # a family without a sample yet (no dead letter in this store) has its label names only in
    # the collector: the families the API's registry yields declare them
    assert svc.api_server is not None
    for f in svc.api_server.app.state.api.registry.collect():
        name = f.name + ("_total" if f.type == "counter" else "")
        labels.setdefault(name, set()).update(getattr(f, "_labelnames", ()))
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert len(exprs) >= 15
    for full in exprs:
        assert full.count("(") == full.count(")"), full
        expr = re.sub(r'"[^"]*"', '""', full)  # string literals (label_replace's) name no metric
        names = set(re.findall(r"\bdctwin_[a-z0-9_]+", expr))
        assert names, expr
        for n in names:
            assert n in labels, f"{n} (in {expr!r}) is not exported"
        have = set().union(*(labels[n] for n in names))
        for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
            for lab in (x.strip() for x in clause.split(",")):
                assert lab in have, f"label {lab!r} of {expr!r} is on none of {names}"
        for sel in re.findall(r"\{([^}]*)\}", expr):
            for lab in re.findall(r"([a-z_]+)=", sel):
                assert lab in have, f"label {lab!r} of {expr!r}"
        words = set(re.findall(r"\b[a-z_]+\b(?=\s*\()", expr)) - names
        assert words <= _PROMQL_WORDS, (expr, words - _PROMQL_WORDS)

    # the ratio the dashboard ranks by is headroom / |limit| of the same series (of the
    # family of its unit: both scaled alike)
    def values(prefix: str) -> dict[tuple, float]:
        return {
            tuple(sorted(s.labels.items())): s.value
            for f in fams
            if re.fullmatch(
                prefix + r"_(celsius|amperes|watts|liters_per_second|bytes_per_second)", f.name
            )
            for s in f.samples
        }

    heads, limits = values("dctwin_headroom"), values("dctwin_headroom_limit")
    ratios = [
        (tuple(sorted(s.labels.items())), s.value)
        for f in fams
        if f.name == "dctwin_headroom_ratio"
        for s in f.samples
    ]
    assert len(ratios) > 20
    for lv, ratio in ratios:
        assert ratio == pytest.approx(heads[lv] / abs(limits[lv]), rel=1e-9)
