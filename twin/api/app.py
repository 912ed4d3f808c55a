"""The HTTP API of `dctwin serve` (FastAPI): state, series, headroom, alerts, /metrics.

Reads go through the service's store (a cursor per worker thread); writes (acknowledging an
alert, adding or ending a silence) need the bearer token the service was started with
(``--api-token`` or ``DCTWIN_API_TOKEN``); without one configured, writes are refused (403).
Bad kinds, quantities, ids and time ranges are answered with a 4xx whose ``detail`` says what
was wrong, never with a 500.

Extension point: :class:`twin.api.context.ApiContext` ``routers`` are mounted as they are;
what-if jobs (issue 7) arrive as such a router under ``/api/v1/whatif``.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
import pyarrow as pa
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from collectors.contract import KINDS, QUANTITIES
from twin.alerts import AlertDb, Silence, Silences
from twin.alerts.db import ensure_alert_tables
from twin.api import models as m
from twin.api import queries
from twin.api.context import ApiContext
from twin.api.guard import BodyLimit, BusyLimit, HealthReport, HostCheck, LruCache, allowed_hosts
from twin.api.metrics import HealthCollector, StoreCollector

log = logging.getLogger(__name__)

API_VERSION = "v1"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: Most points a JSON series answer carries; beyond, ask for Arrow or a narrower query.
MAX_JSON_POINTS = 250_000
#: Most points any series answer carries (Arrow included).
MAX_POINTS = 20_000_000
#: "Latest" values are the newest within this window before the kind's newest sample. [s]
LATEST_WINDOW_S = 120.0
FORECAST_CACHE_S = 60.0
#: Most device ids one request may name (``ids=`` of a GET, or ``ids`` of a POST body; a GET's
#: URL holds about 500 of them before the server refuses it, so name more with POST).
MAX_IDS = 20_000
#: A series over a longer range than this [s], or of more points than LONG_SERIES_POINTS,
#: takes a busy slot (429 when none is free).
LONG_SERIES_S = 2 * 3600.0
LONG_SERIES_POINTS = 100_000
#: Default and largest number of unknown ids /api/v1/status lists (it counts them all).
STATUS_UNKNOWN_IDS = 100
STATUS_UNKNOWN_IDS_MAX = 10_000
DERATE = 0.8

BAD = {400: {"model": m.ErrorBody}, 404: {"model": m.ErrorBody}}
BUSY = {429: {"model": m.ErrorBody, "description": "busy: retry after Retry-After s"}}
WRITE = {
    401: {"model": m.ErrorBody, "description": "missing or wrong bearer token"},
    403: {"model": m.ErrorBody, "description": "writes are off: no token configured"},
}


def _bad(detail: str, code: int = 400) -> HTTPException:
    return HTTPException(status_code=code, detail=detail)


def parse_time(value: str | None, name: str) -> datetime | None:
    """ISO 8601 (``Z`` or an offset; naive means UTC) or Unix seconds; 400 otherwise."""
    if value is None or value == "":
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise _bad(
            f"{name}={value!r} is not a time: give ISO 8601 (2026-11-29T14:00:00Z) or Unix seconds"
        ) from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _ids(value: str | list[str] | None) -> list[str] | None:
    """The ids a request names (comma-separated in a GET, a list in a POST body), at most
    :data:`MAX_IDS` of them; 400 for an empty list, 413 beyond the limit."""
    if value is None:
        return None
    raw = value.split(",") if isinstance(value, str) else value
    ids = [i.strip() for i in raw if i.strip()]
    if not ids:
        raise _bad("ids= is empty: give comma-separated device ids, or leave it out for all")
    if len(ids) > MAX_IDS:
        raise _bad(
            f"ids names {len(ids)} devices; at most {MAX_IDS} per request: split the request"
            " (a GET's URL holds about 500 ids; POST the same query with an 'ids' list for more)",
            413,
        )
    return list(dict.fromkeys(ids))


def _site_or_404(ctx: ApiContext) -> Any:
    if ctx.site is None:
        raise _bad("the service runs without a site model: start it with --site FILE", 404)
    return ctx.site


def token_check(ctx: ApiContext) -> Callable[[Request], str]:
    """The dependency that guards writes: the service's bearer token, compared in constant
    time; 403 when the service has none, 401 when it is missing or wrong."""

    def require_token(request: Request) -> str:
        if not ctx.token:
            raise _bad(
                "writes are disabled: this service has no API token. Start `dctwin serve`"
                " with --api-token TOKEN (or set DCTWIN_API_TOKEN) and send"
                " 'Authorization: Bearer TOKEN'",
                403,
            )
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise HTTPException(
                401,
                "this write needs 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(given.strip().encode(), ctx.token.encode()):
            raise HTTPException(401, "wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        return "token"

    return require_token


def create_app(ctx: ApiContext, hosts: list[str] | None = None) -> FastAPI:
    """The FastAPI application over ``ctx`` (see the module docstring). ``hosts``: the Host
    header values it answers (default: :func:`twin.api.guard.allowed_hosts` of 127.0.0.1 and
    ``ctx.allowed_hosts``)."""
    app = FastAPI(
        title="dctwin API",
        version=API_VERSION,
        description=(
            "The live digital twin of an AI datacenter: current state, series, headroom,"
            " forecasts, hot spots, fleets, calibration and alerts. Units are in the field"
            " names (`power_kw`, `temp_c`) or in a `unit` field; times are UTC. Writes"
            " (POST, DELETE) need `Authorization: Bearer <token>`."
        ),
    )
    # outermost first: the Host check, then the body limit, then the health report
    if ctx.health is not None:
        app.add_middleware(HealthReport, health=ctx.health)
    app.add_middleware(BodyLimit)
    app.add_middleware(
        HostCheck,
        allowed=hosts if hosts is not None else allowed_hosts("127.0.0.1", ctx.allowed_hosts),
    )
    busy = BusyLimit(ctx.max_busy)
    forecast_cache = LruCache(ctx.forecast_cache_entries, FORECAST_CACHE_S)
    app.state.busy = busy
    app.state.forecast_cache = forecast_cache
    setup = ctx.db()
    setup.con.execute(queries.ACK_DDL).fetchall()
    ensure_alert_tables(setup.con)
    index_lock = threading.Lock()
    state: dict[str, Any] = {}

    def site_index() -> queries.SiteIndex:
        site = _site_or_404(ctx)
        with index_lock:
            if "index" not in state:
                state["index"] = queries.SiteIndex.build(site)
            return state["index"]

    def silences() -> Silences:
        if ctx.engine is not None:
            return ctx.engine.silences
        with index_lock:
            if "silences" not in state:
                state["silences"] = Silences(AlertDb(ctx.new_cursor()))
            return state["silences"]

    def active_alerts() -> list[dict[str, Any]]:
        if ctx.engine is None:
            return []
        for _ in range(5):  # the detection thread may change the groups while we read
            try:
                return list(ctx.engine.active())
            except RuntimeError:
                time.sleep(0.01)
        return []

    require_token = token_check(ctx)

    writer = [Depends(require_token)]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(ctx, active_alerts))
    registry.register(HealthCollector(ctx, busy, forecast_cache))

    # ---- service ---------------------------------------------------------------------------

    def broker_connected() -> bool | None:
        if ctx.health is not None:
            return ctx.health.broker.connected
        return None

    @app.get(
        "/healthz",
        response_model=m.Health,
        responses={503: {"model": m.Health, "description": "ingest stalled: `reason` says why"}},
        tags=["service"],
    )
    def healthz() -> Response:
        """The service's health: 200 while it works (``status`` ok, or degraded with the
        failing loops or a lost broker in ``reason``), 503 when ingest is stalled (messages
        received but not stored for longer than ``serve --stall-after``). With the broker
        connection, ingest lag and last commit, each background loop's last success and error,
        and the telemetry kinds found missing."""
        ctx.db().con.execute("SELECT 1").fetchall()
        base = {
            "site": ctx.site.name if ctx.site else None,
            "started_at": ctx.started_at,
            "uptime_s": (datetime.now(UTC) - ctx.started_at).total_seconds(),
        }
        if ctx.health is None:
            body = m.Health(status="ok", reason=None, broker_connected=None, **base)
            return JSONResponse(body.model_dump(mode="json"))
        snap = ctx.health.snapshot()
        broker = snap["broker"]
        failing = sorted(name for name, lp in snap["loops"].items() if lp["failing"])
        status: str = "ok"
        reason = snap["stalled"]
        if reason:
            status = "stalled"
        else:
            why = []
            if broker["connected"] is False:
                why.append(f"broker disconnected ({broker['last_reason'] or 'no reason given'})")
            for name in failing:
                why.append(f"loop {name} failing: {snap['loops'][name]['last_error']}")
            if snap["store_retrying"]:
                why.append(f"store write retrying: {snap['store_retrying']}")
            if why:
                status, reason = "degraded", "; ".join(why)
        body = m.Health(
            status=status,  # type: ignore[arg-type]
            reason=reason,
            broker_connected=broker["connected"],
            broker=m.BrokerHealth(**broker),
            ingest=m.IngestProgress(
                lag_s=snap["ingest_lag_s"],
                last_commit_at=snap["last_commit_at"],
                store_retrying=snap["store_retrying"],
                stall_after_s=ctx.health.stall_after_s,
            ),
            loops={name: m.LoopHealth(**lp) for name, lp in snap["loops"].items()},
            missing_telemetry=snap["missing_telemetry"],
            **base,
        )
        code = 503 if status == "stalled" else 200
        return JSONResponse(body.model_dump(mode="json"), status_code=code)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["service"])
    def metrics() -> Response:
        """Prometheus exposition: headroom per component, ingest counters, dead letters,
        calibration quality, active alerts (see twin/api/metrics.py for every name)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1", response_model=m.ApiIndex, tags=["service"])
    def index() -> m.ApiIndex:
        """The endpoints this service offers and its optional features."""
        # the OpenAPI document lists included routers' paths too (app.routes may hold them
        # as one included-router entry)
        paths = sorted(app.openapi()["paths"])
        return m.ApiIndex(
            version=API_VERSION,
            site=ctx.site.name if ctx.site else None,
            endpoints=paths,
            features={"whatif": any(p.startswith("/api/v1/whatif") for p in paths)},
        )

    @app.get(
        "/api/v1/status",
        response_model=m.StatusResponse,
        responses=BUSY,
        tags=["service"],
    )
    def status(
        limit: Annotated[
            int,
            Query(
                ge=0,
                le=STATUS_UNKNOWN_IDS_MAX,
                description="most unknown ids listed (all are counted in unknown_ids_total)",
            ),
        ] = STATUS_UNKNOWN_IDS,
    ) -> dict[str, Any]:
        """What the store holds (as `dctwin status --json`, the unknown ids cut to ``limit``
        with their total in ``unknown_ids_total``) and the service's counters and health."""
        with busy.slot("the store status"):
            st = ctx.db().status()
        unknown = st.get("unknown_ids") or []
        st["unknown_ids_total"] = len(unknown)
        st["unknown_ids"] = unknown[:limit]
        svc: dict[str, Any] = {}
        if ctx.ingester is not None:
            svc["ingest"] = ctx.ingester.counters.as_dict()
        if ctx.service is not None:
            for attr in ("write_errors", "last_error", "disconnects", "receiver_restarts"):
                svc[attr] = getattr(ctx.service, attr, None)
        for name, sched in (("calibration", ctx.calibrator), ("detection", ctx.detector)):
            if sched is not None:
                svc[name] = {"runs": sched.runs, "failures": sched.failures}
        if ctx.health is not None:
            svc["health"] = ctx.health.snapshot()
        st["service"] = svc
        return st

    # ---- site, state, series ---------------------------------------------------------------

    @app.get("/api/v1/site", response_model=m.SiteResponse, responses=BAD, tags=["site"])
    def site_model() -> m.SiteResponse:
        """The site model: halls, rows, racks (grid positions), nodes, PDUs, CDUs, links,
        fleets."""
        site = _site_or_404(ctx)
        return m.SiteResponse(
            name=site.name,
            counts=m.SiteCounts(
                halls=len(site.halls),
                rows=sum(len(h.rows) for h in site.halls),
                racks=len(site.racks),
                nodes=len(site.nodes),
                gpus=sum(len(n.gpu_ids()) for n in site.nodes),
                pdus=len(site.pdus),
                cdus=len(site.cdus),
                links=len(site.links),
                fleets=len(site.fleets),
            ),
            site=site,
        )

    @app.get(
        "/api/v1/state/{kind}", response_model=m.StateResponse, responses=BAD, tags=["telemetry"]
    )
    def device_state(
        kind: Annotated[str, Path(description=f"one of {', '.join(KINDS)}")],
        ids: Annotated[str | None, Query(description="comma-separated device ids")] = None,
        max_age_s: Annotated[
            float, Query(gt=0, le=30 * 86400, description="leave out devices silent longer")
        ] = 300.0,
    ) -> m.StateResponse:
        """The latest sample of each device of ``kind`` (each quantity: its newest value).
        ``ids=`` holds about 500 ids before the URL is too long; POST for up to 20000."""
        return _state(kind, ids, max_age_s)

    @app.post(
        "/api/v1/state/{kind}",
        response_model=m.StateResponse,
        responses={**BAD, 413: {"model": m.ErrorBody, "description": "too many ids"}},
        tags=["telemetry"],
    )
    def device_state_post(
        kind: Annotated[str, Path(description=f"one of {', '.join(KINDS)}")],
        body: m.StateQuery,
    ) -> m.StateResponse:
        """As GET, with the ids (at most 20000) in the body: ``{"ids": [...], "max_age_s"}``."""
        return _state(kind, body.ids, body.max_age_s)

    def _check_ids(db: Any, kind: str, wanted: list[str] | None, code: int) -> None:
        if wanted:
            bad = queries.unknown_ids(db, kind, wanted, ctx.site)
            if bad:
                more = f" (and {len(bad) - 20} more)" if len(bad) > 20 else ""
                raise _bad(f"unknown {kind} id(s): {', '.join(bad[:20])}{more}", code)

    def _state(kind: str, ids: str | list[str] | None, max_age_s: float) -> m.StateResponse:
        if kind not in KINDS:
            raise _bad(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}", 404)
        db = ctx.db()
        wanted = _ids(ids)
        _check_ids(db, kind, wanted, 404)
        newest = queries.newest(db, kind)
        devices: list[m.DeviceState] = []
        if newest is not None:
            cols = list(QUANTITIES[kind])
            table = queries.latest(
                db, kind, since=newest - timedelta(seconds=max_age_s), ids=wanted
            )
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

    @app.get(
        "/api/v1/series",
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
        tags=["telemetry"],
    )
    def series(
        request: Request,
        kind: Annotated[str, Query(description=f"one of {', '.join(KINDS)}")],
        quantity: Annotated[str, Query(description="a quantity of that kind, e.g. temp_c")],
        ids: Annotated[str | None, Query(description="comma-separated ids; default all")] = None,
        start: Annotated[
            str | None, Query(description="ISO 8601 or Unix s; default end - 1 h")
        ] = None,
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
        return _series(request, kind, quantity, ids, start, end, resolution, format, agg)

    @app.post(
        "/api/v1/series",
        response_model=m.SeriesResponse,
        responses={
            **BAD,
            413: {"model": m.ErrorBody, "description": "too many ids or points"},
            **BUSY,
        },
        tags=["telemetry"],
    )
    def series_post(request: Request, body: m.SeriesQuery) -> Response:
        """As GET, with the parameters in the body and ``ids`` a list (at most 20000)."""
        return _series(
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
            raise _bad(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        if quantity not in QUANTITIES[kind]:
            raise _bad(
                f"unknown quantity {quantity!r} of kind {kind!r}; expected one of"
                f" {', '.join(QUANTITIES[kind])}"
            )
        if format not in (None, "", "json", "arrow"):
            raise _bad(f"format={format!r}: expected json or arrow")
        db = ctx.db()
        wanted = _ids(ids)
        _check_ids(db, kind, wanted, 400)
        t1 = parse_time(end, "end")
        t0 = parse_time(start, "start")
        if t1 is None:
            newest = queries.newest(db, kind)
            t1 = (newest or datetime.now(UTC)) + timedelta(seconds=1)
        if t0 is None:
            t0 = t1 - timedelta(hours=1)
        if t1 <= t0:
            raise _bad(f"end {t1.isoformat()} is not after start {t0.isoformat()}")
        if agg is not None and agg not in queries.AGGREGATES:
            raise _bad(f"agg={agg!r}: expected one of {', '.join(queries.AGGREGATES)}")
        res: str = resolution
        if res == "auto":
            res = queries.pick_resolution((t1 - t0).total_seconds())
            if agg is not None and res == "raw":
                res = "1m"
        elif agg is not None and res == "raw":
            raise _bad("agg= needs resolution 1m or 1h (devices poll at different instants)")
        arrow = format == "arrow" or ARROW_STREAM in request.headers.get("accept", "")
        with contextlib.ExitStack() as held:
            what = f"a {kind} {quantity} series"
            if (t1 - t0).total_seconds() > LONG_SERIES_S:
                held.enter_context(busy.slot(what))
            n = queries.series_count(db, kind, quantity, wanted, t0, t1, res, agg)
            limit = MAX_POINTS if arrow else MAX_JSON_POINTS
            if n > limit:
                raise _bad(
                    f"{n} points exceed the {limit} a {'' if arrow else 'JSON '}answer carries:"
                    + (f" ask for Arrow (Accept: {ARROW_STREAM})," if not arrow else "")
                    + " name fewer ids, a shorter range or a coarser resolution (1m, 1h)",
                    413,
                )
            if n > LONG_SERIES_POINTS and (t1 - t0).total_seconds() <= LONG_SERIES_S:
                held.enter_context(busy.slot(what))
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

    # ---- headroom, overview, racks, power, cooling, network --------------------------------

    @app.get("/api/v1/headroom", response_model=m.HeadroomResponse, responses=BAD, tags=["twin"])
    def headroom(
        kind: Annotated[
            str | None, Query(description=f"one of {', '.join(m.HEADROOM_KINDS)}")
        ] = None,
        rack: str | None = None,
        cdu: str | None = None,
    ) -> m.HeadroomResponse:
        """The latest stored headroom report (the service recomputes it every --detect-every
        s): per limit, headroom now, its minimum over the horizon and the time to breach."""
        if kind is not None and kind not in m.HEADROOM_KINDS:
            raise _bad(f"unknown kind {kind!r}; expected one of {', '.join(m.HEADROOM_KINDS)}")
        computed_at, data_until, rows = queries.headroom_latest(ctx.db(), kind, rack, cdu)
        return m.HeadroomResponse(
            computed_at=computed_at,
            data_until=data_until,
            rows=[m.HeadroomRowOut(**r) for r in rows],
        )

    @app.get("/api/v1/overview", response_model=m.Overview, tags=["twin"])
    def overview() -> m.Overview:
        """One call for the console's first page: IT power, cooling load, headroom summary,
        alert counts and ingest health."""
        db = ctx.db()
        newest = queries.newest_all(db)
        now = datetime.now(UTC)
        it_kw = gpu_kw = cool_kw = None
        n_nodes = n_gpus = 0
        if newest["node"] is not None:
            n_nodes, s = db.con.execute(
                "SELECT count(*), sum(p) FROM (SELECT arg_max(power_w, ts) AS p FROM node"
                " WHERE ts >= ? GROUP BY id)",
                [newest["node"] - timedelta(seconds=LATEST_WINDOW_S)],
            ).fetchall()[0]
            it_kw = None if s is None else s / 1000.0
        if newest["gpu"] is not None:
            n_gpus, s = db.con.execute(
                "SELECT count(*), sum(p) FROM (SELECT arg_max(power_w, ts) AS p FROM gpu"
                " WHERE ts >= ? GROUP BY id)",
                [newest["gpu"] - timedelta(seconds=LATEST_WINDOW_S)],
            ).fetchall()[0]
            gpu_kw = None if s is None else s / 1000.0
        if newest["cdu"] is not None:
            s = db.con.execute(
                "SELECT sum(h) FROM (SELECT arg_max(heat_kw, ts) AS h FROM cdu WHERE ts >= ?"
                " AND NOT contains(id, '/') GROUP BY id)",
                [newest["cdu"] - timedelta(seconds=LATEST_WINDOW_S)],
            ).fetchall()[0][0]
            cool_kw = queries._f(s)
        cap = None
        if ctx.site is not None and ctx.site.cdus:
            caps = [c.capacity_kw for c in ctx.site.cdus if c.capacity_kw]
            cap = float(sum(caps)) if caps else None
        computed_at, summary, tight = queries.headroom_summary(db)
        active = active_alerts()
        acked = _acked(db, active)
        by_sev: dict[str, int] = {}
        for a in active:
            by_sev[a["severity"]] = by_sev.get(a["severity"], 0) + 1
        counters = ctx.ingester.counters.as_dict() if ctx.ingester is not None else None
        dead = dict(
            db.con.execute("SELECT reason, count(*) FROM dead_letters GROUP BY reason").fetchall()
        )
        data_until = max((t for t in newest.values() if t is not None), default=None)
        return m.Overview(
            site=ctx.site.name if ctx.site else None,
            data_until=data_until,
            it_power_kw=queries._f(it_kw),
            nodes_reporting=int(n_nodes),
            gpus_reporting=int(n_gpus),
            gpu_power_kw=queries._f(gpu_kw),
            cooling_load_kw=cool_kw,
            cooling_capacity_kw=cap,
            headroom_computed_at=computed_at,
            headroom=[m.HeadroomKindSummary(**s) for s in summary],
            tightest=[m.HeadroomRowOut(**r) for r in tight],
            alerts=m.AlertCounts(
                enabled=ctx.engine is not None,
                active=len(active),
                by_severity=by_sev,
                unacknowledged=sum(1 for a in active if a["dedup_key"] not in acked),
            ),
            ingest=m.IngestHealth(
                received=counters["received"] if counters else None,
                stored_messages=counters["stored_messages"] if counters else None,
                duplicates=counters["duplicates"] if counters else None,
                dead_letters_since_start=counters["dead_letters"] if counters else {},
                dead_letters_stored={k: int(v) for k, v in dead.items()},
                newest=newest,
                lag_s={
                    k: None if t is None else round((now - t).total_seconds(), 3)
                    for k, t in newest.items()
                },
                broker_connected=broker_connected(),
                write_errors=getattr(ctx.service, "write_errors", None),
            ),
        )

    def _rack_summaries() -> tuple[datetime | None, list[m.RackSummary]]:
        idx = site_index()
        site = idx.site
        db = ctx.db()
        newest = queries.newest_all(db)

        def latest(kind: str, **kw: Any) -> dict[str, dict[str, Any]]:
            if newest[kind] is None:
                return {}
            since = newest[kind] - timedelta(seconds=LATEST_WINDOW_S)
            return queries.latest_by_id(db, kind, since, **kw)

        node = latest("node", quantities=["power_w", "inlet_temp_c"])
        gpu = latest("gpu", quantities=["temp_c", "util_pct"])
        pdu = latest("pdu", quantities=["inlet_temp_c"], id_filter="whole")
        _, _, hrows = queries.headroom_latest(db)
        rack_hr = {r["id"]: r for r in hrows if r["kind"] == "rack"}
        gpu_hr: dict[str, float] = {}
        pdu_hr: dict[str, float] = {}
        for r in hrows:
            h = r["headroom_now"]
            if h is None:
                continue
            if r["kind"] == "gpu" and r["id"] in idx.gpu_node:
                rk = idx.node_rack[idx.gpu_node[r["id"]][0]]
                gpu_hr[rk] = min(gpu_hr.get(rk, h), h)
            elif r["kind"] == "pdu_phase":
                for rk in idx.racks_of(r["id"]):
                    pdu_hr[rk] = min(pdu_hr.get(rk, h), h)
        alerts: dict[str, int] = {}
        for a in active_alerts():
            racks: set[str] = set()
            for e in [a["group"]["id"], *a["members"]]:
                racks |= idx.racks_of(e)
            for rk in racks:
                alerts[rk] = alerts.get(rk, 0) + 1
        out = []
        for r in site.racks:
            hall, row = idx.rack_where[r.name]
            powers = [node[n.name]["power_w"] for n in r.nodes if n.name in node]
            powers = [p for p in powers if p is not None]
            temps, utils = [], []
            n_gpu = 0
            for n in r.nodes:
                for gid in n.gpu_ids():
                    n_gpu += 1
                    g = gpu.get(gid)
                    if g is None and n.gpu_uuids:
                        g = gpu.get(n.gpu_uuids[int(gid.rsplit(":", 1)[1])])
                    if g is not None:
                        if g["temp_c"] is not None:
                            temps.append(g["temp_c"])
                        if g["util_pct"] is not None:
                            utils.append(g["util_pct"])
            inlets = [node[n.name]["inlet_temp_c"] for n in r.nodes if n.name in node]
            inlets += [pdu[p]["inlet_temp_c"] for p in r.pdus if p in pdu]
            inlets = [t for t in inlets if t is not None]
            hr = rack_hr.get(r.name)
            out.append(
                m.RackSummary(
                    name=r.name,
                    hall=hall,
                    row=row,
                    grid_col=r.grid[0],
                    grid_row=r.grid[1],
                    cdu=r.cdu,
                    pdus=list(r.pdus),
                    fleet=idx.fleet_of_rack.get(r.name),
                    nodes=len(r.nodes),
                    gpus=n_gpu,
                    power_kw=sum(powers) / 1000.0 if powers else None,
                    power_limit_kw=hr["limit"] if hr else None,
                    headroom_kw=hr["headroom_now"] if hr else None,
                    gpu_temp_max_c=max(temps) if temps else None,
                    gpu_headroom_min_k=gpu_hr.get(r.name),
                    gpu_util_mean_pct=sum(utils) / len(utils) if utils else None,
                    inlet_temp_c=max(inlets) if inlets else None,
                    pdu_headroom_min_a=pdu_hr.get(r.name),
                    alerts=alerts.get(r.name, 0),
                )
            )
        until = max((t for t in newest.values() if t is not None), default=None)
        return until, out

    @app.get("/api/v1/racks", response_model=m.RacksResponse, responses=BAD, tags=["twin"])
    def racks() -> m.RacksResponse:
        """Every rack with its grid position and latest power, temperatures and headroom (the
        console's floor map)."""
        until, out = _rack_summaries()
        return m.RacksResponse(data_until=until, racks=out)

    def _phase_rows(pdu_names: list[str]) -> list[m.PhaseRow]:
        site = _site_or_404(ctx)
        db = ctx.db()
        nw = queries.newest(db, "pdu")
        state = (
            {}
            if nw is None
            else queries.latest_by_id(
                db,
                "pdu",
                nw - timedelta(seconds=LATEST_WINDOW_S),
                quantities=["current_a", "voltage_v", "power_w"],
                id_filter="parts",
            )
        )
        _, _, hrows = queries.headroom_latest(db, "pdu_phase")
        hr = {r["id"]: r for r in hrows}
        out = []
        for name in pdu_names:
            p = site.pdu_by_name[name]
            parts = [(f"{p.name}/L{i}", p.rated_current_a) for i in range(1, p.phases + 1)]
            parts += [(f"{p.name}/{b.name}", b.rated_current_a) for b in p.breakers]
            for pid, rated in parts:
                s = state.get(pid, {})
                h = hr.get(pid)
                cur = queries._f(s.get("current_a"))
                limit = DERATE * rated
                out.append(
                    m.PhaseRow(
                        id=pid,
                        pdu=p.name,
                        feed=p.feed,
                        current_a=cur,
                        voltage_v=queries._f(s.get("voltage_v")),
                        power_w=queries._f(s.get("power_w")),
                        rated_a=rated,
                        limit_a=limit,
                        headroom_a=h["headroom_now"]
                        if h
                        else (None if cur is None else limit - cur),
                        breach_in_s_p50=h["breach_in_s_p50"] if h else None,
                    )
                )
        return out

    def _cdu_rows(names: list[str]) -> list[m.CduRow]:
        idx = site_index()
        site = idx.site
        db = ctx.db()
        nw = queries.newest(db, "cdu")
        state = (
            {}
            if nw is None
            else queries.latest_by_id(db, "cdu", nw - timedelta(seconds=LATEST_WINDOW_S))
        )
        _, _, hrows = queries.headroom_latest(db)
        cdu_hr = {r["id"]: r for r in hrows if r["kind"] == "cdu" and r["quantity"] == "heat_kw"}
        loop_hr = {r["id"]: r for r in hrows if r["kind"] == "loop"}
        out = []
        for name in names:
            c = site.cdu_by_name[name]
            s = state.get(name, {})
            heat = queries._f(s.get("heat_kw"))
            pumps = []
            for pump in c.pumps:
                ps = state.get(f"{name}/{pump}")
                speed = queries._f(ps.get("pump_speed_pct")) if ps else None
                pumps.append(
                    m.PumpRow(
                        name=pump,
                        speed_pct=speed,
                        power_w=queries._f(ps.get("pump_power_w")) if ps else None,
                        running=None if speed is None else speed >= 5.0,
                    )
                )
            out.append(
                m.CduRow(
                    name=name,
                    model=c.model,
                    capacity_kw=c.capacity_kw,
                    max_flow_lpm=c.max_flow_lpm,
                    return_limit_c=c.return_limit_c,
                    supply_temp_c=queries._f(s.get("supply_temp_c")),
                    return_temp_c=queries._f(s.get("return_temp_c")),
                    flow_lpm=queries._f(s.get("flow_lpm")),
                    dp_kpa=queries._f(s.get("dp_kpa")),
                    heat_kw=heat,
                    fw_supply_temp_c=queries._f(s.get("fw_supply_temp_c")),
                    fw_return_temp_c=queries._f(s.get("fw_return_temp_c")),
                    capacity_used_pct=None
                    if heat is None or not c.capacity_kw
                    else 100.0 * heat / c.capacity_kw,
                    headroom_kw=cdu_hr[name]["headroom_now"] if name in cdu_hr else None,
                    return_headroom_k=loop_hr[name]["headroom_now"] if name in loop_hr else None,
                    racks=idx.cdu_racks.get(name, []),
                    pumps=pumps,
                )
            )
        return out

    @app.get("/api/v1/racks/{name}", response_model=m.RackDetail, responses=BAD, tags=["twin"])
    def rack_detail(name: str) -> m.RackDetail:
        """One rack: its nodes and GPUs, its PDU phases against their limits, its CDU loop."""
        idx = site_index()
        rack = next((r for r in idx.site.racks if r.name == name), None)
        if rack is None:
            raise _bad(f"no rack {name!r} in site {idx.site.name!r}", 404)
        _, summaries = _rack_summaries()
        summary = next(s for s in summaries if s.name == name)
        db = ctx.db()
        node_ids = [n.name for n in rack.nodes]
        gpu_ids = [g for n in rack.nodes for g in (*n.gpu_ids(), *(n.gpu_uuids or ()))]

        def latest(kind: str, ids: list[str]) -> dict[str, dict[str, Any]]:
            nw = queries.newest(db, kind)
            if nw is None or not ids:
                return {}
            return queries.latest_by_id(db, kind, nw - timedelta(seconds=LATEST_WINDOW_S), ids=ids)

        node = latest("node", node_ids)
        gpu = latest("gpu", gpu_ids)
        _, _, ghr = queries.headroom_latest(db, "gpu", rack=name)
        gpu_hr = {r["id"]: r["headroom_now"] for r in ghr}
        nodes = []
        for n in rack.nodes:
            ns = node.get(n.name, {})
            gpus = []
            for i, gid in enumerate(n.gpu_ids()):
                g = gpu.get(gid) or (gpu.get(n.gpu_uuids[i]) if n.gpu_uuids else None) or {}
                gpus.append(
                    m.GpuRow(
                        id=gid,
                        index=i,
                        power_w=queries._f(g.get("power_w")),
                        temp_c=queries._f(g.get("temp_c")),
                        mem_temp_c=queries._f(g.get("mem_temp_c")),
                        util_pct=queries._f(g.get("util_pct")),
                        sm_active=queries._f(g.get("sm_active")),
                        power_limit_w=queries._f(g.get("power_limit_w")),
                        headroom_k=gpu_hr.get(gid),
                    )
                )
            nodes.append(
                m.NodeRow(
                    name=n.name,
                    model=n.model,
                    gpu_model=n.gpu_model or n.spec.gpu,
                    phase=n.phase,
                    power_w=queries._f(ns.get("power_w")),
                    inlet_temp_c=queries._f(ns.get("inlet_temp_c")),
                    outlet_temp_c=queries._f(ns.get("outlet_temp_c")),
                    fan_speed_pct=queries._f(ns.get("fan_speed_pct")),
                    gpus=gpus,
                )
            )
        cdu = _cdu_rows([rack.cdu])[0] if rack.cdu else None
        return m.RackDetail(rack=summary, nodes=nodes, phases=_phase_rows(list(rack.pdus)), cdu=cdu)

    @app.get("/api/v1/power", response_model=m.PhasesResponse, responses=BAD, tags=["twin"])
    def power() -> m.PhasesResponse:
        """Every PDU phase and branch breaker: current against the 80 % derated limit."""
        site = _site_or_404(ctx)
        return m.PhasesResponse(
            data_until=queries.newest(ctx.db(), "pdu"),
            phases=_phase_rows([p.name for p in site.pdus]),
        )

    @app.get("/api/v1/cooling", response_model=m.CdusResponse, responses=BAD, tags=["twin"])
    def cooling() -> m.CdusResponse:
        """Every CDU: supply and return, flow, heat against capacity, pumps."""
        site = _site_or_404(ctx)
        return m.CdusResponse(
            data_until=queries.newest(ctx.db(), "cdu"),
            cdus=_cdu_rows([c.name for c in site.cdus]),
        )

    @app.get("/api/v1/network", response_model=m.LinksResponse, responses=BAD, tags=["twin"])
    def network() -> m.LinksResponse:
        """Every link: traffic each way against its capacity, errors, headroom."""
        site = _site_or_404(ctx)
        db = ctx.db()
        nw = queries.newest(db, "link")
        state = (
            {}
            if nw is None
            else queries.latest_by_id(db, "link", nw - timedelta(seconds=LATEST_WINDOW_S))
        )
        _, _, hrows = queries.headroom_latest(db, "link")
        hr = {r["id"]: r for r in hrows}
        links = []
        for link in site.links:
            s = state.get(link.name, {})
            tx = queries._f(s.get("tx_bps"))
            rx = queries._f(s.get("rx_bps"))
            busier = max((v for v in (tx, rx) if v is not None), default=None)
            links.append(
                m.LinkRow(
                    name=link.name,
                    a=link.a,
                    b=link.b,
                    capacity_gbps=link.capacity_gbps,
                    tx_gbps=None if tx is None else tx / 1e9,
                    rx_gbps=None if rx is None else rx / 1e9,
                    utilization_pct=None
                    if busier is None
                    else 100.0 * busier / 1e9 / link.capacity_gbps,
                    errors=None if s.get("errors") is None else int(s["errors"]),
                    headroom_gbps=hr[link.name]["headroom_now"] if link.name in hr else None,
                )
            )
        return m.LinksResponse(data_until=nw, links=links)

    # ---- forecast, hot spots, fleets, calibration ------------------------------------------

    @app.get("/api/v1/forecast", responses={**BAD, **BUSY}, tags=["twin"])
    def forecast(
        horizon_s: Annotated[float, Query(gt=0, le=7 * 86400)] = 6 * 3600.0,
        step_s: Annotated[float, Query(ge=60, le=86400)] = 300.0,
    ) -> Response:
        """p05/p50/p90/p95 power [W] per fleet and rack over the horizon (cached 60 s, the
        64 most recently asked horizons and steps; computing one takes a busy slot). The
        schema is `twin.forecast.SiteForecast`."""
        from twin.forecast import forecast_site

        site = _site_or_404(ctx)
        if horizon_s / step_s > 2000:
            raise _bad(f"horizon_s / step_s = {horizon_s / step_s:.0f} steps; at most 2000")

        def compute() -> bytes:
            with busy.slot("a forecast"):
                db = ctx.db()
                nw = queries.newest(db, "node")
                if nw is None:
                    raise _bad("no node power samples yet: nothing to forecast from", 409)
                try:
                    result = forecast_site(db, site, now=nw, horizon_s=horizon_s, step_s=step_s)
                except ValueError as e:
                    raise _bad(str(e), 409) from None
                return result.model_dump_json().encode()

        body = forecast_cache.get_or_compute((horizon_s, step_s), compute)
        return Response(body, media_type="application/json")

    @app.get("/api/v1/hotspots", responses={**BAD, **BUSY}, tags=["twin"])
    def hotspots(
        k_sigma: Annotated[float | None, Query(gt=0, le=100)] = None,
        minutes: Annotated[int | None, Query(ge=1, le=240)] = None,
    ) -> Response:
        """GPUs over their limit, above their calibrated model by k sigma, drifting R; racks
        with hot inlet air. The schema is `twin.hotspots.HotSpotReport`. Without parameters,
        the service's latest detection pass; with them, computed now."""
        from twin.hotspots import find_hotspots

        site = _site_or_404(ctx)
        last = ctx.detector.last if ctx.detector is not None else None
        if last is not None and k_sigma is None and minutes is None:
            return Response(last.hotspots.model_dump_json(), media_type="application/json")
        try:
            with busy.slot("a hot spot search"):
                report = find_hotspots(ctx.db(), site, k_sigma=k_sigma or 3.0, minutes=minutes or 5)
        except ValueError as e:
            raise _bad(str(e), 409) from None
        return Response(report.model_dump_json(), media_type="application/json")

    @app.get("/api/v1/fleets", responses={**BAD, **BUSY}, tags=["twin"])
    def fleets(
        window_s: Annotated[float | None, Query(gt=0, le=30 * 86400)] = None,
        threshold: Annotated[float | None, Query(gt=0, le=1)] = None,
        target_util: Annotated[float | None, Query(gt=0, le=1)] = None,
    ) -> Response:
        """Fleet utilization and underused inference fleets (GPUs and kW to reclaim). The
        schema is `twin.fleets.FleetReport`. Without parameters, the latest detection pass."""
        from twin.fleets import underused_fleets

        site = _site_or_404(ctx)
        last = ctx.detector.last if ctx.detector is not None else None
        default = window_s is None and threshold is None and target_util is None
        if last is not None and last.fleets is not None and default:
            return Response(last.fleets.model_dump_json(), media_type="application/json")
        db = ctx.db()
        nw = queries.newest(db, "gpu")
        if nw is None:
            raise _bad("no GPU samples yet: no fleet activity to judge", 409)
        try:
            with busy.slot("a fleet report"):
                report = underused_fleets(
                    db,
                    site,
                    now=nw,
                    window_s=window_s or 86400.0,
                    threshold=threshold or 0.3,
                    target_util=target_util or 0.7,
                )
        except ValueError as e:
            raise _bad(str(e), 409) from None
        return Response(report.model_dump_json(), media_type="application/json")

    @app.get("/api/v1/calibration", response_model=m.CalibrationResponse, tags=["twin"])
    def calibration() -> dict[str, Any]:
        """The newest calibration: parameter spread and held-out fit quality (MAE, CV(RMSE))
        per device class, unusable parameters with their reasons, drift events."""
        return queries.calibration_summary(ctx.db(), ctx.site)

    # ---- alerts ----------------------------------------------------------------------------

    def _acked(db: Any, active: list[dict[str, Any]]) -> dict[str, m.Ack]:
        starts = {a["dedup_key"]: _dt(a["starts_at"]) for a in active}
        out: dict[str, m.Ack] = {}
        for key, inc_start, at, by, comment in queries.acks(db):
            if key in starts and (inc_start is None or inc_start == starts[key]):
                out[key] = m.Ack(acked_at=at, acked_by=by, comment=comment)
        return out

    @app.get("/api/v1/alerts", response_model=m.AlertsResponse, tags=["alerts"])
    def alerts(
        history: Annotated[int, Query(ge=0, le=5000, description="history events")] = 200,
    ) -> m.AlertsResponse:
        """Open incidents (with their acknowledgement) and the history of firing, resolved and
        acknowledge events, newest first (from the delivery outbox: events reach it when the
        service has at least one hook, acknowledgements always)."""
        db = ctx.db()
        active = active_alerts()
        acked = _acked(db, active)
        out_active = [
            m.ActiveAlert(
                dedup_key=a["dedup_key"],
                rule=a["rule"],
                severity=a["severity"],
                group_kind=a["group"]["kind"],
                group_id=a["group"]["id"],
                notified=a["notified"],
                starts_at=_dt(a["starts_at"]),
                members=a["members"],
                acknowledged=acked.get(a["dedup_key"]),
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
        rules = [r.name for r in ctx.engine.rules.rules] if ctx.engine is not None else []
        return m.AlertsResponse(
            enabled=ctx.engine is not None, rules=rules, active=out_active, history=events
        )

    @app.post(
        "/api/v1/alerts/{dedup_key:path}/ack",
        response_model=m.AckResponse,
        responses={**BAD, **WRITE, 409: {"model": m.ErrorBody}},
        dependencies=writer,
        tags=["alerts"],
    )
    def acknowledge(dedup_key: str, body: m.AckRequest | None = None) -> m.AckResponse:
        """Acknowledge an open incident: recorded in the store and sent as an acknowledge
        event to the hooks that take one (PagerDuty, webhooks). ``dedup_key`` may be sent
        with its slashes as they are or URL-encoded."""
        if ctx.engine is None:
            raise _bad("alerting is off: start `dctwin serve` with --rules FILE", 409)
        body = body or m.AckRequest()
        active = {a["dedup_key"]: a for a in active_alerts()}
        if dedup_key not in active:
            known = ", ".join(sorted(active)[:10]) or "none"
            raise _bad(f"no open incident {dedup_key!r} (open: {known})", 404)
        now = datetime.now(UTC)
        db = ctx.db()
        with db.transaction():
            db.con.execute(
                "INSERT INTO alert_acks VALUES (?, ?, ?, ?, ?)",
                [dedup_key, _dt(active[dedup_key]["starts_at"]), now, body.by, body.comment],
            ).fetchall()
        rows = ctx.engine.acknowledge(dedup_key, now)
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

    @app.get("/api/v1/silences", response_model=m.SilencesResponse, tags=["alerts"])
    def list_silences(
        active_only: Annotated[bool, Query(description="only those in force now")] = False,
        limit: Annotated[
            int, Query(ge=0, le=5000, description="most listed (the newest; total counts all)")
        ] = 500,
    ) -> m.SilencesResponse:
        """Silences kept in the store, oldest first: the newest ``limit`` of them, with the
        count of all in ``total``."""
        now = datetime.now(UTC)
        items = [s for s in silences().all() if not active_only or s.active(now)]
        shown = items[-limit:] if limit else []
        return m.SilencesResponse(silences=[_silence_out(s, now) for s in shown], total=len(items))

    @app.post(
        "/api/v1/silences",
        response_model=m.SilenceOut,
        status_code=201,
        responses={**BAD, **WRITE},
        dependencies=writer,
        tags=["alerts"],
    )
    def add_silence(body: m.SilenceRequest) -> m.SilenceOut:
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
            raise _bad(f"ends_at {ends.isoformat()} must be after starts_at and now")
        s = silences().add(
            Silence(
                matchers=body.matchers,
                starts_at=starts,
                ends_at=ends,
                created_by=body.created_by,
                comment=body.comment,
            )
        )
        return _silence_out(s, now)

    @app.delete(
        "/api/v1/silences/{silence_id}",
        response_model=m.SilenceOut,
        responses={**BAD, **WRITE},
        dependencies=writer,
        tags=["alerts"],
    )
    def end_silence(silence_id: str) -> m.SilenceOut:
        """End a silence now (it stays listed, with its new end)."""
        sil = silences()
        if not any(s.id == silence_id for s in sil.all()):
            raise _bad(f"no silence {silence_id!r}", 404)
        now = datetime.now(UTC)
        sil.expire(silence_id, now)
        s = next(s for s in sil.all() if s.id == silence_id)
        return _silence_out(s, now)

    for router in ctx.routers:
        app.include_router(router)
    return app


def _dt(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    ts = datetime.fromisoformat(str(value))
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


Factory = Callable[[ApiContext], FastAPI]
