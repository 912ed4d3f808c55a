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
    PALETTE,
    SERIES,
    TIME_TITLE,
    VERDICT_COLOUR,
    Costs,
    figures,
    figures_json,
    html_report,
    markdown,
    run_colours,
    write_report,
)
from twin.replay.result import ComponentChange, ComponentResult, KindSummary, RunResult
from twin.replay.verdict import Tolerance, compare, verdict

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
        assert fig.data[-1].name in ("baseline", "baseline: limit", "limit (100 %)"), key
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
    for key in ("cdu_util_max", "phase_util_max"):  # ratios drawn in percent, against 100 %
        lim = traces_of(figs[key])["limit (100 %)"]
        assert lim.line.dash == "dot" and list(lim.y) == [100.0, 100.0]
        assert (lim.x[0], lim.x[-1]) == (0.0, base.series["t_h"][-1])
        got = traces_of(figs[key])["baseline"].y
        assert got[0] == pytest.approx(100 * base.series[key][0])
    heat = traces_of(figs["liquid_heat_kw"])
    colours = dict(zip([r.name for r in scen], run_colours(scen), strict=True))
    for r in scen:  # each run's own capacity, dotted in its colour
        cap = heat[f"{r.name}: limit"]
        assert cap.line.dash == "dot" and cap.line.color == colours[r.name]
        assert list(cap.y) == r.series["cdu_capacity_kw"]
    assert "limit (100 %)" not in traces_of(figs["it_power_kw"])


def test_figures_json_round_trips_through_plotly(runs) -> None:
    import plotly.graph_objects as go

    base, scen = runs
    out = figures_json(base, scen)
    assert [f["key"] for f in out] == [k for k, _ in figures(base, scen)]
    back = go.Figure(out[0]["figure"])
    assert traces_of(back)["cdu-1-fails"].line.color == run_colours(scen)[2]


def test_figures_json_without_plotly_objects_is_plotlys_own_json(runs) -> None:
    """The report writes its figures' JSON without building plotly objects: it is exactly what
    plotly's ``to_json`` of :func:`figures` reads back as, template, nulls for NaN and all."""
    import json
    import math

    base, scen = runs
    scen = [r.model_copy(deep=True) for r in scen]
    y = scen[0].series["it_power_kw"]
    y[1], y[2] = math.nan, math.inf  # a gap in a path: null in plotly's JSON
    for start in (None, T0):
        fast = figures_json(base, scen, start=start)
        slow = figures_json(base, scen, figures(base, scen, start), start)
        assert fast == slow
        trace = fast[0]["figure"]["data"][0]
        assert trace["y"][1] is None and trace["y"][2] is None
        assert fast[0]["figure"]["layout"]["template"]["layout"]
        assert json.loads(json.dumps(fast)) == fast  # strict JSON: no NaN left


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
    for name in ("fits", "fits with risks", "does not fit", "baseline"):
        assert any(VERDICT_COLOUR[name] in b for b in badges), name
    # plotly.js once, inline; every figure drawn from it, each scenario's in its own section
    # (the baseline against that scenario); nothing fetched from the network
    per = len(figures(base, scen[:1]))
    assert html.count("Plotly.newPlot(") == per * len(scen)
    for i in range(len(scen)):
        sec = html[html.index(f'id="scenario-{i + 1}"') :]
        sec = sec[: sec.index("</section>")]
        assert sec.count("Plotly.newPlot(") == per
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


def summary_table(md: str) -> tuple[list[str], dict[str, list[str]]]:
    """report.md's summary table: its header cells and its rows by scenario."""
    lines = md[md.index("## Summary") :].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    table = lines[start : next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))]
    head = [c.strip() for c in table[0].strip("|").split(" | ")]
    rows = {}
    for ln in table[2:]:
        cells = [c.strip() for c in ln.strip("|").split(" | ")]
        rows[cells[0]] = cells
    return head, rows


