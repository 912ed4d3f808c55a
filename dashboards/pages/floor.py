"""Floor: the hall's racks on their grid, coloured by a chosen metric or headroom (an SVG map:
each tile links to its rack)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

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


def floor_map(df: pd.DataFrame, hall: str) -> str:
    """One hall's racks as an SVG grid coloured by the chosen metric."""
    label, unit, scale = METRICS[metric]
    values = [None if pd.isna(v) else float(v) for v in df[metric]]
    shown = [v for v in values if v is not None]
    digits = 0 if metric == "alerts" else 1
    title = f"{label} [{unit}]" if unit else label
    low = ui.fmt(min(shown), unit, digits) if shown else ui.MISSING
    high = ui.fmt(max(shown), unit, digits) if shown else ui.MISSING
    return charts.floor_svg(
        list(df["name"]),
        [int(c) for c in df["grid_col"]],
        [int(r) for r in df["grid_row"]],
        values,
        [ui.fmt(v, unit, digits) for v in values],
        scale,
        f"{title} (grey: no value)",
        low,
        high,
    )


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
        label = METRICS[metric][0]
        st.markdown(f"**{hall}: {label}**")
        st.markdown(floor_map(part, str(hall)), unsafe_allow_html=True)
    with st.expander("All racks as a table"):
        ui.table(
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
            {
                "power_kw": "power [kW]",
                "headroom_kw": "headroom [kW]",
                "gpu_temp_max_c": "hottest GPU [°C]",
                "gpu_headroom_min_k": "GPU headroom [K]",
                "pdu_headroom_min_a": "PDU headroom [A]",
                "inlet_temp_c": "inlet [°C]",
            },
            missing_why="no reading or no headroom report for this rack yet",
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
