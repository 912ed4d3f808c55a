"""The what-if report: baseline and scenarios side by side.

- ``report.md``: the text summary (Markdown).
- ``report.html``: one self-contained page rendered from ``templates/report.html.j2``: tables,
  a verdict badge per scenario, and one figure per site-level quantity, plotly.js embedded
  once so that the file opens offline.
- ``figures.json``: the same figures as plotly JSON, which the API serves to the console.

Both documents are rendered from one view (:func:`report_view`), so they say the same things:
a short executive summary, one line of reason beside each verdict, then one section per scenario
with its tables and its own figures (the baseline against that scenario, on clock-time axes).
Every table compares one component with itself: a kind's worst component in a scenario is shown
against that same component's baseline headroom. Headroom and differences of temperatures are
in kelvin, absolute temperatures in °C. With a tariff (and a PUE) each scenario's energy is
priced. Every scenario keeps one colour in every figure (:func:`run_colours`, colour-blind-safe);
the baseline is dashed in a neutral grey and limits are dotted.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from jinja2 import Environment, PackageLoader, StrictUndefined
from plotly.offline import get_plotlyjs
from pydantic import BaseModel, Field

from twin.replay.bundle import Bundle
from twin.replay.result import ComponentChange, ComponentResult, KindSummary, RunResult
from twin.replay.verdict import headline, headroom_unit, num

KIND_LABEL = {
    "gpu": "GPU temperature",
    "pdu_phase": "PDU phase / breaker current",
    "rack": "rack power (its feeds together)",
    "cdu_heat": "CDU heat against capacity",
    "cdu_flow": "CDU flow needed against flow",
    "loop": "loop return temperature",
    "link": "link traffic",
}

#: Badge colour per verdict (background), from the Okabe-Ito colour-blind-safe palette (Okabe &
#: Ito, "Color Universal Design", 2008; bluish green, orange, vermillion, darkened for contrast
#: with the text); the verdict is written on the badge too, so colour is never the only cue.
VERDICT_COLOUR = {
    "fits": "#00785a",
    "fits with risks": "#e69f00",
    "does not fit": "#b84a00",
    "baseline": "#5f6368",
}
#: The badge's text colour per verdict (black on the light orange, else white).
VERDICT_TEXT = {"fits with risks": "#000000"}
#: The baseline in every figure: dashed, neutral.
BASELINE_COLOUR = "#5f6368"
#: Constant limits (a ratio of 1.0, ...): dotted, near black.
LIMIT_COLOUR = "#202124"
#: The plotly layout template of every figure.
FIGURE_TEMPLATE = "plotly_white"
#: One colour per scenario, by its position in the run, every one colour-blind-safe: the
#: Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008) without its black,
#: grey-like and yellow entries, then Paul Tol's "muted" scheme (personal.sron.nl/~pault/,
#: 2021) without its grey, for a seventh scenario and beyond.
PALETTE = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#332288",
    "#88CCEE",
    "#44AA99",
    "#117733",
    "#999933",
    "#DDCC77",
    "#CC6677",
    "#882255",
    "#AA4499",
)


@dataclass(frozen=True)
class SeriesSpec:
    """How one key of :attr:`RunResult.series` is drawn."""

    label: str
    unit: str
    #: the value axis's title, without its unit ("power", "temperature")
    axis: str = ""
    #: a constant limit drawn as one dotted line, in the drawn unit (None: no constant limit)
    limit: float | None = None
    #: another series key holding this quantity's limit per run (dotted, in the run's colour)
    limit_key: str | None = None
    #: said after the title
    note: str = ""
    #: the stored values times this are drawn (a ratio drawn in percent: 100)
    scale: float = 1.0

    def title(self) -> str:
        t = f"{self.label} [{self.unit}]" if self.unit else self.label
        return f"{t}; {self.note}" if self.note else t

    def axis_title(self) -> str:
        what = self.axis or self.label
        return f"{what} [{self.unit}]" if self.unit else what


#: The site-level paths the report knows, in the order they are shown. A key a run does not
#: hold is skipped; a key the run holds and this table does not know is drawn after these,
#: labelled by its name (a ``*_util_max`` key in percent of its limit, against 100 %).
SERIES: dict[str, SeriesSpec] = {
    "it_power_kw": SeriesSpec("IT power, all racks", "kW", "power"),
    "liquid_heat_kw": SeriesSpec(
        "Heat to liquid, all CDUs",
        "kW",
        "heat",
        limit_key="cdu_capacity_kw",
        note="dotted: their capacity",
    ),
    "air_heat_kw": SeriesSpec("Heat to the room's air, all racks", "kW", "heat"),
    "gpu_temp_max_c": SeriesSpec("Hottest GPU", "°C", "temperature"),
    "cdu_util_max": SeriesSpec(
        "Most loaded CDU: heat as a share of its capacity",
        "%",
        "share of capacity",
        limit=100.0,
        scale=100.0,
    ),
    "phase_util_max": SeriesSpec(
        "Most loaded PDU phase: current as a share of its derated limit",
        "%",
        "share of the derated limit",
        limit=100.0,
        scale=100.0,
    ),
    "loop_return_max_c": SeriesSpec("Warmest loop return", "°C", "temperature"),
    "link_util_max": SeriesSpec(
        "Busiest link: traffic as a share of its capacity",
        "%",
        "share of capacity",
        limit=100.0,
        scale=100.0,
    ),
    "gpus_throttled": SeriesSpec("GPUs held at their max operating temperature", "GPUs", "GPUs"),
}
#: Unit of a key the table does not know, from its name's suffix.
_SUFFIX_UNIT = {"_kw": "kW", "_w": "W", "_c": "°C", "_k": "K", "_a": "A", "_kwh": "kWh"}
#: The x axis's title when the figures are on clock time.
TIME_TITLE = "time [UTC]"


def run_colours(runs: list[RunResult]) -> list[str]:
    """The colour of each scenario, by its position (the same in every figure)."""
    return [PALETTE[i % len(PALETTE)] for i in range(len(runs))]


def _spec(key: str) -> SeriesSpec:
    if key in SERIES:
        return SERIES[key]
    if key.endswith("_util_max"):
        what = key.removesuffix("_util_max").replace("_", " ")
        return SeriesSpec(
            f"Most loaded {what}: share of its limit", "%", "share of the limit", 100.0, scale=100.0
        )
    unit = next((u for s, u in _SUFFIX_UNIT.items() if key.endswith(s)), "")
    return SeriesSpec(key.replace("_", " ").capitalize(), unit)


def series_keys(baseline: RunResult, runs: list[RunResult]) -> list[str]:
    """The keys drawn: the known ones a run holds, in table order, then unknown ones sorted."""
    held: set[str] = set()
    for r in [baseline, *runs]:
        held.update(k for k, v in r.series.items() if v)
    limit_keys = {s.limit_key for s in SERIES.values() if s.limit_key}
    known = [k for k in SERIES if k in held]
    extra = sorted(held - set(SERIES) - limit_keys - {"t_h"})
    return known + extra


def _x(t_h: list[float], start: datetime | None) -> list[Any]:
    """The time axis: clock times (ISO, UTC) from ``start``, else hours into the recording."""
    if start is None:
        return t_h
    return [(start + timedelta(hours=h)).strftime("%Y-%m-%d %H:%M:%S") for h in t_h]


def _figure_dicts(
    baseline: RunResult,
    runs: list[RunResult],
    start: datetime | None = None,
    colours: list[str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """:func:`figures` as plain dicts in plotly's figure schema (``{"data", "layout"}``, the
    layout's template by name), built without plotly's validation."""
    colours = colours or run_colours(runs)
    # the baseline is drawn last, over the scenarios (a scenario that leaves a path as recorded
    # would hide it), and listed first in the legend (legendrank)
    styled = [(r, colours[i], "solid", 1000 + 10 * i) for i, r in enumerate(runs)]
    styled.append((baseline, BASELINE_COLOUR, "dash", 1))
    at = "%{x|%H:%M} UTC" if start is not None else "%{x:.2f} h"
    xs: dict[int, list[Any]] = {}  # each run's time axis, formatted once

    def x_of(r: RunResult, t: list[float]) -> list[Any]:
        if id(r) not in xs:
            xs[id(r)] = _x(t, start)
        return xs[id(r)]

    out: list[tuple[str, dict[str, Any]]] = []
    for key in series_keys(baseline, runs):
        spec = _spec(key)
        data: list[dict[str, Any]] = []
        t_all: list[float] = []
        for r, colour, dash, rank in styled:
            y, t = r.series.get(key), r.series.get("t_h")
            if not y or not t:
                continue
            t_all += [t[0], t[-1]]
            data.append(
                {
                    "x": x_of(r, t),
                    "y": [v * spec.scale for v in y],
                    "name": r.name,
                    "legendgroup": r.name,
                    "legendrank": rank,
                    "mode": "lines",
                    "line": {"color": colour, "dash": dash, "width": 2},
                    "hovertemplate": f"{r.name}<br>{at}: %{{y:,.4g}} {spec.unit}<extra></extra>",
                    "type": "scatter",
                }
            )
            lim = r.series.get(spec.limit_key) if spec.limit_key else None
            if lim:
                data.append(
                    {
                        "x": x_of(r, t),
                        "y": [v * spec.scale for v in lim],
                        "name": f"{r.name}: limit",
                        "legendgroup": r.name,
                        "legendrank": rank + 1,
                        "mode": "lines",
                        "line": {"color": colour, "dash": "dot", "width": 1.5},
                        "hovertemplate": f"{r.name} limit<br>{at}: %{{y:,.4g}} {spec.unit}"
                        "<extra></extra>",
                        "type": "scatter",
                    }
                )
        if spec.limit is not None and t_all:
            data.append(
                {
                    "x": _x([min(t_all), max(t_all)], start),
                    "y": [spec.limit, spec.limit],
                    "name": f"limit ({spec.limit:g} {spec.unit})".replace(" )", ")"),
                    "legendrank": 100_000,
                    "mode": "lines",
                    "line": {"color": LIMIT_COLOUR, "dash": "dot", "width": 1.5},
                    "hoverinfo": "skip",
                    "type": "scatter",
                }
            )
        xaxis: dict[str, Any] = {
            "title": {"text": TIME_TITLE if start is not None else "hours into the recording"}
        }
        if start is not None:
            xaxis.update(type="date", tickformat="%H:%M\n%b %d")
        layout = {
            "title": {"text": spec.title()},
            "xaxis": xaxis,
            "yaxis": {"title": {"text": spec.axis_title()}},
            "template": FIGURE_TEMPLATE,
            "height": 340,
            "margin": {"t": 50, "b": 45, "l": 60, "r": 20},
            "showlegend": True,
        }
        out.append((key, {"data": data, "layout": layout}))
    return out


def figures(
    baseline: RunResult,
    runs: list[RunResult],
    start: datetime | None = None,
    colours: list[str] | None = None,
) -> list[tuple[str, go.Figure]]:
    """One figure per site-level quantity: the baseline dashed grey, each scenario in its colour
    (:func:`run_colours`, or ``colours``), limits dotted. Keys absent from every run are
    skipped. ``start``: the recording's first time (UTC), to draw on clock time."""
    return [(k, go.Figure(f)) for k, f in _figure_dicts(baseline, runs, start, colours)]


