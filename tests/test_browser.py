"""The console end to end in a real browser: headless Chromium driven by Playwright.

The service (the demo site, six simulated minutes with a CDU pump failing, so an alert fires)
runs in-process with its API; the console runs as `streamlit run dashboards/app.py`, exactly
as `dctwin demo` starts it. Every page must open without an exception or error box, the floor
map must show every rack, and an alert must be acknowledged from the Alerts page. What an operator
must see is asserted on the drawn page: the critical pump alert listed first and in the critical
colour, no "None", no truncated number, the rack deep link on the right rack. A screenshot per page
and each page's load time (navigation to its last change drawn, :mod:`harness.pageload`;
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
import yaml

from harness import pageload
from twin.bands import BAND_HEX, LimitBands
from twin.cli.demo import CONSOLE_STREAMLIT_OPTIONS
from twin.service import Service

from .helpers import API_TOKEN as TOKEN
from .helpers import REPO, RULES

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


def triage_rules(path: Path) -> Path:
    """deploy's rules with more to triage: GPUs within 40 K of slowdown (so most racks have a
    warning incident with several members) and an info rule on every rack's feeds, beside the
    critical pump alert; an operator must still read the pump first."""
    doc = yaml.safe_load(RULES.read_text())
    for r in doc["rules"]:
        if r["name"] == "gpu_temp_high":
            r.update(value=40, clear_value=45, for_s=0, group_wait_s=0, keep_firing_for_s=0)
    doc["rules"].append(
        {
            "name": "rack_feed_info",
            "type": "threshold",
            "metric": "headroom.rack.kw_to_limit",
            "entity_kind": "rack",
            "op": "<=",
            "value": 1000,
            "severity": "info",
            "summary": "rack {entity_id}: {value:.0f} kW to its feeds' limit",
        }
    )
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, start_service: Callable[..., Service]
) -> Iterator[Service]:
    where = tmp_path_factory.mktemp("browser")
    s = start_service(
        where / "browser.duckdb",
        site_path=DEMO_SITE,
        minutes=6,
        faults=("pump_failure:cdu-1/pump1@3m",),
        rules=triage_rules(where / "rules.yaml"),
    )
    yield s
    s.stop()


def band_thresholds(svc: Service) -> tuple[float, float]:
    """Amber and red thresholds [%] between the racks' largest shares of a limit used, so
    that the floor map has racks in each of the three bands."""
    used = sorted(
        r["limit_used_max_pct"]
        for r in httpx.get(f"{svc.url}/api/v1/racks", timeout=10).json()["racks"]
        if r["limit_used_max_pct"] is not None
    )
    assert len(set(used)) >= 3, used
    n = len(used)
    amber = (used[n // 3 - 1] + used[n // 3]) / 2
    red = (used[2 * n // 3 - 1] + used[2 * n // 3]) / 2
    return round(amber, 4), round(red, 4)


@pytest.fixture(scope="module")
def console(svc: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    amber, red = band_thresholds(svc)
    env = {
        **os.environ,
        "DCTWIN_API_URL": svc.url,
        "DCTWIN_CONSOLE_TOKEN": TOKEN,
        "DCTWIN_CONSOLE_REFRESH_S": "600",  # no refresh in the middle of a click
        # bands set between the racks' figures: the floor map shows all three
        "DCTWIN_BAND_AMBER_PCT": str(amber),
        "DCTWIN_BAND_RED_PCT": str(red),
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
#: screen while innerText keeps the whole text): figures and their labels, table cells.
CLIPPED = """() => [...document.querySelectorAll(
    '[data-testid="stMain"] .dctwin-stat .value,'
    + '[data-testid="stMain"] .dctwin-stat .label,'
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
    if path == "floor":  # the 32nd tile drawn (a loaded machine draws late), and no 33rd
        page.locator("svg.dctwin-floor g.rack").nth(31).wait_for(timeout=30_000)
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
    lines.first.wait_for(timeout=30_000)  # drawn after the page's title on a loaded machine
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
    # the picker's popover button names the rack shown
    picked = page.locator('[data-testid="stPopover"] button').first.inner_text()
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
    # each tile is the rack's name over its worst limit used ("a01" then "61 %")
    racks = {r.name for r in svc.site.racks}
    assert len(tiles) == len(racks) == 32 and {t[0] for t in tiles} == racks
    assert all(re.fullmatch(r"[\d,.]+ %|–", t[1]) for t in tiles), tiles
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
    # Streamlit marks a widget's container with its key: the pump's group (rule|CDU|cdu-1)
    key = "st-key-ack_cdu_pump_lost-CDU-cdu-1"
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


SEVERITY_RANK = {"CRITICAL": 0, "WARNING": 1, "INFO": 2}


def test_alert_groups_and_counts_in_severity_order(  # type: ignore[no-untyped-def]
    console: str, page, svc: Service, artifacts: Path
) -> None:
    """The Alerts page as drawn: one card per rule and rack/CDU/fleet, critical first, each
    card's member count the members the API lists for its alerts, the counts per severity;
    the Overview's alert stat in the worst severity's colour."""
    active = httpx.get(f"{svc.url}/api/v1/alerts", timeout=10).json()["active"]
    page.goto(f"{console}/alerts")
    settle(page, "Alerts")
    cards = page.locator('[class*="st-key-group-"]')
    n = cards.count()
    assert n >= 3
    heads = [
        cards.nth(i).locator('[data-testid="stMarkdownContainer"]').first.inner_text()
        for i in range(n)
    ]
    sev = [re.match(r"\W*(CRITICAL|WARNING|INFO)\b", h).group(1) for h in heads]  # type: ignore[union-attr]
    assert sev == sorted(sev, key=SEVERITY_RANK.__getitem__), sev
    assert {"CRITICAL", "WARNING"} <= set(sev)
    assert "cdu_pump_lost" in heads[0] and "cdu-1" in heads[0]
    # member counts: the members of the API's alerts under that rule and scope
    members: dict[tuple[str, str], set[str]] = {}
    for a in active:
        scope = a["group_id"] if a["group_kind"] in ("rack", "cdu", "fleet") else a["racks"][0]
        members.setdefault((a["rule"], scope), set()).update(a["members"])
    # the first screens of the list, the rest counted (the info groups come last)
    assert n == min(len(members), 20)
    if len(members) > n:
        assert page.get_by_text(f"{len(members) - n} more groups: narrow the filters").count()
    for h in heads:
        rule, scope, count = re.search(
            r"(\w+) on (?:rack|CDU|fleet) (\S+?)(?: ·.*?)? · (\d+) members?", h
        ).groups()  # type: ignore[union-attr]
        assert int(count) == len(members[(rule, scope)]), h
    # the groups of one rule with many members: fewer cards than alerts' members
    assert n < sum(len(m) for m in members.values())
    counts = page.get_by_text("Open alerts by severity:").first.inner_text()
    for word in ("critical", "warning", "info"):
        expected = sum(a["severity"] == word for a in active)
        assert re.search(rf"{word}\W+{expected}\b", counts, re.I), (word, expected, counts)
    shot(page, artifacts, "alerts-groups")
    page.goto(console)
    settle(page, "Overview")
    stat = page.locator(".dctwin-alert-stat .value").first
    assert stat.inner_text().strip() == str(len(active))
    assert rgb(stat.evaluate("e => getComputedStyle(e).color")) == (213.0, 94.0, 0.0)
    assert f"{sum(a['severity'] == 'critical' for a in active)} critical" in shown_text(page)


def test_floor_and_table_band_colours_follow_the_fractions(  # type: ignore[no-untyped-def]
    console: str, page, svc: Service, artifacts: Path
) -> None:
    """Each floor tile is filled with the colour of its rack's band, from the API's largest
    share of a limit used and the console's bands (set between the racks' figures, so all
    three appear); the table's bars carry the same bands."""
    amber, red = band_thresholds(svc)
    bands = LimitBands(amber_pct=amber, red_pct=red)
    racks = httpx.get(f"{svc.url}/api/v1/racks", timeout=10).json()["racks"]
    want = {
        r["name"]: bands.band(r["limit_used_max_pct"]) for r in racks if r["limit_used_max_pct"]
    }
    assert {b.value for b in want.values()} == {"neutral", "amber", "red"}
    page.goto(f"{console}/floor")
    settle(page, "Floor")
    tiles = page.locator("svg.dctwin-floor g.rack").evaluate_all(
        "els => els.map(e => [e.dataset.rack, e.dataset.band || null,"
        " e.querySelector('rect').getAttribute('fill')])"
    )
    assert len(tiles) == 32
    for name, band, fill in tiles:
        if name in want:
            assert band == want[name].value, (name, band, want[name])
            assert fill.lower() == BAND_HEX[want[name]].lower(), (name, fill)
    shot(page, artifacts, "floor-bands")
    page.get_by_text("All racks as a table").click()
    cells = page.locator("td[data-band]")
    cells.first.wait_for(timeout=10_000)
    got = cells.evaluate_all(
        "els => els.map(e => [e.closest('tr').children[0].innerText, e.dataset.band])"
    )
    assert len(got) == len(want)
    for name, band in got:
        assert band == want[name].value, (name, band)


def test_the_rack_page_shows_the_apis_limits_and_an_unknown_rack_is_an_error(  # type: ignore[no-untyped-def]
    console: str, page, svc: Service, artifacts: Path
) -> None:
    rows = httpx.get(f"{svc.url}/api/v1/headroom", params={"rack": "a03"}, timeout=10).json()
    gpu = {r["id"]: r for r in rows["rows"] if r["kind"] == "gpu"}
    page.goto(f"{console}/rack?rack=a03")
    settle(page, "Rack")
    marks = page.locator("svg.dctwin-chart line.mark").evaluate_all(
        "els => els.map(e => [e.dataset.x, parseFloat(e.dataset.value)])"
    )
    gpu_marks = [(x, v) for x, v in marks if x in gpu]
    assert len(gpu_marks) == len(gpu) > 0
    for x, v in gpu_marks:
        assert v == pytest.approx(gpu[x]["limit"]), x  # the tick is the API's limit
    tight = min(gpu.values(), key=lambda r: r["headroom_now"])
    assert f"{tight['headroom_now']:.1f} K to slowdown" in shown_text(page)
    assert problems(page) == []
    shot(page, artifacts, "rack-a03-limits")
    page.goto(f"{console}/rack?rack=zz99")
    page.get_by_role("heading", name="Rack").first.wait_for(timeout=60_000)
    page.locator('[data-testid="stAlertContentError"]').first.wait_for(timeout=30_000)
    pageload.wait_drawn(page)
    assert any("No rack 'zz99' in the site" in p for p in problems(page)), problems(page)
    assert "IT power" not in shown_text(page)  # no other rack shown in its place
    shot(page, artifacts, "rack-unknown")


def test_the_fleets_headline_equals_its_table(  # type: ignore[no-untyped-def]
    console: str, page, artifacts: Path
) -> None:
    page.goto(f"{console}/fleets")
    settle(page, "Fleets")
    metric = page.locator(".dctwin-stat").filter(has_text="GPUs to reclaim").first
    headline = int(metric.locator(".value").inner_text().replace(",", ""))
    table = page.locator(".dctwin-table table").filter(has_text="gpus_to_reclaim").first
    head = table.locator("th").all_inner_texts()
    col = head.index("gpus_to_reclaim")
    cells = table.locator("tbody tr").evaluate_all(
        f"rows => rows.map(r => r.children[{col}].innerText)"
    )
    total = sum(int(c.replace(",", "")) for c in cells if c.strip() not in ("–", ""))
    assert headline == total > 0
    shot(page, artifacts, "fleets-headline")
