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

from .conftest import SMALL_SITE

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
        t0 = time.monotonic()
        r = c.get("/api/v1/overview", headers=LOCAL)
        took = time.monotonic() - t0
        assert r.status_code == 200
        assert took < 10 * TIMEOUT_S  # bounded by the per-shard timeout, not by the silent shard
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
