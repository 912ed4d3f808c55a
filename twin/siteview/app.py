"""The site view's FastAPI application: the shards' API, merged (see :mod:`twin.siteview`).

Every read the console and Prometheus make is served: /healthz, /metrics, /api/v1 (this
app's own index), and overview, headroom, racks, rack detail, power, cooling, network,
alerts, silences, series, state, site, status, fleets, hot spots, forecast and calibration
under /api/v1. Each is asked of every shard at once and merged by :mod:`twin.siteview.merge`;
the answer is 200 while at least one shard answers, with a ``shards`` section naming each
shard's status and age. When no shard answers with a result, the answer is the first shard
4xx (a question no shard can answer, e.g. an unknown rack) or 503 with ``shards``.

Writes go to every shard with the caller's ``Authorization`` header (each shard checks its
own token): an acknowledgement is answered by the shard that holds the incident, a silence
is added to (or ended on) every shard, since an incident may come from any of them.
What-if jobs run on a shard's own API (``features.whatif`` is false here).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from twin.api.deps import API_VERSION, ARROW_STREAM
from twin.api.guard import HostCheck, allowed_hosts
from twin.siteview import merge
from twin.siteview.fanout import Answer, Fanout, Shard

V1 = "/api/v1"

Merge = Callable[[list[dict[str, Any]]], dict[str, Any]]

#: The Prometheus text format's sample line: name, optional {labels}, the rest (value, time).
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?(\s.*)$")
_META = re.compile(r"^#\s+(HELP|TYPE)\s+([a-zA-Z_:][a-zA-Z0-9_:]*)")


def _json(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(jsonable_encoder(body), status_code=status)


def _params(request: Request) -> dict[str, str]:
    return dict(request.query_params)


def _auth(request: Request) -> dict[str, str]:
    a = request.headers.get("authorization")
    return {"Authorization": a} if a else {}


def _error(answers: list[Answer], report: list[dict[str, Any]]) -> JSONResponse:
    """No shard gave a result: the first shard's 4xx, else 503; both with ``shards``."""
    for a in answers:
        if a.status is not None and 400 <= a.status < 500:
            body = a.body if isinstance(a.body, dict) else {"detail": str(a.body)[:500]}
            detail = body.get("detail")
            if isinstance(detail, str):
                detail = f"shard {a.shard.name}: {detail}"
            return _json({**body, "detail": detail, "shards": report}, a.status)
    why = "; ".join(f"{a.shard.name}: {a.error}" for a in answers)
    return _json({"detail": f"no shard answered: {why}", "shards": report}, 503)


def _report(fan: Fanout, answers: list[Answer]) -> list[dict[str, Any]]:
    """Each shard's status beside its HTTP status; a shard answered from its last good
    answer (no answer within the fan-out's ``answer_within_s``) is stale, aged by that
    answer."""
    by_name = {a.shard.name: a for a in answers}
    now = datetime.now(UTC)
    out = []
    for r in fan.report(now):
        a = by_name.get(r["name"])
        row = {**r, "http_status": None if a is None else a.status}
        if a is not None and a.cached_at is not None:
            age_s = max((now - a.cached_at).total_seconds(), 0.0)
            row.update(
                status="stale",
                age_s=round(age_s, 3),
                error=f"no answer within {fan.answer_within_s:g} s: its answer of"
                f" {age_s:.0f} s ago is shown (asked again meanwhile)",
            )
        out.append(row)
    return out


def merge_metrics(texts: list[tuple[str, str]]) -> str:
    """The shards' Prometheus texts as one, every sample labelled ``shard="NAME"`` and each
    family's samples kept together under one HELP and TYPE."""
    families: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for shard, text in texts:
        current = ""
        label = f'shard="{shard}"'
        for line in text.splitlines():
            if not line.strip():
                continue
            meta = _META.match(line)
            if meta:
                current = meta.group(2)
                head = families.setdefault(current, [])
                if len(head) < 2 and line not in head:
                    head.append(line)
                samples.setdefault(current, [])
                continue
            if line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            if m is None:
                continue
            name, labels, rest = m.groups()
            labels = f"{label},{labels}" if labels else label
            samples.setdefault(current or name, []).append(f"{name}{{{labels}}}{rest}")
    out: list[str] = []
    for fam in samples:
        out += families.get(fam, [])
        out += samples[fam]
    return "\n".join(out) + "\n"