@cache
def _template_json() -> dict[str, Any]:
    """The layout template's plotly JSON (what ``to_json`` writes for it), built once."""
    return json.loads(go.Figure(layout={"template": FIGURE_TEMPLATE}).to_json())["layout"][
        "template"
    ]


def _plain_json(fig: dict[str, Any]) -> dict[str, Any]:
    """A figure of :func:`_figure_dicts` as ``json.loads(go.Figure(fig).to_json())`` reads it
    (the template expanded, NaN and infinities null), without building the plotly object."""
    text = json.dumps({**fig, "layout": {**fig["layout"], "template": None}})
    out = json.loads(text, parse_constant=lambda _: None)
    out["layout"]["template"] = copy.deepcopy(_template_json())
    return out


def figures_json(
    baseline: RunResult,
    runs: list[RunResult],
    figs: list[tuple[str, go.Figure]] | None = None,
    start: datetime | None = None,
) -> list[dict[str, Any]]:
    """:func:`figures` as plain JSON: ``[{"key", "title", "figure"}]`` (``figure`` is plotly's
    JSON of the figure, which ``plotly.io.from_json`` or ``go.Figure(...)`` reads back).
    ``figs``: figures already built for these runs (they are built once per report)."""
    if figs is not None:
        return [
            {"key": k, "title": f.layout.title.text, "figure": json.loads(f.to_json())}
            for k, f in figs
        ]
    return [
        {"key": k, "title": f["layout"]["title"]["text"], "figure": _plain_json(f)}
        for k, f in _figure_dicts(baseline, runs, start)
    ]


