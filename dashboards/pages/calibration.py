"""Calibration: fit quality per device class, unusable parameters, drifting devices, hot spots."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

ui.page("Calibration", "📐")


def body() -> None:
    cal = ui.fetch("/api/v1/calibration")
    if cal is None:
        return
    rules = cal.get("model_rules")
    if rules and rules["rules"]:  # which model-based alert rules judge, which wait
        text = "Model-based alert rules: " + rules["note"] + "."
        (st.success if rules["armed"] else st.warning)(text)
    run = cal["run"]
    if run is None:
        st.info(cal["note"][:1].upper() + cal["note"][1:] + ".")
        return
    if run["source"] == "seed":
        st.info("Calibration " + cal["note"] + ".")
    st.caption(
        f"run {run['run_id']} of {cal['runs']} · fitted {ui.md_time(run['fitted_at'])} on"
        f" {ui.md_time(run['window_start'])} .. {ui.md_time(run['window_end'])}, held out from"
        f" {ui.md_time(run['holdout_start'])} · {run['gpus']} GPUs in {run['seconds']:.1f} s"
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
        st.markdown("**CV(RMSE) per class and quantity**")
        spec = charts.bar_spec(
            "class",
            "CV(RMSE) [%]",
            "CV(RMSE) [%]",
            color="quantity",
            color_title="quantity",
            offset="quantity",
            height=300,
        )
        charts.draw(qdf.dropna(subset=["CV(RMSE) [%]"]), spec, "cv_rmse")
        ui.table(qdf, missing_why="not computed: too few held-out samples")
    st.subheader("Parameters")
    prow = []
    for c in cal["classes"]:
        for p in c["params"]:
            prow.append({"class": c["device_class"], "usable": f"{c['usable_fraction']:.0%}", **p})
    ui.table(pd.DataFrame(prow), missing_why="not fitted for this class")
    reasons = [
        {"class": c["device_class"], "reason": reason, "devices": n}
        for c in cal["classes"]
        for reason, n in sorted(c["unusable_reasons"].items(), key=lambda kv: -kv[1])
    ]
    if reasons:
        with st.expander("Why some parameters are unusable"):
            ui.table(pd.DataFrame(reasons))  # a table: no JSON viewer to load for it
    st.subheader("Drifting devices")
    ev = pd.DataFrame(cal["events"])
    if ev.empty:
        st.success("No drift events in this run.")
    else:
        ui.table(ev)
    hot = ui.fetch("/api/v1/hotspots")
    if hot is not None:
        st.subheader("Hot spots")
        hs = pd.DataFrame(hot["hotspots"])
        if hs.empty:
            st.success("No hot spots.")
        else:
            ui.table(
                hs[["kind", "id", "reason", "value", "reference", "excess", "detail"]],
                missing_why="not applicable to this reason",
            )


ui.live(body)
