"""Cooling: each CDU's supply and return, flow, capacity used and pumps."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards import ui

ui.page("Cooling", "💧")


def body() -> None:
    data = ui.fetch("/api/v1/cooling")
    if data is None:
        return
    if not data["cdus"]:
        st.info("No CDUs in the site model: the site is air-cooled.")
        return
    ui.freshness(data["data_until"])
    cdus = data["cdus"]
    wanted = st.query_params.get("cdu")  # deep link: ?cdu=cdu-1 shows that CDU
    if wanted and any(c["name"] == wanted for c in cdus):
        cdus = [c for c in cdus if c["name"] == wanted]
        st.caption(f"showing CDU {wanted} of {ui.plural(len(data['cdus']), 'CDU')}")
        ui.link("cooling", "all CDUs")
    elif wanted:
        st.warning(f"No CDU {wanted!r} in the site: showing all.")
    for cdu in cdus:
        st.subheader(f"{cdu['name']} ({cdu['model'] or 'CDU'}) · racks {', '.join(cdu['racks'])}")
        cols = st.columns(min(8, max(1, len(cdu["racks"]))))
        for k, r in enumerate(cdu["racks"][:8]):
            with cols[k]:
                ui.link("rack", f"rack {r}", rack=r)
        c = st.columns(6)
        c[0].metric("Supply", ui.fmt(cdu["supply_temp_c"], "°C"))
        ui.stat(
            c[1],
            "Return",
            ui.fmt(cdu["return_temp_c"], "°C"),
            f"limit {ui.fmt(cdu['return_limit_c'], '°C', 0)}",
        )
        ui.stat(
            c[2],
            "Flow",
            ui.fmt(cdu["flow_lpm"], "L/min"),
            f"max {ui.fmt(cdu['max_flow_lpm'], 'L/min', 0)}",
        )
        ui.stat(
            c[3],
            "Heat",
            ui.fmt(cdu["heat_kw"], "kW"),
            f"{ui.fmt(cdu['headroom_kw'], 'kW')} headroom",
        )
        ui.stat(
            c[4],
            "Capacity used",
            ui.fmt(cdu["capacity_used_pct"], "%", 0),
            f"of {ui.fmt(cdu['capacity_kw'], 'kW', 0)}",
        )
        running = sum(1 for p in cdu["pumps"] if p["running"])
        ui.stat(
            c[5],
            "Pumps running",
            f"{running} / {len(cdu['pumps'])}",
            None if running == len(cdu["pumps"]) else ":red[pump down]",
        )
        pumps = pd.DataFrame(cdu["pumps"]).rename(
            columns={"speed_pct": "speed [%]", "power_w": "power [W]"}
        )
        st.dataframe(pumps, hide_index=True)
    series = {}
    for q in ("supply_temp_c", "return_temp_c"):
        s = ui.fetch(
            "/api/v1/series", kind="cdu", quantity=q, ids=",".join(c["name"] for c in data["cdus"])
        )
        if s is None:
            return
        series[q] = s
    fig = go.Figure()
    for q, s in series.items():
        for item in s["series"]:
            fig.add_scatter(
                x=item["t"],
                y=item["value"],
                mode="lines",
                name=f"{item['id']} {q.replace('_temp_c', '')}",
            )
    fig.update_layout(
        title="Loop temperatures, last hour [°C]",
        height=340,
        margin={"t": 40, "b": 10},
        yaxis_title="°C",
        xaxis_title="UTC",
    )
    st.plotly_chart(fig, key="loop_temps")


ui.live(body)
