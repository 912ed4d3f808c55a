"""Alerts and silences: /api/v1/alerts, acknowledging an incident, /api/v1/silences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import orjson
from fastapi import APIRouter, Query

from twin.alerts import Silence
from twin.api import models as m
from twin.api import queries
from twin.api.deps import (
    BAD,
    V1,
    WRITE,
    WRITER,
    Api,
    acks_of_open,
    as_utc,
    bad,
)

router = APIRouter(prefix=V1, tags=["alerts"])


@router.get("/alerts", response_model=m.AlertsResponse)
def alerts(
    api: Api,
    history: Annotated[int, Query(ge=0, le=5000, description="history events")] = 200,
) -> m.AlertsResponse:
    """Open incidents (with their acknowledgement) and the history of firing, resolved and
    acknowledge events, newest first (from the delivery outbox: events reach it when the
    service has at least one hook, acknowledgements always)."""
    db = api.ctx.db()
    active = api.active_alerts()
    acked = acks_of_open(db, active)
    rule_of = {r.name: r for r in api.ctx.engine.rules.rules} if api.ctx.engine is not None else {}
    out_active = [
        m.ActiveAlert(
            dedup_key=a["dedup_key"],
            rule=a["rule"],
            severity=a["severity"],
            group_kind=a["group"]["kind"],
            group_id=a["group"]["id"],
            notified=a["notified"],
            starts_at=as_utc(a["starts_at"]),
            members=a["members"],
            racks=a.get("racks", []),
            cdus=a.get("cdus", []),
            summary=a.get("summary"),
            paged_summary=a.get("paged_summary"),
            value=a.get("value"),
            unit=a.get("unit"),
            firing_for_s=a.get("firing_for_s"),
            evaluated_at=as_utc(a["evaluated_at"]) if a.get("evaluated_at") else None,
            runbook_url=a.get("runbook_url"),
            flapping=a.get("flapping", False),
            repeat=a.get("repeat", 0),
            acknowledged=acked.get(a["dedup_key"]),
            values=a.get("values", {}),
            metric=getattr(rule_of.get(a["rule"]), "metric", None),
            op=getattr(rule_of.get(a["rule"]), "op", None),
            threshold=getattr(rule_of.get(a["rule"]), "value", None),
        )
        for a in active
    ]
    events: list[m.AlertEvent] = []
    if history:
        for ev in queries.alert_history(db, history):
            if ev["status"] == "acknowledge":
                continue  # the ack table below has who and why
            try:
                p = orjson.loads(ev["payload"])
            except orjson.JSONDecodeError:
                p = {}
            events.append(
                m.AlertEvent(
                    at=ev["at"],
                    dedup_key=ev["dedup_key"],
                    status=ev["status"],
                    rule=p.get("rule"),
                    severity=p.get("severity"),
                    summary=p.get("summary"),
                    starts_at=p.get("starts_at"),
                    ends_at=p.get("ends_at"),
                )
            )
        for key, inc_start, at, by, comment in queries.acks(db):
            events.append(
                m.AlertEvent(
                    at=at,
                    dedup_key=key,
                    status="acknowledge",
                    rule=key.split("/")[2] if key.count("/") >= 4 else None,
                    severity=None,
                    summary=comment or None,
                    starts_at=inc_start,
                    ends_at=None,
                    by=by,
                )
            )
        events.sort(key=lambda e: e.at, reverse=True)
        events = events[:history]
    rules = [r.name for r in api.ctx.engine.rules.rules] if api.ctx.engine is not None else []
    return m.AlertsResponse(
        enabled=api.ctx.engine is not None, rules=rules, active=out_active, history=events
    )


@router.post(
    "/alerts/{dedup_key:path}/ack",
    response_model=m.AckResponse,
    responses={**BAD, **WRITE, 409: {"model": m.ErrorBody}},
    dependencies=WRITER,
)
def acknowledge(api: Api, dedup_key: str, body: m.AckRequest | None = None) -> m.AckResponse:
    """Acknowledge an open incident: recorded in the store and sent as an acknowledge
    event to the hooks that take one (PagerDuty, webhooks). ``dedup_key`` may be sent
    with its slashes as they are or URL-encoded."""
    if api.ctx.engine is None:
        raise bad("alerting is off: start `dctwin serve` with --rules FILE", 409)
    body = body or m.AckRequest()
    active = {a["dedup_key"]: a for a in api.active_alerts()}
    if dedup_key not in active:
        known = ", ".join(sorted(active)[:10]) or "none"
        raise bad(f"no open incident {dedup_key!r} (open: {known})", 404)
    now = datetime.now(UTC)
    db = api.ctx.db()
    with db.transaction():
        queries.insert_ack(
            db, dedup_key, as_utc(active[dedup_key]["starts_at"]), now, body.by, body.comment
        )
    rows = api.ctx.engine.acknowledge(dedup_key, now)
    return m.AckResponse(
        dedup_key=dedup_key,
        acknowledged=m.Ack(acked_at=now, acked_by=body.by, comment=body.comment),
        outbox_rows=rows,
    )


def _silence_out(s: Silence, now: datetime) -> m.SilenceOut:
    return m.SilenceOut(
        id=s.id or "",
        matchers=s.matchers,
        starts_at=s.starts_at,
        ends_at=s.ends_at,
        created_by=s.created_by,
        comment=s.comment,
        active=s.active(now),
    )


@router.get("/silences", response_model=m.SilencesResponse)
def list_silences(
    api: Api,
    active_only: Annotated[bool, Query(description="only those in force now")] = False,
    limit: Annotated[
        int, Query(ge=0, le=5000, description="most listed (the newest; total counts all)")
    ] = 500,
) -> m.SilencesResponse:
    """Silences kept in the store, oldest first: the newest ``limit`` of them, with the
    count of all in ``total``."""
    now = datetime.now(UTC)
    items = [s for s in api.silences().all() if not active_only or s.active(now)]
    shown = items[-limit:] if limit else []
    return m.SilencesResponse(silences=[_silence_out(s, now) for s in shown], total=len(items))


@router.post(
    "/silences",
    response_model=m.SilenceOut,
    status_code=201,
    responses={**BAD, **WRITE},
    dependencies=WRITER,
)
def add_silence(api: Api, body: m.SilenceRequest) -> m.SilenceOut:
    """Mute notifications whose fields match every matcher, until ``ends_at`` or for
    ``duration_s``."""
    now = datetime.now(UTC)
    starts = body.starts_at or now
    if starts.tzinfo is None:
        starts = starts.replace(tzinfo=UTC)
    ends = body.ends_at or starts + timedelta(seconds=body.duration_s or 0)
    if ends.tzinfo is None:
        ends = ends.replace(tzinfo=UTC)
    if ends <= starts or ends <= now:
        raise bad(f"ends_at {ends.isoformat()} must be after starts_at and now")
    s = api.silences().add(
        Silence(
            matchers=body.matchers,
            starts_at=starts,
            ends_at=ends,
            created_by=body.created_by,
            comment=body.comment,
        )
    )
    return _silence_out(s, now)


@router.delete(
    "/silences/{silence_id}",
    response_model=m.SilenceOut,
    responses={**BAD, **WRITE},
    dependencies=WRITER,
)
def end_silence(api: Api, silence_id: str) -> m.SilenceOut:
    """End a silence now (it stays listed, with its new end)."""
    sil = api.silences()
    if not any(s.id == silence_id for s in sil.all()):
        raise bad(f"no silence {silence_id!r}", 404)
    now = datetime.now(UTC)
    sil.expire(silence_id, now)
    s = next(s for s in sil.all() if s.id == silence_id)
    return _silence_out(s, now)
