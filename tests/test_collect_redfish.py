"""RedfishCollector against the DMTF PDU and CDU mockups served by a local HTTP server.

The server maps ``/redfish/v1/<path>`` to ``<mockup>/<path>/index.json``, checks HTTP basic
auth (the service root stays open, as on real services), implements Redfish sessions and,
when asked, ``$expand`` of collections. Expected values are read from the mockup JSON here,
not from the collector's tables.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import secrets
import shutil
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from collectors.base import Collector, CollectorError
from collectors.contract import decode
from collectors.redfish import RedfishCollector

FIXTURES = Path(__file__).parent / "fixtures" / "redfish"
PDU_DIR = FIXTURES / "public-pdu"
CDU_DIR = FIXTURES / "public-cooling-unit"
USER, PASSWORD = "admin", "s3cret"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:  # keep pytest output quiet
        pass

    def _send(self, code: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        token = self.headers.get("X-Auth-Token")
        if token is not None:
            return token in self.server.tokens
        auth = self.headers.get("Authorization", "")
        want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return auth == want

    def _file(self, path: str) -> Path:
        rel = path.removeprefix("/redfish/v1").strip("/")
        return self.server.root / rel / "index.json"

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        self.server.requests.append(self.path)
        if path.rstrip("/") != "/redfish/v1" and not self._authorized():
            self._send(401, {"error": "unauthorized"}, {"WWW-Authenticate": 'Basic realm="x"'})
            return
        f = self._file(path)
        if not f.is_file():
            self._send(404, {"error": f"no {path}"})
            return
        body = json.loads(f.read_text())
        if self.server.expand and "$expand" in unquote(query) and "Members" in body:
            body["Members"] = [
                json.loads(self._file(m["@odata.id"]).read_text()) for m in body["Members"]
            ]
        self._send(200, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        payload = json.loads(self.rfile.read(length) or b"{}")
        if self.path.rstrip("/") != "/redfish/v1/SessionService/Sessions":
            self._send(405, {"error": "no"})
            return
        if payload.get("UserName") != USER or payload.get("Password") != PASSWORD:
            self._send(401, {"error": "bad credentials"})
            return
        token = secrets.token_hex(8)
        self.server.tokens.add(token)
        uri = f"/redfish/v1/SessionService/Sessions/{token}"
        self._send(201, {"@odata.id": uri, "Id": token}, {"X-Auth-Token": token, "Location": uri})

    def do_DELETE(self) -> None:
        token = self.path.rstrip("/").rsplit("/", 1)[-1]
        if token in self.server.tokens and self.headers.get("X-Auth-Token") == token:
            self.server.tokens.discard(token)
            self.server.logouts += 1
            self._send(204)
        else:
            self._send(401, {"error": "unauthorized"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, expand: bool):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.expand = expand
        self.tokens: set[str] = set()
        self.logouts = 0
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _serve(root: Path, expand: bool = False) -> Iterator[_Server]:
    srv = _Server(root, expand)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def pdu_server() -> Iterator[_Server]:
    yield from _serve(PDU_DIR)


@pytest.fixture
def cdu_server() -> Iterator[_Server]:
    yield from _serve(CDU_DIR)


# ---- helpers reading the mockups --------------------------------------------------------------


def load(root: Path, uri: str) -> dict[str, Any]:
    return json.loads(
        (root / uri.removeprefix("/redfish/v1").strip("/") / "index.json").read_text()
    )


def members(root: Path, uri: str) -> list[dict[str, Any]]:
    return [load(root, m["@odata.id"]) for m in load(root, uri)["Members"]]


def data_sources(obj: Any) -> set[str]:
    """Every DataSourceUri quoted anywhere in a JSON tree."""
    found: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "DataSourceUri" and isinstance(v, str):
                found.add(v)
            else:
                found |= data_sources(v)
    elif isinstance(obj, list):
        for v in obj:
            found |= data_sources(v)
    return found


def readings(obj: Any) -> list[float]:
    """Every numeric sensor reading (Reading, ApparentVA, ReactiveVAR, PowerFactor) in a tree."""
    out: list[float] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("Reading", "ApparentVA", "ReactiveVAR", "PowerFactor") and isinstance(
                v, int | float
            ):
                out.append(float(v))
            elif isinstance(v, dict | list):
                out.extend(readings(v))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(readings(v))
    return out


def poll_one(c: RedfishCollector) -> tuple[str, dict[str, dict[str, Any]]]:
    msgs = c.poll()
    assert len(msgs) == 1, [t for t, _ in msgs]
    topic, payload = msgs[0]
    d = decode(topic, payload)
    return d.kind, {s["id"]: s for s in d.samples}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# ---- PDU --------------------------------------------------------------------------------------

SRC = "pdu-r01-a"
# Sensor.ReadingType + ReadingUnits -> contract quantity and factor, written out for the test.
SENSOR_EXPECT = {
    ("Power", "W"): ("power_w", 1.0),
    ("Current", "A"): ("current_a", 1.0),
    ("Voltage", "V"): ("voltage_v", 1.0),
    ("Frequency", "Hz"): ("frequency_hz", 1.0),
    ("EnergykWh", "kW.h"): ("energy_kwh", 1.0),
    ("Temperature", "Cel"): ("temp_c", 1.0),
    ("Humidity", "%"): ("humidity_pct", 1.0),
}
OUTLET_EXPECT = {
    "CurrentAmps": "current_a",
    "Voltage": "voltage_v",
    "PowerWatts": "power_w",
    "EnergykWh": "energy_kwh",
    "FrequencyHz": "frequency_hz",
}


def test_pdu_mockup_every_reading_lands_with_its_unit(pdu_server: _Server) -> None:
    c = RedfishCollector(
        pdu_server.url, site="lab", source=SRC, kind="pdu", username=USER, password=PASSWORD
    )
    assert isinstance(c, Collector)
    kind, s = poll_one(c)
    assert kind == "pdu"
    base = "/redfish/v1/PowerEquipment/RackPDUs/1"
    pdu = load(PDU_DIR, base)
    metrics = load(PDU_DIR, f"{base}/Metrics")
    (ac1,) = members(PDU_DIR, f"{base}/Mains")

    # unit level: PowerDistributionMetrics
    assert s[SRC]["power_w"] == metrics["PowerWatts"]["Reading"]
    assert s[SRC]["apparent_power_va"] == metrics["PowerWatts"]["ApparentVA"]
    assert s[SRC]["power_factor"] == metrics["PowerWatts"]["PowerFactor"]
    assert s[SRC]["energy_kwh"] == metrics["EnergykWh"]["Reading"]
    assert s[SRC]["inlet_temp_c"] == metrics["TemperatureCelsius"]["Reading"]
    assert s[SRC]["frequency_hz"] == ac1["FrequencyHz"]["Reading"]

    # phases of the one mains circuit, line-to-neutral
    for n in (1, 2, 3):
        ph = s[f"{SRC}/L{n}"]
        assert ph["current_a"] == ac1["PolyPhaseCurrentAmps"][f"Line{n}"]["Reading"]
        assert ph["voltage_v"] == ac1["PolyPhaseVoltage"][f"Line{n}ToNeutral"]["Reading"]
        p = ac1["PolyPhasePowerWatts"][f"Line{n}ToNeutral"]
        assert ph["power_w"] == p["Reading"]
        assert ph["apparent_power_va"] == p["ApparentVA"]
        assert ph["power_factor"] == p["PowerFactor"]
    assert s[f"{SRC}/AC1"]["neutral_current_a"] == ac1["PolyPhaseCurrentAmps"]["Neutral"]["Reading"]
    assert s[f"{SRC}/L1"]["voltage_l1l2_v"] == ac1["PolyPhaseVoltage"]["Line1ToLine2"]["Reading"]

    # branches (breakers) and outlets
    for b in members(PDU_DIR, f"{base}/Branches"):
        got = s[f"{SRC}/{b['Id']}"]
        assert got["current_a"] == b["CurrentAmps"]["Reading"]
        assert got["power_w"] == b["PowerWatts"]["Reading"]
        assert got["energy_kwh"] == b["EnergykWh"]["Reading"]
        (ln,) = [k for k in b["PolyPhaseVoltage"] if k.endswith("ToNeutral")]
        assert got["voltage_v"] == b["PolyPhaseVoltage"][ln]["Reading"]
    outlets = members(PDU_DIR, f"{base}/Outlets")
    assert len(outlets) == 11
    for o in outlets:
        if "CurrentAmps" not in o:  # "Managed, Un-monitored Outlet": nothing to report
            assert f"{SRC}/outlet{o['Id']}" not in s
            continue
        got = s[f"{SRC}/outlet{o['Id']}"]
        for prop, q in OUTLET_EXPECT.items():
            if prop in o:
                assert got[q] == o[prop]["Reading"], (o["Id"], prop)

    # every reading quoted by each resource lands on that resource's samples
    def values(*ids: str) -> list[float]:
        return [
            v
            for i in ids
            for k, v in s.get(i, {}).items()
            if k not in ("id", "ts") and v is not None
        ]

    where = {
        f"{base}/Metrics": [SRC],
        ac1["@odata.id"]: [f"{SRC}/L1", f"{SRC}/L2", f"{SRC}/L3", f"{SRC}/AC1"],
    }
    for b in members(PDU_DIR, f"{base}/Branches"):
        where[b["@odata.id"]] = [f"{SRC}/{b['Id']}"]
    for o in outlets:
        where[o["@odata.id"]] = [f"{SRC}/outlet{o['Id']}"]
    for g in members(PDU_DIR, f"{base}/OutletGroups"):
        where[g["@odata.id"]] = [f"{SRC}/group-{g['Id']}"]
    for uri, ids in where.items():
        got = values(*ids)
        for r in readings(load(PDU_DIR, uri)):
            assert any(close(r, v) for v in got), (uri, r, ids)

    # the chassis sensors that no resource quotes land by ReadingType, in contract units
    quoted = set()
    for uri in [base, f"{base}/Metrics", *where]:
        quoted |= data_sources(load(PDU_DIR, uri))
    chassis = load(PDU_DIR, pdu["Links"]["Chassis"][0]["@odata.id"])
    unquoted = [
        x for x in members(PDU_DIR, chassis["Sensors"]["@odata.id"]) if x["@odata.id"] not in quoted
    ]
    assert unquoted, "the mockup has sensors no resource quotes"
    for x in unquoted:
        q, f = SENSOR_EXPECT[(x["ReadingType"], x["ReadingUnits"])]
        if q == "humidity_pct":
            assert s[SRC]["humidity_pct"] == x["Reading"] * f
        else:
            assert s[f"{SRC}/sensors/{x['Id']}"][q] == x["Reading"] * f
    c.close()


def test_pdu_default_source_is_the_equipment_name_slug(pdu_server: _Server) -> None:
    c = RedfishCollector(pdu_server.url, site="lab", username=USER, password=PASSWORD)
    topic, payload = c.poll()[0]
    d = decode(topic, payload)
    assert (d.kind, d.source) == ("pdu", "rackpdu1")  # Id "1" is a bare number; Name "RackPDU1"
    assert topic == "dctwin/v1/lab/pdu/rackpdu1"
    assert d.collector == "redfish"
    c.close()


# ---- CDU --------------------------------------------------------------------------------------


def test_cdu_mockup_maps_loops_pumps_and_environment(cdu_server: _Server) -> None:
    c = RedfishCollector(
        cdu_server.url, site="lab", source="cdu-1", username=USER, password=PASSWORD
    )
    kind, s = poll_one(c)
    assert kind == "cdu"
    base = "/redfish/v1/ThermalEquipment/CDUs/1"
    (sec,) = members(CDU_DIR, f"{base}/SecondaryCoolantConnectors")
    (pri,) = members(CDU_DIR, f"{base}/PrimaryCoolantConnectors")
    env = load(CDU_DIR, f"{base}/EnvironmentMetrics")
    u = s["cdu-1"]
    assert u["supply_temp_c"] == sec["SupplyTemperatureCelsius"]["Reading"]
    assert u["return_temp_c"] == sec["ReturnTemperatureCelsius"]["Reading"]
    assert u["flow_lpm"] == sec["FlowLitersPerMinute"]["Reading"]
    assert u["dp_kpa"] == sec["DeltaPressurekPa"]["Reading"]
    assert u["heat_kw"] == sec["HeatRemovedkW"]["Reading"]
    assert u["fw_supply_temp_c"] == pri["SupplyTemperatureCelsius"]["Reading"]
    assert u["fw_return_temp_c"] == pri["ReturnTemperatureCelsius"]["Reading"]
    assert u["fw_flow_lpm"] == pri["FlowLitersPerMinute"]["Reading"]
    assert u["ambient_temp_c"] == env["TemperatureCelsius"]["Reading"]
    assert u["humidity_pct"] == env["HumidityPercent"]["Reading"]
    for p in members(CDU_DIR, f"{base}/Pumps"):
        assert s[f"cdu-1/pump{p['Id']}"]["pump_speed_pct"] == p["PumpSpeedPercent"]["Reading"]
    # every reading of the connectors lands on the unit sample
    got = [v for k, v in u.items() if k not in ("id", "ts") and v is not None]
    for r in readings(sec) + readings(pri) + readings(env):
        assert any(close(r, v) for v in got), r
    # every chassis sensor of this mockup is quoted by a connector or the environment
    assert not [i for i in s if "/sensors/" in i]
    c.close()


def _cdu_with_extra_sensors(tmp_path: Path) -> Path:
    root = tmp_path / "cdu"
    shutil.copytree(CDU_DIR, root)
    sensors_dir = root / "Chassis" / "CDU" / "Sensors"
    listing = json.loads((sensors_dir / "index.json").read_text())
    extra = {
        "FlowGpm": ("LiquidFlow", 10.0, "[gal_us]/min", "Chassis"),
        "LoopPressure": ("PressurePa", 150000.0, "Pa", "Chassis"),
        "HeatW": ("Heat", 2500.0, "W", "Chassis"),
        "InletF": ("Temperature", 77.0, "[degF]", "LiquidInlet"),
        "Bogus": ("Temperature", 20.0, "furlong", "Chassis"),
    }
    for sid, (rtype, reading, units, ctx) in extra.items():
        uri = f"/redfish/v1/Chassis/CDU/Sensors/{sid}"
        (sensors_dir / sid).mkdir()
        (sensors_dir / sid / "index.json").write_text(
            json.dumps(
                {
                    "@odata.id": uri,
                    "@odata.type": "#Sensor.v1_9_0.Sensor",
                    "Id": sid,
                    "Name": sid,
                    "ReadingType": rtype,
                    "Reading": reading,
                    "ReadingUnits": units,
                    "PhysicalContext": ctx,
                }
            )
        )
        listing["Members"].append({"@odata.id": uri})
    (sensors_dir / "index.json").write_text(json.dumps(listing))
    return root


@pytest.mark.parametrize("expand", [False, True], ids=["member-by-member", "expand"])
def test_sensor_units_are_converted_or_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, expand: bool
) -> None:
    for srv in _serve(_cdu_with_extra_sensors(tmp_path), expand=expand):
        c = RedfishCollector(srv.url, site="lab", source="cdu-1", username=USER, password=PASSWORD)
        with caplog.at_level(logging.WARNING, logger="collectors.redfish"):
            _, s = poll_one(c)
        assert math.isclose(s["cdu-1/sensors/FlowGpm"]["flow_lpm"], 37.85411784)
        assert math.isclose(s["cdu-1/sensors/LoopPressure"]["pressure_kpa"], 150.0)
        assert math.isclose(s["cdu-1/sensors/HeatW"]["heat_kw"], 2.5)
        assert math.isclose(s["cdu-1/sensors/InletF"]["temp_c"], 25.0)
        assert "cdu-1/sensors/Bogus" not in s
        assert all(v != 20.0 for smp in s.values() for v in smp.values() if v is not None)
        refused = [r.getMessage() for r in caplog.records if "Bogus" in r.getMessage()]
        assert refused and "furlong" in refused[0]
        # the mockup root advertises $expand: a server that honours it answers the sensors in
        # one request; one that ignores it gets them read one by one
        one_by_one = "/redfish/v1/Chassis/CDU/Sensors/FlowGpm" in srv.requests
        assert one_by_one != expand
        c.close()


# ---- auth and failures ------------------------------------------------------------------------


def test_session_login_uses_a_token_and_logs_out(pdu_server: _Server) -> None:
    c = RedfishCollector(
        pdu_server.url, site="lab", source=SRC, username=USER, password=PASSWORD, session=True
    )
    _, s = poll_one(c)
    assert s[f"{SRC}/L1"]["current_a"] > 0
    assert len(pdu_server.tokens) == 1
    c.close()
    assert pdu_server.logouts == 1 and not pdu_server.tokens


def test_session_expired_logs_in_again(pdu_server: _Server) -> None:
    c = RedfishCollector(
        pdu_server.url, site="lab", source=SRC, username=USER, password=PASSWORD, session=True
    )
    poll_one(c)
    pdu_server.tokens.clear()  # the service dropped the session
    poll_one(c)
    assert len(pdu_server.tokens) == 1
    c.close()


@pytest.mark.parametrize("session", [False, True])
def test_wrong_password_names_401(pdu_server: _Server, session: bool) -> None:
    c = RedfishCollector(
        pdu_server.url, site="lab", username=USER, password="wrong", session=session
    )
    with pytest.raises(CollectorError, match="401") as e:
        c.poll()
    assert pdu_server.url in str(e.value)
    c.close()


def test_unreachable_url_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the collector connects
    c = RedfishCollector(f"http://127.0.0.1:{port}", site="lab", timeout_s=2.0)
    with pytest.raises(CollectorError, match=rf"127\.0\.0\.1:{port}.*unreachable"):
        c.poll()
    c.close()


def test_not_a_redfish_service(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text(json.dumps({"hello": "world"}))
    for srv in _serve(tmp_path):
        c = RedfishCollector(srv.url, site="lab")
        with pytest.raises(CollectorError, match="not a Redfish service"):
            c.poll()
        c.close()


def test_source_with_several_devices_asks_for_equipment(tmp_path: Path) -> None:
    root = tmp_path / "pdu"
    shutil.copytree(PDU_DIR, root)
    coll = root / "PowerEquipment" / "RackPDUs" / "index.json"
    body = json.loads(coll.read_text())
    shutil.copytree(coll.parent / "1", coll.parent / "2")
    body["Members"].append({"@odata.id": "/redfish/v1/PowerEquipment/RackPDUs/2"})
    coll.write_text(json.dumps(body))
    second = coll.parent / "2" / "index.json"
    second.write_text(
        second.read_text().replace("RackPDUs/1", "RackPDUs/2").replace('"Id": "1"', '"Id": "2"')
    )
    for srv in _serve(root):
        c = RedfishCollector(srv.url, site="lab", source=SRC, username=USER, password=PASSWORD)
        with pytest.raises(CollectorError, match="equipment"):
            c.poll()
        c.close()
        c = RedfishCollector(
            srv.url, site="lab", source=SRC, equipment="2", username=USER, password=PASSWORD
        )
        _, s = poll_one(c)
        assert f"{SRC}/L1" in s
        c.close()
