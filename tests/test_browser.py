"""The console end to end in a real browser: headless Chromium driven by Playwright.

The service (the demo site, six simulated minutes with a CDU pump failing, so an alert fires)
runs in-process with its API; the console runs as `streamlit run dashboards/app.py`, exactly
as `dctwin demo` starts it. Every page must open without an exception or error box, the floor
map must show every rack, and an alert must be acknowledged from the Alerts page. Screenshots
go to ``$DCTWIN_TEST_ARTIFACTS`` (default ``tests/artifacts/``).

Needs Debian's ``chromium`` (``apt-get install chromium``; `.ci/run` installs it) and the
``playwright`` package; Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from twin.service import Service

from .conftest import API_TOKEN as TOKEN
from .conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium on PATH (apt-get install chromium; .ci/run installs it)",
    ),
]
playwright_sync = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed"
)

ARTIFACTS = Path(os.environ.get("DCTWIN_TEST_ARTIFACTS", REPO / "tests" / "artifacts"))
DEMO_SITE = REPO / "sample_telemetry" / "demo_site.yaml"
PUMP_KEY = "dctwin/demo/cdu_pump_lost/cdu/cdu-1"
PAGES = {
    "": "Overview",
    "floor": "Floor",
    "rack?rack=a01": "Rack",
    "power": "Power",
    "cooling": "Cooling",
    "network": "Network",
    "fleets": "Fleets",
    "alerts": "Alerts",
    "calibration": "Calibration",
    "whatif": "What-if",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, start_service: Callable[..., Service]
) -> Iterator[Service]:
    s = start_service(
        tmp_path_factory.mktemp("browser") / "browser.duckdb",
        site_path=DEMO_SITE,
        minutes=6,
        faults=("pump_failure:cdu-1/pump1@3m",),
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def console(svc: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    env = {
        **os.environ,
        "DCTWIN_API_URL": svc.url,
        "DCTWIN_CONSOLE_TOKEN": TOKEN,
        "DCTWIN_CONSOLE_REFRESH_S": "600",  # no refresh in the middle of a click
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(REPO / "dashboards" / "app.py"),
            "--server.headless",
            "true",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--browser.gatherUsageStats",
            "false",
        ],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).text == "ok":
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not start: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield b
        b.close()


@pytest.fixture
def page(browser) -> Iterator[object]:  # type: ignore[no-untyped-def]
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def settle(page, title: str) -> None:  # type: ignore[no-untyped-def]
    """Wait until the page's title shows and Streamlit has finished running the script."""
    page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText"
        ".includes('Running')",
        timeout=60_000,
    )
    page.wait_for_timeout(1500)  # charts draw after the script ends


def problems(page) -> list[str]:  # type: ignore[no-untyped-def]
    found = [e.inner_text() for e in page.locator('[data-testid="stException"]').all()]
    found += [e.inner_text() for e in page.locator('[data-testid="stAlertContentError"]').all()]
    return found


def shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)


@pytest.mark.parametrize("path", list(PAGES), ids=lambda p: p.split("?")[0] or "overview")
def test_every_page_opens_without_an_error(  # type: ignore[no-untyped-def]
    console: str, page, path: str
) -> None:
    page.goto(f"{console}/{path}")
    settle(page, PAGES[path])
    charts = path in ("floor", "rack?rack=a01", "power", "cooling", "fleets")
    if charts:  # plotly draws after the script ends: slower when the machine is busy
        page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    shot(page, path.split("?")[0] or "overview")
    assert problems(page) == []
    if charts:
        assert page.locator(".js-plotly-plot").count() >= 1, path


def test_floor_map_shows_every_rack(  # type: ignore[no-untyped-def]
    console: str, page, svc: Service
) -> None:
    page.goto(f"{console}/floor")
    settle(page, "Floor")
    plot = page.locator(".js-plotly-plot").first
    plot.wait_for()
    labels = plot.locator("g.textpoint text").evaluate_all("els => els.map(e => e.textContent)")
    # each label is the rack's name over its value ("a01" then "32.4 kW")
    racks = {r.name for r in svc.site.racks}
    shown = {name for name in racks if any((t or "").startswith(name) for t in labels)}
    assert len(labels) == len(racks) == 32 and shown == racks
    shot(page, "floor-map")


def test_an_alert_is_acknowledged_from_the_alerts_page(  # type: ignore[no-untyped-def]
    console: str, page, svc: Service
) -> None:
    page.goto(f"{console}/alerts")
    settle(page, "Alerts")
    assert page.get_by_text(PUMP_KEY).count() >= 1
    before = page.get_by_role("button", name="Acknowledge").count()
    assert before >= 1
    # Streamlit marks a widget's container with its key ("/" becomes "-")
    key = "st-key-ack_" + PUMP_KEY.replace("/", "-")
    page.locator(f".{key}").get_by_role("button", name="Acknowledge").click()
    page.get_by_text(f"Acknowledged {PUMP_KEY}").wait_for(timeout=30_000)
    settle(page, "Alerts")
    assert page.get_by_role("button", name="Acknowledge").count() == before - 1
    assert page.get_by_text("Acknowledged by console").count() >= 1
    assert problems(page) == []
    shot(page, "alerts-acknowledged")
    active = httpx.get(f"{svc.url}/api/v1/alerts", timeout=10).json()["active"]
    pump = next(a for a in active if a["dedup_key"] == PUMP_KEY)
    assert pump["acknowledged"]["acked_by"] == "console"
