"""The API's structure (issue 27, item 5): routers that own their prefix and OpenAPI tag, the
route table held to its contract, what-if jobs per app reached by dependency, all SQL in the
query module, and the site view serving the service's GET routes."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

import twin.api.routes
from twin.api import ApiContext, create_app
from twin.api import whatif as whatif_module
from twin.api.routes import ROUTERS
from twin.api.whatif import WhatifJobs, WhatifSettings, get_jobs
from twin.siteview import Shard, create_siteview_app
from twin.store import Store

REPO = Path(__file__).resolve().parents[1]
TOKEN = "structure-test-token-0123456789"
HEADERS = {"Host": "localhost", "Authorization": f"Bearer {TOKEN}"}

#: The service's routes (method, path) as its OpenAPI document lists them, what-if jobs on:
#: the contract. A route added or removed changes this list on purpose, never by accident.
CONTRACT = [
    ("DELETE", "/api/v1/silences/{silence_id}"),
    ("GET", "/api/v1"),
    ("GET", "/api/v1/alerts"),
    ("GET", "/api/v1/calibration"),
    ("GET", "/api/v1/cooling"),
    ("GET", "/api/v1/fleets"),
    ("GET", "/api/v1/forecast"),
    ("GET", "/api/v1/headroom"),
    ("GET", "/api/v1/headroom/history"),
    ("GET", "/api/v1/hotspots"),
    ("GET", "/api/v1/network"),
    ("GET", "/api/v1/overview"),
    ("GET", "/api/v1/power"),
    ("GET", "/api/v1/racks"),
    ("GET", "/api/v1/racks/{name}"),
    ("GET", "/api/v1/series"),
    ("GET", "/api/v1/silences"),
    ("GET", "/api/v1/site"),
    ("GET", "/api/v1/state/{kind}"),
    ("GET", "/api/v1/status"),
    ("GET", "/api/v1/whatif"),
    ("GET", "/api/v1/whatif/{job}"),
    ("GET", "/api/v1/whatif/{job}/figures"),
    ("GET", "/api/v1/whatif/{job}/report.{ext}"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("POST", "/api/v1/alerts/{dedup_key}/ack"),
    ("POST", "/api/v1/series"),
    ("POST", "/api/v1/silences"),
    ("POST", "/api/v1/state/{kind}"),
    ("POST", "/api/v1/whatif"),
]

#: The OpenAPI groups: the tag of each router's routes.
TAGS = {"service", "site", "telemetry", "twin", "alerts", "what-if"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "api.duckdb")
    yield s
    s.close()


def _context(store: Store, tmp_path: Path) -> ApiContext:
    """A context with what-if jobs on: one bundle (``broken``, whose manifest does not load:
    its jobs fail at once) and one scenario."""
    bundles, scenarios = tmp_path / "bundles", tmp_path / "scenarios"
    (bundles / "broken").mkdir(parents=True)
    (bundles / "broken" / "manifest.json").write_text("{}")
    scenarios.mkdir()
    (scenarios / "hotter.yaml").write_text("name: hotter\n")
    settings = WhatifSettings(bundles, scenarios, tmp_path / "reports")
    return ApiContext(store, token=TOKEN, whatif=settings)


def _operations(app: FastAPI) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, ops in app.openapi()["paths"].items()
        for method, op in ops.items()
    ]


def test_the_route_table_is_the_contract_and_every_route_has_a_tag(
    store: Store, tmp_path: Path
) -> None:
    ops = _operations(create_app(_context(store, tmp_path)))
    assert sorted((method, path) for method, path, _ in ops) == CONTRACT
    untagged = [(method, path) for method, path, op in ops if not op.get("tags")]
    assert not untagged, f"routes without an OpenAPI tag: {untagged}"
    assert {t for _, _, op in ops for t in op["tags"]} == TAGS
    # without what-if settings the service has no what-if routes at all
    plain = create_app(ApiContext(store))
    assert sorted((m, p) for m, p, _ in _operations(plain)) == [
        r for r in CONTRACT if not r[1].startswith("/api/v1/whatif")
    ]


def _route_modules() -> list[Any]:
    names = [m.name for m in pkgutil.iter_modules(twin.api.routes.__path__)]
    return [importlib.import_module(f"twin.api.routes.{n}") for n in sorted(names)]


def test_each_router_owns_its_prefix_and_tag() -> None:
    routers = [mod.router for mod in _route_modules()] + [whatif_module.router]
    assert sorted(map(id, ROUTERS)) == sorted(id(r) for r in routers[:-1])
    for router in routers:
        assert isinstance(router, APIRouter)
        assert len(router.tags) == 1 and router.tags[0] in TAGS, router.tags
        for route in router.routes:
            path = getattr(route, "path", "")
            assert path.startswith(router.prefix), (router.prefix, path)
            # the route names no tag of its own: the router's is its group
            assert getattr(route, "tags", []) == router.tags, (path, route.tags)  # type: ignore[attr-defined]


def _finish(c: TestClient, job: str) -> dict[str, Any]:
    """The job once it left queued and running (a broken bundle fails it at once)."""
    for _ in range(3000):
        state = c.get(f"/api/v1/whatif/{job}", headers=HEADERS).json()
        if state["state"] not in ("queued", "running"):
            return state
        time.sleep(0.01)
    raise AssertionError(f"the what-if job {job} never finished: {state}")


def test_two_apps_on_one_context_keep_their_own_whatif_jobs(store: Store, tmp_path: Path) -> None:
    ctx = _context(store, tmp_path)
    a, b = create_app(ctx), create_app(ctx)
    assert isinstance(a.state.whatif, WhatifJobs) and a.state.whatif is not b.state.whatif
    body = {"bundle": "broken", "scenarios": ["hotter"]}
    with TestClient(a) as ca, TestClient(b) as cb:
        r = ca.post("/api/v1/whatif", json=body, headers=HEADERS)
        assert r.status_code == 202, r.text
        job = r.json()["job"]
        done = _finish(ca, job)
        assert done["state"] == "failed" and done["error"]
        assert [j["job"] for j in ca.get("/api/v1/whatif", headers=HEADERS).json()["reports"]] == [
            job
        ]
        # the other app never saw it
        listing = cb.get("/api/v1/whatif", headers=HEADERS).json()
        assert listing["bundles"] == ["broken"] and listing["reports"] == []
        assert cb.get(f"/api/v1/whatif/{job}", headers=HEADERS).status_code == 404
        r = cb.post("/api/v1/whatif", json=body, headers=HEADERS)
        assert r.status_code == 202 and r.json()["job"] != job
        _finish(cb, r.json()["job"])
        assert {j["job"] for j in ca.get("/api/v1/whatif", headers=HEADERS).json()["reports"]} == {
            job
        }


def test_the_whatif_routes_reach_their_jobs_by_dependency(store: Store, tmp_path: Path) -> None:
    ctx = _context(store, tmp_path)
    app = create_app(ctx)
    other = WhatifJobs(WhatifSettings(tmp_path / "none", tmp_path / "none", tmp_path / "out"))
    app.dependency_overrides[get_jobs] = lambda: other
    with TestClient(app) as c:
        listing = c.get("/api/v1/whatif", headers=HEADERS).json()
        assert listing == {"bundles": [], "scenarios": [], "reports": []}
        r = c.post(
            "/api/v1/whatif", json={"bundle": "broken", "scenarios": ["hotter"]}, headers=HEADERS
        )
        assert r.status_code == 404 and "no bundle 'broken'" in r.json()["detail"]
    assert app.state.whatif.index().reports == []


#: Calls that run SQL on a DuckDB connection, or fetch a result of one.
SQL_CALLS = {"execute", "executemany", "sql", "query", "fetchall", "fetchone", "fetchmany"}


def sql_uses(source: str) -> list[str]:
    """What in ``source`` runs SQL itself: a call of :data:`SQL_CALLS` on anything, a use of
    a store's raw connection (``.con``), an import of duckdb."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SQL_CALLS:
                found.append(f"line {node.lineno}: .{node.func.attr}(")
        elif isinstance(node, ast.Attribute) and node.attr == "con":
            found.append(f"line {node.lineno}: .con")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if any(m and m.split(".")[0] == "duckdb" for m in mods):
                found.append(f"line {node.lineno}: import duckdb")
    return found


