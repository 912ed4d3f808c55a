"""Non-finite JSON numbers in a request body (issue 28): `NaN`, `Infinity`, `-Infinity` and
`1e999` in any field of any body-taking route of the running service's API get 422 naming the
field, never 500 (Python's JSON reader takes them as floats, and a 422 quoting one could not
be written). The routes are read from the service's own OpenAPI document, so a new route is
covered when it appears."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from twin.service import Service, ServiceConfig
from twin.site import load_site

from .helpers import API_TOKEN, REPO, RULES, SCENARIOS, SMALL_SITE

TOKENS = ("NaN", "Infinity", "-Infinity", "1e999")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """`dctwin serve`'s service (its API, alert engine and what-if jobs) on an empty store."""
    db = tmp_path_factory.mktemp("finite") / "f.duckdb"
    hooks = db.with_name("hooks.yaml")
    hooks.write_text("hooks:\n  - {type: webhook, name: ops, url: 'http://127.0.0.1:9/x'}\n")
    service = Service(
        ServiceConfig(
            db=db,
            site=load_site(SMALL_SITE),
            calibrate_every_s=0,
            detect_every_s=0,
            rules=RULES,
            hooks=hooks,
            api_port=0,
            api_token=API_TOKEN,
            whatif_bundles=REPO / "sample_telemetry",
            whatif_scenarios=SCENARIOS,
        )
    )
    try:
        service.start()
        assert service.url is not None
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        with httpx.Client(base_url=service.url, timeout=30, headers=headers) as client:
            yield client
    finally:
        service.stop()


def _body_routes(client: httpx.Client) -> list[tuple[str, str, list[str]]]:
    """(method, path with its parameters filled, the body's top-level fields) of every route
    that takes a JSON body."""
    doc = client.get("/openapi.json").json()
    schemas = doc.get("components", {}).get("schemas", {})
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" not in content:
                continue
            schema = content["application/json"]["schema"]
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
            fields = list(schema.get("properties", {})) or ["value"]
            filled = path.replace("{kind}", "gpu")
            filled = filled.replace("{key}", "k").replace("{job_id}", "j")
            filled = filled.replace("{silence_id}", "1").replace("{id}", "x")
            out.append((method.upper(), filled, fields))
    return out


@pytest.mark.slow  # about 4 s: every field of every body route, four tokens each
def test_every_body_route_answers_non_finite_numbers_with_422_naming_the_field(api):
    routes = _body_routes(api)
    paths = {p for _, p, _ in routes}
    # the ones the hostile run found, among what the document lists
    for p in ("/api/v1/state/gpu", "/api/v1/series", "/api/v1/silences"):
        assert p in paths, sorted(paths)
    for method, path, fields in routes:
        for field in fields:
            for token in TOKENS:
                body = f'{{"{field}": {token}}}'.encode()
                r = api.request(
                    method, path, content=body, headers={"content-type": "application/json"}
                )
                assert r.status_code == 422, (method, path, field, token, r.text)
                (err,) = r.json()["detail"]
                assert err["loc"] == ["body", field], err
                assert field in err["msg"] and err["input"] == token, err
        # nested: the location names the element
        body = f'{{"{fields[0]}": [1.0, {{"a": NaN}}]}}'.encode()
        r = api.request(method, path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == [
            "body",
            fields[0],
            1,
            "a",
        ]


def test_finite_bodies_still_reach_the_routes(api):
    r = api.post("/api/v1/state/gpu", json={"ids": ["trn-r01-n1:0"], "max_age_s": 60.0})
    assert r.status_code == 200, r.text
    r = api.post("/api/v1/state/gpu", json={"ids": ["trn-r01-n1:0"], "max_age_s": -1})
    assert r.status_code == 422 and "max_age_s" in r.text
    # the same value in a query string, as before
    r = api.get("/api/v1/state/gpu", params={"max_age_s": "nan"})
    assert r.status_code == 422, r.text
    assert Path(__file__).exists()
