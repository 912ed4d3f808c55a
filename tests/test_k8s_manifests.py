"""deploy/k8s/: every manifest parses and passes the Kubernetes schema (kubernetes-validate,
the API's own OpenAPI schemas, strict: unknown fields fail), and what the manifests promise
holds against the real programs: one StatefulSet per shard of the site file with its volume,
probes on routes the apps serve, on the port they listen on, with a Host header the apps
accept; the flags they pass are the commands' own."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml
from fastapi.testclient import TestClient

from twin.api.app import create_app
from twin.api.context import ApiContext
from twin.cli import app as cli_app
from twin.site import load_site
from twin.siteview import Shard, create_siteview_app
from twin.store import Store

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
#: The Kubernetes release whose schemas the manifests must pass (a supported release in 2026).
K8S_VERSION = "1.30.0"
NAMESPACE = "dctwin"
#: Flags of `dctwin serve` built by another part of issue 17 (item 1, `serve --shard`) that
#: this checkout's command may not have yet.
ELSEWHERE = {"--shard"}


def docs() -> list[dict[str, Any]]:
    return [d for f in MANIFESTS for d in yaml.safe_load_all(f.read_text()) if d]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in docs() if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    [d] = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return d


def site_file() -> dict[str, Any]:
    return yaml.safe_load(named("ConfigMap", "dctwin-site")["data"]["site.yaml"])


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def probes(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        container[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in container
    ]


def port_of(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    [p] = [p for p in container["ports"] if p["name"] == port]
    return p["containerPort"]


def options(command: str) -> set[str]:
    group = typer.main.get_command(cli_app)
    cmd = group.commands[command]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in getattr(p, "opts", [])}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_passes_the_kubernetes_schema(path: Path) -> None:
    found = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert found, path
    for d in found:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        assert d["metadata"]["namespace"] == NAMESPACE, (path.name, d["metadata"]["name"])


def test_the_schema_check_catches_a_broken_manifest() -> None:
    sts = copy.deepcopy(named("StatefulSet", "dctwin-hall-a"))
    del sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    sts = copy.deepcopy(named("StatefulSet", "dctwin-hall-a"))
    sts["spec"]["volumeClaimTemplate"] = sts["spec"].pop("volumeClaimTemplates")  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_one_statefulset_per_shard_with_its_volume_and_session() -> None:
    site = site_file()
    shards = {s["name"]: s for s in site["shards"]}
    assert len(shards) == 2
    halls = [h for s in shards.values() for h in s["halls"]]
    assert sorted(halls) == sorted(h["name"] for h in site["halls"])  # each hall in one shard
    shard_sets = [
        s for s in of_kind("StatefulSet") if s["metadata"]["name"].startswith("dctwin-hall-")
    ]
    assert len(shard_sets) == len(shards)
    for name, shard in shards.items():
        sts = named("StatefulSet", f"dctwin-{name}")
        spec = sts["spec"]
        assert spec["replicas"] == 1  # one writer per DuckDB file
        assert (
            spec["selector"]["matchLabels"].items()
            <= spec["template"]["metadata"]["labels"].items()
        )
        [c] = spec["template"]["spec"]["containers"]
        args = c["args"]
        assert args[0] == "serve" and arg(args, "--shard") == name
        assert arg(args, "--client-id") == f"dctwin-{name}"  # fixed: the session survives restarts
        db = Path(arg(args, "--db"))
        [claim] = spec["volumeClaimTemplates"]
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert Path(mounts[claim["metadata"]["name"]]) == db.parent
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        # the site file is the ConfigMap, at the path serve reads
        vols = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
        site_mount = next(m for m in c["volumeMounts"] if vols.get(m["name"], {}).get("configMap"))
        assert vols[site_mount["name"]]["configMap"]["name"] == "dctwin-site"
        assert Path(arg(args, "--site")).parent == Path(site_mount["mountPath"])
        # its headless Service is the api_url of the site file
        svc = named("Service", spec["serviceName"])
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
        port = int(arg(args, "--api-port"))
        host = f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
        assert shard["api_url"] == f"http://{host}:{port}"
        assert host in arg(args, "--api-allowed-hosts").split(",")
        assert options("serve") | ELSEWHERE >= {a for a in args if a.startswith("--")}


def test_the_site_file_of_the_configmap_loads(tmp_path: Path) -> None:
    raw = site_file()
    raw.pop("shards")  # validated by the site model's shards: (issue 17 item 1)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(raw))
    site = load_site(path)
    assert [h.name for h in site.halls] == ["hall-a", "hall-b"]


def _shard_app(tmp_path: Path) -> Any:
    raw = site_file()
    raw.pop("shards")
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(raw))
    ctx = ApiContext(Store(tmp_path / "probe.duckdb"), site=load_site(path))
    return create_app(ctx)


def _routes(app: Any) -> set[str]:
    """The paths the app serves (its OpenAPI document lists included routers' paths too)."""
    return set(app.openapi()["paths"])


def test_shard_probes_hit_real_endpoints_on_the_api_port(tmp_path: Path) -> None:
    app = _shard_app(tmp_path)
    with TestClient(app) as client:
        for name in ("dctwin-hall-a", "dctwin-hall-b"):
            [c] = named("StatefulSet", name)["spec"]["template"]["spec"]["containers"]
            found = probes(c)
            assert {"startupProbe", "readinessProbe", "livenessProbe"} <= c.keys()
            for p in found:
                get = p["httpGet"]
                assert get["path"] in _routes(app), get["path"]
                assert port_of(c, get["port"]) == int(arg(c["args"], "--api-port"))
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
                assert client.get(get["path"], headers=headers).status_code == 200
                # without the header the kubelet sends the pod's IP, which the API refuses
                assert client.get(get["path"], headers={"Host": "10.0.0.7:8420"}).status_code == 400


def test_the_site_view_deployment_probes_its_own_endpoints() -> None:
    dep = named("Deployment", "dctwin-site-view")
    spec = dep["spec"]
    assert spec["replicas"] >= 2
    [c] = spec["template"]["spec"]["containers"]
    args = c["args"]
    assert args[0] == "site-view" and options("site-view") >= {
        a for a in args if a.startswith("--")
    }
    vols = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert vols["site"]["configMap"]["name"] == "dctwin-site"
    svc = named("Service", "dctwin-site-view")
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    [sp] = svc["spec"]["ports"]
    assert port_of(c, sp["targetPort"]) == int(arg(args, "--port"))
    # the Service's own name is a Host the view answers
    assert "dctwin-site-view" in arg(args, "--allowed-hosts").split(",")
    # probes: real routes of the site view, answered 200 while no shard answers at all
    app = create_siteview_app([Shard("hall-a", "http://127.0.0.1:9")], timeout_s=0.5)
    with TestClient(app) as client:
        for p in probes(c):
            get = p["httpGet"]
            assert get["path"] in _routes(app)
            assert port_of(c, get["port"]) == int(arg(args, "--port"))
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
            assert client.get(get["path"], headers=headers).status_code == 200
        no_shard = client.get("/healthz", headers={"Host": "localhost"})
        assert no_shard.status_code == 503  # no shard answers: not a probe for the view


def test_emqx_is_a_statefulset_cluster_behind_a_headless_service() -> None:
    sts = named("StatefulSet", "emqx")
    assert sts["spec"]["replicas"] >= 3 and sts["spec"]["replicas"] % 2 == 1
    headless = named("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    env = named("ConfigMap", "emqx-env")["data"]
    assert env["EMQX_CLUSTER__DISCOVERY_STRATEGY"] == "dns"
    assert env["EMQX_CLUSTER__DNS__NAME"].startswith(f"{headless['metadata']['name']}.{NAMESPACE}.")
    assert int(env["EMQX_MQTT__MAX_MQUEUE_LEN"]) > 1000  # EMQX's default drops telemetry
    [c] = sts["spec"]["template"]["spec"]["containers"]
    assert {p["httpGet"]["path"] for p in probes(c)} == {"/status"}
    assert sts["spec"]["volumeClaimTemplates"]
    client_svc = named("Service", "emqx")
    assert {p["port"] for p in client_svc["spec"]["ports"]} >= {1883}
