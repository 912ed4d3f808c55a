"""The telemetry: /api/v1/state/{kind}, /api/v1/series."""

from __future__ import annotations

import contextlib
import io
import itertools
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
import pyarrow as pa
from fastapi import APIRouter, Path, Query, Request, Response

from collectors.contract import KINDS, QUANTITIES
from twin.api import models as m
from twin.api import queries
from twin.api.deps import (
    ARROW_STREAM,
    BAD,
    BUSY,
    V1,
    Api,
    ApiState,
    bad,
    parse_ids,
    parse_time,
)

router = APIRouter(prefix=V1, tags=["telemetry"])

#: Most points a JSON series answer carries; beyond, ask for Arrow or a narrower query.
MAX_JSON_POINTS = 250_000
#: Most points any series answer carries (Arrow included).
MAX_POINTS = 20_000_000
#: A series over a longer range than this [s], or of more points than LONG_SERIES_POINTS,
#: takes a busy slot (429 when none is free).
LONG_SERIES_S = 2 * 3600.0
LONG_SERIES_POINTS = 100_000


@router.get("/state/{kind}", response_model=m.StateResponse, responses=BAD)
def device_state(
    api: Api,
    kind: Annotated[str, Path(description=f"one of {', '.join(KINDS)}")],
    ids: Annotated[str | None, Query(description="comma-separated device ids")] = None,
    max_age_s: Annotated[
        float, Query(gt=0, le=30 * 86400, description="leave out devices silent longer")
    ] = 300.0,
) -> m.StateResponse:
    """The latest sample of each device of ``kind`` (each quantity: its newest value).
    ``ids=`` holds about 500 ids before the URL is too long; POST for up to 20000."""
    return _state(api, kind, ids, max_age_s)


@router.post(
    "/state/{kind}",
    response_model=m.StateResponse,
    responses={**BAD, 413: {"model": m.ErrorBody, "description": "too many ids"}},
)
def device_state_post(
    api: Api,
    kind: Annotated[str, Path(description=f"one of {', '.join(KINDS)}")],
    body: m.StateQuery,
) -> m.StateResponse:
    """As GET, with the ids (at most 20000) in the body: ``{"ids": [...], "max_age_s"}``."""
    return _state(api, kind, body.ids, body.max_age_s)


def _check_ids(api: ApiState, db: Any, kind: str, wanted: list[str] | None, code: int) -> None:
    if wanted:
        unknown = queries.unknown_ids(db, kind, wanted, api.ctx.site)
        if unknown:
            more = f" (and {len(unknown) - 20} more)" if len(unknown) > 20 else ""
            raise bad(f"unknown {kind} id(s): {', '.join(unknown[:20])}{more}", code)


def _state(
    api: ApiState, kind: str, ids: str | list[str] | None, max_age_s: float
) -> m.StateResponse:
    if kind not in KINDS:
        raise bad(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}", 404)
    db = api.ctx.db()
    wanted = parse_ids(ids)
    _check_ids(api, db, kind, wanted, 404)
    newest = queries.newest(db, kind)
    devices: list[m.DeviceState] = []
    if newest is not None:
        cols = list(QUANTITIES[kind])
        table = queries.latest(db, kind, since=newest - timedelta(seconds=max_age_s), ids=wanted)
        for r in table.to_pylist():
            devices.append(
                m.DeviceState(
                    id=r["id"],
                    source=r["source"],
                    ts=r["ts"],
                    values={q: queries._f(r[q]) for q in cols},
                )
            )
    return m.StateResponse(
        kind=kind,
        units={q: v.unit for q, v in QUANTITIES[kind].items()},
        newest=newest,
        max_age_s=max_age_s,
        devices=devices,
    )


@router.get(
    "/series",
    response_model=m.SeriesResponse,
    responses={
        **BAD,
        200: {
            "content": {ARROW_STREAM: {}},
            "description": "JSON (series per id, in time order), or with `Accept:"
            " application/vnd.apache.arrow.stream` an Arrow IPC stream with columns ts"
            " (timestamp[us, UTC]), id (dictionary-encoded string), value (and min, max for"
            " rollups) in storage order (by time as ingested, not grouped by id); the"
            " schema metadata carries kind, quantity, unit and resolution.",
        },
        413: {"model": m.ErrorBody, "description": "too many points"},
    },
)
def series(
    api: Api,
    request: Request,
    kind: Annotated[str, Query(description=f"one of {', '.join(KINDS)}")],
    quantity: Annotated[str, Query(description="a quantity of that kind, e.g. temp_c")],
    ids: Annotated[str | None, Query(description="comma-separated ids; default all")] = None,
    start: Annotated[str | None, Query(description="ISO 8601 or Unix s; default end - 1 h")] = None,
    end: Annotated[
        str | None, Query(description="ISO 8601 or Unix s, exclusive; default newest + 1 s")
    ] = None,
    resolution: Annotated[
        m.Resolution,
        Query(description="auto: raw up to 2 h, 1-minute rollups up to 2 days, 1 h beyond"),
    ] = "auto",
    format: Annotated[
        str | None, Query(description="'arrow' as an alternative to the Accept header")
    ] = None,
    agg: Annotated[
        str | None,
        Query(
            description="sum | mean | min | max across the devices per rollup bucket (one"
            " series, id = agg); needs 1m or 1h (auto picks at least 1m)"
        ),
    ] = None,
) -> Response:
    """A quantity of some devices over [start, end), from the raw table or a rollup.
    ``ids=`` holds about 500 ids before the URL is too long; POST for up to 20000. A range
    over 2 h or an answer over 100,000 points takes a busy slot (429 when none is free)."""
    return _series(api, request, kind, quantity, ids, start, end, resolution, format, agg)


