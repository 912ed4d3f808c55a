"""The console's charts: Vega-Lite specs, the lines and bars of which are drawn here as inline
SVG (:mod:`dashboards.svgchart`: no chart library for the browser to load), the what-if report's
figures by Streamlit's ``st.vega_lite_chart`` (plotly's 4.7 MB chunk is never fetched by a console
page), and the floor map as a static SVG grid.

Every time axis is UTC, labelled ``%H:%M`` (with the date once the span passes a day) with
about six ticks; every value axis has a title with its unit.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st

from dashboards import svgchart

#: A time axis carries about this many labels (readable at the console's column widths).
TIME_TICKS = 6
#: Colour of a limit line (the 100 % of a derated limit, a threshold).
LIMIT_COLOUR = "#d62728"
DAY_S = 86400.0


def time_axis(span_s: float) -> dict[str, Any]:
    """A UTC time axis: ``%H:%M``, with the date when the span is longer than a day; ticks
    at least a minute apart. The labels are a ``utcFormat`` expression: Streamlit's chart
    config replaces an axis ``format`` of ``formatType: utc`` with its own 12-hour labels."""
    fmt = "%b %d %H:%M" if span_s > DAY_S else "%H:%M"
    return {
        "title": "time [UTC]",
        "labelExpr": f"utcFormat(datum.value, '{fmt}')",
        "tickCount": TIME_TICKS,
        "tickMinStep": 60_000,
        "labelAngle": 0,
        "labelOverlap": True,
        "grid": True,
    }


def span_s(t: pd.Series) -> float:
    if t.empty:
        return 0.0
    return float((t.max() - t.min()).total_seconds())


def epoch_ms(t: pd.Series) -> list[float]:
    """UTC times as milliseconds since the epoch (what Vega-Lite reads as a time, with no
    time zone left to the browser)."""
    ts = pd.to_datetime(t, utc=True)
    # floats: Arrow's int64 reaches the browser as BigInt, which Vega does not read as a time
    return [float(x) for x in (ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)]


def complete_buckets(
    t: Sequence[Any], value: Sequence[Any], devices: Sequence[Any] | None
) -> pd.DataFrame:
    """An aggregate series (``/api/v1/series?agg=``) as a frame ``t``, ``value`` without the
    incomplete buckets at its edges: a first or last bucket that fewer devices reached than
    the series' median (a partial first minute would read as a false drop of the sum)."""
    df = pd.DataFrame({"t": pd.to_datetime(list(t), utc=True), "value": list(value)})
    if devices is None or df.empty:
        return df
    n = pd.Series(list(devices), dtype="float64")
    full = n >= n.median()
    ok = full.to_numpy()
    first = int(ok.argmax()) if ok.any() else len(df)
    last = len(df) - int(ok[::-1].argmax()) if ok.any() else 0
    return df.iloc[first:last].reset_index(drop=True)


#: The column :func:`draw` adds beside each time column: the time as text, "... UTC".
UTC_TEXT = "{}_utc"


def _tooltip_time() -> dict[str, Any]:
    return {"field": UTC_TEXT.format("t"), "type": "nominal", "title": "time"}


def line_spec(
    y_title: str,
    t: pd.Series,
    *,
    color: str | None = None,
    color_title: str = "",
    dash: str | None = None,
    limit: float | None = None,
    limit_label: str = "limit",
    height: int = 260,
    title: str | None = None,
    y_format: str = ",~f",
) -> dict[str, Any]:
    """Lines of ``value`` over the times ``t`` (one per ``color`` value), with an optional
    limit line."""
    enc: dict[str, Any] = {
        "x": {
            "field": "t",
            "type": "temporal",
            "scale": {"type": "utc"},
            "axis": time_axis(span_s(t)),
        },
        "y": {
            "field": "value",
            "type": "quantitative",
            "title": y_title,
            "axis": {"format": y_format},
        },
        "tooltip": [
            _tooltip_time(),
            {"field": "value", "type": "quantitative", "title": y_title, "format": ",.1f"},
        ],
    }
    if color:
        enc["color"] = {
            "field": color,
            "type": "nominal",
            "title": color_title or None,
            "legend": {"orient": "bottom", "columns": 3},
        }
        enc["tooltip"].insert(0, {"field": color, "type": "nominal", "title": color_title or color})
    if dash:
        enc["strokeDash"] = {
            "field": dash,
            "type": "nominal",
            "title": None,
            "legend": {"orient": "bottom"},
        }
    layers: list[dict[str, Any]] = [
        {"mark": {"type": "line", "interpolate": "monotone"}, "encoding": enc}
    ]
    if limit is not None:
        layers.append(_rule(limit, limit_label))
    spec: dict[str, Any] = {"height": height, "layer": layers}
    if title:
        spec["title"] = title
    return spec