def test_time_over_component_minutes_and_undelivered_energy(bundle, runs) -> None:
    base, scen = runs
    throttled = scen[2].model_copy(update={"throttled_gpu_s": 3600.0 * 511})
    delivered = scen[1].model_copy(
        update={"throttled_gpu_s": 7200.0, "undelivered_energy_kwh": 12.5, "duration_s": 86400.0}
    )
    md = markdown(bundle, base, [scen[0], delivered, throttled])
    head, rows = summary_table(md)
    col = head.index("energy not delivered (kWh)")
    assert rows["baseline"][col] == "—"  # the recording's work is what it was
    assert rows["water-plus-3c"][col] == "12.5"
    assert rows["cap-500w"][col] == "0.0"  # nothing throttled: nothing lost
    assert rows["cdu-1-fails"][head.index("throttled GPU-hours")] == "511.0"
    # longest over one component (6140 s x 1.2 = 2 h 03 min) and component-minutes (2 x that)
    kinds = md[md.index("## cdu-1-fails") :]
    line = next(ln for ln in kinds.splitlines() if ln.startswith("| PDU phase"))
    assert "| 2 h 03 min | 246 |" in line


class Tables(HTMLParser):
    """report.html's tables, each with the h2 and h3 above it, its header and its rows."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict] = []
        self._h: dict[str, str] = {"h2": "", "h3": ""}
        self._in: str | None = None
        self._text = ""
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("h2", "h3"):
            self._in, self._text = tag, ""
            if tag == "h2":
                self._h["h3"] = ""
        elif tag == "table":
            self.tables.append({**self._h, "head": [], "rows": []})
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._in, self._text = tag, ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "h3") and self._in == tag:
            self._h[tag] = " ".join(self._text.split())
            self._in = None
        elif tag in ("td", "th") and self._row is not None:
            self._row.append(" ".join(self._text.split()))
            self._in = None
        elif tag == "tr" and self._row is not None:
            t = self.tables[-1]
            if t["head"]:
                t["rows"].append(self._row)
            else:
                t["head"] = self._row
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self._text += data


def html_tables(html: str) -> list[dict]:
    p = Tables()
    p.feed(html)
    p.close()
    return p.tables


#: Per table: the column naming the component, and the column holding its baseline headroom.
BASELINE_COLUMNS = (
    ("worst component", "its min headroom, baseline"),
    ("component", "min headroom, baseline"),
)


def baseline_values(html: str) -> dict[tuple[str, str], set[str]]:
    """Every (limit, component) -> the baseline headroom each table of report.html gives it:
    the scenario tables' baseline columns, the baseline section's tables and the recorded
    breaches' tables (those are the recording's own figures)."""
    seen: dict[tuple[str, str], set[str]] = {}
    for t in html_tables(html):
        head = t["head"]
        recording = t["h2"].startswith("The recording") or t["h3"].startswith("Already breaching")
        for comp_col, base_col in (
            *BASELINE_COLUMNS,
            *(
                (("worst component", "min headroom"), ("component", "min headroom"))
                if recording
                else ()
            ),
        ):
            if comp_col in head and base_col in head and "limit" in head:
                for row in t["rows"]:
                    key = (row[head.index("limit")], row[head.index(comp_col)])
                    seen.setdefault(key, set()).add(row[head.index(base_col)])
    return seen


def test_every_table_gives_a_component_the_same_baseline_value(bundle, runs) -> None:
    """The bug of issue 30: a scenario's worst CDU (cdu-2) was shown against the baseline's
    worst (cdu-3's 12.1 kW) in one table and against its own 29.9 kW in the next."""
    base, scen = runs
    base = base.model_copy(
        update={
            "kinds": [
                KindSummary(
                    kind="cdu_heat",
                    unit="kW",
                    components=4,
                    worst_id="cdu-3",
                    worst_min_headroom=12.1,
                    breaching=0,
                    time_over_s=0,
                    component_over_s=0,
                    first_breach=None,
                )
            ]
        }
    )
    worst = KindSummary(
        kind="cdu_heat",
        unit="kW",
        components=4,
        worst_id="cdu-2",
        worst_min_headroom=-100.8,
        worst_baseline_min_headroom=29.9,
        breaching=1,
        time_over_s=7200,
        component_over_s=7200,
        first_breach=T0,
    )
    change = ComponentChange(
        kind="cdu_heat",
        id="cdu-2",
        unit="kW",
        limit=221.2,
        baseline_min_headroom=29.9,
        min_headroom=-100.8,
        delta=-130.7,
        baseline_time_over_s=0.0,
        time_over_s=7200.0,
        change="new breach",
    )
    s = scen[2].model_copy(update={"kinds": [worst], "changes": [change]})
    # without the summary's own figure the report still finds cdu-2's (in the changes)
    old = s.model_copy(
        update={"kinds": [worst.model_copy(update={"worst_baseline_min_headroom": None})]}
    )
    for run in (s, old):
        seen = baseline_values(html_report(bundle, base, [run]))
        cdu2 = seen[("CDU heat against capacity", "cdu-2")]
        assert cdu2 == {"29.9 kW"}, cdu2
        assert seen[("CDU heat against capacity", "cdu-3")] == {"12.1 kW"}
        assert all(len(v) == 1 for v in seen.values()), seen


def component(kind: str, cid: str, unit: str, limit: float, head: float, over_s: float = 0.0):
    return ComponentResult(
        kind=kind,  # type: ignore[arg-type]
        id=cid,
        unit=unit,
        limit=limit,
        peak=limit - head,
        min_headroom=head,
        time_over_s=over_s,
        first_breach=T0 if over_s else None,
    )


def test_a_10_s_breach_fits_with_risks_naming_its_length() -> None:
    base = [component("cdu_heat", "cdu-2", "kW", 220.0, 29.9)]
    short = [component("cdu_heat", "cdu-2", "kW", 220.0, -4.2, over_s=10.0)]
    long = [component("cdu_heat", "cdu-2", "kW", 220.0, -4.2, over_s=600.0)]
    changes = compare(base, short, Tolerance(), 10.0)
    assert [c.change for c in changes] == ["short breach"]
    got, reasons = verdict(changes)
    assert got == "fits with risks"
    assert (
        "10 s over the limit" in reasons[0] and "shorter than the duration tolerance" in reasons[0]
    )
    assert verdict(compare(base, long, Tolerance(), 10.0))[0] == "does not fit"
    # the tolerance is the planner's: with --min-breach 5s the 10 s breach does not fit
    assert verdict(compare(base, short, Tolerance(min_breach_s=5), 10.0))[0] == "does not fit"


def test_temperatures_differ_in_kelvin_and_never_minus_zero(bundle, runs) -> None:
    base, scen = runs
    gpu = KindSummary(
        kind="gpu",
        unit="°C",
        components=8,
        worst_id="g1",
        worst_min_headroom=-0.01,
        worst_baseline_min_headroom=0.02,
        breaching=0,
        time_over_s=0,
        component_over_s=0,
        first_breach=None,
    )
    rec = component("gpu", "g1", "°C", 87.0, 0.0, over_s=60.0)
    s = scen[0].model_copy(update={"kinds": [gpu]})
    md = markdown(bundle, base.model_copy(update={"recorded_breaches": [rec]}), [s])
    assert "-0.0" not in md and "+-" not in md
    line = next(ln for ln in md[md.index("## cap-500w") :].splitlines() if ln.startswith("| GPU"))
    assert "| 0.0 K | 0.0 K | 0.0 K |" in line  # headroom and difference in K
    assert "| 87.0 °C | 87.0 °C | 0.0 K |" in md  # the limit and the peak in °C


def test_money_appears_with_a_tariff_and_pue(bundle, runs) -> None:
    base, scen = runs
    plain = markdown(bundle, base, scen)
    assert "cost" not in summary_table(plain)[0][-1] and "EUR" not in plain
    costs = Costs(tariff_per_kwh=0.2, pue=1.25, currency="EUR")
    md = markdown(bundle, base, scen, costs)
    head, rows = summary_table(md)
    cost = head.index("energy cost (EUR)")
    # baseline: 17,050 kWh x 1.25 x 0.2 = 4,262.5 -> "4,262" (banker's rounding of 4262.5)
    assert rows["baseline"][cost] == f"{17050 * 1.25 * 0.2:,.0f}"
    assert rows["cdu-1-fails"][cost] == f"{17050 * 1.2 * 1.25 * 0.2:,.0f}"
    change = f"+{17050 * 0.2 * 1.25 * 0.2:,.0f} (+20.0 %)"
    assert rows["cdu-1-fails"][head.index("cost change (EUR)")] == change
    assert rows["baseline"][head.index("facility energy (kWh)")] == f"{17050 * 1.25:,.0f}"
    assert "0.2 EUR per kWh of facility energy" in md
    html = html_report(bundle, base, scen, costs=costs)
    assert "energy cost (EUR)" in html and "Energy cost" in html


def test_the_summary_gives_each_verdict_a_reason_and_an_executive_summary(bundle, runs) -> None:
    base, scen = runs
    change = ComponentChange(
        kind="cdu_heat",
        id="cdu-2",
        unit="kW",
        limit=221.2,
        baseline_min_headroom=29.9,
        min_headroom=-4.2,
        delta=-34.1,
        baseline_time_over_s=0.0,
        time_over_s=10.0,
        change="short breach",
    )
    risky = scen[1].model_copy(update={"changes": [change]})
    md = markdown(bundle, base, [scen[0], risky, scen[2]])
    head, rows = summary_table(md)
    why = head.index("why")
    assert head.index("verdict") + 1 == why
    assert rows["water-plus-3c"][why] == (
        "cdu_heat cdu-2 over its limit for only 10 s (shorter than the duration tolerance)"
    )
    assert rows["cap-500w"][why].startswith("no component loses more headroom")
    assert all(rows[r][why] for r in rows)
    summary = md[md.index("## Executive summary") : md.index("## Summary")]
    assert "3 scenarios replayed over" in summary
    assert "1 fits, 1 fits with risks, 1 does not fit" in summary
    assert "water-plus-3c fits with risks: cdu_heat cdu-2 over its limit for only 10 s" in summary


def test_figures_are_on_clock_time_with_human_titles_and_colour_blind_safe_colours(runs) -> None:
    base, scen = runs
    figs = dict(figures(base, scen, start=T0))
    it = figs["it_power_kw"]
    assert it.layout.xaxis.title.text == TIME_TITLE and it.layout.xaxis.type == "date"
    assert traces_of(it)["baseline"].x[0] == "2026-11-23 00:00:00"
    assert it.layout.title.text == "IT power, all racks [kW]"
    assert it.layout.yaxis.title.text == "power [kW]"
    for key, fig in figs.items():
        assert "[" in fig.layout.title.text and "]" in fig.layout.yaxis.title.text, key
        assert "ratio" not in fig.layout.title.text, key
    # Okabe-Ito then Paul Tol's muted: no red-green pair of pure hues, no Plotly defaults
    assert PALETTE[:3] == ("#0072B2", "#D55E00", "#009E73")
    assert len(set(PALETTE)) == len(PALETTE) >= 12


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
    per = len(figures(base, scen[:1]))
    n_figs = per * len(scen)
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
        own = scen[i // per].name  # each section draws the baseline against its scenario
        assert_legend_true(plots.nth(i).evaluate(LEGEND_JS), {own: colours[own]}, i)
    for i in range(len(scen)):
        assert page.locator(f"#scenario-{i + 1} .js-plotly-plot").count() == per
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


@pytest.mark.slow
def test_dctwin_whatif_on_the_demo_bundle_agrees_with_itself_and_prices_energy(
    tmp_path: Path,
) -> None:
    """The real run of issue 30: cdu-1 failing moves its racks to cdu-2, whose baseline
    headroom (29.9 kW) must be the one every table shows, never cdu-3's (12.1 kW); cdu-2 losing
    a pump is over its capacity for 10 s only, which fits with risks; a tariff prices it."""
    out = tmp_path / "report"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "twin.cli",
            "whatif",
            str(BUNDLE),
            str(SCENARIOS / "cdu-1-fails.yaml"),
            str(SCENARIOS / "cdu-2-loses-a-pump.yaml"),
            "--out",
            str(out),
            "--tariff-per-kwh",
            "0.15",
            "--pue",
            "1.2",
            "--currency",
            "EUR",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    html = (out / "report.html").read_text(encoding="utf-8")
    seen = baseline_values(html)
    assert ("CDU heat against capacity", "cdu-2") in seen
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}
    tables = html_tables(html)
    summary = next(t for t in tables if "verdict" in t["head"])
    rows = {r[0]: r for r in summary["rows"]}
    head = summary["head"]
    assert rows["cdu-2-loses-a-pump"][head.index("verdict")] == "fits with risks"
    why = rows["cdu-2-loses-a-pump"][head.index("why")]
    assert "cdu-2" in why and "10 s" in why, why
    assert rows["cdu-1-fails"][head.index("verdict")] == "does not fit"
    cost = rows["baseline"][head.index("energy cost (EUR)")]
    assert float(cost.replace(",", "")) > 0
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "-0.0" not in md and "## Executive summary" in md
