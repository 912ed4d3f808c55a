"""How the site view merges the shards' answers: pure functions of the answers' JSON bodies.

The rules, one per endpoint (each takes the bodies of the shards that answered, in the
shards' order):

- totals (power, cooling load and capacity, GPUs and nodes reporting, ingest counters,
  dead letters, store counts) are sums; a total no shard has is None;
- times: ``data_until`` and newest samples are the newest of any shard; ``computed_at`` of
  headroom and hot spots the oldest (the site's answer is as old as its oldest part);
- lists (racks, phases, CDUs, links, series, devices, fleets, hot spots, calibration
  classes and events, forecast entities) are concatenated in the shards' order;
- headroom rows and the overview's ``tightest`` are re-sorted tightest first (headroom now
  over the limit's size, as one service sorts them, nulls last);
- alerts are merged by ``dedup_key``: one incident per key, its earliest start, acknowledged
  if any shard holds the acknowledgement; history deduplicated on (at, key, status), newest
  first; the overview's alert counts are counted on the merged list;
- a series aggregated across devices (``agg=sum|min|max``) is combined per timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Body = dict[str, Any]

#: How many rows the overview's ``tightest`` lists (as twin/api/queries.py headroom_summary).
TIGHTEST = 10


def _sum(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _sum_dicts(dicts: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in (d or {}).items():
            out[k] = v if k not in out else (_sum([out[k], v]))
    return out


def _concat(bodies: list[Body], key: str) -> list[Any]:
    return [item for b in bodies for item in (b.get(key) or [])]


def names(bodies: list[Body], key: str = "site") -> str | None:
    """One name when every shard says the same, else the names joined with '+'."""
    seen: list[str] = []
    for b in bodies:
        v = b.get(key)
        if v is not None and v not in seen:
            seen.append(v)
    return "+".join(seen) if seen else None


def tightness(row: Body) -> tuple[int, float, str, str]:
    """The headroom sort key: headroom now over |limit|, nulls last, then kind and id."""
    h, lim = row.get("headroom_now"), row.get("limit")
    if h is None or not lim:
        return (1, 0.0, row.get("kind") or "", row.get("id") or "")
    return (0, h / abs(lim), row.get("kind") or "", row.get("id") or "")


def headroom(bodies: list[Body]) -> Body:
    rows = sorted(_concat(bodies, "rows"), key=tightness)
    return {
        "computed_at": _min(b.get("computed_at") for b in bodies),
        "data_until": _max(b.get("data_until") for b in bodies),
        "rows": rows,
    }


def _headroom_summary(bodies: list[Body]) -> list[Body]:
    by_kind: dict[str, Body] = {}
    for s in _concat(bodies, "headroom"):
        cur = by_kind.get(s["kind"])
        if cur is None:
            by_kind[s["kind"]] = dict(s)
            continue
        cur["count"] += s["count"]
        cur["breached_now"] += s["breached_now"]
        cur["breach_within_horizon_p90"] += s["breach_within_horizon_p90"]
        if s.get("min_headroom") is not None and (
            cur.get("min_headroom") is None or s["min_headroom"] < cur["min_headroom"]
        ):
            cur["min_headroom"], cur["min_id"] = s["min_headroom"], s["min_id"]
    return [by_kind[k] for k in sorted(by_kind)]


def alert_counts(alerts: Body) -> Body:
    """The overview's alert counts, on the merged (deduplicated) active alerts."""
    by_sev: dict[str, int] = {}
    for a in alerts["active"]:
        by_sev[a["severity"]] = by_sev.get(a["severity"], 0) + 1
    return {
        "enabled": alerts["enabled"],
        "active": len(alerts["active"]),
        "by_severity": by_sev,
        "unacknowledged": sum(1 for a in alerts["active"] if not a.get("acknowledged")),
    }


def _broker(values: list[Any]) -> bool | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return all(present)


