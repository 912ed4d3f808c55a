"""The what-if report (twin/replay/report.py): its figures, its HTML and its Markdown.

The unit tests build :class:`RunResult` values by hand (no simulator); the browser test opens
the written report.html in headless Chromium through Playwright and reads what a planner sees;
the CLI test runs the real ``dctwin whatif`` on the shipped demo bundle.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest

from twin.replay.bundle import Bundle
from twin.replay.report import (
    BASELINE_COLOUR,
    SERIES,
    VERDICT_COLOUR,
    figures,
    figures_json,
    html_report,
    markdown,
    run_colours,
    write_report,
)
from twin.replay.result import ComponentChange, ComponentResult, KindSummary, RunResult

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "sample_telemetry" / "demo_bundle"
SCENARIOS = REPO / "sample_telemetry" / "scenarios"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
T0 = datetime(2026, 11, 23, tzinfo=UTC)
N = 145  # 24 h at 10 min


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return Bundle.load(BUNDLE)  # only its manifest is read by the report


def kind(
    k: str, unit: str, headroom: float, breaching: int = 0, over_s: float = 0.0
) -> KindSummary:
    return KindSummary(
        kind=k,  # type: ignore[arg-type]
        unit=unit,
        components=10,
        worst_id=f"{k}-1",
        worst_min_headroom=headroom,
        breaching=breaching,
        time_over_s=over_s,
        component_over_s=over_s * breaching,
        first_breach=T0 + timedelta(hours=14) if breaching else None,
    )


def make_run(
    name: str,
    verdict: str,
    scale: float,
    *,
    keys: tuple[str, ...] = (
        "it_power_kw",
        "liquid_heat_kw",
        "cdu_capacity_kw",
        "gpu_temp_max_c",
        "cdu_util_max",
        "phase_util_max",
    ),
    **kw: object,
) -> RunResult:
    """A run whose paths are the baseline's scaled by ``scale``."""
    shape = [1 + 0.3 * ((i % 48) / 48) for i in range(N)]
    base = {
        "it_power_kw": [700 * s * scale for s in shape],
        "liquid_heat_kw": [500 * s * scale for s in shape],
        "cdu_capacity_kw": [920.0] * N,
        "gpu_temp_max_c": [70 + 10 * s * scale for s in shape],
        "cdu_util_max": [0.6 * s * scale for s in shape],
        "phase_util_max": [0.8 * s * scale for s in shape],
        "rack_util_max": [0.5 * s * scale for s in shape],
    }
    series = {"t_h": [i / 6 for i in range(N)], **{k: base[k] for k in keys}}
    fields: dict[str, object] = {
        "name": name,
        "description": f"{name}, built in the test",
        "verdict": verdict,
        "reasons": [f"{name}: a reason"],
        "kinds": [
            kind("pdu_phase", "A", -15.8 * scale, breaching=2, over_s=6140 * scale),
            kind("gpu", "°C", 3.0 / scale),
        ],
        "worst": [],
        "alerts": [
            {
                "at": "2026-11-23T10:00:00+00:00",
                "status": "firing",
                "rule": "cdu_pump_lost",
                "severity": "critical",
                "group": "cdu cdu-2",
                "summary": "CDU cdu-2: 1 pump(s) running",
            }
        ],
        "it_energy_kwh": 17050 * scale,
        "liquid_heat_kwh": 12077 * scale,
        "throttled_gpu_s": 0.0,
        "series": series,
        "cdus": {},
        "gpu_mean_temp_c": {},
    }
    fields.update(kw)
    return RunResult.model_validate(fields)


@pytest.fixture
def runs() -> tuple[RunResult, list[RunResult]]:
    base = make_run("baseline", "baseline", 1.0)
    scen = [
        make_run("cap-500w", "fits", 0.9),
        make_run("water-plus-3c", "fits with risks", 1.02),
        make_run("cdu-1-fails", "does not fit", 1.2),
    ]
    return base, scen


def traces_of(fig) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {t.name: t for t in fig.data}


