"""What-if: run scenarios on a recorded bundle in the service and compare them with the
baseline (verdict, minimum headroom per component, first breach, energy, paths)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards import ui
from dashboards.client import ApiError

ui.page("What-if", "🧪")

api = ui.api()
index = ui.fetch("/api/v1")
if index is not None and not index["features"].get("whatif"):
    st.info("This service's API offers no what-if jobs (started without them).")
    st.stop()

KIND_LABEL = {
    "gpu": "GPU temperature",
    "pdu_phase": "PDU phase current",
    "rack": "rack power",
    "cdu_heat": "CDU heat vs capacity",
    "cdu_flow": "CDU flow needed vs flow",
    "loop": "loop return temperature",
    "link": "link traffic",
}
VERDICT_ICON = {"fits": "🟢", "fits with risks": "🟠", "does not fit": "🔴", "baseline": "⚪"}

listing = ui.fetch("/api/v1/whatif")
if listing is None:
    st.stop()

with st.form("run"):
    st.subheader("Run scenarios")
    c1, c2 = st.columns([1, 2])
    bundle = c1.selectbox("recording (bundle)", listing["bundles"])
    chosen = c2.multiselect("scenarios", listing["scenarios"], default=listing["scenarios"][:1])
    go_run = st.form_submit_button("Run", disabled=not api.token)
    if not api.token:
        st.caption("Running needs the service's token (DCTWIN_CONSOLE_TOKEN in the console).")
if go_run and bundle and chosen:
    try:
        job = api.post("/api/v1/whatif", json={"bundle": bundle, "scenarios": chosen})
        st.success(f"Job {job['job']} started: {', '.join(chosen)} on {bundle}")
    except ApiError as e:
        ui.error_box(e)


def jobs() -> None:
    data = ui.fetch("/api/v1/whatif")
    if data is None:
        return
    reports = data["reports"]
    if not reports:
        st.info("No what-if jobs yet: pick a recording and scenarios above.")
        return
    rows = [
        {
            "job": r["job"],
            "state": r["state"],
            "bundle": r["bundle"],
            "scenarios": ", ".join(r["scenarios"]),
            "verdicts": "; ".join(f"{k}: {v}" for k, v in r["verdicts"].items()),
            "started": ui.ago(r["created_at"]),
            "error": r["error"] or "",
        }
        for r in reports
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, use_container_width=True)
    done = [r["job"] for r in reports if r["state"] == "done"]
    if not done:
        return
    pick = st.selectbox("results of job", done)
    res = ui.fetch(f"/api/v1/whatif/{pick}")
    if res is None or not res.get("results"):
        return
    runs = res["results"]
    base, scen = runs[0], runs[1:]
    for r in scen:
        st.subheader(f"{VERDICT_ICON.get(r['verdict'], '')} {r['name']}: {r['verdict']}")
        st.caption(r["description"])
        for reason in r["reasons"]:
            st.markdown(f"- {reason}")
        b_kinds = {k["kind"]: k for k in base["kinds"]}
        table = [
            {
                "component": KIND_LABEL.get(k["kind"], k["kind"]),
                "worst": k["worst_id"],
                "min headroom, baseline": ui.fmt(
                    b_kinds.get(k["kind"], {}).get("worst_min_headroom"), k["unit"]
                ),
                "min headroom": ui.fmt(k["worst_min_headroom"], k["unit"]),
                "over the limit": f"{k['breaching']} of {k['components']}",
                "time over": f"{k['time_over_s'] / 60:.0f} min",
                "first breach": ui.ago(k["first_breach"]),
            }
            for k in r["kinds"]
        ]
        st.dataframe(pd.DataFrame(table), hide_index=True, use_container_width=True)
        c1, c2, c3 = st.columns(3)
        c1.metric(
            "IT energy",
            ui.fmt(r["it_energy_kwh"], "kWh", 0),
            delta=ui.fmt(r["it_energy_kwh"] - base["it_energy_kwh"], "kWh", 0),
        )
        c2.metric("heat to liquid", ui.fmt(r["liquid_heat_kwh"], "kWh", 0))
        c3.metric("alerts fired", sum(a["status"] == "firing" for a in r["alerts"]))
    fig = go.Figure()
    for r in runs:
        fig.add_trace(
            go.Scatter(
                x=r["series"]["t_h"], y=r["series"]["cdu_util_max"], name=r["name"], mode="lines"
            )
        )
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(
        title="worst CDU: heat / capacity",
        xaxis_title="hours into the recording",
        yaxis_title="fraction of capacity",
        height=350,
    )
    st.plotly_chart(fig, use_container_width=True)
    st.caption(f"Full report: {api.base_url}/api/v1/whatif/{pick}/report.html")


ui.live(jobs)
