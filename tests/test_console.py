"""The Streamlit console, every page, with Streamlit's AppTest against a running API."""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pandas as pd
import pyarrow as pa
import pyarrow.ipc
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from twin.service import Service

from .helpers import API_TOKEN as TOKEN
from .helpers import PUMP_KEY, REPO, page_figures

DASH = REPO / "dashboards"
PAGES = sorted((DASH / "pages").glob("*.py"))


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, start_service: Callable[..., Service]
) -> Iterator[Service]:
    s = start_service(tmp_path_factory.mktemp("console") / "console.duckdb")
    yield s
    s.stop()


@pytest.fixture
def env(svc: Service, monkeypatch: pytest.MonkeyPatch) -> Service:
    monkeypatch.setenv("DCTWIN_API_URL", svc.url)
    monkeypatch.setenv("DCTWIN_CONSOLE_TOKEN", TOKEN)
    st.cache_data.clear()  # the console shares API answers for a few seconds
    return svc


def run(page: Path | str, errors: int = 0, **query: str) -> AppTest:
    """The page run with ``query`` as its URL's query; it must draw exactly ``errors`` errors."""
    at = AppTest.from_file(str(page), default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert len(at.error) == errors, [e.value for e in at.error]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    """The page's labelled figures (``dashboards.ui.metric``), label -> value as shown."""
    return {label: value for label, (value, _) in page_figures(at).items()}


def vega(at: AppTest) -> list[tuple[dict, pd.DataFrame]]:
    """Every Vega-Lite chart the page drew: its spec and the data it was given."""
    out = []
    for el in at.get("vega_lite_chart"):
        raw = el.proto.data.data
        df = pa.ipc.open_stream(raw).read_all().to_pandas() if raw else pd.DataFrame()
        out.append((json.loads(el.proto.spec), df))
    return out


def _attr(tag: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', tag)
    return html.unescape(found.group(1)) if found else ""


def charts(at: AppTest) -> list[dict]:
    """Every line or bar chart the page drew as SVG (dashboards/svgchart.py): its value axis's
    title, the time axis's title and labels, each line's name and number of points, each bar's
    id and value, the red ticks and the limit rules."""
    out = []
    for md in at.markdown:
        for svg in re.findall(r'<svg class="dctwin-chart".*?</svg>', str(md.value), re.S):
            head = svg[: svg.index(">")]
            x_title = re.search(r'class="x-title"[^>]*>([^<]*)<', svg)
            out.append(
                {
                    "kind": _attr(head, "data-kind"),
                    "y_title": _attr(head, "data-y-title"),
                    "x_title": html.unescape(x_title.group(1)) if x_title else None,
                    "x_labels": re.findall(r'text-anchor="middle"[^>]*>(\d\d:\d\d[^<]*)<', svg),
                    "series": {
                        _attr(t, "data-name"): int(_attr(t, "data-points"))
                        for t in re.findall(r'<path class="series"[^>]*>', svg)
                    },
                    "bars": [
                        (_attr(t, "data-x"), float(_attr(t, "data-value")))
                        for t in re.findall(r'<rect class="bar"[^>]*>', svg)
                    ],
                    "marks": [
                        (_attr(t, "data-x"), float(_attr(t, "data-value")))
                        for t in re.findall(r'<line class="mark"[^>]*>', svg)
                    ],
                    "limits": [
                        float(_attr(t, "data-y"))
                        for t in re.findall(r'<line class="limit"[^>]*>', svg)
                    ],
                }
            )
    return out


def assert_no_plotly(at: AppTest) -> None:
    assert not at.get("plotly_chart")


class _Tables(HTMLParser):
    """The tables of an HTML body: per table its header titles, its rows of cell text and the
    tooltip (``title``) of every cell that has one."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict] = []
        self._cell: list[str] | None = None
        self._tip: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self.tables.append({"header": [], "rows": [], "tips": [], "header_tips": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("th", "td"):
            self._cell, self._tip = [], a.get("title")
        elif tag == "span" and self._cell is not None and a.get("title"):
            self._tip = a["title"]

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag not in ("th", "td") or self._cell is None:
            return
        t = self.tables[-1]
        cell = "".join(self._cell).strip()
        if tag == "th":
            t["rows"].pop() if t["rows"] == [[]] else None
            t["header"].append(cell)
            t["header_tips"].append(self._tip)
        else:
            t["rows"][-1].append(cell)
            if self._tip:
                t["tips"].append(self._tip)
        self._cell = None


def tables(at: AppTest) -> list[dict]:
    """Every table the page drew (``st.html``), as its header, rows and tooltips."""
    found: list[dict] = []
    for el in at.get("html"):
        parser = _Tables()
        parser.feed(el.proto.body)
        found += parser.tables
    for t in found:
        t["rows"] = [r for r in t["rows"] if r]
    return found


def column(t: dict, title: str) -> list[str]:
    i = t["header"].index(title)
    return [r[i] for r in t["rows"]]


def text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += [i.value for i in at.info] + [s.value for s in at.success]
    parts += [w.value for w in at.warning]
    return "\n".join(str(p) for p in parts)


def test_every_page_is_tested() -> None:
    assert {p.stem for p in PAGES} == {
        "overview",
        "floor",
        "rack",
        "power",
        "cooling",
        "network",
        "fleets",
        "alerts",
        "calibration",
        "whatif",
    }


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_app_opens_on_the_overview(env: Service) -> None:
    at = run(DASH / "app.py")
    assert "IT power" in metrics(at)


def test_overview(env: Service) -> None:
    at = run(DASH / "pages" / "overview.py")
    m = metrics(at)
    assert m["IT power"].endswith("kW") and m["Cooling load (CDUs)"].endswith("kW")
    assert m["Data age"].endswith("s")
    # the alert stat: its count in the worst severity's colour, the count per severity under it
    stat = next(el.proto.body for el in at.get("html") if "dctwin-alert-stat" in el.proto.body)
    assert 'data-severity="critical"' in stat and ">1</div>" in stat
    assert "color:#D55E00" in stat  # the critical colour
    assert "1 critical · 0 warning · 0 info · 1 unacknowledged" in text(at)
    assert "cdu_pump_lost" in text(at) and "Closest to their limits" in text(at)
    # the critical alert in the critical colour, naming its CDU and the rack it cools
    line = next(md.value for md in at.markdown if "cdu_pump_lost" in md.value)
    assert line.startswith(":red-badge[CRITICAL]") and "CDU **cdu-1** · rack r01" in line
    assert "(1 member)" in line
    summary, tight, ingest = tables(at)  # headroom summary, the ten tightest limits, ingest
    assert summary["header"][:3] == ["kind", "count", "smallest headroom"]
    assert {"gpu", "rack"} <= set(column(summary, "kind"))
    assert all(
        re.fullmatch(r"-?[\d,.]+ (K|kW|A|W|Gb/s|°C|%|L/min)|–", v)
        for v in column(summary, "smallest headroom")
    ), column(summary, "smallest headroom")
    # the ten limits closest to breach, each with its share of the limit as a figure and a bar
    assert len(tight["rows"]) == 10 and "limit used [%]" in tight["header"]
    used = [float(v.removesuffix(" %").replace(",", "")) for v in column(tight, "limit used [%]")]
    assert all(0 <= u <= 100 for u in used), used
    body = next(el.proto.body for el in at.get("html") if "limit used [%]" in el.proto.body)
    assert body.count("linear-gradient") == 10
    assert all(re.search(r"\d (K|kW|A|W|Gb/s|°C|%|L/min)$", v) for v in column(tight, "limit"))
    assert ingest["header"] == ["kind", "newest sample", "age"]
    assert all(v.endswith(" UTC") for v in column(ingest, "newest sample"))
    # 24 h trends: IT power, cooling load against capacity, the tightest limit per kind
    drawn = charts(at)
    assert len(drawn) == 3
    assert not vega(at)  # no chart library for the browser to load
    assert_no_plotly(at)
    assert [c["y_title"] for c in drawn] == [
        "IT power [kW]",
        "heat removed by the CDUs [kW]",
        "limit used [%]",
    ]
    for c in drawn:
        assert c["x_title"] == "time [UTC]" and c["x_labels"], c  # UTC, %H:%M
        assert all(re.fullmatch(r"\d\d:\d\d", label) for label in c["x_labels"]), c
        assert c["series"] and all(n > 0 for n in c["series"].values()), c
    assert drawn[1]["limits"] == [env.site.cdus[0].capacity_kw]
    assert set(drawn[2]["series"]) >= {"gpu", "rack"}


@pytest.mark.slow  # eight pages, 1 s or more each: out of the fast tier
@pytest.mark.parametrize(
    "page", ["overview", "rack", "power", "cooling", "network", "fleets", "alerts", "calibration"]
)
def test_pages_show_no_none_and_no_false_delta(env: Service, page: str) -> None:
    """A missing value is a dash, never "None"/"nan"; a figure's delta is for changes only
    (a limit, a share of capacity or a count of GPUs is context, shown as a caption)."""
    at = run(DASH / "pages" / f"{page}.py", **({"rack": "r01"} if page == "rack" else {}))
    figures = page_figures(at)
    shown = text(at) + "\n".join(f"{label} {v}" for label, (v, _) in figures.items())
    for t in tables(at):
        shown += "\n" + "\n".join(" ".join(r) for r in [t["header"], *t["rows"]])
    # a missing value is a dash that says why in its tooltip
    for t in tables(at):
        dashes = sum(r.count("–") for r in t["rows"])
        assert len([tip for tip in t["tips"] if tip]) >= dashes, t
    assert not re.search(r"\b(None|nan|NaN)\b", shown), shown
    assert [label for label, (_, delta) in figures.items() if delta] == []


def test_number_formatter() -> None:
    from dashboards import ui

    assert ui.fmt(None, "kW") == ui.fmt(float("nan"), "kW") == ui.fmt("x") == "–"
    assert ui.fmt(423.14, "L/min") == "423 L/min" and ui.fmt(12.345, "K") == "12.3 K"
    assert ui.fmt(1151234.0, "kW") == "1,151,234 kW" and ui.fmt(0.0123, "") == "0.01"
    assert ui.fmt(-0.001, "K") == "0.00 K" and ui.fmt(3.14159, "°C", 0) == "3 °C"
    assert ui.plural(1, "member") == "1 member" and ui.plural(3, "rack") == "3 racks"


def test_tables_are_escaped_static_html_with_units_and_dashes() -> None:
    """A table is static HTML: every value escaped (a message's text never becomes markup),
    a column at one precision with its unit in its title, a missing value a dash whose tooltip
    says why, and the rows past the limit counted, not dropped silently."""
    from dashboards import ui

    df = pd.DataFrame(
        {
            "id": ["<script>alert(1)</script>", "r&d", "b"],
            "power_w": [1234.5, None, 87.25],
            "ok": [True, False, True],
        }
    )
    body = ui.table_html(df, {"power_w": "power [W]"}, missing_why="no reading", max_rows=2)
    assert "<script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    parser = _Tables()
    parser.feed(body)
    (t,) = parser.tables
    t["rows"] = [r for r in t["rows"] if r]
    assert t["header"] == ["id", "power [W]", "ok"]
    assert t["rows"] == [["<script>alert(1)</script>", "1,234", "yes"], ["r&d", "–", "no"]]
    assert t["tips"] == ["no reading"] and t["header_tips"][1] == "– no reading"
    assert "1 more row not shown" in body


def test_charts_are_svg_with_utc_axes_units_limits_and_escaped_names() -> None:
    """A line chart over time: UTC labels, the value axis titled with its unit, the limit
    rule at its value, one line per name (names escaped), a gap where a value is missing."""
    from dashboards import charts as ch
    from dashboards import svgchart

    t = pd.to_datetime([f"2026-01-01T10:{m:02d}:00Z" for m in range(30)] * 2, utc=True)
    df = pd.DataFrame(
        {
            "t": t,
            "value": [float(v) for v in range(30)] + [None] + [40.0] * 29,
            "line": ["cdu-1 <supply>"] * 30 + ["cdu-1 return"] * 30,
        }
    )
    spec = ch.line_spec("temperature [°C]", df["t"], color="line", limit=45.0)
    assert svgchart.supported(spec)
    out = svgchart.svg(df.assign(t=ch.epoch_ms(df["t"])), spec, "k", 960)
    assert "<supply>" not in out and "cdu-1 &lt;supply&gt;" in out
    assert 'data-y-title="temperature [°C]"' in out and ">time [UTC]<" in out
    assert re.findall(r">(\d\d:\d\d)<", out)[:2] == ["10:00", "10:05"]
    assert 'class="limit" data-y="45.0"' in out
    assert 'data-points="30"' in out and 'data-points="29"' in out
    assert not svgchart.supported({"mark": {"type": "line"}, "encoding": {}})  # left to Vega


def test_floor_shows_every_rack_coloured_by_the_chosen_metric(env: Service) -> None:
    at = run(DASH / "pages" / "floor.py")
    # the floor opens on the worst headroom: each rack's largest share of a limit used
    assert at.selectbox(key="floor_metric").value == "limit_used_max_pct"
    svg = next(md.value for md in at.markdown if "dctwin-floor" in md.value)
    assert set(re.findall(r'data-rack="([^"]+)"', svg)) == {r.name for r in env.site.racks}
    assert 'href="/rack?rack=r01"' in svg  # each tile opens its rack
    assert "None" not in svg and "Worst limit used" in text(at)
    # colours are the fixed bands, never the spread of today's values
    assert set(re.findall(r'data-band="([^"]+)"', svg)) <= {"neutral", "amber", "red"}
    assert re.findall(r'data-band="([^"]+)"', svg)
    at.selectbox(key="floor_metric").set_value("gpu_headroom_min_k").run()
    assert not at.exception
    assert "GPU headroom to slowdown" in text(at)
    assert set(at.selectbox(key="floor_rack").options) == {"r01", "r02"}
    assert_no_plotly(at)


def test_time_axes_and_complete_buckets() -> None:
    """Time labels in UTC, with the date past a day; a sum's first and last buckets that fewer
    devices reached are left out (no false drop at the edges)."""
    from dashboards import charts as ch

    assert "'%H:%M'" in ch.time_axis(3600)["labelExpr"]
    assert "'%b %d %H:%M'" in ch.time_axis(3 * 86400)["labelExpr"]
    t = [f"2026-01-01T00:0{i}:00+00:00" for i in range(5)]
    df = ch.complete_buckets(t, [50.0, 100.0, 101.0, 99.0, 60.0], [2, 4, 4, 4, 3])
    assert list(df["value"]) == [100.0, 101.0, 99.0]
    assert str(df["t"].iloc[0]) == "2026-01-01 00:01:00+00:00"
    assert ch.epoch_ms(df["t"])[0] == 1767225660000.0


def test_floor_tiles_keep_their_labels_readable() -> None:
    """The name and value on a tile are black on light tiles and white on dark ones."""
    from dashboards import charts as ch

    assert ch.text_colour(ch.scale_colour("YlOrRd", 1.0)) == "#ffffff"  # dark red
    assert ch.text_colour(ch.scale_colour("YlOrRd", 0.0)) == "#000000"  # pale yellow
    assert (
        ch.scale_colour("RdYlGn", 0.0) == "#d73027" and ch.scale_colour("RdYlGn", 1.0) == "#1a9850"
    )


def test_rack(env: Service) -> None:
    at = run(DASH / "pages" / "rack.py", rack="r01")
    assert at.selectbox(key="rack_pick").value == "r01"
    m = metrics(at)
    assert m["IT power"].endswith("kW") and m["Pumps running"] == "1 / 2"
    assert m["Supply"].endswith("°C") and m["Flow"].endswith("L/min")
    drawn = charts(at)
    assert len(drawn) == 2  # GPU temperatures against their maximum, PDU phases
    assert [c["y_title"] for c in drawn] == ["temperature [°C]", "current [A]"]
    gpus, phases = drawn
    assert gpus["bars"] and len(gpus["marks"]) == len(gpus["bars"])  # each GPU's maximum
    assert all(
        mark > temp for (_, temp), (_, mark) in zip(gpus["bars"], gpus["marks"], strict=True)
    )
    assert phases["bars"] and phases["marks"]  # each phase's derated limit
    assert_no_plotly(at)
    at.selectbox(key="rack_pick").set_value("r02").run()
    assert not at.exception
    assert "Air-cooled" in text(at)


def test_power(env: Service) -> None:
    at = run(DASH / "pages" / "power.py")
    trend, phases = charts(at)
    assert trend["y_title"] == "IT power [kW]" and trend["x_title"] == "time [UTC]"
    assert all(re.fullmatch(r"\d\d:\d\d", label) for label in trend["x_labels"])
    assert next(iter(trend["series"].values())) > 1
    assert phases["y_title"] == "derated limit used [%]" and phases["limits"] == [100.0]
    used = [v for _, v in phases["bars"]]
    assert used and used == sorted(used, reverse=True)  # the most loaded first
    (table,) = tables(at)  # every phase and breaker, in the table below the bars
    assert {"current [A]", "limit [A]", "limit used [%]"} <= set(table["header"])
    # worst first by the margin in the limit's own unit (A), and a control to sort otherwise
    head = [float(v.replace(",", "")) for v in column(table, "headroom [A]") if v != "–"]
    assert head == sorted(head)
    assert at.selectbox(key="power_sort").value == "worst first"
    assert {x for x, _ in phases["bars"]} <= set(column(table, "id"))
    assert all(re.fullmatch(r"[\d,.]+", v) for v in column(table, "current [A]"))
    assert_no_plotly(at)


def test_cooling(env: Service) -> None:
    at = run(DASH / "pages" / "cooling.py")
    m = metrics(at)
    assert m["Pumps running"] == "1 / 2" and m["Capacity used"].endswith("%")
    (loop,) = charts(at)
    assert set(loop["series"]) == {"cdu-1 supply", "cdu-1 return"}
    assert loop["y_title"] == "temperature [°C]" and loop["x_title"] == "time [UTC]"
    assert_no_plotly(at)


def test_network(env: Service) -> None:
    at = run(DASH / "pages" / "network.py")
    assert metrics(at)["Links"] == "2" and charts(at)
    assert_no_plotly(at)


def test_fleets(env: Service) -> None:
    at = run(DASH / "pages" / "fleets.py")
    assert "Underused fleets" in metrics(at) and metrics(at)["Power freed"].endswith("kW")
    assert len(charts(at)) == 2  # activity and forecast
    assert_no_plotly(at)
    # the store holds 20 minutes: the page says so, not "over 24 h"
    assert re.search(r"fleets over 2\d min of data \(of a 24 h window\)", text(at)), text(at)
    # the forecast says what it is: model, skill, origins scored
    fc = next(t for t in tables(at) if "origins scored" in t["header"])
    assert column(fc, "model") and all(column(fc, "model")), fc
    assert column(fc, "why") and all("persistence" in w for w in column(fc, "why")), fc


def test_alerts_acknowledge_and_silence(env: Service) -> None:
    at = run(DASH / "pages" / "alerts.py")
    buttons = [b for b in at.button if b.label == "Acknowledge"]
    assert len(buttons) == 1 and "cdu_pump_lost" in buttons[0].key
    buttons[0].click().run()
    assert not at.exception and not at.error
    assert f"Acknowledged {PUMP_KEY}" in text(at)
    assert "Acknowledged by console" in text(at)
    assert not [b for b in at.button if b.label == "Acknowledge"]
    at.text_input[0].set_value("gpu_temp_high")
    at.button[-1].click().run()  # the form's submit
    assert "Silenced {'rule': 'gpu_temp_high'}" in text(at)
    assert any(b.label == "End" for b in at.button)
    # the silence beside the group: the rule on the group's own id
    silence = next(b for b in at.button if b.key.startswith("silence_cdu_pump_lost"))
    assert silence.label == "Silence 2 h"
    silence.click().run()
    assert "Silenced cdu_pump_lost on cdu-1 for 2 h" in text(at)
    sil = httpx.get(f"{env.url}/api/v1/silences", timeout=10).json()["silences"]
    assert {"rule": "cdu_pump_lost", "group_id": "cdu-1"} in [x["matchers"] for x in sil]


def test_alerts_without_a_token_say_so(env: Service, monkeypatch) -> None:
    monkeypatch.delenv("DCTWIN_CONSOLE_TOKEN")
    monkeypatch.setenv("DCTWIN_API_TOKEN", TOKEN)  # the service's token is never the console's
    at = run(DASH / "pages" / "alerts.py")
    # no write offered that the API would refuse; the way to enable them said instead
    assert "dctwin demo --console-writes" in text(at)
    assert not [b for b in at.button if b.label in ("Acknowledge", "End", "Add silence")]
    assert not [b for b in at.button if b.label.startswith("Silence")]
    assert "cdu_pump_lost" in text(at)  # still listed


def test_calibration(env: Service) -> None:
    at = run(DASH / "pages" / "calibration.py")
    assert "run 1 of 1" in text(at)
    assert charts(at)
    quality, params, *_ = tables(at)
    assert {"class", "quantity", "MAE", "CV(RMSE) [%]", "NMBE [%]"} <= set(quality["header"])
    assert all(
        re.fullmatch(r"-?[\d,.]+( (W|°C|K|%|L/min|kW))?|–", v) for v in column(quality, "MAE")
    ), column(quality, "MAE")
    assert "class" in params["header"] and params["rows"]
    assert_no_plotly(at)


def test_whatif_offers_the_bundles_and_scenarios(env: Service) -> None:
    at = run(DASH / "pages" / "whatif.py")
    assert "No what-if jobs yet" in text(at)
    assert "demo_bundle" in at.selectbox[0].options
    assert "facility-water-plus-3c" in at.multiselect[0].options


@pytest.mark.slow  # a what-if job on the demo bundle: out of the fast tier
def test_whatif_shows_the_reports_figures(env: Service) -> None:
    """After the test above (it wants no job yet): a job's page draws the report's own figures,
    one per quantity, each scenario in the colour the report gives it."""
    import httpx

    body = {"bundle": "demo_bundle", "scenarios": ["gpu-power-cap-500w", "cdu-1-fails"]}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    job = httpx.post(f"{env.url}/api/v1/whatif", json=body, headers=auth, timeout=10).json()
    deadline = time.monotonic() + 180
    while (state := httpx.get(f"{env.url}/api/v1/whatif/{job['job']}", timeout=10).json())[
        "state"
    ] not in ("done", "failed"):
        assert time.monotonic() < deadline, state["state"]
        time.sleep(0.5)
    assert state["state"] == "done", state["error"]
    served = httpx.get(f"{env.url}/api/v1/whatif/{job['job']}/figures", timeout=10).json()
    at = run(DASH / "pages" / "whatif.py")
    drawn = vega(at)  # the report's figures stay Vega-Lite: any plotly line figure
    assert_no_plotly(at)
    assert len(drawn) == len(served) >= 5
    for (spec, df), fig in zip(drawn, served, strict=True):
        assert spec["title"] == fig["title"]
        scale = spec["encoding"]["color"]["scale"]
        dash = dict(
            zip(
                spec["encoding"]["strokeDash"]["scale"]["domain"],
                spec["encoding"]["strokeDash"]["scale"]["range"],
                strict=True,
            )
        )
        drawn_colours = dict(zip(scale["domain"], scale["range"], strict=True))
        sent = {t["name"]: t["line"]["color"] for t in fig["figure"]["data"]}
        assert drawn_colours == sent and set(df["name"]) <= set(sent)
        assert dash["baseline"] == [8, 4]  # the baseline dashed
        assert drawn_colours["gpu-power-cap-500w"] != drawn_colours["cdu-1-fails"]
    for name in body["scenarios"]:  # one colour per scenario across every figure
        seen = {
            dict(
                zip(
                    sp["encoding"]["color"]["scale"]["domain"],
                    sp["encoding"]["color"]["scale"]["range"],
                    strict=True,
                )
            )[name]
            for sp, _ in drawn
        }
        assert len(seen) == 1, (name, seen)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_page_whose_api_is_down_shows_an_error_box(
    page: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DCTWIN_API_URL", "http://127.0.0.1:9")
    at = AppTest.from_file(str(page), default_timeout=60)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.error and "http://127.0.0.1:9" in at.error[0].value
    assert "cannot reach the API" in at.error[0].value


def test_the_console_talks_only_to_the_api() -> None:
    """dashboards/ imports neither the store nor DuckDB nor the twin: it reads the HTTP API.
    The one exception is ``twin.bands`` (pure Python, pydantic only): the one definition of
    the limit-used bands that the console, the floor map and the CLI colour by."""
    import ast

    for path in DASH.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if name == "twin.bands":
                    continue
                assert top not in {"duckdb", "twin", "collectors", "models"}, (path, name)


@pytest.mark.slow  # four page runs: out of the fast tier
def test_deep_links_between_cooling_rack_and_alerts(env: Service) -> None:
    """?cdu=cdu-1 opens that CDU with links to its racks; a rack links to its CDU; an alert
    links to its CDU and its racks (page links in the app, markdown links run on their own)."""
    at = run(DASH / "pages" / "cooling.py", cdu="cdu-1")
    assert [h.value.split(" ")[0] for h in at.subheader] == ["cdu-1"]
    assert "(/rack?rack=r01)" in text(at)
    at = run(DASH / "pages" / "cooling.py", errors=1, cdu="cdu-9")
    [err] = [e.value for e in at.error]  # an error, never a quiet warning
    assert "No CDU 'cdu-9' in the site" in err and "cdu-1" in err
    at = run(DASH / "pages" / "rack.py", rack="r01")
    assert "(/cooling?cdu=cdu-1)" in text(at) and "(/alerts)" in text(at)
    at = run(DASH / "pages" / "alerts.py")
    assert "(/cooling?cdu=cdu-1)" in text(at) and "(/rack?rack=r01)" in text(at)


def test_a_page_says_how_old_its_data_is_and_turns_amber_when_stale(
    env: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = run(DASH / "pages" / "cooling.py")
    # the markdown source escapes the clock's colons (shown as 02:13:45): "02:13:45" unescaped
    # would make the browser fetch Streamlit's emoji table for ":13:"
    assert re.search(r"data until \d{4}-\d\d-\d\d \d\d\\:\d\d\\:\d\d UTC · ", text(at))
    monkeypatch.setenv("DCTWIN_CONSOLE_STALE_S", "0.001")  # everything is older than that
    at = run(DASH / "pages" / "cooling.py")
    assert ":orange[" in text(at) and "stale, older than 0.001 s" in text(at)


def test_rack_limits_and_headroom_are_the_apis_and_an_unknown_rack_is_an_error(
    env: Service,
) -> None:
    at = run(DASH / "pages" / "rack.py", rack="r01")
    rows = httpx.get(f"{env.url}/api/v1/headroom", params={"rack": "r01"}, timeout=10).json()
    limits = {r["id"]: r["limit"] for r in rows["rows"] if r["kind"] == "gpu"}
    gpus = charts(at)[0]
    assert gpus["marks"] and {x: v for x, v in gpus["marks"]} == {
        x: pytest.approx(limits[x]) for x, _ in gpus["marks"]
    }
    tight = min((r for r in rows["rows"] if r["kind"] == "gpu"), key=lambda r: r["headroom_now"])
    assert f"{tight['headroom_now']:.1f} K to slowdown" in text(at)
    # GPUs worst first by their headroom in K
    gpu_table = next(t for t in tables(at) if "headroom [K]" in t["header"])
    head = [float(v) for v in column(gpu_table, "headroom [K]") if v != "–"]
    assert head == sorted(head)
    bad = AppTest.from_file(str(DASH / "pages" / "rack.py"), default_timeout=60)
    bad.query_params["rack"] = "zz99"
    bad.run()
    assert not bad.exception
    assert bad.error and "No rack 'zz99' in the site" in bad.error[0].value
    assert "IT power" not in metrics(bad)  # no other rack shown in its place


def test_fleets_headline_is_its_tables_sum(env: Service) -> None:
    at = run(DASH / "pages" / "fleets.py")
    (table,) = [t for t in tables(at) if "gpus_to_reclaim" in t["header"]]
    total = sum(int(v.replace(",", "")) for v in column(table, "gpus_to_reclaim") if v != "–")
    assert metrics(at)["GPUs to reclaim"] == f"{total:,}"


def test_alerts_group_per_rule_and_scope_worst_first() -> None:
    """Ten GPU alerts in two racks, a critical CDU alert and a forecast: three rules, four
    groups; critical first, then the soonest breach, then the smallest margin."""
    from dashboards import triage

    def gpu(i: int, rack: str, k: float) -> dict:
        return {
            "dedup_key": f"d/gpu_temp_high/gpu/{rack}-n1:{i}",
            "rule": "gpu_temp_high",
            "severity": "warning",
            "group_kind": "gpu",
            "group_id": f"{rack}-n1:{i}",
            "members": [f"{rack}-n1:{i}"],
            "racks": [rack],
            "starts_at": "2026-12-03T10:00:00+00:00",
            "values": {f"{rack}-n1:{i}": k},
            "metric": "headroom.gpu.k_to_slowdown",
            "op": "<=",
            "threshold": 5.0,
        }

    alerts = [gpu(i, "a03", 4.0 - i / 10) for i in range(6)]
    alerts += [gpu(i, "b01", 1.5) for i in range(4)]
    alerts.append(
        {
            "dedup_key": "d/cdu_pump_lost/cdu/cdu-1",
            "rule": "cdu_pump_lost",
            "severity": "critical",
            "group_kind": "cdu",
            "group_id": "cdu-1",
            "members": ["cdu-1"],
            "racks": ["a01", "a02"],
            "starts_at": "2026-12-03T11:00:00+00:00",
            "values": {"cdu-1": 1.0},
            "metric": "cdu.pumps_running",
            "op": "<",
            "threshold": 2.0,
        }
    )
    alerts.append(
        {
            "dedup_key": "d/gpu_slowdown_forecast/gpu/c01-n1:0",
            "rule": "gpu_slowdown_forecast",
            "severity": "warning",
            "group_kind": "gpu",
            "group_id": "c01-n1:0",
            "members": ["c01-n1:0"],
            "racks": ["c01"],
            "starts_at": "2026-12-03T11:30:00+00:00",
            "values": {"c01-n1:0": 1800.0},
            "metric": "headroom.gpu.time_to_breach_p90_s",
            "op": "<=",
        }
    )
    now = datetime(2026, 12, 3, 12, tzinfo=UTC)
    groups = triage.group_alerts(alerts, now)
    got = [(g.rule, g.scope_kind, g.scope_id, len(g.members)) for g in groups]
    assert got == [
        ("cdu_pump_lost", "CDU", "cdu-1", 1),
        ("gpu_temp_high", "rack", "b01", 4),  # breached now, 1.5 K left
        ("gpu_temp_high", "rack", "a03", 6),  # breached now, 3.5 K left
        ("gpu_slowdown_forecast", "rack", "c01", 1),  # 30 min to the breach
    ]
    assert groups[2].worst == ("a03-n1:5", 3.5) and groups[2].unit == "K"
    assert groups[2].firing_s(now) == 7200
    assert triage.severity_counts(alerts) == {"critical": 1, "warning": 11, "info": 0}
    assert triage.worst_severity(alerts) == "critical"
    # the same alerts as one incident per rack with members (the engine's grouping) group
    # the same way
    merged = dict(alerts[0], members=[f"a03-n1:{i}" for i in range(6)], group_kind="rack")
    merged["group_id"] = "a03"
    merged["values"] = {f"a03-n1:{i}": 4.0 - i / 10 for i in range(6)}
    (g,) = triage.group_alerts([merged], now)
    assert (g.scope_kind, g.scope_id, len(g.members), g.worst) == (
        "rack",
        "a03",
        6,
        ("a03-n1:5", 3.5),
    )
    only = triage.filter_groups(groups, severities=["warning"], scopes=["rack a03"])
    assert [x.scope_id for x in only] == ["a03"]