def test_each_scenario_has_one_colour_in_every_figure_and_the_baseline_is_dashed(runs) -> None:
    base, scen = runs
    colours = run_colours(scen)
    assert len(set(colours)) == len(scen) and BASELINE_COLOUR not in colours
    figs = figures(base, scen)
    assert len(figs) >= 5
    for key, fig in figs:
        t = traces_of(fig)
        assert t["baseline"].line.color == BASELINE_COLOUR, key
        assert t["baseline"].line.dash == "dash", key
        for r, colour in zip(scen, colours, strict=True):
            assert t[r.name].line.color == colour, (key, r.name)
            assert t[r.name].line.dash == "solid", (key, r.name)
        # the baseline is drawn over the scenarios and listed first
        assert fig.data[-1].name in ("baseline", "baseline: limit", "limit (1)"), key
        ranks = {tr.name: tr.legendrank for tr in fig.data}
        assert ranks["baseline"] == min(ranks.values()), key


def test_one_figure_per_quantity_and_a_key_no_run_holds_is_skipped() -> None:
    keys = ("it_power_kw", "liquid_heat_kw", "cdu_capacity_kw", "cdu_util_max", "rack_util_max")
    base = make_run("baseline", "baseline", 1.0, keys=keys)
    scen = [make_run("s1", "fits", 1.1, keys=keys)]
    got = [k for k, _ in figures(base, scen)]
    # known keys in the table's order; the capacity is the heat's limit, not a figure of its
    # own; a key the table does not know comes last; gpu_temp_max_c and phase_util_max absent
    assert got == ["it_power_kw", "liquid_heat_kw", "cdu_util_max", "rack_util_max"]
    assert [k for k in SERIES if k in got] == got[:3]


def test_limits_are_dotted_lines(runs) -> None:
    base, scen = runs
    figs = dict(figures(base, scen))
    for key in ("cdu_util_max", "phase_util_max"):
        lim = traces_of(figs[key])["limit (1)"]
        assert lim.line.dash == "dot" and list(lim.y) == [1.0, 1.0]
        assert (lim.x[0], lim.x[-1]) == (0.0, base.series["t_h"][-1])
    heat = traces_of(figs["liquid_heat_kw"])
    colours = dict(zip([r.name for r in scen], run_colours(scen), strict=True))
    for r in scen:  # each run's own capacity, dotted in its colour
        cap = heat[f"{r.name}: limit"]
        assert cap.line.dash == "dot" and cap.line.color == colours[r.name]
        assert list(cap.y) == r.series["cdu_capacity_kw"]
    assert "limit (1)" not in traces_of(figs["it_power_kw"])


def test_figures_json_round_trips_through_plotly(runs) -> None:
    import plotly.graph_objects as go

    base, scen = runs
    out = figures_json(base, scen)
    assert [f["key"] for f in out] == [k for k, _ in figures(base, scen)]
    back = go.Figure(out[0]["figure"])
    assert traces_of(back)["cdu-1-fails"].line.color == run_colours(scen)[2]


