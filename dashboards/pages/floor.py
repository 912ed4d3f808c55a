"""Floor: the hall's racks on their grid, coloured by a chosen metric or headroom."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards import ui

ui.page("Floor", "🗺️")

METRICS = {
    "power_kw": ("IT power", "kW", "YlOrRd"),
    "headroom_kw": ("Power headroom (feeds together)", "kW", "RdYlGn"),
    "gpu_temp_max_c": ("Hottest GPU", "°C", "YlOrRd"),
    "gpu_headroom_min_k": ("GPU headroom to slowdown", "K", "RdYlGn"),
    "pdu_headroom_min_a": ("PDU phase headroom", "A", "RdYlGn"),
    "inlet_temp_c": ("Inlet air", "°C", "YlOrRd"),
    "gpu_util_mean_pct": ("GPU utilization (mean)", "%", "Blues"),
    "alerts": ("Active alerts", "", "Reds"),
}

metric = st.selectbox(
    "Colour racks by",
    list(METRICS),
    format_func=lambda k: f"{METRICS[k][0]} [{METRICS[k][1]}]" if METRICS[k][1] else METRICS[k][0],
    key="floor_metric",
)


def floor_figure(df: pd.DataFrame, hall: str) -> go.Figure:
    label, unit, scale = METRICS[metric]
    values = df[metric]
    text = [
        f"<b>{n}</b><br>{ui.fmt(v, unit, 1) if pd.notna(v) else '–'}"
        for n, v in zip(df["name"], values, strict=True)
    ]
    fig = go.Figure(
        go.Scatter(
            x=df["grid_col"],
            y=df["grid_row"],
            mode="markers+text",
            text=text,
            textposition="middle center",
            textfont={"size": 11},
            customdata=df["name"],
            marker={
                "symbol": "square",
                "size": 62,
                "color": values.fillna(0) if bool(values.notna().any()) else None,
                "colorscale": scale,
                "showscale": bool(values.notna().any()),
                "colorbar": {"title": f"{label} [{unit}]" if unit else label},
                "line": {"width": 1, "color": "#444"},
            },
            hovertemplate="%{customdata}<extra></extra>",
        )
    )
    rows = sorted(df["grid_row"].unique())
    fig.update_layout(
        title=f"{hall}: {label}",
        height=max(260, 90 * len(rows) + 120),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        xaxis={"visible": False, "range": [df["grid_col"].min() - 0.7, df["grid_col"].max() + 0.7]},
        yaxis={"visible": False, "autorange": "reversed"},
        plot_bgcolor="#f4f4f4",
    )
    return fig


def body() -> None:
    data = ui.fetch("/api/v1/racks")
    if data is None:
        return
    df = pd.DataFrame(data["racks"])
    if df.empty:
        st.info("The site has no racks.")
        return
    ui.freshness(data["data_until"])
    for hall, part in df.groupby("hall", sort=False):
        st.plotly_chart(floor_figure(part, str(hall)), key=f"floor_{hall}")
    with st.expander("All racks as a table"):
        st.dataframe(
            df[
                [
                    "name",
                    "hall",
                    "row",
                    "fleet",
                    "power_kw",
                    "headroom_kw",
                    "gpu_temp_max_c",
                    "gpu_headroom_min_k",
                    "pdu_headroom_min_a",
                    "inlet_temp_c",
                    "alerts",
                ]
            ],
            hide_index=True,
        )
    st.session_state["floor_racks"] = list(df["name"])


ui.live(body)

racks = st.session_state.get("floor_racks", [])
if racks:
    c1, c2 = st.columns([3, 1])
    chosen = c1.selectbox("Rack", racks, key="floor_rack")
    if c2.button("Open rack", key="open_rack"):
        st.session_state["rack"] = chosen
        st.switch_page("pages/rack.py", query_params={"rack": chosen})
