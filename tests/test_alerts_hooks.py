"""Hooks and the outbox against real local HTTP servers that record every request.

Each server is a ThreadingHTTPServer on 127.0.0.1 that answers as its service does (PagerDuty
202 ``{"status": "success"}``, Slack 200 ``ok``, Alertmanager 200, webhook 200) and can be made
to answer 500 or to refuse connections, then come back. Every payload is checked against the
service's documented schema, written here as pydantic models. Time is a fake clock: "five
minutes down" is simulated, not slept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

from collectors.mqtt import wait_until
from twin.alerts import (
    AlertEngine,
    Delivery,
    Observation,
    Outbox,
    Topology,
    load_hooks,
    load_rules,
    parse_hooks,
    parse_rules,
    webhook_json_schema,
)
from twin.alerts.reload import AlertReloader
from twin.health import ServiceHealth
from twin.site import load_site
from twin.store import Store

from .helpers import ROUTING_KEY, SMALL_SITE, Recorder, check_schemas, hooks_for

T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, s: float) -> datetime:
        self.now += timedelta(seconds=s)
        return self.now


# The engine is metric-agnostic: these rules drive one registered GPU metric
# (twin.alerts.metrics) with temperature-like values, and the CDU pump count.
RULES = """
rules:
  - name: gpu_temp_high
    metric: hotspot.gpu.over_limit_k
    entity_kind: gpu
    op: ">="
    value: 84
    clear_value: 80
    for_s: 30
    severity: warning
    group_by: rack
    labels: {team: ml-infra}
  - name: cdu_pump_lost
    metric: cdu.pumps_running
    entity_kind: cdu
    op: "<"
    value: 2
    severity: critical
    group_by: cdu
    summary: "CDU {entity_id}: {value:g} pumps running"
    labels: {team: facilities}
    inhibits:
      - {rule: gpu_temp_high, along: cooling}