def _rule(y: float, label: str) -> dict[str, Any]:
    return {
        "data": {"values": [{"y": y, "label": label}]},
        "mark": {"type": "rule", "color": LIMIT_COLOUR, "strokeDash": [6, 4]},
        "encoding": {
            "y": {"field": "y", "type": "quantitative"},
            "tooltip": [{"field": "label", "title": "line"}, {"field": "y", "title": "at"}],
        },
    }


def bar_spec(
    x: str,
    y: str,
    y_title: str,
    *,
    color: str | None = None,
    color_title: str = "",
    offset: str | None = None,
    limit: float | None = None,
    limit_label: str = "limit",
    tooltip: Sequence[tuple[str, str, str]] = (),
    height: int = 300,
    title: str | None = None,
    sort: str | None = None,
) -> dict[str, Any]:
    """Bars of ``y`` per ``x`` (grouped side by side by ``offset``, coloured by ``color``),
    ids slanted so that each one stays readable, and an optional limit line.
    ``tooltip``: (field, title, d3 format or "" for text)."""
    enc: dict[str, Any] = {
        "x": {
            "field": x,
            "type": "nominal",
            "title": None,
            "sort": sort or None,
            "axis": {"labelAngle": -45, "labelOverlap": False, "labelLimit": 120},
        },
        "y": {"field": y, "type": "quantitative", "title": y_title},
        "tooltip": [{"field": x, "type": "nominal", "title": "id"}]
        + [
            {
                "field": f,
                "title": t,
                "type": "quantitative" if fmt_ else "nominal",
                **({"format": fmt_} if fmt_ else {}),
            }
            for f, t, fmt_ in ((y, y_title, ",.1f"), *tooltip)
        ],
    }
    if color:
        enc["color"] = {
            "field": color,
            "type": "nominal",
            "title": color_title or None,
            "legend": {"orient": "bottom", "columns": 3},
        }
    if offset:
        enc["xOffset"] = {"field": offset, "type": "nominal"}
    layers: list[dict[str, Any]] = [{"mark": {"type": "bar"}, "encoding": enc}]
    if limit is not None:
        layers.append(_rule(limit, limit_label))
    spec: dict[str, Any] = {"height": height, "layer": layers}
    if title:
        spec["title"] = title
    return spec


def bars_with_marks(
    x: str, bar: str, mark: str, y_title: str, bar_title: str, mark_title: str, height: int = 300
) -> dict[str, Any]:
    """Bars of ``bar`` per ``x`` with a red tick at ``mark`` (a limit per bar)."""
    xenc = {
        "field": x,
        "type": "nominal",
        "title": None,
        "sort": None,
        "axis": {"labelAngle": -45, "labelOverlap": False},
    }
    tip = [
        {"field": x, "type": "nominal", "title": "id"},
        {"field": bar, "type": "quantitative", "title": bar_title, "format": ",.1f"},
        {"field": mark, "type": "quantitative", "title": mark_title, "format": ",.1f"},
    ]
    return {
        "height": height,
        "layer": [
            {
                "mark": {"type": "bar"},
                "encoding": {
                    "x": xenc,
                    "y": {"field": bar, "type": "quantitative", "title": y_title},
                    "tooltip": tip,
                },
            },
            {
                "mark": {"type": "tick", "color": LIMIT_COLOUR, "thickness": 3},
                "encoding": {
                    "x": xenc,
                    "y": {"field": mark, "type": "quantitative"},
                    "tooltip": tip,
                },
            },
        ],
    }


#: Width a chart is laid out for [px] (the main area at 1440 px; the SVG scales to its column).
CHART_PX = 960


def draw(data: pd.DataFrame, spec: dict[str, Any], key: str, width_px: float = CHART_PX) -> None:
    """Draw a spec over ``data`` across the column's width (times as epoch milliseconds): our
    line and bar specs as inline SVG drawn here (:mod:`dashboards.svgchart`, no chart library
    for the browser to load), anything else with Vega-Lite. ``width_px``: the column's width
    the chart is laid out for."""
    data = data.copy()
    for col in list(data.columns):
        if pd.api.types.is_datetime64_any_dtype(data[col]):
            ts = pd.to_datetime(data[col], utc=True)
            data[UTC_TEXT.format(col)] = ts.dt.strftime("%Y-%m-%d %H:%M:%S UTC")
            data[col] = epoch_ms(ts)
    if svgchart.supported(spec):
        # markdown with HTML allowed: st.html's sanitizer keeps no SVG
        st.markdown(svgchart.svg(data, spec, key, width_px), unsafe_allow_html=True)
        return
    st.vega_lite_chart(data, spec, width="stretch", key=key)


# ---- the floor map: an SVG grid ---------------------------------------------------------------