def _own_metrics(report: list[dict[str, Any]]) -> str:
    lines = [
        "# HELP dctwin_siteview_shard_up 1 while the shard's API answers, 0 while it is stale.",
        "# TYPE dctwin_siteview_shard_up gauge",
    ]
    lines += [
        f'dctwin_siteview_shard_up{{shard="{r["name"]}"}} {0 if r["status"] == "stale" else 1}'
        for r in report
    ]
    lines += [
        "# HELP dctwin_siteview_shard_age_seconds Seconds since the shard's last good answer"
        " (NaN: never answered).",
        "# TYPE dctwin_siteview_shard_age_seconds gauge",
    ]
    lines += [
        f'dctwin_siteview_shard_age_seconds{{shard="{r["name"]}"}} '
        f"{'NaN' if r['age_s'] is None else r['age_s']}"
        for r in report
    ]
    return "\n".join(lines) + "\n"


def _health(answers: list[Answer], report: list[dict[str, Any]]) -> JSONResponse:
    stale = [r["name"] for r in report if r["status"] == "stale"]
    bad = [
        f"{a.shard.name} {a.body.get('status')}"
        for a in answers
        if isinstance(a.body, dict) and a.body.get("status") in ("degraded", "stalled")
    ]
    if len(stale) == len(report):
        status, code = "stalled", 503
    elif stale or bad:
        status, code = "degraded", 200
    else:
        status, code = "ok", 200
    why = [f"shard {r['name']} stale ({r['error']})" for r in report if r["status"] == "stale"]
    why += [f"shard {b}" for b in bad]
    body = {
        "status": status,
        "reason": "; ".join(why) or None,
        "site": merge.names([a.body for a in answers if isinstance(a.body, dict)]),
        "shards": report,
        "shard_health": {
            a.shard.name: a.body for a in answers if a.status is not None and a.body is not None
        },
    }
    return _json(body, code)


async def _merged(
    fan: Fanout,
    method: str,
    path: str,
    fn: Merge,
    params: dict[str, Any] | None = None,
    body: Any = None,
) -> Response:
    """``path`` asked of every shard, the results merged by ``fn``, with ``shards``."""
    answers = await fan.call(method, path, params=params, json=body)
    report = _report(fan, answers)
    bodies = [a.body for a in answers if a.ok and isinstance(a.body, dict)]
    if not bodies:
        return _error(answers, report)
    return _json({**fn(bodies), "shards": report})


async def _write(fan: Fanout, method: str, path: str, request: Request, body: Any) -> Response:
    """A write to every shard with the caller's Authorization: the first shard's success
    answers (with ``shards`` and ``applied_on``, the shards that took it), else the first
    4xx, else 503."""
    answers = await fan.call(method, path, json=body, headers=_auth(request))
    report = _report(fan, answers)
    done = [a for a in answers if a.ok]
    if not done:
        return _error(answers, report)
    first = done[0]
    out = first.body if isinstance(first.body, dict) else {}
    extra = {"shards": report, "applied_on": [a.shard.name for a in done]}
    return _json({**out, **extra}, first.status or 200)


def _series_refusal(request: Request, agg: str | None, fmt: str | None) -> Response | None:
    """400 for what the site view cannot combine across shards: Arrow, and agg=mean."""
    if fmt == "arrow" or ARROW_STREAM in request.headers.get("accept", ""):
        return _json(
            {"detail": "the site view answers series in JSON only; ask a shard for Arrow"}, 400
        )
    if agg not in (None, "sum", "min", "max"):
        return _json(
            {
                "detail": f"agg={agg!r}: the site view combines sum, min and max across"
                " shards (a mean needs each shard's device count: ask agg=sum)"
            },
            400,
        )
    return None


#: The reads merged by one rule of :mod:`twin.siteview.merge`, asked with the caller's query.
LISTINGS: dict[str, Merge] = {
    f"{V1}/headroom": merge.headroom,
    f"{V1}/headroom/history": merge.headroom_history,
    f"{V1}/racks": merge.listing("racks"),
    f"{V1}/power": merge.listing("phases"),
    f"{V1}/cooling": merge.listing("cdus"),
    f"{V1}/network": merge.listing("links"),
    f"{V1}/silences": merge.silences,
    f"{V1}/site": merge.site,
    f"{V1}/fleets": merge.fleets,
    f"{V1}/forecast": merge.forecast,
    f"{V1}/hotspots": merge.hotspots,
    f"{V1}/calibration": merge.calibration,
}