"""

R01_GPUS = [f"trn-r01-n{n}:{i}" for n in (1, 2) for i in range(8)]


def pumps_stopped_now() -> list[Observation]:
    """cdu-1 with no pump running, observed now (fires cdu_pump_lost)."""
    return [
        Observation(
            metric="cdu.pumps_running",
            entity_kind="cdu",
            entity_id="cdu-1",
            value=0,
            ts=datetime.now(UTC),
        )
    ]


def observe(clock: Clock, pumps: float, temp_c: float) -> list[Observation]:
    ts = clock.now
    return [
        Observation(
            metric="cdu.pumps_running", entity_kind="cdu", entity_id="cdu-1", value=pumps, ts=ts
        ),
        *(
            Observation(
                metric="hotspot.gpu.over_limit_k",
                entity_kind="gpu",
                entity_id=g,
                value=temp_c,
                ts=ts,
            )
            for g in R01_GPUS
        ),
    ]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "twin.duckdb") as s:
        yield s


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.from_site(load_site(SMALL_SITE))


# ---- acceptance: CDU pump failure ----------------------------------------------------------


def test_cdu_pump_failure_one_grouped_page_per_hook_then_resolve(
    servers: dict[str, Recorder], store: Store, topo: Topology
) -> None:
    clock = Clock()
    outbox = Outbox(store, hooks_for(servers), clock)
    engine = AlertEngine(parse_rules(RULES), topo, outbox, clock)

    engine.evaluate(observe(clock, 2, 60))
    outbox.deliver()
    clock.advance(10)
    engine.evaluate(observe(clock, 0, 62))  # both pumps stop
    outbox.deliver()
    for _ in range(30):  # five minutes: the GPUs heat up past their limit, for_s passes
        clock.advance(10)
        engine.evaluate(observe(clock, 0, 92))
        outbox.deliver()
    clock.advance(10)
    engine.evaluate(observe(clock, 2, 70))  # pumps back, loop and GPUs cool
    outbox.deliver()
    resolved_at = clock.now

    check_schemas(servers)
    key = "dctwin/small/cdu_pump_lost/cdu/cdu-1"
    web = servers["webhook"].accepted()
    assert [(b["event"], b["dedup_key"]) for b in web] == [("firing", key), ("resolved", key)]
    page = web[0]["notification"]
    assert page["group"] == {"kind": "cdu", "id": "cdu-1"}
    assert page["severity"] == "critical"
    assert "CDU cdu-1 cools racks r01" in page["description"]
    assert page["labels"]["racks"] == "r01"
    assert web[1]["notification"]["ends_at"] == resolved_at.isoformat().replace("+00:00", "Z")

    pd = servers["pagerduty"].accepted()
    assert [(b["event_action"], b["dedup_key"]) for b in pd] == [
        ("trigger", key),
        ("resolve", key),
    ]
    assert pd[0]["routing_key"] == ROUTING_KEY
    assert pd[0]["payload"]["severity"] == "critical"
    assert "cdu-1" in pd[0]["payload"]["summary"]
    assert "r01" in pd[0]["payload"]["custom_details"]["description"]

    slack = servers["slack"].accepted()
    assert len(slack) == 2 and "FIRING" in slack[0]["text"] and "RESOLVED" in slack[1]["text"]
    assert "r01" in json.dumps(slack[0]["blocks"]) and key in json.dumps(slack[0]["blocks"])

    am = [b[0] for b in servers["alertmanager"].accepted()]
    assert len(am) == 2 and am[0]["labels"] == am[1]["labels"]  # one alert in Alertmanager
    assert am[0]["labels"]["alertname"] == "cdu_pump_lost"
    assert am[0]["startsAt"] == am[1]["startsAt"]
    assert datetime.fromisoformat(am[1]["endsAt"]) == resolved_at

    # no GPU temperature alert went anywhere
    every = json.dumps([r.body for rec in servers.values() for r in rec.requests])
    assert "gpu_temp_high" not in every
    assert outbox.pending() == 0


# ---- acceptance: a hook down for five minutes ----------------------------------------------


def test_one_incidents_retries_never_delay_anothers_first_delivery(
    servers: dict[str, Recorder], store: Store, topo: Topology
) -> None:
    """Issue 28: an event retrying on a hook (here with a 30 s back-off) held the hook's other
    rows, so two other incidents' first pages on that hook waited 31 s. Now they go at once."""
    clock = Clock()
    outbox = Outbox(store, hooks_for(servers), clock, base_backoff_s=30.0)
    engine = AlertEngine(parse_rules(RULES.replace("for_s: 30", "for_s: 0")), topo, outbox, clock)
    web = servers["webhook"]
    web.mode = "500"
    engine.evaluate(
        [
            Observation(
                metric="hotspot.gpu.over_limit_k",
                entity_kind="gpu",
                entity_id="trn-r01-n1:0",
                value=90,
                ts=clock.now,
            )
        ]
    )
    outbox.deliver()
    assert [r.status for r in web.requests] == [503]  # retrying, 30 s from now
    web.mode = "up"
    clock.advance(1)
    engine.evaluate(
        [
            Observation(
                metric="hotspot.gpu.over_limit_k",
                entity_kind="gpu",
                entity_id="inf-r02-n1:3",
                value=88,
                ts=clock.now,
            ),
            Observation(
                metric="cdu.pumps_running",
                entity_kind="cdu",
                entity_id="cdu-1",
                value=1,
                ts=clock.now,
            ),
        ]
    )
    clock.advance(1)
    outbox.deliver()
    firsts = {(b["dedup_key"], b["event"]) for b in web.accepted()}
    assert firsts == {
        ("dctwin/small/gpu_temp_high/rack/r02", "firing"),
        ("dctwin/small/cdu_pump_lost/cdu/cdu-1", "firing"),
    }
    assert len(web.requests) == 3  # the first incident waits for its own retry time
    clock.advance(30)
    outbox.deliver()
    assert ("dctwin/small/gpu_temp_high/rack/r01", "firing") in {
        (b["dedup_key"], b["event"]) for b in web.accepted()
    }


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_hooks_down_five_minutes_get_every_alert_once_per_key(
    servers: dict[str, Recorder], store: Store, topo: Topology
) -> None:
    clock = Clock()
    outbox = Outbox(store, hooks_for(servers), clock)
    engine = AlertEngine(parse_rules(RULES.replace("for_s: 30", "for_s: 0")), topo, outbox, clock)
    servers["webhook"].mode = servers["pagerduty"].mode = "500"  # answering, failing
    servers["slack"].stop()  # refusing connections
    servers["alertmanager"].stop()

    def temp(gpu: str, v: float) -> Observation:
        return Observation(
            metric="hotspot.gpu.over_limit_k",
            entity_kind="gpu",
            entity_id=gpu,
            value=v,
            ts=clock.now,
        )

    engine.evaluate([temp("trn-r01-n1:0", 90), temp("inf-r02-n1:3", 88)])  # two incidents
    for _ in range(60):
        clock.advance(1)
        outbox.deliver()
    engine.evaluate([temp("trn-r01-n1:0", 70)])  # r01 resolves while the hooks are down
    engine.evaluate(
        [
            Observation(
                metric="cdu.pumps_running",
                entity_kind="cdu",
                entity_id="cdu-1",
                value=1,
                ts=clock.now,
            )
        ]
    )
    while clock.now < T0 + timedelta(minutes=5):
        clock.advance(1)
        outbox.deliver()
    assert all(not r.accepted() for r in servers.values())
    failed_attempts = len(servers["webhook"].requests)
    assert 5 <= failed_attempts <= 20  # backed off, not hammered once a second

    servers["webhook"].mode = servers["pagerduty"].mode = "up"
    servers["slack"].start()  # same ports again
    servers["alertmanager"].start()
    for _ in range(120):
        clock.advance(1)
        outbox.deliver()
    assert outbox.pending() == 0
    check_schemas(servers)

    k_r01 = "dctwin/small/gpu_temp_high/rack/r01"
    k_r02 = "dctwin/small/gpu_temp_high/rack/r02"
    k_cdu = "dctwin/small/cdu_pump_lost/cdu/cdu-1"
    expect = sorted([(k_r01, "firing"), (k_r01, "resolved"), (k_r02, "firing"), (k_cdu, "firing")])
    web = [(b["dedup_key"], b["event"]) for b in servers["webhook"].accepted()]
    pd = [
        (b["dedup_key"], {"trigger": "firing", "resolve": "resolved"}[b["event_action"]])
        for b in servers["pagerduty"].accepted()
    ]
    am = [
        (
            a["labels"]["dedup_key"],
            # a firing alert is posted with endsAt ahead, its resolve with the resolve time
            "resolved" if datetime.fromisoformat(a["endsAt"]) <= clock.now else "firing",
        )
        for b in servers["alertmanager"].accepted()
        for a in b
    ]
    slack = [
        (
            next(k for k in (k_r01, k_r02, k_cdu) if k in json.dumps(b["blocks"])),
            "resolved" if "RESOLVED" in b["text"] else "firing",
        )
        for b in servers["slack"].accepted()
    ]
    for name, got in (("webhook", web), ("pagerduty", pd), ("alertmanager", am), ("slack", slack)):
        assert sorted(got) == expect, name  # every alert, once per (dedup key, status)
        assert got.index((k_r01, "firing")) < got.index((k_r01, "resolved")), name
    rows = outbox.rows()
    assert all(r["state"] == "delivered" for r in rows)
    retried = [r for r in rows if r["attempts"] > 1]
    assert retried and all(r["last_error"] for r in retried)
    assert any("503" in r["last_error"] for r in retried if r["hook"] == "pd")
    assert any("Connect" in r["last_error"] for r in retried if r["hook"] == "slack")


