"""The console's line and bar charts drawn here, as inline SVG, from the Vega-Lite specs that
:mod:`dashboards.charts` builds: a page then loads no chart library (Vega's JavaScript, about
1 MB, costs a page about half a second in the browser; issue 15).

The subset drawn is what ``line_spec``, ``bar_spec`` and ``bars_with_marks`` produce: lines over
UTC time (coloured by a field, dashed by another), bars per id (coloured, grouped side by side),
a red tick per bar, a dashed limit rule. Every time axis is UTC with about six labels, every value
axis has its title with the unit; hovering a point, a bar or a line shows its figures (SVG
``<title>``). Every text is escaped. Any other spec is left to Vega-Lite (:func:`supported`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd

#: Vega-Lite's default categorical colours ("tableau10"), in its order.
PALETTE = (
    "#4c78a8",
    "#f58518",
    "#e45756",
    "#72b7b2",
    "#54a24b",
    "#eeca3b",
    "#b279a2",
    "#ff9da6",
    "#9d755d",
    "#bab0ac",
)
#: Dash patterns per value of a dash field [px on, px off] (the first solid).
DASHES = ("", "7 4", "2 3", "8 3 2 3")
LIMIT_COLOUR = "#d62728"
#: Margins around the plot area [px]: left holds the value labels and the axis title.
LEFT_PX, RIGHT_PX, TOP_PX = 64, 16, 10
#: Points on a chart past which they carry no hover figures (each one is an SVG element).
HOVER_POINTS = 600
#: Nice steps of a time axis [min].
TIME_STEPS_MIN = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)
DAY_MS = 86_400_000.0
FONT = 'font-family="sans-serif" font-size="11" fill="currentColor"'


def supported(spec: dict[str, Any]) -> bool:
    """Whether :func:`svg` draws ``spec`` (one of :mod:`dashboards.charts`' layered specs)."""
    layers = spec.get("layer")
    if not layers:
        return False
    first = layers[0]
    mark = first.get("mark", {}).get("type")
    x = first.get("encoding", {}).get("x", {})
    rest_ok = all(lay.get("mark", {}).get("type") in ("rule", "tick") for lay in layers[1:])
    return rest_ok and (
        (mark == "line" and x.get("type") == "temporal")
        or (mark == "bar" and x.get("type") == "nominal")
    )


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values (steps of 1, 2 or 5 times a power of ten) covering lo..hi."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, v = [], start
    while v < hi + step * 0.999:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _label(v: float) -> str:
    return (
        f"{v:,.0f}" if abs(v) >= 100 or v == int(v) else f"{v:,.2g}" if abs(v) < 1 else f"{v:,.1f}"
    )


def _figure(v: Any, d3: str | None = None) -> str:
    """A figure for a hover text (``d3`` such as ",.1f" gives the decimals)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, int | float):
        digits = 1
        if d3 and d3.rstrip("f").split(".")[-1].isdigit():
            digits = int(d3.rstrip("f").split(".")[-1])
        return f"{float(v):,.{digits}f}"
    return str(v)


def _time_ticks(t0: float, t1: float) -> tuple[list[float], str]:
    """UTC ticks about six apart between epoch-ms t0 and t1, and their strftime format."""
    span_min = max((t1 - t0) / 60_000, 1.0)
    step = next((s for s in TIME_STEPS_MIN if span_min / s <= 6), TIME_STEPS_MIN[-1]) * 60_000
    first = math.ceil(t0 / step) * step
    ticks = [first + k * step for k in range(int((t1 - first) // step) + 1)] or [t0]
    return ticks, ("%b %d %H:%M" if t1 - t0 > DAY_MS else "%H:%M")


def _utc(ms: float, fmt: str) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime(fmt)


def _clock(ms: float) -> str:
    """A tooltip's time, to the second, its colons as character references: the console
    draws these SVGs through markdown, whose emoji lookup (259 kB for the browser to fetch)
    wakes on any ``:word:``, and ``02:13:45`` is one."""
    return _utc(ms, "%Y-%m-%d %H:%M:%S").replace(":", "&#58;")


def _legend(entries: Sequence[tuple[str, str, str]], y: float, width: float, cols: int) -> str:
    """Swatches (colour, dash) and names in rows of ``cols`` under the plot."""
    cell = (width - LEFT_PX) / max(cols, 1)
    out = []
    for k, (name, colour, dash) in enumerate(entries):
        x = LEFT_PX + (k % cols) * cell
        yy = y + (k // cols) * 18
        d = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{x:.1f}" y1="{yy - 4:.1f}" x2="{x + 18:.1f}" y2="{yy - 4:.1f}"'
            f' stroke="{colour}" stroke-width="3"{d}/>'
            f'<text x="{x + 24:.1f}" y="{yy:.1f}" {FONT}>{html.escape(name)}</text>'
        )
    return "".join(out)


def _frame(width: float, height: float, y_ticks: list[float], y_of: Any, y_title: str) -> str:
    """The value axis: grid lines, labels and its title (rotated, left)."""
    out = []
    for v in y_ticks:
        y = y_of(v)
        out.append(
            f'<line x1="{LEFT_PX}" y1="{y:.1f}" x2="{width - RIGHT_PX}" y2="{y:.1f}"'
            ' stroke="currentColor" stroke-opacity="0.15"/>'
            f'<text x="{LEFT_PX - 6}" y="{y + 4:.1f}" text-anchor="end" {FONT}>{_label(v)}</text>'
        )
    mid = TOP_PX + (height - TOP_PX) / 2
    out.append(
        f'<text class="y-title" transform="translate(14,{mid:.1f}) rotate(-90)"'
        f' text-anchor="middle" {FONT}>{html.escape(y_title)}</text>'
    )
    return "".join(out)


def _rules(spec: dict[str, Any], x0: float, x1: float, y_of: Any) -> str:
    out = []
    for lay in spec["layer"][1:]:
        if lay["mark"]["type"] != "rule":
            continue
        for row in lay["data"]["values"]:
            y = y_of(float(row["y"]))
            out.append(
                f'<line class="limit" data-y="{float(row["y"])!r}" x1="{x0}" y1="{y:.1f}"'
                f' x2="{x1}" y2="{y:.1f}" stroke="{LIMIT_COLOUR}" stroke-width="1.5"'
                f' stroke-dasharray="6 4"><title>{html.escape(str(row["label"]))}:'
                f" {_label(float(row['y']))}</title></line>"
            )
    return "".join(out)


def _rule_values(spec: dict[str, Any]) -> list[float]:
    return [
        float(r["y"])
        for lay in spec["layer"][1:]
        if lay["mark"]["type"] == "rule"
        for r in lay["data"]["values"]
    ]


def _svg(key: str, kind: str, y_title: str, width: float, height: float, body: str) -> str:
    return (
        f'<svg class="dctwin-chart" data-key="{html.escape(key)}" data-kind="{kind}"'
        f' data-y-title="{html.escape(y_title)}" xmlns="http://www.w3.org/2000/svg"'
        f' viewBox="0 0 {width:.0f} {height:.0f}" width="100%"'
        f' style="max-width:{1.5 * width:.0f}px;height:auto" role="img">{body}</svg>'
    )


def lines(data: pd.DataFrame, spec: dict[str, Any], key: str, width: float) -> str:
    """A ``line_spec`` over ``data`` (``t`` in epoch ms) as SVG."""
    enc = spec["layer"][0]["encoding"]
    y_title = enc["y"]["title"]
    colour_f = enc.get("color", {}).get("field")
    dash_f = enc.get("strokeDash", {}).get("field")
    plot_h = float(spec.get("height", 260))
    t = pd.to_numeric(data["t"], errors="coerce")
    v = pd.to_numeric(data["value"], errors="coerce")
    ys = [*v.dropna().tolist(), *_rule_values(spec), 0.0]
    y_ticks = nice_ticks(min(ys), max(ys))
    t0, t1 = (float(t.min()), float(t.max())) if t.notna().any() else (0.0, 60_000.0)
    t1 = t1 if t1 > t0 else t0 + 60_000.0
    x0, x1 = LEFT_PX, width - RIGHT_PX
    lo, hi = y_ticks[0], y_ticks[-1]

    def x_of(ms: float) -> float:
        return x0 + (ms - t0) / (t1 - t0) * (x1 - x0)

    def y_of(val: float) -> float:
        return TOP_PX + (hi - val) / (hi - lo) * plot_h

    ticks, tfmt = _time_ticks(t0, t1)
    axis_y = TOP_PX + plot_h
    parts = [_frame(width, axis_y, y_ticks, y_of, y_title)]
    for ms in ticks:
        x = x_of(ms)
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP_PX}" x2="{x:.1f}" y2="{axis_y:.1f}" stroke="currentColor"'
            ' stroke-opacity="0.1"/>'
            f'<text x="{x:.1f}" y="{axis_y + 15:.1f}" text-anchor="middle" {FONT}>'
            f"{_utc(ms, tfmt)}</text>"
        )
    parts.append(
        f'<text class="x-title" x="{(x0 + x1) / 2:.1f}" y="{axis_y + 32:.1f}"'
        f' text-anchor="middle" {FONT}>time [UTC]</text>'
    )
    groups = [c for c in (colour_f, dash_f) if c]
    frame = data.assign(_t=t, _v=v)
    series = list(frame.groupby(groups, sort=False)) if groups else [((), frame)]
    colours: dict[Any, str] = {}
    dashes: dict[Any, str] = {}
    hover = len(frame) <= HOVER_POINTS
    legend = []
    for name, part in series:
        name = name if isinstance(name, tuple) else (name,)
        c_val = name[0] if colour_f else None
        d_val = name[groups.index(dash_f)] if dash_f else None
        colour = colours.setdefault(c_val, PALETTE[len(colours) % len(PALETTE)])
        dash = dashes.setdefault(d_val, DASHES[len(dashes) % len(DASHES)])
        label = str(c_val) if colour_f else y_title
        path, pen_down, points = [], False, []
        for ms, val in zip(part["_t"], part["_v"], strict=True):
            if pd.isna(val) or pd.isna(ms):
                pen_down = False
                continue
            path.append(f"{'L' if pen_down else 'M'}{x_of(ms):.1f},{y_of(val):.1f}")
            pen_down = True
            points.append((ms, val))
        d = f' stroke-dasharray="{dash}"' if dash else ""
        last = f", last {_figure(points[-1][1])}" if points else ""
        parts.append(
            f'<path class="series" data-name="{html.escape(label)}" data-points="{len(points)}"'
            f' d="{"".join(path)}" fill="none" stroke="{colour}" stroke-width="2"{d}>'
            f"<title>{html.escape(label)}{last}</title></path>"
        )
        if hover:
            parts += [
                f'<circle cx="{x_of(ms):.1f}" cy="{y_of(val):.1f}" r="4" fill="transparent">'
                f"<title>{html.escape(label)} · {_clock(ms)} UTC ·"
                f" {html.escape(y_title)}: {_figure(val)}</title></circle>"
                for ms, val in points
            ]
        if colour_f:
            legend.append((label, colour, dash))
    parts.append(_rules(spec, x0, x1, y_of))
    height = axis_y + 44
    if len(legend) > 1:
        cols = max(1, int((width - LEFT_PX) // 150))
        parts.append(_legend(legend, height, width, cols))
        height += 18 * math.ceil(len(legend) / cols)
    return _svg(key, "line", y_title, width, height, "".join(parts))


def bars(data: pd.DataFrame, spec: dict[str, Any], key: str, width: float) -> str:
    """A ``bar_spec`` or ``bars_with_marks`` over ``data`` as SVG: bars per id in the data's
    order (largest first with ``sort: -y``), ids slanted under them."""
    enc = spec["layer"][0]["encoding"]
    xf, yf, y_title = enc["x"]["field"], enc["y"]["field"], enc["y"]["title"]
    colour_f = enc.get("color", {}).get("field")
    offset_f = enc.get("xOffset", {}).get("field")
    marks = [
        lay["encoding"]["y"]["field"] for lay in spec["layer"][1:] if lay["mark"]["type"] == "tick"
    ]
    tips = [
        (f["field"], f.get("title", f["field"]), f.get("format")) for f in enc.get("tooltip", [])
    ]
    plot_h = float(spec.get("height", 300))
    frame = data.copy()
    frame[yf] = pd.to_numeric(frame[yf], errors="coerce")
    if enc["x"].get("sort") == "-y":
        frame = frame.sort_values(yf, ascending=False, kind="stable")
    ids = list(dict.fromkeys(frame[xf].astype(str)))
    groups = list(dict.fromkeys(frame[offset_f].astype(str))) if offset_f else [""]
    ys = [*frame[yf].dropna().tolist(), *_rule_values(spec), 0.0]
    for m in marks:
        ys += pd.to_numeric(frame[m], errors="coerce").dropna().tolist()
    y_ticks = nice_ticks(min(ys), max(ys))
    lo, hi = y_ticks[0], y_ticks[-1]
    x0, x1 = LEFT_PX, width - RIGHT_PX
    band = (x1 - x0) / max(len(ids), 1)

    def y_of(val: float) -> float:
        return TOP_PX + (hi - val) / (hi - lo) * plot_h

    axis_y = TOP_PX + plot_h
    parts = [_frame(width, axis_y, y_ticks, y_of, y_title)]
    colours: dict[str, str] = {}
    inner = band * 0.8 / len(groups)
    for _, row in frame.iterrows():
        i = ids.index(str(row[xf]))
        g = groups.index(str(row[offset_f])) if offset_f else 0
        c_val = str(row[colour_f]) if colour_f else ""
        colour = colours.setdefault(c_val, PALETTE[len(colours) % len(PALETTE)])
        x = x0 + i * band + band * 0.1 + g * inner
        val = row[yf]
        tip = " · ".join(
            f"{html.escape(str(title))}: {html.escape(_figure(row.get(f), fmt))}"
            for f, title, fmt in tips
        )
        if pd.notna(val):
            top, base = y_of(max(val, 0.0)), y_of(min(val, 0.0))
            parts.append(
                f'<rect class="bar" data-x="{html.escape(str(row[xf]))}"'
                f' data-value="{float(val)!r}"'
                f' x="{x:.1f}" y="{top:.1f}" width="{max(inner - 1, 1):.1f}"'
                f' height="{max(base - top, 0.5):.1f}" fill="{colour}"><title>{tip}</title></rect>'
            )
        for m in marks:
            mv = pd.to_numeric(pd.Series([row.get(m)]), errors="coerce").iloc[0]
            if pd.notna(mv):
                ym = y_of(float(mv))
                parts.append(
                    f'<line class="mark" data-x="{html.escape(str(row[xf]))}"'
                    f' data-value="{float(mv)!r}"'
                    f' x1="{x - 2:.1f}" y1="{ym:.1f}" x2="{x + inner + 1:.1f}" y2="{ym:.1f}"'
                    f' stroke="{LIMIT_COLOUR}" stroke-width="3"><title>{tip}</title></line>'
                )
    label_h = min(120, 7 * max((len(s) for s in ids), default=1))
    for i, name in enumerate(ids):
        x = x0 + (i + 0.5) * band
        parts.append(
            f'<text transform="translate({x:.1f},{axis_y + 8:.1f}) rotate(-45)" text-anchor="end"'
            f" {FONT}>{html.escape(name)}</text>"
        )
    parts.append(
        f'<line x1="{x0}" y1="{y_of(0.0):.1f}" x2="{x1}" y2="{y_of(0.0):.1f}" stroke="currentColor"'
        ' stroke-opacity="0.5"/>'
    )
    parts.append(_rules(spec, x0, x1, y_of))
    height = axis_y + label_h + 16
    if colour_f and len(colours) > 1:
        cols = max(1, int((width - LEFT_PX) // 150))
        parts.append(_legend([(n, c, "") for n, c in colours.items()], height, width, cols))
        height += 18 * math.ceil(len(colours) / cols)
    return _svg(key, "bar", y_title, width, height, "".join(parts))


def svg(data: pd.DataFrame, spec: dict[str, Any], key: str, width: float) -> str:
    """``spec`` (:func:`supported`) over ``data`` as an SVG about ``width`` px wide."""
    if spec["layer"][0]["mark"]["type"] == "line":
        return lines(data, spec, key, width)
    return bars(data, spec, key, width)
