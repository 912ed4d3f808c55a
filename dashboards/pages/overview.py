"""Overview: IT power, cooling load, headroom summary, 24 h trends, active alerts, ingest
health."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, triage, ui

ui.page("Overview", "🏠")

#: The trends' window [h] (issue 15: the operator's day).
TREND_H = 24
#: Width of a trend, one of three columns of the main area at 1440 px [px].
TREND_PX = 330


def trends(ov: dict) -> None:
    """24 h of IT power, cooling load against capacity and the tightest limit per kind."""
    end = ov["data_until"]
    if not end:
        return
    t1 = pd.Timestamp(end) + pd.Timedelta(seconds=1)
    t0 = t1 - pd.Timedelta(hours=TREND_H)
    window = {"start": t0.isoformat(), "end": t1.isoformat(), "resolution": "1m"}
    cols = st.columns(3)
    power = ui.fetch("/api/v1/series", kind="node", quantity="power_w", agg="sum", **window)
    with cols[0]:
        st.markdown(f"**IT power, last {TREND_H} h**")
        if power is not None and power["series"]:
            s = power["series"][0]
            df = charts.complete_buckets(s["t"], s["value"], s.get("devices"))
            df["value"] = df["value"] / 1000.0
            charts.draw(df, charts.line_spec("IT power [kW]", df["t"]), "ov_power", TREND_PX)
        elif power is not None:
            st.caption("no complete minute of node power yet")
    cool = ui.fetch("/api/v1/series", kind="cdu", quantity="heat_kw", agg="sum", **window)
    with cols[1]:
        st.markdown(f"**Cooling load against capacity, last {TREND_H} h**")
        if cool is not None and cool["series"]:
            s = cool["series"][0]
            df = charts.complete_buckets(s["t"], s["value"], s.get("devices"))
            cap = ov["cooling_capacity_kw"]
            spec = charts.line_spec(
                "heat removed by the CDUs [kW]",
                df["t"],
                limit=cap,
                limit_label=f"CDU capacity {ui.fmt(cap, 'kW', 0)}",
            )
            charts.draw(df, spec, "ov_cooling", TREND_PX)
            if cap:
                st.caption(f"dashed: the CDUs' rated capacity, {ui.fmt(cap, 'kW', 0)}")
        elif cool is not None:
            st.caption("no complete minute of CDU heat yet")
    hist = ui.fetch("/api/v1/headroom/history", hours=TREND_H)
    with cols[2]:
        st.markdown(f"**Tightest limit per kind, last {TREND_H} h**")
        rows = [
            {"t": t, "value": v, "kind": k["kind"]}
            for k in (hist or {}).get("kinds", [])
            for t, v in zip(k["t"], k["used_pct"], strict=True)
        ]
        if rows:
            df = pd.DataFrame(rows)
            df["t"] = pd.to_datetime(df["t"], utc=True)
            spec = charts.line_spec(
                "limit used [%]",
                df["t"],
                color="kind",
                color_title="kind",
                limit=100.0,
                limit_label="limit (100 %)",
                y_format=".0f",
            )
            spec["layer"][0]["mark"]["point"] = len(df) < 200  # a few reports: show each one
            charts.draw(df, spec, "ov_headroom", TREND_PX)
        elif hist is not None:
            st.caption("no headroom report yet")


#: Alert groups listed on the Overview (the Alerts page lists them all).
ALERT_GROUPS = 8
#: The alert stat's colour per worst severity (Okabe-Ito vermillion, orange, blue).
SEVERITY_HEX = {"critical": "#D55E00", "warning": "#E69F00", "info": "#0072B2"}


def alert_stat(al: dict, active: list[dict]) -> None:
    """The number of active alerts in the colour of the worst severity among them, with the
    count per severity under it."""
    if not al["enabled"]:
        ui.metric(st, "Active alerts", "off")
        st.caption("no --rules")
        return
    worst = triage.worst_severity(active)
    colour = SEVERITY_HEX.get(worst or "", "inherit")
    counts = triage.severity_counts(active)
    st.html(
        f'<div class="dctwin-alert-stat" data-severity="{worst or "none"}">'
        '<div style="font-size:0.875rem">Active alerts</div>'
        f'<div class="value" style="font-size:2.25rem;line-height:1.4;color:{colour}">'
        f"{len(active):,}</div></div>"
    )
    per = " · ".join(f"{n} {s}" for s, n in counts.items())
    st.caption(f"{per} · {al['unacknowledged']} unacknowledged")


def closest(tight: pd.DataFrame) -> pd.DataFrame:
    """The tightest limits with their share used as the bands count it (a temperature above
    its reference, never a share of a Celsius value), worst first; headroom in its unit (K
    for a temperature), the limit in its own (°C)."""
    value = tight["limit"] - tight["headroom_now"]
    tight = tight.assign(
        **{
            "limit used": [
                ui.used_pct(v, lim, u)
                for v, lim, u in zip(value, tight["limit"], tight["unit"], strict=True)
            ]
        }
    )
    tight = tight.sort_values(["limit used", "headroom_now"], ascending=[False, True])
    tight["headroom"] = [
        ui.fmt(h, u) for h, u in zip(tight["headroom_now"], tight["unit"], strict=True)
    ]
    tight["limit"] = [
        ui.fmt(v, ui.limit_unit(u)) for v, u in zip(tight["limit"], tight["unit"], strict=True)
    ]
    return tight


def body() -> None:
    ov = ui.fetch("/api/v1/overview")
    if ov is None:
        return
    ui.freshness(ov["data_until"])
    c = st.columns(5)
    ui.metric(c[0], "IT power", ui.fmt(ov["it_power_kw"], "kW"))
    ui.metric(c[1], "GPU power", ui.fmt(ov["gpu_power_kw"], "kW"))
    cap = ov["cooling_capacity_kw"]
    used = (
        f"{100 * ov['cooling_load_kw'] / cap:.0f} % of {cap:,.0f} kW"
        if cap and ov["cooling_load_kw"] is not None
        else None
    )
    # a delta is for changes; these are context, so they go in a caption
    ui.metric(c[2], "Cooling load (CDUs)", ui.fmt(ov["cooling_load_kw"], "kW"))
    if used:
        c[2].caption(used)
    al = ov["alerts"]
    alerts = ui.fetch("/api/v1/alerts", history=0)
    with c[3]:
        alert_stat(al, (alerts or {}).get("active", []))
    lag = max((v for v in ov["ingest"]["lag_s"].values() if v is not None), default=None)
    ui.metric(c[4], "Data age", ui.fmt(lag, "s", 0))
    c[4].caption(ui.plural(ov["gpus_reporting"], "GPU") + " reporting")
    trends(ov)

    left, right = st.columns([3, 2])
    with left:
        st.subheader("Headroom")
        if not ov["headroom"]:
            st.info("No headroom report yet: the service computes one every --detect-every s.")
        else:
            st.caption(f"report of {ui.md_time(ov['headroom_computed_at'])}")
            df = pd.DataFrame(ov["headroom"])
            df["min_id"] = [ui.MISSING if v is None else v for v in df["min_id"]]
            df["smallest headroom"] = [
                ui.fmt(v, u) for v, u in zip(df["min_headroom"], df["unit"], strict=True)
            ]
            ui.table(
                df[
                    [
                        "kind",
                        "count",
                        "smallest headroom",
                        "min_id",
                        "breached_now",
                        "breach_within_horizon_p90",
                    ]
                ],
                {
                    "min_id": "where",
                    "breached_now": "breached now",
                    "breach_within_horizon_p90": "breach within horizon (p90)",
                },
            )
            tight = pd.DataFrame(ov["tightest"])
            if not tight.empty:
                # bars drawn by the table itself: no chart library to load for them
                st.markdown("**Closest to their limits** (the ten tightest, worst first)")
                tight = closest(tight)
                ui.table(
                    tight[["kind", "id", "quantity", "limit used", "headroom", "limit"]],
                    {"limit used": "limit used [%]"},
                    bars=("limit used",),
                    sort_key="overview_tight_sort",
                )
                st.caption(ui.bands_caption())
    with right:
        st.subheader("Active alerts")
        if alerts is not None:
            if not alerts["enabled"]:
                st.info("Alerting is off: the service runs without --rules.")
            elif not alerts["active"]:
                st.success("No active alerts.")
            groups = triage.group_alerts(alerts["active"])
            for g in groups[:ALERT_GROUPS]:
                acked = sum(1 for a in g.alerts if a.get("acknowledged"))
                ack = f" · {acked} acknowledged" if acked else ""
                scope = f"{g.scope_kind} **{g.scope_id}**"
                racks = sorted({r for a in g.alerts for r in a.get("racks") or []})
                if racks and g.scope_kind != "rack":
                    scope += f" · {'rack' if len(racks) == 1 else 'racks'} {', '.join(racks[:8])}"
                    scope += f" and {len(racks) - 8} more" if len(racks) > 8 else ""
                st.markdown(
                    f"{ui.severity_badge(g.severity)} `{g.rule}` on {scope}"
                    f" ({ui.plural(len(g.members), 'member')}){ack}"
                )
            if len(groups) > ALERT_GROUPS:
                st.caption(f"{ui.plural(len(groups) - ALERT_GROUPS, 'more group')}: see Alerts")
            if groups:
                ui.link("alerts", "all alerts, grouped, with acknowledge and silence")
        st.subheader("Ingest")
        ing = ov["ingest"]
        c1, c2, c3 = st.columns(3)
        ui.metric(c1, "messages received", ui.fmt(ing["received"], "", 0))
        ui.metric(c2, "stored", ui.fmt(ing["stored_messages"], "", 0))
        dead = sum(ing["dead_letters_stored"].values())
        ui.metric(c3, "dead letters", dead)
        rows = [
            {"kind": k, "newest sample": ui.ago(t), "age": ui.fmt(ing["lag_s"][k], "s", 0)}
            for k, t in ing["newest"].items()
        ]
        ui.table(pd.DataFrame(rows), missing_why="no sample of this kind yet")
        if ing["dead_letters_stored"]:
            reasons = ", ".join(
                f"{r}: {n:,}" for r, n in sorted(ing["dead_letters_stored"].items())
            )
            st.warning(f"dead letters by reason: {reasons}")


ui.live(body)
