"""Rack: its nodes and GPUs, its PDU phases against their limits, its CDU loop."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

ui.page("Rack", "🗄️")

racks = ui.fetch("/api/v1/racks")
names = [r["name"] for r in racks["racks"]] if racks else []
wanted = st.query_params.get("rack") or st.session_state.get("rack")
if names:
    rack = st.selectbox(
        "Rack", names, index=names.index(wanted) if wanted in names else 0, key="rack_pick"
    )
    st.session_state["rack"] = rack
    st.query_params["rack"] = rack
else:
    rack = None


def body() -> None:
    if rack is None:
        return
    d = ui.fetch(f"/api/v1/racks/{rack}")
    if d is None:
        return
    s = d["rack"]
    ui.freshness(d.get("data_until"))
    st.caption(
        f"{s['hall']} / {s['row']} · grid ({s['grid_col']}, {s['grid_row']}) · fleet"
        f" {s['fleet'] or '–'} · CDU {s['cdu'] or 'none (air)'} · PDUs {', '.join(s['pdus'])}"
    )
    c = st.columns(5)
    c[0].metric("IT power", ui.fmt(s["power_kw"], "kW"))
    ui.stat(
        c[1],
        "Feed limit",
        ui.fmt(s["power_limit_kw"], "kW"),
        f"{ui.fmt(s['headroom_kw'], 'kW')} headroom",
    )
    ui.stat(
        c[2],
        "Hottest GPU",
        ui.fmt(s["gpu_temp_max_c"], "°C"),
        f"{ui.fmt(s['gpu_headroom_min_k'], 'K')} to slowdown",
    )
    c[3].metric("Inlet air", ui.fmt(s["inlet_temp_c"], "°C"))
    c[4].metric("Active alerts", s["alerts"])
    if s["alerts"]:
        with c[4]:
            ui.link("alerts", "see the alerts")

    st.subheader("Nodes and GPUs")
    rows = []
    for n in d["nodes"]:
        for g in n["gpus"]:
            rows.append({"node": n["name"], **g})
    gdf = pd.DataFrame(rows)
    if not gdf.empty:
        gdf["max_c"] = pd.to_numeric(gdf["temp_c"], errors="coerce") + pd.to_numeric(
            gdf["headroom_k"], errors="coerce"
        )
        st.caption("bars: GPU temperature; red ticks: its maximum operating temperature")
        spec = charts.bars_with_marks(
            "id", "temp_c", "max_c", "temperature [°C]", "GPU [°C]", "max operating [°C]"
        )
        charts.draw(gdf, spec, "rack_gpus")
    ndf = pd.DataFrame([{k: v for k, v in n.items() if k != "gpus"} for n in d["nodes"]])
    ui.table(
        ndf,
        {
            "power_w": "power [W]",
            "inlet_temp_c": "inlet [°C]",
            "outlet_temp_c": "outlet [°C]",
            "fan_speed_pct": "fans [%]",
        },
        missing_why="no reading from this node",
    )
    if not gdf.empty:
        ui.table(
            gdf.drop(columns=["max_c"]),
            {
                "power_w": "power [W]",
                "temp_c": "temp [°C]",
                "mem_temp_c": "HBM [°C]",
                "util_pct": "util [%]",
                "power_limit_w": "limit [W]",
                "headroom_k": "headroom [K]",
            },
            missing_why="no reading from this GPU",
        )

    st.subheader("PDU phases")
    pdf = pd.DataFrame(d["phases"])
    if not pdf.empty:
        st.caption("bars: current; red ticks: the 80 % derated limit")
        spec = charts.bars_with_marks(
            "id", "current_a", "limit_a", "current [A]", "current [A]", "derated limit [A]"
        )
        charts.draw(pdf, spec, "rack_phases")

    st.subheader("Cooling loop")
    cdu = d["cdu"]
    if cdu is None:
        st.info("Air-cooled: this rack has no CDU loop.")
    else:
        c = st.columns(5)
        c[0].metric("Supply", ui.fmt(cdu["supply_temp_c"], "°C"))
        ui.stat(
            c[1],
            "Return",
            ui.fmt(cdu["return_temp_c"], "°C"),
            f"{ui.fmt(cdu['return_headroom_k'], 'K')} to limit",
        )
        c[2].metric("Flow", ui.fmt(cdu["flow_lpm"], "L/min"))
        ui.stat(
            c[3],
            "Heat",
            ui.fmt(cdu["heat_kw"], "kW"),
            f"{ui.fmt(cdu['capacity_used_pct'], '%', 0)} of capacity",
        )
        running = sum(1 for p in cdu["pumps"] if p["running"])
        c[4].metric("Pumps running", f"{running} / {len(cdu['pumps'])}")
        st.caption(f"CDU {cdu['name']} serves racks {', '.join(cdu['racks'])}")
        ui.link("cooling", f"CDU {cdu['name']} on the Cooling page", cdu=cdu["name"])


ui.live(body)