#: Colour scales as stops from low to high (ColorBrewer YlOrRd, RdYlGn, Blues, Reds;
#: colorbrewer2.org, the scales the plotly map used).
SCALES = {
    "YlOrRd": ["#ffffcc", "#fed976", "#fd8d3c", "#e31a1c", "#800026"],
    "RdYlGn": ["#d73027", "#fc8d59", "#fee08b", "#91cf60", "#1a9850"],
    "Blues": ["#eff3ff", "#bdd7e7", "#6baed6", "#3182bd", "#08519c"],
    "Reds": ["#fee5d9", "#fcae91", "#fb6a4a", "#de2d26", "#a50f15"],
}
MISSING_FILL = "#e0e0e0"
TILE_PX = 78
GAP_PX = 8


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def scale_colour(scale: str, share: float) -> str:
    """The colour at ``share`` (0..1) along a scale, linearly between its stops."""
    stops = SCALES[scale]
    x = min(max(share, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    a, b = _hex(stops[i]), _hex(stops[i + 1])
    r, g, bl = (round(a[k] + (b[k] - a[k]) * f) for k in range(3))
    return f"#{r:02x}{g:02x}{bl:02x}"


def text_colour(fill: str) -> str:
    """Black or white, whichever reads better on ``fill`` (WCAG relative luminance; the
    contrast crossover of black and white text lies near 0.18)."""

    def lin(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in _hex(fill))
    return "#000000" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.18 else "#ffffff"


def floor_svg(
    names: Sequence[str],
    cols: Sequence[int],
    rows: Sequence[int],
    values: Sequence[float | None],
    labels: Sequence[str],
    scale: str,
    legend: str,
    low: str,
    high: str,
    fills: Sequence[str | None] | None = None,
    legend_items: Sequence[tuple[str, str]] = (),
    tile_bands: Sequence[str | None] | None = None,
) -> str:
    """The racks of a hall on their grid as an SVG: each tile coloured by its value along
    ``scale`` (grey when missing), or by its own colour in ``fills`` (fixed bands: then the
    legend is ``legend_items``, label and colour, and ``tile_bands`` names each tile's band in
    ``data-band``), its name and value in black or white for contrast, a link to its Rack
    page, and a legend bar from ``low`` to ``high``."""
    v = pd.Series(list(values), dtype="float64")
    lo, hi = (float(v.min()), float(v.max())) if v.notna().any() else (0.0, 0.0)
    c0, r0 = min(cols), min(rows)
    width = (max(cols) - c0 + 1) * (TILE_PX + GAP_PX)
    height = (max(rows) - r0 + 1) * (TILE_PX + GAP_PX)
    parts = []
    for i, (name, c, r, val, label) in enumerate(zip(names, cols, rows, v, labels, strict=True)):
        if fills is not None:
            fill = fills[i] or MISSING_FILL
        else:
            fill = (
                MISSING_FILL
                if pd.isna(val)
                else scale_colour(scale, 0.5 if hi == lo else (val - lo) / (hi - lo))
            )
        ink = text_colour(fill)
        x, y = (c - c0) * (TILE_PX + GAP_PX), (r - r0) * (TILE_PX + GAP_PX)
        n, lab = html.escape(name), html.escape(label)
        band = tile_bands[i] if tile_bands is not None else None
        band_attr = f' data-band="{band}"' if band else ""
        parts.append(
            f'<a href="/rack?rack={n}" target="_self" style="text-decoration:none">'
            f'<g class="rack" data-rack="{n}"{band_attr}>'
            f"<title>{n}: {lab}</title>"
            f'<rect x="{x}" y="{y}" width="{TILE_PX}" height="{TILE_PX}" rx="4" fill="{fill}"'
            f' stroke="#444" stroke-width="1"/>'
            f'<text x="{x + TILE_PX / 2}" y="{y + 32}" text-anchor="middle" font-weight="bold"'
            f' font-size="14" fill="{ink}">{n}</text>'
            f'<text x="{x + TILE_PX / 2}" y="{y + 54}" text-anchor="middle" font-size="13"'
            f' fill="{ink}">{lab}</text></g></a>'
        )
    stops = "".join(
        f'<stop offset="{100 * k / (len(SCALES[scale]) - 1):.0f}%" stop-color="{c}"/>'
        for k, c in enumerate(SCALES[scale])
    )
    gid = f"grad-{scale}"
    lw = 260
    ly = height + 6
    if legend_items:
        keys = []
        for k, (text, colour) in enumerate(legend_items):
            x = k * 150
            keys.append(
                f'<rect x="{x}" y="{ly + 32}" width="18" height="14" fill="{colour}"'
                f' stroke="#444"/><text x="{x + 24}" y="{ly + 44}" font-size="12"'
                f' fill="currentColor">{html.escape(text)}</text>'
            )
        legend_svg = (
            f'<text x="0" y="{ly + 14}" font-size="13" fill="currentColor">'
            f"{html.escape(legend)}</text>" + "".join(keys)
        )
        width = max(width, 150 * len(legend_items))
        total_h = height + 60
        return (
            f'<svg class="dctwin-floor" xmlns="http://www.w3.org/2000/svg"'
            f' width="{max(width, 420)}" height="{total_h}"'
            f' viewBox="0 0 {max(width, 420)} {total_h}" role="img">'
            + "".join(parts)
            + legend_svg
            + "</svg>"
        )
    legend_svg = (
        f'<defs><linearGradient id="{gid}">{stops}</linearGradient></defs>'
        f'<text x="0" y="{ly + 14}" font-size="13" fill="currentColor">{html.escape(legend)}</text>'
        f'<text x="0" y="{ly + 44}" font-size="12" fill="currentColor">{html.escape(low)}</text>'
        f'<rect x="70" y="{ly + 32}" width="{lw}" height="14" fill="url(#{gid})" stroke="#444"/>'
        f'<text x="{80 + lw}" y="{ly + 44}" font-size="12" fill="currentColor">'
        f"{html.escape(high)}</text>"
    )
    total_h = height + 60
    return (
        f'<svg class="dctwin-floor" xmlns="http://www.w3.org/2000/svg" width="{max(width, 420)}"'
        f' height="{total_h}" viewBox="0 0 {max(width, 420)} {total_h}" role="img">'
        + "".join(parts)
        + legend_svg
        + "</svg>"
    )


# ---- the what-if report's figures (plotly JSON from the API) as Vega-Lite ---------------------

#: plotly's dash names as Vega-Lite stroke dashes [px on, px off].
DASHES = {"solid": [1, 0], "dash": [8, 4], "dot": [2, 3], "dashdot": [8, 3, 2, 3]}


def _array(v: Any) -> list[Any]:
    """A plotly JSON array: a list, or a typed array ``{"dtype", "bdata"}`` (base64)."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v or [])


def _title(layout: dict[str, Any], axis: str) -> str | None:
    t = layout.get(axis, {}).get("title")
    return t.get("text") if isinstance(t, dict) else t


def plotly_lines(fig: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A plotly figure of line traces (the what-if report's, served as JSON) as a frame
    ``x``, ``y``, ``name`` and a Vega-Lite spec drawing each trace in its own colour and dash,
    with the figure's title and axis titles."""
    rows, names, colours, dashes = [], [], [], []
    for tr in fig.get("data", []):
        name = tr.get("name") or f"trace {len(names) + 1}"
        line = tr.get("line", {})
        names.append(name)
        colours.append(line.get("color", "#888888"))
        dashes.append(DASHES.get(line.get("dash", "solid"), [1, 0]))
        rows += [
            {"x": x, "y": y, "name": name}
            for x, y in zip(_array(tr.get("x")), _array(tr.get("y")), strict=False)
        ]
    layout = fig.get("layout", {})
    x_title = _title(layout, "xaxis")
    y_title = _title(layout, "yaxis")
    title = layout.get("title", {})
    # the report draws on clock time (UTC) when it knows the recording's start
    on_time = layout.get("xaxis", {}).get("type") == "date"
    frame = pd.DataFrame(rows, columns=["x", "y", "name"])
    if on_time:
        frame["x"] = pd.to_datetime(frame["x"], utc=True)
    x_enc: dict[str, Any] = {"field": "x", "type": "quantitative", "title": x_title}
    if on_time:
        x_enc = {
            "field": "x",
            "type": "temporal",
            "title": x_title,
            "scale": {"type": "utc"},
            "axis": {"format": "%H:%M"},
        }
    spec = {
        "height": 300,
        "title": title.get("text") if isinstance(title, dict) else title,
        "mark": {"type": "line", "strokeWidth": 2},
        "encoding": {
            "x": x_enc,
            "y": {"field": "y", "type": "quantitative", "title": y_title, "scale": {"zero": False}},
            "color": {
                "field": "name",
                "type": "nominal",
                "title": None,
                "scale": {"domain": names, "range": colours},
                "legend": {"orient": "bottom"},
            },
            "strokeDash": {
                "field": "name",
                "type": "nominal",
                "scale": {"domain": names, "range": dashes},
                "legend": None,
            },
            "tooltip": [
                {"field": "name", "title": "run"},
                {"field": "x", "title": x_title or "x", "format": ".2f"}
                if not on_time
                else {"field": UTC_TEXT.format("x"), "title": x_title or "time"},
                {"field": "y", "title": y_title or "y", "format": ",.4~g"},
            ],
        },
    }
    return frame, spec