def _add_listings(app: FastAPI, fan: Fanout) -> None:
    def handler(path: str, fn: Merge) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await _merged(fan, "GET", path, fn, _params(request))

        return route

    for path, fn in LISTINGS.items():
        app.add_api_route(
            path,
            handler(path, fn),
            methods=["GET"],
            tags=["site view"],
            name="get_" + path.removeprefix(V1 + "/"),
            summary=f"{path.removeprefix(V1 + '/')} of every shard, merged",
        )


def _add_service_routes(app: FastAPI, fan: Fanout) -> None:
    @app.get("/healthz", tags=["service"])
    async def healthz() -> Response:
        """200 ok while every shard answers, 200 degraded while some are stale or report
        degraded or stalled, 503 when none answers; each shard's own /healthz in
        ``shard_health``."""
        answers = await fan.call("GET", "/healthz")
        return _health(answers, _report(fan, answers))

    @app.get("/metrics", response_class=PlainTextResponse, tags=["service"])
    async def metrics() -> Response:
        """Every shard's /metrics, each sample labelled ``shard``, and the site view's own
        ``dctwin_siteview_shard_up`` and ``dctwin_siteview_shard_age_seconds``."""
        answers = await fan.call("GET", "/metrics")
        texts = [
            (a.shard.name, a.body.decode("utf-8", "replace"))
            for a in answers
            if a.ok and isinstance(a.body, bytes)
        ]
        body = merge_metrics(texts) + _own_metrics(_report(fan, answers))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get(V1, tags=["service"])
    async def index() -> dict[str, Any]:
        """This site view's endpoints and shards (no shard is asked)."""
        return {
            "version": API_VERSION,
            "site": None,
            "endpoints": sorted(app.openapi()["paths"]),
            "features": {"whatif": False, "site_view": True},
            "shards": [{"name": s.name, "url": s.url} for s in fan.shards],
        }

    @app.get(f"{V1}/status", tags=["site view"])
    async def status(request: Request) -> Response:
        """Store counts summed; each shard's service counters under its name."""
        answers = await fan.call("GET", f"{V1}/status", params=_params(request))
        report = _report(fan, answers)
        ok = [a for a in answers if a.ok and isinstance(a.body, dict)]
        if not ok:
            return _error(answers, report)
        names = [a.shard.name for a in ok]
        return _json({**merge.status([a.body for a in ok], names), "shards": report})

    @app.get(f"{V1}/whatif", tags=["site view"])
    async def whatif() -> Response:
        """What-if jobs run on a shard's API, not the site view's."""
        return _json({"detail": "the site view runs no what-if jobs: ask a shard's API"}, 404)