def test_outbox_survives_restart_and_never_doubles_a_pending_row(
    servers: dict[str, Recorder], tmp_path: Path, topo: Topology
) -> None:
    clock = Clock()
    servers["webhook"].mode = "500"
    path = tmp_path / "twin.duckdb"
    with Store(path) as store:
        outbox = Outbox(store, hooks_for(servers)[:1], clock)
        engine = AlertEngine(parse_rules(RULES.replace("for_s: 30", "for_s: 0")), topo, outbox)
        [n] = engine.evaluate(
            [
                Observation(
                    metric="hotspot.gpu.over_limit_k",
                    entity_kind="gpu",
                    entity_id="trn-r01-n1:0",
                    value=90,
                    ts=clock.now,
                )
            ],
            clock.now,
        )
        outbox.deliver()
        assert outbox.enqueue(n) == 1  # the same event again: updates the pending row
        assert len(outbox.rows()) == 1 and outbox.rows()[0]["attempts"] == 1
    servers["webhook"].mode = "up"
    with Store(path) as store:  # restarted service: the pending row is still there
        outbox = Outbox(store, hooks_for(servers)[:1], clock)
        clock.advance(5)
        report = outbox.deliver()
        assert len(report.delivered) == 1
        assert outbox.enqueue(n) == 0  # delivered already: an idempotent no-op
        outbox.deliver()
    assert [b["event_id"] for b in servers["webhook"].accepted()] == [n.event_id]


