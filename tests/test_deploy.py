"""deploy/: the shipped broker config, systemd units, DaemonSet and compose file are well formed
and keep the properties deploy/README.md promises."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))


def directives(text: str) -> dict[str, list[str]]:
    """``key -> values`` of a systemd unit or mosquitto.conf (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", text)
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=") if "=" in line.split()[0] else line.partition(" ")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("conf", ["mosquitto.conf", "compose/mosquitto.conf"])
def test_mosquitto_conf_has_auth_persistence_and_raised_queues(conf):
    d = directives((DEPLOY / conf).read_text())
    assert d["allow_anonymous"] == ["false"]
    assert d["password_file"]
    assert d["persistence"] == ["true"] and d["persistence_location"]
    assert d["max_queued_messages"] == ["0"]


def test_units_name_user_env_file_restart():
    assert {u.name for u in UNITS} == {"dctwin-serve.service", "dctwin-collect-nvml.service"}
    for unit in UNITS:
        d = directives(unit.read_text())
        assert d["User"] == ["dctwin"], unit.name
        assert d["EnvironmentFile"][0].startswith("/etc/dctwin/"), unit.name
        assert d["Restart"] == ["on-failure"], unit.name
        assert d["StateDirectory"] == ["dctwin"], unit.name
        assert "PASSWORD" not in d["ExecStart"][0], unit.name
    serve = directives((DEPLOY / "systemd" / "dctwin-serve.service").read_text())
    assert " serve " in serve["ExecStart"][0]
    nvml = directives((DEPLOY / "systemd" / "dctwin-collect-nvml.service").read_text())
    assert (
        "collect nvml" in nvml["ExecStart"][0]
        and "--spool /var/lib/dctwin/" in (nvml["ExecStart"][0])
    )
    assert "PrivateDevices" not in nvml  # NVML needs /dev/nvidia*


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_pass_systemd_analyze_verify(tmp_path):
    true = shutil.which("true")
    assert true
    for unit in UNITS:  # the binary is not installed here: verify everything else
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/dctwin/bin/dctwin", true))
    r = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(map(str, tmp_path.glob("*.service")))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "Unknown" not in r.stderr and "Failed" not in r.stderr, r.stderr


def test_daemonset_for_gpu_nodes():
    docs = [
        d
        for d in yaml.safe_load_all(
            (DEPLOY / "k8s" / "dctwin-collect-nvml-daemonset.yaml").read_text()
        )
        if d
    ]
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    assert ds["apiVersion"] == "apps/v1"
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["runtimeClassName"] == "nvidia"
    assert any(k.startswith("nvidia.com/gpu") for k in spec["nodeSelector"])
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    [c] = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["command"] == ["dctwin"] and c["args"][:2] == ["collect", "nvml"]
    assert "$(NODE_NAME)" in c["args"]
    assert "nvidia.com/gpu" not in str(c.get("resources", {}))  # takes no GPU from workloads
    assert [s["secretRef"]["name"] for s in c["envFrom"]] == ["dctwin-mqtt"]
    spool = c["args"][c["args"].index("--spool") + 1]
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == spool]
    [vol] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert vol["hostPath"]["path"].startswith("/var/lib/dctwin/")


def test_compose_broker_service_console():
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    s = doc["services"]
    assert s["broker"]["image"].startswith("eclipse-mosquitto:2")
    assert any(v.startswith("./compose:") for v in s["broker"]["volumes"])
    twin = s["twin"]["command"]
    assert twin[:2] == ["dctwin", "serve"] and twin[twin.index("--broker") + 1] == "broker:1883"
    console = s["console"]["command"]
    assert console[:3] == ["streamlit", "run", "dashboards/app.py"]
    assert s["console"]["environment"]["DCTWIN_API_URL"] == "http://twin:8420"
    assert s["twin"]["build"]["dockerfile"] == "deploy/Dockerfile"  # via the YAML anchor
    for name in ("twin", "console"):
        assert s[name]["env_file"] == "dctwin.env"
    # The files the compose file mounts from the repository exist.
    for svc in s.values():
        for v in svc.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), src
    assert (DEPLOY / "dctwin.env.example").exists()
