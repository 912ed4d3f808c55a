"""Power: site IT power over time, every PDU phase and breaker against its limit."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

ui.page("Power", "⚡")

# a segmented control, not a slider: 5 small files for the browser to load, not 12 with moment.js
hours = (
    st.segmented_control(
        "History", [1, 6, 24, 72], default=6, format_func=lambda h: f"{h} h", key="power_hours"
    )
    or 6  # clicking the chosen segment again clears it: back to the default
)

#: Phases drawn in the bar chart (the most loaded; the table below lists every one).
BARS = 40


def body() -> None:
    ov = ui.fetch("/api/v1/overview")
    if ov is None:
        return
    end = ov["data_until"]
    ui.freshness(end)
    if end:
        start = pd.Timestamp(end) - pd.Timedelta(hours=hours)
        s = ui.fetch(
            "/api/v1/series",
            kind="node",
            quantity="power_w",
            agg="sum",
            start=start.isoformat(),
            end=(pd.Timestamp(end) + pd.Timedelta(seconds=1)).isoformat(),
        )
        if s is not None and s["series"]:
            item = s["series"][0]
            df = charts.complete_buckets(item["t"], item["value"], item.get("devices"))
            df["value"] = df["value"] / 1000.0
            st.markdown(f"**Site IT power ({s['resolution']} means, complete buckets)**")
            spec = charts.line_spec("IT power [kW]", df["t"], height=280)
            charts.draw(df, spec, "site_power")
        elif s is not None:
            st.info("No rolled-up node power yet (rollups cover complete minutes).")
    data = ui.fetch("/api/v1/power")
    if data is None:
        return
    df = pd.DataFrame(data["phases"])
    if df.empty:
        st.info("No PDUs in the site model.")
        return
    df["used_pct"] = 100 * df["current_a"] / df["limit_a"]
    # worst first: the least headroom in amperes (the limit's own unit)
    df = df.sort_values(["headroom_a", "used_pct"], ascending=[True, False], na_position="last")
    cols = ["id", "headroom_a", "used_pct", "current_a", "limit_a"]
    df = df[cols + [c for c in df.columns if c not in cols]]
    st.subheader("PDU phases and breakers against 80 % of their rating")
    top = df.sort_values("used_pct", ascending=False).head(BARS)
    if len(df) > BARS:
        st.caption(f"the {BARS} most loaded of {len(df):,} phases and breakers; all in the table")
    spec = charts.bar_spec(
        "id",
        "used_pct",
        "derated limit used [%]",
        color="feed",
        color_title="feed",
        limit=100.0,
        limit_label="derated limit (100 %)",
        tooltip=(("current_a", "current [A]", ",.1f"), ("limit_a", "limit [A]", ",.1f")),
        height=340,
        sort="-y",
    )
    charts.draw(top, spec, "phases")
    ui.table(
        df,
        {
            "current_a": "current [A]",
            "voltage_v": "voltage [V]",
            "power_w": "power [W]",
            "rated_a": "rated [A]",
            "limit_a": "limit [A]",
            "headroom_a": "headroom [A]",
            "breach_in_s_p50": "breach in (p50) [s]",
            "used_pct": "limit used [%]",
        },
        missing_why="no reading, or (breach in) no breach forecast within the horizon",
        bars=("used_pct",),
        sort_key="power_sort",
    )
    st.caption(ui.bands_caption())


ui.live(body)