def test_pagerduty_400_is_permanent_and_acknowledge_is_sent(
    servers: dict[str, Recorder], store: Store, topo: Topology
) -> None:
    clock = Clock()
    outbox = Outbox(store, hooks_for(servers), clock)
    engine = AlertEngine(parse_rules(RULES), topo, outbox, clock)
    [n] = engine.evaluate(
        [
            Observation(
                metric="cdu.pumps_running",
                entity_kind="cdu",
                entity_id="cdu-1",
                value=0,
                ts=clock.now,
            )
        ]
    )
    outbox.deliver()
    assert engine.acknowledge(n.dedup_key) == 2  # PagerDuty and the webhook take acks
    outbox.deliver()
    check_schemas(servers)
    assert [b["event_action"] for b in servers["pagerduty"].accepted()] == [
        "trigger",
        "acknowledge",
    ]
    ack = servers["webhook"].accepted()[-1]
    assert ack["event"] == "acknowledge" and ack["dedup_key"] == n.dedup_key

    servers["pagerduty"].answer = 400
    clock.advance(10)
    engine.evaluate(
        [
            Observation(
                metric="cdu.pumps_running",
                entity_kind="cdu",
                entity_id="cdu-1",
                value=2,
                ts=clock.now,
            )
        ]
    )
    for _ in range(10):
        outbox.deliver()
        clock.advance(60)
    [row] = [r for r in outbox.rows() if r["hook"] == "pd" and r["status"] == "resolved"]
    assert (row["state"], row["attempts"], row["last_status_code"]) == ("failed", 1, 400)
    assert len(servers["pagerduty"].requests) == 3  # tried once, not again


def test_alertmanager_resends_firing_until_resolved(
    servers: dict[str, Recorder], store: Store, topo: Topology
) -> None:
    clock = Clock()
    am = [h for h in hooks_for(servers, am_resend_s=60) if h.name == "am"]
    outbox = Outbox(store, am, clock)
    engine = AlertEngine(parse_rules(RULES), topo, outbox, clock)

    def pumps(v: float) -> list[Observation]:
        return [
            Observation(
                metric="cdu.pumps_running",
                entity_kind="cdu",
                entity_id="cdu-1",
                value=v,
                ts=clock.now,
            )
        ]

    engine.evaluate(pumps(0))
    for _ in range(200):
        outbox.deliver()
        clock.advance(1)
    engine.evaluate(pumps(2))
    for _ in range(200):
        outbox.deliver()
        clock.advance(1)
    check_schemas(servers)
    sent = [b[0] for b in servers["alertmanager"].accepted()]
    assert len(sent) == 5  # at 0, 60, 120, 180 s, then the resolve
    assert len({json.dumps(a["labels"], sort_keys=True) for a in sent}) == 1
    for a in sent[:-1]:  # each firing post keeps the alert alive for four intervals
        assert datetime.fromisoformat(a["endsAt"]) > clock.now - timedelta(seconds=400)
    assert datetime.fromisoformat(sent[-1]["endsAt"]) == T0 + timedelta(seconds=200)


def test_delivery_thread_delivers(
    servers: dict[str, Recorder], store: Store, topo: Topology
) -> None:
    outbox = Outbox(store, hooks_for(servers)[:1])
    engine = AlertEngine(parse_rules(RULES), topo, outbox)
    with Delivery(outbox, interval_s=0.02):
        engine.evaluate(pumps_stopped_now())
        deadline = time.monotonic() + 30
        while outbox.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
    assert [b["event"] for b in servers["webhook"].accepted()] == ["firing"]


