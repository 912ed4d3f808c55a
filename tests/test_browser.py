"""The console end to end in a real browser: headless Chromium driven by Playwright.

The service (the demo site, six simulated minutes with a CDU pump failing, so an alert fires)
runs in-process with its API; the console runs as `streamlit run dashboards/app.py`, exactly
as `dctwin demo` starts it. Every page must open without an exception or error box, the floor
map must show every rack, and an alert must be acknowledged from the Alerts page. What an operator
must see is asserted on the drawn page: the critical pump alert listed first and in the critical
colour, no "None", no truncated number, the rack deep link on the right rack. A screenshot per page
and each page's load time (navigation to its last change drawn, :mod:`dashboards.pageload`;
recorded, never asserted) go to ``$DCTWIN_ARTIFACTS`` when set, else a folder under pytest's
tmp path; the run prints where.

Needs Debian's ``chromium`` (``apt-get install chromium``; `.ci/run` installs it) and the
``playwright`` package; Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from dashboards import pageload
from twin.cli.demo import CONSOLE_STREAMLIT_OPTIONS
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
            *CONSOLE_STREAMLIT_OPTIONS,  # as `dctwin demo` and `dctwin console` start it
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
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


@pytest.fixture(scope="module")
def artifacts(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """Where screenshots and ``page_load.json`` go (printed at the start and the end)."""
    env = os.environ.get("DCTWIN_ARTIFACTS")
    where = Path(env) if env else tmp_path_factory.mktemp("console-artifacts")
    where.mkdir(parents=True, exist_ok=True)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"console screenshots and page_load.json: {where}")
    yield where
    if LOAD_S:
        (where / "page_load.json").write_text(
            json.dumps(
                {"unit": "s", "definition": pageload.__doc__.split("\n\n")[1], "pages": LOAD_S},
                indent=2,
            )
            + "\n"
        )
        if reporter is not None:
            reporter.write_line(f"page load [s] {LOAD_S} -> {where / 'page_load.json'}")


#: Page -> seconds from navigation to the last change drawn (written to page_load.json).
LOAD_S: dict[str, float] = {}


@pytest.fixture
def page(browser) -> Iterator[object]:  # type: ignore[no-untyped-def]
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    pageload.install(ctx)
    pg = ctx.new_page()
    yield pg
    ctx.close()


def settle(page, title: str) -> None:  # type: ignore[no-untyped-def]
    """Wait until the page's title shows and its main area has stopped changing."""
    page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
    pageload.wait_drawn(page)


def problems(page) -> list[str]:  # type: ignore[no-untyped-def]
    found = [e.inner_text() for e in page.locator('[data-testid="stException"]').all()]
    found += [e.inner_text() for e in page.locator('[data-testid="stAlertContentError"]').all()]
    return found


#: Text in the main area an operator must never see: a raw None/nan, or an ellipsis cutting a
#: number or unit ("423.1 L/…").
BAD_TEXT = re.compile(r"\b(None|nan|NaN)\b|\d\s?\S*…")

#: Elements of the main area whose text is cut by CSS (text-overflow: ellipsis shows "…" on
#: screen while innerText keeps the whole text): metric values and labels, table cells.
CLIPPED = """() => [...document.querySelectorAll(
    '[data-testid="stMain"] [data-testid="stMetricValue"] *,'
    + '[data-testid="stMain"] [data-testid="stMetricLabel"] *,'
    + '[data-testid="stMain"] [data-testid="stTable"] td,'
    + '[data-testid="stMain"] [data-testid="stTable"] th')]
  .filter(e => e.scrollWidth > e.clientWidth + 1 && e.innerText.trim())
  .map(e => e.innerText.trim())"""


#: A chart drawn: the console's own SVG (dashboards/svgchart.py), or a Vega-Lite chart
#: Streamlit has drawn (its canvas, or an SVG with the svg renderer).
CHART_DRAWN = (
    '[data-testid="stMain"] svg.dctwin-chart,'
    ' [data-testid="stMain"] [data-testid="stVegaLiteChart"] canvas,'
    ' [data-testid="stMain"] [data-testid="stVegaLiteChart"] svg'
)
#: The JavaScript files of Vega the page fetched (vega-embed and its interpreter; the console's
#: lines and bars need neither).
VEGA_JS = """() => performance.getEntriesByType('resource')
  .map(r => r.name).filter(n => /\\/(embed|vega-interpreter)\\.[^/]*\\.js$/.test(n))"""
#: The JavaScript files of plotly the page fetched.
PLOTLY_JS = """() => performance.getEntriesByType('resource')
  .map(r => r.name).filter(n => /plotly/i.test(n))"""


def shown_text(page) -> str:  # type: ignore[no-untyped-def]
    return page.locator('[data-testid="stMain"]').inner_text()


