"""Network: every link's traffic against its capacity."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from dashboards import ui

ui.page("Network", "🔗")


def body() -> None:
    data = ui.fetch("/api/v1/network")
    if data is None:
        return
    df = pd.DataFrame(data["links"])
    if df.empty:
        st.info("No links in the site model.")
        return
    ui.freshness(data["data_until"])
    c = st.columns(3)
    c[0].metric("Links", len(df))
    c[1].metric("Busiest", ui.fmt(df["utilization_pct"].max(), "%"))
    c[2].metric("Links with errors", int((df["errors"].fillna(0) > 0).sum()))
    fig = px.bar(
        df.sort_values("utilization_pct", ascending=False).head(80),
        x="name",
        y="utilization_pct",
        hover_data={"tx_gbps": ":.2f", "rx_gbps": ":.2f", "capacity_gbps": True},
        labels={"utilization_pct": "busier direction / capacity [%]", "name": ""},
        title="Link utilization",
    )
    fig.update_layout(height=340, margin={"t": 40, "b": 10})
    st.plotly_chart(fig, key="links")
    st.dataframe(
        df.rename(
            columns={
                "capacity_gbps": "capacity [Gb/s]",
                "tx_gbps": "tx [Gb/s]",
                "rx_gbps": "rx [Gb/s]",
                "utilization_pct": "utilization [%]",
                "headroom_gbps": "headroom [Gb/s]",
            }
        ),
        hide_index=True,
    )


ui.live(body)