def overview(bodies: list[Body], alerts: Body | None) -> Body:
    """The overview; ``alerts``: the merged /api/v1/alerts (None: counted per shard)."""
    ing = [b.get("ingest") or {} for b in bodies]
    kinds: list[str] = []
    for i in ing:
        kinds += [k for k in (i.get("newest") or {}) if k not in kinds]
    tightest = sorted(_concat(bodies, "tightest"), key=tightness)[:TIGHTEST]
    if alerts is not None:
        counts = alert_counts(alerts)
    else:
        per = [b.get("alerts") or {} for b in bodies]
        counts = {
            "enabled": any(a.get("enabled") for a in per),
            "active": sum(a.get("active", 0) for a in per),
            "by_severity": _sum_dicts(a.get("by_severity") for a in per),
            "unacknowledged": sum(a.get("unacknowledged", 0) for a in per),
        }
    return {
        "site": names(bodies),
        "data_until": _max(b.get("data_until") for b in bodies),
        "it_power_kw": _sum(b.get("it_power_kw") for b in bodies),
        "nodes_reporting": sum(b.get("nodes_reporting") or 0 for b in bodies),
        "gpus_reporting": sum(b.get("gpus_reporting") or 0 for b in bodies),
        "gpu_power_kw": _sum(b.get("gpu_power_kw") for b in bodies),
        "cooling_load_kw": _sum(b.get("cooling_load_kw") for b in bodies),
        "cooling_capacity_kw": _sum(b.get("cooling_capacity_kw") for b in bodies),
        "headroom_computed_at": _min(b.get("headroom_computed_at") for b in bodies),
        "headroom": _headroom_summary(bodies),
        "tightest": tightest,
        "alerts": counts,
        "ingest": {
            "received": _sum(i.get("received") for i in ing),
            "stored_messages": _sum(i.get("stored_messages") for i in ing),
            "duplicates": _sum(i.get("duplicates") for i in ing),
            "dead_letters_since_start": _sum_dicts(i.get("dead_letters_since_start") for i in ing),
            "dead_letters_stored": _sum_dicts(i.get("dead_letters_stored") for i in ing),
            # the newest sample of any shard; the lag of the shard that lags most
            "newest": {k: _max((i.get("newest") or {}).get(k) for i in ing) for k in kinds},
            "lag_s": {k: _max((i.get("lag_s") or {}).get(k) for i in ing) for k in kinds},
            "broker_connected": _broker([i.get("broker_connected") for i in ing]),
            "write_errors": _sum(i.get("write_errors") for i in ing),
        },
    }


def listing(key: str) -> Callable[[list[Body]], Body]:
    """``{data_until, <key>: [...]}`` answers (racks, power, cooling, network)."""

    def merge(bodies: list[Body]) -> Body:
        return {"data_until": _max(b.get("data_until") for b in bodies), key: _concat(bodies, key)}

    return merge


def _merge_alert(a: Body, b: Body) -> Body:
    out = dict(a)
    if b.get("starts_at") and (not a.get("starts_at") or b["starts_at"] < a["starts_at"]):
        out["starts_at"] = b["starts_at"]
    out["notified"] = bool(a.get("notified") or b.get("notified"))
    out["acknowledged"] = a.get("acknowledged") or b.get("acknowledged")
    out["summary"] = a.get("summary") or b.get("summary")
    out["flapping"] = bool(a.get("flapping") or b.get("flapping"))
    out["repeat"] = max(a.get("repeat") or 0, b.get("repeat") or 0)
    for key in ("members", "racks"):
        merged = list(a.get(key) or [])
        merged += [x for x in (b.get(key) or []) if x not in merged]
        out[key] = merged
    return out


