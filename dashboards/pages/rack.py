"""Rack: its nodes and GPUs, its PDU phases against their limits, its CDU loop."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

ui.page("Rack", "🗄️")

racks = ui.fetch("/api/v1/racks")
names = [r["name"] for r in racks["racks"]] if racks else []
asked = st.query_params.get("rack")
wanted = asked or st.session_state.get("rack")
if names and asked and asked not in names and st.session_state.get("rack_pick") is None:
    # an unknown id is an error, never another rack shown in its place
    st.error(
        f"No rack {asked!r} in the site: the site's racks are {', '.join(names[:12])}"
        f"{f' and {len(names) - 12} more' if len(names) > 12 else ''}. Pick one below.",
        icon="⚠️",
    )
    wanted = None
if names:
    # the picker in a popover whose button names the rack shown: a select box's code (21 files
    # for the browser) loads when it opens, not with the page
    shown = st.session_state.get("rack_pick") or (wanted if wanted in names else None)
    with st.popover(f"Rack {shown}" if shown else "Choose a rack"):
        rack = st.selectbox(
            "Rack",
            names,
            index=names.index(wanted) if wanted in names else None,
            placeholder="choose a rack",
            key="rack_pick",
        )
    if rack is not None:
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
    # limits and headroom as the API has them now (never a temperature plus a stored headroom)
    hr = ui.fetch("/api/v1/headroom", rack=rack)
    rows = (hr or {}).get("rows", [])
    gpu_hr = {r["id"]: r for r in rows if r["kind"] == "gpu"}
    s = d["rack"]
    ui.freshness(d.get("data_until"))
    st.caption(
        f"{s['hall']} / {s['row']} · grid ({s['grid_col']}, {s['grid_row']}) · fleet"
        f" {s['fleet'] or '–'} · CDU {s['cdu'] or 'none (air)'} · PDUs {', '.join(s['pdus'])}"
    )
    c = st.columns(5)
    ui.metric(c[0], "IT power", ui.fmt(s["power_kw"], "kW"))
    ui.stat(
        c[1],
        "Feed limit",
        ui.fmt(s["power_limit_kw"], "kW"),
        f"{ui.fmt(s['headroom_kw'], 'kW')} headroom",
    )
    tight = min(gpu_hr.values(), key=lambda r: r["headroom_now"], default=None)
    ui.stat(
        c[2],
        "Hottest GPU",
        ui.fmt(s["gpu_temp_max_c"], "°C"),
        (
            f"{ui.fmt(tight['headroom_now'], 'K')} to slowdown ({tight['id']}, limit"
            f" {ui.fmt(tight['limit'], '°C')})"
            if tight is not None
            else "no headroom report yet"
        ),
    )
    ui.metric(c[3], "Inlet air", ui.fmt(s["inlet_temp_c"], "°C"))
    ui.metric(c[4], "Active alerts", s["alerts"])
    if s["alerts"]:
        with c[4]:
            ui.link("alerts", "see the alerts")

    st.subheader("Nodes and GPUs")
    gpus = []
    for n in d["nodes"]:
        for g in n["gpus"]:
            gpus.append({"node": n["name"], **g})
    gdf = pd.DataFrame(gpus)
    if not gdf.empty:
        # the tick is the limit the API's headroom report has for this GPU
        gdf["max_c"] = [gpu_hr[g]["limit"] if g in gpu_hr else None for g in gdf["id"]]
        gdf["headroom_k"] = [gpu_hr[g]["headroom_now"] if g in gpu_hr else None for g in gdf["id"]]
        gdf["limit used"] = [
            ui.used_pct(gpu_hr[g]["limit"] - gpu_hr[g]["headroom_now"], gpu_hr[g]["limit"], "K")
            if g in gpu_hr and gpu_hr[g]["headroom_now"] is not None
            else None
            for g in gdf["id"]
        ]
        gdf = gdf.sort_values("headroom_k", na_position="last", kind="stable")
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
        cols = ["id", "node", "headroom_k", "limit used", "temp_c", "max_c", "power_w"]
        cols += [c for c in gdf.columns if c not in cols and c not in ("index",)]
        ui.table(
            gdf[cols],
            {
                "power_w": "power [W]",
                "temp_c": "temp [°C]",
                "max_c": "max operating [°C]",
                "mem_temp_c": "HBM [°C]",
                "util_pct": "util [%]",
                "power_limit_w": "power limit [W]",
                "headroom_k": "headroom [K]",
                "limit used": "limit used [%]",
            },
            missing_why="no reading from this GPU",
            bars=("limit used",),
            sort_key="rack_gpu_sort",
        )

    st.subheader("PDU phases")
    pdf = pd.DataFrame(d["phases"])
    if not pdf.empty:
        pdf = pdf.sort_values("headroom_a", na_position="last", kind="stable")
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
        ui.metric(c[0], "Supply", ui.fmt(cdu["supply_temp_c"], "°C"))
        ui.stat(
            c[1],
            "Return",
            ui.fmt(cdu["return_temp_c"], "°C"),
            f"{ui.fmt(cdu['return_headroom_k'], 'K')} to limit",
        )
        ui.metric(c[2], "Flow", ui.fmt(cdu["flow_lpm"], "L/min"))
        ui.stat(
            c[3],
            "Heat",
            ui.fmt(cdu["heat_kw"], "kW"),
            f"{ui.fmt(cdu['capacity_used_pct'], '%', 0)} of capacity",
        )
        running = sum(1 for p in cdu["pumps"] if p["running"])
        ui.metric(c[4], "Pumps running", f"{running} / {len(cdu['pumps'])}")
        st.caption(f"CDU {cdu['name']} serves racks {', '.join(cdu['racks'])}")
        ui.link("cooling", f"CDU {cdu['name']} on the Cooling page", cdu=cdu["name"])


ui.live(body)