# --- the view both documents render ----------------------------------------------------------


def _time(t: datetime | None) -> str:
    return "—" if t is None else f"{t:%Y-%m-%d %H:%M} UTC"


def _at(s: str) -> str:
    try:
        return _time(datetime.fromisoformat(s))
    except (TypeError, ValueError):
        return str(s)


def _dur(s: float) -> str:
    """A time over a limit: minutes, or hours and minutes from two hours on."""
    if s <= 0:
        return "0 min"
    m = s / 60
    if m < 1:
        return "< 1 min"
    if m < 120:
        return f"{m:.0f} min"
    return f"{int(m // 60)} h {m % 60:02.0f} min"


def _hr(v: float, unit: str) -> str:
    """A headroom: kelvin for a temperature limit, never "-0.0"."""
    return f"{num(v)} {headroom_unit(unit)}"


def _diff(v: float, unit: str) -> str:
    """A signed difference of headrooms (kelvin for temperatures), never "-0.0" or "+-"."""
    text = num(v)
    return f"{text if text.startswith('-') or text == '0.0' else '+' + text} {headroom_unit(unit)}"


def _abs(v: float, unit: str) -> str:
    """An absolute value in its own unit (a temperature in °C)."""
    return f"{num(v)} {unit}"


def _baseline_headroom(k: KindSummary, run: RunResult, baseline: RunResult) -> float | None:
    """The baseline's minimum headroom of the scenario's worst component of kind ``k`` — the
    same component, never the baseline's own worst: from the run's summary, else from its
    listed changes or the baseline's listed components."""
    if k.worst_baseline_min_headroom is not None:
        return k.worst_baseline_min_headroom
    for c in run.changes:
        if (c.kind, c.id) == (k.kind, k.worst_id):
            return c.baseline_min_headroom
    for c in [*baseline.worst, *baseline.recorded_breaches]:
        if (c.kind, c.id) == (k.kind, k.worst_id):
            return c.min_headroom
    base = next((b for b in baseline.kinds if b.kind == k.kind), None)
    if base is not None and base.worst_id == k.worst_id:
        return base.worst_min_headroom
    return None