def test_webhook_schema_is_published() -> None:
    schema = webhook_json_schema()
    assert set(schema["properties"]) >= {"event", "event_id", "dedup_key", "notification"}
    assert "Notification" in schema["$defs"]


def test_secrets_are_not_in_the_outbox_or_reprs(servers: dict[str, Recorder], store: Store) -> None:
    hooks = hooks_for(servers)
    pd = next(h for h in hooks if h.name == "pd")
    assert ROUTING_KEY not in repr(pd.config)
    outbox = Outbox(store, hooks)
    outbox.acknowledge("dctwin/small/x/cdu/cdu-1")
    dump = json.dumps(store.con.execute("SELECT * FROM alert_outbox").fetchall(), default=str)
    assert ROUTING_KEY not in dump and "/services/T/B/X" not in dump


# ---- hooks never delay each other ----------------------------------------------------------


class Trickler:
    """A receiver that reads the request, then answers one byte every ``gap_s`` (never
    finishing), as the receiver in issue 12 did. Records when each connection came in."""

    def __init__(self, gap_s: float = 3.0) -> None:
        self.gap_s = gap_s
        self.connections: list[float] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections.append(time.monotonic())
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        with conn:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)  # the request (small: one segment)
                for byte in answer[:-1]:  # never the last byte
                    conn.sendall(bytes([byte]))
                    if self._stop.wait(self.gap_s):
                        return
            except OSError:  # the client gave up and closed
                return

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.mark.slow
def test_trickling_hook_never_delays_a_healthy_one(
    servers: dict[str, Recorder], store: Store, topo: Topology
) -> None:
    trickler = Trickler(gap_s=3.0)
    # 4.5 s: longer than the 3 s between bytes, so only a total deadline ends the request
    hooks = parse_hooks(
        {
            "hooks": [
                {"type": "webhook", "name": "slow", "url": trickler.url + "/x", "timeout_s": 4.5},
                {"type": "webhook", "name": "fast", "url": servers["webhook"].url + "/alerts"},
            ]
        }
    )
    health = ServiceHealth()
    outbox = Outbox(store, hooks, base_backoff_s=0.5)
    engine = AlertEngine(parse_rules(RULES.replace("for_s: 30", "for_s: 0")), topo, outbox)

    def temp(gpu: str, v: float) -> list[Observation]:
        ts = datetime.now(UTC)
        return [
            Observation(
                metric="hotspot.gpu.over_limit_k", entity_kind="gpu", entity_id=gpu, value=v, ts=ts
            )
        ]

    sent: list[tuple[str, str]] = []
    try:
        with Delivery(outbox, interval_s=0.2, health=health):
            for gpu, value in (("trn-r01-n1:0", 90), ("inf-r02-n1:3", 91), ("trn-r01-n1:0", 60)):
                sent.extend((n.dedup_key, n.status) for n in engine.evaluate(temp(gpu, value)))
                time.sleep(0.5)
            # let the slow hook's first request reach its deadline and be retried
            assert wait_until(lambda: len(trickler.connections) >= 2, 20)
            snap = health.snapshot()["loops"]
    finally:
        trickler.stop()
    assert len(sent) == 3
    got = {(b["dedup_key"], b["event"]): r.at for r in servers["webhook"].requests if (b := r.body)}
    assert set(got) == set(sent)
    # the healthy hook had every page while the slow hook's first request was still waiting on
    # its receiver: each arrived before that request was abandoned and sent again
    assert max(got.values()) < trickler.connections[1], (got, trickler.connections)
    slow = [r for r in outbox.rows() if r["hook"] == "slow"]
    assert slow and all(r["state"] == "pending" for r in slow)
    first = slow[0]
    # ended by its total deadline: the receiver's 3 s between bytes never trips a read timeout,
    # and its answer (one byte every 3 s) is never complete
    assert first["attempts"] >= 1 and "no complete answer within 4.5 s" in first["last_error"]
    assert re.search(r"abandoned after [\d.]+ s", first["last_error"]), first["last_error"]
    assert snap["outbox:slow"]["failing"] and "4.5 s" in snap["outbox:slow"]["last_error"]


