"""The what-if report: baseline and scenarios side by side, as Markdown and as HTML with plots."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from twin.replay.bundle import Bundle
from twin.replay.result import RunResult

KIND_LABEL = {
    "gpu": "GPU temperature",
    "pdu_phase": "PDU phase / breaker current",
    "rack": "rack power (its feeds together)",
    "cdu_heat": "CDU heat against capacity",
    "cdu_flow": "CDU flow needed against flow",
    "loop": "loop return temperature",
    "link": "link traffic",
}


def _fmt_time(t) -> str:
    return "—" if t is None else f"{t:%Y-%m-%d %H:%M}"


def markdown(bundle: Bundle, baseline: RunResult, runs: list[RunResult]) -> str:
    m = bundle.manifest
    out = [
        "# What-if report",
        "",
        f"Recording: site `{m.site}`, {m.start:%Y-%m-%d %H:%M} to {m.end:%Y-%m-%d %H:%M} UTC at "
        f"{m.resolution_s:g} s, calibration run {m.calibration_run}.",
        "",
        "| scenario | verdict | IT energy (kWh) | heat to liquid (kWh) | alerts fired |",
        "|---|---|---:|---:|---:|",
    ]
    for r in [baseline, *runs]:
        fired = sum(a["status"] == "firing" for a in r.alerts)
        out.append(
            f"| {r.name} | {r.verdict} | {r.it_energy_kwh:,.0f} | {r.liquid_heat_kwh:,.0f} "
            f"| {fired} |"
        )
    for r in runs:
        out += ["", f"## {r.name}: {r.verdict}", "", r.description, ""]
        out += [f"- {reason}" for reason in r.reasons]
        out += [
            "",
            "| component | worst | min headroom (baseline) | min headroom | over the limit"
            " | time over | first breach |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        base = {k.kind: k for k in baseline.kinds}
        for k in r.kinds:
            b = base.get(k.kind)
            bh = "—" if b is None else f"{b.worst_min_headroom:.1f} {b.unit}"
            out.append(
                f"| {KIND_LABEL.get(k.kind, k.kind)} | {k.worst_id} | {bh} | "
                f"{k.worst_min_headroom:.1f} {k.unit} | {k.breaching} of {k.components} | "
                f"{k.time_over_s / 60:.0f} min | {_fmt_time(k.first_breach)} |"
            )
        if r.alerts:
            out += ["", "Alerts the rule file would have sent:", ""]
            for a in r.alerts[:20]:
                out.append(
                    f"- {a['at'][:16]} {a['status']} {a['rule']} ({a['group']}): {a['summary']}"
                )
            if len(r.alerts) > 20:
                out.append(f"- ... {len(r.alerts) - 20} more")
        d_kwh = r.it_energy_kwh - baseline.it_energy_kwh
        out += [
            "",
            f"IT energy {r.it_energy_kwh:,.0f} kWh ({d_kwh:+,.0f} kWh against the baseline).",
        ]
    return "\n".join(out) + "\n"


def figure(baseline: RunResult, runs: list[RunResult]) -> go.Figure:
    panels = [
        ("it_power_kw", "IT power (kW)"),
        ("cdu_util_max", "worst CDU: heat / capacity"),
        ("gpu_temp_max_c", "hottest GPU (°C)"),
        ("phase_util_max", "worst PDU phase: current / derated limit"),
    ]
    fig = make_subplots(
        rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=[t for _, t in panels]
    )
    for r in [baseline, *runs]:
        for row, (key, _) in enumerate(panels, start=1):
            fig.add_trace(
                go.Scatter(
                    x=r.series["t_h"],
                    y=r.series[key],
                    name=r.name,
                    legendgroup=r.name,
                    showlegend=row == 1,
                    mode="lines",
                ),
                row=row,
                col=1,
            )
    for row in (2, 4):
        fig.add_hline(y=1.0, line_dash="dot", row=row, col=1)
    fig.update_xaxes(title_text="hours into the recording", row=len(panels), col=1)
    fig.update_layout(height=250 * len(panels), margin={"t": 40, "b": 40})
    return fig


def write_report(
    bundle: Bundle, baseline: RunResult, runs: list[RunResult], out_dir: str | Path
) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` (self-contained) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(bundle, baseline, runs)
    md_path = out / "report.md"
    md_path.write_text(md, encoding="utf-8")
    body = "\n".join(
        f"<pre>{html.escape(line)}</pre>" if line.startswith("|") else f"<p>{html.escape(line)}</p>"
        for line in md.splitlines()
        if line
    )
    plot = figure(baseline, runs).to_html(full_html=False, include_plotlyjs=True)
    html_path = out / "report.html"
    html_path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>dctwin what-if</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
        "pre{margin:0}</style></head><body>"
        f"{body}<h2>Paths, baseline against each scenario</h2>{plot}</body></html>",
        encoding="utf-8",
    )
    return md_path, html_path