def alerts(bodies: list[Body], history: int | None = None) -> Body:
    """Active alerts merged by ``dedup_key``; history deduplicated, newest first, at most
    ``history`` events (None: all the shards gave)."""
    rules: list[str] = []
    for b in bodies:
        rules += [r for r in b.get("rules") or [] if r not in rules]
    active: dict[str, Body] = {}
    for a in _concat(bodies, "active"):
        k = a["dedup_key"]
        active[k] = a if k not in active else _merge_alert(active[k], a)
    seen: set[tuple[Any, Any, Any]] = set()
    events: list[Body] = []
    for e in _concat(bodies, "history"):
        key = (e.get("at"), e.get("dedup_key"), e.get("status"))
        if key not in seen:
            seen.add(key)
            events.append(e)
    events.sort(key=lambda e: e.get("at") or "", reverse=True)
    if history is not None:
        events = events[:history]
    return {
        "enabled": any(b.get("enabled") for b in bodies),
        "rules": rules,
        "active": list(active.values()),
        "history": events,
    }


def silences(bodies: list[Body]) -> Body:
    seen: dict[str, Body] = {}
    dups = 0
    for s in _concat(bodies, "silences"):
        if s["id"] in seen:
            dups += 1
        else:
            seen[s["id"]] = s
    out = sorted(seen.values(), key=lambda s: s.get("starts_at") or "")
    return {"silences": out, "total": sum(b.get("total") or 0 for b in bodies) - dups}


def series(bodies: list[Body], agg: str | None) -> Body:
    """Series concatenated; with ``agg`` (sum, min, max) combined per timestamp."""
    first = bodies[0]
    out: Body = {
        **{k: first.get(k) for k in ("kind", "quantity", "unit", "resolution", "agg")},
        "start": _min(b.get("start") for b in bodies),
        "end": _max(b.get("end") for b in bodies),
    }
    items = _concat(bodies, "series")
    if agg is None or not items:
        out["points"] = sum(b.get("points") or 0 for b in bodies)
        out["series"] = items
        return out
    combine = {"sum": _sum, "min": _min, "max": _max}[agg]
    cols = [c for c in ("value", "min", "max") if all(c in it for it in items)]
    at: dict[Any, dict[str, list[Any]]] = {}
    for it in items:
        for j, t in enumerate(it["t"]):
            slot = at.setdefault(t, {c: [] for c in cols})
            for c in cols:
                slot[c].append(it[c][j])
    ts = sorted(at)
    item: Body = {"id": items[0]["id"], "t": ts}
    for c in cols:
        item[c] = [combine(at[t][c]) for t in ts]
    out["points"] = len(ts)
    out["series"] = [item]
    return out


def state(bodies: list[Body]) -> Body:
    first = bodies[0]
    return {
        "kind": first.get("kind"),
        "units": _first_per_key(b.get("units") for b in bodies),
        "newest": _max(b.get("newest") for b in bodies),
        "max_age_s": first.get("max_age_s"),
        "devices": _concat(bodies, "devices"),
    }