class Doc(HTMLParser):
    """The HTML's elements and its text, as Python's own parser reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)

    def count(self, tag: str, cls: str | None = None) -> int:
        return sum(
            t == tag and (cls is None or cls in (a.get("class") or "")) for t, a in self.tags
        )


def parse(html: str) -> Doc:
    d = Doc()
    d.feed(html)
    d.close()
    return d


def test_the_html_is_tables_and_badges_with_no_markdown(bundle, runs) -> None:
    base, scen = runs
    html = html_report(bundle, base, scen)
    doc = parse(html)
    text = "".join(doc.text)
    assert "|---" not in text and "**" not in text and "`" not in text
    assert not [ln for ln in text.splitlines() if ln.lstrip().startswith(("# ", "- ", "| "))]
    assert doc.count("pre") == 0
    # summary; baseline: kinds, alerts; per scenario: kinds, alerts (nothing recorded/changed)
    assert doc.count("table") == 1 + 2 + 2 * len(scen)
    assert doc.count("section", "scenario") == len(scen)
    badges = [
        a.get("style") or "" for t, a in doc.tags if t == "span" and a.get("class") == "badge"
    ]
    for verdict in ("fits", "fits with risks", "does not fit", "baseline"):
        assert any(VERDICT_COLOUR[verdict] in b for b in badges), verdict
    # plotly.js once, inline; every figure drawn from it; nothing fetched from the network
    assert html.count("Plotly.newPlot(") == len(figures(base, scen))
    assert html.count("plotly.js v") == 1
    srcs = [a.get("src") for t, a in doc.tags if t == "script" and a.get("src")]
    assert srcs == []


def test_names_and_text_from_files_are_escaped(bundle, runs) -> None:
    base, scen = runs
    evil = scen[0].model_copy(update={"name": "<script>alert(1)</script>", "description": "a & b"})
    html = html_report(bundle, base, [evil])
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "a &amp; b" in html


def test_recorded_breaches_are_kept_apart_from_what_the_scenario_changes(bundle, runs) -> None:
    base, scen = runs
    rec = ComponentResult(
        kind="pdu_phase",
        id="pdu-d08-a/L1",
        unit="A",
        limit=100.0,
        peak=115.8,
        min_headroom=-15.8,
        time_over_s=6140.0,
        first_breach=T0 + timedelta(hours=15, minutes=38),
    )
    change = ComponentChange(
        kind="cdu_heat",
        id="cdu-2",
        unit="kW",
        limit=221.2,
        baseline_min_headroom=12.1,
        min_headroom=-101.0,
        delta=-113.1,
        baseline_time_over_s=0.0,
        time_over_s=7200.0,
        change="new breach",
    )
    base = base.model_copy(update={"recorded_breaches": [rec]})
    s = scen[2].model_copy(update={"changes": [change]})
    html = html_report(bundle, base, [s])
    doc = parse(html)
    assert doc.count("table") == 1 + 3 + 4  # the recorded breaches in both, the change once
    sec = html.index('id="scenario-1"')
    rec_at = html.index("Already breaching in the recording", sec)
    chg_at = html.index("What the scenario changes", sec)
    assert rec_at < html.index("pdu-d08-a/L1", rec_at) < chg_at < html.index("new breach", chg_at)
    md = markdown(bundle, base, [s])
    section = md[md.index("## cdu-1-fails") :]
    recorded = section[section.index("### Already breaching") : section.index("### What")]
    changed = section[section.index("### What") : section.index("### Alerts")]
    assert "pdu-d08-a/L1" in recorded and "-15.8 A" in recorded and "cdu-2" not in recorded
    assert "new breach" in changed and "-113.1 kW" in changed and "2 h 00 min" in changed


def test_empty_lists_say_nothing_false(bundle, runs) -> None:
    base, scen = runs
    md = markdown(bundle, base, scen)
    # the baseline counts 2 phases over their limit but lists none: say so, never "nothing"
    assert "Not itemised in these results; the baseline counts 2 component(s)" in md
    assert "Nothing was over its limit" not in md
    calm = base.model_copy(update={"kinds": [kind("gpu", "°C", 5.0)]})
    assert "Nothing was over its limit in the recording." in markdown(bundle, calm, scen)
    assert "No component changes are listed for this scenario" in md


def test_time_over_component_minutes_and_undelivered_energy(bundle, runs) -> None:
    base, scen = runs
    throttled = scen[2].model_copy(update={"throttled_gpu_s": 3600.0 * 511})
    delivered = scen[1].model_copy(
        update={"throttled_gpu_s": 7200.0, "undelivered_energy_kwh": 12.5, "duration_s": 86400.0}
    )
    md = markdown(bundle, base, [scen[0], delivered, throttled])
    lines = md.splitlines()
    table = lines[4 : next(i for i in range(4, len(lines)) if not lines[i].startswith("|"))]
    head = table[0].split(" | ")
    rows = {ln.split(" | ")[0].lstrip("| "): ln.split(" | ") for ln in table[2:]}
    col = head.index("energy not delivered (kWh)")
    assert rows["cdu-1-fails"][col] == "not reported"  # throttled, yet no energy reported
    assert rows["water-plus-3c"][col] == "12.5"
    assert rows["cap-500w"][col] == "0.0"  # nothing throttled: nothing lost
    assert rows["cdu-1-fails"][head.index("throttled GPU-hours")] == "511.0"
    # longest over one component (6140 s x 1.2 = 2 h 03 min) and component-minutes (2 x that)
    kinds = md[md.index("## cdu-1-fails") :]
    line = next(ln for ln in kinds.splitlines() if ln.startswith("| PDU phase"))
    assert "| 2 h 03 min | 246 |" in line


# --- in a real browser ------------------------------------------------------------------------

LEGEND_JS = """gd => {
  const style = el => el ? [getComputedStyle(el).stroke, getComputedStyle(el).strokeDasharray]
                         : [null, null];
  const drawn = [...gd.querySelectorAll('.scatterlayer g.trace')].map(t => {
    const tr = t.__data__[0].trace, [colour, dash] = style(t.querySelector('path.js-line'));
    return {name: tr.name, index: tr.index, data_colour: gd._fullData[tr.index].line.color,
            colour, dash};
  });
  const legend = [...gd.querySelectorAll('g.legend g.traces')].map(t => {
    const tr = t.__data__[0].trace, [colour, dash] = style(t.querySelector('path.js-line'));
    return {text: t.querySelector('text.legendtext').textContent, name: tr.name,
            index: tr.index, colour, dash};
  });
  return {drawn, legend};
}"""


def rgb(colour: str) -> tuple[int, int, int]:
    """``#rrggbb`` or ``rgb(r, g, b)`` as a tuple."""
    if colour.startswith("#"):
        return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]
    r, g, b = (int(x) for x in re.findall(r"\d+", colour)[:3])
    return r, g, b


