"""Alerts as a triage list: open alerts grouped per rule and rack, CDU or fleet, critical first,
then the soonest breach and the smallest margin (:mod:`dashboards.triage`); label filters;
acknowledge and silence beside each group (only when the console can write); silences;
history."""

from __future__ import annotations

import re

import pandas as pd
import streamlit as st

from dashboards import triage, ui
from dashboards.client import ApiError

ui.page("Alerts", "🚨")

SEVERITY_ICON = {"critical": "🔴", "warning": "🟠", "info": "🔵"}
#: Groups drawn as cards; past them a line says how many more the filters would show (an
#: operator reads the first screens of a list sorted by urgency, and every card costs time).
MAX_GROUPS = 20
#: The durations the silence beside a group offers [h].
SILENCE_HOURS = (1, 2, 4, 8, 24, 72)
#: Members named on a card (the rest are counted).
MEMBERS_SHOWN = 12
#: How to let the console write, said wherever a write would be offered.
HOW_TO_WRITE = (
    "Read-only console: acknowledging and silencing need the service's token. Start the demo"
    " with `dctwin demo --console-writes` (or the console with DCTWIN_CONSOLE_TOKEN set to the"
    " service's token); whoever opens the console can then use them."
)

api = ui.api()
WRITES = bool(api.token)
if not WRITES:
    st.info(HOW_TO_WRITE, icon="🔒")