def _kind_row(k: KindSummary, base_hr: float | None, scenario: bool) -> dict[str, str]:
    row = {
        "limit": KIND_LABEL.get(k.kind, k.kind),
        "worst component": k.worst_id,
    }
    if scenario:
        row["its min headroom, baseline"] = "—" if base_hr is None else _hr(base_hr, k.unit)
        row["its min headroom, scenario"] = _hr(k.worst_min_headroom, k.unit)
        row["difference"] = (
            "—" if base_hr is None else _diff(k.worst_min_headroom - base_hr, k.unit)
        )
    else:
        row["min headroom"] = _hr(k.worst_min_headroom, k.unit)
    row["over the limit"] = f"{k.breaching} of {k.components}"
    row["longest over, one component"] = _dur(k.time_over_s)
    row["component-minutes over"] = f"{k.component_over_s / 60:,.0f}"
    row["first breach"] = _time(k.first_breach)
    return row


def _component_row(c: ComponentResult) -> dict[str, str]:
    return {
        "limit": KIND_LABEL.get(c.kind, c.kind),
        "component": c.id,
        "limit value": _abs(c.limit, c.unit),
        "peak": _abs(c.peak, c.unit),
        "min headroom": _hr(c.min_headroom, c.unit),
        "time over": _dur(c.time_over_s),
        "first breach": _time(c.first_breach),
    }