# ---- reload ----------------------------------------------------------------------------------


def _hooks_yaml(*hooks: dict[str, Any]) -> str:
    return json.dumps({"hooks": list(hooks)})  # JSON is YAML


def test_reload_refuses_bad_files_and_swaps_good_ones(
    servers: dict[str, Recorder], store: Store, topo: Topology, tmp_path: Path, caplog
) -> None:
    rules, hooks = tmp_path / "rules.yaml", tmp_path / "hooks.yaml"
    rules.write_text(RULES.replace("for_s: 30", "for_s: 0"))
    down = Recorder("webhook")
    down.start()
    down.stop()  # refuses connections: its rows stay pending
    keep = {"type": "webhook", "name": "keep", "url": servers["webhook"].url + "/alerts"}
    moved = {"type": "webhook", "name": "moved", "url": down.url + "/alerts"}
    hooks.write_text(_hooks_yaml(keep, moved))
    outbox = Outbox(store, load_hooks(hooks), base_backoff_s=0.2, max_backoff_s=0.5)
    engine = AlertEngine(load_rules(rules), topo, outbox)
    reloader = AlertReloader(engine, Delivery(outbox, interval_s=0.1).start(), rules, hooks)
    try:
        engine.evaluate(pumps_stopped_now())
        assert wait_until(lambda: servers["webhook"].accepted(), 10)
        assert [r["state"] for r in outbox.rows() if r["hook"] == "moved"] == ["pending"]
        kept_hook = outbox.hooks["keep"]

        caplog.clear()
        with caplog.at_level(logging.INFO, logger="twin.alerts"):
            rules.write_text(
                "rules:\n  - name: x\n    metric: hotspot.gpu.over_limit_k\n    op: '=>'\n"
            )
            assert reloader.reload() is False
            hooks.write_text(_hooks_yaml(keep, {**moved, "type": "pager"}))
            rules.write_text(RULES)
            assert reloader.reload() is False
        errors = [r for r in caplog.records if r.name == "twin.alerts.reload"]
        assert len(errors) == 2 and all(r.levelno == logging.ERROR for r in errors)
        assert all("keeping the running" in r.message for r in errors)
        assert "rules.yaml" in errors[0].message and "op" in errors[0].message
        assert "hooks.yaml" in errors[1].message and "hooks[1]" in errors[1].message
        assert [r.name for r in engine.rules] == ["gpu_temp_high", "cdu_pump_lost"]
        assert set(outbox.hooks) == {"keep", "moved"} and outbox.hooks["keep"] is kept_hook

        caplog.clear()
        new_rules = RULES.replace("name: gpu_temp_high", "name: gpu_hot").replace(
            "rule: gpu_temp_high", "rule: gpu_hot"
        )
        rules.write_text(new_rules)
        added = {"type": "slack", "name": "chat", "url": servers["slack"].url + "/services/T/B/X"}
        hooks.write_text(_hooks_yaml(keep, {**moved, "url": servers["pagerduty"].url}, added))
        with caplog.at_level(logging.INFO, logger="twin.alerts"):
            assert reloader.reload() is True
        [line] = [r.message for r in caplog.records if r.name == "twin.alerts.reload"]
        assert "reloaded 2 alert rules" in line and "3 hooks" in line
        assert "added chat" in line and "changed moved" in line
        assert [r.name for r in engine.rules] == ["gpu_hot", "cdu_pump_lost"]
        assert outbox.hooks["keep"] is kept_hook  # unchanged: kept running
        assert reloader.delivery.workers() == ["chat", "keep", "moved"]
        # the pending row of the hook that moved goes out to its new address
        assert wait_until(lambda: servers["pagerduty"].requests, 10)
        assert servers["pagerduty"].requests[0].body["event"] == "firing"
        assert wait_until(lambda: all(r["state"] != "pending" for r in outbox.rows()), 10)
    finally:
        reloader.delivery.stop()


# ---- the service: SIGHUP, and no secret anywhere -------------------------------------------


def _serve(b: Any, db: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "twin.cli", "serve", "--broker", b.address, "--db", str(db)),
            *("--site", str(SMALL_SITE), "--calibrate-every", "0", "--api-port", "0", *args),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env={**os.environ, **b.client_env(), **(env or {})},
    )