def _key(text: str) -> str:
    """A widget key from a group's key (Streamlit marks its container with it)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


def _ack(group: triage.Group) -> None:
    done = []
    for a in group.unacknowledged:
        try:
            api.post(f"/api/v1/alerts/{a['dedup_key']}/ack", json={"by": "console", "comment": ""})
        except ApiError as e:
            st.session_state["alert_error"] = e
            return
        done.append(a["dedup_key"])
    st.session_state.setdefault("alert_msgs", []).append(f"Acknowledged {', '.join(done)}")


def _silence(group: triage.Group, hours: float) -> None:
    made = []
    for gid in group.group_ids:
        matchers = {"rule": group.rule, "group_id": gid}
        try:
            api.post(
                "/api/v1/silences",
                json={
                    "matchers": matchers,
                    "duration_s": hours * 3600,
                    "created_by": "console",
                    "comment": f"from the Alerts page: {group.rule} on {group.scope_id}",
                },
            )
        except ApiError as e:
            st.session_state["alert_error"] = e
            return
        made.append(gid)
    st.session_state.setdefault("alert_msgs", []).append(
        f"Silenced {group.rule} on {', '.join(made)} for {hours:g} h"
    )


def _end_silence(sid: str) -> None:
    try:
        api.delete(f"/api/v1/silences/{sid}")
    except ApiError as e:
        st.session_state["alert_error"] = e
    else:
        st.session_state.setdefault("alert_msgs", []).append(f"Ended silence {sid}")


def _value(g: triage.Group) -> str:
    """The worst member's current value against the rule's threshold."""
    w = g.worst
    if w is None:
        return "no current value"
    unit = g.unit
    digits = 0 if unit in ("pumps", "GPUs") else None  # counts are whole
    value = ui.fmt(triage.display_value(g.metric, w[1]), unit, digits)
    text = f"now **{value}** on {w[0]}"
    if g.threshold is not None and g.op:
        limit = ui.fmt(triage.display_value(g.metric, g.threshold), unit, digits)
        text += f" (fires at {g.op} {limit})"
    return text


def _card(g: triage.Group, silence_h: float) -> None:
    """One group: what, where, how many, for how long, how bad now; acknowledge and silence
    beside it (when the console can write). Few elements: a page lists dozens of them."""
    with st.container(border=True, key=f"group-{_key(g.key)}"):
        c1, c2 = st.columns([5, 1])
        members = g.members
        firing = g.firing_s()
        scope = f"{g.scope_kind} **{g.scope_id}**" if g.scope_kind != "site" else "the site"
        racks = sorted({r for a in g.alerts for r in a.get("racks") or []})
        where = ""
        if racks and g.scope_kind != "rack":
            where = f" · {'rack' if len(racks) == 1 else 'racks'} {', '.join(racks[:12])}"
            where += f" and {len(racks) - 12} more" if len(racks) > 12 else ""
        c1.markdown(
            f"{ui.severity_badge(g.severity)} `{g.rule}` on {scope}{where}"
            f" · {ui.plural(len(members), 'member')}"
            f" · firing for {ui.age_text(firing) if firing is not None else ui.MISSING}"
            f"  \n{_value(g)}"
        )
        summaries = sorted({a.get("summary") for a in g.alerts if a.get("summary")})
        shown = ", ".join(members[:MEMBERS_SHOWN])
        if len(members) > MEMBERS_SHOWN:
            shown += f" and {len(members) - MEMBERS_SHOWN} more"
        note = f"{summaries[0]} · " if summaries else ""
        c1.caption(f"{note}members: {shown} · {g.alerts[0]['dedup_key']}")
        with c2:
            if g.scope_kind == "CDU":
                ui.link("cooling", f"CDU {g.scope_id}", cdu=g.scope_id)
            for r in racks[:1] if g.scope_kind != "rack" else [g.scope_id]:
                ui.link("rack", f"rack {r}", rack=r)
        acked = [a for a in g.alerts if a.get("acknowledged")]
        if acked:
            who = sorted({a["acknowledged"]["acked_by"] for a in acked})
            c2.markdown(f"✅ Acknowledged by {', '.join(who)}")
        if not WRITES:
            return
        if g.unacknowledged:
            c2.button("Acknowledge", key=f"ack_{_key(g.key)}", on_click=_ack, args=(g,))
        c2.button(
            f"Silence {silence_h:g} h",
            key=f"silence_{_key(g.key)}",
            on_click=_silence,
            args=(g, silence_h),
            help=f"silence {g.rule} on {', '.join(g.group_ids)} for {silence_h:g} h",
        )


def _counts(active: list[dict]) -> None:
    counts = triage.severity_counts(active)
    parts = [f"{ui.severity_badge(s)} {n}" if n else f":gray[{s} 0]" for s, n in counts.items()]
    st.markdown("Open alerts by severity: " + " · ".join(parts))


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
    groups = triage.group_alerts(data["active"])
    st.subheader(
        f"Active: {ui.plural(len(groups), 'group')} of {ui.plural(len(data['active']), 'alert')}"
    )
    _counts(data["active"])
    if data["enabled"] and not data["active"]:
        st.success("No active alerts.")
    if groups:
        # the label filters and the silence length in popovers whose buttons say what is set:
        # their select boxes' code (about 20 files for the browser) loads when one opens
        f = st.columns(4)
        on = [k for k in ("alert_sev", "alert_rules", "alert_scopes") if st.session_state.get(k)]
        with f[0].popover(f"Filters ({len(on)} set)" if on else "Filters"):
            sev = st.multiselect(
                "severity",
                [s for s in triage.SEVERITIES if any(g.severity == s for g in groups)],
                key="alert_sev",
            )
            rules = st.multiselect("rule", sorted({g.rule for g in groups}), key="alert_rules")
            scopes = st.multiselect(
                "rack, CDU or fleet",
                sorted({f"{g.scope_kind} {g.scope_id}" for g in groups}),
                key="alert_scopes",
            )
        silence_h = 0.0
        if WRITES:
            with f[1].popover(f"Silence for {st.session_state.get('silence_hours', 2.0):g} h"):
                silence_h = st.selectbox(
                    "silence for [h]", SILENCE_HOURS, index=1, key="silence_hours"
                )
        shown = triage.filter_groups(groups, sev, rules, scopes)
        st.caption(
            "critical first, then the soonest breach and the smallest margin"
            + (
                f" · {len(shown)} of {len(groups)} groups match the filters"
                if len(shown) < len(groups)
                else ""
            )
        )
        for g in shown[:MAX_GROUPS]:
            _card(g, float(silence_h))
        if len(shown) > MAX_GROUPS:
            st.caption(f"{ui.plural(len(shown) - MAX_GROUPS, 'more group')}: narrow the filters")
    with st.expander("History"):
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
if WRITES:
    with st.popover("New silence by matchers"), st.form("silence", clear_on_submit=True):
        st.markdown("Matchers must all match; empty ones are left out.")
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
                k: v
                for k, v in (("rule", rule), ("group_id", group_id), ("entity_id", entity_id))
                if v
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
    if not sil["silences"]:
        st.caption("No silences.")
    for s in sil["silences"]:
        c1, c2 = st.columns([5, 1])
        state = "active" if s["active"] else "ended"
        c1.markdown(
            f"`{s['id'][:8]}` {s['matchers']} until {ui.md_time(s['ends_at'])} ({state}) by"
            f" {s['created_by']} {('· ' + s['comment']) if s['comment'] else ''}"
        )
        if s["active"] and WRITES:
            c2.button("End", key=f"end_{s['id']}", on_click=_end_silence, args=(s["id"],))