def _change_row(c: ComponentChange) -> dict[str, str]:
    return {
        "limit": KIND_LABEL.get(c.kind, c.kind),
        "component": c.id,
        "change": c.change,
        "min headroom, baseline": _hr(c.baseline_min_headroom, c.unit),
        "min headroom, scenario": _hr(c.min_headroom, c.unit),
        "difference": _diff(c.delta, c.unit),
        "time over, baseline": _dur(c.baseline_time_over_s),
        "time over, scenario": _dur(c.time_over_s),
    }


class Costs(BaseModel):
    """Pricing of a run's energy (``dctwin whatif --tariff-per-kwh --pue``): facility energy is
    IT energy times the PUE; its cost is that times the tariff."""

    tariff_per_kwh: float | None = Field(None, ge=0, description="price of 1 kWh (any currency)")
    pue: float | None = Field(None, ge=1, description="power usage effectiveness (>= 1)")
    currency: str = Field("", max_length=8, description="shown after a price (EUR, USD, ...)")

    def facility_kwh(self, it_kwh: float) -> float:
        return it_kwh * (self.pue or 1.0)

    def price(self, it_kwh: float) -> str:
        cost = self.facility_kwh(it_kwh) * (self.tariff_per_kwh or 0.0)
        return f"{num(cost, 0)} {self.currency}".strip()

    def basis(self) -> str:
        """How the money is counted, in words."""
        per = f"{self.tariff_per_kwh:g} {self.currency}".strip() + " per kWh"
        return f"{per} of facility energy, IT energy × PUE {self.pue or 1.0:g}"


#: Alert events listed per run in report.md and report.html; the rest are counted.
MD_ALERT_ROWS = 20
HTML_ALERT_ROWS = 200
NO_CHANGES_LISTED = (
    "No component changes are listed for this scenario; the table above compares each kind's"
    " worst headroom with the baseline's."
)


def _alert_rows(r: RunResult) -> list[dict[str, str]]:
    return [
        {
            "at": _at(a.get("at", "")),
            "status": str(a.get("status", "")),
            "rule": str(a.get("rule", "")),
            "severity": str(a.get("severity", "")),
            "group": str(a.get("group", "")),
            "summary": str(a.get("summary", "")),
        }
        for a in r.alerts
    ]


def _fired(r: RunResult) -> int:
    return sum(a.get("status") == "firing" for a in r.alerts)


def _undelivered(r: RunResult, baseline: RunResult) -> str:
    # the recording's own work is what it was: energy not delivered is a scenario's figure
    if r is baseline:
        return "—"
    return num(r.undelivered_energy_kwh)


def _signed(v: float, digits: int = 0) -> str:
    """A signed figure ("+979", "-1,550", "0"), never "-0" or "+0"."""
    text = num(v, digits)
    return text if text.startswith("-") or float(text.replace(",", "")) == 0 else "+" + text


def _change(d: float, base: float, unit: str, digits: int = 0) -> str:
    """A change and its share of ``base``: "+979 kWh (+5.7 %)"."""
    pct = 100 * d / base if base else 0.0
    return f"{_signed(d, digits)} {unit} ({_signed(pct, 1)} %)".replace("  ", " ")


