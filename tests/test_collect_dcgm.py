"""DCGM collector against a local HTTP server serving a dcgm-exporter scrape in the real
exposition format (HELP and TYPE lines from dcgm-exporter's default counters, its label set,
MIG labels on one GPU instance, DCGM blank sentinels)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from collectors.base import CollectorError
from collectors.contract import QUANTITIES, decode
from collectors.dcgm import (
    DCGM_FIELDS,
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    DCGM_INT64_BLANK,
    DcgmCollector,
    is_blank,
)
from twin.broker import free_port

COUNTERS = Path(__file__).parent / "fixtures" / "dcgm" / "default-counters.csv"
_LINE = re.compile(r"^#?\s*(DCGM_\w+)\s*,\s*(\w+)\s*,\s*(.*)$")


def default_counters() -> dict[str, tuple[str, str]]:
    """DCGM field -> (Prometheus type, help) from dcgm-exporter's default-counters.csv,
    commented-out (off by default) lines included."""
    out = {}
    for line in COUNTERS.read_text().splitlines():
        m = _LINE.match(line.strip())
        if m:
            out[m.group(1)] = (m.group(2), m.group(3).strip())
    return out


#: Help and type of fields that are not in default-counters.csv (from dcgm-exporter's dcp file).
EXTRA_HELP = {
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gauge", "Power management limit (in W)."),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("gauge", "Enforced power limit (in W)."),
}

H100 = "NVIDIA H100 80GB HBM3"
GPU0 = {
    "gpu": "0",
    "UUID": "GPU-5f0c4a3e-1111-2222-3333-444455556666",
    "pci_bus_id": "00000000:18:00.0",
    "device": "nvidia0",
    "modelName": H100,
}
GPU1_MIG = {
    "gpu": "1",
    "UUID": "GPU-7d1e2f3a-aaaa-bbbb-cccc-ddddeeeeffff",
    "pci_bus_id": "00000000:2A:00.0",
    "device": "nvidia1",
    "modelName": H100,
    "GPU_I_PROFILE": "3g.40gb",
    "GPU_I_ID": "1",
}

# What dcgm-exporter prints, field by field (DCGM units). Blanks are DCGM sentinels.
VALUES: dict[str, dict[str, str]] = {
    "DCGM_FI_DEV_SM_CLOCK": {"0": "1980", "1": "1755"},
    "DCGM_FI_DEV_MEM_CLOCK": {"0": "2619", "1": "2619"},
    "DCGM_FI_DEV_MEMORY_TEMP": {"0": str(DCGM_INT64_BLANK + 2), "1": "55"},  # NOT_SUPPORTED
    "DCGM_FI_DEV_GPU_TEMP": {"0": "61", "1": "48"},
    "DCGM_FI_DEV_POWER_USAGE": {"0": "612.345000", "1": "301.500000"},
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": {"0": "9876543210", "1": "1234567"},
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": {"0": "0", "1": "0"},
    "DCGM_FI_DEV_GPU_UTIL": {"0": "97", "1": str(DCGM_INT32_BLANK + 2)},  # int32 NOT_SUPPORTED
    "DCGM_FI_DEV_MEM_COPY_UTIL": {"0": "41", "1": "7"},
    "DCGM_FI_DEV_ENC_UTIL": {"0": "0", "1": "0"},
    "DCGM_FI_DEV_XID_ERRORS": {"0": "0", "1": "79"},
    "DCGM_FI_DEV_FB_FREE": {"0": "28575", "1": "28000"},
    "DCGM_FI_DEV_FB_USED": {"0": "52345", "1": "12000"},
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": {"0": "0.912345", "1": "0.400000"},
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": {"0": f"{DCGM_FP64_BLANK:f}", "1": "0.250000"},
    "DCGM_FI_PROF_SM_ACTIVE": {"0": "0.873000", "1": "0.410000"},
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": {"0": "700.000000", "1": "700.000000"},
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": {"1": "350.000000"},
}


def scrape(host_label: str | None = "Hostname", hosts: tuple[str, ...] = ("gpu-node-017",)) -> str:
    """A dcgm-exporter /metrics body, in its label order (gpu, UUID, pci_bus_id, device,
    modelName, [GPU_I_PROFILE, GPU_I_ID], Hostname, DCGM_FI_DRIVER_VERSION)."""
    counters = {**default_counters(), **EXTRA_HELP}
    lines = []
    for field, per_gpu in VALUES.items():
        ptype, help_text = counters[field]
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {ptype}"]
        for host in hosts:
            for gpu, value in per_gpu.items():
                labels = dict(GPU0 if gpu == "0" else GPU1_MIG)
                if host_label:
                    labels[host_label] = host
                labels["DCGM_FI_DRIVER_VERSION"] = "570.124.06"
                text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{field}{{{text}}} {value}")
    return "\n".join(lines) + "\n"


class Exporter(ThreadingHTTPServer):
    body = ""
    status = 200


class Handler(BaseHTTPRequestHandler):
    server: Exporter

    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        data = self.server.body.encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    srv = Exporter(("127.0.0.1", 0), Handler)
    srv.body = scrape()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv: Exporter) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/metrics"


def poll_one(srv: Exporter, **kw) -> tuple[str, dict[str, dict]]:
    c = DcgmCollector(url(srv), site="demo", **kw)
    try:
        [(topic, payload)] = c.poll()
    finally:
        c.close()
    m = decode(topic, payload)
    assert (m.kind, m.collector) == ("gpu", "dcgm")
    raw = orjson.loads(payload)["samples"]
    return m.source, {s["id"]: s for s in raw}


@pytest.mark.parametrize("host_label", ["Hostname", "hostname"])
def test_scrape_maps_fields_units_and_mig(exporter, host_label):
    exporter.body = scrape(host_label)
    source, s = poll_one(exporter)
    assert source == "gpu-node-017"
    assert set(s) == {"gpu-node-017:0", "gpu-node-017:1", "gpu-node-017:1/mig1"}
    assert s["gpu-node-017:0"] == {
        "id": "gpu-node-017:0",
        "power_w": 612.345,  # W
        "energy_j": 9_876_543.21,  # mJ -> J
        "temp_c": 61.0,  # mem_temp_c: blank (INT64 NOT_SUPPORTED) -> absent
        "util_pct": 97.0,
        "mem_util_pct": 41.0,
        "sm_active": 0.873,
        "clock_sm_mhz": 1980.0,
        "clock_mem_mhz": 2619.0,
        "fb_used_mib": 52345.0,  # MiB
        "power_limit_w": 700.0,
        "fb_free_mib": 28575.0,
        "xid_last": 0,
        "gr_engine_active": 0.912345,  # tensor_active: FP64 blank -> absent
    }
    # Device-wide quantities of a MIG-partitioned GPU belong to the GPU itself ...
    assert s["gpu-node-017:1"] == {
        "id": "gpu-node-017:1",
        "power_w": 301.5,
        "energy_j": 1234.567,
        "temp_c": 48.0,
        "mem_temp_c": 55.0,
        "clock_sm_mhz": 1755.0,
        "clock_mem_mhz": 2619.0,
        "power_limit_w": 350.0,  # the enforced limit wins over the management limit
        "xid_last": 79,
    }
    # ... per-instance ones to the instance (GPU_UTIL there is an INT32 blank -> absent).
    assert s["gpu-node-017:1/mig1"] == {
        "id": "gpu-node-017:1/mig1",
        "mem_util_pct": 7.0,
        "sm_active": 0.41,
        "fb_used_mib": 12000.0,
        "fb_free_mib": 28000.0,
        "gr_engine_active": 0.4,
        "tensor_active": 0.25,
    }


def test_no_host_label_uses_node_or_url_host(exporter):
    exporter.body = scrape(host_label=None)
    source, s = poll_one(exporter)
    assert source == "127.0.0.1" and "127.0.0.1:0" in s
    exporter.body = scrape()
    source, s = poll_one(exporter, node="trn-a01-n1")  # --node overrides the label
    assert source == "trn-a01-n1" and set(s) >= {"trn-a01-n1:0", "trn-a01-n1:1/mig1"}


def test_one_message_per_host_with_increasing_seq(exporter):
    exporter.body = scrape(hosts=("node-a", "node-b"))  # e.g. an aggregating proxy
    c = DcgmCollector(url(exporter), site="demo")
    try:
        first = [decode(t, p) for t, p in c.poll()]
        second = [decode(t, p) for t, p in c.poll()]
    finally:
        c.close()
    assert sorted(m.source for m in first) == ["node-a", "node-b"]
    assert all(len(m.samples) == 3 for m in first)
    seq = {m.source: m.seq for m in first}
    assert all(m.seq == seq[m.source] + 1 for m in second)


def test_blank_sentinels_exactly():
    for base in (DCGM_INT32_BLANK, DCGM_INT64_BLANK):
        for k in range(4):  # BLANK, NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED
            assert is_blank(float(base + k), fp64=False)
    assert is_blank(float(DCGM_INT32_BLANK + 15), fp64=False)
    assert not is_blank(float(DCGM_INT32_BLANK - 1), fp64=False)
    assert not is_blank(float(DCGM_INT32_BLANK + 16), fp64=False)  # a real int64 counter
    assert not is_blank(9_876_543_210.0, fp64=False)
    for k in range(4):
        assert is_blank(DCGM_FP64_BLANK + k, fp64=True)
    assert not is_blank(DCGM_FP64_BLANK - 1, fp64=True)
    assert not is_blank(float(DCGM_INT32_BLANK), fp64=True)  # a plausible fp64 value
    assert is_blank(float("nan"), fp64=True)


def test_units_follow_the_default_counters_file():
    """Each mapped field's unit in dcgm-exporter's help text, times our scale, is the unit of
    the quantity it lands in."""
    unit_of = {"W": "W", "C": "°C", "%": "%", "MHz": "MHz", "MiB": "MiB"}
    counters = default_counters()
    checked = 0
    for name, f in DCGM_FIELDS.items():
        if name not in counters or f.quantity not in QUANTITIES["gpu"]:
            continue
        m = re.search(r"\(in (\w+|%)\)", counters[name][1])
        if m is None:
            continue
        unit = m.group(1)
        if unit == "mJ":
            assert (f.scale, QUANTITIES["gpu"][f.quantity].unit) == (1e-3, "J"), name
        else:
            assert f.scale == 1.0, name
            assert QUANTITIES["gpu"][f.quantity].unit == unit_of[unit], name
        checked += 1
    assert checked >= 9


def test_unreachable_endpoint_is_a_clear_error():
    c = DcgmCollector(f"http://127.0.0.1:{free_port()}/metrics", site="demo", timeout_s=2)
    with pytest.raises(CollectorError, match=r"cannot scrape dcgm-exporter at http://127\.0\.0\.1"):
        c.poll()
    c.close()


def test_http_error_and_garbage_are_clear_errors(exporter):
    c = DcgmCollector(url(exporter), site="demo")
    exporter.status = 503
    with pytest.raises(CollectorError, match="answered HTTP 503"):
        c.poll()
    exporter.status = 200
    exporter.body = "<html><body>not metrics</body></html>\n"
    with pytest.raises(CollectorError, match="not a Prometheus text exposition"):
        c.poll()
    c.close()


@pytest.mark.parametrize("bad", ["ftp://host/metrics", "not a url", "http:///metrics"])
def test_bad_url(bad):
    with pytest.raises(CollectorError, match="bad dcgm-exporter URL"):
        DcgmCollector(bad, site="demo")


def test_bare_host_url_gets_metrics_path(exporter):
    c = DcgmCollector(f"http://127.0.0.1:{exporter.server_address[1]}", site="demo")
    assert c.url.endswith("/metrics")
    assert len(c.poll()) == 1
    c.close()


def test_cli_once_stdout_and_errors(exporter):
    from twin.cli import app

    result = CliRunner().invoke(
        app, ["collect", "dcgm", "--url", url(exporter), "--once", "--stdout", "--site", "demo"]
    )
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    msg = orjson.loads(line)
    m = decode(msg["topic"], orjson.dumps(msg["payload"]))
    assert msg["topic"] == "dctwin/v1/demo/gpu/gpu-node-017" and len(m.samples) == 3

    dead = f"http://127.0.0.1:{free_port()}/metrics"
    result = CliRunner().invoke(app, ["collect", "dcgm", "--url", dead, "--once", "--stdout"])
    assert result.exit_code == 2
    assert "cannot scrape dcgm-exporter" in result.stderr and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["collect", "dcgm", "--url", "ftp://x", "--once", "--stdout"])
    assert result.exit_code == 2 and "bad dcgm-exporter URL" in result.stderr


@pytest.mark.mqtt
def test_cli_once_publishes_through_the_broker(exporter, broker, tmp_path, monkeypatch):
    from collectors.mqtt import connect as mqtt_connect
    from collectors.mqtt import prepare_session, wait_until
    from twin.cli import app

    for k, v in broker.client_env().items():
        monkeypatch.setenv(k, v)
    cfg = broker.client_config()
    got = []
    prepare_session(cfg, "dcgm-cli-sub", "dctwin/v1/#")
    sub = mqtt_connect(
        cfg,
        "dcgm-cli-sub",
        persistent=True,
        on_message=lambda c, u, m: got.append(decode(m.topic, m.payload)),
        subscriptions=["dctwin/v1/#"],
    )
    args = ["collect", "dcgm", "--url", url(exporter), "--once", "--site", "demo"]
    spool = ["--spool", str(tmp_path / "spool")]
    try:
        result = CliRunner().invoke(app, [*args, "--broker", broker.address, *spool])
        assert result.exit_code == 0, result.output
        stats = orjson.loads(result.stdout.strip().splitlines()[-1])
        assert stats["published"] == 1 and stats["pending"] == 0
        assert wait_until(lambda: len(got) == 1, 30)
        assert got[0].source == "gpu-node-017" and len(got[0].samples) == 3
    finally:
        sub.disconnect()
        sub.loop_stop()
    # Broker unreachable: exit 2 with the reason; the poll waits in the spool for the next run.
    dead = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, [*args, "--broker", dead, *spool])
    assert result.exit_code == 2
    assert "kept in the spool" in result.stderr and "Traceback" not in result.output


def test_cli_leaves_out_a_temperature_of_exactly_zero(exporter, monkeypatch, caplog):
    """A card without a memory temperature sensor reports DCGM_FI_DEV_MEMORY_TEMP 0
    (NVIDIA/dcgm-exporter#460, NVIDIA/DCGM#311): not measured, so not published."""
    from twin.cli import app

    monkeypatch.setitem(VALUES, "DCGM_FI_DEV_MEMORY_TEMP", {"0": "0", "1": "0"})
    monkeypatch.setitem(VALUES, "DCGM_FI_DEV_GPU_TEMP", {"0": "61", "1": "0"})
    exporter.body = scrape()
    result = CliRunner().invoke(
        app, ["collect", "dcgm", "--url", url(exporter), "--once", "--stdout", "--site", "demo"]
    )
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    samples = {s["id"]: s for s in orjson.loads(line)["payload"]["samples"]}
    gpu0, gpu1 = samples["gpu-node-017:0"], samples["gpu-node-017:1"]
    assert "mem_temp_c" not in gpu0 and "mem_temp_c" not in gpu1
    assert gpu0["temp_c"] == 61.0 and "temp_c" not in gpu1
    assert gpu0["xid_last"] == 0  # a zero that is a reading stays
    assert gpu1["power_w"] == 301.5  # the rest of the GPU's sample is published

    # Logged once per GPU and field, however many scrapes.
    caplog.set_level("INFO", logger="collectors.dcgm")
    c = DcgmCollector(url(exporter), site="demo")
    try:
        c.poll()
        c.poll()
    finally:
        c.close()
    notes = sorted(r.getMessage() for r in caplog.records if "not measured" in r.getMessage())
    assert notes == [
        "GPU gpu-node-017:0: DCGM_FI_DEV_MEMORY_TEMP reads 0 (not measured); left out of its"
        " samples",
        "GPU gpu-node-017:1: DCGM_FI_DEV_GPU_TEMP reads 0 (not measured); left out of its samples",
        "GPU gpu-node-017:1: DCGM_FI_DEV_MEMORY_TEMP reads 0 (not measured); left out of its"
        " samples",
    ]
