"""Calibration: fit quality per device class, unusable parameters, drifting devices, hot spots."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from dashboards import ui

ui.page("Calibration", "📐")


def body() -> None:
    cal = ui.fetch("/api/v1/calibration")
    if cal is None:
        return
    run = cal["run"]
    if run is None:
        st.info(cal["note"][:1].upper() + cal["note"][1:] + ".")
        return
    if run["source"] == "seed":
        st.info("Calibration " + cal["note"] + ".")
    st.caption(
        f"run {run['run_id']} of {cal['runs']} · fitted {ui.ago(run['fitted_at'])} on"
        f" {ui.ago(run['window_start'])} .. {ui.ago(run['window_end'])}, held out from"
        f" {ui.ago(run['holdout_start'])} · {run['gpus']} GPUs in {run['seconds']:.1f} s"
    )
    rows = []
    for c in cal["classes"]:
        for q in c["quality"]:
            unit = ui.unit_of(q["quantity"])
            rows.append(
                {
                    "class": c["device_class"],
                    "quantity": q["quantity"],
                    "MAE": ui.fmt(q["mae"], unit, 2),
                    "CV(RMSE) [%]": None if q["cv_rmse"] is None else 100 * q["cv_rmse"],
                    "NMBE [%]": None if q["nmbe"] is None else 100 * q["nmbe"],
                    "devices": q["devices"],
                }
            )
    st.subheader("Held-out fit quality per device class (medians)")
    qdf = pd.DataFrame(rows)
    if qdf.empty:
        st.info("No fit quality stored for this run.")
    else:
        fig = px.bar(
            qdf,
            x="class",
            y="CV(RMSE) [%]",
            color="quantity",
            barmode="group",
            title="CV(RMSE) per class and quantity [%]",
        )
        fig.update_layout(height=320, margin={"t": 40, "b": 10})
        st.plotly_chart(fig, key="cv_rmse")
        st.dataframe(qdf, hide_index=True)
    st.subheader("Parameters")
    prow = []
    for c in cal["classes"]:
        for p in c["params"]:
            prow.append({"class": c["device_class"], "usable": f"{c['usable_fraction']:.0%}", **p})
    st.dataframe(pd.DataFrame(prow), hide_index=True)
    reasons = {
        c["device_class"]: c["unusable_reasons"] for c in cal["classes"] if c["unusable_reasons"]
    }
    if reasons:
        with st.expander("Why some parameters are unusable"):
            st.json(reasons)
    st.subheader("Drifting devices")
    ev = pd.DataFrame(cal["events"])
    if ev.empty:
        st.success("No drift events in this run.")
    else:
        st.dataframe(ev, hide_index=True)
    hot = ui.fetch("/api/v1/hotspots")
    if hot is not None:
        st.subheader("Hot spots")
        hs = pd.DataFrame(hot["hotspots"])
        if hs.empty:
            st.success("No hot spots.")
        else:
            st.dataframe(
                hs[["kind", "id", "reason", "value", "reference", "excess", "detail"]],
                hide_index=True,
            )


ui.live(body)
