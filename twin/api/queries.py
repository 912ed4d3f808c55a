"""The API's reads of the store, parameterized: no request value is ever pasted into SQL.

Table and column names come only from the wire contract's lists (:data:`KINDS`,
:data:`QUANTITIES`) and this module's constants, after the request's names were checked
against them. Every result is fetched whole (``fetchall`` or ``to_arrow_table``): DuckDB must
not be left with an unfinished result on a cursor.
"""

from __future__ import annotations

import itertools
import math
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from collectors.contract import KINDS, QUANTITIES
from twin.alerts.db import ensure_alert_tables
from twin.bands import TEMPERATURE_UNITS, bands
from twin.site import Site
from twin.store import Store
from twin.store.schema import ALERT_ACKS_DDL

#: Raw samples up to this span, 1-minute rollups up to ROLLUP_1H_OVER_S, 1-hour beyond. [s]
RAW_UP_TO_S = 2 * 3600.0
ROLLUP_1H_OVER_S = 2 * 86400.0

#: The store's DDL of ``alert_acks`` (the store creates it; kept here for the API's setup).
ACK_DDL = ALERT_ACKS_DDL


def _f(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def check_kind(kind: str) -> str:
    """``kind`` if the contract knows it, else ValueError naming the known ones."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


def check_quantity(kind: str, quantity: str) -> str:
    if quantity not in QUANTITIES[kind]:
        raise ValueError(
            f"unknown quantity {quantity!r} of kind {kind!r}; expected one of"
            f" {', '.join(QUANTITIES[kind])}"
        )
    return quantity


def pick_resolution(span_s: float) -> str:
    """Raw up to 2 h, 1-minute rollups up to 2 days, 1-hour rollups beyond."""
    if span_s <= RAW_UP_TO_S:
        return "raw"
    if span_s <= ROLLUP_1H_OVER_S:
        return "1m"
    return "1h"


def newest(db: Store, kind: str) -> datetime | None:
    return db.con.execute(f"SELECT max(ts) FROM {check_kind(kind)}").fetchall()[0][0]


def newest_all(db: Store) -> dict[str, datetime | None]:
    return {k: newest(db, k) for k in KINDS}


def unknown_ids(db: Store, kind: str, ids: list[str], site: Site | None) -> list[str]:
    """The ids of ``ids`` that name nothing: not in the site, not among the store's
    unknown ids, and (without a site) never seen in the store."""
    if not ids:
        return []
    if site is not None:
        left = [i for i in ids if not site.is_known(kind, i)]
        if not left:
            return []
        rows = db.con.execute(
            "SELECT id FROM unknown_ids WHERE kind = ? AND id IN (SELECT unnest(?))",
            [kind, left],
        ).fetchall()
        seen = {r[0] for r in rows}
        return [i for i in left if i not in seen]
    rows = db.con.execute(
        f"SELECT DISTINCT id FROM {check_kind(kind)} WHERE id IN (SELECT unnest(?))", [ids]
    ).fetchall()
    seen = {r[0] for r in rows}
    return [i for i in ids if i not in seen]


def latest(
    db: Store,
    kind: str,
    *,
    since: datetime,
    ids: list[str] | None = None,
    quantities: list[str] | None = None,
    id_filter: str | None = None,
) -> pa.Table:
    """Per device: the newest timestamp since ``since`` and each quantity's newest non-null
    value (DuckDB's ``arg_max`` skips NULLs). ``id_filter``: ``"whole"`` keeps ids without a
    ``/`` (a PDU or CDU as a whole), ``"parts"`` those with one (phases, breakers, pumps)."""
    check_kind(kind)
    cols = quantities or list(QUANTITIES[kind])
    for q in cols:
        check_quantity(kind, q)
    aggs = ", ".join(f"arg_max({q}, ts) AS {q}" for q in cols)
    where = "ts >= ?"
    params: list[Any] = [since]
    if ids is not None:
        where += " AND id IN (SELECT unnest(?))"
        params.append(ids)
    if id_filter == "whole":
        where += " AND NOT contains(id, '/')"
    elif id_filter == "parts":
        where += " AND contains(id, '/')"
    sql = (
        f"SELECT id, max(ts) AS ts, arg_max(source, ts) AS source, {aggs} FROM {kind}"
        f" WHERE {where} GROUP BY id ORDER BY id"
    )
    return db.con.sql(sql, params=params).to_arrow_table()


def latest_by_id(db: Store, kind: str, since: datetime, **kw: Any) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in latest(db, kind, since=since, **kw).to_pylist()}


def series_count(
    db: Store,
    kind: str,
    quantity: str,
    ids: list[str] | None,
    start: datetime,
    end: datetime,
    resolution: str,
    agg: str | None = None,
) -> int:
    table, tcol, vcol = _series_source(kind, quantity, resolution)
    sql, params = _series_where(tcol, vcol, ids, start, end)
    what = f"count(DISTINCT {tcol})" if agg else "count(*)"
    return int(db.con.execute(f"SELECT {what} FROM {table} WHERE {sql}", params).fetchall()[0][0])


#: Aggregates across devices of ``/api/v1/series?agg=``, to their SQL functions.
AGGREGATES = {"sum": "sum", "mean": "avg", "min": "min", "max": "max"}


def _series_source(kind: str, quantity: str, resolution: str) -> tuple[str, str, str]:
    check_quantity(check_kind(kind), quantity)
    if resolution == "raw":
        return kind, "ts", quantity
    if resolution not in ("1m", "1h"):
        raise ValueError(f"unknown resolution {resolution!r}; expected raw, 1m or 1h")
    return f"{kind}_{resolution}", "bucket", f"{quantity}_avg"


def _series_where(
    tcol: str, vcol: str, ids: list[str] | None, start: datetime, end: datetime
) -> tuple[str, list[Any]]:
    sql = f"{tcol} >= ? AND {tcol} < ? AND {vcol} IS NOT NULL"
    params: list[Any] = [start, end]
    if ids is not None:
        sql += " AND id IN (SELECT unnest(?))"
        params.append(ids)
    return sql, params


def series(
    db: Store,
    kind: str,
    quantity: str,
    ids: list[str] | None,
    start: datetime,
    end: datetime,
    resolution: str,
    agg: str | None = None,
    ordered: bool = True,
) -> pa.Table:
    """Columns ``ts``, ``id``, ``value`` (and ``min``, ``max`` for rollups), ordered by id and
    time, or (``ordered=False``: sorting millions of rows costs far more than reading them)
    in storage order; ``value`` is the raw sample or the bucket mean. With ``agg`` (a key of
    :data:`AGGREGATES`), one series (id = ``agg``) of that aggregate across the devices per
    rollup bucket (of the bucket means: ``sum`` is the site's mean power in the bucket) and
    ``devices``, how many devices the bucket holds (a partial first minute holds fewer)."""
    table, tcol, vcol = _series_source(kind, quantity, resolution)
    where, params = _series_where(tcol, vcol, ids, start, end)
    if agg is not None:
        if resolution == "raw":
            raise ValueError("agg= needs a rollup resolution (1m or 1h): devices poll apart")
        fn = AGGREGATES[agg]
        sql = (
            f"SELECT {tcol} AS ts, ? AS id, CAST({fn}({vcol}) AS DOUBLE) AS value,"
            f" CAST(count(*) AS BIGINT) AS devices FROM {table}"
            f" WHERE {where} GROUP BY {tcol} ORDER BY {tcol}"
        )
        return db.con.sql(sql, params=[agg, *params]).to_arrow_table()
    extra = "" if resolution == "raw" else f", {quantity}_min AS min, {quantity}_max AS max"
    sql = (
        f"SELECT {tcol} AS ts, id, CAST({vcol} AS DOUBLE) AS value{extra} FROM {table}"
        f" WHERE {where}{' ORDER BY id, ts' if ordered else ''}"
    )
    return db.con.sql(sql, params=params).to_arrow_table()


# ---- headroom --------------------------------------------------------------------------------

HEADROOM_COLS = (
    "kind, id, quantity, unit, limit_value, value_now, headroom_now, headroom_min_p50,"
    " headroom_min_p90, breach_in_s_p50, breach_in_s_p90, rack, cdu, basis"
)


_HEADROOM_NAMES = tuple(c.strip() for c in HEADROOM_COLS.split(","))


def _headroom_row(r: tuple[Any, ...]) -> dict[str, Any]:
    d = dict(zip(_HEADROOM_NAMES, r, strict=True))
    d["limit"] = d.pop("limit_value")
    for k in (
        "limit",
        "value_now",
        "headroom_now",
        "headroom_min_p50",
        "headroom_min_p90",
        "breach_in_s_p50",
        "breach_in_s_p90",
    ):
        d[k] = _f(d[k])
    return d


def headroom_latest(
    db: Store,
    kind: str | None = None,
    rack: str | None = None,
    cdu: str | None = None,
    computed_at: datetime | None = None,
) -> tuple[datetime | None, datetime | None, list[dict[str, Any]]]:
    """(computed_at, data_until, rows) of the newest stored headroom report (or of the one
    computed at ``computed_at``: several reads of one answer read the same report)."""
    if computed_at is None:
        head = db.con.execute(
            "SELECT computed_at, max(data_until) FROM headroom WHERE computed_at ="
            " (SELECT max(computed_at) FROM headroom) GROUP BY computed_at"
        ).fetchall()
    else:
        head = db.con.execute(
            "SELECT computed_at, max(data_until) FROM headroom WHERE computed_at = ?"
            " GROUP BY computed_at",
            [computed_at],
        ).fetchall()
    if not head:
        return None, None, []
    computed_at, data_until = head[0]
    where = "computed_at = ?"
    params: list[Any] = [computed_at]
    for col, value in (("kind", kind), ("rack", rack), ("cdu", cdu)):
        if value is not None:
            where += f" AND {col} = ?"
            params.append(value)
    rows = db.con.execute(
        f"SELECT {HEADROOM_COLS} FROM headroom WHERE {where} ORDER BY kind, id, quantity", params
    ).fetchall()
    return computed_at, data_until, [_headroom_row(r) for r in rows]


def _used_sql() -> tuple[str, list[Any]]:
    """SQL of a headroom row's share of its limit used [%], as ``twin.bands`` counts it (a
    temperature above the bands' reference, anything else against zero), and its parameters."""
    units = sorted(TEMPERATURE_UNITS)
    marks = ", ".join("?" for _ in units)
    sql = (
        f"100 * (1 - headroom_now / CASE WHEN unit IN ({marks})"
        " THEN nullif(limit_value - ?, 0) ELSE nullif(abs(limit_value), 0) END)"
    )
    return sql, [*units, bands().temp_ref_c]


def headroom_summary(db: Store) -> tuple[datetime | None, list[dict[str, Any]], list[dict]]:
    """Per kind of limit: count, smallest headroom now and where, breaches; and the ten limits
    closest to breach (the largest share of the limit used, as ``twin.bands`` counts it)."""
    latest_at = db.con.execute("SELECT max(computed_at) FROM headroom").fetchall()[0][0]
    if latest_at is None:
        return None, [], []
    rows = db.con.execute(
        "SELECT kind, any_value(unit), count(*), min(headroom_now), arg_min(id, headroom_now),"
        " count_if(headroom_now <= 0), count_if(breach_in_s_p90 IS NOT NULL)"
        " FROM headroom WHERE computed_at = ? GROUP BY kind ORDER BY kind",
        [latest_at],
    ).fetchall()
    summary = [
        {
            "kind": k,
            "unit": u,
            "count": int(n),
            "min_headroom": _f(m),
            "min_id": mid,
            "breached_now": int(b),
            "breach_within_horizon_p90": int(b90),
        }
        for k, u, n, m, mid, b, b90 in rows
    ]
    used, params = _used_sql()
    tight = db.con.execute(
        f"SELECT {HEADROOM_COLS} FROM headroom WHERE computed_at = ? AND headroom_now IS NOT NULL"
        f" ORDER BY {used} DESC NULLS LAST, kind, id LIMIT 10",
        [latest_at, *params],
    ).fetchall()
    return latest_at, summary, [_headroom_row(r) for r in tight]


def headroom_history(db: Store, since: datetime) -> list[dict[str, Any]]:
    """Per kind of limit, over the stored reports computed since ``since``: the time of each
    report and the share of its limit that the tightest limit of that kind used [%]
    (as ``twin.bands`` counts it, the ranking of :func:`headroom_summary`)."""
    used, params = _used_sql()
    rows = db.con.execute(
        f"SELECT kind, computed_at, max({used})"
        " FROM headroom WHERE computed_at >= ? AND headroom_now IS NOT NULL"
        " GROUP BY kind, computed_at ORDER BY kind, computed_at",
        [*params, since],
    ).fetchall()
    out: list[dict[str, Any]] = []
    for kind, grp in itertools.groupby(rows, key=lambda r: r[0]):
        g = list(grp)
        out.append({"kind": kind, "t": [r[1] for r in g], "used_pct": [_f(r[2]) for r in g]})
    return out


# ---- calibration -----------------------------------------------------------------------------


def calibration_status(
    db: Store, runs: list[dict[str, Any]], calibrator: Any | None
) -> tuple[int, datetime | None, str]:
    """Fits on live data, when the first is expected (None once there is one, or without a
    calibrating service) and the one line that says where the newest calibration stands."""
    from twin.calibrate.seed import hhmm, seed_note

    fits = sum(r["source"] == "fit" for r in runs)
    expected = None
    if fits == 0 and calibrator is not None:
        oldest, newest = db.con.execute("SELECT min(ts), max(ts) FROM gpu").fetchall()[0]
        span_s = 0.0 if newest is None else (newest - oldest).total_seconds()
        expected = calibrator.expected_first_fit_at(span_s)
    if not runs:
        if expected is None:
            note = "no calibration yet, and this service does not calibrate (no site, or off)"
        else:
            note = (
                f"no calibration yet: first fit expected at {hhmm(expected)}, once the store"
                " holds 10 minutes of GPU telemetry"
            )
    elif runs[0]["source"] == "seed":
        note = seed_note(runs[0], expected)
    else:
        note = f"fitted on live data at {hhmm(runs[0]['fitted_at'])}"
        if calibrator is not None and calibrator.next_pass_at is not None:
            note += f"; next refit expected at {hhmm(calibrator.next_pass_at)}"
    return fits, expected, note


def model_rule_status(db: Store, rules: Any | None) -> dict[str, Any] | None:
    """Whether the model-based rules of ``rules`` (residual, R drift, GPU temperature
    forecast: :data:`twin.alerts.metrics.MODEL_METRICS`) judge yet: only with the newest run
    fitted on this store's telemetry, and never a GPU whose fit was refused."""
    if rules is None:
        return None
    from twin.alerts.metrics import MODEL_METRICS

    names = [r.name for r in rules if r.metric in MODEL_METRICS]
    latest, fit = db.latest_calibration_run_id(), db.latest_fit_run_id()
    armed = fit is not None and fit == latest
    refused = earlier = 0
    if armed:
        assert fit is not None
        not_judged, by_earlier = db.gpu_fit_standing(fit)
        refused, earlier = len(not_judged), len(by_earlier)
    if not names:
        note = "the rule file has no model-based rule"
    elif armed:
        note = f"judged with calibration run {fit}, fitted on this site's telemetry"
        if earlier:
            note += (
                f"; {earlier} GPU(s) without a usable fit in it are judged by their newest"
                " usable fit on this site for the residual and R drift (the GPU temperature"
                " forecast skips them until a run fits them again)"
            )
        if refused:
            note += (
                f"; {refused} GPU(s) whose fit was refused and that have no earlier usable fit"
                " are not judged by the model"
            )
    elif latest is None:
        note = f"{', '.join(names)} wait for the first fit (no calibration yet)"
    else:
        note = (
            f"{', '.join(names)} wait for the first fit on this site's telemetry (run"
            f" {latest} is seeded from a recording: it serves headroom and forecasts, never"
            " such a page)"
        )
    return {
        "armed": armed,
        "run_id": fit if armed else None,
        "rules": names,
        "waiting": [] if armed else names,
        "gpus_not_judged": refused,
        "gpus_judged_by_earlier_fit": earlier,
        "note": note,
    }


def calibration_summary(
    db: Store, site: Site | None, calibrator: Any | None = None, rules: Any | None = None
) -> dict[str, Any]:
    """The newest run: per device class, parameter spread, fit quality and usable share;
    with ``calibrator`` (the service's scheduler), when the first fit on live data is due;
    with ``rules``, whether their model-based rules judge yet (:func:`model_rule_status`)."""
    runs = db.calibration_runs()
    fits, expected, note = calibration_status(db, runs, calibrator)
    head = {
        "fits": fits,
        "first_fit_expected_at": expected,
        "note": note,
        "model_rules": model_rule_status(db, rules),
    }
    if not runs:
        return {"run": None, "runs": 0, "classes": [], "events": [], **head}
    run = runs[0]
    run_id = run["run_id"]
    gpu_class: dict[str, str] = {}
    if site is not None:
        for n in site.nodes:
            for gid in (*n.gpu_ids(), *(n.gpu_uuids or ())):
                gpu_class[gid] = f"gpu:{n.gpu_model or n.spec.gpu}"
    stats = db.calibration_class_stats(run_id, gpu_class)
    params, usable, reasons, quality = (
        stats["params"],
        stats["usable"],
        stats["reasons"],
        stats["quality"],
    )
    events = db.calibration_events(run_id)
    classes: dict[str, dict[str, Any]] = {}

    def cls(c: str) -> dict[str, Any]:
        return classes.setdefault(
            c,
            {
                "device_class": c,
                "devices": 0,
                "usable_fraction": 0.0,
                "params": [],
                "quality": [],
                "unusable_reasons": {},
            },
        )

    for c, n, frac in usable:
        cls(c).update(devices=int(n), usable_fraction=_f(frac) or 0.0)
    for c, p, med, p10, p90, n in params:
        cls(c)["params"].append(
            {"param": p, "median": _f(med), "p10": _f(p10), "p90": _f(p90), "n": int(n)}
        )
    for c, reason, n in reasons:
        cls(c)["unusable_reasons"][reason or "unknown"] = int(n)
    for c, q, mae, cv, nmbe, mape, n in quality:
        cls(c)["quality"].append(
            {
                "quantity": q,
                "mae": _f(mae),
                "cv_rmse": _f(cv),
                "nmbe": _f(nmbe),
                "mape": _f(mape),
                "devices": int(n),
            }
        )
    return {
        "run": run,
        "runs": len(runs),
        "classes": [classes[c] for c in sorted(classes)],
        "events": events,
        **head,
    }


def calibration_quality(
    db: Store, site: Site | None
) -> list[tuple[str, str, float | None, float | None]]:
    """(device class, quantity, MAE, CV(RMSE)) of the newest run, for /metrics."""
    out = []
    for c in calibration_summary(db, site)["classes"]:
        for q in c["quality"]:
            out.append((c["device_class"], q["quantity"], q["mae"], q["cv_rmse"]))
    return out


# ---- alerts ----------------------------------------------------------------------------------


def acks(db: Store) -> list[tuple[str, datetime | None, datetime, str, str]]:
    return db.con.execute(
        "SELECT dedup_key, incident_start, acked_at, acked_by, comment FROM alert_acks"
        " ORDER BY acked_at"
    ).fetchall()


def ensure_tables(db: Store) -> None:
    """The API's setup: create ``alert_acks`` and the alert tables when the store lacks
    them (idempotent)."""
    db.con.execute(ACK_DDL).fetchall()
    ensure_alert_tables(db.con)


def insert_ack(
    db: Store,
    dedup_key: str,
    incident_start: datetime | None,
    acked_at: datetime,
    acked_by: str | None,
    comment: str | None,
) -> None:
    """Record an acknowledgement of the incident ``dedup_key`` that began at
    ``incident_start`` (the caller holds the transaction)."""
    db.con.execute(
        "INSERT INTO alert_acks VALUES (?, ?, ?, ?, ?)",
        [dedup_key, incident_start, acked_at, acked_by, comment],
    ).fetchall()


def ping(db: Store) -> None:
    """A trivial query: raises when the store does not answer."""
    db.con.execute("SELECT 1").fetchall()


def dead_letter_counts(db: Store) -> list[tuple[str, int]]:
    """(reason, dead letters kept) per reason, by reason."""
    return db.con.execute(
        "SELECT reason, count(*) FROM dead_letters GROUP BY reason ORDER BY reason"
    ).fetchall()


def latest_power_total(db: Store, kind: str, since: datetime) -> tuple[int, float | None]:
    """(devices, the sum of their newest ``power_w`` [W]) of the ``kind`` devices with a
    sample since ``since``; the sum is None without any."""
    n, total = db.con.execute(
        f"SELECT count(*), sum(p) FROM (SELECT arg_max(power_w, ts) AS p FROM"
        f" {check_kind(kind)} WHERE ts >= ? GROUP BY id)",
        [since],
    ).fetchall()[0]
    return int(n), total


def latest_cdu_heat_kw(db: Store, since: datetime) -> float | None:
    """The sum of the CDUs' newest ``heat_kw`` since ``since`` (the CDUs themselves, not
    their pumps); None without any."""
    s = db.con.execute(
        "SELECT sum(h) FROM (SELECT arg_max(heat_kw, ts) AS h FROM cdu WHERE ts >= ?"
        " AND NOT contains(id, '/') GROUP BY id)",
        [since],
    ).fetchall()[0][0]
    return _f(s)


def alert_history(db: Store, limit: int) -> list[dict[str, Any]]:
    """Firing and resolved notifications the engine made (whether or not hooks are set up),
    and acknowledge events from the outbox, newest first."""
    rows = db.con.execute(
        "SELECT dedup_key, status, event_id, created_at, payload FROM alert_history"
        " UNION ALL SELECT dedup_key, status, event_id, min(created_at), any_value(payload)"
        " FROM alert_outbox WHERE status = 'acknowledge' GROUP BY dedup_key, status, event_id"
        " ORDER BY 4 DESC LIMIT ?",
        [limit],
    ).fetchall()
    return [
        {"dedup_key": k, "status": s, "event_id": e, "at": at, "payload": p}
        for k, s, e, at, p in rows
    ]


# ---- site index ------------------------------------------------------------------------------


def since(ts: datetime | None, seconds: float) -> datetime | None:
    return None if ts is None else ts - timedelta(seconds=seconds)


def headroom_computed_at(db: Store) -> datetime | None:
    """When the newest stored headroom report was computed (None: none yet)."""
    return db.con.execute("SELECT max(computed_at) FROM headroom").fetchall()[0][0]


#: A Prometheus label value's escapes (exposition format: backslash, double quote, newline).
_LABEL_ESCAPED = "replace(replace(replace({}, '\\', '\\\\'), '\"', '\\\"'), chr(10), '\\n')"


def headroom_exposition(
    db: Store,
    computed_at: datetime,
    branches: list[tuple[str, str, str, float]],
) -> list[tuple[str, str]]:
    """Prometheus sample lines of the headroom report computed at ``computed_at``, written by
    DuckDB (a 25,000-GPU report is ~37,000 rows, ~150,000 samples: too many to write one by
    one in Python within a scrape).

    ``branches`` holds (family, value, unit, scale): for each, a line
    ``family{kind="..",id="..",quantity=".."} value*scale`` per row of that ``unit`` (every
    unit where ``unit`` is empty) whose value is finite; ``value`` is one of
    :data:`HEADROOM_VALUES`. Returns (family, lines) per family that has samples, the lines
    sorted by kind, id and quantity and joined by newlines."""
    if not branches:
        return []
    parts, params = [], []
    for family, value, unit, scale in branches:
        expr = HEADROOM_VALUES[value]
        parts.append(
            f"SELECT ? AS family, k, lab, ({expr}) * ? AS v FROM r"
            + (" WHERE unit = ?" if unit else "")
        )
        params += [family, scale] + ([unit] if unit else [])
    # each row's labels written (and escaped) once, its place in the order numbered once
    labels = (
        "'{kind=\"' || kind || '\",id=\"' || "
        + _LABEL_ESCAPED.format("id")
        + " || '\",quantity=\"' || quantity || '\"} '"
    )
    sql = (
        f"WITH r AS MATERIALIZED (SELECT row_number() OVER (ORDER BY kind, id, quantity) AS k,"
        f" {labels} AS lab, unit, limit_value, headroom_now, headroom_min_p90"
        " FROM headroom WHERE computed_at = ?), s AS ("
        + " UNION ALL ".join(parts)
        + ") SELECT family, string_agg(family || lab || CAST(v AS VARCHAR), chr(10) ORDER BY k)"
        " FROM s WHERE isfinite(v) GROUP BY family ORDER BY family"
    )
    return [(f, t) for f, t in db.con.execute(sql, [computed_at, *params]).fetchall()]


#: The values :func:`headroom_exposition` writes (SQL on the headroom table's columns).
HEADROOM_VALUES = {
    "headroom_now": "headroom_now",
    "headroom_min_p90": "headroom_min_p90",
    "limit": "limit_value",
    "ratio": "headroom_now / nullif(abs(limit_value), 0)",
}
