"""The what-if report: baseline and scenarios side by side.

- ``report.md``: the text summary (Markdown).
- ``report.html``: one self-contained page rendered from ``templates/report.html.j2``: tables,
  a verdict badge per scenario, and one figure per site-level quantity, plotly.js embedded
  once so that the file opens offline.
- ``figures.json``: the same figures as plotly JSON, which the API serves to the console.

Both documents are rendered from one view (:func:`report_view`), so they say the same things.
Every scenario keeps one colour in every figure (:func:`run_colours`); the baseline is dashed
in a neutral grey and limits are dotted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from jinja2 import Environment, PackageLoader, StrictUndefined
from plotly.offline import get_plotlyjs

from twin.replay.bundle import Bundle
from twin.replay.result import ComponentChange, ComponentResult, KindSummary, RunResult

KIND_LABEL = {
    "gpu": "GPU temperature",
    "pdu_phase": "PDU phase / breaker current",
    "rack": "rack power (its feeds together)",
    "cdu_heat": "CDU heat against capacity",
    "cdu_flow": "CDU flow needed against flow",
    "loop": "loop return temperature",
    "link": "link traffic",
}

#: Badge colour per verdict (background; the text is white).
VERDICT_COLOUR = {
    "fits": "#1a7f37",
    "fits with risks": "#b35c00",
    "does not fit": "#c62828",
    "baseline": "#5f6368",
}
#: The baseline in every figure: dashed, neutral.
BASELINE_COLOUR = "#5f6368"
#: Constant limits (a ratio of 1.0, ...): dotted, near black.
LIMIT_COLOUR = "#202124"
#: One colour per scenario, by its position in the run: the Okabe-Ito colour-blind-safe palette
#: (Okabe & Ito, "Color Universal Design", 2008) without its black, grey-like and yellow
#: entries, then Plotly's Dark24 for a seventh scenario and beyond (its greys left out).
PALETTE = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#2E91E5",
    "#E15F99",
    "#1CA71C",
    "#FB0D0D",
    "#DA16FF",
    "#B68100",
    "#750D86",
    "#EB663B",
    "#511CFB",
    "#00A08B",
    "#FB00D1",
    "#FC0080",
    "#B2828D",
    "#6C7C32",
)


@dataclass(frozen=True)
class SeriesSpec:
    """How one key of :attr:`RunResult.series` is drawn."""

    label: str
    unit: str
    #: a constant limit drawn as one dotted line (None: no constant limit)
    limit: float | None = None
    #: another series key holding this quantity's limit per run (dotted, in the run's colour)
    limit_key: str | None = None
    #: said after the title
    note: str = ""

    def title(self) -> str:
        t = f"{self.label} ({self.unit})" if self.unit else self.label
        return f"{t}; {self.note}" if self.note else t


#: The site-level paths the report knows, in the order they are shown. A key a run does not
#: hold is skipped; a key the run holds and this table does not know is drawn after these,
#: labelled by its name (a ``*_util_max`` key as a ratio against 1.0).
SERIES: dict[str, SeriesSpec] = {
    "it_power_kw": SeriesSpec("IT power", "kW"),
    "liquid_heat_kw": SeriesSpec(
        "Heat to liquid, all CDUs",
        "kW",
        limit_key="cdu_capacity_kw",
        note="dotted: their capacity",
    ),
    "air_heat_kw": SeriesSpec("Heat to the room's air, all racks", "kW"),
    "gpu_temp_max_c": SeriesSpec("Hottest GPU", "°C"),
    "cdu_util_max": SeriesSpec("Worst CDU: heat / capacity", "ratio", limit=1.0),
    "phase_util_max": SeriesSpec("Worst PDU phase: current / derated limit", "ratio", limit=1.0),
}
#: Unit of a key the table does not know, from its name's suffix.
_SUFFIX_UNIT = {"_kw": "kW", "_w": "W", "_c": "°C", "_k": "K", "_a": "A", "_kwh": "kWh"}


def run_colours(runs: list[RunResult]) -> list[str]:
    """The colour of each scenario, by its position (the same in every figure)."""
    return [PALETTE[i % len(PALETTE)] for i in range(len(runs))]


def _spec(key: str) -> SeriesSpec:
    if key in SERIES:
        return SERIES[key]
    if key.endswith("_util_max"):
        what = key.removesuffix("_util_max").replace("_", " ")
        return SeriesSpec(f"Worst {what}: ratio to its limit", "ratio", limit=1.0)
    unit = next((u for s, u in _SUFFIX_UNIT.items() if key.endswith(s)), "")
    return SeriesSpec(key.replace("_", " "), unit)


def series_keys(baseline: RunResult, runs: list[RunResult]) -> list[str]:
    """The keys drawn: the known ones a run holds, in table order, then unknown ones sorted."""
    held: set[str] = set()
    for r in [baseline, *runs]:
        held.update(k for k, v in r.series.items() if v)
    limit_keys = {s.limit_key for s in SERIES.values() if s.limit_key}
    known = [k for k in SERIES if k in held]
    extra = sorted(held - set(SERIES) - limit_keys - {"t_h"})
    return known + extra


def figures(baseline: RunResult, runs: list[RunResult]) -> list[tuple[str, go.Figure]]:
    """One figure per site-level quantity: the baseline dashed grey, each scenario in its colour
    (:func:`run_colours`), limits dotted. Keys absent from every run are skipped."""
    colours = run_colours(runs)
    # the baseline is drawn last, over the scenarios (a scenario that leaves a path as recorded
    # would hide it), and listed first in the legend (legendrank)
    styled = [(r, colours[i], "solid", 1000 + 10 * i) for i, r in enumerate(runs)]
    styled.append((baseline, BASELINE_COLOUR, "dash", 1))
    out: list[tuple[str, go.Figure]] = []
    for key in series_keys(baseline, runs):
        spec = _spec(key)
        fig = go.Figure()
        t_all: list[float] = []
        for r, colour, dash, rank in styled:
            y, t = r.series.get(key), r.series.get("t_h")
            if not y or not t:
                continue
            t_all += [t[0], t[-1]]
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=y,
                    name=r.name,
                    legendgroup=r.name,
                    legendrank=rank,
                    mode="lines",
                    line={"color": colour, "dash": dash, "width": 2},
                    hovertemplate=f"{r.name}<br>%{{x:.2f}} h: %{{y:,.4g}} {spec.unit}"
                    "<extra></extra>",
                )
            )
            lim = r.series.get(spec.limit_key) if spec.limit_key else None
            if lim:
                fig.add_trace(
                    go.Scatter(
                        x=t,
                        y=lim,
                        name=f"{r.name}: limit",
                        legendgroup=r.name,
                        legendrank=rank + 1,
                        mode="lines",
                        line={"color": colour, "dash": "dot", "width": 1.5},
                        hovertemplate=f"{r.name} limit<br>%{{x:.2f}} h: %{{y:,.4g}} {spec.unit}"
                        "<extra></extra>",
                    )
                )
        if spec.limit is not None and t_all:
            fig.add_trace(
                go.Scatter(
                    x=[min(t_all), max(t_all)],
                    y=[spec.limit, spec.limit],
                    name=f"limit ({spec.limit:g})",
                    legendrank=100_000,
                    mode="lines",
                    line={"color": LIMIT_COLOUR, "dash": "dot", "width": 1.5},
                    hoverinfo="skip",
                )
            )
        fig.update_layout(
            title={"text": spec.title()},
            xaxis_title="hours into the recording",
            yaxis_title=spec.unit,
            template="plotly_white",
            height=340,
            margin={"t": 50, "b": 45, "l": 60, "r": 20},
            showlegend=True,
        )
        out.append((key, fig))
    return out


def figures_json(
    baseline: RunResult, runs: list[RunResult], figs: list[tuple[str, go.Figure]] | None = None
) -> list[dict[str, Any]]:
    """:func:`figures` as plain JSON: ``[{"key", "title", "figure"}]`` (``figure`` is plotly's
    JSON of the figure, which ``plotly.io.from_json`` or ``go.Figure(...)`` reads back).
    ``figs``: figures already built for these runs (they are built once per report)."""
    return [
        {"key": k, "title": f.layout.title.text, "figure": json.loads(f.to_json())}
        for k, f in (figs if figs is not None else figures(baseline, runs))
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
    return f"{v:,.1f} {unit}"


def _kind_row(k: KindSummary, base: KindSummary | None, scenario: bool) -> dict[str, str]:
    row = {
        "limit": KIND_LABEL.get(k.kind, k.kind),
        "worst component": k.worst_id,
    }
    if scenario:
        row["min headroom, baseline"] = (
            "—" if base is None else _hr(base.worst_min_headroom, base.unit)
        )
        row["min headroom, scenario"] = _hr(k.worst_min_headroom, k.unit)
        row["change"] = (
            "—"
            if base is None
            else f"{k.worst_min_headroom - base.worst_min_headroom:+,.1f} {k.unit}"
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
        "limit value": f"{c.limit:,.1f} {c.unit}",
        "peak": f"{c.peak:,.1f} {c.unit}",
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
        "difference": f"{c.delta:+,.1f} {c.unit}",
        "time over, baseline": _dur(c.baseline_time_over_s),
        "time over, scenario": _dur(c.time_over_s),
    }


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


def _undelivered(r: RunResult) -> str:
    # GPUs held at their slowdown temperature shed power: a run that reports throttling but no
    # energy not delivered did not compute it, and 0 would say something false
    if r.undelivered_energy_kwh == 0 and r.throttled_gpu_s > 0:
        return "not reported"
    return f"{r.undelivered_energy_kwh:,.1f}"


def _summary_row(r: RunResult, baseline: RunResult) -> dict[str, Any]:
    d = r.it_energy_kwh - baseline.it_energy_kwh
    pct = 100 * d / baseline.it_energy_kwh if baseline.it_energy_kwh else 0.0
    return {
        "scenario": r.name,
        "verdict": r.verdict,
        "IT energy (kWh)": f"{r.it_energy_kwh:,.0f}",
        "IT energy change": "—" if r is baseline else f"{d:+,.0f} kWh ({pct:+.1f} %)",
        "heat to liquid (kWh)": f"{r.liquid_heat_kwh:,.0f}",
        "throttled GPU-hours": f"{r.throttled_gpu_s / 3600:,.1f}",
        "energy not delivered (kWh)": _undelivered(r),
        "alerts fired": str(_fired(r)),
    }


def _energy_line(row: dict[str, Any]) -> str:
    undelivered = row["energy not delivered (kWh)"]
    undelivered = "not reported" if undelivered == "not reported" else f"{undelivered} kWh"
    return (
        f"IT energy {row['IT energy (kWh)']} kWh, {row['IT energy change']} against the "
        f"baseline; heat to liquid {row['heat to liquid (kWh)']} kWh; throttled "
        f"{row['throttled GPU-hours']} GPU-hours; energy not delivered: {undelivered}."
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


def report_view(bundle: Bundle, baseline: RunResult, runs: list[RunResult]) -> dict[str, Any]:
    """Everything the two documents show, as strings: the header, the summary table, the
    baseline and one section per scenario (rows are dicts, column name to cell)."""
    m = bundle.manifest
    hours = (baseline.duration_s or (m.end - m.start).total_seconds()) / 3600
    colours = run_colours(runs)
    recorded = baseline.recorded_breaches
    base_kinds = {k.kind: k for k in baseline.kinds}
    sections = []
    for r, colour in zip(runs, colours, strict=True):
        listed = r.recorded_breaches or recorded
        sections.append(
            {
                "name": r.name,
                "verdict": r.verdict,
                "colour": colour,
                "description": r.description,
                "reasons": r.reasons,
                "summary": _summary_row(r, baseline),
                "kinds": [_kind_row(k, base_kinds.get(k.kind), True) for k in r.kinds],
                "recorded": [_component_row(c) for c in listed],
                "recorded_note": _recorded_note(listed, baseline),
                "changes": [_change_row(c) for c in r.changes],
                "changes_note": "" if r.changes else NO_CHANGES_LISTED,
                "energy_line": _energy_line(_summary_row(r, baseline)),
                "alerts": _alert_rows(r),
            }
        )
    return {
        "site": m.site,
        "recording": (
            f"{m.start:%Y-%m-%d %H:%M} to {m.end:%Y-%m-%d %H:%M} UTC ({hours:,.1f} h) at "
            f"{m.resolution_s:g} s, calibration run {m.calibration_run}"
        ),
        "summary": [_summary_row(r, baseline) for r in [baseline, *runs]],
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


def markdown(bundle: Bundle, baseline: RunResult, runs: list[RunResult]) -> str:
    v = report_view(bundle, baseline, runs)
    out = [
        "# What-if report",
        "",
        f"Recording: site `{v['site']}`, {v['recording']}.",
        "",
        *_md_table(v["summary"]),
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
        out += ["", f"## {s['name']}: {s['verdict']}", "", s["description"], ""]
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


def html_report(
    bundle: Bundle,
    baseline: RunResult,
    runs: list[RunResult],
    figs_json: list[dict[str, Any]] | None = None,
) -> str:
    """The self-contained HTML report (plotly.js inline once, every figure drawn from it).
    ``figs_json``: :func:`figures_json` of these runs, when already made."""
    made = figs_json if figs_json is not None else figures_json(baseline, runs)
    figs = [{"key": f["key"], "id": f"fig-{i}", "figure": f["figure"]} for i, f in enumerate(made)]
    return _ENV.get_template("report.html.j2").render(
        v=report_view(bundle, baseline, runs),
        figures=figs,
        plotly_js=get_plotlyjs(),
        max_alerts=HTML_ALERT_ROWS,
    )


def write_report(
    bundle: Bundle, baseline: RunResult, runs: list[RunResult], out_dir: str | Path
) -> tuple[Path, Path]:
    """Write ``report.md``, ``report.html`` (self-contained) and ``figures.json`` (the figures
    as plotly JSON, for the console) into ``out_dir``; return the first two paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md_path = out / "report.md"
    md_path.write_text(markdown(bundle, baseline, runs), encoding="utf-8")
    made = figures_json(baseline, runs)  # built once for the page and for figures.json
    html_path = out / "report.html"
    html_path.write_text(html_report(bundle, baseline, runs, made), encoding="utf-8")
    (out / "figures.json").write_text(json.dumps(made), encoding="utf-8")
    return md_path, html_path