def assert_legend_true(found: dict, colours: dict[str, str], panel: int) -> None:
    """Each legend entry has its trace's colour and dash, and so has every line drawn under the
    entry's name (in this panel or any subplot of it); a scenario has its one colour."""
    legend = {e["text"]: e for e in found["legend"]}
    assert len(legend) == len(found["legend"]) >= len(colours) + 1, (panel, found["legend"])
    for e in found["legend"]:
        assert e["text"] == e["name"], (panel, e)
    for d in found["drawn"]:
        e = legend.get(d["name"])
        assert e is not None, (panel, d)  # every line drawn is named in the legend
        assert rgb(d["colour"]) == rgb(d["data_colour"]) == rgb(e["colour"]), (panel, d, e)
        assert d["dash"] == e["dash"], (panel, d, e)
        name = d["name"].removesuffix(": limit")
        if name in colours:
            assert rgb(d["colour"]) == rgb(colours[name]), (panel, d)
        if d["name"] == "baseline":
            assert rgb(d["colour"]) == rgb(BASELINE_COLOUR), (panel, d)
            assert d["dash"] not in ("none", ""), (panel, d)  # dashed


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run installs it)")
    pw = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
    with pw.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield b
        b.close()


@pytest.mark.slow
def test_report_html_in_a_browser_shows_tables_and_true_legends(
    browser, bundle, runs, tmp_path: Path
) -> None:
    base, scen = runs
    _, html_path = write_report(bundle, base, scen, tmp_path)
    ctx = browser.new_context(viewport={"width": 1300, "height": 1000}, offline=True)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(html_path.as_uri())
    n_figs = len(figures(base, scen))
    page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot g.legend').length == {n_figs}", timeout=30_000
    )
    assert errors == []
    text = page.evaluate("document.body.innerText")
    assert "|---" not in text and "**" not in text
    bad = [ln for ln in text.splitlines() if ln.startswith(("# ", "- ", "| "))]
    assert bad == []
    # every tabular block a <table>: no <pre>, no text line built of cells and bars
    assert page.locator("pre").count() == 0
    assert [ln for ln in text.splitlines() if ln.count("|") >= 2] == []
    assert page.locator("table").count() == 1 + 2 + 2 * len(scen)
    for i in range(len(scen)):
        assert page.locator(f"#scenario-{i + 1} table").count() == 2
    colours = dict(zip([r.name for r in scen], run_colours(scen), strict=True))
    plots = page.locator(".js-plotly-plot")
    assert plots.count() == n_figs
    for i in range(n_figs):
        assert_legend_true(plots.nth(i).evaluate(LEGEND_JS), colours, i)
    ctx.close()


@pytest.mark.slow
def test_dctwin_whatif_writes_a_report_with_a_table_per_scenario(tmp_path: Path) -> None:
    out = tmp_path / "report"
    scenario = SCENARIOS / "gpu-power-cap-500w.yaml"
    res = subprocess.run(
        [sys.executable, "-m", "twin.cli", "whatif", str(BUNDLE), str(scenario), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"report: {out / 'report.md'} {out / 'report.html'}" in res.stdout
    doc = parse((out / "report.html").read_text(encoding="utf-8"))
    assert doc.count("section", "scenario") == 1
    assert doc.count("table") >= 1 + 2 + 2  # summary, the baseline's, the scenario's
    html = (out / "report.html").read_text(encoding="utf-8")
    section = html[html.index('id="scenario-1"') :]
    assert "gpu-power-cap-500w" in section[:400] and "<table>" in section
    assert "## gpu-power-cap-500w:" in (out / "report.md").read_text(encoding="utf-8")
    assert (out / "figures.json").is_file()
