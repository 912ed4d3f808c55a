"""The alert engine's data at its boundaries: observations in, notifications and silences out.

Every timestamp is an aware UTC ``datetime``; a naive one is refused.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

EntityKind = Literal[
    "gpu", "node", "rack", "pdu", "pdu_phase", "cdu", "loop", "link", "fleet", "site"
]
Severity = Literal["critical", "warning", "info"]
NotificationStatus = Literal["firing", "resolved"]
#: What an outbox row carries to a hook: a notification's status, or an acknowledgement.
EventKind = Literal["firing", "resolved", "acknowledge"]


def _aware_utc(ts: datetime) -> datetime:
    if ts.tzinfo is UTC:  # the usual case, millions a day: already what is asked
        return ts
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError("timestamp must be timezone-aware (UTC)")
    return ts.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_aware_utc)]

#: Prometheus data model, "Metric names and labels": label names match this; Alertmanager's
#: API v2 validates label and annotation names with the same rule
#: (prometheus/common model.LabelName.IsValid, legacy validation).
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@lru_cache(maxsize=4096)  # the same few dozen names, millions of observations per day
def label_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an Alertmanager label or annotation name; None when it can."""
    if not LABEL_NAME.fullmatch(name):
        hint = re.sub(r"[^a-zA-Z0-9_]", "_", name)
        hint = hint if LABEL_NAME.fullmatch(hint) else f"_{hint}"
        return (
            f"label name {name!r} is not valid: Alertmanager accepts only"
            f" [a-zA-Z_][a-zA-Z0-9_]* (try {hint!r})"
        )
    return None


@lru_cache(maxsize=4096)  # observations of one detector carry the same few name sets
def _names_problem(names: tuple[str, ...]) -> str | None:
    """Why some of ``names`` cannot be label names (each one's reason); None when all can."""
    problems = [p for p in map(label_name_problem, names) if p is not None]
    return "; ".join(problems) if problems else None


def _label_names(labels: dict[str, str]) -> dict[str, str]:
    problem = _names_problem(tuple(labels))
    if problem is not None:
        raise ValueError(problem)
    return labels


#: Labels whose names every receiver accepts (rule labels, observation labels).
LabelSet = Annotated[dict[str, str], AfterValidator(_label_names)]


def utc_iso(ts: datetime) -> str:
    """RFC 3339 with a ``Z``: ``2026-11-29T14:00:00.250000Z``."""
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Observation(BaseModel):
    """One value of one metric of one entity at one time: what detectors hand the engine.

    ``labels`` are free context (``fleet``, ``reason``, ``time_to_breach_s`` ...) carried into
    the notification's labels and the summary template (``{labels[reason]}``); their names
    become Alertmanager annotation names, so they follow :data:`LABEL_NAME`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str = Field(min_length=1, description="a name of twin.alerts.metrics.METRICS")
    entity_kind: EntityKind
    entity_id: str = Field(min_length=1, description="the id the site file gives the entity")
    value: float
    #: residual metrics: the absolute excess over the model that ``value`` (sigmas) stands
    #: for, in the quantity's unit (K); a residual rule's ``min_excess_k`` is checked on it
    excess: float | None = None
    ts: UtcDatetime
    labels: LabelSet = Field(default_factory=dict)


class GroupRef(BaseModel):
    """The ancestor (or the entity itself) that one notification stands for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    id: str


class Member(BaseModel):
    """One entity whose alert is part of a notification."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entity_kind: str
    entity_id: str
    value: float = Field(description="the latest value seen for this entity")
    since: UtcDatetime = Field(description="when its condition first held")


class Notification(BaseModel):
    """One page: a group of alerts of one rule, firing or resolved.

    ``dedup_key`` is deterministic (``dctwin/<site>/<rule>/<group kind>/<group id>``, a
    long one ending in a hash, :func:`twin.alerts.engine.dedup_key`): the
    firing and the resolve of one incident share it, and a re-send of the same
    (``dedup_key``, ``status``) is idempotent at every receiver; ``event_id`` tells the
    firing and the resolve of one incident (and of a later incident) apart, and each reminder
    (``repeat`` > 0: the same firing re-sent, which PagerDuty folds into the open incident and
    Alertmanager takes as the same alert re-sent).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: NotificationStatus
    dedup_key: str = Field(max_length=255)
    event_id: str = Field(description="stable per (dedup_key, status, starts_at)")
    site: str
    rule: str
    severity: Severity
    group: GroupRef
    members: list[Member]
    summary: str
    description: str
    starts_at: UtcDatetime
    ends_at: UtcDatetime | None = Field(default=None, description="set when resolved")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="stable for the incident: the rule's labels, group_kind, group_id, racks",
    )
    context: dict[str, str] = Field(
        default_factory=dict, description="observation labels its members share (may change)"
    )
    unit: str | None = Field(
        default=None, description="unit of the members' values and of the rule's threshold"
    )
    url: str | None = Field(
        default=None,
        description="the component's page in the console (serve --console-url), where the"
        " operator looks first; Alertmanager's generatorURL",
    )
    runbook_url: str | None = Field(default=None, description="the rule's runbook, if it gives one")
    repeat: int = Field(
        default=0,
        ge=0,
        description="a reminder of a firing incident (repeat_interval_s): 1, 2, ...; 0 for"
        " its first page and its resolve",
    )
    flapping: bool = Field(
        default=False, description="the incident is flapping (flap detection): no reminders"
    )


def event_id(dedup_key: str, status: str, starts_at: datetime, repeat: int = 0) -> str:
    """A short deterministic id for one event of one incident (``repeat``: its reminders)."""
    raw = f"{dedup_key}\x1f{status}\x1f{utc_iso(starts_at)}"
    if repeat:
        raw += f"\x1f{repeat}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class Silence(BaseModel):
    """Mutes notifications whose fields all match ``matchers`` from ``starts_at`` to ``ends_at``.

    Matcher keys: ``rule``, ``severity``, ``dedup_key``, ``group_kind``, ``group_id``,
    ``entity_id`` (matches members: a silenced member is left out of its group, and a group
    whose members are all silenced is not sent), or any label of the notification.
    """

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    matchers: dict[str, str] = Field(min_length=1)
    starts_at: UtcDatetime
    ends_at: UtcDatetime
    created_by: str = ""
    comment: str = ""

    def active(self, now: datetime) -> bool:
        return self.starts_at <= now < self.ends_at