def _summary_row(r: RunResult, baseline: RunResult, costs: Costs | None) -> dict[str, Any]:
    d = r.it_energy_kwh - baseline.it_energy_kwh
    row: dict[str, Any] = {
        "scenario": r.name,
        "verdict": r.verdict,
        "why": headline(r.verdict, r.changes),
        "IT energy (kWh)": num(r.it_energy_kwh, 0),
        "IT energy change": "—" if r is baseline else _change(d, baseline.it_energy_kwh, "kWh"),
    }
    if costs is not None and costs.pue is not None:
        row["facility energy (kWh)"] = num(costs.facility_kwh(r.it_energy_kwh), 0)
    if costs is not None and costs.tariff_per_kwh is not None:
        cur = f" ({costs.currency})" if costs.currency else ""
        row[f"energy cost{cur}"] = num(
            costs.facility_kwh(r.it_energy_kwh) * costs.tariff_per_kwh, 0
        )
        dc = costs.facility_kwh(d) * costs.tariff_per_kwh
        row[f"cost change{cur}"] = (
            "—"
            if r is baseline
            else _change(dc, costs.facility_kwh(baseline.it_energy_kwh) * costs.tariff_per_kwh, "")
        )
    row |= {
        "heat to liquid (kWh)": num(r.liquid_heat_kwh, 0),
        "throttled GPU-hours": num(r.throttled_gpu_s / 3600),
        "energy not delivered (kWh)": _undelivered(r, baseline),
        "alerts fired": str(_fired(r)),
    }
    return row


def _energy_line(r: RunResult, baseline: RunResult, costs: Costs | None) -> str:
    row = _summary_row(r, baseline, costs)
    money = ""
    if costs is not None and costs.tariff_per_kwh is not None:
        money = (
            f" Energy cost {costs.price(r.it_energy_kwh)}"
            f" ({row[next(k for k in row if k.startswith('cost change'))]} against the"
            f" baseline) at {costs.basis()}."
        )
    return (
        f"IT energy {row['IT energy (kWh)']} kWh, {row['IT energy change']} against the "
        f"baseline; heat to liquid {row['heat to liquid (kWh)']} kWh; GPUs at their max "
        f"operating temperature for {row['throttled GPU-hours']} GPU-hours (baseline "
        f"{num(baseline.throttled_gpu_s / 3600)}); energy not delivered: "
        f"{row['energy not delivered (kWh)']} kWh.{money}"
    )


def _recorded_note(listed: list[ComponentResult], baseline: RunResult) -> str:
    counted = sum(k.breaching for k in baseline.kinds)
    if listed:
        return ""
    if counted:
        by_kind = ", ".join(
            f"{k.breaching} {KIND_LABEL.get(k.kind, k.kind)}" for k in baseline.kinds if k.breaching
        )
        return (
            f"Not itemised in these results; the baseline counts {counted} component(s) over "
            f"their limit in the recording ({by_kind})."
        )
    return "Nothing was over its limit in the recording."


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def executive_summary(
    baseline: RunResult, runs: list[RunResult], hours: float, costs: Costs | None = None
) -> list[str]:
    """A few sentences a planner can forward: how many scenarios fit, which do not and why, what
    the recording already breached, the largest energy (and money) change."""
    if not runs:
        return [f"No scenario was run; the recording covers {hours:,.1f} h."]
    by: dict[str, list[RunResult]] = {}
    for r in runs:
        by.setdefault(r.verdict, []).append(r)
    many = {"fits": "fit", "fits with risks": "fit with risks", "does not fit": "do not fit"}
    counts = ", ".join(
        f"{len(by[v])} {v if len(by[v]) == 1 else many[v]}" for v in many if by.get(v)
    )
    out = [
        f"{_count(len(runs), 'scenario', 'scenarios')} replayed over {hours:,.1f} h of recorded "
        f"telemetry: {counts}."
    ]
    for v in ("does not fit", "fits with risks"):
        for r in by.get(v, []):
            out.append(f"{r.name} {v}: {headline(r.verdict, r.changes)}.")
    breached = [k for k in baseline.kinds if k.breaching]
    if breached:
        what = ", ".join(f"{k.breaching} {KIND_LABEL.get(k.kind, k.kind)}" for k in breached)
        out.append(
            f"The recording itself already breaches ({what}); those breaches are the "
            "recording's, not any scenario's."
        )
    big = max(runs, key=lambda r: abs(r.it_energy_kwh - baseline.it_energy_kwh))
    d = big.it_energy_kwh - baseline.it_energy_kwh
    if abs(d) >= 0.5:
        line = (
            f"Largest energy change: {big.name}, "
            f"{_change(d, baseline.it_energy_kwh, 'kWh')} of IT energy"
        )
        if costs is not None and costs.tariff_per_kwh is not None:
            dc = costs.facility_kwh(d) * costs.tariff_per_kwh
            line += f" ({_signed(dc)} {costs.currency}".rstrip() + f" at {costs.basis()})"
        out.append(line + ".")
    return out