def _add_reads(app: FastAPI, fan: Fanout) -> None:
    @app.get(f"{V1}/overview", tags=["site view"])
    async def overview() -> Response:
        """Totals summed over the shards; alert counts on the merged, deduplicated alerts."""
        answers, alerts = await asyncio.gather(
            fan.call("GET", f"{V1}/overview"),
            fan.call("GET", f"{V1}/alerts", params={"history": 0}),
        )
        report = _report(fan, answers)
        bodies = [a.body for a in answers if a.ok and isinstance(a.body, dict)]
        if not bodies:
            return _error(answers, report)
        ab = [a.body for a in alerts if a.ok and isinstance(a.body, dict)]
        return _json({**merge.overview(bodies, merge.alerts(ab) if ab else None), "shards": report})

    @app.get(f"{V1}/alerts", tags=["site view"])
    async def alerts(request: Request) -> Response:
        """Active alerts merged by dedup_key; history deduplicated, newest first."""
        raw = request.query_params.get("history")
        history = int(raw) if raw is not None and raw.isdigit() else None
        return await _merged(
            fan, "GET", f"{V1}/alerts", lambda b: merge.alerts(b, history), _params(request)
        )

    @app.get(f"{V1}/racks/{{name}}", tags=["site view"])
    async def rack_detail(name: str) -> Response:
        """The rack from the first shard that has it."""
        answers = await fan.call("GET", f"{V1}/racks/{quote(name, safe='')}")
        report = _report(fan, answers)
        for a in answers:
            if a.ok and isinstance(a.body, dict):
                return _json({**a.body, "shard": a.shard.name, "shards": report})
        return _error(answers, report)

    @app.get(f"{V1}/series", tags=["site view"])
    async def series(request: Request) -> Response:
        """The series of every shard; with agg=sum|min|max combined per timestamp."""
        agg = request.query_params.get("agg")
        refused = _series_refusal(request, agg, request.query_params.get("format"))
        if refused is not None:
            return refused
        fn: Merge = lambda b: merge.series(b, agg)  # noqa: E731
        return await _merged(fan, "GET", f"{V1}/series", fn, _params(request))

    @app.post(f"{V1}/series", tags=["site view"])
    async def series_post(request: Request) -> Response:
        """As GET /api/v1/series, the query in the body."""
        body = await request.json()
        agg = body.get("agg") if isinstance(body, dict) else None
        fmt = body.get("format") if isinstance(body, dict) else None
        refused = _series_refusal(request, agg, fmt)
        if refused is not None:
            return refused
        fn: Merge = lambda b: merge.series(b, agg)  # noqa: E731
        return await _merged(fan, "POST", f"{V1}/series", fn, body=body)

    @app.get(f"{V1}/state/{{kind}}", tags=["site view"])
    async def state(request: Request, kind: str) -> Response:
        """The latest sample of each device of every shard."""
        path = f"{V1}/state/{quote(kind, safe='')}"
        return await _merged(fan, "GET", path, merge.state, _params(request))

    @app.post(f"{V1}/state/{{kind}}", tags=["site view"])
    async def state_post(request: Request, kind: str) -> Response:
        """As GET /api/v1/state/{kind}, the ids in the body."""
        path = f"{V1}/state/{quote(kind, safe='')}"
        return await _merged(fan, "POST", path, merge.state, body=await request.json())


def _add_writes(app: FastAPI, fan: Fanout) -> None:
    @app.post(f"{V1}/alerts/{{dedup_key:path}}/ack", tags=["site view"])
    async def acknowledge(request: Request, dedup_key: str) -> Response:
        """The acknowledgement, taken by the shards that hold the incident."""
        raw = await request.body()
        body = await request.json() if raw else None
        path = f"{V1}/alerts/{quote(dedup_key, safe='/')}/ack"
        return await _write(fan, "POST", path, request, body)

    @app.post(f"{V1}/silences", tags=["site view"])
    async def add_silence(request: Request) -> Response:
        """The silence, added to every shard (each keeps its own id)."""
        return await _write(fan, "POST", f"{V1}/silences", request, await request.json())

    @app.delete(f"{V1}/silences/{{silence_id}}", tags=["site view"])
    async def end_silence(request: Request, silence_id: str) -> Response:
        """Ends the silence on the shard that has this id."""
        path = f"{V1}/silences/{quote(silence_id, safe='')}"
        return await _write(fan, "DELETE", path, request, None)


def create_siteview_app(
    shards: list[Shard],
    timeout_s: float = 5.0,
    host: str = "127.0.0.1",
    extra_hosts: tuple[str, ...] = (),
    answer_within_s: float | None = None,
) -> FastAPI:
    """The site view over ``shards`` (see the module docstring); ``timeout_s`` per shard
    call; ``answer_within_s``: past it, a read is answered from a slow shard's last good
    answer, marked stale with its age (None: wait ``timeout_s``); ``host`` and
    ``extra_hosts``: the Host header values it answers."""
    fan = Fanout(shards, timeout_s=timeout_s, answer_within_s=answer_within_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await fan.close()

    app = FastAPI(
        title="dctwin site view",
        version=API_VERSION,
        lifespan=lifespan,
        description=(
            "The dctwin API for a whole site, merged from its shards' APIs. Every answer"
            " carries `shards`: each shard's status (ok or stale) and age in seconds."
        ),
    )
    app.add_middleware(HostCheck, allowed=allowed_hosts(host, extra_hosts))
    app.state.fanout = fan
    _add_service_routes(app, fan)
    _add_reads(app, fan)
    _add_listings(app, fan)
    _add_writes(app, fan)
    return app