def _first_per_key(dicts: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in (d or {}).items():
            out.setdefault(k, v)
    return out


def fleets(bodies: list[Body]) -> Body:
    out = dict(bodies[0])
    out["site"] = names(bodies)
    out["fleets"] = _concat(bodies, "fleets")
    out["window_start"] = _min(b.get("window_start") for b in bodies)
    out["window_end"] = _max(b.get("window_end") for b in bodies)
    return out


def forecast(bodies: list[Body]) -> Body:
    out = dict(bodies[0])
    out["site"] = names(bodies)
    out["entities"] = _concat(bodies, "entities")
    out["nodes_without_data"] = _concat(bodies, "nodes_without_data")
    out["calibration_origins"] = _min(b.get("calibration_origins") for b in bodies)
    return out


def hotspots(bodies: list[Body]) -> Body:
    out = dict(bodies[0])
    out["computed_at"] = _min(b.get("computed_at") for b in bodies)
    out["data_until"] = _max(b.get("data_until") for b in bodies)
    out["hotspots"] = _concat(bodies, "hotspots")
    for k, v in bodies[0].items():
        if isinstance(v, dict):
            out[k] = _first_per_key(b.get(k) for b in bodies)
    return out


def calibration(bodies: list[Body]) -> Body:
    """The newest run of any shard; counts summed; the first expected fit the earliest; the
    note one line per shard that gives one (shards are in the answer's ``shards``)."""
    runs = [b["run"] for b in bodies if b.get("run")]
    notes = [b["note"] for b in bodies if b.get("note")]
    return {
        "run": max(runs, key=lambda r: r.get("fitted_at") or "") if runs else None,
        "runs": sum(b.get("runs") or 0 for b in bodies),
        "fits": sum(b.get("fits") or 0 for b in bodies),
        "first_fit_expected_at": _min(b.get("first_fit_expected_at") for b in bodies),
        "note": "; ".join(dict.fromkeys(notes)) if notes else "no shard has a calibration yet",
        "classes": _concat(bodies, "classes"),
        "events": _concat(bodies, "events"),
    }


def headroom_history(bodies: list[Body]) -> Body:
    """Per kind, the tightest share used across shards in each minute (shards' detection
    passes do not share timestamps: their reports are put on the minute they were computed)."""
    per_kind: dict[str, dict[str, float | None]] = {}
    for k in _concat(bodies, "kinds"):
        cur = per_kind.setdefault(k["kind"], {})
        for t, used in zip(k.get("t") or [], k.get("used_pct") or [], strict=False):
            minute = str(t)[:16]  # ISO 8601 to the minute: YYYY-MM-DDTHH:MM
            if used is not None and (cur.get(minute) is None or used > cur[minute]):  # type: ignore[operator]
                cur[minute] = used
            else:
                cur.setdefault(minute, None)
    kinds = [
        {
            "kind": kind,
            "t": [f"{m}:00Z" for m in sorted(pts)],
            "used_pct": [pts[m] for m in sorted(pts)],
        }
        for kind, pts in sorted(per_kind.items())
    ]
    return {"start": _min(b.get("start") for b in bodies), "kinds": kinds}


def site(bodies: list[Body]) -> Body:
    """The site: counts summed; ``site`` the first shard's model (each shard's model in
    ``sites``)."""
    return {
        "name": names(bodies, "name"),
        "counts": _sum_dicts(b.get("counts") for b in bodies),
        "site": bodies[0].get("site"),
        "sites": [b.get("site") for b in bodies],
    }


def status(bodies: list[Body], shard_names: list[str]) -> Body:
    ranges = [b["time_range"] for b in bodies if b.get("time_range")]
    by_kind: dict[str, dict[str, str]] = {}
    for b in bodies:
        for k, r in (b.get("time_range_by_kind") or {}).items():
            cur = by_kind.setdefault(k, dict(r))
            cur["start"] = min(cur.get("start", r.get("start")), r.get("start"))
            cur["end"] = max(cur.get("end", r.get("end")), r.get("end"))
    return {
        "db": ", ".join(f"{n}: {b.get('db')}" for n, b in zip(shard_names, bodies, strict=True)),
        "samples": _sum_dicts(b.get("samples") for b in bodies),
        "readings": _sum_dicts(b.get("readings") for b in bodies),
        "time_range": {
            "start": min(r["start"] for r in ranges),
            "end": max(r["end"] for r in ranges),
        }
        if ranges
        else None,
        "time_range_by_kind": by_kind,
        "messages": sum(b.get("messages") or 0 for b in bodies),
        "sources": sum(b.get("sources") or 0 for b in bodies),
        "seq_gaps": sum(b.get("seq_gaps") or 0 for b in bodies),
        "dead_letters": _sum_dicts(b.get("dead_letters") for b in bodies),
        "unknown_ids": _concat(bodies, "unknown_ids"),
        "unknown_ids_total": sum(b.get("unknown_ids_total") or 0 for b in bodies),
        "service": {n: b.get("service") for n, b in zip(shard_names, bodies, strict=True)},
    }
