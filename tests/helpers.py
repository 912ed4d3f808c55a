"""What the tests share besides fixtures (those are in tests/conftest.py): the repository's
paths, the sites built in tests, an MQTT ingest service on its own store, the alert hooks'
recording HTTP servers and the services' documented schemas, `dctwin serve` with a rules file.
Not a test module: tests import it (``from .helpers import ...``); tests/test_import_rules.py
allows it and forbids importing test modules or conftest."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel, model_validator

from collectors.mqtt import BrokerConfig
from twin.alerts import WebhookEvent, parse_hooks
from twin.broker import LocalBroker
from twin.ingest import Ingester, IngestLimits
from twin.ingest.mqtt_service import MqttIngestService, ServiceOptions
from twin.store import Store
from twin.store.schema import arrow_schema

REPO = Path(__file__).resolve().parents[1]
SMALL_SITE = REPO / "sample_telemetry" / "small_site.yaml"
DEMO_SITE = REPO / "sample_telemetry" / "demo_site.yaml"

#: When the tests' simulated recordings start (UTC).
SIM_START = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def simulated_bundle(
    out: Path, site_file: Path = SMALL_SITE, minutes: int = 10, seed: int = 3
) -> Path:
    """``minutes`` of ``site_file`` simulated at 1 s from :data:`SIM_START`, ingested into a
    store beside ``out`` and recorded as the bundle ``out`` (10 s); returns ``out``."""
    from twin.replay.bundle import record
    from twin.simulator import SiteSimulator
    from twin.site import load_site

    site = load_site(site_file)
    sim = SiteSimulator(site, seed=seed, start=SIM_START)
    with Store(out.parent / f"{out.name}-src.duckdb") as src:
        Ingester(src, site, IngestLimits(max_past_s=0)).ingest(
            [m for _ in range(minutes * 60) for m in sim.step()]
        )
        record(src, site_file, out, SIM_START, SIM_START + timedelta(minutes=minutes))
    return out


#: DCTWIN_TEST_BROKER=embedded runs the broker tests against the embedded Python broker even
#: where mosquitto is installed; the default takes mosquitto when on PATH.
TEST_BROKER = os.environ.get("DCTWIN_TEST_BROKER", "auto")


def samples_table(kind: str, ts: Any, ids: Any, **values: Any) -> pa.Table:
    """Rows of ``kind`` for ``Store.insert_arrow``: ``ts`` (datetimes, or epoch microseconds),
    ``ids`` (also the source), and the quantities in ``values`` (NaN or None: a NULL reading);
    every other column NULL."""
    schema = arrow_schema(kind)
    id_arr = pa.array(ids, pa.string())
    cols = {"ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "source": id_arr, "id": id_arr}
    for f in schema:
        if f.name in values:
            v = np.asarray(values[f.name], dtype=float)
            cols[f.name] = pa.array(v, f.type, mask=np.isnan(v))
        elif f.name not in cols:
            cols[f.name] = pa.nulls(len(id_arr), f.type)
    unknown = set(values) - {f.name for f in schema}
    if unknown:
        raise ValueError(f"{kind} has no quantity {sorted(unknown)}")
    return pa.table(cols, schema=schema)


def broker_config(b: LocalBroker) -> BrokerConfig:
    return b.client_config()


def wye_pdu(name: str, feed: str, breaker_prefix: str = "cb") -> dict:
    """A 415 V, 32 A three-phase wye PDU with one breaker per phase, for sites built in tests."""
    return {
        "name": name,
        "feed": feed,
        "voltage_v": 415,
        "rated_current_a": 32,
        "breakers": [
            {"name": f"{breaker_prefix}{i}", "phase": f"L{i}", "rated_current_a": 32}
            for i in (1, 2, 3)
        ],
    }


def has_mosquitto_pub() -> bool:
    return shutil.which("mosquitto_pub") is not None


# ---- an MQTT ingest service on its own store


class IngestService:
    """An MQTT ingest service on its own store, started in this process (its receiver a child
    process unless ``receiver_process`` is False); tests/test_mqtt_ingest.py, test_whatif.py."""

    def __init__(
        self,
        b: LocalBroker,
        db: Path,
        client_id: str = "svc-test",
        receiver_process: bool = True,
        flush_interval_s: float = 0.05,
    ):
        self.store = Store(db)
        self.ingester = Ingester(self.store)
        self.svc = MqttIngestService(
            broker_config(b),
            self.ingester,
            ServiceOptions(
                client_id=client_id,
                flush_interval_s=flush_interval_s,
                receiver_process=receiver_process,
            ),
        )
        self.svc.start()

    def count(self) -> int:
        return self.ingester.counters.samples["gpu"]

    def stop(self) -> None:
        self.svc.stop()
        self.store.close()


# ---- alert hooks: recording HTTP servers and the services' documented schemas ----------------
# (tests/test_alerts_hooks.py and tests/test_detect.py)

#: The PagerDuty routing key the recorded hooks use (32 characters, as PagerDuty's are).
ROUTING_KEY = "0123456789abcdef0123456789abcdef"


# ---- the services' documented schemas -------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PdPayload(_Strict):
    """PagerDuty Events API v2, ``payload`` of a trigger event."""

    summary: str = Field(min_length=1, max_length=1024)
    source: str = Field(min_length=1)
    severity: Literal["critical", "error", "warning", "info"]
    timestamp: AwareDatetime | None = None
    component: str | None = None
    group: str | None = None
    class_: str | None = Field(default=None, alias="class")
    custom_details: dict[str, Any] | None = None


class PdEvent(_Strict):
    """PagerDuty Events API v2 event (POST /v2/enqueue)."""

    routing_key: str = Field(min_length=32, max_length=32)
    event_action: Literal["trigger", "acknowledge", "resolve"]
    dedup_key: str | None = Field(default=None, max_length=255)
    payload: PdPayload | None = None
    client: str | None = None
    client_url: str | None = None
    images: list[dict[str, Any]] | None = None
    links: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _shape(self) -> PdEvent:
        if self.event_action == "trigger":
            assert self.payload is not None, "trigger needs a payload"
        else:
            assert self.dedup_key, "acknowledge/resolve need the dedup_key"
            assert self.payload is None, "payload only on trigger"
        return self


class AmPostableAlert(_Strict):
    """Alertmanager API v2 ``postableAlert`` (POST /api/v2/alerts takes a list of them)."""

    labels: dict[str, str] = Field(min_length=1)
    annotations: dict[str, str] | None = None
    startsAt: AwareDatetime | None = None  # noqa: N815 - the API's name
    endsAt: AwareDatetime | None = None  # noqa: N815
    generatorURL: str | None = None  # noqa: N815

    @model_validator(mode="after")
    def _names(self) -> AmPostableAlert:
        # Alertmanager validates label and annotation names (model.LabelName.IsValid) and
        # answers 400 otherwise.
        for what, names in (("label", self.labels), ("annotation", self.annotations or {})):
            for name in names:
                assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name), f"invalid {what} {name!r}"
        return self


AmPostableAlerts = RootModel[list[AmPostableAlert]]


class SlackText(_Strict):
    type: Literal["plain_text", "mrkdwn"]
    text: str = Field(min_length=1, max_length=3000)
    emoji: bool | None = None
    verbatim: bool | None = None


class SlackHeader(_Strict):
    type: Literal["header"]
    text: SlackText
    block_id: str | None = None

    @model_validator(mode="after")
    def _plain(self) -> SlackHeader:
        assert self.text.type == "plain_text" and len(self.text.text) <= 150
        return self


class SlackSection(_Strict):
    type: Literal["section"]
    text: SlackText
    block_id: str | None = None


class SlackContext(_Strict):
    type: Literal["context"]
    elements: list[SlackText] = Field(min_length=1, max_length=10)
    block_id: str | None = None


class SlackMessage(_Strict):
    """Slack incoming webhook message with Block Kit blocks."""

    text: str = Field(min_length=1)
    blocks: list[SlackHeader | SlackSection | SlackContext] = Field(max_length=50)


# ---- recording servers ---------------------------------------------------------------------


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: Any
    status: int
    at: float = field(default_factory=time.monotonic)  # when it arrived


@dataclass
class Recorder:
    """A local HTTP server for one service; ``mode`` is "up", "500", "echo" (one 503 whose
    body repeats the request's path and headers, as careless receivers do, then "up") or
    (with stop) refused."""

    service: str
    mode: str = "up"
    answer: int | None = None  # force this status when up (e.g. 400)
    requests: list[Request] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def accepted(self) -> list[Any]:
        return [r.body for r in self.requests if 200 <= r.status < 300]

    def start(self) -> None:
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if rec.mode == "echo":
                    rec.mode = "up"
                    status, ctype = 503, "text/plain"
                    out = f"cannot take {self.path} with {dict(self.headers)}".encode()
                else:
                    status, ctype, out = rec.respond(json.loads(raw))
                rec.requests.append(Request(self.path, dict(self.headers), json.loads(raw), status))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        """Refuse connections from now on (the port closes)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def respond(self, body: Any) -> tuple[int, str, bytes]:
        if self.mode == "500":
            return 503, "text/plain", b"unavailable"
        if self.answer is not None and self.answer >= 400:
            msg = {"status": "invalid event", "message": "Event object is invalid"}
            return self.answer, "application/json", json.dumps(msg).encode()
        if self.service == "pagerduty":
            ok = {"status": "success", "message": "Event processed", "dedup_key": body["dedup_key"]}
            return 202, "application/json", json.dumps(ok).encode()
        if self.service == "slack":
            return 200, "text/plain", b"ok"
        return 200, "application/json", b"{}"


def hooks_for(recs: dict[str, Recorder], am_resend_s: float | None = 3600) -> list[Any]:
    return parse_hooks(
        {
            "hooks": [
                {"type": "webhook", "name": "hook", "url": recs["webhook"].url + "/alerts"},
                {"type": "slack", "name": "slack", "url_env": "SLACK_URL"},
                {
                    "type": "pagerduty",
                    "name": "pd",
                    "url": recs["pagerduty"].url + "/v2/enqueue",
                    "routing_key_env": "PD_KEY",
                },
                {
                    "type": "alertmanager",
                    "name": "am",
                    "url": recs["alertmanager"].url,
                    "resend_interval_s": am_resend_s,
                },
            ]
        },
        env={"SLACK_URL": recs["slack"].url + "/services/T/B/X", "PD_KEY": ROUTING_KEY},
    )


def check_schemas(recs: dict[str, Recorder]) -> None:
    """Every request each server saw matches its service's documented schema."""
    for r in recs["pagerduty"].requests:
        assert r.path == "/v2/enqueue"
        PdEvent.model_validate(r.body)
    for r in recs["alertmanager"].requests:
        assert r.path == "/api/v2/alerts"
        AmPostableAlerts.model_validate(r.body)
    for r in recs["slack"].requests:
        assert r.path == "/services/T/B/X"
        SlackMessage.model_validate(r.body)
    for r in recs["webhook"].requests:
        assert r.path == "/alerts"
        WebhookEvent.model_validate(r.body)
    for rec in recs.values():
        for r in rec.requests:
            assert r.headers["Content-Type"] == "application/json"


# ---- the running twin service of the API, console and browser tests (conftest's start_service)

SCENARIOS = REPO / "sample_telemetry" / "scenarios"
RULES = REPO / "deploy" / "alert_rules.yaml"
#: The write token of the test service (16+ characters, as `dctwin serve` requires).
API_TOKEN = "test-token-0123456789"
#: The incident the small site's pump failure opens.
PUMP_KEY = "dctwin/small/cdu_pump_lost/cdu/cdu-1"


class HookHandler(BaseHTTPRequestHandler):
    """A webhook receiver that takes every notification (conftest's ``hook_url``)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_with_rules(tmp_path: Path, rules_text: str) -> subprocess.CompletedProcess[str]:
    """`dctwin serve --rules FILE` with ``rules_text`` as the file, an unreachable broker and a
    store in ``tmp_path`` (tests/test_alert_metrics.py, tests/test_alert_receivers.py)."""
    path = tmp_path / "bad.yaml"
    path.write_text(rules_text)
    cmd = ["serve", "--site", str(SMALL_SITE), "--db", str(tmp_path / "s.duckdb")]
    return subprocess.run(
        [sys.executable, "-m", "twin.cli", *cmd, "--rules", str(path), "--broker", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@contextmanager
def running_ingest(b: LocalBroker, db: Path, client_id: str) -> Iterator[tuple[Store, Ingester]]:
    """A store and an ingest (no max-past guard) subscribed to broker ``b`` for the length of
    the block (tests/test_import_nvidia_smi.py, tests/test_import_prometheus.py)."""
    with Store(db) as store:
        ingester = Ingester(store, None, IngestLimits(max_past_s=0))
        svc = MqttIngestService(
            b.client_config(),
            ingester,
            ServiceOptions(client_id=client_id, flush_interval_s=0.05, receiver_process=False),
        )
        svc.start()
        try:
            yield store, ingester
        finally:
            svc.stop()


#: One figure drawn by ``dashboards.ui.metric``: its label, value and optional delta.
_STAT = re.compile(
    r'class="dctwin-stat" data-label="([^"]*)".*?<div class="value"[^>]*>([^<]*)</div>'
    r'(?:<div class="delta"[^>]*>([^<]*)</div>)?',
    re.S,
)


def page_figures(at: Any) -> dict[str, tuple[str, str | None]]:
    """A Streamlit AppTest page's labelled figures (``dashboards.ui.metric``, HTML): label ->
    (value, delta or None), the text as shown."""
    import html

    out: dict[str, tuple[str, str | None]] = {}
    for h in at.html:
        for label, value, delta in _STAT.findall(h.value):
            out[html.unescape(label)] = (html.unescape(value), html.unescape(delta) or None)
    return out
