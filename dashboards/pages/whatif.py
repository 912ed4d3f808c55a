"""What-if: run scenarios on a recorded bundle in the service and compare them with the
baseline (verdict, minimum headroom per component, first breach, energy, paths)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui
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


def kind_row(k: dict, b: dict | None) -> dict[str, str]:
    """One kind of limit: its worst component, baseline against scenario."""
    return {
        "component": KIND_LABEL.get(k["kind"], k["kind"]),
        "worst": k["worst_id"],
        "min headroom, baseline": ui.fmt(None if b is None else b["worst_min_headroom"], k["unit"]),
        "min headroom": ui.fmt(k["worst_min_headroom"], k["unit"]),
        "over the limit": f"{k['breaching']} of {k['components']}",
        "longest over, one component": f"{k['time_over_s'] / 60:.0f} min",
        "component-minutes over": f"{k.get('component_over_s', 0.0) / 60:,.0f}",
        "first breach": ui.ago(k["first_breach"]),
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
    ui.table(pd.DataFrame(rows))
    done = [r["job"] for r in reports if r["state"] == "done"]
    if not done:
        return
    pick = st.selectbox("results of job", done)
    res = ui.fetch(f"/api/v1/whatif/{pick}")
    if res is None or not res.get("results"):
        return
    runs = res["results"]
    base, scen = runs[0], runs[1:]
    b_kinds = {k["kind"]: k for k in base["kinds"]}
    for r in scen:
        st.subheader(f"{VERDICT_ICON.get(r['verdict'], '')} {r['name']}: {r['verdict']}")
        st.caption(r["description"])
        for reason in r["reasons"]:
            st.markdown(f"- {reason}")
        ui.table(pd.DataFrame([kind_row(k, b_kinds.get(k["kind"])) for k in r["kinds"]]))
        c1, c2, c3, c4 = st.columns(4)
        ui.metric(
            c1,
            "IT energy",
            ui.fmt(r["it_energy_kwh"], "kWh", 0),
            delta=f"{r['it_energy_kwh'] - base['it_energy_kwh']:+,.0f} kWh against the baseline",
        )
        ui.metric(c2, "heat to liquid", ui.fmt(r["liquid_heat_kwh"], "kWh", 0))
        ui.metric(c3, "throttled GPU-hours", ui.fmt(r["throttled_gpu_s"] / 3600, "", 1))
        ui.metric(c4, "alerts fired", sum(a["status"] == "firing" for a in r["alerts"]))
        recorded = r.get("recorded_breaches") or base.get("recorded_breaches") or []
        if recorded:
            st.markdown("**Already breaching in the recording**")
            ui.table(pd.DataFrame(recorded))
        if r.get("changes"):
            st.markdown("**What the scenario changes**")
            ui.table(pd.DataFrame(r["changes"]))
    # the report's own figures (twin.replay.report.figures, served by the API): one per
    # quantity, each scenario in one colour throughout, the baseline dashed
    figs = ui.fetch(f"/api/v1/whatif/{pick}/figures")
    for f in figs or []:
        data, spec = charts.plotly_lines(f["figure"])
        charts.draw(data, spec, f"fig-{f['key']}")
    st.caption(f"Full report: {api.base_url}/api/v1/whatif/{pick}/report.html")


ui.live(jobs)
