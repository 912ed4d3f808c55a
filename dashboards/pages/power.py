"""Power: site IT power over time, every PDU phase and breaker against its limit."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from dashboards import ui

ui.page("Power", "⚡")

hours = st.select_slider("History", options=[1, 6, 24, 72], value=6, format_func=lambda h: f"{h} h")


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
            df = pd.DataFrame({"t": s["series"][0]["t"], "kW": s["series"][0]["value"]})
            df["kW"] = df["kW"] / 1000.0
            fig = px.line(df, x="t", y="kW", title=f"Site IT power ({s['resolution']} means) [kW]")
            fig.update_layout(height=300, margin={"t": 40, "b": 10}, xaxis_title="UTC")
            st.plotly_chart(fig, key="site_power")
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
    st.subheader("PDU phases and breakers against 80 % of their rating")
    fig = px.bar(
        df.sort_values("used_pct", ascending=False).head(60),
        x="id",
        y="used_pct",
        color="feed",
        labels={"used_pct": "derated limit used [%]", "id": ""},
        hover_data={"current_a": ":.1f", "limit_a": ":.1f"},
    )
    fig.add_hline(y=100, line_dash="dash", line_color="red")
    fig.update_layout(height=360, margin={"t": 20, "b": 10})
    st.plotly_chart(fig, key="phases")
    st.dataframe(
        df.rename(
            columns={
                "current_a": "current [A]",
                "voltage_v": "voltage [V]",
                "power_w": "power [W]",
                "rated_a": "rated [A]",
                "limit_a": "limit [A]",
                "headroom_a": "headroom [A]",
                "breach_in_s_p50": "breach in (p50) [s]",
                "used_pct": "used [%]",
            }
        ),
        hide_index=True,
    )


ui.live(body)
