"""Alerts as a triage list: the open incidents of ``/api/v1/alerts`` grouped per rule and the
rack, CDU or fleet they concern, worst first (pure functions; the pages draw them).

A group is one rule on one *scope*: the CDU of a CDU or loop alert, the fleet of a fleet alert,
the rack of a rack alert, and for a GPU, node, PDU phase or link alert the one rack it is in
(else its own group). Grouping reads only the labels the API returns (``rule``,
``group_kind``/``group_id``, ``racks``), so it is the same whether the engine sends one alert
per GPU or one incident per rack with its ``members``: both land in one group whose member
count is the members of its alerts together.

Order: critical first (then warning, info); within a severity the soonest breach first (an
alert that holds now counts as breached now, a forecast's value is its time to breach) and
then the smallest margin (the value of a headroom metric, in its unit), then the longest
firing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: Severity order, most urgent first (as Alertmanager and Grafana rank them).
SEVERITIES = ("critical", "warning", "info")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: The scope word of a group kind, for the page.
SCOPE_WORD = {"cdu": "CDU", "loop": "CDU", "fleet": "fleet", "rack": "rack"}
#: Unit of a rule's metric by the last part of its name (deploy/alert_rules.yaml's metrics);
#: a name ending in ``_s`` is seconds, ``_fraction`` a share (shown in %).
METRIC_UNITS = {
    "k_to_slowdown": "K",
    "k_to_return_limit": "K",
    "a_to_limit": "A",
    "kw_to_limit": "kW",
    "flow_lpm_to_limit": "L/min",
    "gbps_to_limit": "Gb/s",
    "residual_sigma": "σ",
    "r_k_per_w": "%",  # drift: relative to the fleet's median, shown in %
    "underused_gpus": "GPUs",
    "pumps_running": "pumps",
}


def metric_unit(metric: str | None) -> str:
    """The unit of a rule's metric, read off its name (empty when it has none)."""
    last = (metric or "").rsplit(".", 1)[-1]
    if last in METRIC_UNITS:
        return METRIC_UNITS[last]
    if last.endswith("_fraction"):
        return "%"
    if last.endswith("_s"):
        return "s"
    return ""


def display_value(metric: str | None, value: float) -> float:
    """A metric's value in the unit :func:`metric_unit` names (a share in percent)."""
    unit = metric_unit(metric)
    last = (metric or "").rsplit(".", 1)[-1]
    return (
        100.0 * value
        if unit == "%" and (last.endswith("_fraction") or last == "r_k_per_w")
        else value
    )


def scope_of(alert: dict[str, Any]) -> tuple[str, str]:
    """The rack, CDU or fleet an alert concerns: ``("rack", "a03")``, ``("CDU", "cdu-1")``."""
    kind, gid = alert.get("group_kind") or "", alert.get("group_id") or ""
    if kind in SCOPE_WORD:
        return SCOPE_WORD[kind], gid
    racks = alert.get("racks") or []
    if len(racks) == 1:
        return "rack", racks[0]
    return kind or "site", gid


def _since_s(ts: str | None, now: datetime) -> float | None:
    if not ts:
        return None
    t = datetime.fromisoformat(ts)
    return max((now - t).total_seconds(), 0.0)


