"""The site view over a real shard API (`twin.api.ApiServer` on an empty store of the small
site) and a shard that takes connections but never answers: the per-shard timeout bounds the
answer, the silent shard is stale with its reason, the question no shard can answer is the
shard's own 4xx, and `--site FILE` finds the shards' addresses in the site file."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from collectors.mqtt import wait_until
from twin.api import ApiContext, ApiServer
from twin.site import load_site
from twin.siteview import create_siteview_app, parse_shards, shards_from_site_file
from twin.store import Store

from .helpers import SMALL_SITE

pytestmark = pytest.mark.slow  # each waits out a shard's timeout: over 1 s

LOCAL = {"Host": "localhost"}
TIMEOUT_S = 0.5


@pytest.fixture
def live(tmp_path: Path) -> Iterator[str]:
    ctx = ApiContext(Store(tmp_path / "live.duckdb"), site=load_site(SMALL_SITE))
    with ApiServer(ctx, port=0) as server:
        yield server.url


@pytest.fixture
def silent() -> Iterator[str]:
    """A TCP port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_silent_shard_is_stale_after_its_timeout(tmp_path: Path, live: str, silent: str) -> None:
    site = yaml.safe_load(SMALL_SITE.read_text())
    site["shards"] = [
        {"name": "hall-1", "halls": ["hall-1"], "api_url": live},
        {"name": "quiet", "halls": [], "api_url": silent},
    ]
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    shards = shards_from_site_file(path)
    assert [(s.name, s.url) for s in shards] == [("hall-1", live), ("quiet", silent)]
    with TestClient(create_siteview_app(shards, timeout_s=TIMEOUT_S)) as c:
        # the quiet shard never answers: an answer at all is the per-shard timeout's doing
        r = c.get("/api/v1/overview", headers=LOCAL)
        assert r.status_code == 200
        body = r.json()
        assert body["site"] == "small" and body["cooling_capacity_kw"] == 20.0
        report = {s["name"]: s for s in body["shards"]}
        assert report["hall-1"]["status"] == "ok" and report["hall-1"]["http_status"] == 200
        quiet = report["quiet"]
        assert quiet["status"] == "stale" and quiet["age_s"] is None  # never answered
        assert quiet["error"] == f"no answer within {TIMEOUT_S:g} s"
        h = c.get("/healthz", headers=LOCAL)
        assert h.status_code == 200 and h.json()["status"] == "degraded"
        assert "shard quiet stale (no answer within" in h.json()["reason"]
        # a rack no shard has: the shard's own 404, naming the shard
        r = c.get("/api/v1/racks/nope", headers=LOCAL)
        assert r.status_code == 404 and r.json()["detail"].startswith("shard hall-1: ")
        # a rack one shard has: from that shard
        r = c.get("/api/v1/racks/r01", headers=LOCAL)
        assert r.status_code == 200 and r.json()["shard"] == "hall-1"
        # the Host check guards the site view too
        assert c.get("/api/v1/overview", headers={"Host": "evil.example"}).status_code == 400


def test_no_shard_answering_is_503_naming_each(silent: str) -> None:
    shards = parse_shards(f"quiet={silent}")
    with TestClient(create_siteview_app(shards, timeout_s=TIMEOUT_S)) as c:
        r = c.get("/api/v1/racks", headers=LOCAL)
        assert r.status_code == 503
        assert r.json()["detail"] == f"no shard answered: quiet: no answer within {TIMEOUT_S:g} s"
        assert c.get("/healthz", headers=LOCAL).status_code == 503
        assert c.get("/api/v1", headers=LOCAL).status_code == 200  # the view's own index


def test_the_command_serves_until_sigterm_and_exits_0(tmp_path: Path, silent: str) -> None:
    log = tmp_path / "view.log"
    p = subprocess.Popen(
        [
            *(sys.executable, "-m", "twin.cli", "site-view", "--shards", f"quiet={silent}"),
            *("--port", "0", "--timeout-s", str(TIMEOUT_S)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or p.poll() is not None, 30)
        url = re.search(r"site view on (http://127\.0\.0\.1:\d+)", log.read_text()).group(1)  # type: ignore[union-attr]
        r = httpx.get(url + "/api/v1/overview", timeout=10)
        assert r.status_code == 503 and r.json()["shards"][0]["status"] == "stale"
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0, log.read_text()
    assert log.read_text().splitlines()[-1] == "stopped"


class _SlowShard:
    """A shard API whose /api/v1/overview answers ``it_power_kw`` after ``delay_s``."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        self.delay_s = 0.0
        self.it_power_kw = 100.0
        self.answered = 0
        shard = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/api/v1/overview":
                    self.send_error(404)
                    return
                time.sleep(shard.delay_s)
                body = json.dumps({"site": "slow", "it_power_kw": shard.it_power_kw}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                shard.answered += 1

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_slow_shard_is_shown_with_its_last_answer_marked_stale(live: str) -> None:
    """Past --answer-within, a shard that answered the same read before is shown with that
    answer, stale with its age, and asked again in the background: the next read has the new
    answer. A shard that never answered is still waited for (up to its timeout)."""
    slow = _SlowShard()
    try:
        shards = parse_shards(f"hall-1={live},slow={slow.url}")
        app = create_siteview_app(shards, timeout_s=10.0, answer_within_s=0.2)
        with TestClient(app) as c:
            first = c.get("/api/v1/overview", headers=LOCAL).json()
            assert first["it_power_kw"] == 100.0  # the small site's own has no data: None
            assert {s["name"]: s["status"] for s in first["shards"]} == {
                "hall-1": "ok",
                "slow": "ok",
            }
            slow.delay_s, slow.it_power_kw = 2.0, 250.0  # slower than answer_within_s
            second = c.get("/api/v1/overview", headers=LOCAL).json()
            # without the deadline this would wait the 2 s and show 250 kW
            assert second["it_power_kw"] == 100.0, second
            report = {s["name"]: s for s in second["shards"]}
            assert report["hall-1"]["status"] == "ok"
            stale = report["slow"]
            assert stale["status"] == "stale" and stale["http_status"] == 200
            assert stale["age_s"] is not None and stale["age_s"] >= 0.0
            assert stale["error"].startswith("no answer within 0.2 s: its answer of")
            # the call went on: once the shard has answered, the next read shows it
            assert wait_until(lambda: slow.answered >= 2, 10, 0.05)
            slow.delay_s = 0.0
            third = c.get("/api/v1/overview", headers=LOCAL).json()
            assert third["it_power_kw"] == 250.0
            assert {s["name"]: s["status"] for s in third["shards"]}["slow"] == "ok"
    finally:
        slow.close()


def test_the_last_answers_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read with its own parameters (a series names its time window) is a key of its own:
    the fan-out keeps at most MAX_KEPT_ANSWERS of them, the oldest dropped first."""
    import asyncio

    from twin.siteview import fanout

    monkeypatch.setattr(fanout, "MAX_KEPT_ANSWERS", 2)
    slow = _SlowShard()
    try:
        fan = fanout.Fanout(parse_shards(f"slow={slow.url}"), answer_within_s=5.0)

        async def reads() -> list[fanout.Answer]:
            out = [(await fan.call("GET", "/api/v1/overview", {"n": n}))[0] for n in range(3)]
            await fan.close()
            return out

        assert all(a.ok for a in asyncio.run(reads()))
        assert [k[2] for k in fan._good] == ["[('n', 1)]", "[('n', 2)]"]
    finally:
        slow.close()