def report_view(
    bundle: Bundle, baseline: RunResult, runs: list[RunResult], costs: Costs | None = None
) -> dict[str, Any]:
    """Everything the two documents show, as strings: the header, the executive summary, the
    summary table, the baseline and one section per scenario (rows are dicts, column name to
    cell)."""
    m = bundle.manifest
    hours = (baseline.duration_s or (m.end - m.start).total_seconds()) / 3600
    colours = run_colours(runs)
    recorded = baseline.recorded_breaches
    sections = []
    for r, colour in zip(runs, colours, strict=True):
        listed = r.recorded_breaches or recorded
        sections.append(
            {
                "name": r.name,
                "verdict": r.verdict,
                "why": headline(r.verdict, r.changes),
                "colour": colour,
                "description": r.description,
                "reasons": r.reasons,
                "summary": _summary_row(r, baseline, costs),
                "kinds": [_kind_row(k, _baseline_headroom(k, r, baseline), True) for k in r.kinds],
                "recorded": [_component_row(c) for c in listed],
                "recorded_note": _recorded_note(listed, baseline),
                "changes": [_change_row(c) for c in r.changes],
                "changes_note": "" if r.changes else NO_CHANGES_LISTED,
                "energy_line": _energy_line(r, baseline, costs),
                "alerts": _alert_rows(r),
            }
        )
    return {
        "site": m.site,
        "recording": (
            f"{m.start:%Y-%m-%d %H:%M} to {m.end:%Y-%m-%d %H:%M} UTC ({hours:,.1f} h) at "
            f"{m.resolution_s:g} s, calibration run {m.calibration_run}"
        ),
        "executive": executive_summary(baseline, runs, hours, costs),
        "costs": None if costs is None or costs.tariff_per_kwh is None else costs.basis(),
        "summary": [_summary_row(r, baseline, costs) for r in [baseline, *runs]],
        "summary_colours": ["", *colours],  # "": the baseline's dashed swatch
        "baseline": {
            "reasons": baseline.reasons,
            "kinds": [_kind_row(k, None, False) for k in baseline.kinds],
            "recorded": [_component_row(c) for c in recorded],
            "recorded_note": _recorded_note(recorded, baseline),
            "alerts": _alert_rows(baseline),
        },
        "scenarios": sections,
        "verdict_colour": VERDICT_COLOUR,
        "verdict_text": VERDICT_TEXT,
    }


# --- Markdown ---------------------------------------------------------------------------------


def _md_cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_table(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return []
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_md_cell(row[c]) for c in cols) + " |" for row in rows]
    return out


