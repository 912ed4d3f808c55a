"""Alerts: active incidents (acknowledge), silences (add, end), history."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import ui
from dashboards.client import ApiError

ui.page("Alerts", "🚨")

SEVERITY_ICON = {"critical": "🔴", "warning": "🟠", "info": "🔵"}

api = ui.api()
if not api.token:
    st.warning(
        "No DCTWIN_CONSOLE_TOKEN in the console's environment: acknowledging and silencing"
        " are refused by the API. Start the console with the service's token in"
        " DCTWIN_CONSOLE_TOKEN to enable them (whoever opens the console can then use them)."
    )


def _ack(key: str) -> None:
    try:
        api.post(f"/api/v1/alerts/{key}/ack", json={"by": "console", "comment": ""})
    except ApiError as e:
        st.session_state["alert_error"] = e
    else:
        st.session_state.setdefault("alert_msgs", []).append(f"Acknowledged {key}")


def _end_silence(sid: str) -> None:
    try:
        api.delete(f"/api/v1/silences/{sid}")
    except ApiError as e:
        st.session_state["alert_error"] = e
    else:
        st.session_state.setdefault("alert_msgs", []).append(f"Ended silence {sid}")


def active() -> None:
    # inside the fragment: a click on its buttons reruns only the fragment
    for msg in st.session_state.pop("alert_msgs", []):
        st.success(msg)
    if "alert_error" in st.session_state:
        ui.error_box(st.session_state.pop("alert_error"))
    data = ui.fetch("/api/v1/alerts", history=300)
    if data is None:
        return
    if not data["enabled"]:
        st.info("Alerting is off: the service runs without --rules.")
    st.subheader(f"Active ({len(data['active'])})")
    if data["enabled"] and not data["active"]:
        st.success("No active alerts.")
    for a in ui.by_severity(data["active"]):
        with st.container(border=True):
            c1, c2 = st.columns([5, 1])
            c1.markdown(
                f"{SEVERITY_ICON.get(a['severity'], '')} {ui.severity_badge(a['severity'])}"
                f" `{a['rule']}` on {ui.alert_scope(a)}"
                f" · since {ui.ago(a['starts_at'])}"
                f"{'' if a['notified'] else ' · not paged yet'}"
            )
            if a.get("summary"):
                c1.markdown(a["summary"])
            with c1:
                if a["group_kind"] == "cdu":
                    ui.link("cooling", f"CDU {a['group_id']}", cdu=a["group_id"])
                for r in (a.get("racks") or [])[:4]:
                    ui.link("rack", f"rack {r}", rack=r)
            c1.caption(
                f"{a['dedup_key']} · members: {', '.join(a['members'][:12])}"
                + (" …" if len(a["members"]) > 12 else "")
            )
            if a["acknowledged"]:
                k = a["acknowledged"]
                c2.markdown(f"✅ Acknowledged by {k['acked_by']}")
            else:
                c2.button(
                    "Acknowledge",
                    key=f"ack_{a['dedup_key']}",
                    on_click=_ack,
                    args=(a["dedup_key"],),
                )
    st.subheader("History")
    hist = pd.DataFrame(data["history"])
    if hist.empty:
        st.caption(
            "No events yet (firing and resolved events are kept when the service has"
            " a hook; acknowledgements always)."
        )
    else:
        ui.table(
            hist[["at", "status", "rule", "severity", "summary", "dedup_key", "by"]],
            missing_why="(by) the service itself, not a person",
        )


ui.live(active)

st.subheader("Silences")
with st.form("silence", clear_on_submit=True):
    st.markdown("**New silence** (matchers must all match; empty ones are left out)")
    c = st.columns(3)
    rule = c[0].text_input("rule")
    group_id = c[1].text_input("group_id (rack, CDU, PDU, fleet ...)")
    entity_id = c[2].text_input("entity_id (one GPU, phase ...)")
    c = st.columns(3)
    hours = c[0].number_input("duration [h]", min_value=0.1, max_value=720.0, value=2.0)
    who = c[1].text_input("created by", value="console")
    comment = c[2].text_input("comment")
    if st.form_submit_button("Add silence"):
        matchers = {
            k: v for k, v in (("rule", rule), ("group_id", group_id), ("entity_id", entity_id)) if v
        }
        try:
            api.post(
                "/api/v1/silences",
                json={
                    "matchers": matchers,
                    "duration_s": hours * 3600,
                    "created_by": who or "console",
                    "comment": comment,
                },
            )
        except ApiError as e:
            ui.error_box(e)
        else:
            st.success(f"Silenced {matchers} for {hours:g} h")

sil = ui.fetch("/api/v1/silences")
if sil is not None:
    for s in sil["silences"]:
        c1, c2 = st.columns([5, 1])
        state = "active" if s["active"] else "ended"
        c1.markdown(
            f"`{s['id'][:8]}` {s['matchers']} until {ui.ago(s['ends_at'])} ({state}) by"
            f" {s['created_by']} {('· ' + s['comment']) if s['comment'] else ''}"
        )
        if s["active"]:
            c2.button("End", key=f"end_{s['id']}", on_click=_end_silence, args=(s["id"],))