@router.post(
    "/series",
    response_model=m.SeriesResponse,
    responses={
        **BAD,
        413: {"model": m.ErrorBody, "description": "too many ids or points"},
        **BUSY,
    },
)
def series_post(api: Api, request: Request, body: m.SeriesQuery) -> Response:
    """As GET, with the parameters in the body and ``ids`` a list (at most 20000)."""
    return _series(
        api,
        request,
        body.kind,
        body.quantity,
        body.ids,
        body.start,
        body.end,
        body.resolution,
        body.format,
        body.agg,
    )


def _series(
    api: ApiState,
    request: Request,
    kind: str,
    quantity: str,
    ids: str | list[str] | None,
    start: str | None,
    end: str | None,
    resolution: str,
    format: str | None,
    agg: str | None,
) -> Response:
    if kind not in KINDS:
        raise bad(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if quantity not in QUANTITIES[kind]:
        raise bad(
            f"unknown quantity {quantity!r} of kind {kind!r}; expected one of"
            f" {', '.join(QUANTITIES[kind])}"
        )
    if format not in (None, "", "json", "arrow"):
        raise bad(f"format={format!r}: expected json or arrow")
    db = api.ctx.db()
    wanted = parse_ids(ids)
    _check_ids(api, db, kind, wanted, 404)
    t1 = parse_time(end, "end")
    t0 = parse_time(start, "start")
    if t1 is None:
        newest = queries.newest(db, kind)
        t1 = (newest or datetime.now(UTC)) + timedelta(seconds=1)
    if t0 is None:
        t0 = t1 - timedelta(hours=1)
    if t1 <= t0:
        raise bad(f"end {t1.isoformat()} is not after start {t0.isoformat()}")
    if agg is not None and agg not in queries.AGGREGATES:
        raise bad(f"agg={agg!r}: expected one of {', '.join(queries.AGGREGATES)}")
    res: str = resolution
    if res == "auto":
        res = queries.pick_resolution((t1 - t0).total_seconds())
        if agg is not None and res == "raw":
            res = "1m"
    elif agg is not None and res == "raw":
        raise bad("agg= needs resolution 1m or 1h (devices poll at different instants)")
    arrow = format == "arrow" or ARROW_STREAM in request.headers.get("accept", "")
    with contextlib.ExitStack() as held:
        what = f"a {kind} {quantity} series"
        if (t1 - t0).total_seconds() > LONG_SERIES_S:
            held.enter_context(api.busy.slot(what))
        n = queries.series_count(db, kind, quantity, wanted, t0, t1, res, agg)
        limit = MAX_POINTS if arrow else MAX_JSON_POINTS
        if n > limit:
            raise bad(
                f"{n} points exceed the {limit} a {'' if arrow else 'JSON '}answer carries:"
                + (f" ask for Arrow (Accept: {ARROW_STREAM})," if not arrow else "")
                + " name fewer ids, a shorter range or a coarser resolution (1m, 1h)",
                413,
            )
        if n > LONG_SERIES_POINTS and (t1 - t0).total_seconds() <= LONG_SERIES_S:
            held.enter_context(api.busy.slot(what))
        return _series_answer(db, kind, quantity, wanted, t0, t1, res, agg, arrow)


def _series_answer(
    db: Any,
    kind: str,
    quantity: str,
    wanted: list[str] | None,
    t0: datetime,
    t1: datetime,
    res: str,
    agg: str | None,
    arrow: bool,
) -> Response:
    table = queries.series(db, kind, quantity, wanted, t0, t1, res, agg, ordered=not arrow)
    unit = QUANTITIES[kind][quantity].unit
    if arrow:
        # storage (time) order, ids dictionary-encoded: the cheapest to make and to send
        table = table.set_column(
            table.column_names.index("id"), "id", table.column("id").dictionary_encode()
        )
        meta = {
            "kind": kind,
            "quantity": quantity,
            "unit": unit,
            "resolution": res,
            "start": t0.isoformat(),
            "end": t1.isoformat(),
        }
        table = table.replace_schema_metadata(meta)
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return Response(sink.getvalue(), media_type=ARROW_STREAM)
    out: list[dict[str, Any]] = []
    cols = {c: table.column(c).to_pylist() for c in table.column_names}
    pos = 0
    for sid, grp in itertools.groupby(cols["id"]):
        k = sum(1 for _ in grp)
        item: dict[str, Any] = {
            "id": sid,
            "t": cols["ts"][pos : pos + k],
            "value": cols["value"][pos : pos + k],
        }
        if "min" in cols:
            item["min"] = cols["min"][pos : pos + k]
            item["max"] = cols["max"][pos : pos + k]
        if "devices" in cols:
            item["devices"] = cols["devices"][pos : pos + k]
        out.append(item)
        pos += k
    body = {
        "kind": kind,
        "quantity": quantity,
        "unit": unit,
        "resolution": res,
        "agg": agg,
        "start": t0,
        "end": t1,
        "points": table.num_rows,
        "series": out,
    }
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
    )