def shot(page, artifacts: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    page.screenshot(path=str(artifacts / f"console-{name}.png"), full_page=True)


def rgb(css: str) -> tuple[float, float, float]:
    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
    return r, g, b


@pytest.mark.parametrize("path", list(PAGES), ids=lambda p: p.split("?")[0] or "overview")
def test_every_page_opens_without_an_error_none_or_cut_number(  # type: ignore[no-untyped-def]
    console: str, page, artifacts: Path, path: str
) -> None:
    name = path.split("?")[0] or "overview"
    LOAD_S[name] = round(pageload.load_s(page, f"{console}/{path}"), 3)
    page.get_by_role("heading", name=PAGES[path]).first.wait_for(timeout=10_000)
    shot(page, artifacts, name)
    assert problems(page) == []
    text = shown_text(page)
    assert not BAD_TEXT.search(text), BAD_TEXT.search(text)
    assert page.evaluate(CLIPPED) == [], name
    if path in ("", "rack?rack=a01", "power", "cooling", "network", "fleets", "calibration"):
        assert page.locator(CHART_DRAWN).count() >= 1, path
    if path == "floor":
        assert page.locator("svg.dctwin-floor g.rack").count() == 32
    # the console's charts are Vega-Lite and SVG: plotly's 4.7 MB bundle is never fetched
    assert page.evaluate(PLOTLY_JS) == [], name


@pytest.mark.parametrize("path", ["", "alerts"], ids=["overview", "alerts"])
def test_the_pump_failure_is_listed_first_in_the_critical_colour(  # type: ignore[no-untyped-def]
    console: str, page, artifacts: Path, path: str
) -> None:
    """After the injected pump failure, the first alert an operator reads is the critical
    cdu_pump_lost, on a red badge, naming its CDU and the racks it cools."""
    page.goto(f"{console}/{path}")
    settle(page, PAGES[path])
    lines = page.locator('[data-testid="stMarkdownContainer"]').filter(
        has_text=re.compile(r"^\W*(CRITICAL|WARNING|INFO)\b")
    )
    assert lines.count() >= 1
    first = lines.first
    assert "cdu_pump_lost" in first.inner_text() and "cdu-1" in first.inner_text()
    assert "a01" in first.inner_text()  # the racks the CDU cools, not "members: cdu-1"
    badge = first.get_by_text("CRITICAL", exact=True).first
    r, g, b = rgb(badge.evaluate("e => getComputedStyle(e).color"))
    assert r > 1.5 * g and r > 1.5 * b, (r, g, b)  # red, the critical colour
    assert lines.filter(has_text="CRITICAL").count() >= 1
    shot(page, artifacts, f"{path or 'overview'}-critical-first")


def test_the_overview_draws_its_24_h_trends(  # type: ignore[no-untyped-def]
    console: str, page, artifacts: Path
) -> None:
    """IT power, cooling load against capacity and the tightest limit per kind: three
    charts drawn with something on them, their UTC time axes readable, and no chart library
    fetched for them."""
    page.goto(console)
    settle(page, "Overview")
    for title in ("IT power, last 24 h", "Cooling load against capacity", "Tightest limit"):
        assert page.get_by_text(title).count() >= 1, title
    drawn = page.locator(CHART_DRAWN)
    assert drawn.count() == 3
    for i in range(3):
        box = drawn.nth(i).bounding_box()
        assert box is not None and box["width"] > 150 and box["height"] > 100, box
        assert drawn.nth(i).locator("path.series").count() >= 1
        labels = drawn.nth(i).locator("text").evaluate_all("els => els.map(e => e.textContent)")
        assert "time [UTC]" in labels and any(re.fullmatch(r"\d\d:\d\d", t) for t in labels)
    assert page.evaluate(VEGA_JS) == []
    assert page.evaluate(PLOTLY_JS) == []
    shot(page, artifacts, "overview-trends")


def test_the_rack_deep_link_opens_that_rack(  # type: ignore[no-untyped-def]
    console: str, page, artifacts: Path
) -> None:
    page.goto(f"{console}/rack?rack=b03")
    settle(page, "Rack")
    picked = page.locator('[data-testid="stSelectbox"]').first.evaluate(
        "e => e.textContent + ' ' + [...e.querySelectorAll('input')].map(i => i.value).join(' ')"
    )
    assert "b03" in picked and "a01" not in picked, picked
    assert page.url.endswith("rack=b03")
    assert "CDU cdu-2" in shown_text(page)  # b03's own CDU, not a01's
    assert problems(page) == []
    shot(page, artifacts, "rack-b03")


def test_floor_map_shows_every_rack(  # type: ignore[no-untyped-def]
    console: str, page, svc: Service, artifacts: Path
) -> None:
    page.goto(f"{console}/floor")
    settle(page, "Floor")
    plot = page.locator("svg.dctwin-floor").first
    plot.wait_for()
    tiles = plot.locator("g.rack").evaluate_all(
        "els => els.map(e => [...e.querySelectorAll('text')].map(t => t.textContent))"
    )
    # each tile is the rack's name over its value ("a01" then "32.4 kW")
    racks = {r.name for r in svc.site.racks}
    assert len(tiles) == len(racks) == 32 and {t[0] for t in tiles} == racks
    assert all(re.fullmatch(r"[\d,.]+ kW|–", t[1]) for t in tiles), tiles
    # a tile opens its rack
    assert plot.locator('a[href="/rack?rack=a01"]').count() == 1
    shot(page, artifacts, "floor-map")


def test_an_alert_is_acknowledged_from_the_alerts_page(  # type: ignore[no-untyped-def]
    console: str, page, svc: Service, artifacts: Path
) -> None:
    """Last: it acknowledges the pump alert the tests above read."""
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
    shot(page, artifacts, "alerts-acknowledged")
    active = httpx.get(f"{svc.url}/api/v1/alerts", timeout=10).json()["active"]
    pump = next(a for a in active if a["dedup_key"] == PUMP_KEY)
    assert pump["acknowledged"]["acked_by"] == "console"
