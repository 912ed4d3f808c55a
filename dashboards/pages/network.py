"""Network: every link's traffic against its capacity."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

ui.page("Network", "🔗")

#: Links drawn in the bar chart (the busiest; the table below lists every one).
BARS = 40


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
    ui.metric(c[0], "Links", len(df))
    ui.metric(c[1], "Busiest", ui.fmt(df["utilization_pct"].max(), "%"))
    ui.metric(c[2], "Links with errors", int((df["errors"].fillna(0) > 0).sum()))
    st.markdown("**Link utilization** (the busier direction against capacity)")
    if len(df) > BARS:
        st.caption(f"the {BARS} busiest of {len(df):,} links; all in the table")
    spec = charts.bar_spec(
        "name",
        "utilization_pct",
        "busier direction / capacity [%]",
        limit=100.0,
        limit_label="capacity (100 %)",
        tooltip=(
            ("tx_gbps", "tx [Gb/s]", ",.2f"),
            ("rx_gbps", "rx [Gb/s]", ",.2f"),
            ("capacity_gbps", "capacity [Gb/s]", ",.0f"),
        ),
        height=320,
        sort="-y",
    )
    charts.draw(df.sort_values("utilization_pct", ascending=False).head(BARS), spec, "links")
    # worst first: the least headroom in Gb/s (the limit's own unit), then the most errors
    df = df.sort_values(
        ["headroom_gbps", "errors"], ascending=[True, False], na_position="last", kind="stable"
    )
    cols = ["name", "headroom_gbps", "utilization_pct", "errors"]
    df = df[cols + [c for c in df.columns if c not in cols]]
    ui.table(
        df,
        {
            "capacity_gbps": "capacity [Gb/s]",
            "tx_gbps": "tx [Gb/s]",
            "rx_gbps": "rx [Gb/s]",
            "utilization_pct": "utilization [%]",
            "headroom_gbps": "headroom [Gb/s]",
        },
        missing_why="no reading from this link yet",
        bars=("utilization_pct",),
        sort_key="network_sort",
    )


ui.live(body)