@dataclass
class Group:
    """One rule on one scope: its alerts, members and the figures it is ordered by."""

    rule: str
    severity: str
    scope_kind: str
    scope_id: str
    alerts: list[dict[str, Any]] = field(default_factory=list)
    metric: str | None = None
    op: str | None = None
    threshold: float | None = None

    @property
    def members(self) -> list[str]:
        return sorted({m for a in self.alerts for m in a.get("members") or []})

    @property
    def values(self) -> dict[str, float]:
        """Each member's current value: the API's per-member ``values``, else each alert's
        worst ``value`` under its group id."""
        out: dict[str, float] = {}
        for a in self.alerts:
            per = a.get("values") or {}
            if not per and a.get("value") is not None:
                per = {a.get("group_id") or a["dedup_key"]: a["value"]}
            for k, v in per.items():
                if v is not None and math.isfinite(float(v)):
                    out[k] = float(v)
        return out

    @property
    def worst(self) -> tuple[str, float] | None:
        """The member whose value is furthest past the threshold, and its value."""
        vals = self.values
        if not vals:
            return None
        above = self.op in (">", ">=")
        k = max(vals, key=lambda m: vals[m]) if above else min(vals, key=lambda m: vals[m])
        return k, vals[k]

    @property
    def unit(self) -> str:
        return metric_unit(self.metric)

    @property
    def breach_in_s(self) -> float:
        """Seconds to the breach: a forecast's value, else 0 (the condition holds now)."""
        w = self.worst
        if self.metric and "time_to_breach" in self.metric and w is not None:
            return max(w[1], 0.0)
        return 0.0

    @property
    def margin(self) -> float:
        """The worst member's headroom, in the metric's unit (inf when not a headroom)."""
        w = self.worst
        if w is None or not (self.metric or "").startswith("headroom.") or self.unit == "s":
            return math.inf
        return w[1]

    def firing_s(self, now: datetime | None = None) -> float | None:
        """How long the group's oldest alert has been firing: from its start to ``now`` (the
        API's ``firing_for_s``, to the service's last evaluation, when ``now`` is not given)."""
        if now is None:
            given = [float(a["firing_for_s"]) for a in self.alerts if a.get("firing_for_s")]
            if given:
                return max(given)
        now = now or datetime.now(UTC)
        ages = [s for a in self.alerts if (s := _since_s(a.get("starts_at"), now)) is not None]
        return max(ages) if ages else None

    @property
    def unacknowledged(self) -> list[dict[str, Any]]:
        return [a for a in self.alerts if not a.get("acknowledged")]

    @property
    def group_ids(self) -> list[str]:
        """The alerts' own group ids (what a silence matches on, with the rule)."""
        return sorted({a.get("group_id") or "" for a in self.alerts})

    @property
    def key(self) -> str:
        return f"{self.rule}|{self.scope_kind}|{self.scope_id}"

    def sort_key(self, now: datetime | None = None) -> tuple[float, float, float, float, str]:
        return (
            SEVERITY_RANK.get(self.severity, len(SEVERITIES)),
            self.breach_in_s,
            self.margin,
            -(self.firing_s(now) or 0.0),
            self.key,
        )


def group_alerts(alerts: list[dict[str, Any]], now: datetime | None = None) -> list[Group]:
    """The open alerts grouped per rule and scope (module docstring), worst first."""
    groups: dict[tuple[str, str, str, str], Group] = {}
    for a in alerts:
        kind, sid = scope_of(a)
        sev = a.get("severity") or "info"
        g = groups.get((a["rule"], sev, kind, sid))
        if g is None:
            g = groups[(a["rule"], sev, kind, sid)] = Group(
                rule=a["rule"],
                severity=sev,
                scope_kind=kind,
                scope_id=sid,
                metric=a.get("metric"),
                op=a.get("op"),
                threshold=a.get("threshold"),
            )
        g.alerts.append(a)
    return sorted(groups.values(), key=lambda g: g.sort_key(now))


def severity_counts(alerts: list[dict[str, Any]]) -> dict[str, int]:
    """Open alerts per severity, every severity present (0 when none)."""
    out = dict.fromkeys(SEVERITIES, 0)
    for a in alerts:
        out[a.get("severity") or "info"] = out.get(a.get("severity") or "info", 0) + 1
    return out


def worst_severity(alerts: list[dict[str, Any]]) -> str | None:
    """The most urgent severity among ``alerts`` (None when there is none)."""
    present = [a.get("severity") or "info" for a in alerts]
    if not present:
        return None
    return min(present, key=lambda s: SEVERITY_RANK.get(s, len(SEVERITIES)))


def filter_groups(
    groups: list[Group],
    severities: list[str] | None = None,
    rules: list[str] | None = None,
    scopes: list[str] | None = None,
) -> list[Group]:
    """The groups whose severity, rule and scope ("rack a03") are among those chosen (an
    empty or None choice keeps every value)."""
    return [
        g
        for g in groups
        if (not severities or g.severity in severities)
        and (not rules or g.rule in rules)
        and (not scopes or f"{g.scope_kind} {g.scope_id}" in scopes)
    ]