def _api_url(p: Any, log: Path) -> str:
    assert wait_until(lambda: b"serving:" in log.read_bytes() or p.poll() is not None, 60)
    assert p.poll() is None, log.read_text()
    return re.search(r"api: (http://127\.0\.0\.1:\d+)", log.read_text()).group(1)  # type: ignore[union-attr]


def _stop(p: Any, log: Path) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    assert p.returncode == 0, log.read_text()


@pytest.mark.mqtt
@pytest.mark.slow
def test_sighup_keeps_the_rules_on_a_bad_file_and_swaps_a_good_one(
    broker: Any, servers: dict[str, Recorder], tmp_path: Path
) -> None:
    rules, hooks, log = tmp_path / "rules.yaml", tmp_path / "hooks.yaml", tmp_path / "serve.log"
    rules.write_text(RULES)
    hooks.write_text(_hooks_yaml({"type": "webhook", "name": "ops", "url": servers["webhook"].url}))
    p = _serve(broker, tmp_path / "s.duckdb", log, "--rules", str(rules), "--hooks", str(hooks))
    try:
        url = _api_url(p, log)
        with httpx.Client(base_url=url, timeout=30) as c:

            def names() -> list[str]:
                return c.get("/api/v1/alerts", params={"history": 0}).json()["rules"]

            assert names() == ["gpu_temp_high", "cdu_pump_lost"]
            rules.write_text(RULES.replace('op: "<"', 'op: "=<"'))
            p.send_signal(signal.SIGHUP)
            assert wait_until(lambda: "reload refused" in log.read_text(), 20)
            assert names() == ["gpu_temp_high", "cdu_pump_lost"]
            text = log.read_text()
            assert "rule 'cdu_pump_lost' (rules[1]): op:" in text  # says why

            rules.write_text(RULES.replace("gpu_temp_high", "gpu_hot"))
            hooks.write_text(
                _hooks_yaml({"type": "webhook", "name": "ops", "url": servers["slack"].url})
            )
            p.send_signal(signal.SIGHUP)
            assert wait_until(lambda: "reloaded 2 alert rules" in log.read_text(), 20)
            assert names() == ["gpu_hot", "cdu_pump_lost"]
    finally:
        _stop(p, log)
    lines = log.read_text().splitlines()
    assert len([x for x in lines if "reload refused" in x]) == 1
    [done] = [x for x in lines if "reloaded 2 alert rules" in x]
    assert "1 hooks" in done and "changed ops" in done


WEB_PATH = "/hook/wh-SECRET-path-7f3a9c"
WEB_HEADER = "Bearer wh-SECRET-header-51d2e8"
SLACK_PATH = "/services/T0SECRET/B0SECRET/sl4ckS3cretT0ken"
PD_KEY = "pdSECRETkey0123456789abcdef0123X"
AM_PASSWORD = "am-SECRET-pass-9b8c"
AM_HEADER = "am-SECRET-org-4e5f"
API_TOKEN = "api-SECRET-token-0a1b2c3d"
MQTT_PASSWORD = "mqtt-SECRET-pw-77aa"
SECRETS = [WEB_PATH, WEB_HEADER, SLACK_PATH, PD_KEY, AM_PASSWORD, AM_HEADER, API_TOKEN]
SECRETS += [MQTT_PASSWORD, "SECRET"]  # and no piece of any of them