def test_the_sql_scan_finds_sql() -> None:
    assert sql_uses('db.con.execute("SELECT 1").fetchall()') == [
        "line 1: .fetchall(",
        "line 1: .execute(",
        "line 1: .con",
    ]
    assert sql_uses("import duckdb\nx = cur.sql('SELECT 2')") == [
        "line 1: import duckdb",
        "line 2: .sql(",
    ]
    assert sql_uses("from duckdb import connect") == ["line 1: import duckdb"]
    assert sql_uses("api.ctx.db().status()") == []


def test_no_sql_in_the_api_but_in_its_query_module() -> None:
    api = REPO / "twin" / "api"
    paths = sorted(p for p in api.rglob("*.py") if p != api / "queries.py")
    assert api / "app.py" in paths and api / "routes" / "components.py" in paths
    found = {str(p.relative_to(REPO)): uses for p in paths if (uses := sql_uses(p.read_text()))}
    assert not found, f"SQL outside twin/api/queries.py (move it there): {found}"


def _get_paths(app: FastAPI) -> set[str]:
    return {path for method, path, _ in _operations(app) if method == "GET"}


def test_the_site_view_lists_the_service_get_routes(store: Store, tmp_path: Path) -> None:
    """The site view's index lists its endpoints; its GET routes are the service's, but for
    the what-if jobs, which live on the shard that runs them (the site view's own
    /api/v1/whatif says so)."""
    view = create_siteview_app([Shard("hall-a", "http://127.0.0.1:9")], timeout_s=0.5)
    with TestClient(view) as c:
        index = c.get("/api/v1", headers={"Host": "localhost"}).json()
    assert index["features"] == {"whatif": False, "site_view": True}
    listed_get = set(index["endpoints"]) & _get_paths(view)
    assert listed_get == _get_paths(view)
    service_get = _get_paths(create_app(_context(store, tmp_path)))
    shard_only = {p for p in service_get if p.startswith("/api/v1/whatif/")}
    assert shard_only == {
        "/api/v1/whatif/{job}",
        "/api/v1/whatif/{job}/figures",
        "/api/v1/whatif/{job}/report.{ext}",
    }
    assert listed_get == service_get - shard_only, (
        f"the site view lacks {sorted(service_get - shard_only - listed_get)}"
        f" and has beyond the service {sorted(listed_get - service_get)}"
    )