def _md_alerts(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return ["No alerts would have fired."]
    out = [
        f"- {a['at']} {a['status']} {a['rule']} ({a['group']}): {a['summary']}"
        for a in rows[:MD_ALERT_ROWS]
    ]
    more = len(rows) - MD_ALERT_ROWS
    return out + ([f"- ... and {more} more alert events"] if more > 0 else [])


def markdown(
    bundle: Bundle, baseline: RunResult, runs: list[RunResult], costs: Costs | None = None
) -> str:
    v = report_view(bundle, baseline, runs, costs)
    out = [
        "# What-if report",
        "",
        f"Recording: site `{v['site']}`, {v['recording']}.",
        "",
        "## Executive summary",
        "",
        v["executive"][0],
        "",
        *[f"- {line}" for line in v["executive"][1:]],
        "",
        "## Summary",
        "",
        *_md_table(v["summary"]),
        *(["", f"Energy priced at {v['costs']}."] if v["costs"] else []),
        "",
        "## The recording (baseline)",
        "",
        *[f"- {reason}" for reason in v["baseline"]["reasons"]],
        "",
        *_md_table(v["baseline"]["kinds"]),
        "",
        "### Already breaching in the recording",
        "",
        *(_md_table(v["baseline"]["recorded"]) or [v["baseline"]["recorded_note"]]),
        "",
        "### Alerts the rule file would have sent",
        "",
        *_md_alerts(v["baseline"]["alerts"]),
    ]
    for s in v["scenarios"]:
        out += ["", f"## {s['name']}: {s['verdict']}", "", f"Why: {s['why']}.", ""]
        out += [s["description"], ""]
        out += [f"- {reason}" for reason in s["reasons"]]
        out += ["", s["energy_line"], "", *_md_table(s["kinds"])]
        out += ["", "### Already breaching in the recording", ""]
        out += _md_table(s["recorded"]) or [s["recorded_note"]]
        out += ["", "### What the scenario changes", ""]
        out += _md_table(s["changes"]) or [s["changes_note"]]
        out += ["", "### Alerts the rule file would have sent", ""]
        out += _md_alerts(s["alerts"])
    return "\n".join(out) + "\n"


# --- HTML -------------------------------------------------------------------------------------

_ENV = Environment(
    loader=PackageLoader("twin.replay", "templates"),
    autoescape=True,  # the template's name ends in .j2: select_autoescape would not switch it on
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _start(bundle: Bundle) -> datetime:
    return bundle.manifest.start


def html_report(
    bundle: Bundle,
    baseline: RunResult,
    runs: list[RunResult],
    figs_json: list[dict[str, Any]] | None = None,
    costs: Costs | None = None,
) -> str:
    """The self-contained HTML report (plotly.js inline once, every figure drawn from it): each
    scenario's section holds its own figures, the baseline against that scenario on clock
    time. ``figs_json``: unused (kept for callers that built the combined figures already)."""
    start = _start(bundle)
    colours = run_colours(runs)
    per_run = []
    n = 0
    for r, colour in zip(runs, colours, strict=True):
        figs = []
        for key, fig in _figure_dicts(baseline, [r], start, [colour]):
            figs.append({"key": key, "id": f"fig-{n}", "figure": _plain_json(fig)})
            n += 1
        per_run.append(figs)
    return _ENV.get_template("report.html.j2").render(
        v=report_view(bundle, baseline, runs, costs),
        figures=per_run,
        plotly_js=get_plotlyjs(),
        max_alerts=HTML_ALERT_ROWS,
    )


def write_report(
    bundle: Bundle,
    baseline: RunResult,
    runs: list[RunResult],
    out_dir: str | Path,
    costs: Costs | None = None,
) -> tuple[Path, Path]:
    """Write ``report.md``, ``report.html`` (self-contained) and ``figures.json`` (every
    scenario's figures together, as plotly JSON, for the console) into ``out_dir``; return the
    first two paths. ``costs``: a tariff and PUE to price each run's energy."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md_path = out / "report.md"
    md_path.write_text(markdown(bundle, baseline, runs, costs), encoding="utf-8")
    html_path = out / "report.html"
    html_path.write_text(html_report(bundle, baseline, runs, None, costs), encoding="utf-8")
    made = figures_json(baseline, runs, start=_start(bundle))
    (out / "figures.json").write_text(json.dumps(made), encoding="utf-8")
    return md_path, html_path