@pytest.mark.mqtt
@pytest.mark.slow
def test_no_secret_in_logs_metrics_api_or_store(
    broker: Any, servers: dict[str, Recorder], tmp_path: Path
) -> None:
    servers["webhook"].mode = "echo"  # a first 503 that repeats the path and the headers
    am_url = f"http://dctwin:{AM_PASSWORD}@127.0.0.1:{servers['alertmanager'].port}"
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(
        _hooks_yaml(
            {"type": "webhook", "name": "ops", "url_env": "T_WEB_URL"},
            {"type": "slack", "name": "chat", "url_env": "T_SLACK_URL"},
            {
                "type": "pagerduty",
                "name": "pd",
                "url": servers["pagerduty"].url + "/v2/enqueue",
                "routing_key_env": "T_PD_KEY",
            },
            {"type": "alertmanager", "name": "am", "url": am_url, "resend_interval_s": 3},
        )
        .replace(
            '"url_env": "T_WEB_URL"',
            f'"url_env": "T_WEB_URL", "headers": {{"Authorization": "{WEB_HEADER}"}}',
        )
        .replace(
            '"resend_interval_s": 3',
            f'"resend_interval_s": 3, "headers": {{"X-Scope-OrgID": "{AM_HEADER}"}}',
        )
    )
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - {name: pumps_seen, metric: cdu.pumps_running, entity_kind: cdu,"
        " op: '>=', value: 0, severity: critical, group_by: cdu}\n"
    )
    token_file = tmp_path / "token"
    token_file.write_text(API_TOKEN + "\n")
    env = {
        "T_WEB_URL": servers["webhook"].url + WEB_PATH,
        "T_SLACK_URL": servers["slack"].url + SLACK_PATH,
        "T_PD_KEY": PD_KEY,
        "DCTWIN_MQTT_PASSWORD": MQTT_PASSWORD,
    }
    db, log = tmp_path / "s.duckdb", tmp_path / "serve.log"
    p = _serve(
        broker,
        db,
        log,
        *("--rules", str(rules), "--hooks", str(hooks), "--detect-every", "2"),
        *("--api-token-file", str(token_file), "--verbose"),
        env=env,
    )
    answers: list[str] = []
    try:
        url = _api_url(p, log)
        start = (datetime.now(UTC) - timedelta(seconds=120)).replace(microsecond=0)
        sim = subprocess.run(
            [
                *(sys.executable, "-m", "twin.cli", "sim", "--site", str(SMALL_SITE)),
                *("--broker", broker.address, "--duration", "120", "--speed", "0"),
                *("--start", start.isoformat()),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **broker.client_env()},
        )
        assert sim.returncode == 0, sim.stderr
        assert wait_until(lambda: all(r.accepted() for r in servers.values()), 90), log.read_text()
        with httpx.Client(base_url=url, timeout=30) as c:
            key = c.get("/api/v1/alerts").json()["active"][0]["dedup_key"]
            auth = {"Authorization": f"Bearer {API_TOKEN}"}
            r = c.post(f"/api/v1/alerts/{key}/ack", json={"by": "t"}, headers=auth)
            assert r.status_code == 200, r.text
            answers.append(r.text)

            def pd_acks() -> list[Any]:
                acks = servers["pagerduty"].accepted()
                return [b for b in acks if b["event_action"] == "acknowledge"]

            assert wait_until(pd_acks, 30)
            assert wait_until(lambda: len(servers["alertmanager"].accepted()) >= 2, 30)  # a re-send
            for path in ("/api/v1", "/api/v1/status", "/api/v1/alerts", "/api/v1/silences"):
                answers.append(c.get(path).text)
            for path in ("/healthz", "/metrics", "/openapi.json", "/api/v1/overview"):
                answers.append(c.get(path).text)
    finally:
        _stop(p, log)
    text = log.read_text()
    assert " DEBUG " in text  # --verbose: the most the service ever logs
    assert f"hook ops: {servers['webhook'].url}" in text  # where it sends, host only
    assert "HTTP 503: cannot take ***" in text  # the echoed secrets, blanked
    assert r.json()["outbox_rows"] == 2  # PagerDuty and the webhook take acks
    con = duckdb.connect(str(db), read_only=True)
    tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    assert "alert_outbox" in tables
    store_text = json.dumps(
        {t: con.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables}, default=str
    )
    errors = con.execute("SELECT last_error FROM alert_outbox WHERE hook = 'ops'").fetchall()
    con.close()
    assert any(e and "503" in e for (e,) in errors)
    # the receivers did get the secrets: they were in use
    assert servers["webhook"].requests[0].path == WEB_PATH
    assert servers["webhook"].requests[0].headers["Authorization"] == WEB_HEADER
    assert servers["pagerduty"].accepted()[0]["routing_key"] == PD_KEY
    for secret in SECRETS:
        assert secret not in text, secret
        assert secret not in store_text, secret
        for a in answers:
            assert secret not in a, secret
