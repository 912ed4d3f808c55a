"""Fleets: utilization, underused inference fleets with reclaimable GPUs and kW, forecasts."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from dashboards import ui

ui.page("Fleets", "📦")


def body() -> None:
    data = ui.fetch("/api/v1/fleets")
    if data is None:
        return
    df = pd.DataFrame(data["fleets"])
    # the window the figures really had: a fleet seen for 1 minute is judged on 1 minute
    # shortest and longest span by seconds (the texts, "20 min" and "3 h", do not sort)
    spans = sorted({(f["covered_s"], f["covered"]) for f in data["fleets"] if f.get("covered")})
    seen = [t for _, t in dict.fromkeys([spans[0], spans[-1]])] if spans else []
    window_h = f"{data['window_s'] / 3600:g} h"
    over = f"over {' to '.join(seen)} of data" if seen else "over no data"
    if seen and seen != [window_h]:
        over += f" (of a {window_h} window)"
    st.caption(
        f"inference fleets {over}, to {ui.ago(data['window_end'])};"
        f" flagged when SM activity p95 < {data['threshold']:.0%}, remaining GPUs at"
        f" {data['target_util']:.0%}"
    )
    if df.empty:
        st.info("The site has no inference fleets.")
    else:
        flagged = df[df["flagged"]]
        c = st.columns(3)
        c[0].metric("Underused fleets", f"{len(flagged)} / {len(df)}")
        c[1].metric("GPUs to reclaim", int(flagged["gpus_to_reclaim"].fillna(0).sum()))
        c[2].metric("Power freed", ui.fmt(float(flagged["kw_freed"].fillna(0).sum()), "kW"))
        df["activity p50 [%]"] = 100 * df["activity_p50"]
        df["activity p95 [%]"] = 100 * df["activity_p95"]
        fig = px.bar(
            df,
            x="fleet",
            y=["activity p50 [%]", "activity p95 [%]"],
            barmode="group",
            labels={"value": "SM activity [%]", "fleet": ""},
            title="Fleet activity",
        )
        fig.add_hline(y=100 * data["threshold"], line_dash="dash", line_color="red")
        fig.update_layout(height=320, margin={"t": 40, "b": 10})
        st.plotly_chart(fig, key="fleet_activity")
        st.dataframe(
            df[
                [
                    "fleet",
                    "gpus",
                    "gpus_reporting",
                    "activity p50 [%]",
                    "activity p95 [%]",
                    "gpus_needed",
                    "gpus_to_reclaim",
                    "gpu_power_mean_w",
                    "kw_freed",
                    "flagged",
                    "reason",
                ]
            ].rename(columns={"gpu_power_mean_w": "GPU power mean [W]", "kw_freed": "freed [kW]"}),
            hide_index=True,
        )
    fc = ui.fetch("/api/v1/forecast")
    if fc is None:
        return
    fleets = [e for e in fc["entities"] if e["entity"] == "fleet"]
    if fleets:
        fig = go.Figure()
        for e in fleets:
            p50 = [None if v is None else v / 1000 for v in e["p50_w"]]
            p90 = [None if v is None else v / 1000 for v in e["p90_w"]]
            fig.add_scatter(x=e["t"], y=p50, mode="lines", name=f"{e['id']} p50")
            fig.add_scatter(
                x=e["t"], y=p90, mode="lines", line={"dash": "dot"}, name=f"{e['id']} p90"
            )
        fig.update_layout(
            title="Load forecast per fleet [kW]",
            height=340,
            margin={"t": 40, "b": 10},
            yaxis_title="kW",
            xaxis_title="UTC",
        )
        st.plotly_chart(fig, key="fleet_forecast")


ui.live(body)
