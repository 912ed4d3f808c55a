"""Cooling: each CDU's supply and return, flow, capacity used and pumps."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

ui.page("Cooling", "💧")


def body() -> None:
    data = ui.fetch("/api/v1/cooling")
    if data is None:
        return
    if not data["cdus"]:
        st.info("No CDUs in the site model: the site is air-cooled.")
        return
    ui.freshness(data["data_until"])
    # worst first: the least heat headroom (kW, the capacity's own unit), then return headroom
    cdus = sorted(
        data["cdus"],
        key=lambda c: (
            c["headroom_kw"] if c["headroom_kw"] is not None else float("inf"),
            c["return_headroom_k"] if c["return_headroom_k"] is not None else float("inf"),
        ),
    )
    wanted = st.query_params.get("cdu")  # deep link: ?cdu=cdu-1 shows that CDU
    if wanted and any(c["name"] == wanted for c in cdus):
        cdus = [c for c in cdus if c["name"] == wanted]
        st.caption(f"showing CDU {wanted} of {ui.plural(len(data['cdus']), 'CDU')}")
        ui.link("cooling", "all CDUs")
    elif wanted:  # an unknown id is an error, never another CDU shown in its place
        st.error(
            f"No CDU {wanted!r} in the site: its CDUs are"
            f" {', '.join(c['name'] for c in data['cdus'])}. All of them are shown below.",
            icon="⚠️",
        )
    for cdu in cdus:
        st.subheader(f"{cdu['name']} ({cdu['model'] or 'CDU'}) · racks {', '.join(cdu['racks'])}")
        cols = st.columns(min(8, max(1, len(cdu["racks"]))))
        for k, r in enumerate(cdu["racks"][:8]):
            with cols[k]:
                ui.link("rack", f"rack {r}", rack=r)
        c = st.columns(6)
        ui.metric(c[0], "Supply", ui.fmt(cdu["supply_temp_c"], "°C"))
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
        ui.table(
            pd.DataFrame(cdu["pumps"]),
            {"speed_pct": "speed [%]", "power_w": "power [W]"},
            missing_why="no reading from this pump",
        )
    series = {}
    for q in ("supply_temp_c", "return_temp_c"):
        s = ui.fetch(
            "/api/v1/series",
            kind="cdu",
            quantity=q,
            ids=",".join(c["name"] for c in data["cdus"]),
            resolution="1m",  # minute means: a raw hour of every CDU is too many points to draw
        )
        if s is None:
            return
        series[q] = s
    rows = [
        {"t": t, "value": v, "CDU": item["id"], "side": q.replace("_temp_c", "")}
        for q, s in series.items()
        for item in s["series"]
        for t, v in zip(item["t"], item["value"], strict=True)
    ]
    if rows:
        df = pd.DataFrame(rows)
        df["t"] = pd.to_datetime(df["t"], utc=True)
        df["line"] = df["CDU"] + " " + df["side"]
        st.markdown("**Loop temperatures, last hour** (1-minute means)")
        spec = charts.line_spec(
            "temperature [°C]",
            df["t"],
            color="line",
            color_title="CDU and side",
            dash="side",
            height=320,
        )
        charts.draw(df, spec, "loop_temps")


ui.live(body)
