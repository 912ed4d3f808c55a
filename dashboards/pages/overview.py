"""Overview: IT power, cooling load, headroom summary, active alerts, ingest health."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import ui

ui.page("Overview", "🏠")


def body() -> None:
    ov = ui.fetch("/api/v1/overview")
    if ov is None:
        return
    ui.freshness(ov["data_until"])
    c = st.columns(5)
    c[0].metric("IT power", ui.fmt(ov["it_power_kw"], "kW"))
    c[1].metric("GPU power", ui.fmt(ov["gpu_power_kw"], "kW"))
    cap = ov["cooling_capacity_kw"]
    used = (
        f"{100 * ov['cooling_load_kw'] / cap:.0f} % of {cap:,.0f} kW"
        if cap and ov["cooling_load_kw"] is not None
        else None
    )
    # st.metric's delta is for changes; these are context, so they go in a caption
    c[2].metric("Cooling load (CDUs)", ui.fmt(ov["cooling_load_kw"], "kW"))
    if used:
        c[2].caption(used)
    al = ov["alerts"]
    c[3].metric("Active alerts", al["active"] if al["enabled"] else "off")
    c[3].caption(f"{al['unacknowledged']} unacknowledged" if al["enabled"] else "no --rules")
    lag = max((v for v in ov["ingest"]["lag_s"].values() if v is not None), default=None)
    c[4].metric("Data age", ui.fmt(lag, "s", 0))
    c[4].caption(ui.plural(ov["gpus_reporting"], "GPU") + " reporting")

    left, right = st.columns([3, 2])
    with left:
        st.subheader("Headroom")
        if not ov["headroom"]:
            st.info("No headroom report yet: the service computes one every --detect-every s.")
        else:
            st.caption(f"report of {ui.ago(ov['headroom_computed_at'])}")
            df = pd.DataFrame(ov["headroom"])
            df["smallest headroom"] = [
                ui.fmt(v, u) for v, u in zip(df["min_headroom"], df["unit"], strict=True)
            ]
            # small tables as static HTML: the interactive grid is the slowest thing to boot
            st.table(
                df[
                    [
                        "kind",
                        "count",
                        "smallest headroom",
                        "min_id",
                        "breached_now",
                        "breach_within_horizon_p90",
                    ]
                ]
                .rename(
                    columns={
                        "min_id": "where",
                        "breached_now": "breached now",
                        "breach_within_horizon_p90": "breach within horizon (p90)",
                    }
                )
                .set_index("kind")
            )
            tight = pd.DataFrame(ov["tightest"])
            if not tight.empty:
                # bars drawn by the table itself: no chart library to load on the first page
                st.markdown("**Closest to their limits**")
                tight["limit used"] = 100 * (1 - tight["headroom_now"] / tight["limit"].abs())
                tight["headroom"] = [
                    ui.fmt(h, u) for h, u in zip(tight["headroom_now"], tight["unit"], strict=True)
                ]
                tight["limit"] = [
                    ui.fmt(v, u) for v, u in zip(tight["limit"], tight["unit"], strict=True)
                ]
                st.dataframe(
                    tight[["kind", "id", "quantity", "limit used", "headroom", "limit"]],
                    hide_index=True,
                    column_config={
                        "limit used": st.column_config.ProgressColumn(
                            "limit used [%]", min_value=0, max_value=100, format="%.0f %%"
                        )
                    },
                )
    with right:
        st.subheader("Active alerts")
        alerts = ui.fetch("/api/v1/alerts", history=0)
        if alerts is not None:
            if not alerts["enabled"]:
                st.info("Alerting is off: the service runs without --rules.")
            elif not alerts["active"]:
                st.success("No active alerts.")
            for a in ui.by_severity(alerts["active"]):
                ack = " · acknowledged" if a["acknowledged"] else ""
                st.markdown(
                    f"{ui.severity_badge(a['severity'])} `{a['rule']}` on {ui.alert_scope(a)}"
                    f" ({ui.plural(len(a['members']), 'member')}){ack}"
                )
        st.subheader("Ingest")
        ing = ov["ingest"]
        c1, c2, c3 = st.columns(3)
        c1.metric("messages received", ui.fmt(ing["received"], "", 0))
        c2.metric("stored", ui.fmt(ing["stored_messages"], "", 0))
        dead = sum(ing["dead_letters_stored"].values())
        c3.metric("dead letters", dead)
        rows = [
            {"kind": k, "newest sample": ui.ago(t), "age": ui.fmt(ing["lag_s"][k], "s", 0)}
            for k, t in ing["newest"].items()
        ]
        st.table(pd.DataFrame(rows).set_index("kind"))
        if ing["dead_letters_stored"]:
            reasons = ", ".join(
                f"{r}: {n:,}" for r, n in sorted(ing["dead_letters_stored"].items())
            )
            st.warning(f"dead letters by reason: {reasons}")


ui.live(body)
